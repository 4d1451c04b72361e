// Disk full on a real filesystem (a small tmpfs): crash-only, as CONTRACT §8 says and PostgreSQL
// does.
//
// In flight when the disk fills: no 200 for a request whose end was not written, /healthz and
// /readyz fail at once, no write is answered and no read reports what the log does not hold, the
// process exits 75 after the grace, and the next start recovers: holds released, nothing answered
// 503 is charged.
import { afterAll, describe, expect, test } from 'bun:test';
import {
  closeSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  rmSync,
  unlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type GatewayProcess, startGatewayProcess } from '../support/process.ts';
import { SseReader } from '../support/sse.ts';

const ADMIN_TOKEN = 'disk-full-admin-token-0123456789';

interface Balances {
  credits: number;
  held: number;
  charged: number;
  credits_added: number;
}
const GRACE_MS = 1_000;
const IN_FLIGHT = 12;

const root = mkdtempSync(join(tmpdir(), 'tollgate-disk-full-'));
const mountPoint = join(root, 'fs');
mkdirSync(mountPoint);
let mounted = false;
const running: GatewayProcess[] = [];

afterAll(async () => {
  for (const gateway of running) if (gateway.proc.exitCode === null) await gateway.kill();
  if (mounted) Bun.spawnSync(['umount', '-l', mountPoint]);
  rmSync(root, { recursive: true, force: true });
});

function mountSmallTmpfs(): void {
  // Root is needed (the project's tests and CI run as root); say so plainly if it is missing.
  const result = Bun.spawnSync(
    ['mount', '-t', 'tmpfs', '-o', 'size=2m,mode=0700', 'tmpfs', mountPoint],
    { stderr: 'pipe' },
  );
  if (result.exitCode !== 0)
    throw new Error(
      `cannot mount a tmpfs for the disk-full test (root needed): ${result.stderr.toString()}`,
    );
  mounted = true;
}

/** Writes zeros until the filesystem refuses, in ever smaller pieces, so not a page is left. */
function fillDisk(path: string): void {
  const fd = openSync(path, 'w');
  try {
    for (const size of [256 * 1024, 4096, 512, 1]) {
      const zeros = new Uint8Array(size);
      for (;;) {
        try {
          writeSync(fd, zeros);
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code !== 'ENOSPC') throw error;
          break;
        }
      }
    }
  } finally {
    closeSync(fd);
  }
}

function admin(gateway: GatewayProcess, path: string, body?: unknown): Promise<Response> {
  return fetch(`${gateway.url}/admin/v1${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
}

function chat(
  gateway: GatewayProcess,
  key: string,
  body: Record<string, unknown>,
  idempotencyKey?: string,
): Promise<Response> {
  const headers: Record<string, string> = {
    authorization: `Bearer ${key}`,
    'content-type': 'application/json',
  };
  if (idempotencyKey) headers['idempotency-key'] = idempotencyKey;
  return fetch(`${gateway.url}/api/v1/chat/completions`, {
    method: 'POST',
    headers,
    body: JSON.stringify(body),
  });
}

const body = (n: number, stream = false) => ({
  model: 'model_03',
  stream,
  max_completion_tokens: 50,
  messages: [{ role: 'user', content: `request ${n}` }],
});

describe('disk full', () => {
  test(
    'in-flight requests get 503s, the probes fail, the process exits 75, and a restart ' +
      'recovers exactly',
    async () => {
      mountSmallTmpfs();
      const dataDir = join(mountPoint, 'data');
      const configPath = join(root, 'config.json');
      // Answers take 400 ms, so every request below is in flight when the disk fills.
      writeFileSync(
        configPath,
        JSON.stringify({
          providers: {
            simulator: {
              type: 'simulator',
              ttft_ms: 400,
              tokens_per_second: 100_000,
              completion_tokens: 20,
            },
          },
          limits: { shutdown_grace_ms: GRACE_MS, default_rate_limit_rpm: 100_000 },
          // Segments too small to be prepared ahead: a prepared segment's zeros are space the
          // disk already gave, and this test is about the write that finds none.
          wal: { segment_bytes: 32 * 1024 },
        }),
      );
      const env = { DATA_DIR: dataDir, ADMIN_TOKEN, GATEWAY_CONFIG: configPath };
      const first = await startGatewayProcess(env);
      running.push(first);
      const created = (await (
        await admin(first, '/keys', { name: 'disk', credits: 1_000 })
      ).json()) as { id: string; key: string };
      const { key } = created;
      expect((await chat(first, key, body(0))).status).toBe(200);
      const before = (
        (await (await admin(first, `/keys/${created.id}`)).json()) as { balances: Balances }
      ).balances;

      // In flight: streams and non-streams whose start is durable (an Idempotency-Key each), and
      // plain ones.
      const streams = Array.from({ length: IN_FLIGHT }, (_, i) =>
        chat(first, key, body(100 + i, true), `disk-stream-${i}-key`),
      );
      const bound = Array.from({ length: IN_FLIGHT }, (_, i) =>
        chat(first, key, body(200 + i), `disk-plain-${i}-key`),
      );
      const plain = Array.from({ length: IN_FLIGHT }, (_, i) => chat(first, key, body(300 + i)));
      // The twin of each bound request is a 409 only once the original's start is on disk (an
      // event, no sleep).
      for (let i = 0; i < IN_FLIGHT; i++) {
        expect((await chat(first, key, body(100 + i, true), `disk-stream-${i}-key`)).status).toBe(
          409,
        );
        expect((await chat(first, key, body(200 + i), `disk-plain-${i}-key`)).status).toBe(409);
      }
      fillDisk(join(mountPoint, 'filler'));

      // Every answer: a 200 whose end is durable, or a 503 / a service_unavailable event. Which
      // ones fit in the last page of the segment is the filesystem's business; that most cannot is
      // certain.
      const okIds: string[] = [];
      const failedIds: string[] = [];
      for (const response of await Promise.all([...bound, ...plain])) {
        const id = response.headers.get('x-request-id')!;
        if (response.status === 200) okIds.push(id);
        else {
          expect(response.status).toBe(503);
          expect(((await response.json()) as { error: { code: string } }).error.code).toBe(
            'service_unavailable',
          );
          expect(response.headers.get('x-should-retry')).toBe('true');
          failedIds.push(id);
        }
      }
      for (const response of await Promise.all(streams)) {
        const id = response.headers.get('x-request-id')!;
        const events =
          response.status === 200
            ? await new SseReader(response).rest()
            : [JSON.stringify(await response.json())];
        const last = events.at(-1);
        if (last === '[DONE]') okIds.push(id);
        else {
          expect(JSON.parse(last!)).toMatchObject({ error: { code: 'service_unavailable' } });
          failedIds.push(id);
        }
      }
      expect(failedIds.length).toBeGreaterThan(IN_FLIGHT);

      // At once, not after the exit: both probes fail, and nothing that reads or writes the ledger
      // answers.
      expect((await fetch(`${first.url}/healthz`)).status).toBe(503);
      expect((await fetch(`${first.url}/readyz`)).status).toBe(503);
      expect((await admin(first, `/keys/${created.id}/credits`, { credits: 500 })).status).toBe(
        503,
      );
      expect((await admin(first, `/keys/${created.id}`)).status).toBe(503);
      expect((await chat(first, key, body(999))).status).toBe(503);

      const startedExitMs = performance.now();
      expect(await first.exited).toBe(75);
      expect(performance.now() - startedExitMs).toBeLessThan(GRACE_MS + 2_000);

      // Space returns; the supervisor starts the gateway again, at once.
      unlinkSync(join(mountPoint, 'filler'));
      const second = await startGatewayProcess(env);
      running.push(second);
      const after = (
        (await (await admin(second, `/keys/${created.id}`)).json()) as { balances: Balances }
      ).balances;
      expect(after.held).toBe(0);
      // the top-up answered 503 is not there
      expect(after.credits_added).toBe(before.credits_added);
      expect(Math.round((after.credits + after.held + after.charged) * 1e6)).toBe(
        Math.round(after.credits_added * 1e6),
      );
      let chargedMicro = Math.round(before.charged * 1e6);
      const lookup = async (id: string) =>
        (await (
          await fetch(`${second.url}/api/v1/requests/${id}`, {
            headers: { authorization: `Bearer ${key}` },
          })
        ).json()) as Record<string, unknown>;
      for (const id of okIds) {
        const record = await lookup(id);
        expect(record.request_status).toBe('completed');
        chargedMicro += Math.round((record.charged_credits as number) * 1e6);
      }
      // Nothing answered 503 is charged: the plain ones left no trace, the others ended as
      // interrupted.
      for (const id of failedIds) {
        const record = await lookup(id);
        if ('error' in record)
          expect(record).toMatchObject({ error: { code: 'request_not_found' } });
        else
          expect(record).toMatchObject({
            request_status: 'error',
            error_code: 'interrupted',
            charged_credits: 0,
          });
      }
      expect(Math.round(after.charged * 1e6)).toBe(chargedMicro);

      // The disk fills again, and the orchestrator, seeing the probes fail, sends SIGTERM within
      // the grace: still the log failure's exit (75), not a clean stop.
      fillDisk(join(mountPoint, 'filler'));
      const refused = await Promise.all(
        Array.from({ length: IN_FLIGHT }, (_, i) => chat(second, key, body(400 + i))),
      );
      expect(refused.some((response) => response.status === 503)).toBe(true);
      expect((await fetch(`${second.url}/healthz`)).status).toBe(503);
      expect(await second.kill('SIGTERM')).toBe(75);
      unlinkSync(join(mountPoint, 'filler'));
    },
  );
});

describe('reads racing a finish the log fails to write', () => {
  test('no status read, cancel or 409 reports the end that was never recorded', async () => {
    const { openTestGateway, bearer, chatBody } = await import('../support/gateway.ts');
    const { readdirSync, symlinkSync } = await import('node:fs');
    const { SseReader: Reader } = await import('../support/sse.ts');
    // Every record rolls the segment; the one after the stream's start is a link to /dev/full,
    // where the kernel answers ENOSPC: the start is durable, the finish cannot be.
    const gateway = openTestGateway({
      wal: { fsync: 'always', segment_bytes: 1 },
      providers: {
        simulator: {
          type: 'simulator',
          ttft_ms: 50,
          tokens_per_second: 2_000,
          completion_tokens: 60,
        },
      },
    });
    try {
      const { key } = await gateway.createKey({ credits: 100 });
      const walDir = join(gateway.config.data_dir, 'wal');
      const current = Math.max(
        ...readdirSync(walDir)
          .filter((name) => name.endsWith('.wal'))
          .map((name) => Number(name.slice(8, 20))),
      );
      symlinkSync(
        '/dev/full',
        join(walDir, `segment-${String(current + 1).padStart(12, '0')}.wal`),
      );
      const body = chatBody({ stream: true });
      const headers = bearer(key, { 'idempotency-key': 'race-the-failed-finish' });
      const response = await gateway.request('/api/v1/chat/completions', {
        method: 'POST',
        headers,
        body: JSON.stringify(body),
      });
      expect(response.status).toBe(200);
      const id = response.headers.get('x-request-id')!;
      const reader = new Reader(response);
      // Read its status, cancel it and repeat it, every turn, until the stream has ended.
      let ended = false;
      const seen: string[] = [];
      const racing = (async () => {
        while (!ended) {
          const [status, cancel, repeat] = await Promise.all([
            gateway.request(`/api/v1/requests/${id}`, { headers: bearer(key) }),
            gateway.request(`/api/v1/requests/${id}/cancel`, {
              method: 'POST',
              headers: bearer(key),
            }),
            gateway.request('/api/v1/chat/completions', {
              method: 'POST',
              headers,
              body: JSON.stringify(body),
            }),
          ]);
          for (const answer of [status, cancel, repeat]) {
            const json = (await answer.json()) as {
              request_status?: string;
              error?: { code: string };
            };
            seen.push(`${answer.status} ${json.request_status ?? json.error?.code}`);
          }
          await new Promise((resolve) => setImmediate(resolve));
        }
      })();
      const events = await reader.rest();
      ended = true;
      await racing;
      expect(JSON.parse(events.at(-1)!)).toMatchObject({
        error: { code: expect.stringMatching(/^(service_unavailable|request_cancelled)$/) },
      });
      // Before the failure: in progress (or the cancel's 202, or the repeat's 409 in progress).
      // After it: 503. Never an end the log does not hold.
      for (const answer of seen)
        expect(answer).toMatch(
          /^(200 in_progress|202 \w+|409 (?:request_)?in_progress|503 service_unavailable)$/,
        );
      expect(seen.some((answer) => answer.startsWith('503'))).toBe(true);
      for (const answer of seen) expect(answer).not.toMatch(/completed|cancelled$/);
    } finally {
      await gateway.close();
    }
  });
});
