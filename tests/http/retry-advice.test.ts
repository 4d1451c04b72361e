// x-should-retry on every error (CONTRACT §8 "Retry advice"), and the 409's X-Request-ID naming the
// original.
import { describe, expect, test } from 'bun:test';
import OpenAI, { APIError } from 'openai';
import {
  ADMIN_TOKEN,
  bearer,
  chatBody,
  closedAfterEach,
  type TestGateway,
} from '../support/gateway.ts';
import { startFakeUpstream, upstreamOverrides } from '../support/upstream.ts';

const t = closedAfterEach();

const DECISION = {
  model: 'decision-fast',
  state: { ticket: 'checkout is down' },
  questions: {
    urgency: {
      type: 'choice',
      prompt: 'How urgent?',
      criteria: { urgent: 'today', routine: 'later' },
    },
  },
};

function post(
  gateway: TestGateway,
  path: string,
  key: string,
  body: unknown,
  extra: Record<string, string> = {},
) {
  return gateway.request(path, {
    method: 'POST',
    headers: bearer(key, extra),
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

async function advice(response: Response): Promise<[number, string, string | null]> {
  const body = (await response.json()) as { error: { code: string } };
  return [response.status, body.error.code, response.headers.get('x-should-retry')];
}

async function charged(gateway: TestGateway, id: string): Promise<number> {
  const response = await gateway.request(`/admin/v1/keys/${id}`, {
    headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
  });
  return ((await response.json()) as { balances: { charged: number } }).balances.charged;
}

describe('x-should-retry', () => {
  test(
    'refusals: false for client errors, true ' + 'for a rate limit and an unavailable gateway',
    async () => {
      const gateway = t.gateway();
      const { key } = await gateway.createKey({ credits: 100, rate_limit_rpm: 2 });
      const { key: broke } = await gateway.createKey({ credits: 0 });
      const chat = '/api/v1/chat/completions';
      expect(await advice(await post(gateway, chat, key, '{not json'))).toEqual([
        400,
        'invalid_request_error',
        'false',
      ]);
      expect(await advice(await post(gateway, chat, 'tg-nope', chatBody()))).toEqual([
        401,
        'invalid_api_key',
        'false',
      ]);
      expect(await advice(await post(gateway, chat, key, chatBody({ model: 'model_99' })))).toEqual(
        [404, 'model_not_found', 'false'],
      );
      expect(
        await advice(await post(gateway, chat, key, chatBody(), { 'idempotency-key': 'x' })),
      ).toEqual([400, 'invalid_idempotency_key', 'false']);
      expect(await advice(await post(gateway, chat, broke, chatBody()))).toEqual([
        402,
        'insufficient_quota',
        'false',
      ]);
      const big = 'x'.repeat(gateway.config.limits.max_body_bytes + 1);
      expect(await advice(await post(gateway, chat, key, big))).toEqual([
        413,
        'request_too_large',
        'false',
      ]);
      expect((await post(gateway, chat, key, chatBody())).status).toBe(200);
      expect((await post(gateway, chat, key, chatBody())).status).toBe(200);
      expect(await advice(await post(gateway, chat, key, chatBody()))).toEqual([
        429,
        'rate_limit_exceeded',
        'true',
      ]);
      gateway.gateway.draining = true;
      expect(await advice(await post(gateway, chat, key, chatBody()))).toEqual([
        503,
        'service_unavailable',
        'true',
      ]);
      // Routes Elysia answers (unknown path, a status lookup) carry it too.
      expect(await advice(await gateway.request('/api/v1/nothing-here'))).toEqual([
        404,
        'not_found',
        'false',
      ]);
      expect(
        await advice(
          await gateway.request('/api/v1/requests/chatcmpl-nope', { headers: bearer(key) }),
        ),
      ).toEqual([404, 'request_not_found', 'false']);
    },
  );

  test(
    'decision: a spent daily budget is false; a ' + 'failed upstream call (never charged) is true',
    async () => {
      const upstream = t.track(startFakeUpstream('error500'));
      const gateway = t.gateway(upstreamOverrides(upstream));
      const { key } = await gateway.createKey({ credits: 100, daily_decision_budget: 0.000001 });
      const spent = await post(gateway, '/decision/v1/decide/', key, DECISION);
      expect(await advice(spent)).toEqual([429, 'api_key_spend_limit_exceeded', 'false']);
      const { key: rich } = await gateway.createKey({ credits: 100 });
      expect(await advice(await post(gateway, '/decision/v1/decide/', rich, DECISION))).toEqual([
        502,
        'upstream_error',
        'true',
      ]);
    },
  );

  test(
    'chat: an upstream failure whose hold was kept is false; with billing.on_error "release" it ' +
      'is true',
    async () => {
      const upstream = t.track(startFakeUpstream('error500'));
      const keep = t.gateway(upstreamOverrides(upstream));
      const { key } = await keep.createKey({ credits: 100 });
      expect(await advice(await post(keep, '/api/v1/chat/completions', key, chatBody()))).toEqual([
        502,
        'upstream_error',
        'false',
      ]);
      const release = t.gateway(upstreamOverrides(upstream, { billing: { on_error: 'release' } }));
      const { key: key2 } = await release.createKey({ credits: 100 });
      expect(
        await advice(await post(release, '/api/v1/chat/completions', key2, chatBody())),
      ).toEqual([502, 'upstream_error', 'true']);
      const stream = await post(keep, '/api/v1/chat/completions', key, chatBody({ stream: true }));
      expect(await advice(stream)).toEqual([502, 'upstream_error', 'false']);
    },
  );

  test(
    'the official openai SDK, default retries, hits a 504 with a kept hold once: one upstream ' +
      'call, one hold',
    async () => {
      const upstream = t.track(startFakeUpstream('hang'));
      const server = await t.server(
        upstreamOverrides(upstream, { limits: { upstream_timeout_ms: 200 } }),
      );
      const { id, key } = await server.createKey({ credits: 100 });
      const client = new OpenAI({ baseURL: `${server.baseUrl}/api/v1`, apiKey: key });
      const failure = await client.chat.completions
        .create({ model: 'model_03', messages: [{ role: 'user', content: 'hi' }] })
        .catch((error) => error);
      expect(failure).toBeInstanceOf(APIError);
      expect((failure as APIError).status).toBe(504);
      expect(upstream.calls).toBe(1);
      const holdCredits = await charged(server, id);
      expect(holdCredits).toBeGreaterThan(0);
      const status = await server.request(
        `/api/v1/requests/${(failure as APIError).headers?.get('x-request-id')}`,
        { headers: bearer(key) },
      );
      expect(((await status.json()) as { charged_credits: number }).charged_credits).toBe(
        holdCredits,
      );
    },
  );
});

describe('a 409 for an existing request', () => {
  test(
    'carries that request’s id in X-Request-ID, for ' +
      'a repeat and for a cancel of a finished request',
    async () => {
      const gateway = t.gateway();
      const { key } = await gateway.createKey({ credits: 100 });
      const first = await post(gateway, '/api/v1/chat/completions', key, chatBody(), {
        'idempotency-key': 'the-original-1',
      });
      const original = first.headers.get('x-request-id')!;
      const repeat = await post(gateway, '/api/v1/chat/completions', key, chatBody(), {
        'idempotency-key': 'the-original-1',
      });
      expect(repeat.status).toBe(409);
      expect(repeat.headers.get('x-request-id')).toBe(original);
      expect(repeat.headers.get('x-should-retry')).toBe('false');
      const cancel = await post(gateway, `/api/v1/requests/${original}/cancel`, key, '');
      expect(cancel.status).toBe(409);
      expect(cancel.headers.get('x-request-id')).toBe(original);
      const decided = await post(gateway, '/decision/v1/decide/', key, DECISION, {
        'idempotency-key': 'decide-once-1',
      });
      expect(decided.status).toBe(200);
      const again = await post(gateway, '/decision/v1/decide/', key, DECISION, {
        'idempotency-key': 'decide-once-1',
      });
      expect(again.status).toBe(409);
      expect(again.headers.get('x-request-id')).toBe(decided.headers.get('x-request-id'));
    },
  );
});
