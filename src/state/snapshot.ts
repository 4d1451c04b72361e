// Snapshot form of the state: plain JSON, taken synchronously so it matches one log sequence number.
import { GatewayState, type IdempotencyBinding, type KeyAccount, type RequestRecord, type StateLimits } from './apply.ts';

interface SnapshotV1 {
  keys: KeyAccount[];
  inFlight: RequestRecord[];
  finished: RequestRecord[];
  idempotency: Array<[string, IdempotencyBinding]>;
}

export function serializeState(state: GatewayState): string {
  const snapshot: SnapshotV1 = {
    keys: [...state.keys.values()],
    inFlight: [...state.inFlight.values()],
    // Oldest first, so restoring in order rebuilds the same eviction order.
    finished: [...state.finished.values()],
    idempotency: [...state.idempotency.rentries()] as Array<[string, IdempotencyBinding]>,
  };
  return JSON.stringify(snapshot);
}

export function restoreState(state: GatewayState, raw: unknown, nowMs: number): void {
  const snapshot = raw as SnapshotV1;
  for (const account of snapshot.keys) {
    state.keys.set(account.id, account);
    state.keysBySecret.set(account.secretSha256, account);
  }
  for (const record of snapshot.inFlight) state.inFlight.set(record.id, record);
  for (const record of snapshot.finished) state.finished.add(record);
  for (const [scope, binding] of snapshot.idempotency) {
    const ttl = binding.expiresAtMs - nowMs;
    if (ttl > 0) state.idempotency.set(scope, binding, { ttl });
  }
}

export function emptyState(limits: StateLimits): GatewayState {
  return new GatewayState(limits);
}
