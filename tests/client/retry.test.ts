// The TollgateClient's retry rule (spec 001, rules 4–6) against a real server whose fake upstream
// fails on demand.
import { describe, expect, test } from 'bun:test';
import {
  type ClientOptions,
  type DecideRequest,
  retryDelayMs,
  TollgateClient,
  TollgateError,
} from '../../src/client/index.ts';
import {
  answerValidly,
  closedPortUrl,
  DEFAULT_USAGE,
  type DecisionUpstream,
  decisionUpstreamOverrides,
  startDecisionUpstream,
  type UpstreamCall,
  type UpstreamReply,
} from '../support/decision-upstream.ts';
import { ADMIN_TOKEN, bearer, closedAfterEach, type TestServer } from '../support/gateway.ts';

const DECIDE = '/decision/v1/decide/';
const IDEMPOTENCY_KEY_RE = /^[A-Za-z0-9._:-]{8,255}$/;
const REQUEST_ID_RE = /^dec_[A-Za-z0-9]+$/;
/** One decision at model_03 rates (5 / 14 µcr per token) for the fake upstream's usage. */
const DECISION_MICRO = DEFAULT_USAGE.prompt_tokens * 5 + DEFAULT_USAGE.completion_tokens * 14;

const cleanup = closedAfterEach();
const server = cleanup.server;

/** A real gateway whose decision-fast model is a fake upstream running `script`. */
async function serverWithUpstream(
  script: (call: UpstreamCall) => UpstreamReply,
): Promise<{ t: TestServer; fake: DecisionUpstream }> {
  const fake = cleanup.track(startDecisionUpstream(script));
  return { t: await server(decisionUpstreamOverrides(fake.url)), fake };
}

/**
 * Fails the first `failures` calls with an upstream 500 (the gateway answers 502 upstream_error),
 * then answers.
 */
const failThenAnswer =
  (failures: number) =>
  (call: UpstreamCall): UpstreamReply =>
    call.index < failures ? { kind: 'status', status: 500 } : answerValidly(call);

const REQUEST: DecideRequest = {
  model: 'decision-fast',
  state: { ticket: 'Refund not received after 14 days.', customer: 'globex' },
  questions: {
    urgency: {
      type: 'choice',
      prompt: 'How urgent is this ticket?',
      criteria: { urgent: 'needs action today', routine: 'can wait' },
    },
    quality: {
      type: 'score',
      prompt: 'How complete is the report?',
      criteria: ['missing', 'partial', 'complete'],
    },
  },
};

const VALID_ANSWERS = {
  urgency: { type: 'choice', label: 'urgent' },
  quality: { type: 'score', score: 2, level: 'complete' },
} as const;

interface Attempt {
  method: string;
  path: string;
  idempotencyKey: string | null;
  /** null when the fetch itself failed. */
  status: number | null;
  requestId: string | null;
  retryAfter: string | null;
}

/**
 * A client whose waits are recorded instead of slept, and whose every HTTP attempt (request headers
 * and response status) is recorded by a wrapping fetch.
 */
function recordingClient(baseUrl: string, apiKey: string, extra: Partial<ClientOptions> = {}) {
  const waits: number[] = [];
  const attempts: Attempt[] = [];
  const recordingFetch = async (
    input: string | URL | Request,
    init?: RequestInit,
  ): Promise<Response> => {
    const headers = new Headers(init?.headers);
    const attempt: Attempt = {
      method: init?.method ?? 'GET',
      path: new URL(String(input)).pathname,
      idempotencyKey: headers.get('idempotency-key'),
      status: null,
      requestId: null,
      retryAfter: null,
    };
    attempts.push(attempt);
    const response = await fetch(input, init);
    attempt.status = response.status;
    attempt.requestId = response.headers.get('x-request-id');
    attempt.retryAfter = response.headers.get('retry-after');
    return response;
  };
  const client = new TollgateClient({
    baseUrl,
    apiKey,
    fetch: recordingFetch as typeof fetch,
    sleep: async (ms) => {
      waits.push(ms);
    },
    ...extra,
  });
  return { client, waits, attempts };
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

/** The client call's rejection, which must be a TollgateError. */
async function rejection(promise: Promise<unknown>): Promise<TollgateError> {
  const error = await promise.then(
    () => null,
    (thrown: unknown) => thrown,
  );
  expect(error).toBeInstanceOf(TollgateError);
  return error as TollgateError;
}

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('retryDelayMs', () => {
  test('500 ms × 2^attempt from attempt 0 without a usable Retry-After', () => {
    expect([0, 1, 2, 3].map((attempt) => retryDelayMs(attempt, null))).toEqual([
      500, 1000, 2000, 4000,
    ]);
    // Retry-After counts only when it is a positive number of seconds.
    for (const unusable of [
      '0',
      '-3',
      '',
      'soon',
      'Wed, 21 Oct 2015 07:28:00 GMT',
      'NaN',
      'Infinity',
    ]) {
      expect([unusable, retryDelayMs(1, unusable)]).toEqual([unusable, 1000]);
    }
  });

  test('a positive Retry-After in seconds wins, whatever the attempt', () => {
    expect(retryDelayMs(0, '1')).toBe(1000);
    expect(retryDelayMs(2, '60')).toBe(60_000);
    expect(retryDelayMs(3, '1.5')).toBe(1500);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('TollgateClient against a real gateway', () => {
  test(
    'two 502s (upstream 500), then a decision: 3 attempts, waits [500, 1000], one ' +
      'Idempotency-Key, one decision, one charge',
    async () => {
      const { t, fake } = await serverWithUpstream(failThenAnswer(2));
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const { client, waits, attempts } = recordingClient(t.baseUrl, key);

      const decision = await client.decide(REQUEST);

      expect(attempts.map((a) => [a.method, a.path, a.status])).toEqual([
        ['POST', DECIDE, 502],
        ['POST', DECIDE, 502],
        ['POST', DECIDE, 200],
      ]);
      expect(waits).toEqual([500, 1000]);
      const idempotencyKey = attempts[0]!.idempotencyKey;
      expect(idempotencyKey).toMatch(IDEMPOTENCY_KEY_RE);
      expect(attempts.map((a) => a.idempotencyKey)).toEqual([
        idempotencyKey,
        idempotencyKey,
        idempotencyKey,
      ]);
      expect(fake.calls).toBe(3);

      expect(decision).toEqual({
        id: attempts[2]!.requestId!,
        object: 'decision',
        created: expect.any(Number),
        model: 'decision-fast',
        answers: VALID_ANSWERS,
        usage: {
          ...DEFAULT_USAGE,
          total_tokens: DEFAULT_USAGE.prompt_tokens + DEFAULT_USAGE.completion_tokens,
        },
        charged: { tokens: 0, credits: DECISION_MICRO / 1e6 },
      });
      // Exactly one charge on the key…
      expect(await balances(t, keyId)).toEqual({
        credits: (10_000_000 - DECISION_MICRO) / 1e6,
        held: 0,
        charged: DECISION_MICRO / 1e6,
        credits_added: 10,
        token_wallet: 0,
      });
      // …one completed decision, and the two failed attempts on record as errors that charged
      // nothing.
      expect(await client.getDecision(decision.id)).toEqual({
        id: decision.id,
        object: 'decision.request',
        status: 'completed',
        http_status: 200,
        created: decision.created,
        finished: expect.any(Number),
        model: 'decision-fast',
        error_code: null,
        answers: VALID_ANSWERS,
        usage: decision.usage,
        charged: decision.charged,
        attempts: [
          {
            provider: 'fake',
            upstream_model: 'up',
            outcome: 'ok',
            error_code: null,
            latency_ms: expect.any(Number),
          },
        ],
      });
      for (const failed of attempts.slice(0, 2)) {
        expect(failed.requestId).toMatch(REQUEST_ID_RE);
        expect(await client.getDecision(failed.requestId!)).toMatchObject({
          status: 'error',
          http_status: 502,
          error_code: 'upstream_error',
          answers: null,
          charged: { tokens: 0, credits: 0 },
        });
      }
    },
  );

  test(
    "the caller's Idempotency-Key is sent on every attempt; repeating the call later cannot make " +
      'a second decision',
    async () => {
      const { t, fake } = await serverWithUpstream(failThenAnswer(1));
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const { client, waits, attempts } = recordingClient(t.baseUrl, key);
      const idempotencyKey = 'order-42:decide.v1';

      const decision = await client.decide(REQUEST, { idempotencyKey });
      expect(attempts.map((a) => [a.status, a.idempotencyKey])).toEqual([
        [502, idempotencyKey],
        [200, idempotencyKey],
      ]);
      expect(waits).toEqual([500]);

      // A caller that lost the answer and calls again: 409, not retried, pointing at the one
      // decision.
      const error = await rejection(client.decide(REQUEST, { idempotencyKey }));
      expect({ status: error.status, code: error.code, attempts: error.attempts }).toEqual({
        status: 409,
        code: 'request_already_completed',
        attempts: 1,
      });
      expect(error.body).toMatchObject({
        request_id: decision.id,
        request_status: 'completed',
        status_url: `/decision/v1/requests/${decision.id}/`,
      });
      expect(waits).toEqual([500]);
      expect(fake.calls).toBe(2);
      expect((await balances(t, keyId)).charged).toBe(DECISION_MICRO / 1e6);
    },
  );

  test(
    'at most 3 retries: 4 attempts, waits [500, 1000, ' +
      '2000], then a TollgateError; nothing charged',
    async () => {
      const { t, fake } = await serverWithUpstream(() => ({ kind: 'status', status: 500 }));
      const { id: keyId, key } = await t.createKey({ credits: 10, token_wallet: 100_000 });
      const { client, waits, attempts } = recordingClient(t.baseUrl, key);

      const error = await rejection(client.decide(REQUEST));
      expect({
        status: error.status,
        code: error.code,
        type: error.error.type,
        attempts: error.attempts,
      }).toEqual({
        status: 502,
        code: 'upstream_error',
        type: 'upstream_error',
        attempts: 4,
      });
      expect(error.requestId).toBe(attempts[3]!.requestId);
      expect(attempts.map((a) => a.status)).toEqual([502, 502, 502, 502]);
      expect(new Set(attempts.map((a) => a.idempotencyKey)).size).toBe(1);
      expect(waits).toEqual([500, 1000, 2000]);
      expect(fake.calls).toBe(4);
      expect(await balances(t, keyId)).toEqual({
        credits: 10,
        held: 0,
        charged: 0,
        credits_added: 10,
        token_wallet: 100_000,
      });
    },
  );

  test('maxRetries is honoured when set lower', async () => {
    const { t, fake } = await serverWithUpstream(() => ({ kind: 'status', status: 500 }));
    const { key } = await t.createKey({ credits: 10 });
    const { client, waits } = recordingClient(t.baseUrl, key, { maxRetries: 1 });
    const error = await rejection(client.decide(REQUEST));
    expect(error.attempts).toBe(2);
    expect(waits).toEqual([500]);
    expect(fake.calls).toBe(2);
  });

  test('429 rate_limit_exceeded: each wait is that answer’s Retry-After × 1000', async () => {
    const t = await server();
    const { id: keyId, key } = await t.createKey({ credits: 10, rate_limit_rpm: 1 });
    // The key's one request per minute is spent here.
    const first = await fetch(`${t.baseUrl}${DECIDE}`, {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(REQUEST),
    });
    expect(first.status).toBe(200);
    const before = await balances(t, keyId);
    const { client, waits, attempts } = recordingClient(t.baseUrl, key);

    const error = await rejection(client.decide(REQUEST));
    expect({ status: error.status, code: error.code, attempts: error.attempts }).toEqual({
      status: 429,
      code: 'rate_limit_exceeded',
      attempts: 4,
    });
    expect(attempts.map((a) => a.status)).toEqual([429, 429, 429, 429]);
    for (const attempt of attempts) expect(Number(attempt.retryAfter)).toBeGreaterThanOrEqual(1);
    // The three waits follow the three Retry-After values that preceded them — not the backoff.
    expect(waits).toEqual(attempts.slice(0, 3).map((a) => Number(a.retryAfter) * 1000));
    expect(waits).not.toEqual([500, 1000, 2000]);
    expect(await balances(t, keyId)).toEqual(before);
  });

  test('503 while the gateway drains, then a decision once it is back', async () => {
    const t = await server();
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    t.gateway.draining = true;
    const { client, waits, attempts } = recordingClient(t.baseUrl, key, {
      // The "clock": the gateway comes back during the first wait.
      sleep: async (ms) => {
        waits.push(ms);
        t.gateway.draining = false;
      },
    });
    const decision = await client.decide(REQUEST);
    expect(attempts.map((a) => a.status)).toEqual([503, 200]);
    expect(waits).toEqual([500]);
    expect(decision.id).toBe(attempts[1]!.requestId!);
    const after = await balances(t, keyId);
    expect(after.held).toBe(0);
    expect(after.charged).toBe(decision.charged.credits);
  });

  test(
    'network failures are retried with the same ' + 'backoff, then the last failure is thrown',
    async () => {
      const { client, waits, attempts } = recordingClient(
        closedPortUrl().replace(/\/v1$/, ''),
        'tg-unused',
      );
      const thrown = await client.decide(REQUEST).then(
        () => null,
        (error: unknown) => error,
      );
      expect(thrown).toBeInstanceOf(Error);
      expect(thrown).not.toBeInstanceOf(TollgateError);
      expect(attempts.map((a) => a.status)).toEqual([null, null, null, null]);
      expect(waits).toEqual([500, 1000, 2000]);
    },
  );
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('statuses that need a change by the caller are not retried', () => {
  test.each([
    ['400 invalid_request_error', 400, 'invalid_request_error'],
    ['401 invalid_api_key', 401, 'invalid_api_key'],
    ['402 insufficient_quota', 402, 'insufficient_quota'],
    ['404 model_not_found', 404, 'model_not_found'],
  ] as const)('%s: one attempt, no wait', async (_name, status, code) => {
    const { t, fake } = await serverWithUpstream(answerValidly);
    const funded = await t.createKey({ credits: 10 });
    const broke = await t.createKey({ credits: 0 });
    const apiKey =
      status === 401 ? `tg-${'Z'.repeat(43)}` : status === 402 ? broke.key : funded.key;
    const request: DecideRequest =
      status === 400
        ? {
            ...REQUEST,
            questions: {
              urgency: { type: 'choice', prompt: 'Urgent?', criteria: ['yes', 'no'] as any },
            },
          }
        : status === 404
          ? { ...REQUEST, model: 'decision-turbo' as any }
          : REQUEST;
    const { client, waits, attempts } = recordingClient(t.baseUrl, apiKey);
    const error = await rejection(client.decide(request));
    expect({ status: error.status, code: error.code, attempts: error.attempts }).toEqual({
      status,
      code,
      attempts: 1,
    });
    expect(error.requestId).toMatch(REQUEST_ID_RE);
    expect(attempts).toHaveLength(1);
    expect(waits).toEqual([]);
    expect(fake.calls).toBe(0);
  });

  test('409 request_in_progress: not retried; the body names the running original', async () => {
    const release = Promise.withResolvers<void>();
    const { t, fake } = await serverWithUpstream((call) => ({
      kind: 'wait',
      until: release.promise,
      then: answerValidly(call),
    }));
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const idempotencyKey = 'in-flight-0042';
    const called = fake.nextCall.promise;
    const original = fetch(`${t.baseUrl}${DECIDE}`, {
      method: 'POST',
      headers: bearer(key, { 'idempotency-key': idempotencyKey }),
      body: JSON.stringify(REQUEST),
    });
    await called;

    const { client, waits, attempts } = recordingClient(t.baseUrl, key);
    const error = await rejection(client.decide(REQUEST, { idempotencyKey }));
    expect({ status: error.status, code: error.code, attempts: error.attempts }).toEqual({
      status: 409,
      code: 'request_in_progress',
      attempts: 1,
    });
    const originalId = error.body.request_id as string;
    expect(originalId).toMatch(REQUEST_ID_RE);
    expect(error.body.request_status).toBe('in_progress');
    expect(attempts).toHaveLength(1);
    expect(waits).toEqual([]);

    release.resolve();
    const done = (await (await original).json()) as any;
    expect(done.id).toBe(originalId);
    expect(fake.calls).toBe(1);
    expect((await balances(t, keyId)).charged).toBe(DECISION_MICRO / 1e6);
  });

  test('409 idempotency_key_reused: not retried', async () => {
    const { t } = await serverWithUpstream(answerValidly);
    const { key } = await t.createKey({ credits: 10 });
    const { client, waits } = recordingClient(t.baseUrl, key);
    await client.decide(REQUEST, { idempotencyKey: 'reused-0042' });
    const error = await rejection(
      client.decide({ ...REQUEST, state: { other: true } }, { idempotencyKey: 'reused-0042' }),
    );
    expect({ status: error.status, code: error.code, attempts: error.attempts }).toEqual({
      status: 409,
      code: 'idempotency_key_reused',
      attempts: 1,
    });
    expect(waits).toEqual([]);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('a retry only where it can help (x-should-retry, chat keys stay bound)', () => {
  const CHAT = {
    model: 'model_03',
    messages: [{ role: 'user' as const, content: 'Summarise the ticket.' }],
    max_completion_tokens: 50,
  };

  test('chat 502 whose hold was kept (x-should-retry: false): one attempt, its error', async () => {
    const { t, fake } = await serverWithUpstream(() => ({ kind: 'status', status: 500 }));
    const { key } = await t.createKey({ credits: 10 });
    const { client, waits, attempts } = recordingClient(t.baseUrl, key);
    const error = await rejection(client.chatCompletion(CHAT));
    expect({ status: error.status, code: error.code, attempts: error.attempts }).toEqual({
      status: 502,
      code: 'upstream_error',
      attempts: 1,
    });
    expect(attempts.map((a) => a.status)).toEqual([502]);
    expect(waits).toEqual([]);
    expect(fake.calls).toBe(1);
  });

  test(
    'chat 502 with nothing charged (billing release): retried under a new key of its own, so ' +
      'the retry runs instead of answering 409; charged once',
    async () => {
      const fake = cleanup.track(startDecisionUpstream(failThenAnswer(1)));
      const t = await server(
        decisionUpstreamOverrides(fake.url, { billing: { on_error: 'release' } }),
      );
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const { client, waits, attempts } = recordingClient(t.baseUrl, key);
      const completion = await client.chatCompletion(CHAT);
      expect(completion.object).toBe('chat.completion');
      expect(attempts.map((a) => a.status)).toEqual([502, 200]);
      expect(attempts[0]!.idempotencyKey).toMatch(IDEMPOTENCY_KEY_RE);
      expect(attempts[1]!.idempotencyKey).toMatch(IDEMPOTENCY_KEY_RE);
      expect(attempts[1]!.idempotencyKey).not.toBe(attempts[0]!.idempotencyKey);
      expect(waits).toEqual([500]);
      expect(fake.calls).toBe(2);
      const { charged, held } = await balances(t, keyId);
      expect({ held, charged: charged > 0 }).toEqual({ held: 0, charged: true });
      // The caller's own key is never replaced: the 502 is theirs to decide on.
      fake.script = failThenAnswer(fake.calls + 1);
      const mine = recordingClient(t.baseUrl, key);
      const error = await rejection(
        mine.client.chatCompletion(CHAT, { idempotencyKey: 'chat-order-4711' }),
      );
      expect({ status: error.status, attempts: error.attempts }).toEqual({
        status: 502,
        attempts: 1,
      });
      expect(mine.waits).toEqual([]);
    },
  );

  test('chat 499 (cancelled through the cancel call): not retried', async () => {
    const release = Promise.withResolvers<void>();
    const { t, fake } = await serverWithUpstream((call) => ({
      kind: 'wait',
      until: release.promise,
      then: answerValidly(call),
    }));
    const { key } = await t.createKey({ credits: 10 });
    const { client, waits, attempts } = recordingClient(t.baseUrl, key);
    const pending = rejection(client.chatCompletion(CHAT));
    await fake.nextCall.promise;
    const live = (await (
      await fetch(`${t.baseUrl}/admin/v1/requests`, {
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
      })
    ).json()) as { data: Array<{ id: string }> };
    const id = live.data[0]!.id;
    const cancel = await fetch(`${t.baseUrl}/api/v1/requests/${id}/cancel`, {
      method: 'POST',
      headers: bearer(key),
    });
    expect(cancel.status).toBe(202);
    const error = await pending;
    release.resolve();
    expect({ status: error.status, code: error.code, attempts: error.attempts }).toEqual({
      status: 499,
      code: 'request_cancelled',
      attempts: 1,
    });
    expect(attempts).toHaveLength(1);
    expect(waits).toEqual([]);
  });

  test('decision 429 api_key_spend_limit_exceeded (x-should-retry false): no retry', async () => {
    const { t, fake } = await serverWithUpstream(answerValidly);
    const { key } = await t.createKey({ credits: 10, daily_decision_budget: 0.001 });
    const { client, waits, attempts } = recordingClient(t.baseUrl, key);
    const error = await rejection(client.decide(REQUEST));
    expect({ status: error.status, code: error.code, attempts: error.attempts }).toEqual({
      status: 429,
      code: 'api_key_spend_limit_exceeded',
      attempts: 1,
    });
    expect(attempts).toHaveLength(1);
    expect(waits).toEqual([]);
    expect(fake.calls).toBe(0);
  });
});

test('a chat 504 without x-should-retry (from a proxy): retried with the same key', async () => {
  const { t, fake } = await serverWithUpstream(answerValidly);
  const { key } = await t.createKey({ credits: 10 });
  const keys: Array<string | null> = [];
  let calls = 0;
  const client = new TollgateClient({
    baseUrl: t.baseUrl,
    apiKey: key,
    sleep: async () => {},
    fetch: (async (input: string | URL | Request, init?: RequestInit) => {
      keys.push(new Headers(init?.headers).get('idempotency-key'));
      // The first attempt reaches the gateway, but its answer is lost behind a proxy's 504.
      const response = await fetch(input, init);
      if (calls++ > 0) return response;
      await response.arrayBuffer();
      return Response.json({ error: { message: 'gateway timeout' } }, { status: 504 });
    }) as typeof fetch,
  });
  const error = await rejection(
    client.chatCompletion({ model: 'model_03', messages: [{ role: 'user', content: 'Hi' }] }),
  );
  // The retry under the same key finds the first request: a 409, never a second run.
  expect({ status: error.status, code: error.code }).toEqual({
    status: 409,
    code: 'request_already_completed',
  });
  expect(keys).toHaveLength(2);
  expect(keys[1]).toBe(keys[0]);
  expect(fake.calls).toBe(1);
});
