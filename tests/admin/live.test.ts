// Live requests through HTTP (CONTRACT §6): GET /admin/v1/requests?state=in_progress lists what
// holds credits now; POST /admin/v1/requests/<id>/cancel is the key's own cancel, by the admin.
import { expect, test } from 'bun:test';
import { Value } from '@sinclair/typebox/value';
import { LiveRequestSchema, listOf } from '../../src/admin/model.ts';
import { ADMIN_TOKEN, bearer, chatBody, closedAfterEach } from '../support/gateway.ts';
import { startLifecycleUpstream } from '../support/lifecycle-harness.ts';
import { SseReader } from '../support/sse.ts';

const cleanup = closedAfterEach();
const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };

test('a running stream is listed with its hold and attempt; the admin cancels it', async () => {
  const upstream = cleanup.track(startLifecycleUpstream(() => ({ kind: 'hold' })));
  const t = await cleanup.server({
    providers: { up: { type: 'openai', base_url: upstream.url } },
    models: { model_03: { provider: 'up', upstream_model: 'up' } },
  });
  const { id: keyId, key } = await t.createKey({ credits: 10 });
  const response = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(key),
    body: JSON.stringify(chatBody({ stream: true })),
  });
  const reader = new SseReader(response);
  const { id } = JSON.parse((await reader.next())!) as { id: string };
  const listed = await fetch(`${t.baseUrl}/admin/v1/requests?state=in_progress`, {
    headers: admin,
  });
  expect(listed.status).toBe(200);
  const { object, data } = (await listed.json()) as { object: string; data: any[] };
  expect(object).toBe('list');
  expect(Value.Check(listOf(LiveRequestSchema), { object, data })).toBe(true);
  expect(data).toEqual([
    {
      id,
      key_id: keyId,
      service: 'chat',
      model: 'model_03',
      stream: true,
      created: expect.any(Number),
      age_ms: expect.any(Number),
      held_credits: expect.any(Number),
      attempt: 1,
    },
  ]);
  expect(data[0].held_credits).toBeGreaterThan(0);
  const cancel = await fetch(`${t.baseUrl}/admin/v1/requests/${id}/cancel`, {
    method: 'POST',
    headers: admin,
  });
  expect(cancel.status).toBe(202);
  expect(await cancel.json()).toMatchObject({
    request_id: id,
    cancel_requested: true,
    request_status: 'cancelled',
  });
  await upstream.calls[0]!.aborted;
  const events = await reader.rest();
  expect(JSON.parse(events.at(-1)!).error.code).toBe('request_cancelled');
  const after = (await (
    await fetch(`${t.baseUrl}/admin/v1/requests`, { headers: admin })
  ).json()) as { data: unknown[] };
  expect(after.data).toEqual([]);
  const balances = (
    (await (await fetch(`${t.baseUrl}/admin/v1/keys/${keyId}`, { headers: admin })).json()) as any
  ).balances;
  expect(balances.held).toBe(0);
  const again = await fetch(`${t.baseUrl}/admin/v1/requests/${id}/cancel`, {
    method: 'POST',
    headers: admin,
  });
  expect(again.status).toBe(409);
  expect(((await again.json()) as any).error.code).toBe('request_already_completed');
});

test('bad state, unknown id and no token', async () => {
  const t = cleanup.gateway();
  const bad = await t.request('/admin/v1/requests?state=done', { headers: admin });
  expect(bad.status).toBe(400);
  expect(((await bad.json()) as any).error.param).toBe('state');
  const unknown = await t.request('/admin/v1/requests/chatcmpl-nope/cancel', {
    method: 'POST',
    headers: admin,
  });
  expect(unknown.status).toBe(404);
  expect(((await unknown.json()) as any).error.code).toBe('request_not_found');
  expect((await t.request('/admin/v1/requests')).status).toBe(401);
  const { key } = await t.createKey();
  const asKey = await t.request('/admin/v1/requests', { headers: bearer(key) });
  expect(asKey.status).toBe(401);
});
