// The usage history is the ledger's own numbers (CONTRACT §6, issue 16): after a mixed run of
// answers, streams, cancels, errors and failovers, with a SIGKILL and a restart in the middle, the
// history's charges for each key sum to its `charged` balance exactly, and every finished request
// is counted once.
import { afterEach, expect, test } from 'bun:test';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  type LifecycleUpstream,
  startLifecycleUpstream,
  type UpstreamAct,
} from '../support/lifecycle-harness.ts';
import { type GatewayProcess, startGatewayProcess } from '../support/process.ts';
import { SseReader } from '../support/sse.ts';

const ADMIN_TOKEN = 'usage-ledger-admin-token-0123456789';
const micro = (credits: number) => Math.round(credits * 1_000_000);

const running: GatewayProcess[] = [];
const cleanups: Array<() => void> = [];
afterEach(async () => {
  for (const gateway of running.splice(0)) if (gateway.proc.exitCode === null) await gateway.kill();
  for (const cleanup of cleanups.splice(0)) cleanup();
});

/** What each fake does, by the word the test puts in the prompt. */
function act(deployment: 'a' | 'b') {
  return (call: { body: any }): UpstreamAct => {
    const text = JSON.stringify(call.body?.messages ?? '');
    if (text.includes('hold')) return { kind: 'hold' };
    if (text.includes('refused')) return { kind: 'fail', status: 400 };
    // The first deployment fails these before a byte (503): the second answers, charged once.
    if (text.includes('flaky') && deployment === 'a') return { kind: 'fail', status: 503 };
    return { kind: 'answer' };
  };
}

function admin(gateway: GatewayProcess, path: string, body?: unknown): Promise<Response> {
  return fetch(`${gateway.url}/admin/v1${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
}

function chat(gateway: GatewayProcess, key: string, word: string, extra: object = {}) {
  return fetch(`${gateway.url}/api/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'model_03',
      max_completion_tokens: 50,
      messages: [{ role: 'user', content: `usage ledger: ${word}` }],
      ...extra,
    }),
  });
}

/** A stream held open by the upstream, cancelled through its own key's cancel. */
async function cancelledStream(gateway: GatewayProcess, key: string): Promise<void> {
  const reader = new SseReader(await chat(gateway, key, 'hold', { stream: true }));
  const { id } = JSON.parse((await reader.next())!) as { id: string };
  const cancel = await fetch(`${gateway.url}/api/v1/requests/${id}/cancel`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}` },
  });
  expect(cancel.status).toBe(202);
  await reader.rest();
}

/** One round of every kind of end for `key`; returns how many requests finished. */
async function mixedRound(gateway: GatewayProcess, key: string): Promise<number> {
  expect((await chat(gateway, key, 'plain')).status).toBe(200);
  expect((await chat(gateway, key, 'flaky')).status).toBe(200);
  const streamed = await chat(gateway, key, 'flaky stream', { stream: true });
  expect(await streamed.text()).toContain('[DONE]');
  expect((await chat(gateway, key, 'refused')).status).toBe(502);
  await cancelledStream(gateway, key);
  return 5;
}

async function usageRows(gateway: GatewayProcess): Promise<any[]> {
  const dayMs = 86_400_000;
  const from = new Date(Date.now() - dayMs).toISOString().slice(0, 10);
  const to = new Date(Date.now() + dayMs).toISOString().slice(0, 10);
  const response = await admin(gateway, `/usage?from=${from}&to=${to}`);
  expect(response.status).toBe(200);
  return ((await response.json()) as { data: any[] }).data;
}

async function expectHistoryIsLedger(
  gateway: GatewayProcess,
  keys: Array<{ id: string }>,
  finished: Map<string, number>,
): Promise<void> {
  const rows = await usageRows(gateway);
  for (const { id } of keys) {
    const mine = rows.filter((row) => row.key_id === id);
    const response = await admin(gateway, `/keys/${id}`);
    const balances = ((await response.json()) as any).balances;
    const charged = mine.reduce((sum, row) => sum + micro(row.charged_credits), 0);
    expect(charged).toBe(micro(balances.charged));
    expect(charged).toBeGreaterThan(0);
    expect(balances.held).toBe(0);
    const requests = mine.reduce((sum, row) => sum + row.requests, 0);
    expect(requests).toBe(finished.get(id));
    const ends = mine.reduce((sum, row) => sum + row.completed + row.cancelled + row.errors, 0);
    expect(ends).toBe(requests);
  }
}

test('history sums are the keys’ charged after a mixed run, SIGKILL in the middle', async () => {
  const a: LifecycleUpstream = startLifecycleUpstream(act('a'));
  const b: LifecycleUpstream = startLifecycleUpstream(act('b'));
  cleanups.push(() => {
    a.stop();
    b.stop();
  });
  const dataRoot = mkdtempSync(join(tmpdir(), 'tollgate-usage-ledger-'));
  cleanups.push(() => rmSync(dataRoot, { recursive: true, force: true }));
  const configPath = join(dataRoot, 'config.json');
  writeFileSync(
    configPath,
    JSON.stringify({
      providers: { a: { type: 'openai', base_url: a.url }, b: { type: 'openai', base_url: b.url } },
      // `a` first in all but one call in a million: the flaky prompts fail over to `b`.
      models: {
        model_03: {
          deployments: [
            { provider: 'a', upstream_model: 'up-a', weight: 1_000_000 },
            { provider: 'b', upstream_model: 'up-b', weight: 1 },
          ],
        },
      },
      // Snapshots during the run, so the restart restores one and replays the rest.
      wal: { fsync: 'always', snapshot_every_records: 7 },
    }),
  );
  const env = { DATA_DIR: join(dataRoot, 'data'), ADMIN_TOKEN, GATEWAY_CONFIG: configPath };
  const first = await startGatewayProcess(env);
  running.push(first);
  const keys: Array<{ id: string; key: string }> = [];
  for (const name of ['one', 'two']) {
    const created = await admin(first, '/keys', { name, services: ['chat'], credits: 50 });
    keys.push((await created.json()) as { id: string; key: string });
  }
  const finished = new Map(keys.map(({ id }) => [id, 0]));
  for (const { id, key } of keys)
    finished.set(id, finished.get(id)! + (await mixedRound(first, key)));
  await expectHistoryIsLedger(first, keys, finished);
  // A stream in flight when the gateway is killed: the restart ends it (interrupted, released).
  const inFlight = await chat(first, keys[0]!.key, 'hold', { stream: true });
  await new SseReader(inFlight).next();
  await first.kill('SIGKILL');
  finished.set(keys[0]!.id, finished.get(keys[0]!.id)! + 1);
  const second = await startGatewayProcess(env);
  running.push(second);
  await expectHistoryIsLedger(second, keys, finished);
  for (const { id, key } of keys)
    finished.set(id, finished.get(id)! + (await mixedRound(second, key)));
  await expectHistoryIsLedger(second, keys, finished);
  const rows = await usageRows(second);
  expect(rows.reduce((sum, row) => sum + row.cancelled, 0)).toBe(4);
  expect(rows.reduce((sum, row) => sum + row.errors, 0)).toBe(5);
});
