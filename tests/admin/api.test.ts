// The admin API (/admin/v1) through app.handle: auth, key creation and import, views, top-ups,
// revoke, bad bodies.
import { afterAll, beforeAll, describe, expect, test } from 'bun:test';
import { createHash } from 'node:crypto';
import { rmSync } from 'node:fs';
import { topUp } from '../../src/state/commands.ts';
import { ADMIN_TOKEN, bearer, openTestGateway, type TestGateway } from '../support/gateway.ts';

let t: TestGateway;

beforeAll(() => {
  t = openTestGateway({ limits: { default_rate_limit_rpm: 600 } });
});

afterAll(async () => {
  await t.close();
  // The durability test reopens the gateway on the same dir, which close() then leaves in place.
  rmSync(t.config.data_dir, { recursive: true, force: true });
});

const ADMIN = { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' };
const KEY_RE = /^tg-[A-Za-z0-9]{40,}$/;
const KEY_ID_RE = /^key_[A-Za-z0-9]+$/;

function admin(path: string, method: 'GET' | 'POST' = 'GET', body?: unknown): Promise<Response> {
  return t.request(`/admin/v1${path}`, {
    method,
    headers: ADMIN,
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
}

async function create(
  body: Record<string, unknown>,
): Promise<{ id: string; key: string } & Record<string, any>> {
  const response = await admin('/keys', 'POST', body);
  expect(response.status).toBe(201);
  return (await response.json()) as any;
}

function models(key: string): Promise<Response> {
  return t.request('/api/v1/models', { headers: bearer(key) });
}

function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/**
 * The key view of CONTRACT §6 with the fields this gateway adds (`created`,
 * `limits.rate_limit_rpm_in_force`).
 */
function view(fields: {
  id: string;
  name: string;
  services?: string[];
  revoked?: boolean;
  rpm?: number | null;
  rpmInForce?: number;
  dailyBudget?: number | null;
  credits?: number;
  held?: number;
  charged?: number;
  creditsAdded?: number;
  tokenWallet?: number;
}) {
  return {
    id: fields.id,
    name: fields.name,
    services: fields.services ?? ['chat', 'decision'],
    revoked: fields.revoked ?? false,
    created: expect.any(Number),
    limits: {
      rate_limit_rpm: fields.rpm ?? null,
      rate_limit_rpm_in_force: fields.rpmInForce ?? 600,
      daily_decision_budget: fields.dailyBudget ?? null,
    },
    balances: {
      credits: fields.credits ?? 0,
      held: fields.held ?? 0,
      charged: fields.charged ?? 0,
      credits_added: fields.creditsAdded ?? fields.credits ?? 0,
      token_wallet: fields.tokenWallet ?? 0,
    },
  };
}

function invalidKeyBody(reason: string) {
  return {
    error: {
      message: expect.any(String),
      type: 'authentication_error',
      code: 'invalid_api_key',
      param: null,
      reason,
    },
  };
}

describe('admin auth', () => {
  test('no token → 401 invalid_api_key, reason missing', async () => {
    const response = await t.request('/admin/v1/keys');
    expect(response.status).toBe(401);
    expect(await response.json()).toEqual(invalidKeyBody('missing'));
  });

  test('a non-bearer scheme counts as missing', async () => {
    const response = await t.request('/admin/v1/keys', {
      headers: { authorization: `Basic ${ADMIN_TOKEN}` },
    });
    expect(response.status).toBe(401);
    expect(await response.json()).toEqual(invalidKeyBody('missing'));
  });

  test('a wrong token → 401 invalid_api_key', async () => {
    for (const token of ['wrong', `${ADMIN_TOKEN}x`, ADMIN_TOKEN.slice(0, -1)]) {
      const response = await t.request('/admin/v1/keys', {
        headers: { authorization: `Bearer ${token}` },
      });
      expect(response.status).toBe(401);
      expect(await response.json()).toEqual(invalidKeyBody('unknown'));
    }
  });

  test('an API key is not an admin token', async () => {
    const { key } = await create({ name: 'not-admin', credits: 1 });
    const response = await t.request('/admin/v1/keys', { headers: bearer(key) });
    expect(response.status).toBe(401);
  });

  test(
    'every admin route needs the token, POSTs ' + 'included, and creates nothing without it',
    async () => {
      const before = t.gateway.store.state.keys.size;
      const { id } = await create({ name: 'guarded' });
      const calls: Array<[string, string]> = [
        ['GET', '/admin/v1/keys'],
        ['POST', '/admin/v1/keys'],
        ['GET', `/admin/v1/keys/${id}`],
        ['POST', `/admin/v1/keys/${id}/credits`],
        ['POST', `/admin/v1/keys/${id}/revoke`],
      ];
      for (const [method, path] of calls) {
        const response = await t.request(path, {
          method,
          body: method === 'POST' ? JSON.stringify({ name: 'x', credits: 5 }) : undefined,
        });
        expect({ method, path, status: response.status }).toEqual({ method, path, status: 401 });
      }
      expect(t.gateway.store.state.keys.size).toBe(before + 1);
      expect(await (await admin(`/keys/${id}`)).json()).toEqual(view({ id, name: 'guarded' }));
    },
  );
});

describe('POST /admin/v1/keys', () => {
  test('201 with id, a tg- key of ≥ 40 base62 characters, and the key view', async () => {
    const response = await admin('/keys', 'POST', { name: 'demo', credits: 100 });
    expect(response.status).toBe(201);
    const body = (await response.json()) as any;
    expect(body.id).toMatch(KEY_ID_RE);
    expect(body.key).toMatch(KEY_RE);
    expect(body).toEqual({ ...view({ id: body.id, name: 'demo', credits: 100 }), key: body.key });
    // The new key works at once.
    expect((await models(body.key)).status).toBe(200);
  });

  test('every field of the body is kept', async () => {
    const body = await create({
      name: 'full',
      services: ['decision'],
      credits: 2.5,
      token_wallet: 7_000,
      daily_decision_budget: 0.25,
      rate_limit_rpm: 30,
    });
    expect(body).toEqual({
      ...view({
        id: body.id,
        name: 'full',
        services: ['decision'],
        credits: 2.5,
        tokenWallet: 7_000,
        dailyBudget: 0.25,
        rpm: 30,
        rpmInForce: 30,
      }),
      key: body.key,
    });
    // A decision-only key is refused by the chat service.
    const response = await models(body.key);
    expect(response.status).toBe(401);
    expect(await response.json()).toEqual(invalidKeyBody('wrong_type'));
  });

  test('two keys never share a secret or an id', async () => {
    const a = await create({ name: 'a' });
    const b = await create({ name: 'b' });
    expect(a.key).not.toBe(b.key);
    expect(a.id).not.toBe(b.id);
  });

  test('0.000001 credits is exactly 1 µcr, and top-ups add without float drift', async () => {
    const { id } = await create({ name: 'micro', credits: 0.000001 });
    expect(t.gateway.store.state.keys.get(id)!.balanceMicro).toBe(1);
    expect(await (await admin(`/keys/${id}`)).json()).toEqual(
      view({ id, name: 'micro', credits: 0.000001 }),
    );

    // 0.1 + 0.2 in floats is 0.30000000000000004; in µcr it is 300,000 and shows as 0.300001 with
    // the first µcr.
    expect((await admin(`/keys/${id}/credits`, 'POST', { credits: 0.1 })).status).toBe(200);
    expect((await admin(`/keys/${id}/credits`, 'POST', { credits: 0.2 })).status).toBe(200);
    expect(t.gateway.store.state.keys.get(id)!.balanceMicro).toBe(300_001);
    expect(await (await admin(`/keys/${id}`)).json()).toEqual(
      view({ id, name: 'micro', credits: 0.300001 }),
    );
  });

  test('import: an existing secret given as `key` is stored and authenticates', async () => {
    const secret = 'sk-legacy-0123456789abcdefghijKLMNOP';
    const body = await create({ name: 'migrated', key: secret, credits: 3 });
    expect(body).toEqual({ ...view({ id: body.id, name: 'migrated', credits: 3 }), key: secret });
    expect(t.gateway.store.state.keys.get(body.id)!.secretSha256).toBe(sha256(secret));
    const response = await models(secret);
    expect(response.status).toBe(200);
    expect(((await response.json()) as any).data).toHaveLength(11);
  });

  test('import of a secret that is already registered is refused and changes nothing', async () => {
    const secret = 'tg-imported0123456789abcdefghijklmnopqrstuvwxyz';
    const first = await create({ name: 'first', key: secret });
    const before = t.gateway.store.state.keys.size;
    const response = await admin('/keys', 'POST', { name: 'second', key: secret });
    expect(response.status).toBe(400);
    expect(await response.json()).toEqual({
      error: {
        message: expect.any(String),
        type: 'invalid_request_error',
        code: 'invalid_request_error',
        param: 'key',
      },
    });
    expect(t.gateway.store.state.keys.size).toBe(before);
    expect(t.gateway.store.state.keysBySecret.get(sha256(secret))!.id).toBe(first.id);
  });
});

describe('bad bodies → 400 invalid_request_error naming the field', () => {
  // `message` where it names the field and the bound (CONTRACT §8: never "Expected union value").
  const cases: Array<{ name: string; body: unknown; param: string | null; message?: string }> = [
    { name: 'not JSON', body: '{"name": ', param: null },
    { name: 'missing name', body: {}, param: 'name', message: 'name is required' },
    { name: 'empty name', body: { name: '' }, param: 'name', message: 'name must not be empty' },
    {
      name: 'name not a string',
      body: { name: 7 },
      param: 'name',
      message: 'name must be a string',
    },
    {
      name: 'negative credits',
      body: { name: 'x', credits: -1 },
      param: 'credits',
      message: 'credits must be ≥ 0',
    },
    {
      name: 'credits over their maximum',
      body: { name: 'x', credits: 8_589_934_592 },
      param: 'credits',
      message: 'credits must be ≤ 8589934591',
    },
    {
      name: 'credits as a string',
      body: { name: 'x', credits: '5' },
      param: 'credits',
      message: 'credits must be a number',
    },
    {
      name: 'unknown service',
      body: { name: 'x', services: ['images'] },
      param: 'services[0]',
      message: 'services[0] must be one of "chat" or "decision"',
    },
    {
      name: 'no services',
      body: { name: 'x', services: [] },
      param: 'services',
      message: 'services must have at least 1 item',
    },
    {
      name: 'fractional token wallet',
      body: { name: 'x', token_wallet: 1.5 },
      param: 'token_wallet',
      message: 'token_wallet must be an integer',
    },
    {
      name: 'zero rpm',
      body: { name: 'x', rate_limit_rpm: 0 },
      param: 'rate_limit_rpm',
      message: 'rate_limit_rpm must be ≥ 1',
    },
    {
      name: 'rpm over its maximum',
      body: { name: 'x', rate_limit_rpm: 10_000_001 },
      param: 'rate_limit_rpm',
      message: 'rate_limit_rpm must be ≤ 10000000',
    },
    {
      name: 'rpm a string',
      body: { name: 'x', rate_limit_rpm: 'fast' },
      param: 'rate_limit_rpm',
      message: 'rate_limit_rpm must be null or an integer',
    },
    {
      name: 'negative daily budget',
      body: { name: 'x', daily_decision_budget: -1 },
      param: 'daily_decision_budget',
      message: 'daily_decision_budget must be ≥ 0',
    },
    {
      name: 'unknown field',
      body: { name: 'x', colour: 'red' },
      param: 'colour',
      message: 'colour is not a known field',
    },
    { name: 'imported secret too short', body: { name: 'x', key: 'short' }, param: 'key' },
    {
      name: 'imported secret with a space',
      body: { name: 'x', key: 'has a space 0123456789abcdef' },
      param: 'key',
    },
  ];

  for (const c of cases) {
    test(`create: ${c.name}`, async () => {
      const before = t.gateway.store.state.keys.size;
      const response = await admin('/keys', 'POST', c.body);
      expect(response.status).toBe(400);
      expect(await response.json()).toEqual({
        error: {
          message: c.message ?? expect.any(String),
          type: 'invalid_request_error',
          code: 'invalid_request_error',
          param: c.param,
        },
      });
      expect(t.gateway.store.state.keys.size).toBe(before);
    });
  }

  const creditCases: Array<{
    name: string;
    body: unknown;
    param: string | null;
    message?: string;
  }> = [
    { name: 'neither credits nor tokens', body: {}, param: 'credits' },
    {
      name: 'negative credits',
      body: { credits: -5 },
      param: 'credits',
      message: 'credits must be ≥ 0',
    },
    {
      name: 'credits as a string',
      body: { credits: '5' },
      param: 'credits',
      message: 'credits must be a number',
    },
    {
      name: 'fractional tokens',
      body: { tokens: 0.5 },
      param: 'tokens',
      message: 'tokens must be an integer',
    },
    {
      name: 'unknown field',
      body: { amount: 5 },
      param: 'amount',
      message: 'amount is not a known field',
    },
    { name: 'not JSON', body: 'five', param: null },
  ];

  for (const c of creditCases) {
    test(`credits: ${c.name}`, async () => {
      const { id } = await create({ name: 'bad-topup', credits: 1 });
      const response = await admin(`/keys/${id}/credits`, 'POST', c.body);
      expect(response.status).toBe(400);
      expect(await response.json()).toEqual({
        error: {
          message: c.message ?? expect.any(String),
          type: 'invalid_request_error',
          code: 'invalid_request_error',
          param: c.param,
        },
      });
      expect(await (await admin(`/keys/${id}`)).json()).toEqual(
        view({ id, name: 'bad-topup', credits: 1 }),
      );
    });
  }
});

describe('reading keys', () => {
  test(
    "GET /keys/<id> has exactly the contract's view " +
      '(plus created and rate_limit_rpm_in_force)',
    async () => {
      const { id } = await create({ name: 'shape', credits: 12.345678, token_wallet: 9 });
      const response = await admin(`/keys/${id}`);
      expect(response.status).toBe(200);
      const body = (await response.json()) as any;
      expect(body).toEqual(view({ id, name: 'shape', credits: 12.345678, tokenWallet: 9 }));
      expect(Object.keys(body).sort()).toEqual([
        'balances',
        'created',
        'id',
        'limits',
        'name',
        'revoked',
        'services',
      ]);
      expect(Object.keys(body.balances).sort()).toEqual([
        'charged',
        'credits',
        'credits_added',
        'held',
        'token_wallet',
      ]);
      expect(Number.isInteger(body.balances.token_wallet)).toBe(true);
      expect(body.created).toBe(Math.floor(t.gateway.store.state.keys.get(id)!.createdAtMs / 1000));
    },
  );

  test('GET /keys lists every key and no secret, hash or key field', async () => {
    const a = await create({ name: 'list-a', credits: 1 });
    const b = await create({ name: 'list-b', key: 'imported-secret-for-list-0123456789' });
    const response = await admin('/keys');
    expect(response.status).toBe(200);
    const text = await response.text();
    const body = JSON.parse(text) as { object: string; data: any[] };
    expect(body.object).toBe('list');
    expect(body.data).toHaveLength(t.gateway.store.state.keys.size);
    expect(body.data.find((k) => k.id === a.id)).toEqual(
      view({ id: a.id, name: 'list-a', credits: 1 }),
    );
    expect(body.data.find((k) => k.id === b.id)).toEqual(view({ id: b.id, name: 'list-b' }));
    for (const secret of [a.key, b.key]) {
      expect(text).not.toContain(secret);
      expect(text).not.toContain(sha256(secret));
    }
    for (const key of body.data) expect(key).not.toHaveProperty('key');
  });

  test('GET /keys/<id> never shows the secret or its hash', async () => {
    const { id, key } = await create({ name: 'secret-check' });
    const text = await (await admin(`/keys/${id}`)).text();
    expect(text).not.toContain(key);
    expect(text).not.toContain(sha256(key));
    expect(text).not.toContain(key.slice(3));
  });

  test('unknown key id → 404 on show, credits and revoke', async () => {
    for (const [method, path, body] of [
      ['GET', '/keys/key_doesnotexist', undefined],
      ['POST', '/keys/key_doesnotexist/credits', { credits: 1 }],
      ['POST', '/keys/key_doesnotexist/revoke', undefined],
    ] as const) {
      const response = await admin(path, method, body);
      expect({ path, status: response.status }).toEqual({ path, status: 404 });
      expect(await response.json()).toEqual({
        error: {
          message: expect.any(String),
          type: 'invalid_request_error',
          code: 'not_found',
          param: null,
        },
      });
    }
  });
});

describe('POST /admin/v1/keys/<id>/credits', () => {
  test(
    '{credits} adds to balance and credits_added; ' + '{tokens} adds to the token wallet',
    async () => {
      const { id } = await create({ name: 'topup', credits: 1, token_wallet: 10 });
      let response = await admin(`/keys/${id}/credits`, 'POST', { credits: 4.5 });
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual(
        view({ id, name: 'topup', credits: 5.5, tokenWallet: 10 }),
      );

      response = await admin(`/keys/${id}/credits`, 'POST', { tokens: 90 });
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual(
        view({ id, name: 'topup', credits: 5.5, tokenWallet: 100 }),
      );

      response = await admin(`/keys/${id}/credits`, 'POST', { credits: 0.5, tokens: 1 });
      expect(response.status).toBe(200);
      expect(await response.json()).toEqual(
        view({ id, name: 'topup', credits: 6, tokenWallet: 101 }),
      );

      expect(await (await admin(`/keys/${id}`)).json()).toEqual(
        view({ id, name: 'topup', credits: 6, tokenWallet: 101 }),
      );
      const account = t.gateway.store.state.keys.get(id)!;
      expect(account.creditsAddedMicro).toBe(6_000_000);
      expect(account.creditsAddedMicro).toBe(
        account.balanceMicro + account.heldMicro + account.chargedMicro,
      );
    },
  );

  test('a key given credits past 2^33 earlier still takes tokens, not credits', async () => {
    const { id } = await create({ name: 'older', credits: 8_000_000_000 });
    // What an older gateway (bound 9e9) may have logged: written as it was, past the API's check.
    await topUp(t.gateway.store, id, 1_000_000_000 * 1_000_000, 0, Date.now());
    expect((await admin(`/keys/${id}/credits`, 'POST', { tokens: 5 })).status).toBe(200);
    const refused = await admin(`/keys/${id}/credits`, 'POST', { credits: 1 });
    expect(refused.status).toBe(400);
    expect(((await refused.json()) as any).error.param).toBe('credits');
  });

  test('a top-up that would overflow is 400 naming the pocket: tokens or credits', async () => {
    const { id } = await create({
      name: 'full',
      credits: 8_589_934_591,
      token_wallet: Number.MAX_SAFE_INTEGER,
    });
    for (const [body, param] of [
      [{ tokens: 5 }, 'tokens'],
      [{ credits: 1 }, 'credits'],
    ] as const) {
      const response = await admin(`/keys/${id}/credits`, 'POST', body);
      expect(response.status).toBe(400);
      const error = ((await response.json()) as { error: { code: string; param: string } }).error;
      expect(error).toMatchObject({ code: 'invalid_request_error', param });
    }
    // Nothing was added.
    expect(await (await admin(`/keys/${id}`)).json()).toEqual(
      view({ id, name: 'full', credits: 8_589_934_591, tokenWallet: Number.MAX_SAFE_INTEGER }),
    );
    // Up to the last µcr below 2^33 credits, where every amount still shows exactly (audit N:
    // 9e9 + 0.000001 read 9000000000.000002).
    expect((await admin(`/keys/${id}/credits`, 'POST', { credits: 0.999999 })).status).toBe(200);
    const text = await (await admin(`/keys/${id}`)).text();
    expect(text).toContain('"credits":8589934591.999999');
    expect((await admin(`/keys/${id}/credits`, 'POST', { credits: 0.000001 })).status).toBe(400);
  });

  test('a top-up of 0.000001 credits adds exactly 1 µcr', async () => {
    const { id } = await create({ name: 'one-micro', credits: 0 });
    expect((await admin(`/keys/${id}/credits`, 'POST', { credits: 0.000001 })).status).toBe(200);
    expect(t.gateway.store.state.keys.get(id)!.balanceMicro).toBe(1);
    expect(await (await admin(`/keys/${id}`)).json()).toEqual(
      view({ id, name: 'one-micro', credits: 0.000001 }),
    );
  });
});

describe('POST /admin/v1/keys/<id>/revoke', () => {
  test('the key then gets 401 reason revoked; revoking again is harmless', async () => {
    const { id, key } = await create({ name: 'to-revoke', credits: 1 });
    expect((await models(key)).status).toBe(200);

    let response = await admin(`/keys/${id}/revoke`, 'POST');
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual(
      view({ id, name: 'to-revoke', credits: 1, revoked: true }),
    );

    response = await models(key);
    expect(response.status).toBe(401);
    expect(await response.json()).toEqual(invalidKeyBody('revoked'));

    response = await t.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(response.status).toBe(401);
    expect(await response.json()).toEqual(invalidKeyBody('revoked'));

    response = await admin(`/keys/${id}/revoke`, 'POST');
    expect(response.status).toBe(200);
    expect(await response.json()).toEqual(
      view({ id, name: 'to-revoke', credits: 1, revoked: true }),
    );
    expect(await (await admin(`/keys/${id}`)).json()).toEqual(
      view({ id, name: 'to-revoke', credits: 1, revoked: true }),
    );
  });

  test('an unknown secret is reason unknown, not revoked', async () => {
    const response = await models('tg-neverissued0123456789abcdefghijklmnopqrstuv');
    expect(response.status).toBe(401);
    expect(await response.json()).toEqual(invalidKeyBody('unknown'));
  });
});

describe('durability', () => {
  test('keys, top-ups and revokes survive a reopen of the data dir', async () => {
    const dataDir = t.config.data_dir;
    const { id } = await create({ name: 'durable', credits: 2 });
    await admin(`/keys/${id}/credits`, 'POST', { credits: 1, tokens: 5 });
    await admin(`/keys/${id}/revoke`, 'POST');
    const expected = await (await admin(`/keys/${id}`)).json();
    expect(expected).toEqual(
      view({ id, name: 'durable', credits: 3, tokenWallet: 5, revoked: true }),
    );
    const keysBefore = await (await admin('/keys')).json();

    await t.gateway.store.close();
    t = openTestGateway({ limits: { default_rate_limit_rpm: 600 } }, dataDir);
    expect(await (await admin(`/keys/${id}`)).json()).toEqual(expected);
    expect(await (await admin('/keys')).json()).toEqual(keysBefore);
  });
});
