// CRC-32C: published check values and the slicing-by-8 path against a plain bitwise reference;
// frame encoding: frames carry CRC-32 (flagged), frames written before carry CRC-32C, and a log
// holding both replays whole.
import { afterAll, describe, expect, test } from 'bun:test';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { crc32c } from '../../src/wal/crc32c.ts';
import {
  decodeFrame,
  encodeFrame,
  encodeTextFrame,
  FRAME_HEADER_BYTES,
} from '../../src/wal/frame.ts';
import { WalCorruptionError } from '../../src/wal/log.ts';
import { openRecording, payloadOf, replayOnly, segmentFiles, tempDirs } from './support.ts';

const dirs = tempDirs('tollgate-wal-crc-');
afterAll(() => dirs.cleanup());

const ENCODER = new TextEncoder();

/** The textbook bit-at-a-time CRC-32C (reflected polynomial 0x82f63b78): slow, obviously right. */
function crc32cBitwise(bytes: Uint8Array, start = 0, end = bytes.length, seed = 0): number {
  let crc = ~seed >>> 0;
  for (let i = start; i < end; i++) {
    crc ^= bytes[i]!;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0x82f63b78 : crc >>> 1;
  }
  return ~crc >>> 0;
}

/** The textbook bit-at-a-time CRC-32 (zlib's, reflected polynomial 0xedb88320). */
function crc32Bitwise(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const byte of bytes) {
    crc ^= byte;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0xedb88320 : crc >>> 1;
  }
  return ~crc >>> 0;
}

function u32(bytes: Uint8Array, offset: number): number {
  return new DataView(bytes.buffer, bytes.byteOffset + offset, 4).getUint32(0, true);
}

/** A frame as gateways before the CRC-32 flag wrote it: plain length, CRC-32C. */
function legacyFrame(seq: number, payload: Uint8Array): Uint8Array {
  const frame = new Uint8Array(FRAME_HEADER_BYTES + payload.length);
  const view = new DataView(frame.buffer);
  view.setUint32(0, payload.length, true);
  view.setUint32(8, seq % 2 ** 32, true);
  view.setUint32(12, Math.floor(seq / 2 ** 32), true);
  frame.set(payload, FRAME_HEADER_BYTES);
  view.setUint32(4, crc32cBitwise(frame, 8), true);
  return frame;
}

/** A seeded xorshift32 so a failure can be reproduced from its seed. */
function xorshift32(seed: number): () => number {
  let state = seed >>> 0 || 1;
  return () => {
    state ^= state << 13;
    state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5;
    state >>>= 0;
    return state;
  };
}

describe('crc32c', () => {
  test('known vectors', () => {
    expect(crc32c(ENCODER.encode('123456789'))).toBe(0xe3069283);
    expect(crc32c(new Uint8Array(0))).toBe(0);
    expect(crc32c(new Uint8Array(32))).toBe(0x8a9136aa);
    // RFC 3720 (iSCSI) B.4: 32 bytes of 0xff.
    expect(crc32c(new Uint8Array(32).fill(0xff))).toBe(0x62a8ab43);
  });

  test('the reference itself matches the check value', () => {
    expect(crc32cBitwise(ENCODER.encode('123456789'))).toBe(0xe3069283);
  });

  test('slicing path equals the bytewise reference on random lengths and offsets', () => {
    const next = xorshift32(0x5eed);
    const buffer = new Uint8Array(4096 + 64);
    for (let i = 0; i < buffer.length; i++) buffer[i] = next() & 0xff;
    for (let round = 0; round < 2000; round++) {
      const start = next() % 64;
      const length = round < 64 ? round : next() % 4096;
      const end = start + length;
      expect({ start, end, crc: crc32c(buffer, start, end) }).toEqual({
        start,
        end,
        crc: crc32cBitwise(buffer, start, end),
      });
    }
  });

  test('a subarray with a non-zero byteOffset checksums its own bytes', () => {
    const next = xorshift32(7);
    const backing = new Uint8Array(1000);
    for (let i = 0; i < backing.length; i++) backing[i] = next() & 0xff;
    for (const offset of [1, 2, 3, 5, 17]) {
      const view = backing.subarray(offset, offset + 333);
      expect(crc32c(view)).toBe(crc32cBitwise(backing, offset, offset + 333));
    }
  });

  test('chaining with the previous result as seed equals one pass', () => {
    const next = xorshift32(99);
    const bytes = new Uint8Array(777);
    for (let i = 0; i < bytes.length; i++) bytes[i] = next() & 0xff;
    for (const split of [0, 1, 3, 4, 5, 100, 776, 777]) {
      const first = crc32c(bytes, 0, split);
      expect(crc32c(bytes, split, bytes.length, first)).toBe(crc32c(bytes));
    }
    expect(crc32c(bytes)).toBe(crc32cBitwise(bytes));
  });

  test('any single flipped bit changes the checksum', () => {
    const bytes = ENCODER.encode('the quick brown fox jumps over the lazy dog');
    const clean = crc32c(bytes);
    for (let i = 0; i < bytes.length; i++) {
      for (let bit = 0; bit < 8; bit++) {
        bytes[i]! ^= 1 << bit;
        expect(crc32c(bytes)).not.toBe(clean);
        bytes[i]! ^= 1 << bit;
      }
    }
  });
});

describe('frames', () => {
  test(
    'a text frame is byte for byte the frame of its UTF-8 bytes, and decodes back (multi-byte ' +
      'text, seq over 2^32)',
    () => {
      for (const [seq, text] of [
        [1, '{"a":1}'],
        [2 ** 32 + 7, '{"name":"Zoë ✓ 日本 🙂"}'],
      ] as const) {
        const frame = encodeTextFrame(seq, text);
        expect(frame).toEqual(encodeFrame(seq, ENCODER.encode(text)));
        const decoded = decodeFrame(frame, 0);
        expect(decoded.kind).toBe('ok');
        if (decoded.kind !== 'ok') continue;
        expect(decoded.seq).toBe(seq);
        expect(new TextDecoder().decode(decoded.payload)).toBe(text);
      }
    },
  );
});

describe('frame checksums', () => {
  test('a frame carries CRC-32 of its seq and payload, flagged in its length word', () => {
    const payload = ENCODER.encode('{"check":"123456789"}');
    const frame = encodeFrame(2 ** 32 + 5, payload);
    expect(u32(frame, 0)).toBe(0x8000_0000 + payload.length);
    expect(u32(frame, 4)).toBe(crc32Bitwise(frame.subarray(8)));
    expect(crc32Bitwise(ENCODER.encode('123456789'))).toBe(0xcbf43926);
  });

  test('a frame written before the flag (CRC-32C) still decodes; damage is caught in both', () => {
    const payload = ENCODER.encode('{"old":true}');
    for (const frame of [legacyFrame(9, payload), encodeFrame(9, payload)]) {
      const decoded = decodeFrame(frame, 0);
      expect(decoded.kind).toBe('ok');
      if (decoded.kind === 'ok') expect(decoded.payload).toEqual(payload);
      for (const at of [4, 8, FRAME_HEADER_BYTES, frame.length - 1]) {
        const damaged = frame.slice();
        damaged[at]! ^= 0x01;
        expect(decodeFrame(damaged, 0)).toEqual({ kind: 'corrupt', why: 'checksum mismatch' });
      }
      // The flag flipped: the other algorithm's checksum does not match.
      const flipped = frame.slice();
      flipped[3]! ^= 0x80;
      expect(decodeFrame(flipped, 0)).toEqual({ kind: 'corrupt', why: 'checksum mismatch' });
    }
  });

  test(
    'a segment of bare frames of both kinds (before batches) replays; appends go to a new ' +
      'segment of batches',
    async () => {
      const dir = dirs.make();
      // Gateways before the flag wrote CRC-32C frames; between the flag and batches, a segment
      // they went on appending to held both kinds.
      const bytes = new Uint8Array(
        Buffer.concat([
          ...[0, 1, 2].map((i) => legacyFrame(i + 1, ENCODER.encode(JSON.stringify(payloadOf(i))))),
          ...[3, 4, 5].map((i) => encodeFrame(i + 1, ENCODER.encode(JSON.stringify(payloadOf(i))))),
        ]),
      );
      const name = 'segment-000000000001.wal';
      writeFileSync(join(dir, name), bytes);
      const { wal, replayed } = openRecording(dir, { fsync: 'off' });
      expect(replayed.records.map((record) => record.seq)).toEqual([1, 2, 3, 4, 5, 6]);
      for (let i = 6; i < 9; i++) await wal.append(payloadOf(i));
      await wal.close();
      // The old segment is left as it was: a segment holds one format.
      expect(segmentFiles(dir)).toEqual([name, 'segment-000000000002.wal']);
      expect(new Uint8Array(readFileSync(join(dir, name)))).toEqual(bytes);
      const again = await replayOnly(dir, { fsync: 'off' });
      expect(again.records).toEqual(
        Array.from({ length: 9 }, (_, i) => ({ seq: i + 1, payload: payloadOf(i) })),
      );
      const flags: boolean[] = [];
      for (let offset = 0; offset < bytes.length; ) {
        flags.push(u32(bytes, offset) >= 0x8000_0000);
        const frame = decodeFrame(bytes, offset);
        if (frame.kind !== 'ok') throw new Error(`frame at ${offset}: ${frame.kind}`);
        offset = frame.nextOffset;
      }
      expect(flags).toEqual([false, false, false, true, true, true]);

      // In such a segment a torn last frame is cut off, and damage to any other frame, of either
      // kind, refuses the start.
      const ends: number[] = [];
      for (let offset = 0; offset < bytes.length; ) {
        const frame = decodeFrame(bytes, offset);
        if (frame.kind !== 'ok') throw new Error(`frame at ${offset}: ${frame.kind}`);
        offset = frame.nextOffset;
        ends.push(offset);
      }
      const torn = dirs.make();
      writeFileSync(join(torn, name), bytes.subarray(0, ends[4]! + 20));
      expect((await replayOnly(torn, { fsync: 'off' })).records.map((r) => r.seq)).toEqual([
        1, 2, 3, 4, 5,
      ]);
      for (const frameIndex of [1, 4]) {
        const damaged = dirs.make();
        const copy = bytes.slice();
        copy[ends[frameIndex - 1]! + FRAME_HEADER_BYTES + 2]! ^= 0x01;
        writeFileSync(join(damaged, name), copy);
        expect(() => openRecording(damaged, { fsync: 'off' })).toThrow(WalCorruptionError);
      }
    },
  );
});
