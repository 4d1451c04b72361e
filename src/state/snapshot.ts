// Snapshot form of the state: JSON and record columns, captured at one log sequence number and
// serialized in steps.

import { nextTurn } from '../util/promise.ts';
import { type SnapshotContent, type SnapshotSource, WalCorruptionError } from '../wal/log.ts';
import type { GatewayState, KeyAccount } from './apply.ts';
import type { IdempotencyBinding } from './bindings.ts';
import type { ColumnsMeta, RequestRecord } from './records.ts';
import type { UsageMeta } from './usage.ts';

/**
 * Version 2 keeps finished records as the record table's columns (RecordTable.captureColumns):
 * their bytes travel beside the JSON, which holds the rest. Serialized in milliseconds instead of
 * ~160 ms for 100,000 records as objects (version 1, which only a development build wrote:
 * it is no longer read; a snapshot of another version refuses to start). Version 3 is version 2
 * with the record columns in layout 3 (134-byte rows, records.ts): this gateway reads both; a
 * gateway from before it refuses a version 3 snapshot by its number rather than by a column's size.
 */
interface SnapshotV2 {
  version: 2 | 3;
  keys: KeyAccount[];
  inFlight: RequestRecord[];
  idempotency: Array<[string, IdempotencyBinding]>;
  /** The API keys holding bindings in FairSlots' bucket order (absent before it was kept). */
  idempotencyOwners?: string[];
  /** Oldest first, so restoring in order rebuilds the same eviction order. */
  finished: unknown;
  /**
   * The usage history's names and days (absent before it was kept: it then starts empty); its
   * columns are the blobs after the first `finishedBlobs`, which are the records'.
   */
  usage?: UsageMeta;
  finishedBlobs?: number;
}

/**
 * Work between two turns of the event loop while a snapshot is serialized: a full table of 100,000
 * bindings is ~150 ms of JSON, which in one piece was the gateway's longest stall (issue 15).
 */
const STEP_MS = 4;
/** JSON text is encoded to UTF-8 in parts of about this many characters (~0.5 ms each). */
const PART_CHARS = 256 * 1024;

/** JSON text built as UTF-8 parts, in steps of STEP_MS with the event loop free in between. */
class SteppedJson {
  readonly parts: Uint8Array[] = [];
  private text = '';
  private stepStartMs = performance.now();

  write(text: string): void {
    this.text += text;
    if (this.text.length >= PART_CHARS) this.encode();
  }

  /** Gives the loop a turn when this step has run its time. */
  async pause(): Promise<void> {
    if (performance.now() - this.stepStartMs < STEP_MS) return;
    await nextTurn();
    this.stepStartMs = performance.now();
  }

  /** `"name":{"k":v,...}` for an object whose entries may be many, in steps. */
  async object(name: string, entries: Record<number, unknown>): Promise<void> {
    this.write(`${JSON.stringify(name)}:{`);
    let first = true;
    for (const position in entries) {
      this.write(`${first ? '' : ','}"${position}":${JSON.stringify(entries[position])}`);
      first = false;
      await this.pause();
    }
    this.write('}');
  }

  finish(): Uint8Array[] {
    this.encode();
    return this.parts;
  }

  private encode(): void {
    if (this.text.length === 0) return;
    this.parts.push(Buffer.from(this.text, 'utf8'));
    this.text = '';
  }
}

/**
 * The state as a snapshot. Everything that changes in place (keys, in-flight records) is copied or
 * serialized before the first `await`, and the record columns are captured then (the table keeps
 * the rows it overwrites until `written`), so the snapshot is the state at the moment of the call
 * (the log's seq then); what is only referenced afterwards never changes in place (bindings, a
 * finished record's answers and attempts, interned strings), and is serialized in steps so that no
 * request waits behind the whole of it.
 */
export async function serializeState(state: GatewayState): Promise<SnapshotContent> {
  const head = JSON.stringify({
    version: 3,
    keys: [...state.keys.values()],
    inFlight: [...state.inFlight.values()],
  });
  const { meta, sources, release } = state.finished.captureColumns();
  try {
    // The log calls `written` once the file is written or the snapshot failed, not when it ends:
    // removing the segments it covers takes longer, and each record evicted meanwhile would be
    // kept for nothing.
    return { ...(await serializeRest(state, head, meta, sources)), written: release };
  } catch (error) {
    release();
    throw error;
  }
}

async function serializeRest(
  state: GatewayState,
  head: string,
  meta: ColumnsMeta,
  blobs: SnapshotSource[],
): Promise<SnapshotContent> {
  const usage = state.usage.serialize();
  // All of it, expired entries too, with the keys' order: restored, it is the table the log made.
  const { scopes, bindings } = state.idempotency.capture();
  const owners = state.idempotency.ownerOrder();
  const json = new SteppedJson();
  json.write(`${head.slice(0, -1)},"idempotency":[`);
  for (let i = 0; i < bindings.length; i++) {
    json.write(
      `${i === 0 ? '' : ','}[${JSON.stringify(scopes[i])},${JSON.stringify(bindings[i])}]`,
    );
    await json.pause();
  }
  json.write(`],"idempotencyOwners":${JSON.stringify(owners)},`);
  json.write(`"usage":${JSON.stringify(usage.meta)},"finishedBlobs":${blobs.length},"finished":{`);
  const { answers, attempts, ...small } = meta;
  json.write(`${JSON.stringify(small).slice(1, -1)},`);
  await json.object('answers', answers);
  json.write(',');
  await json.object('attempts', attempts ?? {});
  json.write('}}');
  return { json: json.finish(), blobs: [...blobs, ...usage.blobs] };
}

/** Restores `raw` (the parsed JSON) and `blobs` (the record columns' bytes beside it). */
export function restoreState(
  state: GatewayState,
  raw: unknown,
  _nowMs: number,
  blobs: readonly Uint8Array[],
): void {
  const snapshot = raw as SnapshotV2;
  if (snapshot?.version !== 2 && snapshot?.version !== 3) {
    throw new WalCorruptionError(`snapshot state version ${String(snapshot?.version)} is unknown`);
  }
  for (const account of snapshot.keys) {
    state.keys.set(account.id, account);
    state.keysBySecret.set(account.secretSha256, account);
  }
  for (const record of snapshot.inFlight) state.inFlight.set(record.id, record);
  const finishedBlobs = snapshot.finishedBlobs ?? blobs.length;
  state.finished.restoreColumns(snapshot.finished, blobs.slice(0, finishedBlobs));
  if (snapshot.usage !== undefined) state.usage.restore(snapshot.usage, blobs.slice(finishedBlobs));
  // Oldest first (as written), so the per-key order of eviction survives the restart.
  for (const [scope, binding] of snapshot.idempotency) state.idempotency.restore(scope, binding);
  if ('idempotencyOwners' in snapshot && Array.isArray(snapshot.idempotencyOwners))
    state.idempotency.restoreOwnerOrder(snapshot.idempotencyOwners);
}
