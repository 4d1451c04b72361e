// The OpenAI adapter's bounds on what an upstream answers (CONTRACT §7): body, event, content,
// usage, tool calls; and the one resend of a request whose pooled connection the upstream closed
// unanswered.
import { afterEach, describe, expect, test } from 'bun:test';
import type { Socket } from 'bun';
import { countPromptTokens } from '../../src/billing/tokens.ts';
import { OpenAIProvider } from '../../src/providers/openai/index.ts';
import type { Delta, ProviderRequest } from '../../src/providers/provider.ts';
import { GatewayError } from '../../src/util/errors.ts';
import { createLogger } from '../../src/util/log.ts';
import { type FakeUpstream, sseResponse, startUpstream } from './fake-upstream.ts';

const logger = createLogger('silent');
const encoder = new TextEncoder();
const KIB = 1024;
const MIB = 1024 * 1024;
/** Tool calls one answer may make: as many as a request's assistant message may carry back. */
const TOOL_CALLS_MAX = 128;

interface Limits {
  bodyBytesMax?: number;
  eventBytesMax?: number;
  timeoutMs?: number;
}

function adapter(baseUrl: string, limits: Limits = {}): OpenAIProvider {
  return new OpenAIProvider(
    'fake-openai',
    { type: 'openai', base_url: baseUrl, timeout_ms: limits.timeoutMs ?? 5_000 },
    {
      defaultTimeoutMs: 5_000,
      bodyBytesMax: limits.bodyBytesMax ?? 16 * MIB,
      eventBytesMax: limits.eventBytesMax ?? MIB,
      logger,
    },
  );
}

function request(stream: boolean): ProviderRequest {
  const messages: ProviderRequest['messages'] = [{ role: 'user', content: 'Say hello.' }];
  return {
    model: 'up',
    messages,
    maxOutputTokens: null,
    temperature: null,
    topP: null,
    topK: null,
    seed: null,
    stop: null,
    tools: null,
    toolChoice: null,
    promptTokens: countPromptTokens(messages, null),
    stream,
  };
}

/** The deltas of `provider.stream`, or the error it threw (with the deltas that came before it). */
async function streamed(
  provider: OpenAIProvider,
  stream = true,
): Promise<{ deltas: Delta[]; error: unknown }> {
  const deltas: Delta[] = [];
  try {
    for await (const delta of provider.stream(request(stream), new AbortController().signal))
      deltas.push(delta);
    return { deltas, error: null };
  } catch (error) {
    return { deltas, error };
  }
}

async function completed(
  provider: OpenAIProvider,
): Promise<{ deltas: Delta[] | null; error: unknown }> {
  try {
    return {
      deltas: await provider.complete(request(false), new AbortController().signal),
      error: null,
    };
  } catch (error) {
    return { deltas: null, error };
  }
}

function expectInvalid(error: unknown, message?: RegExp): void {
  expect(error).toBeInstanceOf(GatewayError);
  expect((error as GatewayError).code).toBe('upstream_invalid_response');
  expect((error as GatewayError).status).toBe(502);
  if (message) expect((error as GatewayError).message).toMatch(message);
}

/** A chat.completion JSON text of exactly `bytes` bytes (its content padded with x). */
function completionOfBytes(bytes: number): string {
  const base = JSON.stringify({
    choices: [{ index: 0, message: { role: 'assistant', content: '' }, finish_reason: 'stop' }],
  });
  return base.replace('"content":""', `"content":"${'x'.repeat(bytes - base.length)}"`);
}

/** A body streamed (chunked, no length) in pieces of at most 64 KiB. */
function chunkedBody(text: string): ReadableStream<Uint8Array> {
  const bytes = encoder.encode(text);
  let at = 0;
  return new ReadableStream<Uint8Array>({
    pull(controller) {
      if (at >= bytes.length) {
        controller.close();
        return;
      }
      controller.enqueue(bytes.subarray(at, at + 64 * KIB));
      at += 64 * KIB;
    },
  });
}

function chunkEvent(delta: Record<string, unknown>, finish: string | null = null): string {
  return `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
}

/** Live JS heap after a full collection: what is still referenced, garbage excluded. */
function liveHeapBytes(): number {
  Bun.gc(true);
  return process.memoryUsage().heapUsed;
}

const stops: (() => void)[] = [];
afterEach(() => {
  for (const stop of stops.splice(0)) stop();
});
function track(upstream: FakeUpstream): FakeUpstream {
  stops.push(() => upstream.stop());
  return upstream;
}

/**
 * A raw TCP upstream (Bun.listen): `onRequest` gets each whole request (head and body) with the
 * number of the connection it came on (1 for the first accepted) and its position on that
 * connection.
 */
function rawUpstream(
  onRequest: (socket: Socket<RawConnection>, connection: number, nth: number) => void,
) {
  const closed: PromiseWithResolvers<void>[] = [];
  let connections = 0;
  let requests = 0;
  const server = Bun.listen<RawConnection>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(socket) {
        connections++;
        closed.push(Promise.withResolvers<void>());
        socket.data = { connection: connections, requests: 0, pending: '' };
      },
      data(socket, bytes) {
        const data = socket.data;
        data.pending += new TextDecoder().decode(bytes);
        for (;;) {
          const headEnd = data.pending.indexOf('\r\n\r\n');
          if (headEnd === -1) return;
          const length = Number(
            /content-length: (\d+)/i.exec(data.pending.slice(0, headEnd))?.[1] ?? 0,
          );
          // The bodies here are ASCII JSON: characters are bytes.
          if (data.pending.length < headEnd + 4 + length) return;
          data.pending = data.pending.slice(headEnd + 4 + length);
          data.requests++;
          requests++;
          onRequest(socket, data.connection, data.requests);
        }
      },
      close(socket) {
        closed[socket.data.connection - 1]!.resolve();
      },
    },
  });
  stops.push(() => server.stop(true));
  return {
    baseUrl: `http://127.0.0.1:${server.port}/v1`,
    connections: () => connections,
    requests: () => requests,
    closed: (connection: number) => closed[connection - 1]!.promise,
  };
}

interface RawConnection {
  connection: number;
  requests: number;
  pending: string;
}

function jsonAnswer(content: string): string {
  const body = JSON.stringify({
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
  });
  return (
    `HTTP/1.1 200 OK\r\ncontent-type: ` +
    `application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`
  );
}

describe('a JSON body is bounded by max_upstream_body_bytes', () => {
  test(
    'a declared Content-Length over the bound is refused before the body is read, and the ' +
      'connection dropped',
    async () => {
      // The head promises a body and none follows: only a refusal by the declared size answers at
      // once.
      const raw: ReturnType<typeof rawUpstream> = rawUpstream((socket) => {
        socket.write(
          `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${MIB + 1}\r\n\r\n`,
        );
      });
      const provider = adapter(raw.baseUrl, { bodyBytesMax: MIB, timeoutMs: 2_000 });
      expectInvalid((await completed(provider)).error, /body over 1048576 bytes/);
      await raw.closed(1);
      expectInvalid((await streamed(provider, false)).error, /body over 1048576 bytes/);
      await raw.closed(2);
    },
  );

  test(
    'exactly the bound passes, one byte more is ' + 'refused: with Content-Length, and chunked',
    async () => {
      for (const chunked of [false, true]) {
        let size = 0;
        const upstream = track(
          startUpstream(() => {
            const text = completionOfBytes(size);
            return new Response(chunked ? chunkedBody(text) : text, {
              headers: { 'content-type': 'application/json' },
            });
          }),
        );
        const provider = adapter(upstream.baseUrl, { bodyBytesMax: 256 * KIB });
        size = 256 * KIB;
        const whole = await completed(provider);
        expect(whole.error).toBeNull();
        expect((whole.deltas![0] as { text: string }).text.length).toBeGreaterThan(255 * KIB);
        size = 256 * KIB + 1;
        expectInvalid((await completed(provider)).error, /body over 262144 bytes/);
        expectInvalid((await streamed(provider, false)).error, /body over 262144 bytes/);
      }
    },
  );

  test(
    'an endless chunked body is refused once its count passes the bound, and the upstream ' +
      'request is dropped',
    async () => {
      const piece = encoder.encode(`{"choices": [${' '.repeat(64 * KIB - 14)}`);
      let sentBytes = 0;
      const upstream = track(
        startUpstream(
          () =>
            new Response(
              new ReadableStream<Uint8Array>({
                pull(controller) {
                  sentBytes += piece.length;
                  controller.enqueue(piece);
                },
              }),
              { headers: { 'content-type': 'application/json' } },
            ),
        ),
      );
      const before = liveHeapBytes();
      const { error } = await completed(adapter(upstream.baseUrl, { bodyBytesMax: MIB }));
      expectInvalid(error, /body over 1048576 bytes/);
      await upstream.requests[0]!.aborted;
      expect(sentBytes).toBeGreaterThan(MIB);
      expect(liveHeapBytes() - before).toBeLessThan(8 * MIB);
    },
  );
});

describe(
  'a stream is bounded: one event by max_upstream_event_bytes, ' +
    'its content by max_upstream_body_bytes',
  () => {
    test(
      'one event over the event bound is ' +
        'upstream_invalid_response; one of exactly the bound passes',
      async () => {
        // `data: ` + the chunk JSON: pad the content so the line is exactly `bytes` long.
        const eventOfBytes = (bytes: number) => {
          const empty = `data: ${JSON.stringify({
            choices: [{ index: 0, delta: { content: '' }, finish_reason: 'stop' }],
          })}`;
          const padding = 'y'.repeat(bytes - empty.length);
          return `${empty.replace('"content":""', `"content":"${padding}"`)}\n\n`;
        };
        let bytes = 0;
        const upstream = track(
          startUpstream(() =>
            sseResponse([chunkEvent({ content: 'Hi' }), eventOfBytes(bytes), 'data: [DONE]\n\n']),
          ),
        );
        const provider = adapter(upstream.baseUrl, { eventBytesMax: 8 * KIB });
        bytes = 8 * KIB;
        const fits = await streamed(provider);
        expect(fits.error).toBeNull();
        expect(fits.deltas.at(-1)).toEqual({ type: 'finish', reason: 'stop', usage: null });
        bytes = 8 * KIB + 1;
        const over = await streamed(provider);
        expectInvalid(over.error, /stream event over 8192 bytes/);
        expectInvalid((await completed(provider)).error, /stream event over 8192 bytes/);
      },
    );

    test(
      'content past the body bound is upstream_invalid_response: the relayed stream stops there, ' +
        'the collected one too',
      async () => {
        const piece = 'z'.repeat(KIB);
        const events: string[] = [];
        for (let i = 0; i < 200; i++) events.push(chunkEvent({ content: piece }));
        events.push(chunkEvent({}, 'stop'), 'data: [DONE]\n\n');
        const upstream = track(startUpstream(() => sseResponse(events)));
        const provider = adapter(upstream.baseUrl, { bodyBytesMax: 64 * KIB });
        const relayed = await streamed(provider);
        expectInvalid(relayed.error, /over 65536 bytes of content/);
        expect(relayed.deltas.length).toBe(64);
        expectInvalid((await completed(provider)).error, /over 65536 bytes of content/);
        // The same answer within the bound goes through.
        const roomy = adapter(upstream.baseUrl, { bodyBytesMax: 200 * KIB });
        expect((await streamed(roomy)).deltas.length).toBe(201);
        expect(await roomy.complete(request(false), new AbortController().signal)).toEqual([
          { type: 'text', text: piece.repeat(200) },
          { type: 'finish', reason: 'stop', usage: null },
        ]);
      },
    );

    test('tool-call arguments count as content', async () => {
      const events = [
        chunkEvent({
          tool_calls: [{ index: 0, id: 'call_1', function: { name: 'f', arguments: '' } }],
        }),
      ];
      for (let i = 0; i < 100; i++)
        events.push(
          chunkEvent({ tool_calls: [{ index: 0, function: { arguments: 'a'.repeat(KIB) } }] }),
        );
      events.push(chunkEvent({}, 'tool_calls'), 'data: [DONE]\n\n');
      const upstream = track(startUpstream(() => sseResponse(events)));
      expectInvalid(
        (await streamed(adapter(upstream.baseUrl, { bodyBytesMax: 32 * KIB }))).error,
        /over 32768 bytes of content/,
      );
      expectInvalid(
        (await completed(adapter(upstream.baseUrl, { bodyBytesMax: 32 * KIB }))).error,
        /over 32768 bytes of content/,
      );
    });

    test(
      'an endless stream ends with upstream_invalid_response, ' +
        'and the upstream request is dropped',
      async () => {
        const event = encoder.encode(chunkEvent({ content: 'w'.repeat(4 * KIB) }).repeat(16));
        for (const collect of [false, true]) {
          const upstream = track(
            startUpstream(
              () =>
                new Response(
                  new ReadableStream<Uint8Array>({
                    pull(controller) {
                      controller.enqueue(event);
                    },
                  }),
                  { headers: { 'content-type': 'text/event-stream' } },
                ),
            ),
          );
          const provider = adapter(upstream.baseUrl, { bodyBytesMax: 4 * MIB });
          const before = liveHeapBytes();
          const { error } = collect ? await completed(provider) : await streamed(provider);
          expectInvalid(error, /over 4194304 bytes of content/);
          await upstream.requests[0]!.aborted;
          // The relayed deltas are kept by this test, not by the provider: what stays is about the
          // content.
          expect(liveHeapBytes() - before).toBeLessThan(16 * MIB);
        }
      },
    );

    test(
      'a collected stream of a million tiny events ' + 'keeps its content, not a million deltas',
      async () => {
        // 1,000 one-character events per write, 1,000 writes: the text is 1,000,000 characters.
        const block = encoder.encode(chunkEvent({ content: 'q' }).repeat(1_000));
        const end = encoder.encode(`${chunkEvent({}, 'stop')}data: [DONE]\n\n`);
        let writes = 0;
        const upstream = track(
          startUpstream(
            () =>
              new Response(
                new ReadableStream<Uint8Array>({
                  pull(controller) {
                    if (writes++ < 1_000) controller.enqueue(block);
                    else {
                      controller.enqueue(end);
                      controller.close();
                    }
                  },
                }),
                { headers: { 'content-type': 'text/event-stream' } },
              ),
          ),
        );
        const before = liveHeapBytes();
        const deltas = await adapter(upstream.baseUrl).complete(
          request(false),
          new AbortController().signal,
        );
        const retainedBytes = liveHeapBytes() - before;
        expect(deltas.length).toBe(2);
        expect((deltas[0] as { text: string }).text).toBe('q'.repeat(1_000_000));
        // One delta per event would hold tens of MB (an object and a string each).
        expect(retainedBytes).toBeLessThan(8 * MIB);
      },
    );

    test(
      'endless keep-alives and empty events keep nothing: the live heap stays flat, and the ' +
        'answer ' +
        'after them arrives',
      async () => {
        const block = encoder.encode(
          ': keep-alive\n\ndata: {"choices": []}\n\ndata: ' +
            '{"choices": [{"index": 0, "delta": {}}]}\n\n'.repeat(2_000),
        );
        const samples: number[] = [];
        let writes = 0;
        const upstream = track(
          startUpstream(
            () =>
              new Response(
                new ReadableStream<Uint8Array>({
                  pull(controller) {
                    writes++;
                    // The gateway's own process: sample its live heap every 100 writes (600,000
                    // events).
                    if (writes % 100 === 0) samples.push(liveHeapBytes());
                    if (writes <= 500) controller.enqueue(block);
                    else {
                      controller.enqueue(
                        encoder.encode(
                          `${chunkEvent({ content: 'after' }, 'stop')}data: [DONE]\n\n`,
                        ),
                      );
                      controller.close();
                    }
                  },
                }),
                { headers: { 'content-type': 'text/event-stream' } },
              ),
          ),
        );
        const { deltas, error } = await streamed(
          adapter(upstream.baseUrl, { eventBytesMax: KIB, bodyBytesMax: KIB }),
        );
        expect(error).toBeNull();
        expect(deltas).toEqual([
          { type: 'text', text: 'after' },
          { type: 'finish', reason: 'stop', usage: null },
        ]);
        expect(samples.length).toBe(5);
        expect(Math.max(...samples) - samples[0]!).toBeLessThan(4 * MIB);
      },
    );

    test(
      `more than ${TOOL_CALLS_MAX} tool calls ` + `in one answer is upstream_invalid_response`,
      async () => {
        const calls = (count: number) =>
          Array.from({ length: count }, (_, index) => ({
            index,
            id: `call_${index}`,
            function: { name: 'f', arguments: '{}' },
          }));
        const upstream = track(
          startUpstream((_req, recorded) => {
            const count =
              (recorded.body.messages as { content: string }[])[0]!.content === 'many'
                ? TOOL_CALLS_MAX + 1
                : TOOL_CALLS_MAX;
            if (recorded.body.stream)
              return sseResponse([
                chunkEvent({ tool_calls: calls(count) }, 'tool_calls'),
                'data: [DONE]\n\n',
              ]);
            return Response.json({
              choices: [
                {
                  index: 0,
                  message: { role: 'assistant', content: null, tool_calls: calls(count) },
                  finish_reason: 'tool_calls',
                },
              ],
            });
          }),
        );
        const provider = adapter(upstream.baseUrl);
        const many = { ...request(true), messages: [{ role: 'user' as const, content: 'many' }] };
        for (const stream of [true, false]) {
          const deltas: Delta[] = [];
          for await (const delta of provider.stream(
            { ...request(true), stream },
            new AbortController().signal,
          ))
            deltas.push(delta);
          expect(deltas.length).toBe(TOOL_CALLS_MAX + 1);
          let caught: unknown = null;
          try {
            for await (const _ of provider.stream(
              { ...many, stream },
              new AbortController().signal,
            ));
          } catch (error) {
            caught = error;
          }
          expectInvalid(caught, /more than 128 tool calls/);
        }
      },
    );
  },
);

describe('usage figures must be whole numbers in [0, 2^31)', () => {
  const BAD = [2 ** 53 - 1, 2 ** 31, -1, 1.5, '12', Number.MAX_VALUE];

  function usageUpstream(usage: () => unknown): FakeUpstream {
    return track(
      startUpstream((_req, recorded) => {
        const value = usage();
        if (recorded.body.stream) {
          return sseResponse([
            chunkEvent({ content: 'Hi' }, 'stop'),
            `data: ${JSON.stringify({ choices: [], usage: value })}\n\n`,
            'data: [DONE]\n\n',
          ]);
        }
        return Response.json({
          choices: [
            { index: 0, message: { role: 'assistant', content: 'Hi' }, finish_reason: 'stop' },
          ],
          usage: value,
        });
      }),
    );
  }

  test(
    'a bad prompt_tokens, completion_tokens or total_tokens is upstream_invalid_response, ' +
      'streamed or not',
    async () => {
      let usage: unknown = null;
      const provider = adapter(usageUpstream(() => usage).baseUrl);
      for (const bad of BAD) {
        for (const figure of ['prompt_tokens', 'completion_tokens', 'total_tokens']) {
          usage = { prompt_tokens: 5, completion_tokens: 7, total_tokens: 12, [figure]: bad };
          expectInvalid((await streamed(provider)).error, /usage figure/);
          expectInvalid((await completed(provider)).error, /usage figure/);
        }
      }
      usage = 'lots';
      expectInvalid((await streamed(provider)).error, /usage that is not an object/);
    },
  );

  test(
    'the largest figure passes; absent usage, or usage without both figures, is dropped for the ' +
      'gateway to count',
    async () => {
      let usage: unknown = null;
      const provider = adapter(usageUpstream(() => usage).baseUrl);
      const finish = async () => [
        (await streamed(provider)).deltas.at(-1),
        (await completed(provider)).deltas!.at(-1),
      ];
      usage = {
        prompt_tokens: 2 ** 31 - 1,
        completion_tokens: 2 ** 31 - 1,
        total_tokens: 2 ** 31 - 1,
      };
      const largest: Delta = {
        type: 'finish',
        reason: 'stop',
        usage: { promptTokens: 2 ** 31 - 1, completionTokens: 2 ** 31 - 1 },
      };
      expect(await finish()).toEqual([largest, largest]);
      const dropped: Delta = { type: 'finish', reason: 'stop', usage: null };
      for (const absent of [
        null,
        {},
        { prompt_tokens: 5 },
        { completion_tokens: null, prompt_tokens: 3 },
      ]) {
        usage = absent;
        expect(await finish()).toEqual([dropped, dropped]);
      }
    },
  );
});

describe('a pooled connection the upstream closed before answering', () => {
  test('the request is sent once more on a new connection and answered there', async () => {
    const seen: string[] = [];
    const raw = rawUpstream((socket, connection, nth) => {
      seen.push(`${connection}.${nth}`);
      if (connection === 1 && nth === 2) socket.terminate();
      else socket.write(jsonAnswer(`answer ${connection}.${nth}`));
    });
    const provider = adapter(raw.baseUrl);
    expect(await provider.complete(request(false), new AbortController().signal)).toEqual([
      { type: 'text', text: 'answer 1.1' },
      { type: 'finish', reason: 'stop', usage: null },
    ]);
    expect(await provider.complete(request(false), new AbortController().signal)).toEqual([
      { type: 'text', text: 'answer 2.1' },
      { type: 'finish', reason: 'stop', usage: null },
    ]);
    expect(seen).toEqual(['1.1', '1.2', '2.1']);
    expect(raw.connections()).toBe(2);
  });

  test(
    'an abort during the resend throws its reason ' + 'within 50 ms and closes the new connection',
    async () => {
      const resent = Promise.withResolvers<void>();
      const raw = rawUpstream((socket, connection, nth) => {
        if (connection === 1 && nth === 1) socket.write(jsonAnswer('first'));
        else if (connection === 1) socket.terminate();
        else resent.resolve(); // the new connection never answers
      });
      const provider = adapter(raw.baseUrl);
      await provider.complete(request(false), new AbortController().signal);
      const controller = new AbortController();
      const pending = provider.complete(request(false), controller.signal).then(
        () => null,
        (error: unknown) => error,
      );
      await resent.promise;
      const reason = new Error('cancelled by test');
      const abortedAtMs = performance.now();
      controller.abort(reason);
      expect(await pending).toBe(reason);
      expect(performance.now() - abortedAtMs).toBeLessThan(50);
      await raw.closed(2);
    },
  );

  test(
    'a new connection closed before answering ' + 'is upstream_unreachable, with no resend',
    async () => {
      const raw = rawUpstream((socket) => socket.terminate());
      const { error } = await completed(adapter(raw.baseUrl));
      expect(error).toBeInstanceOf(GatewayError);
      expect((error as GatewayError).code).toBe('upstream_unreachable');
      expect({ connections: raw.connections(), requests: raw.requests() }).toEqual({
        connections: 1,
        requests: 1,
      });
    },
  );

  test(
    'a pooled connection closed after part ' + 'of the answer is an error, with no resend',
    async () => {
      const raw = rawUpstream((socket, _connection, nth) => {
        if (nth === 1) socket.write(jsonAnswer('first'));
        else
          socket.end(
            'HTTP/1.1 200 OK\r\ncontent-type: ' +
              'application/json\r\ncontent-length: 100\r\n\r\n{"choices":',
          );
      });
      const provider = adapter(raw.baseUrl);
      await provider.complete(request(false), new AbortController().signal);
      const { error } = await completed(provider);
      expectInvalid(error, /broke the connection mid-answer/);
      expect({ connections: raw.connections(), requests: raw.requests() }).toEqual({
        connections: 1,
        requests: 2,
      });
    },
  );
});
