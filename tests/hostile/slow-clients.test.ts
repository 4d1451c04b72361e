// Slow and idle clients cannot keep a connection past the read deadline (CONTRACT §8), while a slow
// provider still gets its time; a client that vanishes mid-body is a 499 in the log, not an
// internal error.
import { describe, expect, test } from 'bun:test';
import { rmSync } from 'node:fs';
import pino from 'pino';
import { openGateway } from '../../src/gateway.ts';
import { startServer } from '../../src/server.ts';
import { fifoTimersFor } from '../../src/util/fifo-timers.ts';
import { ADMIN_TOKEN, bearer, chatBody, closedAfterEach, testConfig } from '../support/gateway.ts';
import { postHead, rawConnect } from '../support/raw-http.ts';

const READ_TIMEOUT_MS = 300;
const SHORT_READ = { limits: { request_read_timeout_ms: READ_TIMEOUT_MS } };
/** Bun sweeps its socket timers every 4 s, so a timer of whole seconds fires up to 4 s late. */
const SWEEP_MS = 4000;
/** Slack for a loaded test machine. */
const MARGIN_MS = 1000;
/** uWS gives the headers of a connection's first request 10 s, whatever idleTimeout says. */
const FIRST_HEADERS_MS = 10_000;

const cleanup = closedAfterEach();

describe('the read deadline (request_read_timeout_ms), counted before auth', () => {
  test('a body sent too slowly or not at all: 400, then the connection is closed', async () => {
    const t = await cleanup.server(SHORT_READ);
    const body = JSON.stringify(chatBody());
    const cases = [
      {
        name: 'trickled, Content-Length',
        path: '/api/v1/chat/completions',
        chunked: false,
        trickle: true,
      },
      {
        name: 'silent, Content-Length',
        path: '/api/v1/chat/completions',
        chunked: false,
        trickle: false,
      },
      { name: 'trickled, chunked', path: '/api/v1/chat/completions', chunked: true, trickle: true },
      { name: 'silent, chunked', path: '/api/v1/chat/completions', chunked: true, trickle: false },
      { name: 'decision, trickled', path: '/decision/v1/decide', chunked: false, trickle: true },
      { name: 'admin, trickled', path: '/admin/v1/keys', chunked: false, trickle: true },
    ];
    await Promise.all(
      cases.map(async ({ name, path, chunked, trickle }) => {
        const client = await rawConnect(t.server.port);
        // The admin routes check their token first; the others read the body before any key is
        // looked at.
        const headers: Record<string, string> = path.startsWith('/admin')
          ? { authorization: `Bearer ${ADMIN_TOKEN}` }
          : {};
        client.write(postHead(path, headers, chunked ? 'chunked' : body.length));
        if (trickle) client.trickle(chunked ? `1\r\n${'x'}\r\n`.repeat(body.length) : body, 20);
        const closedMs = await client.closed;
        expect({ name, closedInTime: closedMs < READ_TIMEOUT_MS + MARGIN_MS }).toEqual({
          name,
          closedInTime: true,
        });
        const answer = client.received();
        expect({ name, head: answer.slice(0, 24) }).toEqual({
          name,
          head: 'HTTP/1.1 400 Bad Request',
        });
        expect(answer.toLowerCase()).toContain('connection: close');
        const error = JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)).error;
        expect(error).toEqual({
          message: `The request body did not arrive within ${READ_TIMEOUT_MS} ms.`,
          type: 'invalid_request_error',
          code: 'invalid_request_error',
          param: null,
        });
      }),
    );
  });

  test('a stalled body holds one read deadline, not those of the requests after it', async () => {
    // A read timeout no other test uses, so that the list of its deadlines is this test's alone.
    const readTimeoutMs = 7_321;
    const t = await cleanup.server({ limits: { request_read_timeout_ms: readTimeoutMs } });
    const deadlines = fifoTimersFor(readTimeoutMs);
    const staller = await rawConnect(t.server.port);
    staller.write(postHead('/api/v1/chat/completions', {}, JSON.stringify(chatBody()).length));
    while (deadlines.length === 0) await new Promise((resolve) => setImmediate(resolve));
    // Another key's requests, each with a read deadline behind the stalled one at the head.
    const { key } = await t.createKey({ credits: 10 });
    for (let i = 0; i < 40; i++) {
      const response = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify(chatBody()),
      });
      expect(response.status).toBe(200);
      await response.text();
    }
    expect(deadlines.length).toBe(1);
    // The stalled client goes: its read fails and its deadline goes with it.
    staller.destroy();
    while (deadlines.length > 0) await new Promise((resolve) => setImmediate(resolve));
  });

  test('a kept-alive connection that idles, or trickles its next request, is closed', async () => {
    const t = await cleanup.server(SHORT_READ);
    const boundMs = Math.ceil(READ_TIMEOUT_MS / 1000) * 1000 + SWEEP_MS + MARGIN_MS;
    const idle = await rawConnect(t.server.port);
    const trickling = await rawConnect(t.server.port);
    for (const client of [idle, trickling])
      client.write('GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
    await Promise.all([
      idle.receivedText('{"status":"ok"}'),
      trickling.receivedText('{"status":"ok"}'),
    ]);
    const answeredMs = Date.now();
    trickling.trickle(
      `GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ${'x'.repeat(1000)}\r\n\r\n`,
      50,
    );
    await Promise.all([idle.closed, trickling.closed]);
    expect(Date.now() - answeredMs).toBeLessThan(boundMs);
    // The trickled request was never answered.
    expect(trickling.received().split('HTTP/1.1 200').length).toBe(2);
  }, 15_000);

  test('after a stream (whose idle timer was lifted), the kept-alive connection idles under the ' +
    'deadline again', async () => {
    const t = await cleanup.server(SHORT_READ);
    const { key } = await t.createKey({ credits: 10 });
    const client = await rawConnect(t.server.port);
    const body = JSON.stringify(chatBody({ stream: true }));
    client.write(
      postHead('/api/v1/chat/completions', { authorization: `Bearer ${key}` }, body.length) + body,
    );
    await client.receivedText('data: [DONE]');
    const answeredMs = Date.now();
    await client.closed;
    expect(Date.now() - answeredMs).toBeLessThan(
      Math.ceil(READ_TIMEOUT_MS / 1000) * 1000 + SWEEP_MS + MARGIN_MS,
    );
  }, 15_000);

  test("a new connection that idles, or trickles its headers, is closed by uWS's fixed 10 s " +
    'header timer', async () => {
    const t = await cleanup.server(SHORT_READ);
    const silent = await rawConnect(t.server.port);
    const trickling = await rawConnect(t.server.port);
    trickling.trickle(
      `GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ${'x'.repeat(1000)}\r\n\r\n`,
      50,
    );
    const [silentMs, tricklingMs] = await Promise.all([silent.closed, trickling.closed]);
    expect(silentMs).toBeLessThan(FIRST_HEADERS_MS + SWEEP_MS + MARGIN_MS);
    expect(tricklingMs).toBeLessThan(FIRST_HEADERS_MS + SWEEP_MS + MARGIN_MS);
    expect(trickling.received()).toBe('');
  }, 20_000);
});

/**
 * Beyond the connection's idle timer (1 s here, swept every 4 s): a wait that long would have been
 * cut.
 */
const PROVIDER_SILENCE_MS = SWEEP_MS + 1500;

/**
 * An OpenAI-compatible upstream whose stream says one word, is silent for `silenceMs`, then
 * finishes.
 */
function startPausingUpstream(silenceMs: number): { url: string; stop(): void } {
  const chunk = (content: string, finish: string | null) =>
    `data: ${JSON.stringify({
      id: 'up-1',
      object: 'chat.completion.chunk',
      created: 0,
      model: 'up',
      choices: [{ index: 0, delta: { content }, finish_reason: finish }],
    })}\n\n`;
  const usage = {
    id: 'up-1',
    object: 'chat.completion.chunk',
    created: 0,
    model: 'up',
    choices: [],
    usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
  };
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    async fetch(request) {
      await request.json();
      return new Response(
        new ReadableStream<Uint8Array>({
          type: 'direct',
          async pull(controller) {
            controller.write(chunk('Hello', null));
            controller.flush();
            await new Promise((resolve) => setTimeout(resolve, silenceMs));
            controller.write(
              `${chunk(' there', 'stop')}data: ${JSON.stringify(usage)}\n\ndata: [DONE]\n\n`,
            );
            controller.close();
          },
        }),
        { headers: { 'content-type': 'text/event-stream' } },
      );
    },
  });
  return { url: `http://127.0.0.1:${server.port}/v1`, stop: () => server.stop(true) };
}

describe('a provider slower than the read deadline', () => {
  test('a stream silent between tokens for longer is not cut', async () => {
    const upstream = cleanup.track(startPausingUpstream(PROVIDER_SILENCE_MS));
    const t = await cleanup.server({
      ...SHORT_READ,
      providers: { fake: { type: 'openai', base_url: upstream.url, timeout_ms: 30_000 } },
      models: { model_03: { provider: 'fake', upstream_model: 'up' } },
    });
    const { key } = await t.createKey({ credits: 10 });
    const response = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody({ stream: true })),
    });
    expect(response.status).toBe(200);
    const text = await response.text();
    expect(text).toContain('"content":" there"');
    expect(text.endsWith('data: [DONE]\n\n')).toBe(true);
  }, 20_000);

  test('an answer that takes longer to start is ' +
    'still given: chat, chat stream, decision', async () => {
    const t = await cleanup.server({
      ...SHORT_READ,
      providers: {
        simulator: {
          type: 'simulator',
          ttft_ms: PROVIDER_SILENCE_MS,
          tokens_per_second: 100_000,
          completion_tokens: 12,
        },
      },
    });
    const { key } = await t.createKey({ credits: 10, services: ['chat', 'decision'] });
    const post = (path: string, body: unknown) =>
      fetch(`${t.baseUrl}${path}`, {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify(body),
      });
    const decision = {
      model: 'decision-fast',
      state: { ticket: 'The checkout page fails.' },
      questions: {
        urgency: {
          type: 'choice',
          prompt: 'How urgent is this ticket?',
          criteria: { urgent: 'needs action today', routine: 'can wait' },
        },
      },
    };
    const [chat, stream, decide] = await Promise.all([
      post('/api/v1/chat/completions', chatBody()),
      post('/api/v1/chat/completions', chatBody({ stream: true })),
      post('/decision/v1/decide', decision),
    ]);
    expect(chat.status).toBe(200);
    expect(((await chat.json()) as any).choices[0].finish_reason).toBe('stop');
    expect(stream.status).toBe(200);
    expect((await stream.text()).endsWith('data: [DONE]\n\n')).toBe(true);
    expect(decide.status).toBe(200);
  }, 20_000);
});

describe('a client that vanishes mid-body', () => {
  test('is a 499 in the log, never an internal error; no hold is placed', async () => {
    const lines: string[] = [];
    const logged499 = Promise.withResolvers<void>();
    const logger = pino(
      { level: 'debug' },
      {
        write(line: string) {
          lines.push(line);
          if (line.includes('"status":499')) logged499.resolve();
        },
      },
    );
    const config = testConfig(SHORT_READ);
    const gateway = openGateway(config, logger, ADMIN_TOKEN);
    const running = await startServer(gateway, { hostname: '127.0.0.1', port: 0 });
    try {
      const created = await fetch(`${running.url}/admin/v1/keys`, {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ name: 'vanishing', credits: 10, services: ['chat', 'decision'] }),
      });
      const { id: keyId, key } = (await created.json()) as { id: string; key: string };
      const body = JSON.stringify(chatBody());
      for (const path of ['/api/v1/chat/completions', '/decision/v1/decide']) {
        const client = await rawConnect(running.port);
        client.write(
          postHead(path, { authorization: `Bearer ${key}` }, body.length) + body.slice(0, 20),
        );
        client.destroy();
        await client.closed;
      }
      await logged499.promise;
      // The decision request ends the same way; its end leaves no line to wait for, so wait for the
      // server to go idle.
      while (running.server.pendingRequests > 0)
        await new Promise((resolve) => setImmediate(resolve));
      const records = lines.map((line) => JSON.parse(line) as Record<string, unknown>);
      expect(records.filter((record) => (record.level as number) >= 50)).toEqual([]);
      expect(lines.join('\n')).not.toContain('internal_error');
      expect(records.find((record) => record.status === 499)).toMatchObject({
        code: 'request_cancelled',
      });
      expect(gateway.registry.size).toBe(0);
      const view = (await (
        await fetch(`${running.url}/admin/v1/keys/${keyId}`, {
          headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
        })
      ).json()) as any;
      expect(view.balances).toMatchObject({ held: 0, charged: 0 });
    } finally {
      await running.shutdown(0);
      rmSync(config.data_dir, { recursive: true, force: true });
    }
  });
});
