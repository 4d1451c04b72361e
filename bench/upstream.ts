// A fake OpenAI-compatible upstream for benchmarks: instant replies, streams of 20 chunks written
// one by one.
//
// Usage: bun bench/upstream.ts [port]   (or PORT=…; 0 or nothing picks a free port) Prints one JSON
// line {"msg":"upstream listening","url":…} on stdout, then serves:
//   POST …/chat/completions  body.stream === true → SSE: 20 chat.completion.chunk events, each its
//   own
//                            write (one per pull of a direct stream, flushed), then a usage chunk
//                            and
//                            `data: [DONE]`; otherwise → one chat.completion JSON with the same
//                            text.
//                            body.model === "hold" → SSE whose first chunk is sent at once and
//                            whose
//                            rest waits until POST /bench/release (the memory benchmark's open
//                            streams).
//   POST /bench/release      ends every held stream normally; answers {"released":n}.
//   GET  /bench/stats        {"requests":n,"held":n}. Exits on SIGTERM/SIGINT.

export const CHUNKS_PER_STREAM = 20;

const encoder = new TextEncoder();
const ID = 'chatcmpl-bench';
const CREATED_S = 1_767_225_600;

function chunkFrame(content: string, finishReason: string | null): Uint8Array {
  const chunk = {
    id: ID,
    object: 'chat.completion.chunk',
    created: CREATED_S,
    model: 'up',
    choices: [{ index: 0, delta: { content }, finish_reason: finishReason }],
  };
  return encoder.encode(`data: ${JSON.stringify(chunk)}\n\n`);
}

const words = Array.from(
  { length: CHUNKS_PER_STREAM },
  (_, i) => `tok${String(i + 1).padStart(2, '0')} `,
);
const usage = {
  prompt_tokens: 9,
  completion_tokens: CHUNKS_PER_STREAM,
  total_tokens: 9 + CHUNKS_PER_STREAM,
};
/**
 * Every frame of one stream, in order: 20 content chunks (the last carries finish_reason), usage,
 * [DONE].
 */
const STREAM_FRAMES: Uint8Array[] = [
  ...words.map((word, i) => chunkFrame(word, i === CHUNKS_PER_STREAM - 1 ? 'stop' : null)),
  encoder.encode(
    `data: ${JSON.stringify({
      id: ID,
      object: 'chat.completion.chunk',
      created: CREATED_S,
      model: 'up',
      choices: [],
      usage,
    })}\n\n`,
  ),
  encoder.encode('data: [DONE]\n\n'),
];
const COMPLETION_JSON = JSON.stringify({
  id: ID,
  object: 'chat.completion',
  created: CREATED_S,
  model: 'up',
  choices: [
    { index: 0, message: { role: 'assistant', content: words.join('') }, finish_reason: 'stop' },
  ],
  usage,
});
const SSE_HEADERS = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' };
const JSON_HEADERS = { 'content-type': 'application/json' };

function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * A stream that writes each frame separately: one write and one flush per frame, never coalesced by
 * us.
 */
function sseStream(
  frames: readonly Uint8Array[],
  gate: Promise<void> | null,
): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>({
    type: 'direct',
    async pull(controller: ReadableStreamDirectController) {
      for (let i = 0; i < frames.length; i++) {
        if (i === 1 && gate) await gate;
        controller.write(frames[i]!);
        await controller.flush();
        // Within one tick Bun corks the socket and would send the whole stream in one write; one
        // turn of the event loop per frame makes every frame its own send, as a real token stream
        // is.
        if (i < frames.length - 1) await nextTurn();
      }
      controller.close();
    },
  });
}

export interface UpstreamHandle {
  url: string;
  stop(): void;
}

export function startUpstream(port = 0): UpstreamHandle {
  let requests = 0;
  let held: Array<() => void> = [];
  const server = Bun.serve({
    hostname: '127.0.0.1',
    port,
    idleTimeout: 0,
    async fetch(request) {
      const path = new URL(request.url).pathname;
      if (path.endsWith('/chat/completions') && request.method === 'POST') {
        requests++;
        const body = (await request.json()) as { stream?: boolean; model?: string };
        if (body.model === 'hold') {
          const gate = Promise.withResolvers<void>();
          held.push(gate.resolve);
          return new Response(sseStream(STREAM_FRAMES, gate.promise), { headers: SSE_HEADERS });
        }
        if (body.stream === true)
          return new Response(sseStream(STREAM_FRAMES, null), { headers: SSE_HEADERS });
        return new Response(COMPLETION_JSON, { headers: JSON_HEADERS });
      }
      if (path === '/bench/release' && request.method === 'POST') {
        const released = held.length;
        for (const release of held) release();
        held = [];
        return Response.json({ released });
      }
      if (path === '/bench/stats') return Response.json({ requests, held: held.length });
      return new Response('not found', { status: 404 });
    },
  });
  return { url: `http://127.0.0.1:${server.port}`, stop: () => server.stop(true) };
}

if (import.meta.main) {
  const port = Number(process.argv[2] ?? process.env.PORT ?? 0);
  const upstream = startUpstream(port);
  console.log(JSON.stringify({ msg: 'upstream listening', url: upstream.url }));
  const stop = () => {
    upstream.stop();
    process.exit(0);
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}
