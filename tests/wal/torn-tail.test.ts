// Recovery from a torn or damaged log: a bad tail is cut back to the longest valid prefix, damage
// elsewhere refuses to start.
import { afterAll, describe, expect, test } from 'bun:test';
import { readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { decodeFrame, encodeFrame } from '../../src/wal/frame.ts';
import {
  bareFramesOf,
  batchedSegment,
  batchRanges,
  expectCorruption,
  openRecording,
  payloadOf,
  replayOnly,
  segmentFiles,
  tempDirs,
} from './support.ts';

const dirs = tempDirs('tollgate-wal-torn-');
afterAll(() => dirs.cleanup());

const RECORD_COUNT = 6;
const SEGMENT = 'segment-000000000001.wal';

type Format = 'batches' | 'bare frames';
/** The writer's format, and the one gateways before batches wrote (still read). */
const FORMATS: Format[] = ['batches', 'bare frames'];

/**
 * Byte ranges [start, end) of each unit a torn write cuts into (a batch, or a bare frame), with
 * the last seq in it, read with the real decoders.
 */
function unitRanges(
  bytes: Uint8Array,
  format: Format,
): Array<{ start: number; end: number; seq: number }> {
  if (format === 'batches')
    return batchRanges(bytes).map((r) => ({ start: r.start, end: r.end, seq: r.seqs.at(-1)! }));
  const ranges: Array<{ start: number; end: number; seq: number }> = [];
  let offset = 0;
  while (offset < bytes.length) {
    const frame = decodeFrame(bytes, offset);
    if (frame.kind !== 'ok') throw new Error(`fixture is not clean at ${offset}: ${frame.kind}`);
    ranges.push({ start: offset, end: frame.nextOffset, seq: frame.seq });
    offset = frame.nextOffset;
  }
  return ranges;
}

/** Rewrites every segment in `dir` as bare frames (an older gateway's log), for that format. */
function toFormat(dir: string, format: Format): void {
  if (format === 'batches') return;
  for (const name of segmentFiles(dir)) {
    const path = join(dir, name);
    const bytes = new Uint8Array(readFileSync(path));
    if (bytes.length > 0) writeFileSync(path, bareFramesOf(bytes));
  }
}

/**
 * Writes `count` records with fsync off into a fresh dir, closes, and returns the dir and its one
 * segment's bytes, in `format`.
 */
async function writeFixture(
  count: number,
  format: Format,
): Promise<{ dir: string; bytes: Uint8Array }> {
  const dir = dirs.make();
  const { wal, replayed } = openRecording(dir);
  expect(replayed).toEqual({ snapshot: null, records: [] });
  // Each append awaited alone, so every record is its own batch (and group commit plays no part).
  for (let i = 0; i < count; i++) await wal.append(payloadOf(i));
  await wal.close();
  expect(segmentFiles(dir)).toEqual([SEGMENT]);
  toFormat(dir, format);
  return { dir, bytes: new Uint8Array(readFileSync(join(dir, SEGMENT))) };
}

function expectedRecords(count: number): Array<{ seq: number; payload: unknown }> {
  return Array.from({ length: count }, (_, i) => ({ seq: i + 1, payload: payloadOf(i) }));
}

/** A fresh dir holding `bytes` as its only segment. */
function dirWithSegment(bytes: Uint8Array, name = SEGMENT): string {
  const dir = dirs.make();
  writeFileSync(join(dir, name), bytes);
  return dir;
}

describe.each(FORMATS)('torn tail (%s)', (format) => {
  test('the fixture replays whole', async () => {
    const { dir, bytes } = await writeFixture(RECORD_COUNT, format);
    expect(unitRanges(bytes, format).map((r) => r.seq)).toEqual([1, 2, 3, 4, 5, 6]);
    expect(await replayOnly(dir)).toEqual({
      snapshot: null,
      records: expectedRecords(RECORD_COUNT),
    });
  });

  test(
    '(a) truncation at every byte offset of the last record: prefix kept, file cut back, ' +
      'appends continue',
    async () => {
      const { bytes } = await writeFixture(RECORD_COUNT, format);
      const last = unitRanges(bytes, format).at(-1)!;
      // The last record is the biggest payload of the fixture, so this covers header and payload
      // cuts alike.
      expect(last.end - last.start).toBeGreaterThan(16 + 200);
      for (let cut = last.start; cut < last.end; cut++) {
        const dir = dirWithSegment(bytes.subarray(0, cut));
        const path = join(dir, SEGMENT);

        const first = openRecording(dir);
        expect({ cut, replayed: first.replayed }).toEqual({
          cut,
          replayed: { snapshot: null, records: expectedRecords(RECORD_COUNT - 1) },
        });
        expect({ cut, size: statSync(path).size }).toEqual({ cut, size: last.start });
        expect(first.wal.lastSeq).toBe(RECORD_COUNT - 1);

        await first.wal.append({ after: cut });
        await first.wal.close();

        const second = await replayOnly(dir);
        expect({ cut, replayed: second }).toEqual({
          cut,
          replayed: {
            snapshot: null,
            records: [
              ...expectedRecords(RECORD_COUNT - 1),
              { seq: RECORD_COUNT, payload: { after: cut } },
            ],
          },
        });
      }
    },
  );

  test('(b) each byte of the last record flipped: exactly the longest valid prefix', async () => {
    const { bytes } = await writeFixture(RECORD_COUNT, format);
    const last = unitRanges(bytes, format).at(-1)!;
    for (let at = last.start; at < last.end; at++) {
      const damaged = bytes.slice();
      damaged[at] = damaged[at]! ^ 0xff;
      const dir = dirWithSegment(damaged);
      const { wal, replayed } = openRecording(dir);
      expect({ at, replayed }).toEqual({
        at,
        replayed: { snapshot: null, records: expectedRecords(RECORD_COUNT - 1) },
      });
      expect({ at, size: statSync(join(dir, SEGMENT)).size }).toEqual({ at, size: last.start });
      await wal.append({ after: at });
      await wal.close();
      expect((await replayOnly(dir)).records.map((r) => r.seq)).toEqual([1, 2, 3, 4, 5, 6]);
    }
  });

  test('(b) a clean cut exactly at a record boundary is not damage', async () => {
    const { bytes } = await writeFixture(RECORD_COUNT, format);
    const ranges = unitRanges(bytes, format);
    for (const [index, range] of ranges.entries()) {
      const dir = dirWithSegment(bytes.subarray(0, range.end));
      expect(await replayOnly(dir)).toEqual({
        snapshot: null,
        records: expectedRecords(index + 1),
      });
      expect(statSync(join(dir, SEGMENT)).size).toBe(range.end);
    }
  });

  test(
    '(c) corruption in the middle refuses to start, names file and offset, and leaves the ' +
      'file alone',
    async () => {
      const { bytes } = await writeFixture(5, format);
      const second = unitRanges(bytes, format)[1]!;
      for (let at = second.start; at < second.end; at++) {
        const damaged = bytes.slice();
        damaged[at] = damaged[at]! ^ 0xff;
        const dir = dirWithSegment(damaged);
        const path = join(dir, SEGMENT);
        const error = expectCorruption(() => openRecording(dir));
        expect(error.message).toContain(path);
        expect(error.message).toContain(`offset ${second.start}`);
        // Refusing must not "repair": the valid records after the damage are still on disk.
        expect(new Uint8Array(readFileSync(path))).toEqual(damaged);
      }
    },
  );

  test(
    '(c) a record cut out of the middle (length ' + 'pointing past the end) refuses to start',
    async () => {
      const { bytes } = await writeFixture(5, format);
      const ranges = unitRanges(bytes, format);
      // Record 2's header followed directly by record 4 and 5: record 2's length now swallows
      // record 3.
      const spliced = new Uint8Array([
        ...bytes.subarray(0, ranges[1]!.start + 20),
        ...bytes.subarray(ranges[2]!.end),
      ]);
      const dir = dirWithSegment(spliced);
      const error = expectCorruption(() => openRecording(dir));
      expect(error.message).toContain(join(dir, SEGMENT));
    },
  );

  test('(d) a bad frame in a segment that is not the last refuses to start', async () => {
    const dir = dirs.make();
    // Tiny segments: every write rolls to the next file (the smallest frame here is 33 bytes).
    const { wal } = openRecording(dir, { segmentBytes: 32 });
    for (let i = 0; i < 5; i++) await wal.append(payloadOf(i));
    await wal.close();
    toFormat(dir, format);
    const segments = segmentFiles(dir);
    expect(segments.length).toBe(6);
    expect((await replayOnly(dir, { segmentBytes: 32 })).records).toEqual(expectedRecords(5));

    // The last record of the first segment, flipped: in the last segment this would be a torn tail,
    // here it is not.
    const firstPath = join(dir, segments[0]!);
    const original = new Uint8Array(readFileSync(firstPath));
    const lastOfFirst = unitRanges(original, format).at(-1)!;
    for (const at of [lastOfFirst.start, lastOfFirst.start + 5, lastOfFirst.end - 1]) {
      const damaged = original.slice();
      damaged[at] = damaged[at]! ^ 0xff;
      writeFileSync(firstPath, damaged);
      const error = expectCorruption(() => openRecording(dir, { segmentBytes: 32 }));
      expect(error.message).toContain(firstPath);
      expect(error.message).toContain(`offset ${lastOfFirst.start}`);
      expect(new Uint8Array(readFileSync(firstPath))).toEqual(damaged);
    }

    // A non-last segment cut short is not a torn tail either.
    writeFileSync(firstPath, original.subarray(0, original.length - 1));
    const cut = expectCorruption(() => openRecording(dir, { segmentBytes: 32 }));
    expect(cut.message).toContain(firstPath);

    // Restored, the log opens again: the refusals changed nothing.
    writeFileSync(firstPath, original);
    expect((await replayOnly(dir, { segmentBytes: 32 })).records).toEqual(expectedRecords(5));
  });

  test(
    '(d) a torn tail in the second-to-last segment ' +
      'is refused even when the last segment is empty',
    async () => {
      const dir = dirs.make();
      const { wal } = openRecording(dir, { segmentBytes: 32 });
      for (let i = 0; i < 3; i++) await wal.append(payloadOf(i, [100]));
      await wal.close();
      toFormat(dir, format);
      const segments = segmentFiles(dir);
      const lastPath = join(dir, segments.at(-1)!);
      expect(statSync(lastPath).size).toBe(0);
      const previousPath = join(dir, segments.at(-2)!);
      const bytes = readFileSync(previousPath);
      writeFileSync(previousPath, bytes.subarray(0, bytes.length - 3));
      expect(expectCorruption(() => openRecording(dir, { segmentBytes: 32 })).message).toContain(
        previousPath,
      );
    },
  );

  test('(e) a gap in sequence numbers refuses to start', () => {
    const frame = (seq: number) =>
      encodeFrame(seq, new TextEncoder().encode(JSON.stringify({ seq })));
    const join3 = (...frames: Uint8Array[]) =>
      format === 'batches' ? batchedSegment(frames) : new Uint8Array(frames.flatMap((f) => [...f]));

    const gapDir = dirWithSegment(join3(frame(1), frame(2), frame(4), frame(5)));
    const gap = expectCorruption(() => openRecording(gapDir));
    expect(gap.message).toContain(join(gapDir, SEGMENT));
    expect(gap.message).toContain('seq 4, expected 3');

    // Sequence numbers must rise by one: a repeat is as wrong as a gap.
    const repeatDir = dirWithSegment(join3(frame(1), frame(2), frame(2)));
    expect(expectCorruption(() => openRecording(repeatDir)).message).toContain('seq 2, expected 3');

    // A log that does not start at 1 (its first records lost, no snapshot to cover them).
    const headlessDir = dirWithSegment(join3(frame(3), frame(4)));
    expect(expectCorruption(() => openRecording(headlessDir)).message).toContain(
      'seq 3, expected 1',
    );

    // A gap between segments.
    const acrossDir = dirWithSegment(join3(frame(1), frame(2)));
    writeFileSync(join(acrossDir, 'segment-000000000002.wal'), join3(frame(4)));
    const across = expectCorruption(() => openRecording(acrossDir));
    expect(across.message).toContain(join(acrossDir, 'segment-000000000002.wal'));
  });
});
