// The load client of `bun bench/profile.ts tail`: `connections` loops of one request after another
// for a fixed time, every request's start and end kept on the bench's clock.
//
// Usage: bun bench/tail-client.ts <spec.json> The spec (TailClientSpec) names the URL, headers,
// body, whether the answer is a stream (read to `data: [DONE]`), the warm-up and the measured time.
// Requests that start during the warm-up are sent but not kept. Writes <spec.out>: a Float64Array
// of [start, end] pairs in epoch ms (performance.timeOrigin + performance.now(), the clock of the
// collector lines' arrival and of bench/tail-probe.ts), then prints one JSON line
// {"msg":"tail client done","requests":n,"sent":n,"errors":n,"firstError":…,"cpuS":s} (`sent`
// counts the warm-up too; `cpuS` is the client's own CPU time). Run it pinned to the load
// core; everything it allocates per request is what any Bun client allocates (fetch, a reader).

export interface TailClientSpec {
  url: string;
  headers: Record<string, string>;
  body: string;
  stream: boolean;
  connections: number;
  warmupMs: number;
  measureMs: number;
  out: string;
}

const DONE = new TextEncoder().encode('data: [DONE]');

/** Whether `tail` (the last bytes seen) ends with `data: [DONE]` and a blank line or two. */
function endsWithDone(tail: Uint8Array, length: number): boolean {
  let end = length;
  while (end > 0 && (tail[end - 1] === 10 || tail[end - 1] === 13)) end--;
  if (end < DONE.length) return false;
  for (let i = 0; i < DONE.length; i++) if (tail[end - DONE.length + i] !== DONE[i]) return false;
  return true;
}

async function oneRequest(spec: TailClientSpec, tail: Uint8Array): Promise<string | null> {
  const response = await fetch(spec.url, {
    method: 'POST',
    headers: spec.headers,
    body: spec.body,
  });
  if (response.status !== 200) return `HTTP ${response.status}: ${await response.text()}`;
  if (!spec.stream) {
    await response.arrayBuffer();
    return null;
  }
  // Keep the last 32 bytes: enough to see `data: [DONE]` however the chunks were cut.
  let kept = 0;
  for await (const bytes of response.body!) {
    if (bytes.length >= tail.length) {
      tail.set(bytes.subarray(bytes.length - tail.length));
      kept = tail.length;
    } else {
      const keep = Math.min(kept, tail.length - bytes.length);
      tail.copyWithin(0, kept - keep, kept);
      tail.set(bytes, keep);
      kept = keep + bytes.length;
    }
  }
  return endsWithDone(tail, kept) ? null : 'stream ended without data: [DONE]';
}

async function run(spec: TailClientSpec): Promise<void> {
  const origin = performance.timeOrigin;
  const startMs = performance.now();
  const measureFromMs = startMs + spec.warmupMs;
  const stopMs = measureFromMs + spec.measureMs;
  // Grown by doubling: no allocation per request for the samples themselves.
  let samples = new Float64Array(1 << 16);
  let count = 0;
  let sent = 0;
  let errors = 0;
  let firstError: string | null = null;
  const loop = async () => {
    const tail = new Uint8Array(32);
    for (;;) {
      const begin = performance.now();
      if (begin >= stopMs) return;
      let error: string | null;
      try {
        error = await oneRequest(spec, tail);
      } catch (thrown) {
        error = (thrown as Error).message;
      }
      const end = performance.now();
      sent++;
      if (begin < measureFromMs) continue;
      if (error !== null) {
        errors++;
        firstError ??= error;
        continue;
      }
      if (count * 2 + 2 > samples.length) {
        const grown = new Float64Array(samples.length * 2);
        grown.set(samples);
        samples = grown;
      }
      samples[count * 2] = origin + begin;
      samples[count * 2 + 1] = origin + end;
      count++;
    }
  };
  await Promise.all(Array.from({ length: spec.connections }, loop));
  await Bun.write(spec.out, samples.subarray(0, count * 2));
  const cpu = process.cpuUsage();
  const cpuS = (cpu.user + cpu.system) / 1e6;
  console.log(
    JSON.stringify({ msg: 'tail client done', requests: count, sent, errors, firstError, cpuS }),
  );
}

if (import.meta.main) {
  const path = process.argv[2];
  if (!path) {
    console.error('usage: bun bench/tail-client.ts <spec.json>');
    process.exit(64);
  }
  await run((await Bun.file(path).json()) as TailClientSpec);
}
