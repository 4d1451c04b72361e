// Snapshot files: written beside the log so that a crash leaves the old one or the whole new one,
// read and verified on open; the segments a durable snapshot covers are removed.
import {
  closeSync,
  fdatasync,
  fstatSync,
  ftruncate,
  readdirSync,
  readFileSync,
  unlinkSync,
  write,
} from 'node:fs';
import { rename, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { assert } from '../util/assert.ts';
import type { Logger } from '../util/log.ts';
import { ignore } from '../util/promise.ts';
import { WalCorruptionError } from './errors.ts';
import type { FdReserve } from './fd-reserve.ts';
import { fsyncAsync, segmentName } from './segment.ts';

const SNAPSHOT_FILE = 'snapshot.json';
/**
 * A snapshot is written and flushed this much at a time. One write and one fsync of tens of MB
 * queue that much behind the disk at once, and every log fsync of the requests in flight waits
 * behind it (measured: 15–20 ms per log fsync during a 25 MB snapshot, 1–2 ms with 1 MiB steps).
 */
const SNAPSHOT_FLUSH_BYTES = 1024 * 1024;

/**
 * Bytes read in pieces as the snapshot is written, from a table that goes on changing (the record
 * columns: see state/columns-capture.ts). `read` copies the next bytes into `into` and returns how
 * many; the pieces add up to `byteLength`.
 */
export interface SnapshotSource {
  readonly byteLength: number;
  read(into: Uint8Array): number;
}

/** Every byte of `blob` in one array (a source read whole). */
export function readWhole(blob: Uint8Array | SnapshotSource): Uint8Array {
  if (blob instanceof Uint8Array) return blob;
  const bytes = new Uint8Array(blob.byteLength);
  let at = 0;
  while (at < bytes.length) {
    const read = blob.read(bytes.subarray(at));
    assert(read > 0, 'a snapshot source ended early');
    at += read;
  }
  return bytes;
}

/**
 * A snapshot's content: the state as JSON (UTF-8, in parts written one after the other), and bytes
 * that travel beside it (the record columns, the usage history).
 */
export interface SnapshotContent {
  json: Uint8Array[];
  blobs: Array<Uint8Array | SnapshotSource>;
  /**
   * Called once, when the file is written or the snapshot has failed: the sources are read no
   * more.
   */
  written?: () => void;
}

/** A snapshot read back: the seq it was taken at, the parsed state and the bytes beside it. */
export interface LoadedSnapshot {
  seq: number;
  state: unknown;
  blobs: Uint8Array[];
}

function fdatasyncAsync(fd: number): Promise<void> {
  return new Promise((resolve, reject) =>
    fdatasync(fd, (error) => (error ? reject(error) : resolve())),
  );
}

/** Writes `length` bytes of `bytes` from `offset`, at `position` (null: the file's offset). */
function writeAsync(
  fd: number,
  bytes: Uint8Array,
  offset: number,
  length: number,
  position: number | null = null,
): Promise<number> {
  return new Promise((resolve, reject) =>
    write(fd, bytes, offset, length, position, (error, written) =>
      error ? reject(error) : resolve(written),
    ),
  );
}

/**
 * The CRC-32 of a format 2 header's fields, the seed of the body's: a changed `seq` must not pass.
 */
function snapshotHeaderCrc(seq: number, jsonBytes: number, blobBytes: readonly number[]): number {
  return Bun.hash.crc32(`${seq} ${jsonBytes} ${blobBytes.join(',')}`);
}

/** The snapshot in `dir`, or null when there is none. */
export function readSnapshotFile(dir: string): LoadedSnapshot | null {
  let bytes: Buffer;
  try {
    bytes = readFileSync(join(dir, SNAPSHOT_FILE));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') throw error;
    return null;
  }
  return readSnapshot(bytes, join(dir, SNAPSHOT_FILE));
}

/**
 * Reads a snapshot file, format 2; a damaged one is a WalCorruptionError (starting would lose
 * facts), and so is any other format (format 1 was written only by unreleased builds).
 */
function readSnapshot(bytes: Buffer, path: string): LoadedSnapshot {
  const corrupt = (why: string) => new WalCorruptionError(`${path}: ${why}; refusing to start`);
  const newline = bytes.indexOf(10);
  let header: {
    format?: unknown;
    seq?: unknown;
    json_bytes?: unknown;
    blob_bytes?: unknown;
    crc32?: unknown;
  };
  try {
    // The header is the first line; a file with no line break is read whole, and refused below.
    header = JSON.parse(bytes.toString('utf8', 0, newline === -1 ? bytes.length : newline));
  } catch {
    throw corrupt('not valid JSON');
  }
  if (!Number.isSafeInteger(header.seq)) throw corrupt('unknown format');
  const seq = header.seq as number;
  if (
    header.format !== 2 ||
    !Number.isSafeInteger(header.json_bytes) ||
    !Array.isArray(header.blob_bytes)
  )
    throw corrupt('unknown format');
  const blobBytes = header.blob_bytes as unknown[];
  if (!blobBytes.every((length) => Number.isSafeInteger(length) && (length as number) >= 0))
    throw corrupt('unknown format');
  const bodyStart = newline + 1;
  const total =
    (header.json_bytes as number) +
    (blobBytes as number[]).reduce((sum, length) => sum + length, 0);
  if (bytes.length - bodyStart !== total)
    throw corrupt(`${bytes.length - bodyStart} bytes after the header, expected ${total}`);
  const headerCrc = snapshotHeaderCrc(seq, header.json_bytes as number, blobBytes as number[]);
  if (Bun.hash.crc32(bytes.subarray(bodyStart), headerCrc) !== header.crc32)
    throw corrupt('checksum mismatch');
  let state: unknown;
  const jsonEnd = bodyStart + (header.json_bytes as number);
  try {
    state = JSON.parse(bytes.toString('utf8', bodyStart, jsonEnd));
  } catch {
    throw corrupt('state is not valid JSON');
  }
  const blobs: Uint8Array[] = [];
  let at = jsonEnd;
  for (const length of blobBytes as number[]) {
    blobs.push(bytes.subarray(at, at + length));
    at += length;
  }
  return { seq, state, blobs };
}

/**
 * Snapshot file, format 2: one line of JSON,
 * `{"format":2,"seq","json_bytes","blob_bytes":[...],"crc32"}`, then the state JSON, then the
 * blobs, one after the other. The CRC-32 (IEEE, native) covers the header's fields (`seq` decides
 * which log records replay skips) and all that follows the line.
 *
 * Written so that after a crash it is either the old file or the whole new one, and
 * asynchronously: a snapshot is megabytes, and its write and fsync must not stop the event loop.
 * `reserve` gives the temp file a descriptor when the process has none left; `dirFd` is the log
 * directory's, fsynced so that the rename is durable.
 */
export async function writeSnapshotFile(
  dir: string,
  dirFd: number,
  reserve: FdReserve,
  content: SnapshotContent,
  seq: number,
): Promise<void> {
  const path = join(dir, SNAPSHOT_FILE);
  const jsonBytes = content.json.reduce((sum, part) => sum + part.byteLength, 0);
  const blobBytes = content.blobs.map((blob) => blob.byteLength);
  const headerLine = (crc32: number) =>
    JSON.stringify({ format: 2, seq, json_bytes: jsonBytes, blob_bytes: blobBytes, crc32 });
  // The header comes first but holds the CRC of all that follows, known only once the sources are
  // read: a line as long as the longest header is written first, and the header over it last,
  // padded with spaces (JSON allows them).
  const headerBytes = headerLine(0xffffffff).length + 1;
  // The hardware CRC runs at tens of GB/s: megabytes take well under a millisecond.
  let crc = snapshotHeaderCrc(seq, jsonBytes, blobBytes);
  const temp = `${path}.tmp`;
  const fd = reserve.openSync(temp, 'w', 0o600);
  try {
    let unflushed = 0;
    const put = async (bytes: Uint8Array, length: number, checked: boolean): Promise<void> => {
      if (checked) crc = Bun.hash.crc32(bytes.subarray(0, length), crc);
      let written = 0;
      while (written < length) written += await writeAsync(fd, bytes, written, length - written);
      unflushed += length;
      if (unflushed >= SNAPSHOT_FLUSH_BYTES) {
        await fdatasyncAsync(fd);
        unflushed = 0;
      }
    };
    await put(Buffer.from(`${' '.repeat(headerBytes - 1)}\n`), headerBytes, false);
    let piece: Uint8Array | null = null;
    for (const part of [...content.json, ...content.blobs]) {
      if (part instanceof Uint8Array) {
        for (let at = 0; at < part.byteLength; at += SNAPSHOT_FLUSH_BYTES) {
          const length = Math.min(part.byteLength - at, SNAPSHOT_FLUSH_BYTES);
          await put(part.subarray(at, at + length), length, true);
        }
        continue;
      }
      // Copied a piece at a time into one buffer, each piece written before the next is read.
      piece ??= new Uint8Array(SNAPSHOT_FLUSH_BYTES);
      for (let at = 0; at < part.byteLength; ) {
        const length = part.read(piece);
        assert(length > 0 && at + length <= part.byteLength, 'snapshot source: wrong length');
        await put(piece, length, true);
        at += length;
      }
    }
    const header = Buffer.from(`${headerLine(crc).padEnd(headerBytes - 1)}\n`);
    assert(header.length === headerBytes, 'snapshot header longer than its line');
    // Over the line reserved at the start (a positional write: the file's offset stays put).
    for (let written = 0; written < header.length; )
      written += await writeAsync(fd, header, written, header.length - written, written);
    // The last step, and the file's size and metadata: the rename below must find it whole.
    await fsyncAsync(fd);
  } catch (error) {
    // A full disk: the half-written file must not keep the space the log needs.
    await unlink(temp).catch(ignore);
    throw error;
  } finally {
    closeSync(fd);
    reserve.refill();
  }
  await rename(temp, path);
  await fsyncAsync(dirFd);
}

/** A covered segment is renamed with this suffix before it is cut down and removed. */
export const DROPPED_SUFFIX = '.dropped';
/**
 * A dropped segment is cut down this much at a time, with a pause between steps. Removing a full
 * 64 MB segment at once frees all its blocks in one journal transaction, and the log's next fsync
 * waits for that commit: 10–14 ms against ~0.3 (measured on ext4 here: `.scratch`-style A/B of a
 * 512-byte append + fsync beside the removal; in 4 MiB steps 10 ms apart its worst was 1.3–2.7 ms).
 * Under load that was a p99 of ~6–7 ms in every 3 s run holding a snapshot, against ~3.5 without.
 */
const DROP_STEP_BYTES = 4 * 1024 * 1024;
const DROP_PAUSE_MS = 10;

/**
 * After a durable snapshot taken at `seq`: removes the segments up to `closedIndex` (the one closed
 * for it) that hold nothing after `seq`. Records appended after `seq` was taken (while the snapshot
 * waited for the flush) sit in the old segments too; a segment holding any of them must stay, or
 * they would be lost (and replay would find a gap).
 *
 * Each is first renamed (and the directory flushed), then cut down in steps and removed: a crash
 * part way leaves a whole segment or a `.dropped` file, which replay never reads (and the next
 * start removes), never a segment cut short, which replay would refuse as torn.
 */
export async function dropCoveredSegments(
  dir: string,
  dirFd: number,
  reserve: FdReserve,
  segments: Map<number, number>,
  closedIndex: number,
  seq: number,
): Promise<void> {
  const dropped: string[] = [];
  try {
    for (const index of [...segments.keys()].sort((a, b) => a - b)) {
      if (index <= closedIndex && (segments.get(index) ?? 0) <= seq) {
        const path = join(dir, segmentName(index));
        await rename(path, `${path}${DROPPED_SUFFIX}`);
        segments.delete(index);
        dropped.push(`${path}${DROPPED_SUFFIX}`);
      }
    }
  } finally {
    // Also after a failed rename: those already renamed go.
    if (dropped.length > 0) {
      await fsyncAsync(dirFd);
      for (const path of dropped) await removeGradually(path, reserve);
      await fsyncAsync(dirFd);
    }
  }
}

/** Removes `path`, cutting it down DROP_STEP_BYTES at a time first when it is larger. */
async function removeGradually(path: string, reserve: FdReserve): Promise<void> {
  let fd = -1;
  try {
    fd = reserve.openSync(path, 'r+');
    for (let size = fstatSync(fd).size; size > DROP_STEP_BYTES; ) {
      size -= DROP_STEP_BYTES;
      await ftruncateAsync(fd, size);
      await sleep(DROP_PAUSE_MS);
    }
  } catch {
    // No descriptor to spare (or the file is gone): removed at once below, as before the steps.
  } finally {
    if (fd !== -1) {
      closeSync(fd);
      reserve.refill();
    }
  }
  await unlink(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code !== 'ENOENT') throw error;
  });
}

function ftruncateAsync(fd: number, length: number): Promise<void> {
  return new Promise((resolve, reject) =>
    ftruncate(fd, length, (error) => (error ? reject(error) : resolve())),
  );
}

/** What a crash left of dropped segments: their names (on open, before any load). */
const DROPPED_RE = /^segment-\d{12}\.wal\.dropped$/;

/**
 * Removes what a crash left of dropped segments (on open, before any load). One that cannot be
 * removed is only logged: it holds nothing replay needs, so it must not stop the start.
 */
export function removeDroppedSegments(dir: string, logger: Logger): void {
  for (const name of readdirSync(dir)) {
    if (!DROPPED_RE.test(name)) continue;
    try {
      unlinkSync(join(dir, name));
    } catch (error) {
      logger.warn({ err: (error as Error).message, file: name }, 'wal: a dropped segment stays');
    }
  }
}
