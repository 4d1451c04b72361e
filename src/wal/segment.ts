// The log's segment files: the one appends go to, its roll to the next, the fsync policy that makes
// their bytes durable, and the failure that stops every write for good.
import {
  closeSync,
  fstatSync,
  fsync,
  fsyncSync,
  ftruncateSync,
  openSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../util/log.ts';
import { WalUnavailableError } from './errors.ts';
import { FdReserve } from './fd-reserve.ts';

export type FsyncPolicy = 'always' | 'interval' | 'off';

export interface WalOptions {
  dir: string;
  fsync: FsyncPolicy;
  fsyncIntervalMs: number;
  segmentBytes: number;
  logger: Logger;
  /**
   * How many commits are expected soon (the requests in flight): with `always`, an fsync waits a
   * turn for them when there are more than its own waiters. Absent: never waits.
   */
  expectedCommits?: () => number;
  /**
   * The error appenders get when the log fails (the owner's own, e.g. a 503); default
   * WalUnavailableError.
   */
  unavailable?: (message: string) => Error;
  /**
   * Called once, when a write or fsync fails and the log stops taking records (the owner goes
   * down).
   */
  onFailure?: (error: Error) => void;
}

export function segmentName(index: number): string {
  return `segment-${String(index).padStart(12, '0')}.wal`;
}

export function fsyncAsync(fd: number): Promise<void> {
  return new Promise((resolve, reject) =>
    fsync(fd, (error) => (error ? reject(error) : resolve())),
  );
}

export class SegmentFiles {
  /** The segment appends go to (-1 before it is open and after close), its index and its size. */
  private fd = -1;
  private segmentIndex = 0;
  private segmentSizeBytes = 0;
  /**
   * The segment files on disk by index, with the highest seq written to each (0: none yet): a
   * snapshot removes the ones it fully covers.
   */
  readonly segments = new Map<number, number>();
  /** Written since the last interval fsync. */
  private dirty = false;
  private intervalTimer: ReturnType<typeof setInterval> | null = null;
  /** The interval fsync in flight, if any; segment fds it may be using are closed only after it. */
  private syncing: Promise<void> | null = null;
  private readonly fdsToCloseAfterSync: number[] = [];
  private failureError: Error | null = null;
  private closedFlag = false;
  /** Spare descriptors for the log's own opens (segments, snapshots): see FdReserve. */
  readonly reserve = new FdReserve();
  /** The log directory, open for the log's life: its fsyncs need no descriptor of their own. */
  readonly dirFd: number;

  constructor(private readonly options: WalOptions) {
    this.dirFd = openSync(options.dir, 'r');
  }

  get failure(): Error | null {
    return this.failureError;
  }

  get closed(): boolean {
    return this.closedFlag;
  }

  /** The index of the segment appends go to. */
  get index(): number {
    return this.segmentIndex;
  }

  /** The current segment has reached its size: the next moment between batches rolls it. */
  get full(): boolean {
    return this.segmentSizeBytes >= this.options.segmentBytes;
  }

  /** Where the next batch starts: a failed one is cut back to here. */
  get writePosition(): { fd: number; offset: number } {
    return { fd: this.fd, offset: this.segmentSizeBytes };
  }

  /** Takes over the segments replay found and opens the last for appends (the first, if none). */
  openAfterReplay(segments: Map<number, number>): void {
    for (const [index, lastSeq] of segments) this.segments.set(index, lastSeq);
    // Replay found them in ascending order: the last is the newest.
    this.openSegment([...segments.keys()].at(-1) ?? 1);
  }

  private openSegment(index: number): void {
    const path = join(this.options.dir, segmentName(index));
    this.fd = this.reserve.openSync(path, 'a', 0o600);
    if (!this.segments.has(index)) this.segments.set(index, 0);
    this.segmentIndex = index;
    this.segmentSizeBytes = fstatSync(this.fd).size;
    // The new file's directory entry must be durable too, or an fsynced record could vanish with
    // it.
    fsyncSync(this.dirFd);
  }

  /** Writes a framed batch whose last record is `lastSeq` to the current segment, all of it. */
  write(batch: Buffer, lastSeq: number): void {
    let written = 0;
    while (written < batch.length)
      written += writeSync(this.fd, batch, written, batch.length - written);
    this.segmentSizeBytes += batch.length;
    this.segments.set(this.segmentIndex, lastSeq);
  }

  /**
   * After a batch is written, the fsync policy: under `always` the fsync its appenders wait for;
   * otherwise null, and the interval timer (or, under `off`, the OS) makes it durable.
   */
  syncBatch(): Promise<void> | null {
    if (this.options.fsync === 'always') return fsyncAsync(this.fd);
    this.dirty = true;
    return null;
  }

  /**
   * Cuts a batch whose write or fsync failed back off its segment. Its appenders are told it failed
   * (a 503), so none of its records may count after a restart: a partial write (disk full) can
   * leave whole frames of it on disk, which replay would otherwise apply, charging requests
   * answered 503. Best effort: when even this fails, the log says so.
   */
  eraseFailedBatch(fd: number, offset: number): void {
    try {
      ftruncateSync(fd, offset);
      fsyncSync(fd);
      this.segmentSizeBytes = offset;
    } catch (error) {
      this.options.logger.fatal(
        { err: (error as Error).message, offset },
        'wal: could not cut the failed batch off its segment',
      );
    }
  }

  /** Closes the current segment for the next one; call only between batches. */
  roll(): void {
    try {
      if (this.options.fsync !== 'off') fsyncSync(this.fd);
      // An interval fsync may still be running on this fd; closing it under that fsync would fail
      // it (EBADF) and with it the whole log.
      const old = this.fd;
      this.openSegment(this.segmentIndex + 1);
      if (this.syncing) this.fdsToCloseAfterSync.push(old);
      else closeSync(old);
      this.reserve.refill();
    } catch (error) {
      this.fail(error as Error);
    }
  }

  startIntervalSync(): void {
    this.intervalTimer = setInterval(() => void this.syncInterval(), this.options.fsyncIntervalMs);
    this.intervalTimer.unref?.();
  }

  private async syncInterval(): Promise<void> {
    if (!this.dirty || this.syncing || this.failureError || this.closedFlag || this.fd < 0) return;
    this.dirty = false;
    this.syncing = fsyncAsync(this.fd)
      .catch((error: Error) => this.fail(error))
      .finally(() => {
        this.syncing = null;
        for (const fd of this.fdsToCloseAfterSync.splice(0)) closeSync(fd);
        this.reserve.refill();
      });
    await this.syncing;
  }

  fail(error: Error): void {
    if (this.failureError) return;
    this.failureError = error;
    this.options.logger.fatal(
      { err: error.message },
      'wal: write or fsync failed; refusing all further writes',
    );
    this.options.onFailure?.(error);
  }

  /** The error the appenders of a failed batch get (the owner's, when it gave a mapping). */
  unavailableError(cause: Error): Error {
    const message = `write-ahead log unavailable: ${cause.message}`;
    return this.options.unavailable
      ? this.options.unavailable(message)
      : new WalUnavailableError(message);
  }

  assertWritable(): void {
    if (this.failureError) throw this.unavailableError(this.failureError);
  }

  /** Takes no more writes or interval fsyncs; returns the interval fsync still running, if any. */
  stop(): Promise<void> | null {
    this.closedFlag = true;
    if (this.intervalTimer) clearInterval(this.intervalTimer);
    return this.syncing;
  }

  /** The last fsync (unless the log failed or the policy is `off`), then every descriptor goes. */
  close(): void {
    try {
      if (this.fd >= 0 && !this.failureError && this.options.fsync !== 'off') fsyncSync(this.fd);
    } finally {
      this.releaseDescriptors();
    }
  }

  releaseDescriptors(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
    closeSync(this.dirFd);
    this.reserve.close();
  }
}
