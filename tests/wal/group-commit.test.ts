// Group commit, fsync policies and the failure path of the write-ahead log.
import { afterAll, describe, expect, test } from 'bun:test';
import { readFileSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import pino from 'pino';
import { StateStore } from '../../src/state/store.ts';
import { AssertionError } from '../../src/util/assert.ts';
import { GatewayError } from '../../src/util/errors.ts';
import { FRAME_PAYLOAD_BYTES_MAX } from '../../src/wal/frame.ts';
import { type FsyncPolicy, WalUnavailableError, WriteAheadLog } from '../../src/wal/log.ts';
import {
  batchRanges,
  openRecording,
  replayOnly,
  SILENT,
  segmentFiles,
  tempDirs,
  walOptions,
} from './support.ts';

const dirs = tempDirs('tollgate-wal-group-');
afterAll(() => dirs.cleanup());

const POLICIES: FsyncPolicy[] = ['always', 'interval', 'off'];

function countFrames(path: string): number {
  const bytes = new Uint8Array(readFileSync(path));
  return batchRanges(bytes).reduce((count, batch) => count + batch.frames.length, 0);
}

function records(from: number, to: number, payload: (i: number) => unknown = (i) => ({ n: i })) {
  return Array.from({ length: to - from + 1 }, (_, k) => ({
    seq: from + k,
    payload: payload(from + k),
  }));
}

describe('group commit', () => {
  /**
   * Appends A, then B one event-loop turn later, and tells whether one write and one fsync covered
   * both: whether they are in one batch on disk. (Not by the order of the acknowledgements: a
   * batch fsynced into prepared zeros can come back within the turn.)
   */
  async function sharedOneFsync(expectedCommits: number): Promise<boolean> {
    const dir = dirs.make();
    const { wal } = openRecording(dir, { fsync: 'always', expectedCommits: () => expectedCommits });
    const first = wal.append({ n: 1 });
    const second = new Promise<void>((resolve, reject) =>
      setImmediate(() => wal.append({ n: 2 }).then(resolve, reject)),
    );
    await Promise.all([first, second]);
    await wal.close();
    expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, 2) });
    const batches = batchesOf(dir);
    expect(batches.flat()).toEqual([1, 2]);
    return batches.length === 1;
  }

  test(
    'fsync always: with other requests in flight, a commit waits a turn for theirs and shares ' +
      'its fsync',
    async () => {
      expect(await sharedOneFsync(5)).toBe(true);
    },
  );

  test('fsync always: alone (nothing else in flight), a commit does not wait', async () => {
    expect(await sharedOneFsync(1)).toBe(false);
  });

  /** The seqs of each batch on disk, in order. */
  function batchesOf(dir: string): number[][] {
    return segmentFiles(dir).flatMap((name) => {
      const bytes = new Uint8Array(readFileSync(join(dir, name)));
      return bytes.length === 0 ? [] : batchRanges(bytes).map((batch) => batch.seqs);
    });
  }

  test('a deferred record waits for the next write and shares its fsync', async () => {
    const dir = dirs.make();
    const { wal } = openRecording(dir, { fsync: 'always' });
    let deferredDone = false;
    // A delay no test waits out: only the next append can write it.
    const deferred = wal.append({ n: 1 }, 600_000).then(() => {
      deferredDone = true;
    });
    for (let turn = 0; turn < 5; turn++) await new Promise((resolve) => setImmediate(resolve));
    expect(deferredDone).toBe(false);
    // Not even written: an append's write comes at the end of its turn.
    expect(batchesOf(dir)).toEqual([]);
    await wal.append({ n: 2 });
    await deferred;
    await wal.close();
    expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, 2) });
    expect(batchesOf(dir)).toEqual([[1, 2]]);
  });

  test('a deferred record is written at once for whoever waits for it, and by close', async () => {
    const dir = dirs.make();
    const { wal } = openRecording(dir, { fsync: 'always' });
    // Delays no test waits out: only the wait (the live list's) and close can write them.
    wal.append({ n: 1 }, 600_000);
    await wal.flushThrough(wal.lastSeq);
    expect(batchesOf(dir)).toEqual([[1]]);
    const closing = wal.append({ n: 2 }, 600_000);
    await wal.close();
    await closing;
    expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, 2) });
  });

  test('thousands of deferred records admitted at once are written in few batches', async () => {
    const dir = dirs.make();
    const { wal } = openRecording(dir, { fsync: 'always' });
    const count = 5_000;
    const acks = Array.from({ length: count }, (_, i) => wal.append({ n: i + 1 }, 5));
    await Promise.all(acks);
    // Every one is on disk, in order, without a write (or a timer) per record.
    expect(batchesOf(dir).length).toBeLessThanOrEqual(2);
    await wal.close();
    expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, count) });
  });

  test('a wait for what was committed so far ends under steady appends', async () => {
    const dir = dirs.make();
    const { wal } = openRecording(dir, { fsync: 'always' });
    // Another key's steady load: an append every turn, so the log never goes idle.
    let appending = true;
    let n = 0;
    const load = (async () => {
      while (appending) {
        wal.append({ n: ++n });
        await new Promise((resolve) => setImmediate(resolve));
      }
    })();
    for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
    const seq = wal.lastSeq;
    await wal.flushThrough(seq);
    appending = false;
    await load;
    await wal.close();
    const { records: replayed } = await replayOnly(dir);
    expect(replayed.length).toBeGreaterThanOrEqual(seq);
  });

  test('a deferred record with nothing after it is written once its delay is up', async () => {
    const dir = dirs.make();
    const { wal } = openRecording(dir, { fsync: 'always' });
    await wal.append({ n: 1 }, 5);
    expect(batchesOf(dir)).toEqual([[1]]);
    await wal.close();
    expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, 1) });
  });

  for (const fsync of POLICIES) {
    test(
      `appends in one tick share one write and ` + `resolve together, in order (fsync ${fsync})`,
      async () => {
        const dir = dirs.make();
        const { wal } = openRecording(dir, { fsync });
        const count = 200;
        const resolved: number[] = [];
        let framesOnDiskAtFirstResolve = -1;
        const promises = Array.from({ length: count }, (_, i) => wal.append({ n: i + 1 }));
        expect(wal.lastSeq).toBe(count);
        promises[0]!.then(() => {
          framesOnDiskAtFirstResolve = countFrames(join(dir, segmentFiles(dir)[0]!));
        });
        for (const [i, promise] of promises.entries()) promise.then(() => resolved.push(i + 1));
        await Promise.all(promises);
        // When the first record is acknowledged the whole batch is already written: one write, not
        // 200.
        expect(framesOnDiskAtFirstResolve).toBe(count);
        expect(resolved).toEqual(records(1, count).map((r) => r.seq));
        await wal.close();
        expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, count) });
      },
    );

    test(
      `an append made as soon as the previous one is ` +
        `acknowledged is written too (fsync ${fsync})`,
      async () => {
        // Regression: the waiter of a finished batch ran before the flush loop was marked idle, so
        // an append it made was queued but never written, and close() then spun forever.
        const dir = dirs.make();
        const { wal } = openRecording(dir, { fsync });
        for (let i = 1; i <= 50; i++) await wal.append({ n: i });
        // Chained inside a `then`, the tightest form of the same race.
        await wal
          .append({ n: 51 })
          .then(() => wal.append({ n: 52 }))
          .then(() => wal.append({ n: 53 }));
        await wal.close();
        expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, 53) });
      },
    );

    test(
      `every policy replays everything after close: ` +
        `mixed batches and segment rolls (fsync ${fsync})`,
      async () => {
        const dir = dirs.make();
        const { wal } = openRecording(dir, { fsync, segmentBytes: 4096 });
        let n = 0;
        const payload = (i: number) => ({ n: i, pad: 'p'.repeat((i * 37) % 300) });
        for (let round = 0; round < 20; round++) {
          const batch = Array.from({ length: round % 7 }, () => wal.append(payload(++n)));
          // Appends made while a write or fsync is in flight join the next batch.
          await Promise.resolve();
          batch.push(wal.append(payload(++n)));
          await Promise.all(batch);
        }
        // Appended without waiting: close() must still write them.
        wal.append(payload(++n));
        wal.append(payload(++n));
        await wal.close();
        expect(segmentFiles(dir).length).toBeGreaterThan(2);
        expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, n, payload) });
      },
    );
  }

  test('an oversized record is refused before it is written; the log goes on', async () => {
    const dir = dirs.make();
    const { wal } = openRecording(dir, { fsync: 'always' });
    await wal.append({ n: 1 });
    // Under the limit in UTF-16 units, over it in UTF-8 bytes (3 per character).
    const huge = { n: 2, text: '€'.repeat(FRAME_PAYLOAD_BYTES_MAX / 3 + 1) };
    expect(() => wal.append(huge)).toThrow(AssertionError);
    await wal.append({ n: 2 });
    await wal.close();
    expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, 2) });
  });

  test('a reopened log continues the sequence', async () => {
    const dir = dirs.make();
    const first = openRecording(dir, { fsync: 'always' });
    await Promise.all([first.wal.append({ n: 1 }), first.wal.append({ n: 2 })]);
    await first.wal.close();
    const second = openRecording(dir, { fsync: 'always' });
    expect(second.wal.lastSeq).toBe(2);
    await second.wal.append({ n: 3 });
    await second.wal.close();
    expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, 3) });
  });
});

describe('failure', () => {
  test('open throws when the log directory cannot be created', () => {
    const parent = dirs.make();
    const file = join(parent, 'not-a-dir');
    writeFileSync(file, 'x');
    // A path under a regular file: ENOTDIR, whoever runs the test (root bypasses permissions, not
    // this).
    expect(() =>
      WriteAheadLog.open(walOptions(join(file, 'wal')), { loadSnapshot() {}, applyRecord() {} }),
    ).toThrow();
  });

  test('open throws when the directory is a file', () => {
    const parent = dirs.make();
    const file = join(parent, 'wal');
    writeFileSync(file, 'x');
    expect(() =>
      WriteAheadLog.open(walOptions(file), { loadSnapshot() {}, applyRecord() {} }),
    ).toThrow();
  });

  // The next segment is made a link to a device the kernel fails on, so a real write() or fsync()
  // in the real code path returns an error: ENOSPC from /dev/full, EINVAL from fsync on /dev/null.
  function linkNextSegment(dir: string, device: string): string {
    const path = join(dir, 'segment-000000000002.wal');
    symlinkSync(device, path);
    return path;
  }

  test(
    'a failed write rejects the whole batch and every ' +
      'later append, and nothing after it is acknowledged',
    async () => {
      const dir = dirs.make();
      const { wal } = openRecording(dir, { fsync: 'always', segmentBytes: 1 });
      const link = linkNextSegment(dir, '/dev/full');
      await wal.append({ n: 1 }); // written to segment 1, then the log rolls onto /dev/full
      const batch = [wal.append({ n: 2 }), wal.append({ n: 3 })];
      const outcomes = await Promise.allSettled(batch);
      for (const outcome of outcomes) {
        expect(outcome.status).toBe('rejected');
        expect((outcome as PromiseRejectedResult).reason).toBeInstanceOf(WalUnavailableError);
        expect((outcome as PromiseRejectedResult).reason.message).toContain('ENOSPC');
      }
      expect(wal.failure?.message).toContain('ENOSPC');
      expect(() => wal.append({ n: 4 })).toThrow(WalUnavailableError);
      await wal.close();
      // The device never held anything; without the link the log is the one acknowledged record.
      unlinkSync(link);
      expect(await replayOnly(dir)).toEqual({ snapshot: null, records: records(1, 1) });
    },
  );

  test(
    'a failed fsync (policy always) rejects its ' +
      'batch: fatal, never retried, never acknowledged',
    async () => {
      const dir = dirs.make();
      const { wal } = openRecording(dir, { fsync: 'always', segmentBytes: 1 });
      const link = linkNextSegment(dir, '/dev/null');
      await wal.append({ n: 1 });
      const outcomes = await Promise.allSettled([wal.append({ n: 2 }), wal.append({ n: 3 })]);
      expect(outcomes.map((o) => o.status)).toEqual(['rejected', 'rejected']);
      expect(((outcomes[0] as PromiseRejectedResult).reason as Error).message).toContain('EINVAL');
      expect(wal.failure).not.toBeNull();
      expect(() => wal.append({ n: 4 })).toThrow(WalUnavailableError);
      // A snapshot is a write too.
      await expect(
        wal.snapshot({ json: [Buffer.from('{}')], blobs: [] }, 1),
      ).rejects.toBeInstanceOf(WalUnavailableError);
      await wal.close();
      unlinkSync(link);
      expect((await replayOnly(dir)).records).toEqual(records(1, 1));
    },
  );

  test('a failed fsync under policy interval stops all later appends', async () => {
    const dir = dirs.make();
    const fatal = Promise.withResolvers<string>();
    const logger = pino(
      { level: 'fatal' },
      {
        write(line: string) {
          fatal.resolve(line);
        },
      },
    );
    // The first segment is the device and never rolls, so the timer's fsync is the only one. (With
    // a second segment linked and one record per segment, the roll's own fsync failed instead, or
    // the timer's failed before the second append, at random.)
    symlinkSync('/dev/null', join(dir, 'segment-000000000001.wal'));
    const { wal } = openRecording(dir, { fsync: 'interval', fsyncIntervalMs: 1, logger });
    // Under `interval` a record is acknowledged once written: both are, in one batch, before any
    // tick of the timer; the timer's fsync is what fails.
    await Promise.all([wal.append({ n: 1 }), wal.append({ n: 2 })]);
    const line = JSON.parse(await fatal.promise);
    expect(line.msg).toContain('fsync failed');
    expect(line.err).toContain('EINVAL');
    expect(() => wal.append({ n: 3 })).toThrow(WalUnavailableError);
    await wal.close();
  });

  /**
   * A store whose every record starts a new segment, so the next segment's file can be made to
   * fail.
   */
  const openOneRecordSegments = (dataDir: string) =>
    StateStore.open({
      dataDir,
      fsync: 'always',
      fsyncIntervalMs: 5,
      segmentBytes: 1,
      snapshotEveryRecords: 1_000_000,
      limits: {
        requestRecordsMax: 100,
        requestRecordTtlMs: 60_000,
        idempotencyKeysMax: 100,
        requestRecordsPerKey: 100,
        idempotencyKeysPerKey: 100,
        usageRetentionDays: 400,
      },
      logger: SILENT,
    });

  test('the store answers 503 service_unavailable after the log fails and says why', async () => {
    const dataDir = dirs.make();
    const store = openOneRecordSegments(dataDir);
    const link = linkNextSegment(join(dataDir, 'wal'), '/dev/null');
    const created = (id: string, secret: string) => ({
      type: 'key.created' as const,
      key_id: id,
      name: id,
      secret_sha256: secret.repeat(64),
      services: ['chat' as const],
      credits_micro: 1000,
      token_wallet: 0,
      daily_decision_budget_micro: null,
      rate_limit_rpm: null,
      at_ms: 1,
    });
    await store.commit([created('k1', 'a')]);
    expect(store.unavailableReason).toBeNull();
    const failed = await store.commit([created('k2', 'b')]).then(
      () => null,
      (error: unknown) => error,
    );
    expect(failed).toBeInstanceOf(GatewayError);
    expect((failed as GatewayError).code).toBe('service_unavailable');
    expect((failed as GatewayError).status).toBe(503);
    expect(store.unavailableReason).toContain('EINVAL');
    let refused: unknown;
    try {
      store.commit([created('k3', 'c')]);
    } catch (error) {
      refused = error;
    }
    expect((refused as GatewayError).code).toBe('service_unavailable');
    await store.close();
    unlinkSync(link);
    const reopened = openOneRecordSegments(dataDir);
    expect([...reopened.state.keys.keys()]).toEqual(['k1']);
    await reopened.close();
  });
});
