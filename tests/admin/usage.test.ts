// GET /admin/v1/usage through HTTP (CONTRACT §6): rows per UTC day, key and model from the finish
// events, sums equal to each key's `charged`, grouping, bounds and 400s naming the field, restart.
import { expect, test } from 'bun:test';
import { Value } from '@sinclair/typebox/value';
import { listOf, UsageRowSchema } from '../../src/admin/model.ts';
import { ADMIN_TOKEN, bearer, chatBody, closedAfterEach, tempDir } from '../support/gateway.ts';
import { startLifecycleUpstream, type UpstreamAct } from '../support/lifecycle-harness.ts';
import { SseReader } from '../support/sse.ts';

const cleanup = closedAfterEach();
const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };
const today = () => new Date().toISOString().slice(0, 10);

type Usage = { status: number; body: any };

async function usage(
  t: { request(path: string, init?: RequestInit): Promise<Response> },
  query: string,
): Promise<Usage> {
  const response = await t.request(`/admin/v1/usage?${query}`, { headers: admin });
  return { status: response.status, body: await response.json() };
}

function upstreamConfig(url: string) {
  return {
    providers: { up: { type: 'openai', base_url: url, timeout_ms: 2_000 } },
    models: { model_03: { provider: 'up', upstream_model: 'up' } },
  };
}

test('finished requests of any end land in a row per key and model; sums are charged', async () => {
  let act: UpstreamAct = { kind: 'answer' };
  const upstream = cleanup.track(startLifecycleUpstream(() => act));
  const t = await cleanup.server(upstreamConfig(upstream.url));
  const a = await t.createKey({ credits: 10 });
  const b = await t.createKey({ credits: 10 });
  const post = (key: string, body = chatBody()) =>
    fetch(`${t.baseUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(body),
    });
  for (const key of [a.key, a.key, b.key]) expect((await post(key)).status).toBe(200);
  const streamed = await post(a.key, chatBody({ stream: true }));
  await streamed.text();
  act = { kind: 'hold' };
  const held = await post(b.key, chatBody({ stream: true }));
  const reader = new SseReader(held);
  const { id: heldId } = JSON.parse((await reader.next())!) as { id: string };
  const cancel = await fetch(`${t.baseUrl}/api/v1/requests/${heldId}/cancel`, {
    method: 'POST',
    headers: bearer(b.key),
  });
  expect(cancel.status).toBe(202);
  await reader.rest();
  act = { kind: 'fail', status: 503 };
  expect((await post(b.key)).status).toBe(502);
  const day = today();
  const { status, body } = await usage(t, `from=${day}&to=${day}`);
  expect(status).toBe(200);
  // The answer is what the OpenAPI document says it is.
  expect(Value.Check(listOf(UsageRowSchema), body)).toBe(true);
  expect(body.object).toBe('list');
  const rowOf = (keyId: string) => body.data.find((row: any) => row.key_id === keyId);
  expect(rowOf(a.id)).toMatchObject({
    day,
    model: 'model_03',
    requests: 3,
    completed: 3,
    cancelled: 0,
    errors: 0,
    prompt_tokens: 900,
    completion_tokens: 60,
  });
  expect(rowOf(b.id)).toMatchObject({ requests: 3, completed: 1, cancelled: 1, errors: 1 });
  for (const { id } of [a, b]) {
    const key = (await (await t.request(`/admin/v1/keys/${id}`, { headers: admin })).json()) as any;
    expect(Math.round(rowOf(id).charged_credits * 1e6)).toBe(
      Math.round(key.balances.charged * 1e6),
    );
    expect(key.balances.charged).toBeGreaterThan(0);
  }
  // Grouped by model only: the key and the day are dropped, the sums kept.
  const byModel = await usage(t, `from=${day}&to=${day}&group_by=model`);
  expect(byModel.body.data).toEqual([
    expect.objectContaining({
      model: 'model_03',
      requests: 6,
      completed: 4,
      cancelled: 1,
      errors: 1,
    }),
  ]);
  expect(byModel.body.data[0]).not.toHaveProperty('key_id');
  expect(Value.Check(listOf(UsageRowSchema), byModel.body)).toBe(true);
  // group_by empty: one row, the total; key_id is a spelling of key.
  const total = await usage(t, `from=${day}&to=${day}&group_by=`);
  expect(total.body.data).toEqual([expect.objectContaining({ requests: 6 })]);
  expect(Object.keys(total.body.data[0])).not.toContain('model');
  const byKey = await usage(t, `from=${day}&to=${day}&group_by=key_id, day`);
  expect(byKey.body.data.map((row: any) => row.key_id).sort()).toEqual([a.id, b.id].sort());
  expect(byModel.body.data[0]).not.toHaveProperty('day');
  // Filtered by key.
  const onlyB = await usage(t, `from=${day}&to=${day}&key_id=${b.id}`);
  expect(onlyB.body.data.map((row: any) => row.key_id)).toEqual([b.id]);
  // Another day has nothing.
  const before = await usage(t, 'from=2020-01-01&to=2020-01-31');
  expect(before.body.data).toEqual([]);
});

test('the history survives a restart (snapshot and log)', async () => {
  const dataDir = tempDir();
  const upstream = cleanup.track(startLifecycleUpstream());
  const config = { ...upstreamConfig(upstream.url), wal: { snapshot_every_records: 3 } };
  const first = cleanup.gatewayOn(dataDir, config);
  const { key } = await first.createKey({ credits: 10 });
  for (let i = 0; i < 4; i++) {
    const response = await first.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody()),
    });
    expect(response.status).toBe(200);
  }
  const day = today();
  const before = await usage(first, `from=${day}&to=${day}`);
  await first.close();
  const second = cleanup.gatewayOn(dataDir, config);
  const after = await usage(second, `from=${day}&to=${day}`);
  expect(after.body.data).toEqual(before.body.data);
  expect(after.body.data[0].requests).toBe(4);
});

test('bad queries are a 400 naming the field', async () => {
  const t = cleanup.gateway();
  const { id } = await t.createKey();
  for (const [query, param] of [
    ['to=2026-01-01', 'from'],
    ['from=2026-01-01', 'to'],
    ['from=2026-02-30&to=2026-03-01', 'from'],
    ['from=26-01-01&to=2026-03-01', 'from'],
    ['from=2026-01-01&to=2026-13-01', 'to'],
    ['from=2026-03-01&to=2026-01-01', 'to'],
    ['from=2024-01-01&to=2026-01-01', 'to'],
    ['from=2026-01-01&to=2026-01-02&key_id=key_nope', 'key_id'],
    ['from=2026-01-01&to=2026-01-02&model=model_nope', 'model'],
    ['from=2026-01-01&to=2026-01-02&group_by=week', 'group_by'],
    ['from=2026-01-01&to=2026-01-02&group_by=day,day', 'group_by'],
    ['from=2026-01-01&to=2026-01-02&group_by=week', 'group_by'],
    ['from=2026-01-01&to=2026-01-02&model=key_x', 'model'],
  ] as const) {
    const { status, body } = await usage(t, query);
    expect({ query, status, param: body.error?.param }).toEqual({ query, status: 400, param });
    expect(body.error.code).toBe('invalid_request_error');
  }
  // 400 days is the bound, inclusive.
  expect((await usage(t, 'from=2025-01-01&to=2026-02-04')).status).toBe(200);
  expect((await usage(t, 'from=2025-01-01&to=2026-02-05')).status).toBe(400);
  expect((await usage(t, `from=2026-01-01&to=2026-01-02&key_id=${id}`)).status).toBe(200);
  // Without the admin token: 401, nothing read.
  const anonymous = await t.request('/admin/v1/usage?from=2026-01-01&to=2026-01-02');
  expect(anonymous.status).toBe(401);
});

test('a key sending model names of its own adds no history: refusals do not finish', async () => {
  const t = cleanup.gateway();
  const { key } = await t.createKey();
  for (let i = 0; i < 200; i++) {
    const response = await t.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody({ model: `made-up-model-${i}` })),
    });
    expect(response.status).toBe(404);
  }
  expect(t.gateway.store.state.usage.size).toBe(0);
  const day = today();
  expect((await usage(t, `from=${day}&to=${day}&model=made-up-model-1`)).status).toBe(400);
});
