// The write-ahead log as its owner (state/store.ts) sees it: one class over the segment files,
// group commit, snapshots and replay, and the one module outside wal/ imports from.
import { mkdirSync } from 'node:fs';
import { assert } from '../util/assert.ts';
import { ignore } from '../util/promise.ts';
import { GroupCommit } from './group-commit.ts';
import { type Replayed, type ReplayHandlers, replay } from './replay.ts';
import { SegmentFiles, type WalOptions } from './segment.ts';
import {
  dropCoveredSegments,
  removeDroppedSegments,
  type SnapshotContent,
  writeSnapshotFile,
} from './snapshot.ts';

export { WalCorruptionError, WalUnavailableError } from './errors.ts';
export type { ReplayHandlers } from './replay.ts';
export type { FsyncPolicy, WalOptions } from './segment.ts';
export type { SnapshotContent, SnapshotSource } from './snapshot.ts';
export { readWhole } from './snapshot.ts';

export class WriteAheadLog {
  /** The snapshot being written, if any: the next one starts after it. */
  private snapshotQueue: Promise<void> = Promise.resolve();

  private constructor(
    private readonly options: WalOptions,
    private readonly files: SegmentFiles,
    private readonly commits: GroupCommit,
    private recordsSinceSnapshot: number,
  ) {}

  /** Opens the log, replaying the snapshot and every valid record through `handlers`. */
  static open(options: WalOptions, handlers: ReplayHandlers): WriteAheadLog {
    mkdirSync(options.dir, { recursive: true, mode: 0o700 });
    const files = new SegmentFiles(options);
    let replayed: Replayed;
    try {
      replayed = replay(options.dir, options.logger, handlers);
      removeDroppedSegments(options.dir, options.logger);
      files.openAfterReplay(replayed.segments, replayed.tail);
    } catch (error) {
      // A damaged log stops the start; an embedding process (the CLI, tests) must not keep our
      // descriptors.
      files.releaseDescriptors();
      throw error;
    }
    const commits = new GroupCommit(options, files, replayed.seq);
    const log = new WriteAheadLog(options, files, commits, replayed.recordsApplied);
    if (options.fsync === 'interval') files.startIntervalSync();
    return log;
  }

  get lastSeq(): number {
    return this.commits.lastSeq;
  }

  get failure(): Error | null {
    return this.files.failure;
  }

  get recordsSinceSnapshotCount(): number {
    return this.recordsSinceSnapshot;
  }

  /** A snapshot failed: count the records for the next one from here. */
  deferSnapshot(): void {
    this.recordsSinceSnapshot = 0;
  }

  /**
   * Queues one record. Records appended in the same event-loop turn share one write and one fsync
   * (group commit). The promise resolves when the record is as durable as the policy promises: on
   * disk for `always`, written to the OS for `interval` and `off`. Throws at once when the log has
   * failed. With `deferMs`, it waits for the next write, `deferMs` at the most
   * (GroupCommit.append).
   */
  append(payload: unknown, deferMs = 0): Promise<void> {
    const durable = this.commits.append(payload, deferMs);
    this.recordsSinceSnapshot++;
    return durable;
  }

  /**
   * Resolves once no next segment is being prepared: under fsync `always`, one is then ready (or
   * could not be made). Tests and benchmarks wait on it; the log never needs to.
   */
  prepared(): Promise<void> {
    return this.files.prepared();
  }

  /** Resolves when everything appended so far has been written (and fsynced under `always`). */
  flush(): Promise<void> {
    return this.commits.flush();
  }

  /** Resolves when every record up to `seq` is durable (see GroupCommit.flushThrough). */
  flushThrough(seq: number): Promise<void> {
    return this.commits.flushThrough(seq);
  }

  /**
   * Writes `content` (captured by the caller at `seq`, so later changes cannot leak in) as the new
   * snapshot, then removes the segments it covers. Crash-safe: the snapshot is
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
    const { dir } = this.options;
    const files = this.files;
    let oldIndex: number;
    try {
      assert(seq <= this.commits.lastSeq, 'snapshot ahead of the log');
      // Everything the snapshot covers must be in the log first; then the segment is closed
      // between two batches (no write or fsync in flight on it), and appends go on in the next
      // while the snapshot is written. Only segments the snapshot fully covers are removed.
      await this.commits.flushThrough(seq);
      files.assertWritable();
      oldIndex = await this.commits.rollSegmentSoon();
      // A failed roll leaves the old segment current: removing it would remove the live log.
      files.assertWritable();
      await writeSnapshotFile(dir, files.dirFd, files.reserve, content, seq);
    } finally {
      // Durable, or failed on any step: what it read from the live state may go (before the
      // segments do, which takes longer).
      content.written?.();
    }
    this.recordsSinceSnapshot = this.commits.lastSeq - seq;
    await dropCoveredSegments(dir, files.dirFd, files.reserve, files.segments, oldIndex, seq);
  }

  async close(): Promise<void> {
    if (this.files.closed) return;
    await this.commits.flush();
    const syncing = this.files.stop();
    if (syncing) await syncing;
    await this.snapshotQueue;
    // A snapshot that was queued may have rolled the segment meanwhile (a directory fsync).
    const late = this.files.stop();
    if (late) await late;
    this.files.close();
  }
}
