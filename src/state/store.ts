// The only path that changes durable state: check events, apply them in order, append them to the
// log.

import { assert } from '../util/assert.ts';
import { GatewayError } from '../util/errors.ts';
import { IdMap } from '../util/id-map.ts';
import type { Logger } from '../util/log.ts';
import { ignore } from '../util/promise.ts';
import { type FsyncPolicy, WriteAheadLog } from '../wal/log.ts';
import { GatewayState, type StateLimits } from './apply.ts';
import { checkEvent, type Event } from './events.ts';
import { restoreState, serializeState } from './snapshot.ts';

export interface StoreOptions {
  dataDir: string;
  fsync: FsyncPolicy;
  fsyncIntervalMs: number;
  segmentBytes: number;
  snapshotEveryRecords: number;
  limits: StateLimits;
  logger: Logger;
  /**
   * Commits expected soon (the requests in flight that will commit as their provider answers):
   * lets an fsync wait for them (see WalOptions).
   */
  expectedCommits?: () => number;
  /**
   * Called once when the log fails: nothing can be made durable any more (§8: the process goes
   * down).
   */
  onFailure?: (error: Error) => void;
}

export function unavailableError(): GatewayError {
  return new GatewayError(
    'service_unavailable',
    'The gateway cannot record state right now (its write-ahead log failed); retry later.',
  );
}

export class StateStore {
  readonly state: GatewayState;
  private readonly wal: WriteAheadLog;
  private snapshotting: Promise<void> | null = null;
  /**
   * Starts applied in memory but not yet logged, by request id. A request nobody outside can name
   * yet (a non-stream call without an Idempotency-Key: its id is first sent with its answer) needs
   * no durable start: its start is logged together with its finish, in one record and one fsync. A
   * crash before that loses nothing anyone was told, and the hold vanishes with the memory that
   * held it. (An IdMap, not a Map: the events must not outlive their request, util/id-map.ts.)
   */
  private readonly unlogged = new IdMap<Event[]>();

  private constructor(
    state: GatewayState,
    wal: WriteAheadLog,
    private readonly options: StoreOptions,
  ) {
    this.state = state;
    this.wal = wal;
  }

  /** Opens the log under `dataDir/wal` and rebuilds the state from its snapshot and records. */
  static open(options: StoreOptions): StateStore {
    const state = new GatewayState(options.limits);
    let records = 0;
    const wal = WriteAheadLog.open(
      {
        dir: `${options.dataDir}/wal`,
        fsync: options.fsync,
        fsyncIntervalMs: options.fsyncIntervalMs,
        segmentBytes: options.segmentBytes,
        logger: options.logger,
        ...(options.expectedCommits ? { expectedCommits: options.expectedCommits } : {}),
        ...(options.onFailure ? { onFailure: options.onFailure } : {}),
        unavailable: unavailableError,
      },
      {
        loadSnapshot: (raw, _seq, blobs) => restoreState(state, raw, Date.now(), blobs),
        applyRecord: (_seq, payload) => {
          assert(Array.isArray(payload), 'a WAL record is an array of events');
          for (const event of payload) state.apply(checkEvent(event));
          records++;
        },
      },
    );
    options.logger.info(
      { records, seq: wal.lastSeq, keys: state.keys.size, inFlight: state.inFlight.size },
      'state: replayed',
    );
    return new StateStore(state, wal, options);
  }

  /** Why writes are refused, or null when the log is healthy. */
  get unavailableReason(): string | null {
    return this.wal.failure ? `write-ahead log failed: ${this.wal.failure.message}` : null;
  }

  /**
   * 503 once the log has failed, for reads too: memory may then hold what the log never will (a
   * top-up or a finish whose write failed), and nothing may be reported that a restart would take
   * back.
   */
  checkAvailable(): void {
    if (this.wal.failure) throw unavailableError();
  }

  /**
   * Applies `events` at once (so the next command sees them) and returns when they are durable.
   * Callers check and commit without an `await` in between; that is what makes check-then-act
   * atomic.
   */
  commit(events: Event[]): Promise<void> {
    if (this.wal.failure) throw unavailableError();
    for (const event of events) checkEvent(event);
    for (const event of events) this.state.apply(event);
    let record = events;
    if (this.unlogged.size > 0) {
      for (const event of events) {
        if (event.type !== 'request.finished') continue;
        const start = this.unlogged.get(event.request_id);
        if (!start) continue;
        this.unlogged.delete(event.request_id);
        // The start's array is the store's own (see applyUnlogged): it takes the record's events
        // after its own, rather than both being copied into a third per request.
        for (const later of record) start.push(later);
        record = start;
      }
    }
    // A failed log throws or rejects with the store's own 503 (the `unavailable` option), so no
    // wrapper here.
    const durable = this.wal.append(record);
    this.maybeSnapshot();
    return durable;
  }

  /**
   * Applies the start of `requestId` now and logs it with the request's finish (see `unlogged`).
   * Same checks as `commit`; the caller must commit the request's `request.finished` later.
   * `events` is the store's from here on (the finish's record is appended to it): a caller keeps no
   * reference to it.
   */
  applyUnlogged(requestId: string, events: Event[]): void {
    if (this.wal.failure) throw unavailableError();
    for (const event of events) checkEvent(event);
    for (const event of events) this.state.apply(event);
    this.unlogged.set(requestId, events);
  }

  /**
   * Logs every start still waiting for its finish (before a snapshot, which must match the log).
   */
  private logUnlogged(): void {
    if (this.unlogged.size === 0) return;
    const record = this.unlogged.values().flat();
    this.unlogged.clear();
    this.wal.append(record).catch(ignore);
  }

  private maybeSnapshot(): void {
    if (this.snapshotting || this.wal.recordsSinceSnapshotCount < this.options.snapshotEveryRecords)
      return;
    this.snapshotting = this.snapshot().finally(() => (this.snapshotting = null));
  }

  /** Writes a snapshot of the current state and drops the log segments it covers. */
  async snapshot(): Promise<void> {
    // The snapshot holds every in-flight request, so every start it holds must be in the log by
    // `seq`.
    this.logUnlogged();
    const seq = this.wal.lastSeq;
    // Captured now, at `seq`; serialized in steps while the log goes on.
    const serializing = serializeState(this.state);
    try {
      await this.wal.snapshot(await serializing, seq);
    } catch (error) {
      // Tried again after as many records as the policy leaves between snapshots, not at every
      // commit: each attempt serializes the whole state on the event loop and rolls a segment.
      this.wal.deferSnapshot();
      this.options.logger.error(
        { err: (error as Error).message },
        'state: snapshot failed; the next one after snapshot_every_records more records',
      );
    }
  }

  flush(): Promise<void> {
    return this.wal.flush();
  }

  async close(): Promise<void> {
    if (this.snapshotting) await this.snapshotting;
    await this.wal.close();
  }
}
