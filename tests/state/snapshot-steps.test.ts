// A snapshot is the state at the moment it is taken, though it is serialized in steps with the
// event loop free in between: what happens after the call never leaks in.
import { expect, test } from 'bun:test';
import { GatewayState } from '../../src/state/apply.ts';
import { restoreState, serializeState } from '../../src/state/snapshot.ts';
import { readWhole } from '../../src/wal/log.ts';
import { keyCreated, LIMITS, requestFinished, requestStarted, T0_MS } from './support.ts';

const BINDINGS = 60_000;
const LATER_MS = T0_MS + 86_400_000;

function filled(): GatewayState {
  const state = new GatewayState({
    ...LIMITS,
    idempotencyKeysMax: BINDINGS + 1,
    idempotencyKeysPerKey: BINDINGS + 1,
  });
  state.apply(keyCreated('k1', 1_000_000_000));
  for (let i = 0; i < BINDINGS; i++) {
    state.idempotency.set(
      'k1',
      `idem-${i}`,
      { requestId: `req-${i}`, fingerprint: 'f'.repeat(64), expiresAtMs: LATER_MS },
      T0_MS,
    );
  }
  state.apply(
    requestStarted('r1', 'k1', 5_000, {
      idempotency: { key: 'idem-started', fingerprint: 'f', expires_at_ms: LATER_MS },
    }),
  );
  state.apply(requestStarted('r2', 'k1', 5_000));
  state.apply(requestFinished('r2', 1_000));
  return state;
}

function parsed(json: Uint8Array[]): any {
  return JSON.parse(Buffer.concat(json).toString());
}

test('a large snapshot gives the loop turns, and holds only the state of its call', async () => {
  const state = filled();
  const expected = parsed((await serializeState(state)).json);
  let turns = 0;
  let counting = true;
  const tick = () => {
    turns++;
    if (counting) setImmediate(tick);
  };
  setImmediate(tick);
  const serializing = serializeState(state);
  // While it is serialized: a request finishes, another starts, bindings are replaced and evicted.
  state.apply(requestFinished('r1', 2_000));
  state.apply(requestStarted('r3', 'k1', 7_000));
  for (let i = 0; i < 1_000; i++) {
    state.idempotency.set(
      'k1',
      `new-${i}`,
      { requestId: `late-${i}`, fingerprint: 'e'.repeat(64), expiresAtMs: LATER_MS },
      T0_MS,
    );
  }
  const content = await serializing;
  counting = false;
  // 60,000 bindings are tens of milliseconds of JSON: in steps of 4 ms the loop ran in between.
  expect(turns).toBeGreaterThan(1);
  const snapshot = parsed(content.json);
  expect(snapshot).toEqual(expected);
  expect(snapshot.inFlight.map((record: { id: string }) => record.id)).toEqual(['r1']);
  expect(JSON.stringify(snapshot)).not.toContain('late-');
  // And it restores to the table it captured.
  const restored = new GatewayState(state.limits);
  restoreState(restored, snapshot, T0_MS, content.blobs.map(readWhole));
  content.written?.();
  expect(restored.binding('k1', 'idem-0', T0_MS)?.requestId).toBe('req-0');
  expect(restored.binding('k1', 'new-0', T0_MS)).toBeUndefined();
  expect(restored.idempotency.size).toBe(BINDINGS + 1);
  // r1's hold (5,000 µcr) as it was; r3's never.
  expect(restored.account('k1').heldMicro).toBe(5_000);
});
