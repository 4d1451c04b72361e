// A start nobody can name yet is logged with its finish: one record, one fsync; streams and keyed
// calls log first.
import { expect, test } from 'bun:test';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { ADMIN_TOKEN, bearer, chatBody, openTestGateway, tempDir } from '../support/gateway.ts';
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

test(
  'a plain non-stream call logs start and finish in one record; stream and keyed calls log the ' +
    'start first',
  async () => {
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
    expect(recordWith(records, 'request.started', plain)).toBe(
      recordWith(records, 'request.finished', plain),
    );
    for (const id of [keyed, stream])
      expect(recordWith(records, 'request.started', id)).toBeLessThan(
        recordWith(records, 'request.finished', id),
      );
    rmSync(dataDir, { recursive: true, force: true });
  },
);

test(
  'a snapshot taken while an unlogged start ' + 'is in flight stays consistent with the log',
  async () => {
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
  },
);
