// Snapshot form of the state: JSON, taken synchronously so it matches one log sequence number.
import { assert } from '../util/assert.ts';
import type { SnapshotContent } from '../wal/log.ts';
import type { GatewayState, KeyAccount } from './apply.ts';
import type { IdempotencyBinding } from './bindings.ts';
import type { RequestRecord } from './records.ts';

/**
 * Version 2 keeps finished records as the record table's columns (RecordTable.serializeColumns):
 * their bytes travel beside the JSON, which holds the rest. Serialized in milliseconds instead of
 * ~160 ms for 100,000 records of version 1, while the gateway waits. Version 1 (no `version`,
 * `finished` as objects) is still read.
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

interface SnapshotV1 {
  keys: KeyAccount[];
  inFlight: RequestRecord[];
  finished: RequestRecord[];
  idempotency: Array<[string, IdempotencyBinding]>;
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

/** Restores `raw` (the parsed JSON) and `blobs` (the bytes beside it; none for version 1). */
export function restoreState(
  state: GatewayState,
  raw: unknown,
  _nowMs: number,
  blobs: readonly Uint8Array[] | null = null,
): void {
  const snapshot = raw as SnapshotV2 | SnapshotV1;
  for (const account of snapshot.keys) {
    state.keys.set(account.id, account);
    state.keysBySecret.set(account.secretSha256, account);
  }
  for (const record of snapshot.inFlight) state.inFlight.set(record.id, record);
  if ('version' in snapshot) {
    assert(blobs !== null, 'snapshot version 2 without its record columns');
    state.finished.restoreColumns(snapshot.finished, blobs);
  } else for (const record of snapshot.finished) state.finished.add(record);
  // Oldest first (as written), so the per-key order of eviction survives the restart.
  for (const [scope, binding] of snapshot.idempotency) state.idempotency.restore(scope, binding);
  if ('idempotencyOwners' in snapshot && Array.isArray(snapshot.idempotencyOwners))
    state.idempotency.restoreOwnerOrder(snapshot.idempotencyOwners);
}
