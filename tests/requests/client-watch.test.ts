// How a request watches its client (requests/actor.ts, http/client-connection.ts). A served
// request's AbortSignal costs every young collection, so it is read only by a run still going
// CLIENT_WATCH_DELAY_MS in (a wait for its binding's fsync included); a run over sooner asks the
// connection once whether its client is gone, and a gone client cancels it all the same.
import { expect, test } from 'bun:test';
import { connect } from 'node:net';
import { ServedClient } from '../../src/http/client-connection.ts';
import type { Completion, RequestActor, RunPolicy } from '../../src/requests/actor.ts';
import { admit } from '../../src/requests/admit.ts';
import type { Event } from '../../src/state/events.ts';
import type { ClientConnection } from '../../src/util/abort.ts';
import { newChatRequestId } from '../../src/util/ids.ts';
import {
  ADMIN_TOKEN,
  bearer,
  chatBody,
  closedAfterEach,
  FAST_SIMULATOR,
  type TestGateway,
  type TestServer,
} from '../support/gateway.ts';
import {
  CHAT,
  CHAT_STREAM,
  Client,
  DECISION,
  lifecycleOverrides,
  sendTo,
  startLifecycleUpstream,
} from '../support/lifecycle-harness.ts';

const cleanup = closedAfterEach();

/** Lets the event loop run once. */
const turn = () => new Promise((resolve) => setImmediate(resolve));

/** A client's connection that counts what the actor asks of it. */
class CountedClient implements ClientConnection {
  signalReads = 0;
  goneCalls = 0;
  readonly controller = new AbortController();

  constructor(private readonly closed = false) {}

  get signal(): AbortSignal {
    this.signalReads++;
    return this.controller.signal;
  }

  gone(): boolean {
    this.goneCalls++;
    return this.closed;
  }
}

const POLICY: RunPolicy = {
  deadlineMs: 60_000,
  deadlineKind: 'upstream_timeout',
  keepsHold: () => false,
};
const HOLD_MICRO = 1_000;
const CHARGE_MICRO = 300;

const COMPLETION: Completion<string> = {
  value: 'answer',
  usage: { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 },
  charge: { credits_micro: CHARGE_MICRO, tokens: 0 },
  budgetSpendMicro: 0,
  answers: null,
};

/** Work that answers at once: the run is over in microtasks, before any timer can fire. */
const answerNow = async (): Promise<Completion<string>> => COMPLETION;

/** Work that answers only when its request is aborted (then it throws the abort's reason). */
function untilAborted(_context: null, actor: RequestActor): Promise<Completion<string>> {
  return new Promise((_resolve, reject) =>
    actor.signal.addEventListener('abort', () => reject(actor.signal.reason)),
  );
}

async function admitted(
  client: ClientConnection,
  idempotencyKey: string | null = null,
): Promise<{ t: TestGateway; actor: RequestActor; keyId: string }> {
  const t = cleanup.gateway();
  const { id: keyId } = await t.createKey({ credits: 10 });
  const { actor } = admit(t.gateway, {
    service: 'chat',
    requestId: newChatRequestId(),
    account: t.gateway.store.state.keys.get(keyId)!,
    model: 'model_03',
    stream: false,
    idempotency: idempotencyKey === null ? null : { key: idempotencyKey, fingerprint: 'f' },
    client,
    reserve: () => ({ hold: { credits_micro: HOLD_MICRO, tokens: 0 }, budgetHoldMicro: 0 }),
  });
  return { t, actor, keyId };
}

function ledgerOf(t: TestGateway, keyId: string): { held: number; charged: number } {
  const account = t.gateway.store.state.keys.get(keyId)!;
  return { held: account.heldMicro, charged: account.chargedMicro };
}

test('a fast run never reads the signal; it asks once if its client is gone', async () => {
  const client = new CountedClient();
  const { t, actor, keyId } = await admitted(client);
  const result = await actor.run(answerNow, null, POLICY);
  expect(result).toEqual({ ok: true, value: 'answer' });
  expect({ signalReads: client.signalReads, goneCalls: client.goneCalls }).toEqual({
    signalReads: 0,
    goneCalls: 1,
  });
  expect(ledgerOf(t, keyId)).toEqual({ held: 0, charged: CHARGE_MICRO });
});

test('a fast run whose client is gone is cancelled: 499, nothing charged', async () => {
  const client = new CountedClient(true);
  const { t, actor, keyId } = await admitted(client);
  const result = await actor.run(answerNow, null, POLICY);
  expect(result.ok).toBe(false);
  expect(!result.ok && result.error.code).toBe('request_cancelled');
  expect(client.signalReads).toBe(0);
  expect(t.gateway.store.state.request(actor.id)?.status).toBe('cancelled');
  expect(ledgerOf(t, keyId)).toEqual({ held: 0, charged: 0 });
});

test('a run going at the watch reads the signal once; a disconnect cancels it', async () => {
  const client = new CountedClient();
  const { t, actor, keyId } = await admitted(client);
  const running = actor.run(untilAborted, null, POLICY);
  // The watch fires CLIENT_WATCH_DELAY_MS into the run; no timer of the test's own.
  while (client.signalReads === 0) await turn();
  client.controller.abort();
  const result = await running;
  expect(!result.ok && result.error.code).toBe('request_cancelled');
  expect({ signalReads: client.signalReads, goneCalls: client.goneCalls }).toEqual({
    signalReads: 1,
    goneCalls: 0,
  });
  expect(ledgerOf(t, keyId)).toEqual({ held: 0, charged: 0 });
});

test('a run that first waits for its binding, quickly, reads no signal either', async () => {
  const client = new CountedClient();
  const { actor } = await admitted(client, 'watch-idempotent-0001');
  expect(await actor.run(answerNow, null, POLICY)).toEqual({ ok: true, value: 'answer' });
  expect({ signalReads: client.signalReads, goneCalls: client.goneCalls }).toEqual({
    signalReads: 0,
    goneCalls: 1,
  });
});

test('a client gone while its binding waits for a slow disk is heard at the watch', async () => {
  const client = new CountedClient();
  const { t, actor, keyId } = await admitted(client, 'watch-idempotent-0002');
  // The start as a slow disk would leave it: not yet durable (the real commit goes on beside it).
  const disk = Promise.withResolvers<void>();
  actor.started(disk.promise);
  let worked = false;
  const running = actor.run(
    async () => {
      worked = true;
      return COMPLETION;
    },
    null,
    POLICY,
  );
  // The watch fires CLIENT_WATCH_DELAY_MS into the wait; no timer of the test's own.
  while (client.signalReads === 0) await turn();
  client.controller.abort();
  disk.resolve();
  const result = await running;
  expect(!result.ok && result.error.code).toBe('request_cancelled');
  expect(client.signalReads).toBe(1);
  expect(ledgerOf(t, keyId)).toEqual({ held: 0, charged: 0 });
  // Heard before the wait ended: the work (the provider's call) never started.
  expect(worked).toBe(false);
});

/** A run waiting for its binding behind a slow disk, until `disk` resolves; its work never ends. */
async function waitingForDisk(client: CountedClient, idempotencyKey: string) {
  const admission = await admitted(client, idempotencyKey);
  const disk = Promise.withResolvers<void>();
  admission.actor.started(disk.promise);
  const running = admission.actor.run(untilAborted, null, DEADLINE_POLICY);
  return { ...admission, disk, running };
}

const DEADLINE_POLICY: RunPolicy = { ...POLICY, deadlineMs: 40 };

test('the deadline counts from the end of the wait for the disk, watch fired or not', async () => {
  // The watch fires during the wait: the deadline is armed whole once the wait ends.
  const slow = new CountedClient();
  const first = await waitingForDisk(slow, 'watch-idempotent-0003');
  while (slow.signalReads === 0) await turn();
  let waitEndedMs = performance.now();
  first.disk.resolve();
  let result = await first.running;
  expect(!result.ok && result.error.code).toBe('upstream_timeout');
  expect(performance.now() - waitEndedMs).toBeGreaterThanOrEqual(DEADLINE_POLICY.deadlineMs);
  // The wait ends a few ms in, before the watch: what the watch leaves of the deadline is counted
  // from the wait's end too.
  const quick = new CountedClient();
  const second = await waitingForDisk(quick, 'watch-idempotent-0004');
  const startMs = performance.now();
  while (performance.now() - startMs < 5) await turn();
  waitEndedMs = performance.now();
  second.disk.resolve();
  result = await second.running;
  expect(!result.ok && result.error.code).toBe('upstream_timeout');
  expect(performance.now() - waitEndedMs).toBeGreaterThanOrEqual(DEADLINE_POLICY.deadlineMs);
  expect(quick.signalReads).toBe(1);
});

test("a watch pending at the wait's end never leaves less than the whole deadline", async () => {
  // Bun's setTimeout truncates its delay to whole ms (toInt32, oven-sh/bun#8859): a rest with a
  // fraction, armed as it is, fires up to 1 ms before the deadline counted from the wait's end.
  // Each round ends the wait where what is left of the watch has a small fraction, so the rest's
  // is large; the abort is timed by the run's own signal, the moment the deadline fires.
  const shortMs: number[] = [];
  for (let round = 0; round < 8; round++) {
    const client = new CountedClient();
    const waiting = await waitingForDisk(client, `watch-idempotent-01${round}`);
    const abortedAt = Promise.withResolvers<number>();
    waiting.actor.signal.addEventListener('abort', () => abortedAt.resolve(performance.now()));
    let waitEndedMs = performance.now();
    let leftMs = waiting.actor.timerDueMs - waitEndedMs;
    // Synchronous: no timer can fire meanwhile (the watch stays pending, ~10 ms away at most), and
    // it ends, as leftMs only falls. Whatever it ends at, the deadline must hold from there.
    while (leftMs >= 1 && leftMs % 1 > 0.2) {
      waitEndedMs = performance.now();
      leftMs = waiting.actor.timerDueMs - waitEndedMs;
    }
    waiting.disk.resolve();
    const result = await waiting.running;
    expect(!result.ok && result.error.code).toBe('upstream_timeout');
    const elapsedMs = (await abortedAt.promise) - waitEndedMs;
    if (elapsedMs < DEADLINE_POLICY.deadlineMs) shortMs.push(elapsedMs);
  }
  expect(shortMs).toEqual([]);
});

test('served: gone() is false while the client is connected, true once it closed', async () => {
  const seen = Promise.withResolvers<ServedClient>();
  const release = Promise.withResolvers<void>();
  const server = Bun.serve({
    port: 0,
    async fetch(request, served) {
      seen.resolve(new ServedClient(request, served));
      await release.promise;
      return new Response('late');
    },
  });
  cleanup.track({ stop: () => server.stop(true) });
  const socket = connect(server.port!, '127.0.0.1');
  socket.write('GET / HTTP/1.1\r\nHost: gateway.test\r\n\r\n');
  const client = await seen.promise;
  expect(client.gone()).toBe(false);
  socket.destroy();
  // Bun notices the close on a later turn; the test's own timeout bounds this wait.
  while (!client.gone()) await turn();
  expect(client.signal.aborted).toBe(true);
  release.resolve();
});

test('served fast requests, chat and decision, keyed or not, read no request signal', async () => {
  // Every token due at once: a run ends in microtasks, before its watch's timer can fire.
  const simulator = { ...FAST_SIMULATOR, tokens_per_second: 1_000_000_000 };
  const t = await cleanup.server({ providers: { simulator } });
  const { key } = await t.createKey({ credits: 10 });
  // A spy that calls through: the reads of ServedClient's signal getter, the one way to the
  // request's signal on these routes.
  const getter = Object.getOwnPropertyDescriptor(ServedClient.prototype, 'signal')!;
  let reads = 0;
  Object.defineProperty(ServedClient.prototype, 'signal', {
    ...getter,
    get(this: ServedClient) {
      reads++;
      return getter.get!.call(this);
    },
  });
  try {
    for (const stream of [false, true]) {
      // With an Idempotency-Key too (the official SDKs send one with every POST): its run waits
      // for the binding's fsync first, through the same watch.
      for (const idempotencyKey of [null, `watch-served-${stream}`]) {
        const headers: Record<string, string> = bearer(key);
        if (idempotencyKey !== null) headers['idempotency-key'] = idempotencyKey;
        const response = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
          method: 'POST',
          headers,
          body: JSON.stringify(chatBody({ stream })),
        });
        expect(response.status).toBe(200);
        await response.text();
      }
    }
    const extras: Record<string, string>[] = [{}, { 'idempotency-key': 'watch-served-decision' }];
    for (const extra of extras) {
      const decision = await fetch(`${t.baseUrl}${DECISION.path}`, {
        method: 'POST',
        headers: bearer(key, extra),
        body: JSON.stringify(DECISION.body()),
      });
      expect(decision.status).toBe(200);
    }
    expect(reads).toBe(0);
  } finally {
    Object.defineProperty(ServedClient.prototype, 'signal', getter);
  }
});

/**
 * A slow disk for the starts a run must wait for (or for the commits of another event type): each
 * such commit is durable only once the returned gate opens (the commit itself goes on as it would).
 */
function slowStarts(
  t: TestServer,
  type: Event['type'] = 'request.started',
): PromiseWithResolvers<void> {
  const store = t.gateway.store;
  const commit = store.commit.bind(store);
  const gate = Promise.withResolvers<void>();
  store.commit = (events: Event[]) => {
    const durable = commit(events);
    return events.some((event) => event.type === type) ? durable.then(() => gate.promise) : durable;
  };
  return gate;
}

/** The one request running on `t`, once admitted. */
async function runningActor(t: TestServer): Promise<RequestActor> {
  while (t.gateway.registry.size === 0) await turn();
  return t.gateway.registry.all()[0]!;
}

for (const svc of [CHAT, CHAT_STREAM, DECISION]) {
  const label = svc.label.replace(' ', '-');

  const gone = `served ${svc.label}: a client gone during a slow keyed start is heard, no provider`;
  test(gone, async () => {
    const upstream = cleanup.track(startLifecycleUpstream());
    const t = await cleanup.server(lifecycleOverrides(upstream));
    const client = await Client.create(svc, sendTo(t.baseUrl));
    const disk = slowStarts(t);
    const leaving = new AbortController();
    const response = client.post({ idempotencyKey: `watch-gone-${label}`, signal: leaving.signal });
    const actor = await runningActor(t);
    leaving.abort();
    await response.catch(() => {});
    // Heard while the start is still not durable: only the watch can hear it then.
    while (!actor.signal.aborted) await turn();
    disk.resolve();
    await actor.settled;
    const record = await client.record(actor.id);
    expect({ status: record.status, errorCode: record.errorCode }).toEqual({
      status: 'cancelled',
      errorCode: 'request_cancelled',
    });
    expect(upstream.calls.length).toBe(0);
    await client.expectLedger(0);
  }, 10_000);

  test(`served ${svc.label}: a keyed request's status and cancel during a slow start`, async () => {
    const release = Promise.withResolvers<void>();
    const upstream = cleanup.track(
      startLifecycleUpstream(() => ({ kind: 'answerAfter', until: release.promise })),
    );
    const t = await cleanup.server(lifecycleOverrides(upstream));
    const client = await Client.create(svc, sendTo(t.baseUrl));
    const disk = slowStarts(t);
    const finishing = slowStarts(t, 'request.finished');
    const response = client.post({ idempotencyKey: `watch-cancel-${label}` });
    const actor = await runningActor(t);
    // Read while the start is not durable. The cancel comes during the wait, so the request ends
    // the moment the wait does: the read answers with that end once it is durable, never with a
    // state a crash could take back.
    const status = client.record(actor.id);
    // Chat has its key's own cancel; a decision is cancelled by the admin.
    const cancel =
      svc.service === 'chat'
        ? fetch(`${t.baseUrl}/api/v1/requests/${actor.id}/cancel`, {
            method: 'POST',
            headers: bearer(client.key),
          })
        : fetch(`${t.baseUrl}/admin/v1/requests/${actor.id}/cancel`, {
            method: 'POST',
            headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
          });
    while (!actor.signal.aborted) await turn();
    let statusRead = false;
    void status.then(() => (statusRead = true));
    disk.resolve();
    for (let i = 0; i < 20; i++) await turn();
    // Its finish is not durable yet: the read waits for it.
    expect(statusRead).toBe(false);
    finishing.resolve();
    expect((await status).status).toBe('cancelled');
    const cancelled = await cancel;
    expect(cancelled.status).toBe(202);
    expect(((await cancelled.json()) as any).request_status).toBe('cancelled');
    const answered = await response;
    expect(answered.status).toBe(499);
    expect(((await answered.json()) as any).error.code).toBe('request_cancelled');
    expect((await client.record(actor.id)).status).toBe('cancelled');
    expect(upstream.calls.length).toBe(0);
    await client.expectLedger(0);
    release.resolve();
  }, 10_000);
}
