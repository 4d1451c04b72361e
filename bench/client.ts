// Benchmark clients that wrk cannot be: time to first token, and many streams held open at once.
//
//   bun bench/client.ts latency <spec.json>
//     Sequential requests (one at a time), interleaved over the spec's targets so drift hits all
//     alike.
//     Streams: time to the first SSE `data:` bytes and to the end; non-stream: time to the whole
//     body.
//     Prints one JSON line {"msg":"latency","results":{name:{ttftMs:[…],totalMs:[…]}}}.
//   bun bench/client.ts open <url> <key> <n> [model]
//     Reads commands on stdin: `open` starts n streams and prints {"msg":"opened",…} once every one
//     has
//     sent its first chunk, then {"msg":"closed",…} when they have all ended; `quit` exits. Run it
//     pinned to the load core (taskset -c 1), with BUN_CONFIG_MAX_HTTP_REQUESTS above n for `open`.

export interface LatencyTarget {
  name: string;
  url: string;
  headers: Record<string, string>;
  body: string;
  stream: boolean;
}

export interface LatencySpec {
  targets: LatencyTarget[];
  warmup: number;
  requests: number;
}

export interface LatencySamples {
  ttftMs: number[];
  totalMs: number[];
}

const decoder = new TextDecoder();

async function timeOne(target: LatencyTarget): Promise<{ ttftMs: number; totalMs: number }> {
  const start = performance.now();
  const response = await fetch(target.url, {
    method: 'POST',
    headers: target.headers,
    body: target.body,
  });
  if (response.status !== 200)
    throw new Error(`${target.name}: HTTP ${response.status}: ${await response.text()}`);
  const reader = response.body!.getReader();
  let ttftMs = NaN;
  let text = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (Number.isNaN(ttftMs)) {
      text += decoder.decode(value, { stream: true });
      if (!target.stream || text.includes('data:')) ttftMs = performance.now() - start;
    }
  }
  return { ttftMs, totalMs: performance.now() - start };
}

async function latency(spec: LatencySpec): Promise<Record<string, LatencySamples>> {
  const results: Record<string, LatencySamples> = {};
  for (const target of spec.targets) results[target.name] = { ttftMs: [], totalMs: [] };
  const count = spec.targets.length;
  for (let i = 0; i < spec.warmup + spec.requests; i++) {
    for (let j = 0; j < count; j++) {
      // Rotate the order each iteration: no target always follows the same neighbour.
      const target = spec.targets[(i + j) % count]!;
      const sample = await timeOne(target);
      if (i < spec.warmup) continue;
      results[target.name]!.ttftMs.push(sample.ttftMs);
      results[target.name]!.totalMs.push(sample.totalMs);
    }
  }
  return results;
}

async function openStreams(url: string, key: string, n: number, model = 'model_02'): Promise<void> {
  const body = JSON.stringify({
    model,
    messages: [{ role: 'user', content: 'hello' }],
    max_completion_tokens: 64,
    stream: true,
  });
  const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  const startMs = performance.now();
  let opened = 0;
  let failedOpen = 0;
  const allOpen = Promise.withResolvers<void>();
  const check = () => {
    if (opened + failedOpen === n) allOpen.resolve();
  };
  const streams = Array.from({ length: n }, async () => {
    let first = true;
    try {
      const response = await fetch(`${url}/api/v1/chat/completions`, {
        method: 'POST',
        headers,
        body,
      });
      if (response.status !== 200) throw new Error(`HTTP ${response.status}`);
      let sawDone = false;
      let tail = '';
      for await (const bytes of response.body!) {
        if (first) {
          first = false;
          opened++;
          check();
        }
        tail = (tail + decoder.decode(bytes)).slice(-32);
        if (tail.includes('[DONE]')) sawDone = true;
      }
      return sawDone;
    } catch {
      if (first) {
        failedOpen++;
        check();
      }
      return false;
    }
  });
  const timeout = setTimeout(() => allOpen.resolve(), 20_000);
  await allOpen.promise;
  clearTimeout(timeout);
  console.log(
    JSON.stringify({ msg: 'opened', opened, failed: failedOpen, ms: performance.now() - startMs }),
  );
  const ends = await Promise.all(streams);
  const completed = ends.filter(Boolean).length;
  console.log(
    JSON.stringify({
      msg: 'closed',
      completed,
      failed: n - completed,
      ms: performance.now() - startMs,
    }),
  );
}

if (import.meta.main) {
  const [mode, ...args] = process.argv.slice(2);
  if (mode === 'latency') {
    const spec = (await Bun.file(args[0]!).json()) as LatencySpec;
    const results = await latency(spec);
    console.log(JSON.stringify({ msg: 'latency', results }));
  } else if (mode === 'open') {
    const [url, key, n, model] = args;
    console.log(JSON.stringify({ msg: 'client ready', url: 'stdin' }));
    const decoderIn = new TextDecoder();
    let buffer = '';
    for await (const bytes of Bun.stdin.stream()) {
      buffer += decoderIn.decode(bytes, { stream: true });
      let newline: number;
      while ((newline = buffer.indexOf('\n')) !== -1) {
        const command = buffer.slice(0, newline).trim();
        buffer = buffer.slice(newline + 1);
        if (command === 'open') void openStreams(url!, key!, Number(n), model);
        else if (command === 'quit') process.exit(0);
      }
    }
    process.exit(0);
  } else {
    console.error('usage: bun bench/client.ts latency <spec.json> | open <url> <key> <n> [model]');
    process.exit(64);
  }
}
