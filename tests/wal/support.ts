// Test support for the WAL tests: temp dirs that clean up, a log opened with recording handlers,
// segment paths.
import { expect } from 'bun:test';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLogger, type Logger } from '../../src/util/log.ts';
import {
  BATCH_HEADER_BYTES,
  decodeBatch,
  decodeFrame,
  SEGMENT_HEADER,
  SEGMENT_HEADER_BYTES,
  sealBatch,
} from '../../src/wal/frame.ts';
import {
  type FsyncPolicy,
  WalCorruptionError,
  type WalOptions,
  WriteAheadLog,
} from '../../src/wal/log.ts';

export const SILENT: Logger = createLogger('silent');

/** Temp dirs made by a test file; `cleanup()` in afterAll/afterEach removes them all. */
export function tempDirs(prefix: string): { make(): string; cleanup(): void } {
  const made: string[] = [];
  return {
    make() {
      const dir = mkdtempSync(join(tmpdir(), prefix));
      made.push(dir);
      return dir;
    },
    cleanup() {
      for (const dir of made.splice(0)) rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface Replayed {
  snapshot: { state: unknown; seq: number } | null;
  records: Array<{ seq: number; payload: unknown }>;
}

export function walOptions(dir: string, overrides: Partial<WalOptions> = {}): WalOptions {
  return {
    dir,
    fsync: 'off' as FsyncPolicy,
    fsyncIntervalMs: 5,
    segmentBytes: 64 * 1024 * 1024,
    logger: SILENT,
    ...overrides,
  };
}

/** Opens the log in `dir`, recording everything replay hands over. */
export function openRecording(
  dir: string,
  overrides: Partial<WalOptions> = {},
): { wal: WriteAheadLog; replayed: Replayed } {
  const replayed: Replayed = { snapshot: null, records: [] };
  const wal = WriteAheadLog.open(walOptions(dir, overrides), {
    loadSnapshot(state, seq) {
      expect(replayed.snapshot).toBeNull();
      expect(replayed.records).toEqual([]);
      replayed.snapshot = { state, seq };
    },
    applyRecord(seq, payload) {
      replayed.records.push({ seq, payload });
    },
  });
  return { wal, replayed };
}

/** Opens, records the replay, closes: what a restart would see. */
export async function replayOnly(
  dir: string,
  overrides: Partial<WalOptions> = {},
): Promise<Replayed> {
  const { wal, replayed } = openRecording(dir, overrides);
  await wal.close();
  return replayed;
}

export function segmentFiles(dir: string): string[] {
  return readdirSync(dir)
    .filter((name) => /^segment-\d{12}\.wal$/.test(name))
    .sort();
}

/** Payload `i` of a test run: sizes vary so frames do not all share one length. */
export function payloadOf(
  i: number,
  sizes: readonly number[] = [1, 57, 3, 130, 0, 250, 9],
): { i: number; pad: string } {
  return { i, pad: 'x'.repeat(sizes[i % sizes.length]!) };
}

export interface BatchRange {
  /** [start, end) of the batch in the segment, its header included. */
  start: number;
  end: number;
  /** Its frames, each whole (header and payload), and their seqs. */
  frames: Uint8Array[];
  seqs: number[];
}

/**
 * The batches of a segment the log wrote (header, then batches, then zeros), read with the real
 * decoders; throws when the segment is not clean.
 */
export function batchRanges(bytes: Uint8Array): BatchRange[] {
  expect(bytes.subarray(0, SEGMENT_HEADER_BYTES)).toEqual(SEGMENT_HEADER);
  const ranges: BatchRange[] = [];
  let offset = SEGMENT_HEADER_BYTES;
  while (offset < bytes.length) {
    const batch = decodeBatch(bytes, offset);
    if (batch.kind !== 'ok') {
      if (bytes.subarray(offset).every((byte) => byte === 0)) break;
      throw new Error(`segment is not clean at ${offset}: ${batch.kind}`);
    }
    const range: BatchRange = { start: offset, end: batch.nextOffset, frames: [], seqs: [] };
    for (let at = batch.framesStart; at < batch.nextOffset; ) {
      const frame = decodeFrame(bytes, at);
      if (frame.kind !== 'ok') throw new Error(`bad frame at ${at} in a whole batch`);
      range.frames.push(bytes.subarray(at, frame.nextOffset));
      range.seqs.push(frame.seq);
      at = frame.nextOffset;
    }
    ranges.push(range);
    offset = batch.nextOffset;
  }
  return ranges;
}

/** The same records as a segment of bare frames, as gateways before batches wrote them. */
export function bareFramesOf(bytes: Uint8Array): Uint8Array {
  return new Uint8Array(Buffer.concat(batchRanges(bytes).flatMap((range) => range.frames)));
}

/** A segment of the given frames, one batch each, as the writer lays them out. */
export function batchedSegment(frames: Uint8Array[]): Uint8Array {
  return segmentOfBatches(frames.map((frame) => [frame]));
}

/** A segment of batches of the given frames, as the writer lays them out. */
export function segmentOfBatches(batches: Uint8Array[][]): Uint8Array {
  const parts: Uint8Array[] = [SEGMENT_HEADER];
  for (const frames of batches) {
    const joined = Buffer.concat(frames);
    const batch = new Uint8Array(BATCH_HEADER_BYTES + joined.length);
    batch.set(joined, BATCH_HEADER_BYTES);
    sealBatch(batch, 0, joined.length, frames.length);
    parts.push(batch);
  }
  return new Uint8Array(Buffer.concat(parts));
}

/** Runs `open`, which must refuse to start; returns the error. */
export function expectCorruption(open: () => unknown): WalCorruptionError {
  let caught: unknown;
  try {
    open();
  } catch (error) {
    caught = error;
  }
  expect(caught).toBeInstanceOf(WalCorruptionError);
  return caught as WalCorruptionError;
}
