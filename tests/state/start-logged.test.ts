// Every request's start is logged before its finish, a plain non-stream call's too: the live list
// names it while it runs, and a crash must leave it error/interrupted (CONTRACT §3), counted.
import { expect, test } from 'bun:test';
import { rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ADMIN_TOKEN, bearer, chatBody, openTestGateway, tempDir } from '../support/gateway.ts';
import { type GatewayProcess, startGatewayProcess } from '../support/process.ts';
import { openRecording } from '../wal/support.ts';

type Logged = Array<{ type: string; request_id?: string }>;

async function recordsOf(dataDir: string): Promise<Logged[]> {
  const { wal, replayed } = openRecording(join(dataDir, 'wal'));
  await wal.close();
  return replayed.records.map((record) => record.payload as Logged);
}

function recordWith(records: Logged[], type: string, id: string): number {
  return records.findIndex((record) =>
    record.some((event) => event.type === type && event.request_id === id),
  );
}

test('every call logs its start before its finish: plain, keyed and streamed', async () => {
  const dataDir = tempDir();
  const t = openTestGateway({}, dataDir);
  const { key } = await t.createKey({ credits: 10 });
  const call = async (body: Record<string, unknown>, headers: Record<string, string> = {}) => {
    const response = await t.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key, headers),
      body: JSON.stringify(body),
    });
    expect(response.status).toBe(200);
    await response.text();
    return response.headers.get('x-request-id')!;
  };
  const plain = await call(chatBody());
  const keyed = await call(chatBody(), { 'idempotency-key': 'keyed-call-1' });
  const stream = await call(chatBody({ stream: true }));
  await t.close();

  const records = await recordsOf(dataDir);
  for (const id of [plain, keyed, stream]) {
    expect(recordWith(records, 'request.started', id)).toBeGreaterThanOrEqual(0);
    expect(recordWith(records, 'request.started', id)).toBeLessThan(
      recordWith(records, 'request.finished', id),
    );
  }
  rmSync(dataDir, { recursive: true, force: true });
});

test('SIGKILL while a plain non-stream call (no Idempotency-Key) waits on its provider: ' +
  'after the restart it is error/interrupted, released, and counted in the usage', async () => {
  const arrived = Promise.withResolvers<void>();
  const upstream = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    async fetch(request) {
      await request.text();
      arrived.resolve();
      return new Promise<Response>(() => {});
    },
  });
  const root = tempDir();
  const configPath = join(root, 'config.json');
  writeFileSync(
    configPath,
    JSON.stringify({
      providers: {
        held: { type: 'openai', base_url: `http://127.0.0.1:${upstream.port}/v1` },
      },
      models: { model_03: { provider: 'held', upstream_model: 'up' } },
      wal: { fsync: 'always' },
    }),
  );
  const env = { DATA_DIR: join(root, 'data'), ADMIN_TOKEN, GATEWAY_CONFIG: configPath };
  const admin = (gateway: GatewayProcess, path: string, body?: unknown) =>
    fetch(`${gateway.url}/admin/v1${path}`, {
      method: body === undefined ? 'GET' : 'POST',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
  const gateways: GatewayProcess[] = [];
  try {
    const before = await startGatewayProcess(env);
    gateways.push(before);
    const created = (await (
      await admin(before, '/keys', { name: 'plain', services: ['chat'], credits: 10 })
    ).json()) as { id: string; key: string };
    const original = fetch(`${before.url}/api/v1/chat/completions`, {
      method: 'POST',
      headers: bearer(created.key),
      body: JSON.stringify(chatBody()),
    }).catch(() => null);
    await arrived.promise;
    // The operator's live list names it; from its answer on, the kill cannot land before the
    // request is on disk.
    const live = (await (await admin(before, '/requests?state=in_progress')).json()) as {
      data: Array<{ id: string; key_id: string }>;
    };
    expect(live.data).toHaveLength(1);
    const { id } = live.data[0]!;
    expect(live.data[0]!.key_id).toBe(created.id);
    expect(await before.kill('SIGKILL')).not.toBe(0);
    await original;

    const after = await startGatewayProcess(env);
    gateways.push(after);
    const status = (await (
      await fetch(`${after.url}/api/v1/requests/${id}`, { headers: bearer(created.key) })
    ).json()) as Record<string, unknown>;
    expect(status).toMatchObject({
      request_id: id,
      request_status: 'error',
      error_code: 'interrupted',
      charged_credits: 0,
    });
    const keyView = (await (await admin(after, `/keys/${created.id}`)).json()) as {
      balances: { credits: number; held: number; charged: number };
    };
    expect(keyView.balances).toMatchObject({ credits: 10, held: 0, charged: 0 });
    const day = new Date().toISOString().slice(0, 10);
    const usage = (await (
      await admin(after, `/usage?from=${day}&to=${day}&key_id=${created.id}`)
    ).json()) as { data: Array<{ requests: number; errors: number }> };
    expect(usage.data).toMatchObject([{ requests: 1, errors: 1 }]);
  } finally {
    for (const gateway of gateways) if (gateway.proc.exitCode === null) await gateway.kill();
    upstream.stop(true);
    rmSync(root, { recursive: true, force: true });
  }
}, 60_000);

test('a snapshot taken while a plain call is in flight stays consistent with the log', async () => {
  const dataDir = tempDir();
  const slow = {
    providers: {
      simulator: { type: 'simulator', ttft_ms: 0, tokens_per_second: 200, completion_tokens: 20 },
    },
  };
  const t = openTestGateway(slow, dataDir);
  const { id: keyId, key } = await t.createKey({ credits: 10 });
  const pending = t.request('/api/v1/chat/completions', {
    method: 'POST',
    headers: bearer(key),
    body: JSON.stringify(chatBody()),
  });
  while (t.gateway.registry.size === 0) await new Promise((resolve) => setImmediate(resolve));
  await t.gateway.store.snapshot();
  const response = await pending;
  expect(response.status).toBe(200);
  const id = response.headers.get('x-request-id')!;
  const before = await (
    await t.request(`/admin/v1/keys/${keyId}`, {
      headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
    })
  ).json();
  await t.close();

  // Replaying snapshot + log rebuilds the same ledger and the finished record.
  const reopened = openTestGateway(slow, dataDir);
  const after = await (
    await reopened.request(`/admin/v1/keys/${keyId}`, {
      headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
    })
  ).json();
  expect(after).toEqual(before);
  const status = (await (
    await reopened.request(`/api/v1/requests/${id}`, { headers: bearer(key) })
  ).json()) as any;
  expect(status.request_status).toBe('completed');
  await reopened.close();
  rmSync(dataDir, { recursive: true, force: true });
});
