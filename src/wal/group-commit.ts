// Group commit: the records appended in one event-loop turn (under fsync `always`, a turn or two
// more) share one write and one fsync; each append's promise says when its record is durable.
import { assert } from '../util/assert.ts';
import { ignore, nextTurn } from '../util/promise.ts';
import {
  BATCH_BYTES_MAX,
  BATCH_HEADER_BYTES,
  FRAME_PAYLOAD_BYTES_MAX,
  SEGMENT_HEADER,
  SEGMENT_HEADER_BYTES,
  sealBatch,
  textFrameBytesMax,
  writeTextFrame,
} from './frame.ts';
import type { SegmentFiles, WalOptions } from './segment.ts';

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

export class GroupCommit {
  private seq: number;
  /** JSON of the records appended but not yet written, in seq order; framed only when written. */
  private pendingTexts: string[] = [];
  /**
   * The list the pending texts go to while a batch is framed from the other: the two take turns,
   * so a batch makes no list of its own.
   */
  private spareTexts: string[] = [];
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
  private durableSeq: number;
  /**
   * A snapshot's request to close the segment between two batches; resolves with the closed index.
   */
  private rollRequest: PromiseWithResolvers<number> | null = null;
  private flushing: Promise<void> | null = null;
  private flushScheduled = false;
  /** Set while deferred records wait with no write scheduled (see append's `deferMs`). */
  private deferredTimer: ReturnType<typeof setTimeout> | null = null;
  /** How many of the pending records are deferred ones (not the commits a batch waits for). */
  private deferredPending = 0;
  private readonly expectedCommits: () => number;

  /** Appends go on from `seq`, the last one replay found. */
  constructor(
    private readonly options: WalOptions,
    private readonly files: SegmentFiles,
    seq: number,
  ) {
    this.expectedCommits = options.expectedCommits ?? (() => 0);
    this.seq = seq;
    this.durableSeq = seq;
  }

  get lastSeq(): number {
    return this.seq;
  }

  /**
   * Queues one record. Records appended in the same event-loop turn share one write and one fsync
   * (group commit). The promise resolves when the record is as durable as the policy promises: on
   * disk for `always`, written to the OS for `interval` and `off`. Throws at once when the log has
   * failed.
   *
   * With `deferMs`, the record starts no write of its own: the next write takes it (another
   * record's, which under any load comes within a turn or two), and at the latest one `deferMs`
   * from now. For a record nobody waits on yet: a plain call's start, whose finish comes first when
   * its provider answers within the delay, so that both share one fsync.
   */
  append(payload: unknown, deferMs = 0): Promise<void> {
    const durable = this.queue(payload);
    if (deferMs === 0) this.scheduleFlush();
    else {
      this.deferredPending++;
      if (!this.flushScheduled && this.flushing === null && this.deferredTimer === null)
        this.deferredTimer = setTimeout(this.flushDeferred, deferMs);
    }
    return durable;
  }

  private readonly flushDeferred = (): void => {
    this.deferredTimer = null;
    if (this.pendingTexts.length > 0) this.scheduleFlush();
  };

  /**
   * A write takes every pending record: the deferred ones' timer is done with (left running, it
   * would write the next call's start on its own, which is what deferring avoids).
   */
  private stopDeferredTimer(): void {
    this.deferredPending = 0;
    if (this.deferredTimer === null) return;
    clearTimeout(this.deferredTimer);
    this.deferredTimer = null;
  }

  /** Adds one record to the pending batch; returns the batch's promise. */
  private queue(payload: unknown): Promise<void> {
    this.files.assertWritable();
    assert(!this.files.closed, 'append after close');
    const json = JSON.stringify(payload);
    // Replay takes a frame over FRAME_PAYLOAD_BYTES_MAX for garbage: such a record would be
    // acknowledged and then refuse every start. No record is near it (bodies are never logged); one
    // is a bug, stopped here before a byte of it is written.
    assert(
      json.length <= FRAME_PAYLOAD_BYTES_MAX / 3 ||
        Buffer.byteLength(json) <= FRAME_PAYLOAD_BYTES_MAX,
      'a log record over the frame size limit',
    );
    this.seq++;
    this.pendingTexts.push(json);
    this.pendingBytesMax += textFrameBytesMax(json);
    let batch = this.pendingBatch;
    if (batch === null) {
      batch = this.pendingBatch = Promise.withResolvers<void>();
      // Appenders handle the failure; the batch itself must never be an unhandled rejection.
      batch.promise.catch(ignore);
    }
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
    // `then` with two handlers made once, not `finally`: finally makes two closures and a promise
    // of its own per call, and a loop starts once per batch (under light load, per request).
    this.flushing = this.flushLoop().then(this.flushLoopEnded, this.flushLoopFailed);
  }

  private readonly flushLoopEnded = (): void => {
    this.flushing = null;
    // A waiter resolved by the loop runs before this callback; what it appended after the loop's
    // last check is still pending, and nothing else would ever write it.
    if (this.pendingTexts.length > 0) this.scheduleFlush();
  };

  /** As `finally` would: the same end, and the loop's failure still rejects `flushing`. */
  private readonly flushLoopFailed = (error: unknown): never => {
    this.flushLoopEnded();
    throw error;
  };

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
              this.expectedCommits() - (this.pendingTexts.length - this.deferredPending) <
                COMMIT_SIBLINGS_MIN ||
              performance.now() - startedMs > COMMIT_DELAY_MS_MAX
            )
              break;
            await nextTurn();
          }
        }
        // A prepared segment may have become ready since the last batch: this one goes there.
        if (this.files.full) this.rollBetweenBatches();
        if (this.files.failure) throw this.files.failure;
        batch = this.pendingBatch;
        this.pendingBatch = null;
        written = this.files.writePosition;
        const lastSeq = this.writePending();
        this.writingBatch = batch;
        this.writingLastSeq = lastSeq;
        const sync = this.files.syncBatch();
        if (sync !== null) await sync;
        this.durableSeq = Math.max(this.durableSeq, lastSeq);
      } catch (error) {
        this.files.fail(error as Error);
        if (written !== null) this.files.eraseFailedBatch(written.fd, written.offset);
        this.writingBatch = null;
        (batch ?? this.takeBatch())?.reject(this.files.unavailableError(error as Error));
        this.rollRequest?.reject(this.files.unavailableError(error as Error));
        this.rollRequest = null;
        continue;
      }
      this.writingBatch = null;
      batch?.resolve();
      // Between two batches no write or fsync is in flight: the one moment a segment may be closed.
      if (this.rollRequest !== null || this.files.full) this.rollBetweenBatches();
    }
    if (this.rollRequest !== null) this.rollBetweenBatches();
  }

  /** Closes the segment for the next one and answers a snapshot's request for it, if one waits. */
  private rollBetweenBatches(): void {
    const request = this.rollRequest;
    this.rollRequest = null;
    const closedIndex = this.files.index;
    this.files.roll();
    if (request === null) return;
    if (this.files.failure) request.reject(this.files.unavailableError(this.files.failure));
    else request.resolve(closedIndex);
  }

  /** Closes the current segment at the next moment no batch is on it; resolves with its index. */
  rollSegmentSoon(): Promise<number> {
    if (this.flushing === null) {
      const closedIndex = this.files.index;
      this.files.roll();
      return this.files.failure
        ? Promise.reject(this.files.unavailableError(this.files.failure))
        : Promise.resolve(closedIndex);
    }
    this.rollRequest ??= Promise.withResolvers<number>();
    return this.rollRequest.promise;
  }

  /**
   * Resolves when every record up to `seq` is as durable as the policy promises. Waits on the batch
   * that holds it, not for the log to go idle: under steady load it never does.
   */
  async flushThrough(seq: number): Promise<void> {
    while (this.durableSeq < seq) {
      this.files.assertWritable();
      const writing = this.writingBatch !== null && seq <= this.writingLastSeq;
      const batch = writing ? this.writingBatch : this.pendingBatch;
      if (batch === null) return;
      // Someone waits for it: deferred records go now, not when their delay is up.
      if (!writing && !this.flushScheduled && this.flushing === null) this.scheduleFlush();
      await batch.promise.catch(ignore);
    }
  }

  private takeBatch(): PromiseWithResolvers<void> | null {
    const batch = this.pendingBatch;
    this.pendingBatch = null;
    this.pendingTexts = [];
    this.pendingBytesMax = 0;
    this.stopDeferredTimer();
    return batch;
  }

  /** Writes every pending record in one write; returns the last seq written. */
  private writePending(): number {
    const texts = this.pendingTexts;
    // The flush loop runs only while records are pending, and only its own failure path takes
    // them: a batch with none would be a bug.
    assert(texts.length > 0, 'a batch written with no records pending');
    // append() bumps seq and queues its text in one step, so the batch ends at the current seq.
    const batchLastSeq = this.seq;
    const bytesMax = this.pendingBytesMax;
    this.pendingTexts = this.spareTexts;
    this.pendingBytesMax = 0;
    this.stopDeferredTimer();
    try {
      const batch = this.frameBatch(texts, batchLastSeq - texts.length + 1, bytesMax);
      this.files.write(batch, batchLastSeq);
    } finally {
      // Written or failed, these records are no longer pending (as when the list was dropped).
      texts.length = 0;
      this.spareTexts = texts;
    }
    return batchLastSeq;
  }

  /**
   * Frames `texts` (seqs from `firstSeq`) one after the other in one batch, after the segment
   * header when the batch opens a segment; the view is valid until the next batch.
   */
  private frameBatch(texts: string[], firstSeq: number, bytesMax: number): Buffer {
    const segmentStart = this.files.atSegmentStart;
    const bytesNeeded = bytesMax + BATCH_HEADER_BYTES + (segmentStart ? SEGMENT_HEADER_BYTES : 0);
    const out =
      bytesNeeded > this.writeBuffer.length
        ? Buffer.allocUnsafeSlow(bytesNeeded)
        : this.writeBuffer;
    let batchStart = 0;
    if (segmentStart) {
      out.set(SEGMENT_HEADER, 0);
      batchStart = SEGMENT_HEADER_BYTES;
    }
    const framesStart = batchStart + BATCH_HEADER_BYTES;
    let offset = framesStart;
    for (let i = 0; i < texts.length; i++)
      offset += writeTextFrame(out, offset, firstSeq + i, texts[i]!);
    // Replay takes a larger batch for garbage; a turn's records are nowhere near it.
    assert(offset - framesStart <= BATCH_BYTES_MAX, 'a batch over the batch size limit');
    return out.subarray(0, sealBatch(out, batchStart, offset - framesStart, texts.length));
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
}
