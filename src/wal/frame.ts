// WAL framing: [u32 payload length][u32 CRC-32C of seq+payload][u64 seq][payload], little-endian.
import { crc32c } from './crc32c.ts';

export const FRAME_HEADER_BYTES = 16;
/** A larger length can only be garbage: no commit carries this much. */
export const FRAME_PAYLOAD_BYTES_MAX = 16 * 1024 * 1024;

export function encodeFrame(seq: number, payload: Uint8Array): Uint8Array {
  const frame = new Uint8Array(FRAME_HEADER_BYTES + payload.length);
  const view = new DataView(frame.buffer);
  view.setUint32(0, payload.length, true);
  view.setUint32(8, seq % 0x1_0000_0000, true);
  view.setUint32(12, Math.floor(seq / 0x1_0000_0000), true);
  frame.set(payload, FRAME_HEADER_BYTES);
  view.setUint32(4, crc32c(frame, 8), true);
  return frame;
}

export type DecodedFrame =
  | { kind: 'ok'; seq: number; payload: Uint8Array; nextOffset: number }
  | { kind: 'incomplete' }
  | { kind: 'corrupt'; why: string };

/** Reads the frame at `offset` of `bytes`; never throws on bad input. */
export function decodeFrame(bytes: Uint8Array, offset: number): DecodedFrame {
  if (bytes.length - offset < FRAME_HEADER_BYTES) return { kind: 'incomplete' };
  const view = new DataView(bytes.buffer, bytes.byteOffset + offset, FRAME_HEADER_BYTES);
  const length = view.getUint32(0, true);
  if (length === 0 || length > FRAME_PAYLOAD_BYTES_MAX) return { kind: 'corrupt', why: `implausible length ${length}` };
  const end = offset + FRAME_HEADER_BYTES + length;
  if (end > bytes.length) return { kind: 'incomplete' };
  const expected = view.getUint32(4, true);
  if (crc32c(bytes, offset + 8, end) !== expected) return { kind: 'corrupt', why: 'checksum mismatch' };
  const seq = view.getUint32(8, true) + view.getUint32(12, true) * 0x1_0000_0000;
  return { kind: 'ok', seq, payload: bytes.subarray(offset + FRAME_HEADER_BYTES, end), nextOffset: end };
}
