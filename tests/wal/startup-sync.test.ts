// What a killed process wrote to the log but never synced is synced by the next one before it
// acknowledges anything, and a failed log rolls no further. Which files get synced is observed by
// wrapping node:fs (the module, not ours: the wrappers call through, or fail on request), since a
// SIGKILL keeps the page cache and only a power cut would show the difference.
import { afterAll, expect, mock, test } from 'bun:test';
import * as fsNamespace from 'node:fs';
import { join } from 'node:path';

const realFs = { ...fsNamespace };
const synced: string[] = [];
/** How many of the next calls fail with EIO. */
const inject = { fdatasyncFails: 0, ftruncateFails: 0 };
const eio = () => Object.assign(new Error('EIO: injected'), { code: 'EIO' });
function note(fd: number): void {
  try {
    synced.push(realFs.readlinkSync(`/proc/self/fd/${fd}`));
  } catch {
    synced.push(`fd ${fd}`);
  }
}
mock.module('node:fs', () => ({
  ...realFs,
  fsyncSync: (fd: number) => {
    note(fd);
    return realFs.fsyncSync(fd);
  },
  fdatasyncSync: (fd: number) => {
    note(fd);
    return realFs.fdatasyncSync(fd);
  },
  fsync: (fd: number, callback: (error: Error | null) => void) => {
    note(fd);
    return realFs.fsync(fd, callback);
  },
  fdatasync: (fd: number, callback: (error: Error | null) => void) => {
    note(fd);
    if (inject.fdatasyncFails > 0) {
      inject.fdatasyncFails--;
      return realFs.fdatasync(fd, () => callback(eio()));
    }
    return realFs.fdatasync(fd, callback);
  },
  ftruncateSync: (fd: number, length?: number) => {
    if (inject.ftruncateFails > 0) {
      inject.ftruncateFails--;
      throw eio();
    }
    return realFs.ftruncateSync(fd, length);
  },
}));

const { bareFramesOf, openRecording, payloadOf, segmentFiles, tempDirs } = await import(
  './support.ts'
);

const dirs = tempDirs('tollgate-wal-startup-sync-');
afterAll(() => dirs.cleanup());

for (const format of ['batches', 'bare frames'] as const) {
  test(`(${format}) what a killed process never synced is synced before the next ack`, async () => {
    const dir = dirs.make();
    // Process A: its batches are written (in the page cache) but never synced, as when A is
    // killed between a write and its fsync: modelled by fsync off.
    const a = openRecording(dir, { fsync: 'off' });
    for (let i = 0; i < 3; i++) await a.wal.append(payloadOf(i));
    await a.wal.close();
    const first = join(dir, 'segment-000000000001.wal');
    if (format === 'bare frames')
      realFs.writeFileSync(first, bareFramesOf(new Uint8Array(realFs.readFileSync(first))));
    // Process B replays them and goes on under fsync always, into a prepared segment.
    synced.length = 0;
    const b = openRecording(dir, { fsync: 'always' });
    expect(b.replayed.records.length).toBe(3);
    await b.wal.prepared();
    await b.wal.append(payloadOf(3));
    const syncedBeforeAck = [...synced];
    await b.wal.close();
    expect(segmentFiles(dir).length).toBeGreaterThan(1);
    // Record 4 is acknowledged in segment 2; 1..3, which its state follows from, are in segment 1.
    expect(syncedBeforeAck).toContain(first);
  });
}

for (const segmentBytes of [1, 300]) {
  test(`every segment a killed process left under off (${segmentBytes} B segments)`, async () => {
    const dir = dirs.make();
    // Under off a roll syncs nothing: every segment may be unsynced, and the last may be empty.
    const a = openRecording(dir, { fsync: 'off', segmentBytes });
    for (let i = 0; i < 4; i++) await a.wal.append(payloadOf(i, [200]));
    await a.wal.close();
    const written = segmentFiles(dir).filter((name) => realFs.statSync(join(dir, name)).size > 0);
    expect(written.length).toBeGreaterThan(1);
    synced.length = 0;
    const b = openRecording(dir, { fsync: 'always', segmentBytes });
    expect(b.replayed.records.length).toBe(4);
    await b.wal.append(payloadOf(4));
    const syncedBeforeAck = [...synced];
    await b.wal.close();
    for (const name of written) expect(syncedBeforeAck).toContain(join(dir, name));
  });
}

test('a failed log rolls no further: the segment of its failed batch stays the last', async () => {
  const dir = dirs.make();
  const { wal } = openRecording(dir, { fsync: 'always', segmentBytes: 1 });
  await wal.append({ n: 1 });
  const before = segmentFiles(dir);
  // The batch's fsync fails, and so does cutting it off: its bytes stay, unsynced.
  inject.fdatasyncFails = 1;
  inject.ftruncateFails = 1;
  const second = wal.append({ n: 2 });
  await new Promise((resolve) => setImmediate(resolve));
  const third = wal.append({ n: 3 });
  const outcomes = await Promise.allSettled([second, third]);
  expect(outcomes.map((outcome) => outcome.status)).toEqual(['rejected', 'rejected']);
  await wal.close();
  expect(segmentFiles(dir)).toEqual(before);
});
