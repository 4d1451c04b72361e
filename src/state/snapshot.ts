// Snapshot form of the state: JSON, taken synchronously so it matches one log sequence number.
import { GatewayState, type IdempotencyBinding, type KeyAccount, type RequestRecord, type StateLimits } from './apply.ts';

/**
 * Version 2 keeps finished records as the record table's columns (RecordTable.serializeColumns):
 * a quarter of the text of version 1's objects, serialized in milliseconds instead of ~160 ms for
 * 100,000 records while the gateway waits. Version 1 (no `version`, `finished` as objects) is still read.
 */
interface SnapshotV2 {
  version: 2;
  keys: KeyAccount[];
  inFlight: RequestRecord[];
  idempotency: Array<[string, IdempotencyBinding]>;
  /** Oldest first, so restoring in order rebuilds the same eviction order. */
  finished: unknown;
}

interface SnapshotV1 {
  keys: KeyAccount[];
  inFlight: RequestRecord[];
  finished: RequestRecord[];
  idempotency: Array<[string, IdempotencyBinding]>;
}

export function serializeState(state: GatewayState): string {
  const keys = JSON.stringify([...state.keys.values()]);
  const inFlight = JSON.stringify([...state.inFlight.values()]);
  const idempotency = JSON.stringify([...state.idempotency.rentries()]);
  return `{"version":2,"keys":${keys},"inFlight":${inFlight},"idempotency":${idempotency},"finished":${state.finished.serializeColumns()}}`;
}

export function restoreState(state: GatewayState, raw: unknown, nowMs: number): void {
  const snapshot = raw as SnapshotV2 | SnapshotV1;
  for (const account of snapshot.keys) {
    state.keys.set(account.id, account);
    state.keysBySecret.set(account.secretSha256, account);
  }
  for (const record of snapshot.inFlight) state.inFlight.set(record.id, record);
  if ('version' in snapshot) state.finished.restoreColumns(snapshot.finished, nowMs);
  else for (const record of snapshot.finished) state.finished.add(record);
  for (const [scope, binding] of snapshot.idempotency) {
    const ttl = binding.expiresAtMs - nowMs;
    if (ttl > 0) state.idempotency.set(scope, binding, { ttl });
  }
}

export function emptyState(limits: StateLimits): GatewayState {
  return new GatewayState(limits);
}
