// The log's segment files: the one appends go to, its roll to the next, the fsync policy that makes
// their bytes durable, and the failure that stops every write for good.
import {
  closeSync,
  constants,
  existsSync,
  fdatasync,
  fstatSync,
  fsync,
  fsyncSync,
  ftruncateSync,
  lstatSync,
  openSync,
  renameSync,
  rmSync,
  statSync,
  write,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../util/log.ts';
import { ignore } from '../util/promise.ts';
import { WalUnavailableError } from './errors.ts';
import { FdReserve } from './fd-reserve.ts';
import { SEGMENT_HEADER, SEGMENT_HEADER_BYTES } from './frame.ts';

export type FsyncPolicy = 'always' | 'interval' | 'off';

export interface WalOptions {
  dir: string;
  fsync: FsyncPolicy;
  fsyncIntervalMs: number;
  segmentBytes: number;
  logger: Logger;
  /**
   * How many commits are expected soon (the requests in flight that commit as their provider
   * answers): with `always`, an fsync waits a turn for them when there are more than its own
   * waiters. Absent: never waits.
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

/** Opens, fsyncs and closes the file at `path` (once, at start). */
function syncFile(path: string): void {
  const fd = openSync(path, 'r');
  try {
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

/** Cuts the file at `path` back to `sizeBytes`, durably (replay's torn tails; zeros at start). */
export function truncateDurably(path: string, sizeBytes: number): void {
  const fd = openSync(path, 'r+');
  try {
    ftruncateSync(fd, sizeBytes);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

function fdatasyncAsync(fd: number): Promise<void> {
  return new Promise((resolve, reject) =>
    fdatasync(fd, (error) => (error ? reject(error) : resolve())),
  );
}

function writeAsync(fd: number, bytes: Uint8Array, length: number, position: number) {
  return new Promise<number>((resolve, reject) =>
    write(fd, bytes, 0, length, position, (error, count) =>
      error ? reject(error) : resolve(count),
    ),
  );
}

/**
 * Writes a prepared segment to `path`: the segment header, then zeros up to `sizeBytes`, synced,
 * off the event loop. The header is part of it, synced before the file is renamed in, so a power
 * cut can never take it from a segment that holds records: replay tells a log's own segments from
 * an older gateway's by it. A sync every ZEROS_SYNC_BYTES, so that the disk is never busy with
 * more zeros at once than a batch fsync can wait behind unnoticed (one sync of 16 MiB at the end
 * doubled the commit p99). A file that could not be made whole is removed: it holds disk space.
 */
async function writePreparedSegment(
  path: string,
  sizeBytes: number,
  reserve: FdReserve,
): Promise<void> {
  zeros ??= new Uint8Array(ZEROS_BYTES);
  const bytes = zeros;
  const fd = reserve.openSync(path, 'w', 0o600);
  try {
    let written = 0;
    while (written < SEGMENT_HEADER_BYTES)
      written += await writeAsync(
        fd,
        SEGMENT_HEADER.subarray(written),
        SEGMENT_HEADER_BYTES - written,
        written,
      );
    let unsynced = written;
    while (written < sizeBytes) {
      const count = await writeAsync(
        fd,
        bytes,
        Math.min(bytes.length, sizeBytes - written),
        written,
      );
      written += count;
      unsynced += count;
      if (unsynced >= ZEROS_SYNC_BYTES) {
        await fdatasyncAsync(fd);
        unsynced = 0;
      }
    }
    if (unsynced > 0) await fdatasyncAsync(fd);
  } catch (error) {
    try {
      rmSync(path, { force: true });
    } catch {
      // The next preparation overwrites it; the error that matters is the one above.
    }
    throw error;
  } finally {
    closeSync(fd);
    reserve.refill();
  }
}

/** Waits for both; then fails with the first's error, if any (neither is left running). */
async function bothSettled(a: Promise<void>, b: Promise<void>): Promise<void> {
  const [first, second] = await Promise.allSettled([a, b]);
  if (first.status === 'rejected') throw first.reason;
  if (second.status === 'rejected') throw second.reason;
}

/**
 * Under fsync `always` the next segment is prepared ahead: a file of zeros, written and synced off
 * the event loop, renamed in at the roll. A batch written into such space changes no size or
 * extent, so its fdatasync commits no journal: ~30 µs less CPU and ~75 µs less wait per fsync on
 * ext4 than an append's (bench/README, issue 15). PostgreSQL prepares its WAL segments for the same
 * reason. A separate file, not zeros written ahead in the segment being synced: a batch's fdatasync
 * waits for every dirty page of its file, zeros included (that version's commit p99 at 32
 * appenders was 0.5–0.9 ms against 0.45).
 */
export const PREPARED_SEGMENT_NAME = 'segment-next.zeros';
/**
 * The first prepared segment's size; each next one is twice the last, up to the segment size. A
 * log that writes little (a test, a quiet gateway) zero-fills little.
 */
const PREPARED_BYTES_FIRST = 1024 * 1024;
/** Smaller segments are not worth preparing. */
const PREPARED_BYTES_MIN = 64 * 1024;
/** The zeros are written from this buffer, one piece at a time, and synced every so many. */
const ZEROS_BYTES = 256 * 1024;
const ZEROS_SYNC_BYTES = 1024 * 1024;
let zeros: Uint8Array | null = null;

/** Where replay found the data of the last segment to end, and whether it holds batches. */
export interface SegmentTail {
  index: number;
  /** Bytes of data (header and whole batches); zeros may follow. */
  endBytes: number;
  /** False for a segment of bare frames, written before batches: appends go to a new segment. */
  batched: boolean;
}

export class SegmentFiles {
  /**
   * The segment appends go to (-1 before it is open and after close), its index and the end of its
   * data, where the next batch goes.
   */
  private fd = -1;
  private segmentIndex = 0;
  private segmentSizeBytes = 0;
  /** Where the segment's synced zeros end (its size when opened): a batch past it grows it. */
  private readyEndBytes = 0;
  /** The size of the last batch written: when the next would not fit the zeros, roll first. */
  private lastBatchBytes = 0;
  /** The directory fsync after a roll, awaited with the next batch's (see openSegment). */
  private dirSync: Promise<void> | null = null;
  /** The next segment being prepared, if it is; the size of the one ready (0: none). */
  private preparing: Promise<void> | null = null;
  private preparedBytes = 0;
  private nextPreparedBytes = PREPARED_BYTES_FIRST;
  /**
   * The segment files on disk by index, with the highest seq written to each (0: none yet): a
   * snapshot removes the ones it fully covers.
   */
  readonly segments = new Map<number, number>();
  /** Written since the last interval fsync. */
  private dirty = false;
  private intervalTimer: ReturnType<typeof setInterval> | null = null;
  /** The interval fsync in flight, if any. */
  private syncing: Promise<void> | null = null;
  /** Segment fds the interval fsync may still be using: closed after it (EBADF would fail it). */
  private readonly fdsToCloseLater: number[] = [];
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

  /** Where the next batch starts: a failed one is cut back to here. */
  get writePosition(): { fd: number; offset: number } {
    return { fd: this.fd, offset: this.segmentSizeBytes };
  }

  /**
   * Takes over the segments replay found and opens the last for appends where its data ends; after
   * a segment of bare frames (an older gateway's), or none, appends start a new one.
   */
  openAfterReplay(segments: Map<number, number>, tail: SegmentTail | null): void {
    for (const [index, lastSeq] of segments) this.segments.set(index, lastSeq);
    // A prepared segment a crash left may be half written: made again.
    rmSync(join(this.options.dir, PREPARED_SEGMENT_NAME), { force: true });
    // What a killed process wrote but never synced is in the page cache, and replay applied it:
    // synced now, before any record that depends on it is acknowledged. Else a power cut could
    // keep later records and lose these; and in zero-filled space the one batch this process has
    // unsynced would no longer be the only one. Every segment, not only the last: under `off` a
    // roll syncs nothing. (Empty ones hold nothing to sync.)
    for (const index of segments.keys()) {
      const path = join(this.options.dir, segmentName(index));
      if (statSync(path).size > 0) syncFile(path);
    }
    // Under `interval` and `off` many batches are unsynced at once, and in zero-filled space their
    // pages could reach the disk in any order: the zeros an `always` run prepared are cut off.
    if (tail?.batched && this.options.fsync !== 'always') {
      const path = join(this.options.dir, segmentName(tail.index));
      if (statSync(path).size > tail.endBytes) truncateDurably(path, tail.endBytes);
    }
    if (tail === null) this.openSegment(1, 0, 'now');
    else if (tail.batched) this.openSegment(tail.index, tail.endBytes, 'now');
    else this.openSegment(tail.index + 1, 0, 'now');
    this.prepareNext();
  }

  /**
   * Opens segment `index` for writes at `endBytes`, the end of its data (0 for a new one). Its
   * directory entry must be durable before a record in it is acknowledged, or a synced record could
   * vanish with it: fsynced here, or, at a roll under `always`, off the loop beside the next
   * batch's fsync (`dirSync`), so that a roll does not hold the event loop for a journal commit.
   */
  private openSegment(index: number, endBytes: number, syncDir: 'now' | 'with-next-batch'): void {
    const path = join(this.options.dir, segmentName(index));
    // Read-write without O_APPEND: writes go at the end of the data, which may be followed by
    // zeros, and O_APPEND would ignore the position.
    const fd = this.reserve.openSync(path, constants.O_RDWR | constants.O_CREAT, 0o600);
    const sizeBytes = fstatSync(fd).size;
    this.fd = fd;
    if (!this.segments.has(index)) this.segments.set(index, 0);
    this.segmentIndex = index;
    this.segmentSizeBytes = endBytes;
    // Replay read everything after the data as zeros (or cut it off); a prepared file is zeros.
    this.readyEndBytes = Math.max(sizeBytes, endBytes);
    this.lastBatchBytes = 0;
    if (syncDir === 'now') {
      fsyncSync(this.dirFd);
    } else {
      const synced = fsyncAsync(this.dirFd);
      // Two rolls with no batch between them: the next batch waits for both.
      const dirSync = this.dirSync === null ? synced : bothSettled(this.dirSync, synced);
      // Awaited with the next batch's fsync (which fails the log if this did); handled here so that
      // a log closed before any batch does not leave a rejection unhandled.
      dirSync.catch(ignore);
      this.dirSync = dirSync;
    }
  }

  /** Where the next batch starts: a new segment's first batch carries the segment header. */
  get atSegmentStart(): boolean {
    return this.segmentSizeBytes === 0;
  }

  /** Writes a framed batch whose last record is `lastSeq` to the current segment, all of it. */
  write(batch: Buffer, lastSeq: number): void {
    const position = this.segmentSizeBytes;
    let written = 0;
    while (written < batch.length)
      written += writeSync(this.fd, batch, written, batch.length - written, position + written);
    this.segmentSizeBytes += batch.length;
    this.lastBatchBytes = batch.length;
    this.segments.set(this.segmentIndex, lastSeq);
  }

  /**
   * Prepares the next segment off the event loop, under `always`, unless one is ready or on its
   * way. Never fails the log: without a prepared segment the next is a new file that batches grow,
   * and their own fsyncs make them durable all the same.
   */
  private prepareNext(): void {
    if (this.options.fsync !== 'always' || this.preparing !== null || this.preparedBytes > 0)
      return;
    if (this.failureError !== null || this.closedFlag) return;
    const sizeBytes = Math.min(this.nextPreparedBytes, this.options.segmentBytes);
    if (sizeBytes < PREPARED_BYTES_MIN) return;
    const path = join(this.options.dir, PREPARED_SEGMENT_NAME);
    this.preparing = writePreparedSegment(path, sizeBytes, this.reserve)
      .then(
        () => {
          this.preparedBytes = sizeBytes;
          this.nextPreparedBytes = Math.min(sizeBytes * 2, this.options.segmentBytes);
        },
        (error: Error) =>
          this.options.logger.warn(
            { err: error.message },
            'wal: could not prepare the next segment; it will be a new file',
          ),
      )
      .finally(() => {
        this.preparing = null;
      });
  }

  /**
   * After a batch is written, the fsync policy: under `always` the fsync its appenders wait for;
   * otherwise null, and the interval timer (or, under `off`, the OS) makes it durable.
   */
  syncBatch(): Promise<void> | null {
    // fdatasync: what a batch needs durable is its bytes and, when it grew the file, the size;
    // fdatasync syncs both and skips the times, and in zero-filled space it commits no journal.
    if (this.options.fsync === 'always') {
      const dirSync = this.dirSync;
      if (dirSync === null) return fdatasyncAsync(this.fd);
      this.dirSync = null;
      // Both settle before the batch does: a failure closes the fds, never under a sync.
      return bothSettled(fdatasyncAsync(this.fd), dirSync);
    }
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

  /**
   * The segment should be closed for the next one, between two batches: it has reached its size,
   * or a prepared one is ready and the next batch (as large as the last, say) would not fit the
   * zeros of this one (a new file has none).
   */
  get full(): boolean {
    return (
      this.segmentSizeBytes >= this.options.segmentBytes ||
      (this.preparedBytes > 0 &&
        this.segmentSizeBytes + Math.max(this.lastBatchBytes, 1) > this.readyEndBytes)
    );
  }

  /** Closes the current segment for the next one; call only between batches. */
  roll(): void {
    // A failed log writes nothing more, and the segment with the failed batch stays the last: a
    // torn tail is cut off only there.
    if (this.failureError !== null) return;
    try {
      // Under `always` every batch in it was fsynced before it was acknowledged, and a roll comes
      // only between batches.
      if (this.options.fsync === 'interval') fsyncSync(this.fd);
      // An interval fsync may still be running on this fd; closing it under that fsync would fail
      // it (EBADF) and with it the whole log.
      // (After a roll that failed, there is no current fd.)
      if (this.fd >= 0) this.fdsToCloseLater.push(this.fd);
      this.fd = -1;
      const next = this.segmentIndex + 1;
      const nextPath = join(this.options.dir, segmentName(next));
      let endBytes = 0;
      if (existsSync(nextPath)) {
        // Not ours (replay found the segments, and the next was past them): opened as it is, and
        // never replaced by a rename.
        if (lstatSync(nextPath).isFile() && statSync(nextPath).size > 0)
          throw new Error(`${nextPath} exists and is not empty: not a segment this log made`);
      } else if (this.preparedBytes > 0) {
        this.preparedBytes = 0;
        // The directory fsync (openSegment) makes the rename durable before a record in the new
        // segment is acknowledged. Its header is written: appends start after it.
        if (this.renamePrepared(nextPath)) endBytes = SEGMENT_HEADER_BYTES;
      }
      const syncDir = this.options.fsync === 'always' ? 'with-next-batch' : 'now';
      this.openSegment(next, endBytes, syncDir);
      this.prepareNext();
      this.closeLaterFds();
    } catch (error) {
      this.fail(error as Error);
    }
  }

  /** Renames the prepared segment to `path`; false (a new file then) when it cannot. */
  private renamePrepared(path: string): boolean {
    try {
      renameSync(join(this.options.dir, PREPARED_SEGMENT_NAME), path);
      return true;
    } catch (error) {
      this.options.logger.warn(
        { err: (error as Error).message },
        'wal: the prepared segment could not be renamed in; the next is a new file',
      );
      return false;
    }
  }

  /** Closes the old segments' fds once no interval fsync can be using them. */
  private closeLaterFds(): void {
    if (this.syncing !== null || this.fdsToCloseLater.length === 0) return;
    try {
      for (const fd of this.fdsToCloseLater.splice(0)) closeSync(fd);
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
        this.closeLaterFds();
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

  /**
   * Takes no more writes, interval fsyncs or preparations; returns what is still running (neither
   * rejects), if anything.
   */
  stop(): Promise<unknown> | null {
    this.closedFlag = true;
    if (this.intervalTimer) clearInterval(this.intervalTimer);
    if (this.syncing === null && this.preparing === null && this.dirSync === null) return null;
    return Promise.all([this.syncing, this.preparing, this.dirSync?.catch(ignore)]);
  }

  /** Resolves once no next segment is being prepared (tests and benchmarks wait for one). */
  async prepared(): Promise<void> {
    await this.preparing;
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
    for (const fd of this.fdsToCloseLater.splice(0)) closeSync(fd);
    closeSync(this.dirFd);
    this.reserve.close();
  }
}
