// A crash between two attempts (CONTRACT §3 "a crash of the gateway itself", §7 "one hold covers
// all attempts"): the first deployment answered 500, the second has the call and is holding it when
// the gateway is SIGKILLed. After the restart the request is error/interrupted, its one hold is
// released, nothing is charged, and a repeat of its Idempotency-Key is 409
// request_already_completed that calls no provider.
import { afterEach, expect, test } from 'bun:test';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type GatewayProcess, startGatewayProcess } from '../support/process.ts';

const ADMIN_TOKEN = 'failover-crash-admin-token-0123456789';
const INITIAL_CREDITS = 10;
const MICRO_PER_CREDIT = 1_000_000;

/** One deployment's fake OpenAI-compatible upstream. */
interface FakeDeployment {
  name: string;
  url: string;
  calls: number;
  server: ReturnType<typeof Bun.serve>;
}

/**
 * Two fakes that answer by the order calls arrive at either of them: the first call fails with a
 * 500 (a failover), the second is held open, never answered. The router picks the first
 * attempt by weight, at random, and never tries a deployment twice in one request, so whichever
 * deployment it picks first fails and the other one holds attempt 2: the sequence is the same on
 * every run, with no weight trick and no timing.
 */
interface ScriptedPair {
  deployments: [FakeDeployment, FakeDeployment];
  /** Names of the deployments in the order calls arrived. */
  arrivals: string[];
  /** Resolves with the deployment's name when the second call arrives and is being held. */
  held: PromiseWithResolvers<string>;
  stop(): void;
}

function startScriptedPair(): ScriptedPair {
  const pair: ScriptedPair = {
    deployments: [] as unknown as [FakeDeployment, FakeDeployment],
    arrivals: [],
    held: Promise.withResolvers<string>(),
    stop: () => {
      for (const deployment of pair.deployments) deployment.server.stop(true);
    },
  };
  for (const name of ['first', 'second']) {
    const deployment: FakeDeployment = { name, url: '', calls: 0, server: null as never };
    deployment.server = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      idleTimeout: 0,
      async fetch(request) {
        deployment.calls++;
        await request.text();
        pair.arrivals.push(name);
        if (pair.arrivals.length === 2) {
          pair.held.resolve(name);
          return new Promise<Response>(() => {});
        }
        // The first call, and any call after the held one (a bug: the test counts them), fails
        // at once, so such a bug shows as a wrong answer, not as a test that hangs.
        return Response.json({ error: { message: 'boom', type: 'server_error' } }, { status: 500 });
      },
    });
    deployment.url = `http://127.0.0.1:${deployment.server.port}/v1`;
    pair.deployments.push(deployment);
  }
  return pair;
}

interface Balances {
  credits: number;
  held: number;
  charged: number;
  credits_added: number;
}

const micro = (credits: number) => Math.round(credits * MICRO_PER_CREDIT);

const running: GatewayProcess[] = [];
const cleanups: Array<() => void> = [];
afterEach(async () => {
  for (const gateway of running.splice(0)) if (gateway.proc.exitCode === null) await gateway.kill();
  for (const cleanup of cleanups.splice(0)) cleanup();
});

function admin(gateway: GatewayProcess, path: string, body?: unknown): Promise<Response> {
  return fetch(`${gateway.url}/admin/v1${path}`, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
}

async function balances(gateway: GatewayProcess, keyId: string): Promise<Balances> {
  const response = await admin(gateway, `/keys/${keyId}`);
  expect(response.status).toBe(200);
  return ((await response.json()) as { balances: Balances }).balances;
}

/** The ledger invariant to the µcr: credits_added = balance + held + charged, balance ≥ 0. */
function expectInvariant(b: Balances): void {
  expect(micro(b.credits_added)).toBe(micro(b.credits) + micro(b.held) + micro(b.charged));
  expect(b.credits).toBeGreaterThanOrEqual(0);
}

function chat(
  gateway: GatewayProcess,
  key: string,
  body: Record<string, unknown>,
  idempotencyKey: string,
): Promise<Response> {
  return fetch(`${gateway.url}/api/v1/chat/completions`, {
    method: 'POST',
    headers: {
      authorization: `Bearer ${key}`,
      'content-type': 'application/json',
      'idempotency-key': idempotencyKey,
    },
    body: JSON.stringify(body),
  });
}

for (const stream of [false, true]) {
  const variant = stream ? 'stream' : 'non-stream';
  const name =
    `${variant}: SIGKILL while attempt 2 is in flight leaves no hold and no charge, ` +
    "and the key's repeat is 409 without a provider call";
  test(name, async () => {
    const pair = startScriptedPair();
    cleanups.push(() => pair.stop());
    const dataRoot = mkdtempSync(join(tmpdir(), 'tollgate-failover-crash-'));
    cleanups.push(() => rmSync(dataRoot, { recursive: true, force: true }));
    const configPath = join(dataRoot, 'config.json');
    const [first, second] = pair.deployments;
    writeFileSync(
      configPath,
      JSON.stringify({
        providers: {
          first: { type: 'openai', base_url: first.url, timeout_ms: 60_000 },
          second: { type: 'openai', base_url: second.url, timeout_ms: 60_000 },
        },
        // Equal weights: either may be picked first; the pair's script, not the pick, decides
        // which call fails and which is held.
        models: {
          model_03: {
            deployments: [
              { provider: 'first', upstream_model: 'up-first' },
              { provider: 'second', upstream_model: 'up-second' },
            ],
          },
        },
        limits: { upstream_timeout_ms: 60_000, stream_timeout_ms: 60_000 },
        // Every acknowledged commit is on disk when the kill lands.
        wal: { fsync: 'always' },
      }),
    );
    const env = { DATA_DIR: join(dataRoot, 'data'), ADMIN_TOKEN, GATEWAY_CONFIG: configPath };

    const before = await startGatewayProcess(env);
    running.push(before);
    const created = await admin(before, '/keys', {
      name: 'failover-crash',
      services: ['chat'],
      credits: INITIAL_CREDITS,
    });
    expect(created.status).toBe(201);
    const { id: keyId, key } = (await created.json()) as { id: string; key: string };
    const start = await balances(before, keyId);

    const body = {
      model: 'model_03',
      stream,
      max_completion_tokens: 100,
      messages: [{ role: 'user', content: `crash between attempts (${variant})` }],
    };
    const idempotencyKey = `failover-crash-${variant}`;
    // The original's answer: whatever the kill leaves of it (a transport error, most likely).
    const original = chat(before, key, body, idempotencyKey).then(
      async (response) => ({
        status: response.status,
        text: await response.text().catch(() => ''),
      }),
      (error: unknown) => ({ status: null, text: String(error) }),
    );

    // Attempt 1 failed with a 500 and attempt 2 has reached the other deployment.
    const holder = await pair.held.promise;
    expect(pair.arrivals).toHaveLength(2);
    expect(pair.arrivals[1]).toBe(holder);
    expect(pair.arrivals[0]).not.toBe(holder);
    expect(first.calls + second.calls).toBe(2);

    // A twin is 409 request_in_progress only once the original's start (its hold) is durable:
    // after this, the kill cannot land before the request exists on disk. It names the request.
    const twin = await chat(before, key, body, idempotencyKey);
    expect(twin.status).toBe(409);
    const twinBody = (await twin.json()) as any;
    expect(twinBody.error.code).toBe('request_in_progress');
    const requestId: string = twinBody.request_id;
    expect(requestId).toMatch(/^chatcmpl-/);
    const inFlight = await balances(before, keyId);
    expect(micro(inFlight.held)).toBeGreaterThan(0);
    expectInvariant(inFlight);

    expect(await before.kill('SIGKILL')).not.toBe(0);
    const cut = await original;
    // The client never got an answer that could be mistaken for a success.
    expect(cut.status === null || !cut.text.includes('[DONE]')).toBe(true);
    expect(cut.status === 200 && !stream).toBe(false);

    const after = await startGatewayProcess(env);
    running.push(after);

    // The one hold is released, nothing charged: the key is as it was before the request.
    const ledger = await balances(after, keyId);
    expect(ledger.held).toBe(0);
    expect(micro(ledger.charged)).toBe(micro(start.charged));
    expect(micro(ledger.credits)).toBe(micro(start.credits));
    expect(micro(ledger.credits_added)).toBe(micro(start.credits_added));
    expectInvariant(ledger);

    // The status record: error/interrupted, charged 0, with the hold it had as its reservation.
    const lookup = await fetch(`${after.url}/api/v1/requests/${requestId}`, {
      headers: { authorization: `Bearer ${key}` },
    });
    expect(lookup.status).toBe(200);
    const record = (await lookup.json()) as any;
    expect(record).toMatchObject({
      object: 'request.status',
      request_id: requestId,
      request_status: 'error',
      error_code: 'interrupted',
      model: 'model_03',
      stream,
      usage: null,
      charged_credits: 0,
    });
    expect(micro(record.reserved_credits)).toBe(micro(inFlight.held));
    expect(record.finished).toBeGreaterThanOrEqual(record.created);
    // The attempts are written with the request's finish, which the crash prevented: whatever the
    // record lists, no attempt answered.
    expect(Array.isArray(record.attempts)).toBe(true);
    for (const attempt of record.attempts) expect(attempt.outcome).not.toBe('ok');

    // The key covers the whole request: its repeat is the terminal original, no new task.
    const repeat = await chat(after, key, body, idempotencyKey);
    expect(repeat.status).toBe(409);
    const repeatBody = (await repeat.json()) as any;
    expect(repeatBody).toMatchObject({
      error: { code: 'request_already_completed' },
      request_id: requestId,
      request_status: 'error',
    });
    expect(repeat.headers.get('x-request-id')).toBe(requestId);
    expect(repeat.headers.get('x-service-request-status')).toBe(repeatBody.status_url);
    // Neither deployment was called again, neither by recovery nor by the repeat.
    expect(first.calls + second.calls).toBe(2);
    expect(pair.arrivals).toHaveLength(2);

    // Recovery said what it did: one request ended as interrupted.
    const recovered = after.lines.find((line) => String(line.msg).startsWith('recovery:'));
    expect(recovered?.requests).toBe(1);

    const final = await balances(after, keyId);
    expect(micro(final.charged)).toBe(micro(start.charged));
    expect(final.held).toBe(0);
    expectInvariant(final);
  }, 60_000);
}
