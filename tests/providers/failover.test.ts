// Deployments and failover through HTTP (CONTRACT §7): the next deployment answers when the first
// fails before the first byte, one charge, every attempt in the status record; no failover after
// the first byte or on a 400; ejection, the probe after the cooldown; weights.
import { expect, test } from 'bun:test';
import { defaultSettings } from '../../src/config/defaults.ts';
import { deepMerge, validateConfig } from '../../src/config/load.ts';
import { bearer, chatBody, closedAfterEach, type TestServer } from '../support/gateway.ts';
import {
  type LifecycleUpstream,
  startLifecycleUpstream,
  type UpstreamAct,
  USAGE,
} from '../support/lifecycle-harness.ts';
import { SseReader } from '../support/sse.ts';

const cleanup = closedAfterEach();
/** model_03: 5 and 14 µcr per token. */
const ANSWER_MICRO = USAGE.prompt_tokens * 5 + USAGE.completion_tokens * 14;
/** Weights that make `a` the first pick in all but one call in a million. */
const A_FIRST = 1_000_000;

function upstream(act: UpstreamAct['kind'] | ((index: number) => UpstreamAct)): LifecycleUpstream {
  const decide = typeof act === 'function' ? act : () => ({ kind: act }) as UpstreamAct;
  return cleanup.track(startLifecycleUpstream((call) => decide(call.index)));
}

/**
 * Deployment a (picked first) and b of model_03; `aTimeoutMs` is a's provider timeout_ms, `a.type`
 * its provider type (openai unless given).
 */
async function twoDeployments(
  a: { url: string; type?: string },
  b: LifecycleUpstream,
  extra: Record<string, unknown> = {},
  aTimeoutMs = 2_000,
): Promise<TestServer> {
  return cleanup.server({
    providers: {
      a: { type: a.type ?? 'openai', base_url: a.url, timeout_ms: aTimeoutMs },
      b: { type: 'openai', base_url: b.url, timeout_ms: 2_000 },
    },
    models: {
      model_03: {
        deployments: [
          { provider: 'a', upstream_model: 'up-a', weight: A_FIRST },
          { provider: 'b', upstream_model: 'up-b', weight: 1 },
        ],
      },
    },
    ...extra,
  });
}

function post(t: TestServer, key: string, body: unknown = chatBody()): Promise<Response> {
  return fetch(`${t.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(key),
    body: JSON.stringify(body),
  });
}

async function record(t: TestServer, key: string, id: string): Promise<any> {
  const response = await fetch(`${t.baseUrl}/api/v1/requests/${id}`, { headers: bearer(key) });
  expect(response.status).toBe(200);
  return response.json();
}

async function balances(t: TestServer, keyId: string): Promise<any> {
  const response = await fetch(`${t.baseUrl}/admin/v1/keys/${keyId}`, {
    headers: { authorization: 'Bearer test-admin-token-0123456789' },
  });
  return ((await response.json()) as any).balances;
}

const attempt = (provider: string, outcome: string, errorCode: string | null = null) => ({
  provider,
  upstream_model: provider === 'a' ? 'up-a' : 'up-b',
  outcome,
  error_code: errorCode,
  latency_ms: expect.any(Number),
});

for (const [name, act] of [
  ['5xx', { kind: 'fail', status: 503 }],
  ['429', { kind: 'fail', status: 429 }],
] as const) {
  test(`first deployment answers ${name}: the second answers, charged once`, async () => {
    const a = upstream(() => act);
    const b = upstream('answer');
    const t = await twoDeployments(a, b);
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const response = await post(t, key);
    expect(response.status).toBe(200);
    const body = (await response.json()) as any;
    expect(body.choices[0].message.content).toBe('Hello there');
    expect(a.calls.length).toBe(1);
    expect(b.calls.length).toBe(1);
    expect(b.calls[0]!.body.model).toBe('up-b');
    const status = await record(t, key, body.id);
    expect(status.attempts).toEqual([attempt('a', 'error', 'upstream_error'), attempt('b', 'ok')]);
    expect(Math.round(status.charged_credits * 1e6)).toBe(ANSWER_MICRO);
    const after = await balances(t, keyId);
    expect(Math.round(after.charged * 1e6)).toBe(ANSWER_MICRO);
    expect(after.held).toBe(0);
  });
}

function postWithKey(t: TestServer, key: string, idempotencyKey: string): Promise<Response> {
  return fetch(`${t.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: { ...bearer(key), 'idempotency-key': idempotencyKey },
    body: JSON.stringify(chatBody()),
  });
}

test('an Idempotency-Key covers every attempt: a repeat is 409 and calls nothing', async () => {
  const release = Promise.withResolvers<void>();
  const a = upstream(() => ({ kind: 'fail', status: 503 }));
  const b = upstream(() => ({ kind: 'answerAfter', until: release.promise }));
  const t = await twoDeployments(a, b);
  const { id: keyId, key } = await t.createKey({ credits: 10 });
  const original = postWithKey(t, key, 'failover-once-1');
  await b.call(0);
  // The first deployment failed, the second holds the call: the key is bound to that one request.
  const during = await postWithKey(t, key, 'failover-once-1');
  expect(during.status).toBe(409);
  const duringBody = (await during.json()) as any;
  expect(duringBody.error.code).toBe('request_in_progress');
  release.resolve();
  const answered = await original;
  expect(answered.status).toBe(200);
  const { id } = (await answered.json()) as { id: string };
  expect(duringBody.request_id).toBe(id);
  const after = await postWithKey(t, key, 'failover-once-1');
  expect(after.status).toBe(409);
  const afterBody = (await after.json()) as any;
  expect(afterBody.error.code).toBe('request_already_completed');
  expect(afterBody.request_id).toBe(id);
  expect(a.calls.length).toBe(1);
  expect(b.calls.length).toBe(1);
  const status = await record(t, key, id);
  expect(status.attempts).toEqual([attempt('a', 'error', 'upstream_error'), attempt('b', 'ok')]);
  const balance = await balances(t, keyId);
  expect(Math.round(balance.charged * 1e6)).toBe(ANSWER_MICRO);
  expect(balance.held).toBe(0);
});

test('an unreachable first deployment fails over, stream too', async () => {
  const b = upstream('answer');
  const dead = startLifecycleUpstream();
  const deadUrl = dead.url;
  dead.stop();
  const t = await cleanup.server({
    providers: {
      a: { type: 'openai', base_url: deadUrl },
      b: { type: 'openai', base_url: b.url },
    },
    models: {
      model_03: {
        deployments: [
          { provider: 'a', upstream_model: 'up-a', weight: A_FIRST },
          { provider: 'b', upstream_model: 'up-b' },
        ],
      },
    },
  });
  const { key } = await t.createKey({ credits: 10 });
  const response = await post(t, key, chatBody({ stream: true }));
  expect(response.status).toBe(200);
  const reader = new SseReader(response);
  const events = await reader.rest();
  const first = JSON.parse(events[0]!) as { id: string };
  expect(events.at(-1)).toBe('[DONE]');
  const status = await record(t, key, first.id);
  expect(status.attempts).toEqual([
    attempt('a', 'error', 'upstream_unreachable'),
    attempt('b', 'ok'),
  ]);
});

test('a 400 never fails over: one call, the error as the first deployment gave it', async () => {
  const a = upstream(() => ({ kind: 'fail', status: 400 }));
  const b = upstream('answer');
  const t = await twoDeployments(a, b);
  const { key } = await t.createKey({ credits: 10 });
  const response = await post(t, key);
  expect(response.status).toBe(502);
  expect(((await response.json()) as any).error.code).toBe('upstream_error');
  expect(a.calls.length).toBe(1);
  expect(b.calls.length).toBe(0);
});

test('a failure after the first streamed byte: an error event, no second call', async () => {
  // The first deployment sends a chunk, then nothing: its silence timer ends it after the client
  // had bytes (a timeout would fail over before them).
  const a = upstream('hold');
  const b = upstream('answer');
  const t = await cleanup.server({
    providers: {
      a: { type: 'openai', base_url: a.url, timeout_ms: 150 },
      b: { type: 'openai', base_url: b.url },
    },
    models: {
      model_03: {
        deployments: [
          { provider: 'a', upstream_model: 'up-a', weight: A_FIRST },
          { provider: 'b', upstream_model: 'up-b' },
        ],
      },
    },
  });
  const { key } = await t.createKey({ credits: 10 });
  const response = await post(t, key, chatBody({ stream: true }));
  expect(response.status).toBe(200);
  const events = await new SseReader(response).rest();
  const last = JSON.parse(events.at(-1)!) as any;
  expect(last.error.code).toBe('upstream_timeout');
  expect(b.calls.length).toBe(0);
  const first = JSON.parse(events[0]!) as { id: string };
  const status = await record(t, key, first.id);
  expect(status.attempts).toEqual([attempt('a', 'error', 'upstream_timeout')]);
});

test(
  "the request's own deadline passing during an attempt: that attempt is an error with the " +
    "request's code, not a cancel",
  async () => {
    // The provider's own silence timer (2 s) is longer than the request's deadline (300 ms): the
    // run's deadline ends the attempt, through the run's signal.
    const a = upstream('silent');
    const b = upstream('answer');
    const t = await twoDeployments(a, b, { limits: { upstream_timeout_ms: 300 } });
    const { key } = await t.createKey({ credits: 10 });
    const response = await post(t, key);
    expect(response.status).toBe(504);
    expect(((await response.json()) as any).error.code).toBe('upstream_timeout');
    const status = await record(t, key, response.headers.get('x-request-id')!);
    expect(status.error_code).toBe('upstream_timeout');
    expect(status.attempts).toEqual([attempt('a', 'error', 'upstream_timeout')]);
    expect(b.calls.length).toBe(0);
  },
);

test('a cancel during an attempt: that attempt is cancelled, with no error code', async () => {
  const a = upstream('silent');
  const b = upstream('answer');
  const t = await twoDeployments(a, b);
  const { key } = await t.createKey({ credits: 10 });
  const pending = post(t, key);
  await a.call(0);
  const listed = await fetch(`${t.baseUrl}/admin/v1/requests?state=in_progress`, {
    headers: { authorization: 'Bearer test-admin-token-0123456789' },
  });
  const [live] = ((await listed.json()) as { data: Array<{ id: string }> }).data;
  const cancelled = await fetch(`${t.baseUrl}/api/v1/requests/${live!.id}/cancel`, {
    method: 'POST',
    headers: bearer(key),
  });
  expect(cancelled.status).toBe(202);
  expect((await pending).status).toBe(499);
  const status = await record(t, key, live!.id);
  expect(status.attempts).toEqual([attempt('a', 'cancelled')]);
});

test('ejection after failures in a row, one probe after the cooldown, recovery', async () => {
  let aFails = true;
  const a = upstream(() => (aFails ? { kind: 'fail', status: 500 } : { kind: 'answer' }));
  const b = upstream('answer');
  const cooldownMs = 400;
  const t = await twoDeployments(a, b, {
    routing: { max_attempts: 3, failures_to_eject: 2, cooldown_ms: cooldownMs },
  });
  const { key } = await t.createKey({ credits: 10 });
  for (let i = 0; i < 2; i++) expect((await post(t, key)).status).toBe(200);
  expect(a.calls.length).toBe(2);
  const metrics = async () => (await fetch(`${t.baseUrl}/metrics`)).text();
  const series = (state: string) =>
    `tollgate_deployment_state{model="model_03",provider="a",upstream_model="up-a",` +
    `state="${state}"} 1`;
  expect(await metrics()).toContain(series('ejected'));
  // Ejected: skipped although it weighs a million times more.
  const skipped = (await (await post(t, key)).json()) as any;
  expect(a.calls.length).toBe(2);
  expect((await record(t, key, skipped.id)).attempts).toEqual([attempt('b', 'ok')]);
  // After the cooldown, one call probes it; it answers and is healthy again.
  aFails = false;
  await Bun.sleep(cooldownMs);
  // Pickable again, but only an answer shows it healthy.
  expect(await metrics()).toContain(series('ejected'));
  const probe = (await (await post(t, key)).json()) as any;
  expect(a.calls.length).toBe(3);
  expect((await record(t, key, probe.id)).attempts).toEqual([attempt('a', 'ok')]);
  expect(await metrics()).toContain(series('healthy'));
  expect(await metrics()).toContain(
    'tollgate_deployment_attempts_total{model="model_03",provider="a",upstream_model="up-a",' +
      'outcome="error"} 2',
  );
});

test('weights are respected within tolerance over many calls', async () => {
  const t = await cleanup.server({
    providers: {
      a: { type: 'simulator', ttft_ms: 0, tokens_per_second: 100_000 },
      b: { type: 'simulator', ttft_ms: 0, tokens_per_second: 100_000 },
    },
    models: {
      model_03: {
        deployments: [
          { provider: 'a', weight: 3 },
          { provider: 'b', weight: 1 },
        ],
      },
    },
  });
  const { key } = await t.createKey({ credits: 100 });
  const calls = 400;
  let onA = 0;
  for (let i = 0; i < calls; i++) {
    const body = (await (await post(t, key, chatBody({ max_completion_tokens: 4 }))).json()) as any;
    const status = await record(t, key, body.id);
    expect(status.attempts).toHaveLength(1);
    if (status.attempts[0].provider === 'a') onA++;
  }
  // 3:1 → 75 %; 400 calls put one standard deviation at ~2.2 %: 8 % is over 3.5 of them.
  expect(Math.abs(onA / calls - 0.75)).toBeLessThan(0.08);
});

test('routing.max_attempts bounds the upstream calls of one request', async () => {
  const failing = [0, 1, 2].map(() => upstream(() => ({ kind: 'fail', status: 503 })));
  const t = await cleanup.server({
    providers: Object.fromEntries(
      failing.map((fake, i) => [`d${i}`, { type: 'openai', base_url: fake.url }]),
    ),
    models: {
      model_03: {
        deployments: failing.map((_, i) => ({ provider: `d${i}`, upstream_model: 'up' })),
      },
    },
    routing: { max_attempts: 2, failures_to_eject: 3, cooldown_ms: 30_000 },
  });
  const { key } = await t.createKey({ credits: 10 });
  const response = await post(t, key);
  expect(response.status).toBe(502);
  const body = (await response.json()) as any;
  expect(body.error.code).toBe('upstream_error');
  expect(failing.reduce((calls, fake) => calls + fake.calls.length, 0)).toBe(2);
  const id = response.headers.get('x-request-id');
  expect(id).not.toBeNull();
  expect((await record(t, key, id!)).attempts).toEqual([
    expect.objectContaining({ outcome: 'error', error_code: 'upstream_error' }),
    expect.objectContaining({ outcome: 'error', error_code: 'upstream_error' }),
  ]);
});

test('routing.max_attempts above the bound of 16 is refused at start, naming the field', () => {
  expect(() =>
    validateConfig(deepMerge(defaultSettings() as any, { routing: { max_attempts: 17 } } as any)),
  ).toThrow('routing.max_attempts');
});

/**
 * An upstream that answers 200 at once and then sends only bytes that carry nothing: SSE comments
 * to a stream, whitespace before a JSON body never sent. A call's body ends when its client goes.
 */
function keepAliveOnly(): { url: string; calls: number; stop(): void } {
  const state = { calls: 0 };
  const server = Bun.serve({
    port: 0,
    idleTimeout: 0,
    async fetch(request) {
      state.calls++;
      const stream = ((await request.json()) as { stream?: boolean }).stream === true;
      const filler = new TextEncoder().encode(stream ? ': keep-alive\n\n' : ' ');
      let timer: ReturnType<typeof setInterval> | undefined;
      const body = new ReadableStream<Uint8Array>({
        start(controller) {
          timer = setInterval(() => controller.enqueue(filler), 50);
          request.signal.addEventListener('abort', () => {
            clearInterval(timer);
            controller.close();
          });
        },
        cancel: () => clearInterval(timer),
      });
      const type = stream ? 'text/event-stream' : 'application/json';
      return new Response(body, { headers: { 'content-type': type } });
    },
  });
  const handle = {
    url: `http://127.0.0.1:${server.port}/v1`,
    get calls() {
      return state.calls;
    },
    stop: () => server.stop(true),
  };
  cleanup.track(handle);
  return handle;
}

for (const stream of [false, true]) {
  test(
    `keep-alives are no answer (${stream ? 'stream' : 'non-stream'}): the first deployment ` +
      'times out at its timeout_ms and the second answers',
    async () => {
      const a = keepAliveOnly();
      const b = upstream('answer');
      const t = await twoDeployments(
        a,
        b,
        { limits: { upstream_timeout_ms: 20_000, stream_timeout_ms: 20_000 } },
        400,
      );
      const { key } = await t.createKey({ credits: 10 });
      const response = await post(t, key, chatBody({ stream }));
      expect(response.status).toBe(200);
      const text = await response.text();
      expect(text).toContain('Hello');
      const id = /chatcmpl-[A-Za-z0-9]+/.exec(text)![0];
      const status = await record(t, key, id);
      expect(status.attempts).toEqual([
        attempt('a', 'error', 'upstream_timeout'),
        attempt('b', 'ok'),
      ]);
      expect(a.calls).toBe(1);
      expect(b.calls.length).toBe(1);
    },
  );
}

/**
 * An upstream that answers every call 200 with an error inside: the first SSE event of a stream,
 * or the JSON body of a plain call (OpenRouter and Gemini do this when overloaded).
 */
function errorInsideUpstream(error: Record<string, unknown>): { url: string; calls: number } {
  const state = { url: '', calls: 0 };
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    async fetch(request) {
      state.calls++;
      await request.text();
      const url = new URL(request.url);
      const sse = url.pathname.includes('streamGenerateContent') || url.search.includes('alt=sse');
      const streamed = sse || request.headers.get('accept') === 'text/event-stream';
      if (streamed)
        return new Response(`data: ${JSON.stringify({ error })}\n\n`, {
          headers: { 'content-type': 'text/event-stream' },
        });
      return Response.json({ error });
    },
  });
  state.url = `http://127.0.0.1:${server.port}`;
  cleanup.track({ stop: () => server.stop(true) });
  return state;
}

for (const [dialect, error, failsOver] of [
  ['openai', { code: 502, message: 'Provider returned error' }, true],
  ['openai', { message: 'overloaded', type: 'server_error', code: null }, true],
  ['openai', { code: 429, message: 'rate limited' }, true],
  ['openai', { message: 'bad', type: 'invalid_request_error', code: 'invalid_value' }, false],
  ['gemini', { code: 503, message: 'The model is overloaded.', status: 'UNAVAILABLE' }, true],
  ['gemini', { code: 429, message: 'quota', status: 'RESOURCE_EXHAUSTED' }, true],
  ['gemini', { code: 400, message: 'bad', status: 'INVALID_ARGUMENT' }, false],
] as const) {
  test(
    `${dialect}: an error inside a 200 answer, ${JSON.stringify(error)}, ` +
      (failsOver ? 'fails over like its status would' : 'does not fail over (the request’s fault)'),
    async () => {
      const a = errorInsideUpstream(error);
      const b = upstream('answer');
      const base = dialect === 'gemini' ? `${a.url}/v1beta` : `${a.url}/v1`;
      const t = await twoDeployments({ url: base, type: dialect }, b);
      const { key } = await t.createKey({ credits: 10 });
      for (const stream of [false, true]) {
        const callsBefore = { a: a.calls, b: b.calls.length };
        const response = await post(t, key, chatBody({ stream }));
        const text = await response.text();
        expect({ stream, calledA: a.calls - callsBefore.a }).toEqual({ stream, calledA: 1 });
        if (failsOver) {
          expect({ stream, status: response.status }).toEqual({ stream, status: 200 });
          expect(text).toContain('Hello');
          expect(b.calls.length - callsBefore.b).toBe(1);
        } else {
          expect({ stream, status: response.status }).toEqual({ stream, status: 502 });
          expect(JSON.parse(text).error.code).toBe('upstream_error');
          expect(b.calls.length).toBe(callsBefore.b);
        }
      }
    },
  );
}

test(
  'an OpenAI-style deployment gets every tool call id within 40 characters (a Gemini id with its ' +
    'signature runs to KBs), calls and results still paired; shorter ids as they were',
  async () => {
    const b = upstream('answer');
    const t = await cleanup.server({
      providers: { b: { type: 'openai', base_url: b.url, timeout_ms: 2_000 } },
      models: { model_03: { provider: 'b', upstream_model: 'up-b' } },
    });
    const { key } = await t.createKey({ credits: 10 });
    const ids = [`call_x__sig_${'A'.repeat(800)}`, `call_y__sig_${'A'.repeat(800)}`, 'call_short'];
    const messages = [
      { role: 'user', content: 'Weather?' },
      {
        role: 'assistant',
        content: null,
        tool_calls: ids.map((id) => ({
          id,
          type: 'function',
          function: { name: 'get_weather', arguments: '{}' },
        })),
      },
      ...ids.map((id) => ({ role: 'tool', tool_call_id: id, content: '21 C' })),
    ];
    const response = await post(t, key, chatBody({ messages }));
    expect(response.status).toBe(200);
    const sent = b.calls[0]!.body.messages;
    const callIds = sent[1].tool_calls.map((call: any) => call.id);
    expect(sent.slice(2).map((message: any) => message.tool_call_id)).toEqual(callIds);
    expect(callIds[2]).toBe('call_short');
    expect(new Set(callIds).size).toBe(3);
    for (const id of callIds) expect(id.length).toBeLessThanOrEqual(40);
  },
);

/**
 * An upstream that answers `status` at once, then trickles its declared 1,000-byte error body a
 * byte every 100 ms: never silent, never done.
 */
function tricklingErrorUpstream(status: number): { url: string } {
  const timers = new Set<ReturnType<typeof setInterval>>();
  const server = Bun.listen<undefined>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      data(socket) {
        socket.write(`HTTP/1.1 ${status} Busy\r\ncontent-type: application/json\r\n`);
        socket.write('content-length: 1000\r\n\r\n{');
        const timer = setInterval(() => socket.write(' '), 100);
        timers.add(timer);
      },
      close() {},
    },
  });
  cleanup.track({
    stop: () => {
      for (const timer of timers) clearInterval(timer);
      server.stop(true);
    },
  });
  return { url: `http://127.0.0.1:${server.port}/v1` };
}

for (const [status, failsOver] of [
  [503, true],
  [400, false],
] as const) {
  test(
    `a ${status} whose error body trickles in is answered as its status (` +
      `${failsOver ? 'fails over' : 'no failover'}), not held to the request's deadline`,
    async () => {
      const a = tricklingErrorUpstream(status);
      const b = upstream('answer');
      const t = await twoDeployments(a, b, { limits: { upstream_timeout_ms: 8_000 } }, 8_000);
      const { key } = await t.createKey({ credits: 10 });
      const response = await post(t, key);
      const body = (await response.json()) as any;
      if (failsOver) {
        expect(response.status).toBe(200);
        expect(b.calls.length).toBe(1);
        const status = await record(t, key, body.id);
        expect(status.attempts).toEqual([
          attempt('a', 'error', 'upstream_error'),
          attempt('b', 'ok'),
        ]);
      } else {
        expect(response.status).toBe(502);
        expect(body.error.code).toBe('upstream_error');
        expect(b.calls.length).toBe(0);
      }
    },
  );
}
