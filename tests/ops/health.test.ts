// Probes and routing: /healthz, /readyz (draining → 503), unknown routes → 404 envelope, trailing
// slashes.
import { afterAll, beforeAll, describe, expect, test } from 'bun:test';
import {
  ADMIN_TOKEN,
  bearer,
  chatBody,
  openTestGateway,
  type TestGateway,
} from '../support/gateway.ts';

let t: TestGateway;
let key: string;
let keyId: string;

beforeAll(async () => {
  t = openTestGateway();
  ({ key, id: keyId } = await t.createKey({ credits: 1_000 }));
});

afterAll(() => t.close());

const NOT_FOUND = {
  error: {
    message: expect.any(String),
    type: 'invalid_request_error',
    code: 'not_found',
    param: null,
  },
};

describe('probes (no auth)', () => {
  test('/healthz → 200', async () => {
    const response = await t.request('/healthz');
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ status: 'ok' });
  });

  test('/readyz → 200 while serving, 503 once draining, and /healthz stays 200', async () => {
    let response = await t.request('/readyz');
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual({ status: 'ready', in_flight: 0 });

    t.gateway.draining = true;
    try {
      response = await t.request('/readyz');
      expect(response.status).toBe(503);
      expect(await response.json()).toEqual({ status: 'unavailable', reason: 'draining' });
      expect((await t.request('/healthz')).status).toBe(200);
    } finally {
      t.gateway.draining = false;
    }
    expect((await t.request('/readyz')).status).toBe(200);
  });

  test('a draining gateway refuses new chat work with 503 service_unavailable', async () => {
    t.gateway.draining = true;
    try {
      const response = await t.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify(chatBody()),
      });
      expect(response.status).toBe(503);
      expect(await response.json()).toEqual({
        error: {
          message: expect.any(String),
          type: 'service_unavailable_error',
          code: 'service_unavailable',
          param: null,
        },
      });
    } finally {
      t.gateway.draining = false;
    }
  });

  test("/metrics: the gateway's figures and the process ones, scrape after scrape", async () => {
    const first = await t.request('/metrics');
    expect(first.status).toBe(200);
    expect(first.headers.get('content-type')).toStartWith('text/plain');
    const text = await first.text();
    for (const name of [
      'tollgate_requests_in_flight',
      'tollgate_event_loop_delay_seconds_bucket',
      'tollgate_deployment_state',
      'tollgate_process_cpu_user_seconds_total',
      'tollgate_process_resident_memory_bytes',
    ])
      expect(text).toContain(`\n${name}`);
    // The first scrape builds the registry (and loads prom-client); the next ones reuse it.
    const again = await t.request('/metrics');
    expect(again.status).toBe(200);
    expect((await again.text()).match(/^# TYPE tollgate_requests_in_flight /gm)).toHaveLength(1);
  });

  test('probes ignore an Authorization header, even a wrong one', async () => {
    const response = await t.request('/healthz', { headers: { authorization: 'Bearer nonsense' } });
    expect(response.status).toBe(200);
  });
});

describe('unknown routes', () => {
  const paths: Array<[string, string]> = [
    ['GET', '/'],
    ['GET', '/nope'],
    ['GET', '/api/v1/nope'],
    ['POST', '/api/v2/chat/completions'],
    ['GET', '/admin/v1/nope'],
    ['GET', '/decision/v1/nothing-here'],
  ];
  for (const [method, path] of paths) {
    test(`${method} ${path} → 404 with the error envelope`, async () => {
      const response = await t.request(path, {
        method,
        headers: bearer(key),
        body: method === 'POST' ? '{}' : undefined,
      });
      expect(response.status).toBe(404);
      expect(response.headers.get('content-type')).toStartWith('application/json');
      expect(await response.json()).toEqual(NOT_FOUND);
    });
  }
});

describe('trailing slashes are accepted (CONTRACT §1)', () => {
  test('/api/v1/models/ answers as /api/v1/models', async () => {
    const plain = await t.request('/api/v1/models', { headers: bearer(key) });
    const slashed = await t.request('/api/v1/models/', { headers: bearer(key) });
    expect(plain.status).toBe(200);
    expect(slashed.status).toBe(200);
    const body = (await slashed.json()) as { object: string; data: Array<{ id: string }> };
    expect(body).toEqual((await plain.json()) as typeof body);
    expect(body.data.map((m) => m.id)).toEqual([
      'model_01',
      'model_02',
      'model_03',
      'model_04',
      'model_05',
      'model_06',
      'model_07',
      'model_08',
      'model_09',
      'model_10',
      'model_11',
    ]);
  });

  test('/api/v1/models/model_03/ answers as /api/v1/models/model_03', async () => {
    const plain = await t.request('/api/v1/models/model_03', { headers: bearer(key) });
    const slashed = await t.request('/api/v1/models/model_03/', { headers: bearer(key) });
    expect(plain.status).toBe(200);
    expect(slashed.status).toBe(200);
    expect(await slashed.json()).toEqual(await plain.json());
  });

  test('/api/v1/models/model_03 needs a key', async () => {
    const response = await t.request('/api/v1/models/model_03');
    expect(response.status).toBe(401);
    expect(((await response.json()) as any).error.reason).toBe('missing');
  });

  test('/api/v1/models/ still needs a key', async () => {
    const response = await t.request('/api/v1/models/');
    expect(response.status).toBe(401);
    expect(((await response.json()) as any).error).toEqual({
      message: expect.any(String),
      type: 'authentication_error',
      code: 'invalid_api_key',
      param: null,
      reason: 'missing',
    });
  });

  test('/healthz/ and /readyz/', async () => {
    expect(await (await t.request('/healthz/')).json()).toEqual({ status: 'ok' });
    const ready = await t.request('/readyz/');
    expect(ready.status).toBe(200);
    expect(await ready.json()).toEqual({ status: 'ready', in_flight: 0 });
  });

  test('POST /api/v1/chat/completions/ completes', async () => {
    const response = await t.request('/api/v1/chat/completions/', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody()),
    });
    expect(response.status).toBe(200);
    const body = (await response.json()) as any;
    expect(body.object).toBe('chat.completion');
    expect(body.model).toBe('model_03');
  });

  test('admin routes with a trailing slash', async () => {
    const admin = { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' };
    const list = await t.request('/admin/v1/keys/', { headers: admin });
    expect(list.status).toBe(200);
    const shown = await t.request(`/admin/v1/keys/${keyId}/`, { headers: admin });
    expect(shown.status).toBe(200);
    expect(((await shown.json()) as any).id).toBe(keyId);
    const credited = await t.request(`/admin/v1/keys/${keyId}/credits/`, {
      method: 'POST',
      headers: admin,
      body: JSON.stringify({ tokens: 1 }),
    });
    expect(credited.status).toBe(200);
    expect(((await credited.json()) as any).balances.token_wallet).toBe(1);
  });
});
