// CONTRACT §7 through the gateway's HTTP surface: an unbounded or unusable upstream answer is a 502
// upstream_invalid_response (or its error event), never a 500; a pooled connection the upstream
// closed unanswered is retried once on a new one.
import { describe, expect, test } from 'bun:test';
import type { Socket } from 'bun';
import { bearer, chatBody, closedAfterEach, type TestServer } from '../support/gateway.ts';
import { SseReader } from '../support/sse.ts';
import { type FakeUpstream, sseResponse, startUpstream } from './fake-upstream.ts';

const cleanup = closedAfterEach();
const KIB = 1024;
const BODY_BYTES_MAX = 64 * KIB;
const EVENT_BYTES_MAX = 4 * KIB;
const encoder = new TextEncoder();

/**
 * A gateway whose model_03 is served by the openai provider at `baseUrl`, with small answer bounds.
 */
async function gatewayOn(baseUrl: string): Promise<{ t: TestServer; key: string }> {
  const t = await cleanup.server({
    providers: { fake: { type: 'openai', base_url: baseUrl, timeout_ms: 5_000 } },
    models: { model_03: { provider: 'fake', upstream_model: 'up' } },
    limits: { max_upstream_body_bytes: BODY_BYTES_MAX, max_upstream_event_bytes: EVENT_BYTES_MAX },
  });
  const { key } = await t.createKey({ credits: 100 });
  return { t, key };
}

function chat(
  t: TestServer,
  key: string,
  body: Record<string, unknown> = chatBody(),
): Promise<Response> {
  return fetch(`${t.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(key),
    body: JSON.stringify(body),
  });
}

async function expectInvalidResponse(response: Response): Promise<void> {
  expect(response.status).toBe(502);
  const body = (await response.json()) as { error: Record<string, unknown> };
  expect(body.error).toMatchObject({ type: 'upstream_error', code: 'upstream_invalid_response' });
}

/**
 * The stream's events after a 200: text chunks first, then one error event and the end (no [DONE]).
 */
async function expectErrorEvent(
  response: Response,
  reader = new SseReader(response),
): Promise<void> {
  expect(response.status).toBe(200);
  const events = await reader.rest();
  expect(events.at(-1)).not.toBe('[DONE]');
  expect(JSON.parse(events.at(-1)!).error).toMatchObject({
    type: 'upstream_error',
    code: 'upstream_invalid_response',
  });
}

/**
 * An SSE answer in two parts: `first` at once, `rest` once the test opens the gate (after the
 * client has seen the first chunk), so the failure in `rest` comes after the stream began, whatever
 * the reads.
 */
function gatedSse(first: string[], rest: string[]): { response: () => Response; open: () => void } {
  let gate = Promise.withResolvers<void>();
  return {
    response() {
      gate = Promise.withResolvers<void>();
      const wait = gate.promise;
      let sentFirst = false;
      const body = new ReadableStream<Uint8Array>({
        async pull(controller) {
          if (!sentFirst) {
            sentFirst = true;
            controller.enqueue(encoder.encode(first.join('')));
            return;
          }
          await wait;
          controller.enqueue(encoder.encode(rest.join('')));
          controller.close();
        },
      });
      return new Response(body, { headers: { 'content-type': 'text/event-stream' } });
    },
    open: () => gate.resolve(),
  };
}

/**
 * A stream call whose upstream is gated: the 200 and its first chunk, then the gate opens, then the
 * rest.
 */
async function expectErrorEventAfterStart(
  t: TestServer,
  key: string,
  gated: { open: () => void },
): Promise<void> {
  const response = await chat(t, key, chatBody({ stream: true }));
  expect(response.status).toBe(200);
  const reader = new SseReader(response);
  expect(JSON.parse((await reader.next())!).choices[0].delta.role).toBe('assistant');
  gated.open();
  await expectErrorEvent(response, reader);
}

function upstream(handler: Parameters<typeof startUpstream>[0]): FakeUpstream {
  return cleanup.track(startUpstream(handler));
}

function completion(content: string, usage?: unknown): Record<string, unknown> {
  return {
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
    ...(usage === undefined ? {} : { usage }),
  };
}

function chunkEvent(delta: Record<string, unknown>, finish: string | null = null): string {
  return `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
}

describe(
  'an unbounded or unusable upstream answer is ' + '502 upstream_invalid_response, never a 500',
  () => {
    test('a JSON body over max_upstream_body_bytes, with Content-Length and chunked', async () => {
      let content = 'x'.repeat(BODY_BYTES_MAX);
      let chunked = false;
      const fake = upstream(() => {
        const bytes = encoder.encode(JSON.stringify(completion(content)));
        if (!chunked)
          return new Response(bytes, { headers: { 'content-type': 'application/json' } });
        return new Response(
          new ReadableStream<Uint8Array>({
            start(controller) {
              for (let at = 0; at < bytes.length; at += 8 * KIB)
                controller.enqueue(bytes.subarray(at, at + 8 * KIB));
              controller.close();
            },
          }),
          { headers: { 'content-type': 'application/json' } },
        );
      });
      const { t, key } = await gatewayOn(fake.baseUrl);
      await expectInvalidResponse(await chat(t, key));
      chunked = true;
      await expectInvalidResponse(await chat(t, key));
      // Within the bound, the same upstream answers.
      content = 'x'.repeat(BODY_BYTES_MAX - 200);
      const response = await chat(t, key);
      expect(response.status).toBe(200);
      expect(((await response.json()) as any).choices[0].message.content).toBe(content);
    });

    test('a usage figure of 2^53-1, 2^31, -1 or 1.5, streamed or not', async () => {
      let figure = 0;
      let gated = gatedSse([], []);
      const fake = upstream((_req, recorded) => {
        const usage = { prompt_tokens: 5, completion_tokens: figure, total_tokens: 5 };
        if (!recorded.body.stream) return Response.json(completion('Hi', usage));
        return gated.response();
      });
      const { t, key } = await gatewayOn(fake.baseUrl);
      for (const bad of [2 ** 53 - 1, 2 ** 31, -1, 1.5]) {
        figure = bad;
        await expectInvalidResponse(await chat(t, key));
        const usage = { prompt_tokens: 5, completion_tokens: bad, total_tokens: 5 };
        gated = gatedSse(
          [chunkEvent({ content: 'Hi' })],
          [
            chunkEvent({}, 'stop'),
            `data: ${JSON.stringify({ choices: [], usage })}\n\n`,
            'data: [DONE]\n\n',
          ],
        );
        await expectErrorEventAfterStart(t, key, gated);
      }
      figure = 2 ** 31 - 1;
      const response = await chat(t, key);
      expect(response.status).toBe(200);
      expect(((await response.json()) as { usage: unknown }).usage).toEqual({
        prompt_tokens: 5,
        completion_tokens: 2 ** 31 - 1,
        total_tokens: 2 ** 31 + 4,
      });
    });

    test(
      'one SSE event over max_upstream_event_bytes: the error event after what came before it, ' +
        'or ' +
        'a 502 when it is first',
      async () => {
        const huge = chunkEvent({ content: 'y'.repeat(EVENT_BYTES_MAX) });
        const gated = gatedSse(
          [chunkEvent({ content: 'Hi' })],
          [huge, chunkEvent({}, 'stop'), 'data: [DONE]\n\n'],
        );
        let first = false;
        const fake = upstream(() =>
          first ? sseResponse([huge, 'data: [DONE]\n\n']) : gated.response(),
        );
        const { t, key } = await gatewayOn(fake.baseUrl);
        await expectErrorEventAfterStart(t, key, gated);
        first = true;
        await expectInvalidResponse(await chat(t, key, chatBody({ stream: true })));
        // The upstream streams although asked not to: the collected path has the same bound.
        await expectInvalidResponse(await chat(t, key));
      },
    );

    test(
      'an endless stream: its content passes max_upstream_body_bytes and the client gets the ' +
        'error event',
      async () => {
        const block = encoder.encode(chunkEvent({ content: 'w'.repeat(KIB) }).repeat(8));
        const fake = upstream(
          () =>
            new Response(
              new ReadableStream<Uint8Array>({
                pull(controller) {
                  controller.enqueue(block);
                },
              }),
              { headers: { 'content-type': 'text/event-stream' } },
            ),
        );
        const { t, key } = await gatewayOn(fake.baseUrl);
        const response = await chat(t, key, chatBody({ stream: true }));
        await expectErrorEvent(response);
        await fake.requests[0]!.aborted;
        // Collected (a non-stream call to an upstream that streams anyway): a 502.
        await expectInvalidResponse(await chat(t, key));
      },
    );
  },
);

interface RawConnection {
  connection: number;
  requests: number;
  pending: string;
}

/**
 * A raw TCP upstream: `onRequest` gets each whole request with the number of its connection (1 for
 * the first accepted) and its position there. Bun.serve cannot close a kept connection as a request
 * arrives.
 */
function rawUpstream(
  onRequest: (socket: Socket<RawConnection>, connection: number, nth: number) => void,
) {
  let connections = 0;
  let requests = 0;
  const server = Bun.listen<RawConnection>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(socket) {
        connections++;
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
          // The gateway's request bodies here are ASCII JSON: characters are bytes.
          if (data.pending.length < headEnd + 4 + length) return;
          data.pending = data.pending.slice(headEnd + 4 + length);
          data.requests++;
          requests++;
          onRequest(socket, data.connection, data.requests);
        }
      },
    },
  });
  cleanup.track({ stop: () => server.stop(true) });
  return {
    baseUrl: `http://127.0.0.1:${server.port}/v1`,
    connections: () => connections,
    requests: () => requests,
  };
}

function jsonAnswer(content: string): string {
  const body = JSON.stringify(
    completion(content, { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 }),
  );
  return (
    `HTTP/1.1 200 OK\r\ncontent-type: ` +
    `application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`
  );
}

describe('a pooled upstream connection the provider closed before answering', () => {
  test('is retried once on a new connection: the call succeeds', async () => {
    const seen: string[] = [];
    const raw = rawUpstream((socket, connection, nth) => {
      seen.push(`${connection}.${nth}`);
      if (connection === 1 && nth === 2) socket.terminate();
      else socket.write(jsonAnswer(`answer ${connection}.${nth}`));
    });
    const { t, key } = await gatewayOn(raw.baseUrl);
    const first = await chat(t, key);
    expect(first.status).toBe(200);
    const second = await chat(t, key);
    expect(second.status).toBe(200);
    expect(((await second.json()) as any).choices[0].message.content).toBe('answer 2.1');
    // The second request reached the upstream twice: unanswered on the kept connection, answered on
    // a new one.
    expect(seen).toEqual(['1.1', '1.2', '2.1']);
    expect(raw.connections()).toBe(2);
  });

  test(
    'a new connection closed before answering ' + 'is 502 upstream_unreachable, sent once',
    async () => {
      const raw = rawUpstream((socket) => socket.terminate());
      const { t, key } = await gatewayOn(raw.baseUrl);
      const response = await chat(t, key);
      expect(response.status).toBe(502);
      expect(((await response.json()) as any).error.code).toBe('upstream_unreachable');
      expect({ connections: raw.connections(), requests: raw.requests() }).toEqual({
        connections: 1,
        requests: 1,
      });
    },
  );

  test('a pooled connection closed after part of the answer is a 502, sent once', async () => {
    const raw = rawUpstream((socket, _connection, nth) => {
      if (nth === 1) socket.write(jsonAnswer('first'));
      else
        socket.end(
          'HTTP/1.1 200 OK\r\ncontent-type: ' +
            'application/json\r\ncontent-length: 100\r\n\r\n{"choices":',
        );
    });
    const { t, key } = await gatewayOn(raw.baseUrl);
    expect((await chat(t, key)).status).toBe(200);
    await expectInvalidResponse(await chat(t, key));
    expect({ connections: raw.connections(), requests: raw.requests() }).toEqual({
      connections: 1,
      requests: 2,
    });
  });
});
