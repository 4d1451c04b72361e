// Reading the log back on open: the snapshot, then every segment's records in seq order. A torn
// tail (a crash mid-write) is cut off; any other damage refuses to start.
import { closeSync, fsyncSync, ftruncateSync, openSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '../util/log.ts';
import { WalCorruptionError } from './errors.ts';
import { decodeFrame, FRAME_HEADER_BYTES } from './frame.ts';
import { segmentName } from './segment.ts';
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
    };
  }

  /** Applies the records of segment `index` past the snapshot; only the last may be torn. */
  read(index: number, isLast: boolean): void {
    const replayed = this.replayed;
    replayed.segments.set(index, 0);
    const path = join(this.dir, segmentName(index));
    const bytes = new Uint8Array(readFileSync(path));
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
      replayed.segments.set(index, frame.seq);
      offset = frame.nextOffset;
    }
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
    const fd = openSync(path, 'r+');
    try {
      ftruncateSync(fd, offset);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
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
