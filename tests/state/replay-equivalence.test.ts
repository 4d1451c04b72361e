// What the gateway believes after a restart is what it believed before: replaying the log, or
// restoring a snapshot and replaying the rest, rebuilds the same bindings and records, evicted the
// same way, whatever the wall clock says when the log is read (FairSlots decides by the events' own
// times).
import { afterAll, expect, setSystemTime, test } from 'bun:test';
import { SeededRandom } from '../../src/providers/simulator/random.ts';
import { GatewayState, type StateLimits } from '../../src/state/apply.ts';
import { checkEvent, type Event } from '../../src/state/events.ts';
import { restoreState, serializeState } from '../../src/state/snapshot.ts';
import { readWhole } from '../../src/wal/log.ts';
import { keyCreated, requestFinished, requestStarted } from './support.ts';

afterAll(() => setSystemTime());

const T0_MS = 1_900_000_000_000;
const TTL_MS = 40;

/**
 * A random history: keys, chat and decision requests with Idempotency-Keys, decisions that fail
 * (freeing their key).
 */
function history(seed: number): Event[] {
  const random = new SeededRandom(seed);
  const keys = ['k0', 'k1', 'k2', 'k3'];
  const events: Event[] = keys.map((key) => keyCreated(key, 1_000_000_000, { at_ms: T0_MS }));
  let nowMs = T0_MS;
  const running: Array<{ id: string; service: 'chat' | 'decision' }> = [];
  for (let i = 0; i < 160; i++) {
    // Now and then a jump of hours, so the usage history spans days and drops the old ones.
    nowMs += random.next() < 0.03 ? random.integer(6, 30) * 3_600_000 : random.integer(0, 4);
    if (running.length > 0 && random.next() < 0.5) {
      const { id, service } = running.splice(random.integer(0, running.length - 1), 1)[0]!;
      const failed = service === 'decision' && random.next() < 0.4;
      events.push(
        requestFinished(id, failed ? 0 : 5, {
          status: failed ? 'error' : 'completed',
          error_code: failed ? 'upstream_error' : null,
          at_ms: nowMs,
        }),
      );
      continue;
    }
    const service = random.next() < 0.3 ? 'decision' : 'chat';
    const id = `r${i}`;
    const idempotency =
      random.next() < 0.8
        ? { key: `idem-${random.integer(0, 20)}`, fingerprint: 'f', expires_at_ms: nowMs + TTL_MS }
        : null;
    events.push(
      requestStarted(id, keys[random.integer(0, keys.length - 1)]!, 10, {
        service,
        idempotency,
        at_ms: nowMs,
      }),
    );
    running.push({ id, service });
  }
  return events;
}

/** The whole of both tables, expired entries and the keys' eviction order included. */
function view(state: GatewayState) {
  return {
    bindings: [...state.idempotency.allEntries()].map(
      ([scope, binding]) => `${scope}|${binding.requestId}|${binding.expiresAtMs}`,
    ),
    bindingOwners: state.idempotency.ownerOrder(),
    records: [...state.finished.values(0)].map(
      (record) => `${record.id}|${record.keyId}|${record.status}`,
    ),
    recordOwners: state.finished.serializeColumns().meta.owners,
    usage: [...state.usage.rows(Number.NEGATIVE_INFINITY, Number.POSITIVE_INFINITY)],
  };
}

/** A snapshot's JSON parts, parsed. */
function parsed(content: { json: Uint8Array[] }): unknown {
  return JSON.parse(Buffer.concat(content.json).toString());
}

function applyAll(state: GatewayState, events: Event[], wallMs: number): void {
  setSystemTime(new Date(wallMs));
  for (const event of events) state.apply(checkEvent(structuredClone(event)));
}

test('live, replayed later, and snapshot + replay of the rest end with equal tables', async () => {
  for (let seed = 1; seed <= 400; seed++) {
    const random = new SeededRandom(seed * 7919);
    const limits: StateLimits = {
      requestRecordsMax: random.integer(2, 12),
      requestRecordsPerKey: random.integer(1, 12),
      idempotencyKeysMax: random.integer(2, 12),
      idempotencyKeysPerKey: random.integer(1, 12),
      requestRecordTtlMs: TTL_MS,
      usageRetentionDays: seed % 2 === 0 ? 400 : random.integer(1, 3),
    };
    const events = history(seed);
    const live = new GatewayState(limits);
    // Live: each event applied at its own time.
    for (const event of events) applyAll(live, [event], event.at_ms);
    // Replayed from the start, long after (every binding has expired by the wall clock).
    const replayed = new GatewayState(limits);
    applyAll(replayed, events, T0_MS + 10 * 60_000);
    expect(view(replayed)).toEqual(view(live));
    if (limits.usageRetentionDays === 400) {
      // Nothing dropped: the history's charges are each key's ledger `charged`, exactly.
      for (const account of live.keys.values()) {
        let charged = 0;
        for (const row of live.usage.rows(0, Number.POSITIVE_INFINITY, account.id))
          charged += row.chargedMicro;
        expect(charged).toBe(account.chargedMicro);
      }
    }
    // A snapshot taken live at a random point, restored later, the rest of the log replayed on it.
    const cut = random.integer(1, events.length - 1);
    const before = new GatewayState(limits);
    for (const event of events.slice(0, cut)) applyAll(before, [event], event.at_ms);
    const content = await serializeState(before);
    setSystemTime(new Date(T0_MS + 20 * 60_000));
    const restored = new GatewayState(limits);
    restoreState(restored, parsed(content), Date.now(), content.blobs.map(readWhole));
    content.written?.();
    applyAll(restored, events.slice(cut), T0_MS + 20 * 60_000);
    expect(view(restored)).toEqual(view(live));
  }
});

test(
  'a tie between the heaviest keys is settled after a restore as it was before (the order ' +
    'travels in the snapshot)',
  async () => {
    // Bindings: A 3, B 2; a failed decision frees one of A's, C binds one; A and B now tie at 2 in
    // an order only the live history made. The next key to bind evicts from the same one of them
    // either way.
    const far = T0_MS + 3_600_000;
    const binding = (id: string) => ({ requestId: id, fingerprint: 'f', expiresAtMs: far });
    const state = new GatewayState({
      requestRecordsMax: 4,
      requestRecordsPerKey: 100,
      idempotencyKeysMax: 5,
      idempotencyKeysPerKey: 100,
      requestRecordTtlMs: 3_600_000,
      usageRetentionDays: 400,
    });
    const live = state.idempotency;
    for (const [key, idem] of [
      ['A', 'a1'],
      ['A', 'a2'],
      ['A', 'a3'],
      ['B', 'b1'],
      ['B', 'b2'],
    ] as const)
      live.set(key, `${idem}-000000`, binding(`${key}${idem}`), T0_MS);
    live.deleteIfBoundTo('A', 'a3-000000', 'Aa3');
    live.set('C', 'c1-000000', binding('Cc1'), T0_MS);
    // Records: A 2, B 2 (B last to arrive), then C evicts from one of them, and B comes back to 2.
    const record = (id: string, keyId: string) => ({
      id,
      keyId,
      service: 'chat' as const,
      model: 'm',
      stream: false,
      status: 'completed' as const,
      createdAtMs: T0_MS,
      finishedAtMs: T0_MS,
      hold: { credits_micro: 0, tokens: 0 },
      charge: { credits_micro: 0, tokens: 0 },
      budgetHoldMicro: 0,
      usage: null,
      errorCode: null,
      httpStatus: 200,
      answers: null,
      attempts: null,
      idempotencyKey: null,
    });
    for (const [id, key] of [
      ['A1', 'A'],
      ['A2', 'A'],
      ['B1', 'B'],
      ['B2', 'B'],
      ['C1', 'C'],
      ['B3', 'B'],
    ] as const)
      state.finished.add(record(id, key));
    const content = await serializeState(state);
    const restored = new GatewayState(state.limits);
    restoreState(restored, parsed(content), T0_MS, content.blobs.map(readWhole));
    content.written?.();
    expect(view(restored)).toEqual(view(state));
    for (const table of [state, restored]) {
      table.idempotency.set('D', 'd1-000000', binding('Dd1'), T0_MS);
      table.finished.add(record('D1', 'D'));
    }
    expect(view(restored)).toEqual(view(state));
  },
);
