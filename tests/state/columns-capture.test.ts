// A snapshot reads the record columns from the live table while requests go on finishing: what it
// reads must be the table as it was when captured, whatever is added, evicted or grown meanwhile
// (state/columns-capture.ts).
import { expect, test } from 'bun:test';
import type { RequestRecord } from '../../src/state/records.ts';
import { RecordTable } from '../../src/state/records.ts';
import type { SnapshotSource } from '../../src/wal/log.ts';

const NOW_MS = 1_800_000_000_000;
const TTL_MS = 3_600_000;

function randomFrom(seed: number): (n: number) => number {
  let state = seed >>> 0;
  return (n) => {
    state = (Math.imul(state, 1_103_515_245) + 12_345) >>> 0;
    return Math.floor((state / 2 ** 32) * n);
  };
}

let nextId = 0;
function record(random: (n: number) => number): RequestRecord {
  const id = random(20) === 0 ? `long-id-${'x'.repeat(50)}-${nextId++}` : `chatcmpl-${nextId++}`;
  const several = random(10) === 0;
  return {
    id,
    keyId: `key_${random(4)}`,
    service: random(5) === 0 ? 'decision' : 'chat',
    model: `model_0${random(3)}`,
    stream: random(2) === 0,
    status: random(6) === 0 ? 'error' : 'completed',
    createdAtMs: NOW_MS - random(10_000),
    finishedAtMs: NOW_MS - random(1_000),
    // Now and then counts and a latency the Int32 columns cannot hold: they go aside, by position.
    hold: {
      credits_micro: random(1_000_000),
      tokens: random(15) === 0 ? 2 ** 31 + random(9) : random(5_000),
    },
    charge: { credits_micro: random(1_000_000), tokens: random(5_000) },
    budgetHoldMicro: random(100),
    usage:
      random(4) === 0
        ? null
        : {
            prompt_tokens: random(900),
            completion_tokens: random(900),
            total_tokens: random(2_000),
          },
    errorCode: random(6) === 0 ? 'upstream_timeout' : null,
    httpStatus: random(7) === 0 ? null : 200 + random(300),
    answers: random(8) === 0 ? { q: random(100) } : null,
    attempts: several
      ? [
          { provider: 'a', upstream_model: 'up', outcome: 'error', error_code: 'x', latency_ms: 3 },
          { provider: 'b', upstream_model: 'up', outcome: 'ok', error_code: null, latency_ms: 4 },
        ]
      : [
          {
            provider: 'fake',
            upstream_model: `up${random(3)}`,
            outcome: 'ok',
            error_code: null,
            latency_ms: random(15) === 0 ? 2 ** 31 + random(9) : random(300),
          },
        ],
    idempotencyKey: null,
  };
}

/** Reads `sources` in pieces of random sizes, in a random interleaving, calling `between` often. */
function readInPieces(
  sources: SnapshotSource[],
  random: (n: number) => number,
  between: () => void,
): Uint8Array[] {
  const out = sources.map((source) => new Uint8Array(source.byteLength));
  const at = sources.map(() => 0);
  for (;;) {
    const open = sources.map((_, i) => i).filter((i) => at[i]! < sources[i]!.byteLength);
    if (open.length === 0) return out;
    const i = open[random(open.length)]!;
    // At least the widest row (40 bytes), at most a few hundred rows.
    const piece = new Uint8Array(40 + random(4_000));
    const read = sources[i]!.read(piece);
    expect(read).toBeGreaterThan(0);
    out[i]!.set(piece.subarray(0, read), at[i]!);
    at[i]! += read;
    between();
  }
}

test('a capture reads the table as it was, through evictions, per-key bounds and growth', () => {
  for (let seed = 1; seed <= 12; seed++) {
    const random = randomFrom(seed);
    // Above 1,024 records the columns grow (they start at 1,024 slots): some seeds grow them
    // while a capture is read, some fill the table first; a per-key bound on half of them.
    const capacity = 3_000;
    const table = new RecordTable(capacity, TTL_MS, seed % 2 === 0 ? 900 : capacity);
    const before = seed % 3 === 0 ? 4_000 : 700 + random(400);
    for (let i = 0; i < before; i++) table.add(record(random));
    const expected = table.serializeColumns();
    const atCapture = [...table.values(NOW_MS)];
    const capture = table.captureColumns();
    // A second snapshot asked for while the first is written holds its own moment.
    let second: { expected: ReturnType<RecordTable['serializeColumns']> } | null = null;
    let secondCapture: ReturnType<RecordTable['captureColumns']> | null = null;
    const blobs = readInPieces(capture.sources, random, () => {
      for (let n = random(40); n > 0; n--) table.add(record(random));
      if (secondCapture === null && random(30) === 0) {
        second = { expected: table.serializeColumns() };
        secondCapture = table.captureColumns();
      }
    });
    capture.release();
    expect(JSON.parse(JSON.stringify(capture.meta))).toEqual(
      JSON.parse(JSON.stringify(expected.meta)),
    );
    expect(blobs).toEqual(expected.blobs);
    if (secondCapture !== null && second !== null) {
      const later = secondCapture as ReturnType<RecordTable['captureColumns']>;
      const again = readInPieces(later.sources, random, () => {
        for (let n = random(40); n > 0; n--) table.add(record(random));
      });
      later.release();
      expect(again).toEqual((second as { expected: { blobs: Uint8Array[] } }).expected.blobs);
    }
    // What was captured restores to the records of that moment.
    const copy = new RecordTable(capacity, TTL_MS, seed % 2 === 0 ? 900 : capacity);
    copy.restoreColumns(JSON.parse(JSON.stringify(capture.meta)), blobs);
    const reference = new RecordTable(capacity, TTL_MS, seed % 2 === 0 ? 900 : capacity);
    reference.restoreColumns(JSON.parse(JSON.stringify(expected.meta)), expected.blobs);
    expect([...copy.values(NOW_MS)]).toEqual([...reference.values(NOW_MS)]);
    // And to the table's own records then, read by slot, not by the capture's positions.
    expect([...copy.values(NOW_MS)]).toEqual(atCapture);
  }
});

test('a released capture keeps nothing more, and an empty table captures as empty', () => {
  const random = randomFrom(99);
  const empty = new RecordTable(10, TTL_MS).captureColumns();
  expect(empty.sources.map((source) => source.byteLength)).toEqual([0, 0, 0, 0, 0, 0]);
  empty.release();
  const table = new RecordTable(100, TTL_MS);
  for (let i = 0; i < 100; i++) table.add(record(random));
  const capture = table.captureColumns();
  capture.release();
  // Read after its release, a capture no longer sees the rows it held: the table did not keep them.
  const expected = table.serializeColumns();
  for (let i = 0; i < 100; i++) table.add(record(random));
  const piece = new Uint8Array(1 << 20);
  const numbers = piece.subarray(0, capture.sources[0]!.read(piece)).slice();
  expect(numbers).not.toEqual(expected.blobs[0]!);
});

test('a read stops after a bounded number of runs when eviction scatters the age order', () => {
  const random = randomFrom(7);
  // Keys at their own bound, finishing at random: each evicts its own oldest, so slots are taken
  // back out of age order.
  const table = new RecordTable(20_000, TTL_MS, 7_000);
  for (let i = 0; i < 60_000; i++) table.add({ ...record(random), keyId: `key_${random(3)}` });
  const { sources, release } = table.captureColumns();
  const idLengths = sources[4]!;
  const piece = new Uint8Array(1 << 20);
  const first = idLengths.read(piece);
  release();
  // One byte per row: a 1 MiB piece would take every row; scattered, a read stops at 4,096 runs.
  expect(first).toBeGreaterThan(0);
  expect(first).toBeLessThan(idLengths.byteLength);
  expect(first).toBeLessThanOrEqual(4_096 * 2);
});

test('a flood while a snapshot is written keeps at most one row per captured record', () => {
  const random = randomFrom(11);
  const table = new RecordTable(2_000, TTL_MS);
  for (let i = 0; i < 2_000; i++) table.add(record(random));
  const { sources, release } = table.captureColumns();
  // The capture (private): its kept rows are what a flood could grow.
  const capture = (table as unknown as { captures: Array<{ keptCount: number; kept: Uint8Array }> })
    .captures[0]!;
  // Ten times the table, every slot overwritten ten times over, before a byte is read.
  for (let i = 0; i < 20_000; i++) table.add(record(random));
  expect(capture.keptCount).toBe(2_000);
  // 134 bytes a row: the buffer grows to the captured records' rows and no further.
  expect(capture.kept.length).toBeLessThanOrEqual(2_000 * 134);
  expect(sources.reduce((sum, source) => sum + readAll(source).length, 0)).toBeGreaterThan(0);
  release();
});

function readAll(source: SnapshotSource): Uint8Array {
  const out = new Uint8Array(source.byteLength);
  for (let at = 0; at < out.length; ) at += source.read(out.subarray(at));
  return out;
}
