// WAL framing: [u32 flags and payload length][u32 checksum of seq+payload][u64 seq][payload],
// little-endian.
//
// The checksum is CRC-32 (zlib's) when the length word's top bit is set, as every frame written now
// is: Bun computes it natively, ~80 ns for a record, where the CRC-32C in JS that frames carried
// before took 0.5–2 µs, about 1 µs of every request (two records; bench/README, issue 15). Frames
// without the bit, written before, still read with CRC-32C: a log written by an older gateway
// replays, and the segment it appends to may hold both. (An older gateway cannot read the new
// frames: README, "Operating".) What the trade costs: at a record's few hundred bytes CRC-32 is
// sure to catch any 3 flipped bits and CRC-32C any 5; both catch every burst of up to 32 bits and
// all but 2^-32 of random damage. A frame's checksum is there for a torn write, which both catch.
import { crc32c } from './crc32c.ts';

export const FRAME_HEADER_BYTES = 16;
/** A larger length can only be garbage: no commit carries this much. */
export const FRAME_PAYLOAD_BYTES_MAX = 16 * 1024 * 1024;
/** In the length word: the checksum is CRC-32, not CRC-32C. */
const CRC32_FLAG = 0x8000_0000;

export function encodeFrame(seq: number, payload: Uint8Array): Uint8Array {
  const frame = new Uint8Array(FRAME_HEADER_BYTES + payload.length);
  frame.set(payload, FRAME_HEADER_BYTES);
  sealFrame(frame, 0, seq, payload.length);
  return frame;
}

/**
 * The most bytes the frame of `text` can take: UTF-8 needs at most 3 bytes per UTF-16 code unit.
 */
export function textFrameBytesMax(text: string): number {
  return FRAME_HEADER_BYTES + text.length * 3;
}

/**
 * Writes the frame of a JSON text into `out` at `offset`, encoding the text straight into place (no
 * intermediate copy: this runs for every commit), and returns the frame's length. `out` must have
 * textFrameBytesMax(text) bytes from `offset`.
 */
export function writeTextFrame(out: Buffer, offset: number, seq: number, text: string): number {
  const written = out.write(text, offset + FRAME_HEADER_BYTES, 'utf8');
  sealFrame(out, offset, seq, written);
  return FRAME_HEADER_BYTES + written;
}

/** The frame of a JSON text as its own array (tests, tools). */
export function encodeTextFrame(seq: number, text: string): Uint8Array {
  const out = Buffer.alloc(textFrameBytesMax(text));
  return new Uint8Array(out.subarray(0, writeTextFrame(out, 0, seq, text)));
}

/**
 * Writes the header of the frame at `offset` whose payload is in place; byte by byte, without a
 * DataView.
 */
function sealFrame(frame: Uint8Array, offset: number, seq: number, payloadBytes: number): void {
  writeU32(frame, offset, CRC32_FLAG + payloadBytes);
  writeU32(frame, offset + 8, seq % 0x1_0000_0000);
  writeU32(frame, offset + 12, Math.floor(seq / 0x1_0000_0000));
  const checked = frame.subarray(offset + 8, offset + FRAME_HEADER_BYTES + payloadBytes);
  writeU32(frame, offset + 4, Bun.hash.crc32(checked));
}

function writeU32(bytes: Uint8Array, offset: number, value: number): void {
  bytes[offset] = value & 0xff;
  bytes[offset + 1] = (value >>> 8) & 0xff;
  bytes[offset + 2] = (value >>> 16) & 0xff;
  bytes[offset + 3] = (value >>> 24) & 0xff;
}

export type DecodedFrame =
  | { kind: 'ok'; seq: number; payload: Uint8Array; nextOffset: number }
  | { kind: 'incomplete' }
  | { kind: 'corrupt'; why: string };

/** Reads the frame at `offset` of `bytes`; never throws on bad input. */
export function decodeFrame(bytes: Uint8Array, offset: number): DecodedFrame {
  if (bytes.length - offset < FRAME_HEADER_BYTES) return { kind: 'incomplete' };
  const view = new DataView(bytes.buffer, bytes.byteOffset + offset, FRAME_HEADER_BYTES);
  const word = view.getUint32(0, true);
  const crc32 = word >= CRC32_FLAG;
  const length = crc32 ? word - CRC32_FLAG : word;
  if (length === 0 || length > FRAME_PAYLOAD_BYTES_MAX)
    return { kind: 'corrupt', why: `implausible length ${length}` };
  const end = offset + FRAME_HEADER_BYTES + length;
  if (end > bytes.length) return { kind: 'incomplete' };
  const expected = view.getUint32(4, true);
  const actual = crc32
    ? Bun.hash.crc32(bytes.subarray(offset + 8, end))
    : crc32c(bytes, offset + 8, end);
  if (actual !== expected) return { kind: 'corrupt', why: 'checksum mismatch' };
  const seq = view.getUint32(8, true) + view.getUint32(12, true) * 0x1_0000_0000;
  return {
    kind: 'ok',
    seq,
    payload: bytes.subarray(offset + FRAME_HEADER_BYTES, end),
    nextOffset: end,
  };
}

// Batch framing. A segment written since the segment header was introduced starts with
// SEGMENT_HEADER and holds batches: [u32 BATCH_TAG][u32 checksum][u32 frames' bytes][u32 frame
// count][frames], the checksum CRC-32 of everything after it. A batch is what one write() and one
// fsync carry. Under fsync `always` the segment ahead of the writer is zero-filled in advance (no
// journal commit per fsync: bench/README, issue 15), and in such a file the pages of the one batch
// not yet synced can reach the disk in any order after a power cut: some of its frames whole, some
// zeros. Its own checksum tells such a batch from damage to an acknowledged one; a frame's cannot.

/** The first bytes of a segment of batches. Its first word is no frame's (implausible length). */
export const SEGMENT_HEADER = new TextEncoder().encode('tollgate-wal-b1\n');
export const SEGMENT_HEADER_BYTES = SEGMENT_HEADER.length;
export const BATCH_HEADER_BYTES = 16;
/** 'TGB1', little-endian: as a frame's length word, implausible. */
const BATCH_TAG = 0x3142_4754;
/** A batch over this can only be garbage; the writer splits none (see group-commit.ts). */
export const BATCH_BYTES_MAX = 1024 * 1024 * 1024;

/** Seals the batch at `offset` whose `frameCount` frames take `framesBytes` after its header. */
export function sealBatch(
  out: Uint8Array,
  offset: number,
  framesBytes: number,
  frameCount: number,
): number {
  writeU32(out, offset, BATCH_TAG);
  writeU32(out, offset + 8, framesBytes);
  writeU32(out, offset + 12, frameCount);
  const end = offset + BATCH_HEADER_BYTES + framesBytes;
  writeU32(out, offset + 4, Bun.hash.crc32(out.subarray(offset + 8, end)));
  return end;
}

export type DecodedBatch =
  | { kind: 'ok'; framesStart: number; frameCount: number; nextOffset: number }
  | { kind: 'incomplete' }
  | { kind: 'corrupt'; why: string };

const NO_BATCH: DecodedBatch = { kind: 'corrupt', why: 'no batch header' };

/** Reads the batch header at `offset` and checks the batch; never throws on bad input. */
export function decodeBatch(bytes: Uint8Array, offset: number): DecodedBatch {
  if (bytes.length - offset < BATCH_HEADER_BYTES) return { kind: 'incomplete' };
  // The tag first, byte by byte: replay tries every offset of a damaged segment.
  if (
    bytes[offset] !== (BATCH_TAG & 0xff) ||
    bytes[offset + 1] !== ((BATCH_TAG >>> 8) & 0xff) ||
    bytes[offset + 2] !== ((BATCH_TAG >>> 16) & 0xff) ||
    bytes[offset + 3] !== BATCH_TAG >>> 24
  )
    return NO_BATCH;
  const view = new DataView(bytes.buffer, bytes.byteOffset + offset, BATCH_HEADER_BYTES);
  const framesBytes = view.getUint32(8, true);
  const frameCount = view.getUint32(12, true);
  if (
    framesBytes > BATCH_BYTES_MAX ||
    frameCount === 0 ||
    frameCount * FRAME_HEADER_BYTES > framesBytes
  )
    return {
      kind: 'corrupt',
      why: `implausible batch of ${frameCount} frames in ${framesBytes} bytes`,
    };
  const end = offset + BATCH_HEADER_BYTES + framesBytes;
  if (end > bytes.length) return { kind: 'incomplete' };
  if (Bun.hash.crc32(bytes.subarray(offset + 8, end)) !== view.getUint32(4, true))
    return { kind: 'corrupt', why: 'batch checksum mismatch' };
  return { kind: 'ok', framesStart: offset + BATCH_HEADER_BYTES, frameCount, nextOffset: end };
}
