// Graceful stop: refuse new work with 503, let in-flight requests finish within the grace,
// interrupt the rest.
import { expect, test } from 'bun:test';
import { rmSync } from 'node:fs';
import {
  ADMIN_TOKEN,
  bearer,
  chatBody,
  openTestGateway,
  startTestServer,
  tempDir,
} from '../support/gateway.ts';
import { SseReader } from '../support/sse.ts';

const SLOW = {
  providers: {
    simulator: { type: 'simulator', ttft_ms: 0, tokens_per_second: 50, completion_tokens: 5000 },
  },
};

test(
  'SIGTERM behaviour: 503 while draining, the rest ' +
    'interrupted with holds released, state durable',
  async () => {
    const dataDir = tempDir();
    const t = await startTestServer(SLOW, dataDir);
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const stream = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody({ stream: true })),
    });
    const reader = new SseReader(stream);
    const first = JSON.parse((await reader.next())!);

    const stopping = t.server.shutdown(300);
    const refused = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody()),
    });
    expect(refused.status).toBe(503);
    expect(((await refused.json()) as any).error.code).toBe('service_unavailable');
    expect((await fetch(`${t.baseUrl}/readyz`)).status).toBe(503);

    const events = await reader.rest();
    // The client's code is the contract's for a stopping gateway; the record says interrupted.
    expect(JSON.parse(events.at(-1)!).error.code).toBe('service_unavailable');
    await stopping;

    // Reopen the same data dir: the interrupted request is recorded, its hold released, nothing
    // charged.
    const reopened = openTestGateway(SLOW, dataDir);
    const record = await reopened.request(`/api/v1/requests/${first.id}`, { headers: bearer(key) });
    expect((await record.json()) as any).toMatchObject({
      request_status: 'error',
      error_code: 'interrupted',
      charged_credits: 0,
    });
    const keyView = (await (
      await reopened.request(`/admin/v1/keys/${keyId}`, {
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
      })
    ).json()) as any;
    expect(keyView.balances).toEqual({
      credits: 10,
      held: 0,
      charged: 0,
      credits_added: 10,
      token_wallet: 0,
    });
    await reopened.close();
    rmSync(dataDir, { recursive: true, force: true });
  },
);

test('a request that finishes within the grace period completes normally', async () => {
  const t = await startTestServer({
    providers: {
      simulator: { type: 'simulator', ttft_ms: 0, tokens_per_second: 200, completion_tokens: 20 },
    },
  });
  const { key } = await t.createKey({ credits: 10 });
  const pending = fetch(`${t.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(key),
    body: JSON.stringify(chatBody()),
  });
  // Wait until it is admitted, then stop with a generous grace.
  while (t.gateway.registry.size === 0) await new Promise((resolve) => setImmediate(resolve));
  const stopping = t.server.shutdown(10_000);
  const response = await pending;
  expect(response.status).toBe(200);
  expect(((await response.json()) as any).choices[0].finish_reason).toBe('stop');
  await stopping;
  rmSync(t.config.data_dir, { recursive: true, force: true });
});
