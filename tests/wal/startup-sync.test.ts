// What a killed process wrote to the log but never synced is synced by the next one before it
// acknowledges anything. Which files get synced is observed by wrapping node:fs (the module, not
// ours: the wrappers call through), since a SIGKILL keeps the page cache and only a power cut would
// show the difference.
import { afterAll, expect, mock, test } from 'bun:test';
import * as fsNamespace from 'node:fs';
import { join } from 'node:path';

const realFs = { ...fsNamespace };
const synced: string[] = [];
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
    return realFs.fdatasync(fd, callback);
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
