// The only path that changes durable state: check events, apply them in order, append them to the log.
import { GatewayError } from '../http/errors.ts';
import { assert } from '../util/assert.ts';
import type { Logger } from '../util/log.ts';
import { WalUnavailableError, WriteAheadLog, type FsyncPolicy } from '../wal/log.ts';
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
}

export class StateStore {
  readonly state: GatewayState;
  private readonly wal: WriteAheadLog;
  private snapshotting: Promise<void> | null = null;

  private constructor(state: GatewayState, wal: WriteAheadLog, private readonly options: StoreOptions) {
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
      },
      {
        loadSnapshot: (raw) => restoreState(state, raw, Date.now()),
        applyRecord: (_seq, payload) => {
          assert(Array.isArray(payload), 'a WAL record is an array of events');
          for (const event of payload) state.apply(checkEvent(event));
          records++;
        },
      },
    );
    options.logger.info({ records, seq: wal.lastSeq, keys: state.keys.size, inFlight: state.inFlight.size }, 'state: replayed');
    return new StateStore(state, wal, options);
  }

  /** Why writes are refused, or null when the log is healthy. */
  get unavailableReason(): string | null {
    return this.wal.failure ? `write-ahead log failed: ${this.wal.failure.message}` : null;
  }

  /**
   * Applies `events` at once (so the next command sees them) and returns when they are durable.
   * Callers check and commit without an `await` in between; that is what makes check-then-act atomic.
   */
  commit(events: Event[]): Promise<void> {
    if (this.wal.failure) throw this.unavailable();
    for (const event of events) checkEvent(event);
    for (const event of events) this.state.apply(event);
    let durable: Promise<void>;
    try {
      durable = this.wal.append(events);
    } catch (error) {
      throw error instanceof WalUnavailableError ? this.unavailable() : error;
    }
    this.maybeSnapshot();
    return durable.catch((error) => {
      throw error instanceof WalUnavailableError ? this.unavailable() : error;
    });
  }

  private unavailable(): GatewayError {
    return new GatewayError('service_unavailable', 'The gateway cannot record state right now (its write-ahead log failed); retry later.');
  }

  private maybeSnapshot(): void {
    if (this.snapshotting || this.wal.recordsSinceSnapshotCount < this.options.snapshotEveryRecords) return;
    this.snapshotting = this.snapshot().finally(() => (this.snapshotting = null));
  }

  /** Writes a snapshot of the current state and drops the log segments it covers. */
  async snapshot(): Promise<void> {
    const seq = this.wal.lastSeq;
    const json = serializeState(this.state);
    try {
      await this.wal.snapshot(json, seq);
    } catch (error) {
      this.options.logger.error({ err: (error as Error).message }, 'state: snapshot failed');
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
