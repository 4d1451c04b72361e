// The only path that changes durable state: check events, apply them in order, append them to the
// log.

import { assert } from '../util/assert.ts';
import { GatewayError } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
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
   * atomic. With `deferMs`, the events wait for the next write, `deferMs` at the most
   * (GroupCommit.append): for a commit nobody waits on yet.
   */
  commit(events: Event[], deferMs = 0): Promise<void> {
    if (this.wal.failure) throw unavailableError();
    for (const event of events) checkEvent(event);
    for (const event of events) this.state.apply(event);
    // A failed log throws or rejects with the store's own 503 (the `unavailable` option), so no
    // wrapper here.
    const durable = this.wal.append(events, deferMs);
    this.maybeSnapshot();
    return durable;
  }

  private maybeSnapshot(): void {
    if (this.snapshotting || this.wal.recordsSinceSnapshotCount < this.options.snapshotEveryRecords)
      return;
    this.snapshotting = this.snapshot().finally(() => (this.snapshotting = null));
  }

  /** Writes a snapshot of the current state and drops the log segments it covers. */
  async snapshot(): Promise<void> {
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

  /**
   * Resolves when everything committed so far is durable: the batch holding the last record, not
   * the log going idle (under steady load it never does).
   */
  durableSoFar(): Promise<void> {
    return this.wal.flushThrough(this.wal.lastSeq);
  }

  async close(): Promise<void> {
    if (this.snapshotting) await this.snapshotting;
    await this.wal.close();
  }
}
