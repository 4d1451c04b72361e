// A hostile OpenAI-compatible upstream for the attack bench: every answer is too large, endless or
// malformed.
//
// Usage: bun bench/hostile-upstream.ts [port]   Prints {"msg":"hostile upstream
// listening","url":…}. The request's `model` picks the attack:
//   huge       a JSON completion of 64 MiB (chunked, no length), content larger than any bound
//   endless    an SSE stream of content chunks that never ends
//   bigevent   one SSE event of 2 MiB
//   badusage   a normal answer whose usage says 2^53 − 1 tokens
//   manydeltas one-character deltas, as fast as the socket takes them, up to 64 MiB of content
export {};

const encoder = new TextEncoder();
const frame = (content: string) =>
  encoder.encode(
    `data: ${JSON.stringify({
      id: 'x',
      object: 'chat.completion.chunk',
      created: 0,
      model: 'h',
      choices: [{ index: 0, delta: { content }, finish_reason: null }],
    })}\n\n`,
  );
const CHUNK = frame('endless '.repeat(64));
const TINY = frame('a');
const MIB = 1024 * 1024;

/** A body written piece by piece while the client reads, up to `totalBytes` (Infinity: forever). */
function pumped(
  piece: Uint8Array,
  totalBytes: number,
  prefix?: Uint8Array,
): ReadableStream<Uint8Array> {
  let sent = 0;
  return new ReadableStream<Uint8Array>({
    start(controller) {
      if (prefix) controller.enqueue(prefix);
    },
    pull(controller) {
      if (sent >= totalBytes) return controller.close();
      controller.enqueue(piece);
      sent += piece.byteLength;
    },
  });
}

const server = Bun.serve({
  hostname: '127.0.0.1',
  port: Number(process.argv[2] ?? process.env.PORT ?? 0),
  idleTimeout: 0,
  async fetch(request) {
    const body = (await request.json()) as { model?: string };
    switch (body.model) {
      case 'huge':
        return new Response(
          pumped(
            encoder.encode('x'.repeat(64 * 1024)),
            64 * MIB,
            encoder.encode('{"choices":[{"message":{"content":"'),
          ),
          {
            headers: { 'content-type': 'application/json' },
          },
        );
      case 'endless':
        return new Response(pumped(CHUNK, Number.POSITIVE_INFINITY), {
          headers: { 'content-type': 'text/event-stream' },
        });
      case 'bigevent':
        return new Response(frame('y'.repeat(2 * MIB)), {
          headers: { 'content-type': 'text/event-stream' },
        });
      case 'manydeltas':
        return new Response(pumped(TINY, 64 * MIB * TINY.byteLength), {
          headers: { 'content-type': 'text/event-stream' },
        });
      default:
        return Response.json({
          id: 'x',
          object: 'chat.completion',
          created: 0,
          model: 'h',
          choices: [
            { index: 0, message: { role: 'assistant', content: 'fine' }, finish_reason: 'stop' },
          ],
          usage: {
            prompt_tokens: Number.MAX_SAFE_INTEGER,
            completion_tokens: Number.MAX_SAFE_INTEGER,
            total_tokens: Number.MAX_SAFE_INTEGER,
          },
        });
    }
  },
});
console.log(
  JSON.stringify({ msg: 'hostile upstream listening', url: `http://127.0.0.1:${server.port}` }),
);
for (const signal of ['SIGTERM', 'SIGINT'] as const) process.once(signal, () => process.exit(0));
