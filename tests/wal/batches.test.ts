// Segments of batches, zero-filled ahead of the writer under fsync `always`: the zeros are the end
// of the data, a power cut's torn last batch (its pages persisted in any order) is cut off whole,
// and damage to acknowledged batches still refuses to start.
import { afterAll, describe, expect, test } from 'bun:test';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { encodeFrame, SEGMENT_HEADER, SEGMENT_HEADER_BYTES } from '../../src/wal/frame.ts';
import { PREPARED_SEGMENT_NAME } from '../../src/wal/segment.ts';
import {
  bareFramesOf,
  batchedSegment,
  batchRanges,
  expectCorruption,
  openRecording,
  payloadOf,
  replayOnly,
  segmentFiles,
  segmentOfBatches,
  tempDirs,
} from './support.ts';

const dirs = tempDirs('tollgate-wal-batches-');
afterAll(() => dirs.cleanup());

const SEGMENT = 'segment-000000000001.wal';
const SECOND = 'segment-000000000002.wal';
const PAGE_BYTES = 4096;

function expectedRecords(from: number, to: number, payload = (i: number) => payloadOf(i)) {
  return Array.from({ length: to - from + 1 }, (_, k) => ({
    seq: from + k,
    payload: payload(from + k - 1),
  }));
}

function dirWith(files: Record<string, Uint8Array>): string {
  const dir = dirs.make();
  for (const [name, bytes] of Object.entries(files)) writeFileSync(join(dir, name), bytes);
  return dir;
}

function segmentBytes(dir: string, name = SEGMENT): Uint8Array {
  return new Uint8Array(readFileSync(join(dir, name)));
}

/**
 * The descriptors a log of this file can hold: its files, and the spares it keeps on /dev/null.
 * (Not all the process's: the runtime's own come and go.)
 */
function logFds(): number {
  let count = 0;
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      const target = readlinkSync(`/proc/self/fd/${fd}`);
      if (target === '/dev/null' || target.includes('tollgate-wal-batches-')) count++;
    } catch {
      // closed meanwhile (the listing's own descriptor)
    }
  }
  return count;
}

function dataEnd(bytes: Uint8Array): number {
  return batchRanges(bytes).at(-1)?.end ?? SEGMENT_HEADER_BYTES;
}

function zerosFrom(bytes: Uint8Array, offset: number): boolean {
  return bytes.subarray(offset).every((byte) => byte === 0);
}

/**
 * Five records in batches of their own, then `lastBatch` more in one batch (appended in one
 * turn), written with fsync always once the next segment is prepared: they all go to that one, a
 * file of zeros, and segment 1 stays empty.
 */
async function fixture(lastBatch: number, pad = 400) {
  const dir = dirs.make();
  const { wal } = openRecording(dir, { fsync: 'always' });
  await wal.prepared();
  const payload = (i: number) => payloadOf(i, [pad]);
  for (let i = 0; i < 5; i++) await wal.append(payload(i));
  await Promise.all(Array.from({ length: lastBatch }, (_, k) => wal.append(payload(5 + k))));
  await wal.close();
  expect(segmentFiles(dir)).toEqual([SEGMENT, SECOND]);
  expect(statSync(join(dir, SEGMENT)).size).toBe(0);
  const bytes = segmentBytes(dir, SECOND);
  const ranges = batchRanges(bytes);
  expect(ranges.map((range) => range.seqs.length)).toEqual([1, 1, 1, 1, 1, lastBatch]);
  return { dir, bytes, ranges, payload };
}

describe('zero-filled segments', () => {
  test(
    'under fsync always the next segment is prepared as a file of zeros; a restart goes on after ' +
      'the data, and the zeros are no record',
    async () => {
      const { dir, bytes, payload } = await fixture(3);
      const end = dataEnd(bytes);
      expect(bytes.length).toBe(1024 * 1024);
      expect(zerosFrom(bytes, end)).toBe(true);

      const { wal, replayed } = openRecording(dir, { fsync: 'always' });
      expect(replayed.records).toEqual(expectedRecords(1, 8, payload));
      expect(wal.lastSeq).toBe(8);
      await wal.append(payload(8));
      await wal.close();
      // Appended right after the data, into the zeros, in the same segment.
      expect(segmentFiles(dir)).toEqual([SEGMENT, SECOND]);
      const after = segmentBytes(dir, SECOND);
      expect(batchRanges(after).map((range) => range.seqs)).toEqual([
        [1],
        [2],
        [3],
        [4],
        [5],
        [6, 7, 8],
        [9],
      ]);
      expect((await replayOnly(dir)).records).toEqual(expectedRecords(1, 9, payload));
    },
  );

  test('fsync interval or off: nothing is zero-filled, the file ends at the data', async () => {
    for (const fsync of ['interval', 'off'] as const) {
      const dir = dirs.make();
      const { wal } = openRecording(dir, { fsync });
      for (let i = 0; i < 4; i++) await wal.append(payloadOf(i));
      await wal.close();
      const bytes = segmentBytes(dir);
      expect({ fsync, size: bytes.length }).toEqual({ fsync, size: dataEnd(bytes) });
    }
  });

  test(
    'a power cut during the last batch: whatever subset of its pages reached the disk, replay ' +
      'keeps exactly the batches before it, cuts it off, and the log goes on',
    async () => {
      const { bytes, ranges, payload } = await fixture(40);
      const last = ranges.at(-1)!;
      // The pages the last batch touches; the first also holds the end of the batch before it,
      // which was synced and is there whatever happens.
      const firstPage = Math.floor(last.start / PAGE_BYTES);
      const lastPage = Math.floor((last.end - 1) / PAGE_BYTES);
      const pages = lastPage - firstPage + 1;
      expect(pages).toBeGreaterThanOrEqual(4);
      for (let persisted = 0; persisted < 2 ** pages; persisted++) {
        const image = bytes.slice();
        for (let page = 0; page < pages; page++) {
          if (persisted & (1 << page)) continue;
          const from = Math.max(last.start, (firstPage + page) * PAGE_BYTES);
          const to = Math.min(last.end, (firstPage + page + 1) * PAGE_BYTES);
          image.fill(0, from, to);
        }
        const dir = dirWith({ [SEGMENT]: image });
        const whole = persisted === 2 ** pages - 1;
        const { wal, replayed } = openRecording(dir, { fsync: 'always' });
        expect({ persisted, records: replayed.records }).toEqual({
          persisted,
          records: expectedRecords(1, whole ? 45 : 5, payload),
        });
        // Cut off, or all zeros already: nothing but zeros past the batches kept.
        if (!whole) expect(zerosFrom(segmentBytes(dir), last.start)).toBe(true);
        await wal.append({ after: persisted });
        await wal.close();
        // The next batch goes where the torn one began.
        const after = batchRanges(segmentBytes(dir)).at(-1)!;
        expect({ persisted, start: after.start }).toEqual({
          persisted,
          start: whole ? last.end : last.start,
        });
        const again = await replayOnly(dir);
        expect(again.records.at(-1)).toEqual({
          seq: whole ? 46 : 6,
          payload: { after: persisted },
        });
      }
    },
  );

  test(
    'a torn first batch of a prepared segment (its page with the header back to the header and ' +
      'zeros) is cut off whole; a new file cut inside its header is that batch torn too',
    async () => {
      const dir = dirs.make();
      const { wal } = openRecording(dir, { fsync: 'always' });
      await wal.prepared();
      const payload = (i: number) => payloadOf(i, [300]);
      await Promise.all(Array.from({ length: 30 }, (_, i) => wal.append(payload(i))));
      await wal.close();
      const bytes = segmentBytes(dir, SECOND);
      expect(batchRanges(bytes)[0]!.end).toBeGreaterThan(2 * PAGE_BYTES);
      // The header was synced with the prepared file: a lost first page still holds it.
      const image = bytes.slice();
      image.fill(0, SEGMENT_HEADER_BYTES, PAGE_BYTES);
      const torn = dirWith({ [SEGMENT]: image });
      const opened = openRecording(torn, { fsync: 'always' });
      expect(opened.replayed.records).toEqual([]);
      expect(statSync(join(torn, SEGMENT)).size).toBe(SEGMENT_HEADER_BYTES);
      await opened.wal.append({ again: 1 });
      await opened.wal.close();
      expect(batchRanges(segmentBytes(torn)).map((range) => range.seqs)).toEqual([[1]]);
      expect((await replayOnly(torn)).records).toEqual([{ seq: 1, payload: { again: 1 } }]);

      // A new file's first write (header and batch) cut inside the header: nothing was there.
      const cut = dirWith({ [SEGMENT]: bytes.subarray(0, 7) });
      expect((await replayOnly(cut)).records).toEqual([]);
      expect(statSync(join(cut, SEGMENT)).size).toBe(0);
    },
  );
});

describe('damage is still refused', () => {
  test('zeros where an acknowledged batch was, followed by others, refuse to start', async () => {
    const { bytes, ranges } = await fixture(3);
    for (const victim of [1, 4]) {
      const image = bytes.slice();
      image.fill(0, ranges[victim]!.start, ranges[victim]!.end);
      const dir = dirWith({ [SEGMENT]: image });
      const error = expectCorruption(() => openRecording(dir));
      expect(error.message).toContain(`offset ${ranges[victim]!.start}`);
      // Refusing does not repair.
      expect(segmentBytes(dir)).toEqual(image);
    }
    // The segment header's page lost under acknowledged batches.
    const headless = bytes.slice();
    headless.fill(0, 0, SEGMENT_HEADER_BYTES + 4);
    expectCorruption(() => openRecording(dirWith({ [SEGMENT]: headless })));
  });

  test(
    'a whole frame inside a torn last batch does not count as a valid record after the tear, ' +
      'but a whole batch does',
    () => {
      const frame = (seq: number) => encodeFrame(seq, new TextEncoder().encode(`{"n":${seq}}`));
      const clean = batchedSegment([frame(1), frame(2), frame(3)]);
      const ranges = batchRanges(clean);
      // Batch 2's header zeroed: its frame is whole, batch 3 after it is whole too: damage.
      const image = clean.slice();
      image.fill(0, ranges[1]!.start, ranges[1]!.start + 16);
      expectCorruption(() => openRecording(dirWith({ [SEGMENT]: image })));
      // Batch 3's header zeroed: only a frame follows the tear, no batch: a torn tail.
      const tail = clean.slice();
      tail.fill(0, ranges[2]!.start, ranges[2]!.start + 16);
      const dir = dirWith({ [SEGMENT]: tail });
      const { replayed } = openRecording(dir);
      expect(replayed.records.map((record) => record.seq)).toEqual([1, 2]);
      expect(statSync(join(dir, SEGMENT)).size).toBe(ranges[2]!.start);
    },
  );

  test('a segment that is not the last may end in zeros, but not in anything else', async () => {
    const frame = (seq: number) => encodeFrame(seq, new TextEncoder().encode(`{"n":${seq}}`));
    const first = batchedSegment([frame(1), frame(2)]);
    const second = batchedSegment([frame(3)]);
    const padded = new Uint8Array(first.length + 10_000);
    padded.set(first);
    const ok = dirWith({ [SEGMENT]: padded, 'segment-000000000002.wal': second });
    expect((await replayOnly(ok)).records.map((record) => record.seq)).toEqual([1, 2, 3]);
    expect(segmentBytes(ok)).toEqual(padded);

    padded[first.length + 5_000] = 1;
    const bad = dirWith({ [SEGMENT]: padded, 'segment-000000000002.wal': second });
    expect(expectCorruption(() => openRecording(bad)).message).toContain(join(bad, SEGMENT));
  });

  test('a batch whose checksum holds but whose frames do not is refused, not cut', () => {
    const frame = encodeFrame(1, new TextEncoder().encode('{"n":1}'));
    frame[20] = frame[20]! ^ 0x01; // the frame's own checksum no longer matches
    const dir = dirWith({ [SEGMENT]: batchedSegment([frame]) });
    expect(expectCorruption(() => openRecording(dir)).message).toContain('inside a whole batch');
  });
});

describe('policies that sync later', () => {
  test('under interval or off, no batch goes into the zeros an always run prepared', async () => {
    for (const fsync of ['interval', 'off'] as const) {
      const dir = dirs.make();
      const a = openRecording(dir, { fsync: 'always' });
      await a.wal.prepared();
      for (let i = 0; i < 3; i++) await a.wal.append(payloadOf(i, [300]));
      await a.wal.close();
      // Several unsynced batches: in zeros their pages could reach the disk in any order.
      const b = openRecording(dir, { fsync, fsyncIntervalMs: 60_000 });
      for (let i = 3; i < 6; i++) await b.wal.append(payloadOf(i, [3000]));
      await b.wal.close();
      const bytes = segmentBytes(dir, SECOND);
      expect(batchRanges(bytes).flatMap((range) => range.seqs)).toEqual([1, 2, 3, 4, 5, 6]);
      expect({ fsync, size: bytes.length }).toEqual({ fsync, size: dataEnd(bytes) });
    }
  });
});

describe('damage at the edges', () => {
  test(
    'damage before a batch that straddles the snapshot seq is refused, not cut off with the ' +
      'records after the snapshot',
    async () => {
      const src = dirs.make();
      const log = openRecording(src, { fsync: 'off' });
      for (let i = 0; i < 10; i++) await log.wal.append({ n: i + 1 });
      await log.wal.snapshot({ json: [Buffer.from('{"snap":true}')], blobs: [] }, 8);
      await log.wal.close();
      const frame = (seq: number) => encodeFrame(seq, new TextEncoder().encode(`{"n":${seq}}`));
      // Batches [1-3], [4-6], [7-10]: the last holds 9 and 10, after the snapshot.
      const segment = (batches: number[][]) =>
        segmentOfBatches(batches.map((seqs) => seqs.map(frame)));
      const clean = segment([
        [1, 2, 3],
        [4, 5, 6],
        [7, 8, 9, 10],
      ]);
      const damaged = clean.slice();
      damaged[batchRanges(clean)[1]!.start + 40]! ^= 0xff;
      const dir = dirWith({ [SEGMENT]: damaged });
      copyFileSync(join(src, 'snapshot.json'), join(dir, 'snapshot.json'));
      expectCorruption(() => openRecording(dir));
      expect(segmentBytes(dir)).toEqual(damaged);
    },
  );

  test("an older gateway's segment with its start zeroed is refused, not emptied", async () => {
    const src = dirs.make();
    const log = openRecording(src, { fsync: 'off' });
    for (let i = 0; i < 6; i++) await log.wal.append(payloadOf(i));
    await log.wal.close();
    const damaged = bareFramesOf(segmentBytes(src));
    damaged.fill(0, 0, 4); // the first frame's length word
    const dir = dirWith({ [SEGMENT]: damaged });
    expectCorruption(() => openRecording(dir));
    expect(segmentBytes(dir)).toEqual(damaged);
  });

  test('a log whose roll failed twice closes cleanly and releases every descriptor', async () => {
    const fdsBefore = logFds();
    const dir = dirs.make();
    const { wal } = openRecording(dir, { fsync: 'always', segmentBytes: 1 });
    // The next segment cannot be opened (EISDIR).
    mkdirSync(join(dir, SECOND));
    const first = wal.append({ n: 1 });
    // Appended while the first batch's fsync runs: pending when the roll after it fails.
    await new Promise((resolve) => setImmediate(resolve));
    const second = wal.append({ n: 2 });
    const outcomes = await Promise.allSettled([first, second]);
    expect(outcomes.map((o) => o.status)).toEqual(['fulfilled', 'rejected']);
    expect(wal.failure).not.toBeNull();
    await wal.close();
    expect(logFds()).toBe(fdsBefore);
  });
});

describe('prepared segments', () => {
  test(
    'under load the log rolls onto prepared files of growing size; nothing is lost and no ' +
      'descriptor leaks',
    async () => {
      const fdsBefore = logFds();
      const dir = dirs.make();
      const { wal } = openRecording(dir, { fsync: 'always' });
      const payload = (i: number) => payloadOf(i, [900, 2_000, 50]);
      let n = 0;
      while (n < 3_500) {
        const batch = Array.from({ length: 25 }, () => wal.append(payload(n++)));
        await Promise.all(batch);
      }
      await wal.close();
      // Each prepared segment twice the last (1, 2 MiB, …); a batch may run past the zeros before
      // the roll, never short of them. (Measured before a replay under `off` cuts the last.)
      const sizes = segmentFiles(dir).map((name) => statSync(join(dir, name)).size);
      expect(sizes.length).toBeGreaterThanOrEqual(3);
      for (let k = 1; k < sizes.length; k++)
        expect(sizes[k]).toBeGreaterThanOrEqual(2 ** (k - 1) * 1024 * 1024);
      expect((await replayOnly(dir)).records).toEqual(expectedRecords(1, n, payload));
      // Open and closed right away, with a preparation in flight each time.
      for (let i = 0; i < 10; i++)
        await openRecording(dirs.make(), { fsync: 'always' }).wal.close();
      expect(logFds()).toBe(fdsBefore);
    },
  );

  test('records larger than the zeros left grow the segment; small ones roll too', async () => {
    const dir = dirs.make();
    // 200 KiB segments, prepared at that size: records of up to 150 KB run past the zeros.
    const options = { fsync: 'always' as const, segmentBytes: 200 * 1024 };
    const { wal } = openRecording(dir, options);
    const preparedBytes = () => statSync(join(dir, PREPARED_SEGMENT_NAME)).size;
    // The zeros held ahead are bounded by the segment size, the first and every later one.
    await wal.prepared();
    expect(preparedBytes()).toBe(200 * 1024);
    const sizes = [100_000, 10, 3_000, 70_000, 1, 500, 150_000, 20_000];
    let n = 0;
    for (let round = 0; round < 12; round++) {
      const batch = Array.from({ length: 1 + (round % 4) }, () =>
        wal.append(payloadOf(n++, sizes)),
      );
      await Promise.all(batch);
      if (round % 3 === 0) await wal.prepared();
    }
    await wal.close();
    expect(preparedBytes()).toBeLessThanOrEqual(200 * 1024);
    expect(segmentFiles(dir).length).toBeGreaterThanOrEqual(4);
    expect((await replayOnly(dir, options)).records).toEqual(
      expectedRecords(1, n, (i) => payloadOf(i, sizes)),
    );
  });

  test('a prepared segment a crash left behind is removed on open, and made again', async () => {
    for (const fsync of ['always', 'off'] as const) {
      const dir = dirs.make();
      const leftover = join(dir, PREPARED_SEGMENT_NAME);
      writeFileSync(leftover, 'half written, not zeros');
      const { wal, replayed } = openRecording(dir, { fsync });
      expect(replayed.records).toEqual([]);
      await wal.prepared();
      await wal.append({ n: 1 });
      await wal.close();
      // Under always a new one, the header and zeros; under off none.
      if (fsync === 'off') expect(existsSync(leftover)).toBe(false);
      else {
        const made = new Uint8Array(readFileSync(leftover));
        expect(made.subarray(0, SEGMENT_HEADER_BYTES)).toEqual(SEGMENT_HEADER);
        expect(zerosFrom(made, SEGMENT_HEADER_BYTES)).toBe(true);
      }
      expect((await replayOnly(dir, { fsync })).records).toEqual([{ seq: 1, payload: { n: 1 } }]);
    }
  });
});
