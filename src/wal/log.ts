// The write-ahead log: numbered segment files of checksummed frames, group commit, fsync policy,
// snapshots.
import {
  closeSync,
  fstatSync,
  fsync,
  fsyncSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  write,
  writeSync,
} from 'node:fs';
import { rename, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { assert } from '../util/assert.ts';
import type { Logger } from '../util/log.ts';
import { ignore } from '../util/promise.ts';
import { FdReserve } from './fd-reserve.ts';
import { decodeFrame, FRAME_HEADER_BYTES, textFrameBytesMax, writeTextFrame } from './frame.ts';

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

export interface ReplayHandlers {
  /**
   * Called once, before any record, when a snapshot exists; `blobs` are its bytes beside the JSON
   * (format 2).
   */
  loadSnapshot(state: unknown, seq: number, blobs: Uint8Array[] | null): void;
  /** Called for each record after the snapshot, in sequence order. */
  applyRecord(seq: number, payload: unknown): void;
}

/**
 * The log on disk is damaged in a way a crash cannot explain; starting would lose acknowledged
 * facts.
 */
export class WalCorruptionError extends Error {
  override name = 'WalCorruptionError';
}

/** The log cannot be written (a failed write or fsync); nothing may be acknowledged after it. */
export class WalUnavailableError extends Error {
  override name = 'WalUnavailableError';
}

const SEGMENT_RE = /^segment-(\d{12})\.wal$/;
/**
 * Commit delay (fsync always): how many other commits must be expected, and how long they are
 * waited for.
 */
const COMMIT_SIBLINGS_MIN = 2;
const COMMIT_DELAY_TURNS_MAX = 2;
const COMMIT_DELAY_MS_MAX = 1;
/**
 * The write buffer every batch is framed into; a larger batch gets a buffer of its own, not kept.
 */
const WRITE_BUFFER_BYTES_KEPT = 1024 * 1024;
const SNAPSHOT_FILE = 'snapshot.json';
const DECODER = new TextDecoder('utf-8', { fatal: true });

function segmentName(index: number): string {
  return `segment-${String(index).padStart(12, '0')}.wal`;
}

function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

function fsyncAsync(fd: number): Promise<void> {
  return new Promise((resolve, reject) =>
    fsync(fd, (error) => (error ? reject(error) : resolve())),
  );
}

function writeAsync(
  fd: number,
  bytes: Uint8Array,
  offset: number,
  length: number,
): Promise<number> {
  return new Promise((resolve, reject) =>
    write(fd, bytes, offset, length, null, (error, written) =>
      error ? reject(error) : resolve(written),
    ),
  );
}

/**
 * A snapshot's content: the state as JSON, and bytes that travel beside it (the record columns).
 */
export interface SnapshotContent {
  json: string;
  blobs: Uint8Array[];
}

/**
 * The CRC-32 of a format 2 header's fields, the seed of the body's: a changed `seq` must not pass.
 */
function snapshotHeaderCrc(seq: number, jsonBytes: number, blobBytes: readonly number[]): number {
  return Bun.hash.crc32(`${seq} ${jsonBytes} ${blobBytes.join(',')}`);
}

/**
 * Reads a snapshot file of either format; a damaged one is a WalCorruptionError (starting would
 * lose facts).
 */
function readSnapshot(
  bytes: Buffer,
  path: string,
): { seq: number; state: unknown; blobs: Uint8Array[] | null } {
  const corrupt = (why: string) => new WalCorruptionError(`${path}: ${why}; refusing to start`);
  const newline = bytes.indexOf(10);
  let header: {
    format?: unknown;
    seq?: unknown;
    json_bytes?: unknown;
    blob_bytes?: unknown;
    crc32?: unknown;
    state?: unknown;
  };
  try {
    // Format 1 is a single JSON object (no line break of its own); format 2 starts with a header
    // line.
    header = JSON.parse(bytes.toString('utf8', 0, newline === -1 ? bytes.length : newline));
  } catch {
    throw corrupt('not valid JSON');
  }
  if (!Number.isSafeInteger(header.seq)) throw corrupt('unknown format');
  const seq = header.seq as number;
  if (header.format === 1) return { seq, state: header.state, blobs: null };
  if (
    header.format !== 2 ||
    !Number.isSafeInteger(header.json_bytes) ||
    !Array.isArray(header.blob_bytes)
  )
    throw corrupt('unknown format');
  const blobBytes = header.blob_bytes as unknown[];
  if (!blobBytes.every((length) => Number.isSafeInteger(length) && (length as number) >= 0))
    throw corrupt('unknown format');
  const bodyStart = newline + 1;
  const total =
    (header.json_bytes as number) +
    (blobBytes as number[]).reduce((sum, length) => sum + length, 0);
  if (bytes.length - bodyStart !== total)
    throw corrupt(`${bytes.length - bodyStart} bytes after the header, expected ${total}`);
  const headerCrc = snapshotHeaderCrc(seq, header.json_bytes as number, blobBytes as number[]);
  if (Bun.hash.crc32(bytes.subarray(bodyStart), headerCrc) !== header.crc32)
    throw corrupt('checksum mismatch');
  let state: unknown;
  const jsonEnd = bodyStart + (header.json_bytes as number);
  try {
    state = JSON.parse(bytes.toString('utf8', bodyStart, jsonEnd));
  } catch {
    throw corrupt('state is not valid JSON');
  }
  const blobs: Uint8Array[] = [];
  let at = jsonEnd;
  for (const length of blobBytes as number[]) {
    blobs.push(bytes.subarray(at, at + length));
    at += length;
  }
  return { seq, state, blobs };
}

export class WriteAheadLog {
  private fd = -1;
  private segmentIndex = 0;
  private segmentSizeBytes = 0;
  private seq = 0;
  /** JSON of the records appended but not yet written, in seq order; framed only when written. */
  private pendingTexts: string[] = [];
  /** The most bytes their frames can take. */
  private pendingBytesMax = 0;
  /**
   * Where a batch is framed before its one write; reused, so a commit allocates no bytes of its
   * own.
   */
  private readonly writeBuffer = Buffer.allocUnsafeSlow(WRITE_BUFFER_BYTES_KEPT);
  /**
   * The promise every record appended since the last write resolves with: one per batch, not per
   * record.
   */
  private pendingBatch: PromiseWithResolvers<void> | null = null;
  /** The batch being written and synced now, and the last seq it holds. */
  private writingBatch: PromiseWithResolvers<void> | null = null;
  private writingLastSeq = 0;
  /**
   * The highest seq as durable as the policy promises (on disk under `always`, written otherwise).
   */
  private durableSeq = 0;
  /** The snapshot being written, if any: the next one starts after it. */
  private snapshotQueue: Promise<void> = Promise.resolve();
  /**
   * A snapshot's request to close the segment between two batches; resolves with the closed index.
   */
  private rollRequest: PromiseWithResolvers<number> | null = null;
  private flushing: Promise<void> | null = null;
  private flushScheduled = false;
  private dirty = false;
  private intervalTimer: ReturnType<typeof setInterval> | null = null;
  private failureError: Error | null = null;
  private closed = false;
  private recordsSinceSnapshot = 0;
  /** Highest seq written to each segment: a snapshot may only remove segments it fully covers. */
  private readonly segmentLastSeq = new Map<number, number>();
  /** The interval fsync in flight, if any; segment fds it may be using are closed only after it. */
  private syncing: Promise<void> | null = null;
  private readonly fdsToCloseAfterSync: number[] = [];
  /** Spare descriptors for the log's own opens (segments, snapshots): see FdReserve. */
  private readonly reserve = new FdReserve();
  /** The log directory, open for the log's life: its fsyncs need no descriptor of their own. */
  private readonly dirFd: number;
  /** Indexes of the segment files on disk (a snapshot removes the ones it covers). */
  private readonly segments = new Set<number>();

  private readonly expectedCommits: () => number;

  private constructor(private readonly options: WalOptions) {
    this.expectedCommits = options.expectedCommits ?? (() => 0);
    this.dirFd = openSync(options.dir, 'r');
  }

  get lastSeq(): number {
    return this.seq;
  }

  get failure(): Error | null {
    return this.failureError;
  }

  get recordsSinceSnapshotCount(): number {
    return this.recordsSinceSnapshot;
  }

  /** A snapshot failed: count the records for the next one from here. */
  deferSnapshot(): void {
    this.recordsSinceSnapshot = 0;
  }

  /** Opens the log, replaying the snapshot and every valid record through `handlers`. */
  static open(options: WalOptions, handlers: ReplayHandlers): WriteAheadLog {
    mkdirSync(options.dir, { recursive: true, mode: 0o700 });
    const log = new WriteAheadLog(options);
    try {
      log.replay(handlers);
    } catch (error) {
      // A damaged log stops the start; an embedding process (the CLI, tests) must not keep our
      // descriptors.
      log.releaseDescriptors();
      throw error;
    }
    if (options.fsync === 'interval') {
      log.intervalTimer = setInterval(() => void log.syncInterval(), options.fsyncIntervalMs);
      log.intervalTimer.unref?.();
    }
    return log;
  }

  private replay(handlers: ReplayHandlers): void {
    const { dir, logger } = this.options;
    let snapshotSeq = 0;
    let snapshotBytes: Buffer | null = null;
    try {
      snapshotBytes = readFileSync(join(dir, SNAPSHOT_FILE));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
    }
    if (snapshotBytes !== null) {
      const snapshot = readSnapshot(snapshotBytes, join(dir, SNAPSHOT_FILE));
      snapshotSeq = snapshot.seq;
      handlers.loadSnapshot(snapshot.state, snapshot.seq, snapshot.blobs);
    }
    this.seq = snapshotSeq;

    const segments = readdirSync(dir)
      .map((name) => SEGMENT_RE.exec(name))
      .filter((match): match is RegExpExecArray => match !== null)
      .map((match) => Number(match[1]))
      .sort((a, b) => a - b);

    for (let i = 0; i < segments.length; i++) {
      const index = segments[i]!;
      this.segments.add(index);
      const path = join(dir, segmentName(index));
      const bytes = new Uint8Array(readFileSync(path));
      const isLast = i === segments.length - 1;
      let offset = 0;
      while (offset < bytes.length) {
        const frame = decodeFrame(bytes, offset);
        if (frame.kind !== 'ok') {
          const why = frame.kind === 'incomplete' ? 'incomplete frame' : frame.why;
          if (!isLast || this.hasValidFrameAfter(bytes, offset + 1)) {
            throw new WalCorruptionError(
              `${path}: corrupt record at offset ${offset} (${why}) followed by valid records; ` +
                `refusing to start`,
            );
          }
          logger.warn(
            { file: path, offset, why, droppedBytes: bytes.length - offset },
            'wal: torn tail truncated',
          );
          const fd = openSync(path, 'r+');
          try {
            ftruncateSync(fd, offset);
            fsyncSync(fd);
          } finally {
            closeSync(fd);
          }
          break;
        }
        if (frame.seq > snapshotSeq) {
          if (frame.seq !== this.seq + 1) {
            throw new WalCorruptionError(
              `${path}: record at offset ${offset} has seq ${frame.seq}, expected ` +
                `${this.seq + 1}; refusing to start`,
            );
          }
          let payload: unknown;
          try {
            payload = JSON.parse(DECODER.decode(frame.payload));
          } catch {
            throw new WalCorruptionError(
              `${path}: record at offset ${offset} is not valid JSON; refusing to start`,
            );
          }
          handlers.applyRecord(frame.seq, payload);
          this.seq = frame.seq;
          this.recordsSinceSnapshot++;
        }
        this.segmentLastSeq.set(index, frame.seq);
        offset = frame.nextOffset;
      }
    }
    const lastIndex = segments.at(-1);
    this.openSegment(lastIndex ?? 1);
    this.durableSeq = this.seq;
  }

  /**
   * After a bad frame: is there any frame further on that checks out? Then this is not a torn tail.
   */
  private hasValidFrameAfter(bytes: Uint8Array, from: number): boolean {
    for (let offset = from; offset + FRAME_HEADER_BYTES < bytes.length; offset++) {
      const frame = decodeFrame(bytes, offset);
      if (frame.kind === 'ok' && frame.seq > this.seq) return true;
    }
    return false;
  }

  private openSegment(index: number): void {
    const path = join(this.options.dir, segmentName(index));
    this.fd = this.reserve.openSync(path, 'a', 0o600);
    this.segments.add(index);
    this.segmentIndex = index;
    this.segmentSizeBytes = fstatSync(this.fd).size;
    // The new file's directory entry must be durable too, or an fsynced record could vanish with
    // it.
    fsyncSync(this.dirFd);
  }

  /**
   * Queues one record. Records appended in the same event-loop turn share one write and one fsync
   * (group commit). The promise resolves when the record is as durable as the policy promises: on
   * disk for `always`, written to the OS for `interval` and `off`. Throws at once when the log has
   * failed.
   */
  append(payload: unknown): Promise<void> {
    if (this.failureError) throw this.unavailableError(this.failureError);
    assert(!this.closed, 'append after close');
    const json = JSON.stringify(payload);
    this.seq++;
    this.pendingTexts.push(json);
    this.pendingBytesMax += textFrameBytesMax(json);
    this.recordsSinceSnapshot++;
    let batch = this.pendingBatch;
    if (batch === null) {
      batch = this.pendingBatch = Promise.withResolvers<void>();
      // Appenders handle the failure; the batch itself must never be an unhandled rejection.
      batch.promise.catch(ignore);
    }
    this.scheduleFlush();
    return batch.promise;
  }

  private scheduleFlush(): void {
    if (this.flushScheduled) return;
    this.flushScheduled = true;
    // At the end of this event-loop turn rather than of this task: the commits of every answer
    // handled in the turn share one write (and, under `always`, one fsync), at the cost of
    // microseconds.
    setImmediate(this.runScheduledFlush);
  }

  private readonly runScheduledFlush = (): void => {
    if (!this.flushScheduled) return; // flush() started it already
    this.flushScheduled = false;
    if (!this.flushing) this.startFlushLoop();
  };

  private startFlushLoop(): void {
    this.flushing = this.flushLoop().finally(() => {
      this.flushing = null;
      // A waiter resolved by the loop runs before this callback; what it appended after the loop's
      // last check is still pending, and nothing else would ever write it.
      if (this.pendingTexts.length > 0) this.scheduleFlush();
    });
  }

  private async flushLoop(): Promise<void> {
    while (this.pendingTexts.length > 0) {
      let batch: PromiseWithResolvers<void> | null = null;
      let written: { fd: number; offset: number } | null = null;
      try {
        if (this.options.fsync === 'always') {
          // Group commit across turns: while other requests are about to commit (they are in flight
          // and their records are not yet pending), wait a turn or two so that one write and one
          // fsync cover them too. Under load that halves the fsyncs, each ~100 µs of kernel CPU;
          // alone (one client) nothing waits.
          const startedMs = performance.now();
          for (let turn = 0; turn < COMMIT_DELAY_TURNS_MAX; turn++) {
            if (
              this.expectedCommits() - this.pendingTexts.length < COMMIT_SIBLINGS_MIN ||
              performance.now() - startedMs > COMMIT_DELAY_MS_MAX
            )
              break;
            await nextTurn();
          }
        }
        if (this.failureError) throw this.failureError;
        batch = this.pendingBatch;
        this.pendingBatch = null;
        written = { fd: this.fd, offset: this.segmentSizeBytes };
        const lastSeq = this.writePending();
        this.writingBatch = batch;
        this.writingLastSeq = lastSeq;
        if (this.options.fsync === 'always') await fsyncAsync(this.fd);
        else this.dirty = true;
        this.durableSeq = Math.max(this.durableSeq, lastSeq);
      } catch (error) {
        this.fail(error as Error);
        if (written !== null) this.eraseFailedBatch(written.fd, written.offset);
        this.writingBatch = null;
        (batch ?? this.takeBatch())?.reject(this.unavailableError(error as Error));
        this.rollRequest?.reject(this.unavailableError(error as Error));
        this.rollRequest = null;
        continue;
      }
      this.writingBatch = null;
      batch?.resolve();
      // Between two batches no write or fsync is in flight: the one moment a segment may be closed.
      if (this.rollRequest !== null || this.segmentSizeBytes >= this.options.segmentBytes)
        this.rollBetweenBatches();
    }
    if (this.rollRequest !== null) this.rollBetweenBatches();
  }

  /** Closes the segment for the next one and answers a snapshot's request for it, if one waits. */
  private rollBetweenBatches(): void {
    const request = this.rollRequest;
    this.rollRequest = null;
    const closedIndex = this.segmentIndex;
    this.rollSegment();
    if (request === null) return;
    if (this.failureError) request.reject(this.unavailableError(this.failureError));
    else request.resolve(closedIndex);
  }

  /** Closes the current segment at the next moment no batch is on it; resolves with its index. */
  private rollSegmentSoon(): Promise<number> {
    if (this.flushing === null) {
      const closedIndex = this.segmentIndex;
      this.rollSegment();
      return this.failureError
        ? Promise.reject(this.unavailableError(this.failureError))
        : Promise.resolve(closedIndex);
    }
    this.rollRequest ??= Promise.withResolvers<number>();
    return this.rollRequest.promise;
  }

  /**
   * Resolves when every record up to `seq` is as durable as the policy promises. Waits on the batch
   * that holds it, not for the log to go idle: under steady load it never does.
   */
  private async flushThrough(seq: number): Promise<void> {
    while (this.durableSeq < seq) {
      this.assertWritable();
      const batch =
        this.writingBatch !== null && seq <= this.writingLastSeq
          ? this.writingBatch
          : this.pendingBatch;
      if (batch === null) return;
      await batch.promise.catch(ignore);
    }
  }

  private takeBatch(): PromiseWithResolvers<void> | null {
    const batch = this.pendingBatch;
    this.pendingBatch = null;
    this.pendingTexts = [];
    this.pendingBytesMax = 0;
    return batch;
  }

  /** The error the appenders of a failed batch get (the owner's, when it gave a mapping). */
  private unavailableError(cause: Error): Error {
    const message = `write-ahead log unavailable: ${cause.message}`;
    return this.options.unavailable
      ? this.options.unavailable(message)
      : new WalUnavailableError(message);
  }

  /**
   * Writes every pending record in one write; returns the last seq written (-1 when none was
   * pending).
   */
  private writePending(): number {
    const texts = this.pendingTexts;
    if (texts.length === 0) return -1;
    // append() bumps seq and queues its text in one step, so the batch ends at the current seq.
    const batchLastSeq = this.seq;
    const bytesMax = this.pendingBytesMax;
    this.pendingTexts = [];
    this.pendingBytesMax = 0;
    const batch = this.frameBatch(texts, batchLastSeq - texts.length + 1, bytesMax);
    let written = 0;
    while (written < batch.length)
      written += writeSync(this.fd, batch, written, batch.length - written);
    this.segmentSizeBytes += batch.length;
    this.segmentLastSeq.set(this.segmentIndex, batchLastSeq);
    return batchLastSeq;
  }

  /**
   * Cuts a batch whose write or fsync failed back off its segment. Its appenders are told it failed
   * (a 503), so none of its records may count after a restart: a partial write (disk full) can
   * leave whole frames of it on disk, which replay would otherwise apply, charging requests
   * answered 503. Best effort: when even this fails, the log says so.
   */
  private eraseFailedBatch(fd: number, offset: number): void {
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
   * Frames `texts` (seqs from `firstSeq`) one after the other; the view is valid until the next
   * batch.
   */
  private frameBatch(texts: string[], firstSeq: number, bytesMax: number): Buffer {
    const out =
      bytesMax > this.writeBuffer.length ? Buffer.allocUnsafeSlow(bytesMax) : this.writeBuffer;
    let offset = 0;
    for (let i = 0; i < texts.length; i++)
      offset += writeTextFrame(out, offset, firstSeq + i, texts[i]!);
    return out.subarray(0, offset);
  }

  private fail(error: Error): void {
    if (this.failureError) return;
    this.failureError = error;
    this.options.logger.fatal(
      { err: error.message },
      'wal: write or fsync failed; refusing all further writes',
    );
    this.options.onFailure?.(error);
  }

  private rollSegment(): void {
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

  private async syncInterval(): Promise<void> {
    if (!this.dirty || this.syncing || this.failureError || this.closed || this.fd < 0) return;
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

  /** Resolves when everything appended so far has been written (and fsynced under `always`). */
  async flush(): Promise<void> {
    while (this.flushing || this.flushScheduled || this.pendingTexts.length > 0) {
      if (this.flushing) {
        await this.flushing;
      } else {
        // Someone waits: write now instead of at the end of the turn.
        this.flushScheduled = false;
        this.startFlushLoop();
      }
    }
  }

  /**
   * Writes `content` (serialized synchronously by the caller at `seq`, so later changes cannot leak
   * in) as the new snapshot, then removes the segments it covers. Crash-safe: the snapshot is
   * atomic and segments go only after it is durable.
   */
  snapshot(content: SnapshotContent, seq: number): Promise<void> {
    // One at a time: two would share the temp file, and the later one's removals assume the earlier
    // one done.
    const run = this.snapshotQueue.then(() => this.writeSnapshot(content, seq));
    this.snapshotQueue = run.catch(ignore);
    return run;
  }

  private async writeSnapshot(content: SnapshotContent, seq: number): Promise<void> {
    assert(seq <= this.seq, 'snapshot ahead of the log');
    // Everything the snapshot covers must be in the log first; then the segment is closed between
    // two batches (no write or fsync in flight on it), and appends go on in the next while the
    // snapshot is written. Only segments the snapshot fully covers are removed.
    await this.flushThrough(seq);
    this.assertWritable();
    const oldIndex = await this.rollSegmentSoon();
    // A failed roll leaves the old segment current: removing it would remove the live log.
    this.assertWritable();
    await this.writeSnapshotFile(content, seq);
    this.recordsSinceSnapshot = this.seq - seq;
    // Records appended after `seq` was taken (while this waited for the flush) sit in the old
    // segments too; a segment holding any of them must stay, or they would be lost (and replay
    // would find a gap).
    for (const index of [...this.segments].sort((a, b) => a - b)) {
      if (index <= oldIndex && (this.segmentLastSeq.get(index) ?? 0) <= seq) {
        this.segmentLastSeq.delete(index);
        this.segments.delete(index);
        // On the thread pool: removing a full 64 MB segment takes the kernel ~30 ms.
        await unlink(join(this.options.dir, segmentName(index)));
      }
    }
    await fsyncAsync(this.dirFd);
  }

  /**
   * Snapshot file, format 2: one line of JSON,
   * `{"format":2,"seq","json_bytes","blob_bytes":[...],"crc32"}`, then the state JSON, then the
   * blobs, one after the other. The CRC-32 (IEEE, native) covers the header's fields (`seq` decides
   * which log records replay skips) and all that follows the line. Format 1, still read, was one
   * JSON object `{"format":1,"seq","state"}`.
   *
   * Written so that after a crash it is either the old file or the whole new one, and
   * asynchronously: a snapshot is megabytes, and its write and fsync must not stop the event loop.
   */
  private async writeSnapshotFile(content: SnapshotContent, seq: number): Promise<void> {
    const path = join(this.options.dir, SNAPSHOT_FILE);
    const json = Buffer.from(content.json, 'utf8');
    const blobBytes = content.blobs.map((blob) => blob.byteLength);
    let crc = Bun.hash.crc32(json, snapshotHeaderCrc(seq, json.length, blobBytes));
    for (const blob of content.blobs) crc = Bun.hash.crc32(blob, crc);
    const meta = { format: 2, seq, json_bytes: json.length, blob_bytes: blobBytes, crc32: crc };
    const header = Buffer.from(`${JSON.stringify(meta)}\n`);
    const temp = `${path}.tmp`;
    const fd = this.reserve.openSync(temp, 'w', 0o600);
    try {
      for (const part of [header, json, ...content.blobs]) {
        let written = 0;
        while (written < part.byteLength)
          written += await writeAsync(fd, part, written, part.byteLength - written);
      }
      await fsyncAsync(fd);
    } catch (error) {
      // A full disk: the half-written file must not keep the space the log needs.
      await unlink(temp).catch(ignore);
      throw error;
    } finally {
      closeSync(fd);
      this.reserve.refill();
    }
    await rename(temp, path);
    await fsyncAsync(this.dirFd);
  }

  private releaseDescriptors(): void {
    if (this.fd >= 0) closeSync(this.fd);
    this.fd = -1;
    closeSync(this.dirFd);
    this.reserve.close();
  }

  private assertWritable(): void {
    if (this.failureError) throw this.unavailableError(this.failureError);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.flush();
    this.closed = true;
    if (this.intervalTimer) clearInterval(this.intervalTimer);
    if (this.syncing) await this.syncing;
    await this.snapshotQueue;
    try {
      if (this.fd >= 0 && !this.failureError && this.options.fsync !== 'off') fsyncSync(this.fd);
    } finally {
      this.releaseDescriptors();
    }
  }
}
