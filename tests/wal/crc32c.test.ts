// CRC-32C: published check values and the slicing-by-4 path against a plain bitwise reference;
// frame encoding.
import { describe, expect, test } from 'bun:test';
import { crc32c } from '../../src/wal/crc32c.ts';
import { decodeFrame, encodeFrame, encodeTextFrame } from '../../src/wal/frame.ts';

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
