// Snapshot form of the state: JSON, taken synchronously so it matches one log sequence number.
import { type SnapshotContent, WalCorruptionError } from '../wal/log.ts';
import type { GatewayState, KeyAccount } from './apply.ts';
import type { IdempotencyBinding } from './bindings.ts';
import type { RequestRecord } from './records.ts';

/**
 * Version 2 keeps finished records as the record table's columns (RecordTable.serializeColumns):
 * their bytes travel beside the JSON, which holds the rest. Serialized in milliseconds instead of
 * ~160 ms for 100,000 records as objects (version 1, which only a development build wrote:
 * it is no longer read; a snapshot of another version refuses to start).
 */
interface SnapshotV2 {
  version: 2;
  keys: KeyAccount[];
  inFlight: RequestRecord[];
  idempotency: Array<[string, IdempotencyBinding]>;
  /** The API keys holding bindings in FairSlots' bucket order (absent before it was kept). */
  idempotencyOwners?: string[];
  /** Oldest first, so restoring in order rebuilds the same eviction order. */
  finished: unknown;
}

export function serializeState(state: GatewayState): SnapshotContent {
  const { meta, blobs } = state.finished.serializeColumns();
  const snapshot: SnapshotV2 = {
    version: 2,
    keys: [...state.keys.values()],
    inFlight: [...state.inFlight.values()],
    // All of it, expired entries too, with the keys' order: restored, it is the table the log made.
    idempotency: [...state.idempotency.allEntries()],
    idempotencyOwners: state.idempotency.ownerOrder(),
    finished: meta,
  };
  return { json: JSON.stringify(snapshot), blobs };
}

/** Restores `raw` (the parsed JSON) and `blobs` (the record columns' bytes beside it). */
export function restoreState(
  state: GatewayState,
  raw: unknown,
  _nowMs: number,
  blobs: readonly Uint8Array[],
): void {
  const snapshot = raw as SnapshotV2;
  if (snapshot?.version !== 2) {
    throw new WalCorruptionError(`snapshot state version ${String(snapshot?.version)} is unknown`);
  }
  for (const account of snapshot.keys) {
    state.keys.set(account.id, account);
    state.keysBySecret.set(account.secretSha256, account);
  }
  for (const record of snapshot.inFlight) state.inFlight.set(record.id, record);
  state.finished.restoreColumns(snapshot.finished, blobs);
  // Oldest first (as written), so the per-key order of eviction survives the restart.
  for (const [scope, binding] of snapshot.idempotency) state.idempotency.restore(scope, binding);
  if ('idempotencyOwners' in snapshot && Array.isArray(snapshot.idempotencyOwners))
    state.idempotency.restoreOwnerOrder(snapshot.idempotencyOwners);
}
