// A chat request's life through HTTP: status, cancel, disconnect, timeouts, upstream failures,
// billing.
import { describe, expect, setSystemTime, test } from 'bun:test';
import {
  ADMIN_TOKEN,
  bearer,
  chatBody,
  closedAfterEach,
  type TestServer,
} from '../support/gateway.ts';
import { startLifecycleUpstream } from '../support/lifecycle-harness.ts';
import { SseReader } from '../support/sse.ts';
import { type FakeUpstream, startFakeUpstream, upstreamOverrides } from '../support/upstream.ts';

const SLOW_SIMULATOR = {
  providers: {
    simulator: { type: 'simulator', ttft_ms: 0, tokens_per_second: 50, completion_tokens: 5000 },
  },
};

const cleanup = closedAfterEach();
const server = cleanup.server;

function upstream(mode: Parameters<typeof startFakeUpstream>[0]): FakeUpstream {
  return cleanup.track(startFakeUpstream(mode));
}

function post(
  t: TestServer,
  key: string,
  body: unknown,
  headers: Record<string, string> = {},
  signal?: AbortSignal,
): Promise<Response> {
  return fetch(`${t.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(key, headers),
    body: JSON.stringify(body),
    signal,
  });
}

interface Balances {
  credits: number;
  held: number;
  charged: number;
  credits_added: number;
  token_wallet: number;
}

async function balances(t: TestServer, keyId: string): Promise<Balances> {
  const response = await fetch(`${t.baseUrl}/admin/v1/keys/${keyId}`, {
    headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
  });
  return ((await response.json()) as any).balances;
}

async function status(
  t: TestServer,
  key: string,
  id: string,
): Promise<{ status: number; body: any }> {
  const response = await fetch(`${t.baseUrl}/api/v1/requests/${id}`, { headers: bearer(key) });
  return { status: response.status, body: await response.json() };
}

function cancel(t: TestServer, key: string, id: string): Promise<Response> {
  return fetch(`${t.baseUrl}/api/v1/requests/${id}/cancel`, {
    method: 'POST',
    headers: bearer(key),
  });
}

describe('status', () => {
  test('a completed request: usage, exact charge, reservation; never the text', async () => {
    const t = await server();
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const response = await post(t, key, chatBody({ max_completion_tokens: 100 }));
    const completion = (await response.json()) as any;
    const { status: code, body } = await status(t, key, completion.id);
    expect(code).toBe(200);
    const { prompt_tokens, completion_tokens } = completion.usage;
    // model_03: 5 credits / 1M input, 14 / 1M output → exactly 5 and 14 µcr per token.
    const chargedMicro = prompt_tokens * 5 + completion_tokens * 14;
    expect(body).toEqual({
      object: 'request.status',
      request_id: completion.id,
      request_status: 'completed',
      status_url: `/api/v1/requests/${completion.id}`,
      model: 'model_03',
      stream: false,
      created: completion.created,
      finished: expect.any(Number),
      usage: completion.usage,
      reserved_credits: (prompt_tokens * 5 + 100 * 14) / 1e6,
      charged_credits: chargedMicro / 1e6,
      error_code: null,
      // The one deployment of model_03 (CONTRACT §7).
      attempts: [
        {
          provider: 'simulator',
          upstream_model: 'model_03',
          outcome: 'ok',
          error_code: null,
          latency_ms: expect.any(Number),
        },
      ],
    });
    expect(await balances(t, keyId)).toEqual({
      credits: (10_000_000 - chargedMicro) / 1e6,
      held: 0,
      charged: chargedMicro / 1e6,
      credits_added: 10,
      token_wallet: 0,
    });
  });

  test("another key's request and an unknown id are both 404 request_not_found", async () => {
    const t = await server();
    const owner = await t.createKey();
    const other = await t.createKey();
    const completion = (await (await post(t, owner.key, chatBody())).json()) as any;
    for (const [key, id] of [
      [other.key, completion.id],
      [owner.key, 'chatcmpl-doesnotexist'],
    ]) {
      const { status: code, body } = await status(t, key!, id!);
      expect(code).toBe(404);
      expect(body.error.code).toBe('request_not_found');
      const cancelled = await cancel(t, key!, id!);
      expect(cancelled.status).toBe(404);
    }
  });

  test('cancel of a finished request is 409 request_already_completed', async () => {
    const t = await server();
    const { key } = await t.createKey();
    const completion = (await (await post(t, key, chatBody())).json()) as any;
    const response = await cancel(t, key, completion.id);
    expect(response.status).toBe(409);
    const body = (await response.json()) as any;
    expect(body.error.code).toBe('request_already_completed');
    expect(body.request_status).toBe('completed');
  });

  test('a running request shows its attempt in_progress, then as it ended', async () => {
    const fake = upstream('gated');
    const t = await server(upstreamOverrides(fake));
    const { key } = await t.createKey({ credits: 10 });
    const headers = { 'idempotency-key': 'running-attempt-01' };
    const original = post(t, key, chatBody(), headers);
    await fake.nextCall.promise;
    const id = ((await (await post(t, key, chatBody(), headers)).json()) as any).request_id;
    const running = await status(t, key, id);
    expect(running.body.request_status).toBe('in_progress');
    // Not an `ok` of 0 ms while the provider still holds it (audit O).
    expect(running.body.attempts).toEqual([
      {
        provider: expect.any(String),
        upstream_model: expect.any(String),
        outcome: 'in_progress',
        error_code: null,
        latency_ms: expect.any(Number),
      },
    ]);
    fake.gate.resolve();
    expect((await original).status).toBe(200);
    expect((await status(t, key, id)).body.attempts).toMatchObject([{ outcome: 'ok' }]);
  });
});

describe('cancel', () => {
  test(
    'a stream: 202, the stream ends with request_cancelled, ' +
      'the hold is released, status cancelled',
    async () => {
      const t = await server(SLOW_SIMULATOR);
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const response = await post(t, key, chatBody({ stream: true }));
      expect(response.status).toBe(200);
      const reader = new SseReader(response);
      const first = JSON.parse((await reader.next())!);
      expect((await balances(t, keyId)).held).toBeGreaterThan(0);

      const cancelled = await cancel(t, key, first.id);
      expect(cancelled.status).toBe(202);
      expect(await cancelled.json()).toEqual({
        request_id: first.id,
        cancel_requested: true,
        request_status: 'cancelled',
        status_url: `/api/v1/requests/${first.id}`,
      });
      const rest = await reader.rest();
      expect(rest.at(-1)).not.toBe('[DONE]');
      expect(JSON.parse(rest.at(-1)!).error.code).toBe('request_cancelled');
      expect((await status(t, key, first.id)).body.request_status).toBe('cancelled');
      expect(await balances(t, keyId)).toEqual({
        credits: 10,
        held: 0,
        charged: 0,
        credits_added: 10,
        token_wallet: 0,
      });
    },
  );

  test(
    'a non-stream call: found through its ' + 'Idempotency-Key, cancelled, the original gets 499',
    async () => {
      const t = await server(SLOW_SIMULATOR);
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const headers = { 'idempotency-key': 'cancel-me-0001' };
      const original = post(t, key, chatBody(), headers);
      // Repeat until the original is admitted: the 409 carries its request id.
      let conflict: any;
      for (;;) {
        const again = await post(t, key, chatBody(), headers);
        if (again.status === 409) {
          conflict = await again.json();
          break;
        }
        await again.text();
      }
      expect(conflict.error.code).toBe('request_in_progress');
      expect(conflict.request_status).toBe('in_progress');
      expect((await cancel(t, key, conflict.request_id)).status).toBe(202);
      const answer = await original;
      expect(answer.status).toBe(499);
      expect(((await answer.json()) as any).error).toEqual({
        message: expect.any(String),
        type: 'cancelled_error',
        code: 'request_cancelled',
        param: null,
      });
      expect(await balances(t, keyId)).toEqual({
        credits: 10,
        held: 0,
        charged: 0,
        credits_added: 10,
        token_wallet: 0,
      });
      const { body } = await status(t, key, conflict.request_id);
      expect(body.request_status).toBe('cancelled');
      expect(body.error_code).toBe('request_cancelled');
    },
  );

  test(
    'cancel reaches the upstream: the fake ' + 'provider sees the abort, stream and non-stream',
    async () => {
      const fake = upstream('endless');
      const t = await server(upstreamOverrides(fake));
      const { key } = await t.createKey({ credits: 10 });

      const stream = await post(t, key, chatBody({ stream: true }));
      const first = JSON.parse((await new SseReader(stream).next())!);
      const sawAbort = fake.nextAbort.promise;
      expect((await cancel(t, key, first.id)).status).toBe(202);
      await sawAbort;
      expect(fake.aborts).toBe(1);

      const headers = { 'idempotency-key': 'upstream-abort-1' };
      const called = fake.nextCall.promise;
      const original = post(t, key, chatBody(), headers);
      await called;
      const conflict = (await (await post(t, key, chatBody(), headers)).json()) as any;
      const sawSecondAbort = fake.nextAbort.promise;
      expect((await cancel(t, key, conflict.request_id)).status).toBe(202);
      await sawSecondAbort;
      expect((await original).status).toBe(499);
      expect(fake.aborts).toBe(2);
    },
  );
});

describe('client disconnect', () => {
  test(
    'a stream whose client goes away is cancelled, ' + 'its hold released, the upstream aborted',
    async () => {
      const fake = upstream('endless');
      const t = await server(upstreamOverrides(fake));
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const controller = new AbortController();
      const response = await post(t, key, chatBody({ stream: true }), {}, controller.signal);
      const first = JSON.parse((await new SseReader(response).next())!);
      const sawAbort = fake.nextAbort.promise;
      controller.abort();
      await sawAbort;
      // The actor records the cancel once the provider stops; wait for it through the status
      // endpoint.
      await t.gateway.registry.get(first.id)?.settled;
      expect((await status(t, key, first.id)).body.request_status).toBe('cancelled');
      expect(await balances(t, keyId)).toEqual({
        credits: 10,
        held: 0,
        charged: 0,
        credits_added: 10,
        token_wallet: 0,
      });
    },
  );

  test('a non-stream call whose client goes away is cancelled', async () => {
    const fake = upstream('hang');
    const t = await server(upstreamOverrides(fake));
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const controller = new AbortController();
    const called = fake.nextCall.promise;
    const pending = post(t, key, chatBody(), {}, controller.signal).catch((error) => error);
    await called;
    const [actor] = t.gateway.registry.all();
    controller.abort();
    await pending;
    await actor!.settled;
    expect((await status(t, key, actor!.id)).body.request_status).toBe('cancelled');
    expect((await balances(t, keyId)).held).toBe(0);
    expect((await balances(t, keyId)).charged).toBe(0);
  });
});

describe('time limits', () => {
  test(
    'a stream past stream_timeout_ms ends with a ' +
      'stream_timeout error event and keeps the hold',
    async () => {
      const t = await server({ ...SLOW_SIMULATOR, limits: { stream_timeout_ms: 150 } });
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const response = await post(t, key, chatBody({ stream: true }));
      expect(response.status).toBe(200);
      const events = await new SseReader(response).rest();
      expect(events).not.toContain('[DONE]');
      const last = JSON.parse(events.at(-1)!);
      expect(last.error.code).toBe('stream_timeout');
      const id = JSON.parse(events[0]!).id;
      const { body } = await status(t, key, id);
      expect(body.request_status).toBe('error');
      expect(body.error_code).toBe('stream_timeout');
      // billing.on_error = keep (the spec): the reservation is charged in full.
      expect(body.charged_credits).toBe(body.reserved_credits);
      const after = await balances(t, keyId);
      expect(after.held).toBe(0);
      expect(after.charged).toBe(body.reserved_credits);
    },
  );

  const SILENT_STREAM =
    'a stream silent past stream_timeout_ms gets its stream_timeout event, whenever the ' +
    "connection's idle sweep comes (Bun sweeps every 4 s: the backstop must not fire first)";
  test(SILENT_STREAM, async () => {
    // Headers and one chunk, then silence: nothing re-arms the connection's idle timer. Three
    // streams one after the other meet Bun's 4 s sweep at different points; a backstop armed
    // for ceil(3 s) + 1 fired before the deadline in ~3 of 4 (the client saw a reset and the
    // request was billed as cancelled).
    const fake = cleanup.track(startLifecycleUpstream(() => ({ kind: 'hold' })));
    const t = await server({
      providers: { fake: { type: 'openai', base_url: fake.url, timeout_ms: 60_000 } },
      models: { model_03: { provider: 'fake', upstream_model: 'up' } },
      limits: { stream_timeout_ms: 3_000 },
    });
    const { key } = await t.createKey({ credits: 10 });
    for (let round = 0; round < 3; round++) {
      const response = await post(t, key, chatBody({ stream: true }));
      expect(response.status).toBe(200);
      const events = await new SseReader(response).rest();
      expect({ round, last: JSON.parse(events.at(-1)!).error?.code }).toEqual({
        round,
        last: 'stream_timeout',
      });
      const { body } = await status(t, key, JSON.parse(events[0]!).id);
      expect(body.error_code).toBe('stream_timeout');
      // The deadline ended the attempt: an error with the request's code, not a cancel.
      expect(body.attempts).toMatchObject([{ outcome: 'error', error_code: 'stream_timeout' }]);
    }
  }, 20_000); // Three streams of 3 s.

  test(
    'a stream that reaches stream_timeout_ms before its first byte answers a plain 504 ' +
      'stream_timeout, a code its OpenAPI entry lists',
    async () => {
      const fake = cleanup.track(startLifecycleUpstream(() => ({ kind: 'silent' })));
      const t = await server({
        providers: { fake: { type: 'openai', base_url: fake.url, timeout_ms: 60_000 } },
        models: { model_03: { provider: 'fake', upstream_model: 'up' } },
        limits: { stream_timeout_ms: 300 },
      });
      const { key } = await t.createKey({ credits: 10 });
      const response = await post(t, key, chatBody({ stream: true }));
      expect(response.status).toBe(504);
      const body = (await response.json()) as any;
      expect(body.error).toMatchObject({ type: 'timeout_error', code: 'stream_timeout' });
      const document = (await (await fetch(`${t.baseUrl}/openapi.json`)).json()) as any;
      const documented = JSON.stringify(
        document.paths['/api/v1/chat/completions'].post.responses['504'],
      );
      expect(documented).toContain('stream_timeout');
    },
  );

  test('a non-stream call past upstream_timeout_ms is 504 upstream_timeout', async () => {
    const fake = upstream('hang');
    const t = await server(upstreamOverrides(fake, { limits: { upstream_timeout_ms: 150 } }));
    const { key } = await t.createKey({ credits: 10 });
    const sawAbort = fake.nextAbort.promise;
    const response = await post(t, key, chatBody());
    expect(response.status).toBe(504);
    expect(((await response.json()) as any).error.code).toBe('upstream_timeout');
    await sawAbort;
  });
});

describe('upstream failures', () => {
  test('upstream 500 → 502 upstream_error; the hold is kept under on_error keep', async () => {
    const fake = upstream('error500');
    const t = await server(upstreamOverrides(fake));
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const response = await post(t, key, chatBody({ max_completion_tokens: 1000 }));
    expect(response.status).toBe(502);
    const body = (await response.json()) as any;
    expect(body.error).toEqual({
      message: expect.any(String),
      type: 'upstream_error',
      code: 'upstream_error',
      param: null,
    });
    const id = response.headers.get('x-request-id')!;
    const record = (await status(t, key, id)).body;
    expect(record.request_status).toBe('error');
    expect(record.error_code).toBe('upstream_error');
    expect(record.charged_credits).toBe(record.reserved_credits);
    expect((await balances(t, keyId)).held).toBe(0);
  });

  test('under billing.on_error release, an error charges nothing', async () => {
    const fake = upstream('error500');
    const t = await server(upstreamOverrides(fake, { billing: { on_error: 'release' } }));
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const stream = await post(t, key, chatBody({ stream: true }));
    // Failed before any output: a plain error reply, not a 200 stream.
    expect(stream.status).toBe(502);
    expect(await balances(t, keyId)).toEqual({
      credits: 10,
      held: 0,
      charged: 0,
      credits_added: 10,
      token_wallet: 0,
    });
  });

  test('the upstream usage is passed through and billed', async () => {
    const fake = upstream('ok');
    const t = await server(upstreamOverrides(fake));
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const completion = (await (await post(t, key, chatBody())).json()) as any;
    expect(completion.choices[0].message.content).toBe('Hello there');
    expect(completion.usage).toEqual({ prompt_tokens: 11, completion_tokens: 2, total_tokens: 13 });
    expect((await balances(t, keyId)).charged).toBe((11 * 5 + 2 * 14) / 1e6);
  });
});

describe('idempotency', () => {
  test(
    'same key, same content in any key order: 409 ' +
      'request_already_completed pointing at the original',
    async () => {
      const t = await server();
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const headers = { 'idempotency-key': 'order-123:abc' };
      const first = await post(
        t,
        key,
        { model: 'model_03', messages: [{ role: 'user', content: 'hi' }], temperature: 0.5 },
        headers,
      );
      expect(first.status).toBe(200);
      const original = (await first.json()) as any;
      const charged = (await balances(t, keyId)).charged;
      const retry = await post(
        t,
        key,
        { temperature: 0.5, messages: [{ content: 'hi', role: 'user' }], model: 'model_03' },
        headers,
      );
      expect(retry.status).toBe(409);
      expect(retry.headers.get('x-service-request-status')).toBe(`/api/v1/requests/${original.id}`);
      expect(await retry.json()).toEqual({
        error: {
          message: expect.any(String),
          type: 'invalid_request_error',
          code: 'request_already_completed',
          param: 'Idempotency-Key',
        },
        request_id: original.id,
        request_status: 'completed',
        status_url: `/api/v1/requests/${original.id}`,
      });
      expect((await balances(t, keyId)).charged).toBe(charged);
    },
  );

  test('same key, different content: 409 idempotency_key_reused', async () => {
    const t = await server();
    const { key } = await t.createKey();
    const headers = { 'idempotency-key': 'reuse-key-01' };
    const original = await post(t, key, chatBody(), headers);
    expect(original.status).toBe(200);
    const response = await post(t, key, chatBody({ temperature: 1 }), headers);
    expect(response.status).toBe(409);
    expect(((await response.json()) as any).error.code).toBe('idempotency_key_reused');
    // A 409 about an existing request names it (CONTRACT §8), not the refused attempt.
    expect(original.headers.get('x-request-id')).toMatch(/^chatcmpl-/);
    expect(response.headers.get('x-request-id')).toBe(original.headers.get('x-request-id'));
  });

  test('idempotency_key_reused names the original even once its record was evicted', async () => {
    // One record per key: the original's record goes, its binding stays (CONTRACT §8).
    const t = await server({
      limits: { request_records_per_key: 1, idempotency_keys_per_key: 100 },
    });
    const { key } = await t.createKey();
    const headers = { 'idempotency-key': 'evicted-original-1' };
    const original = await post(t, key, chatBody(), headers);
    expect(original.status).toBe(200);
    await original.text();
    for (let i = 0; i < 3; i++) await (await post(t, key, chatBody())).text();
    const response = await post(t, key, chatBody({ temperature: 1 }), headers);
    expect(response.status).toBe(409);
    expect(((await response.json()) as any).error.code).toBe('idempotency_key_reused');
    expect(response.headers.get('x-request-id')).toBe(original.headers.get('x-request-id'));
  });

  test('the scope is (API key, Idempotency-Key): another key may use the same value', async () => {
    const t = await server();
    const a = await t.createKey();
    const b = await t.createKey();
    const headers = { 'idempotency-key': 'shared-value-1' };
    expect((await post(t, a.key, chatBody(), headers)).status).toBe(200);
    expect((await post(t, b.key, chatBody(), headers)).status).toBe(200);
  });

  test('a request refused before a task is created binds nothing', async () => {
    const t = await server();
    const { id: keyId, key } = await t.createKey({ credits: 0 });
    const headers = { 'idempotency-key': 'refused-first-1' };
    expect((await post(t, key, chatBody(), headers)).status).toBe(402);
    await fetch(`${t.baseUrl}/admin/v1/keys/${keyId}/credits`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ credits: 5 }),
    });
    expect((await post(t, key, chatBody(), headers)).status).toBe(200);
  });

  test(
    'a key outlives its TTL while its request runs, ' +
      'and is kept the TTL after the request ends (one task per key)',
    async () => {
      const fake = upstream('gated');
      const t = await server(upstreamOverrides(fake, { idempotency_ttl_s: 1 }));
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const headers = { 'idempotency-key': 'long-runner-01' };
      const startMs = Date.now();
      try {
        const original = post(t, key, chatBody(), headers);
        await fake.nextCall.promise;
        // Five TTLs later the original is still with the provider: a repeat must not run it again.
        setSystemTime(new Date(startMs + 5_000));
        const secondCall = fake.nextCall.promise.then(() => 'a second provider call');
        const during = await Promise.race([post(t, key, chatBody(), headers), secondCall]);
        expect(during).toBeInstanceOf(Response);
        expect(((await (during as Response).json()) as any).error.code).toBe('request_in_progress');
        fake.gate.resolve();
        expect((await original).status).toBe(200);
        // It ended at +5 s: a retry within the TTL of its end reads it, one after runs anew.
        setSystemTime(new Date(startMs + 5_500));
        const after = await post(t, key, chatBody(), headers);
        expect(after.status).toBe(409);
        expect(((await after.json()) as any).error.code).toBe('request_already_completed');
        expect(fake.calls).toBe(1);
        setSystemTime(new Date(startMs + 7_000));
        expect((await post(t, key, chatBody(), headers)).status).toBe(200);
        expect(fake.calls).toBe(2);
        expect((await balances(t, keyId)).charged).toBe((2 * (11 * 5 + 2 * 14)) / 1e6);
      } finally {
        setSystemTime();
      }
    },
  );

  test('N identical requests at once create exactly one provider call', async () => {
    const fake = upstream('ok');
    const t = await server(upstreamOverrides(fake));
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const headers = { 'idempotency-key': 'simultaneous-1' };
    const responses = await Promise.all(
      Array.from({ length: 16 }, () => post(t, key, chatBody(), headers)),
    );
    const statuses = responses.map((response) => response.status).sort();
    expect(statuses.filter((code) => code === 200)).toHaveLength(1);
    expect(statuses.filter((code) => code === 409)).toHaveLength(15);
    expect(fake.calls).toBe(1);
    expect((await balances(t, keyId)).charged).toBe((11 * 5 + 2 * 14) / 1e6);
  });
});

describe('concurrency', () => {
  test('N concurrent requests against a small balance never overdraw', async () => {
    // The upstream answers nobody until every request is either with it or refused, so the
    // admitted ones all hold at once: none settles early and lets a later one in.
    const fake = upstream('gated');
    const t = await server(upstreamOverrides(fake));
    // Each request reserves prompt × 5 + 100 × 14 µcr ≈ 1,450 µcr; 0.01 credits cover at most 6.
    const { id: keyId, key } = await t.createKey({ credits: 0.01 });
    const total = 40;
    let refused = 0;
    let refusal = Promise.withResolvers<void>();
    const pending = Array.from({ length: total }, () =>
      post(t, key, chatBody({ max_completion_tokens: 100 })).then((response) => {
        if (response.status !== 200) {
          refused++;
          refusal.resolve();
          refusal = Promise.withResolvers<void>();
        }
        return response;
      }),
    );
    while (fake.calls + refused < total) {
      await Promise.race([fake.nextCall.promise, refusal.promise]);
    }
    const admitted = fake.calls;
    fake.gate.resolve();
    const responses = await Promise.all(pending);
    const ok = responses.filter((response) => response.status === 200).length;
    expect(responses.filter((response) => response.status === 402).length).toBe(refused);
    expect(ok).toBe(admitted);
    expect(ok).toBeGreaterThan(0);
    expect(ok).toBeLessThanOrEqual(6);
    const after = await balances(t, keyId);
    expect(after.credits).toBeGreaterThanOrEqual(0);
    expect(after.held).toBe(0);
    expect(
      Math.round(after.credits * 1e6) +
        Math.round(after.held * 1e6) +
        Math.round(after.charged * 1e6),
    ).toBe(10_000);
  });
});

describe('metrics', () => {
  test(
    '/metrics exposes finished and refused requests, charges and time to first token in ' +
      'Prometheus text',
    async () => {
      const t = await server();
      const { key } = await t.createKey({ credits: 10 });
      const completed = await post(t, key, chatBody());
      expect(completed.status).toBe(200);
      const { id } = (await completed.json()) as { id: string };
      expect((await post(t, key, chatBody({ model: 'model_99' }))).status).toBe(404);
      const status = (await (
        await fetch(`${t.baseUrl}/api/v1/requests/${id}`, { headers: bearer(key) })
      ).json()) as { charged_credits: number };
      // Scraped twice: the totals are set, not added, on each scrape.
      for (let scrape = 0; scrape < 2; scrape++) {
        const response = await fetch(`${t.baseUrl}/metrics`);
        expect(response.status).toBe(200);
        const text = await response.text();
        expect(text).toContain(
          'tollgate_requests_finished_total{service="chat",status="completed",code=""} 1\n',
        );
        expect(text).toContain(
          'tollgate_requests_refused_total{service="chat",code="model_not_found"} 1\n',
        );
        expect(text).toContain(
          `tollgate_charged_microcredits_total{service="chat"} ` +
            `${Math.round(status.charged_credits * 1e6)}\n`,
        );
        expect(text).toContain(
          'tollgate_time_to_first_token_seconds_bucket{le="+Inf",model="model_03"} 1\n',
        );
        expect(text).toContain('tollgate_time_to_first_token_seconds_count{model="model_03"} 1\n');
        expect(text).toContain('tollgate_requests_in_flight 0');
      }
    },
  );
});
