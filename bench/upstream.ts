// A fake upstream for benchmarks, OpenAI-compatible and Anthropic Messages: instant replies,
// streams of 20 text chunks written one by one.
//
// Usage: bun bench/upstream.ts [port]   (or PORT=…; 0 or nothing picks a free port) Prints one JSON
// line {"msg":"upstream listening","url":…} on stdout, then serves:
//   POST …/chat/completions  body.stream === true → SSE: 20 chat.completion.chunk events, each its
//                            own write (one per pull of a direct stream, flushed), then a usage
//                            chunk and `data: [DONE]`; otherwise → one chat.completion JSON with
//                            the same text. body.model === "hold" → SSE whose first chunk is sent
//                            at once and whose rest waits until POST /bench/release (the memory
//                            benchmark's open streams).
//   POST …/messages          the Anthropic Messages API, same text and usage: body.stream === true
//                            → SSE of message_start, content_block_start, 20 content_block_delta
//                            text_delta events, content_block_stop, message_delta (stop reason,
//                            usage), message_stop, in as many writes as the OpenAI stream (22);
//                            otherwise → one Message JSON.
//   POST /bench/release      ends every held stream normally; answers {"released":n}.
//   GET  /bench/stats        {"requests":n,"held":n}. Exits on SIGTERM/SIGINT.
// UPSTREAM_BURST=1 in its environment writes each (unheld) stream whole, in one send: a gateway's
// CPU per stream then leaves out what each read costs it (bench/README, issue 15).

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
export const STREAM_FRAMES: Uint8Array[] = [
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
export const COMPLETION_JSON = JSON.stringify({
  id: ID,
  object: 'chat.completion',
  created: CREATED_S,
  model: 'up',
  choices: [
    { index: 0, message: { role: 'assistant', content: words.join('') }, finish_reason: 'stop' },
  ],
  usage,
});

// ---- Anthropic Messages API: the frames of tests/support/fake-anthropic.ts (checked by the SDK),
// with this file's text and usage.

const MESSAGE_ID = 'msg_01Bench';

function anthropicEvent(type: string, data: object): string {
  return `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
}

function anthropicMessage(content: object[], stopReason: string | null, outputTokens: number) {
  return {
    id: MESSAGE_ID,
    type: 'message',
    role: 'assistant',
    model: 'up',
    content,
    stop_reason: stopReason,
    stop_sequence: null,
    usage: {
      input_tokens: usage.prompt_tokens,
      cache_creation_input_tokens: 0,
      cache_read_input_tokens: 0,
      output_tokens: outputTokens,
      service_tier: 'standard',
    },
  };
}

const textDeltas = words.map((text) =>
  anthropicEvent('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }),
);
/**
 * Every write of one Messages stream, in order. Each text delta is its own write, as each OpenAI
 * chunk is; the events around them are grouped so the stream takes the same 22 writes as the
 * OpenAI one (the first write opens the message and its block with the first delta, as the API
 * does in one packet; the last two carry the stop and usage, and message_stop, as usage and
 * [DONE] do there). Same text, same writes: the fake's speed is the same for both protocols.
 */
export const ANTHROPIC_STREAM_FRAMES: Uint8Array[] = [
  encoder.encode(
    // message_start's usage carries a provisional output count; message_delta's replaces it.
    anthropicEvent('message_start', { message: anthropicMessage([], null, 1) }) +
      anthropicEvent('content_block_start', {
        index: 0,
        content_block: { type: 'text', text: '' },
      }) +
      textDeltas[0],
  ),
  ...textDeltas.slice(1).map((frame) => encoder.encode(frame)),
  encoder.encode(
    anthropicEvent('content_block_stop', { index: 0 }) +
      anthropicEvent('message_delta', {
        delta: { stop_reason: 'end_turn', stop_sequence: null },
        usage: { output_tokens: usage.completion_tokens },
      }),
  ),
  encoder.encode(anthropicEvent('message_stop', {})),
];
if (ANTHROPIC_STREAM_FRAMES.length !== STREAM_FRAMES.length)
  throw new Error('the two fake streams must take the same number of writes');
export const MESSAGE_JSON = JSON.stringify(
  anthropicMessage([{ type: 'text', text: words.join('') }], 'end_turn', usage.completion_tokens),
);

const SSE_HEADERS = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' };
const JSON_HEADERS = { 'content-type': 'application/json' };

const BURST = process.env.UPSTREAM_BURST === '1';

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
      if (BURST && !gate) {
        for (const frame of frames) controller.write(frame);
        await controller.flush();
        controller.close();
        return;
      }
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
      if (path.endsWith('/messages') && request.method === 'POST') {
        requests++;
        const body = (await request.json()) as { stream?: boolean };
        if (body.stream === true)
          return new Response(sseStream(ANTHROPIC_STREAM_FRAMES, null), { headers: SSE_HEADERS });
        return new Response(MESSAGE_JSON, { headers: JSON_HEADERS });
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
