// Reading the log back on open: the snapshot, then every segment's records in seq order. A torn
// tail (a crash mid-write) is cut off; any other damage refuses to start. Segments hold batches of
// frames (frame.ts) after a segment header, or, written by older gateways, bare frames.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../util/log.ts';
import { WalCorruptionError } from './errors.ts';
import {
  decodeBatch,
  decodeFrame,
  FRAME_HEADER_BYTES,
  SEGMENT_HEADER,
  SEGMENT_HEADER_BYTES,
} from './frame.ts';
import { type SegmentTail, segmentName, truncateDurably } from './segment.ts';
import { readSnapshotFile } from './snapshot.ts';

export interface ReplayHandlers {
  /**
   * Called once, before any record, when a snapshot exists; `blobs` are its bytes beside the JSON.
   */
  loadSnapshot(state: unknown, seq: number, blobs: Uint8Array[]): void;
  /** Called for each record after the snapshot, in sequence order. */
  applyRecord(seq: number, payload: unknown): void;
}

/** What replay found: where the log goes on from. */
export interface Replayed {
  /** The last seq (the snapshot's when no record follows it). */
  seq: number;
  /** Records applied after the snapshot. */
  recordsApplied: number;
  /** The segment files on disk by index, ascending, with the highest seq in each (0: none). */
  segments: Map<number, number>;
  /** Where the last segment's data ends: appends go on from there. Null: no segment. */
  tail: SegmentTail | null;
}

/**
 * How a segment's bytes are laid out: batches after the header; nothing yet, or the torn start of
 * a new file's first write (the header goes with the first batch: a prefix of the header, 0 is
 * returned); or bare frames, an older gateway's. A zero-filled segment's header was synced before
 * it was renamed in (segment.ts), and a file that grows keeps its first page before its later
 * ones (ext4's default data=ordered commits a size only after the data under it), so a segment
 * whose start is damaged any other way is read as bare frames, where damage refuses to start.
 */
function dataStart(bytes: Uint8Array): number | 'frames' {
  const compared = Math.min(bytes.length, SEGMENT_HEADER_BYTES);
  for (let i = 0; i < compared; i++) if (bytes[i] !== SEGMENT_HEADER[i]) return 'frames';
  return compared === SEGMENT_HEADER_BYTES ? SEGMENT_HEADER_BYTES : 0;
}

function zerosIn(bytes: Uint8Array, from: number, to: number): boolean {
  for (let i = from; i < to; i++) if (bytes[i] !== 0) return false;
  return true;
}

const SEGMENT_RE = /^segment-(\d{12})\.wal$/;
const DECODER = new TextDecoder('utf-8', { fatal: true });

/** Replays the log in `dir` through `handlers`; a torn tail of the last segment is cut off. */
export function replay(dir: string, logger: Logger, handlers: ReplayHandlers): Replayed {
  const snapshot = readSnapshotFile(dir);
  if (snapshot !== null) handlers.loadSnapshot(snapshot.state, snapshot.seq, snapshot.blobs);
  const reader = new SegmentReader(dir, logger, handlers, snapshot?.seq ?? 0);
  const indexes = readdirSync(dir)
    .map((name) => SEGMENT_RE.exec(name))
    .filter((match): match is RegExpExecArray => match !== null)
    .map((match) => Number(match[1]))
    .sort((a, b) => a - b);
  for (let i = 0; i < indexes.length; i++) reader.read(indexes[i]!, i === indexes.length - 1);
  return reader.replayed;
}

/** Reads segments in index order, checking that seqs after the snapshot follow one another. */
class SegmentReader {
  readonly replayed: Replayed;

  constructor(
    private readonly dir: string,
    private readonly logger: Logger,
    private readonly handlers: ReplayHandlers,
    private readonly snapshotSeq: number,
  ) {
    this.replayed = {
      seq: snapshotSeq,
      recordsApplied: 0,
      segments: new Map(),
      tail: null,
    };
  }

  /** Applies the records of segment `index` past the snapshot; only the last may be torn. */
  read(index: number, isLast: boolean): void {
    this.replayed.segments.set(index, 0);
    const path = join(this.dir, segmentName(index));
    const bytes = new Uint8Array(readFileSync(path));
    const start = dataStart(bytes);
    const endBytes =
      start === 'frames'
        ? this.readFrames(index, path, bytes, isLast)
        : this.readBatches(index, path, bytes, start, isLast);
    if (isLast) this.replayed.tail = { index, endBytes, batched: start !== 'frames' };
  }

  /**
   * A segment of batches. It ends at the first place no whole batch is: zeros from there on are
   * the end (the segment is zero-filled ahead of the writer); anything else is the torn last batch
   * (at most one is unsynced under fsync `always`), in the last segment only, and only when no
   * whole batch follows it. Returns where the data ends.
   */
  private readBatches(
    index: number,
    path: string,
    bytes: Uint8Array,
    start: number,
    isLast: boolean,
  ): number {
    let offset = start;
    while (offset < bytes.length) {
      const batch = decodeBatch(bytes, offset);
      if (batch.kind !== 'ok') {
        if (zerosIn(bytes, offset, bytes.length)) break;
        const why = batch.kind === 'incomplete' ? 'incomplete batch' : batch.why;
        if (!isLast || this.hasValidBatchAfter(bytes, offset + 1)) {
          throw new WalCorruptionError(
            `${path}: corrupt batch at offset ${offset} (${why}) ` +
              `${isLast ? 'followed by valid records' : 'in a segment that is not the last'}; ` +
              `refusing to start`,
          );
        }
        this.truncateTornTail(path, offset, why, bytes.length);
        break;
      }
      let frameOffset = batch.framesStart;
      for (let i = 0; i < batch.frameCount; i++) {
        const frame = decodeFrame(bytes, frameOffset);
        // The batch's checksum held: a frame in it that does not is no torn write.
        if (frame.kind !== 'ok' || frame.nextOffset > batch.nextOffset) {
          throw new WalCorruptionError(
            `${path}: bad frame at offset ${frameOffset} inside a whole batch; refusing to start`,
          );
        }
        if (frame.seq > this.snapshotSeq) this.apply(path, frameOffset, frame.seq, frame.payload);
        this.replayed.segments.set(index, frame.seq);
        frameOffset = frame.nextOffset;
      }
      if (frameOffset !== batch.nextOffset) {
        throw new WalCorruptionError(
          `${path}: batch at offset ${offset} holds bytes after its frames; refusing to start`,
        );
      }
      offset = batch.nextOffset;
    }
    return Math.min(offset, bytes.length);
  }

  /** A segment of bare frames (an older gateway's): a bad frame ends it, as torn or as damage. */
  private readFrames(index: number, path: string, bytes: Uint8Array, isLast: boolean): number {
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
        this.truncateTornTail(path, offset, why, bytes.length);
        break;
      }
      if (frame.seq > this.snapshotSeq) this.apply(path, offset, frame.seq, frame.payload);
      this.replayed.segments.set(index, frame.seq);
      offset = frame.nextOffset;
    }
    return Math.min(offset, bytes.length);
  }

  /** Hands one record to the owner; it must be the next seq, and JSON. */
  private apply(path: string, offset: number, seq: number, payloadBytes: Uint8Array): void {
    const replayed = this.replayed;
    if (seq !== replayed.seq + 1) {
      throw new WalCorruptionError(
        `${path}: record at offset ${offset} has seq ${seq}, expected ` +
          `${replayed.seq + 1}; refusing to start`,
      );
    }
    let payload: unknown;
    try {
      payload = JSON.parse(DECODER.decode(payloadBytes));
    } catch {
      throw new WalCorruptionError(
        `${path}: record at offset ${offset} is not valid JSON; refusing to start`,
      );
    }
    this.handlers.applyRecord(seq, payload);
    replayed.seq = seq;
    replayed.recordsApplied++;
  }

  /** A crash mid-write left the end of the last segment half written: it is cut off, durably. */
  private truncateTornTail(path: string, offset: number, why: string, sizeBytes: number): void {
    this.logger.warn(
      { file: path, offset, why, droppedBytes: sizeBytes - offset },
      'wal: torn tail truncated',
    );
    truncateDurably(path, offset);
  }

  /**
   * After a bad batch: is there a whole batch further on with records not yet applied? Then this
   * is not a torn tail. Frames inside the torn batch may be whole; only a batch counts.
   */
  private hasValidBatchAfter(bytes: Uint8Array, from: number): boolean {
    for (let offset = from; offset + FRAME_HEADER_BYTES < bytes.length; offset++) {
      const batch = decodeBatch(bytes, offset);
      if (batch.kind !== 'ok') continue;
      // Any of its records (a batch may straddle the snapshot's seq).
      for (let at = batch.framesStart; at < batch.nextOffset; ) {
        const frame = decodeFrame(bytes, at);
        if (frame.kind !== 'ok') break;
        if (frame.seq > this.replayed.seq) return true;
        at = frame.nextOffset;
      }
    }
    return false;
  }

  /**
   * After a bad frame: is there any frame further on that checks out? Then this is not a torn tail.
   */
  private hasValidFrameAfter(bytes: Uint8Array, from: number): boolean {
    for (let offset = from; offset + FRAME_HEADER_BYTES < bytes.length; offset++) {
      const frame = decodeFrame(bytes, offset);
      if (frame.kind === 'ok' && frame.seq > this.replayed.seq) return true;
    }
    return false;
  }
}
