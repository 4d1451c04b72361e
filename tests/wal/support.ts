// Test support for the WAL tests: temp dirs that clean up, a log opened with recording handlers,
// segment paths.
import { expect } from 'bun:test';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLogger, type Logger } from '../../src/util/log.ts';
import { type FsyncPolicy, type WalOptions, WriteAheadLog } from '../../src/wal/log.ts';

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
