// Snapshots through the state store: the state survives them, old segments go, and every crash
// point is safe.
import { afterAll, describe, expect, test } from 'bun:test';
import {
  closeSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  statSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import type { GatewayState } from '../../src/state/apply.ts';
import { StateStore, type StoreOptions } from '../../src/state/store.ts';
import { FdReserve } from '../../src/wal/fd-reserve.ts';
import { WalCorruptionError } from '../../src/wal/log.ts';
import { dropCoveredSegments } from '../../src/wal/snapshot.ts';
import {
  keyCreated,
  keyCredited,
  requestFinished,
  requestStarted,
  storeOptions,
} from '../state/support.ts';
import { segmentFiles, tempDirs } from './support.ts';

const dirs = tempDirs('tollgate-wal-snapshot-');
afterAll(() => dirs.cleanup());

/** Everything durable about the state, as plain values for one `toEqual`. */
function view(state: GatewayState) {
  return {
    keys: [...state.keys.values()].sort((a, b) => a.id.localeCompare(b.id)),
    secrets: [...state.keysBySecret.entries()]
      .map(([secret, account]) => [secret, account.id])
      .sort(),
    inFlight: [...state.inFlight.values()].sort((a, b) => a.id.localeCompare(b.id)),
    finished: [...state.finished.values()].sort((a, b) => a.id.localeCompare(b.id)),
    idempotency: [...state.idempotency.entries(Date.now())].sort(),
  };
}

async function reopenView(options: StoreOptions) {
  const store = StateStore.open(options);
  const seen = view(store.state);
  await store.close();
  return seen;
}

/** Phase one of a typical history: keys, top-ups, some finished and some in-flight requests. */
async function firstHistory(store: StateStore): Promise<void> {
  await store.commit([keyCreated('k1', 1_000_000), keyCreated('k2', 0)]);
  await store.commit([keyCredited('k2', 500_000)]);
  for (let i = 0; i < 10; i++) {
    await store.commit([requestStarted(`r${i}`, 'k1', 10_000)]);
    if (i % 3 !== 0) await store.commit([requestFinished(`r${i}`, 1_000 * i)]);
  }
  await store.commit([keyCreated('k3', 42)]);
}

/**
 * Phase two: after the snapshot, including finishing requests that were in flight at the snapshot.
 */
async function secondHistory(store: StateStore): Promise<void> {
  await store.commit([keyCredited('k1', 7)]);
  await store.commit([requestFinished('r0', 5_000)]);
  await store.commit([
    requestStarted('s1', 'k2', 100_000),
    requestFinished('r3', 0, { status: 'cancelled', http_status: 499, usage: null }),
  ]);
  await store.commit([{ type: 'key.revoked', key_id: 'k3', at_ms: 1_700_000_000_010 }]);
}

describe('snapshot', () => {
  test(
    'state after snapshot plus more commits is ' +
      'identical on reopen; covered segments are removed',
    async () => {
      const dataDir = dirs.make();
      const walDir = join(dataDir, 'wal');
      // Small segments so the history spans several files.
      const options = storeOptions(dataDir, { segmentBytes: 512 });
      const store = StateStore.open(options);
      await firstHistory(store);
      const segmentsBefore = segmentFiles(walDir);
      expect(segmentsBefore.length).toBeGreaterThan(3);

      await store.snapshot();
      expect(existsSync(join(walDir, 'snapshot.json'))).toBe(true);
      const segmentsAfter = segmentFiles(walDir);
      // Every segment that existed before is covered by the snapshot and gone.
      expect(segmentsAfter.filter((name) => segmentsBefore.includes(name))).toEqual([]);
      expect(segmentsAfter.length).toBe(1);

      await secondHistory(store);
      const expected = view(store.state);
      await store.close();

      expect(await reopenView(options)).toEqual(expected);
      // Reopening twice changes nothing.
      expect(await reopenView(options)).toEqual(expected);
      // Spot checks of the ledger, so a bug common to live apply and replay cannot hide behind
      // toEqual.
      const k1 = expected.keys.find((k) => k.id === 'k1')!;
      expect(k1.creditsAddedMicro).toBe(1_000_007);
      expect(k1.creditsAddedMicro).toBe(k1.balanceMicro + k1.heldMicro + k1.chargedMicro);
      expect(k1.heldMicro).toBe(20_000); // r6, r9 still in flight
      expect(expected.inFlight.map((r) => r.id)).toEqual(['r6', 'r9', 's1']);
      expect(expected.keys.find((k) => k.id === 'k3')!.revoked).toBe(true);
    },
  );

  test('records appended while a snapshot is being written survive it', async () => {
    // Regression: the snapshot is taken at seq S, but records S+1… appended before its flush
    // finished were written to the old segment, which was then deleted (lost, and the next start
    // refused: gap).
    const dataDir = dirs.make();
    const options = storeOptions(dataDir, { fsync: 'always' });
    const store = StateStore.open(options);
    await store.commit([keyCreated('k1', 100)]);
    // Not yet written when the snapshot is taken, so the snapshot's flush writes it…
    const covered = store.commit([keyCredited('k1', 1)]);
    const snapshotting = store.snapshot();
    // …in the same batch as these, which the snapshot does not cover.
    const late = [store.commit([keyCredited('k1', 2)])];
    await Promise.all([covered, snapshotting, ...late]);
    await store.commit([keyCredited('k1', 4)]);
    const expected = view(store.state);
    expect(expected.keys[0]!.balanceMicro).toBe(107);
    await store.close();
    expect(await reopenView(options)).toEqual(expected);
  });

  test('automatic snapshots under a burst of commits in one tick lose nothing', async () => {
    const dataDir = dirs.make();
    const options = storeOptions(dataDir, {
      fsync: 'always',
      snapshotEveryRecords: 5,
      segmentBytes: 256,
    });
    const store = StateStore.open(options);
    await store.commit([keyCreated('k1', 0)]);
    for (let round = 0; round < 10; round++) {
      // 12 commits in one tick: the 5th-ish triggers a snapshot while the rest are still being
      // appended.
      await Promise.all(
        Array.from({ length: 12 }, (_, i) => store.commit([keyCredited('k1', round * 100 + i)])),
      );
    }
    const expected = view(store.state);
    await store.close();
    expect(await reopenView(options)).toEqual(expected);
    // Compaction still happens: the log does not keep every segment. (How many a snapshot
    // leaves depends on where the burst's batches fell, not only on the snapshots.)
    const indexes = segmentFiles(join(dataDir, 'wal')).map((name) => Number(/\d+/.exec(name)![0]));
    expect(indexes[0]).toBeGreaterThan(1);
    expect(indexes.length).toBeLessThan(indexes.at(-1)!);
  });

  test('a leftover snapshot.json.tmp is ignored', async () => {
    const dataDir = dirs.make();
    const walDir = join(dataDir, 'wal');
    const options = storeOptions(dataDir);
    const store = StateStore.open(options);
    await firstHistory(store);
    await store.snapshot();
    await secondHistory(store);
    const expected = view(store.state);
    await store.close();

    // A crash mid-write of the next snapshot: a torn, half-written temp file.
    writeFileSync(join(walDir, 'snapshot.json.tmp'), '{"format":1,"seq":99999,"state":{"keys":[');
    expect(await reopenView(options)).toEqual(expected);

    // Also a complete but never-renamed temp (crash before the rename): still not the snapshot.
    writeFileSync(
      join(walDir, 'snapshot.json.tmp'),
      '{"format":1,"seq":1,"state":{"keys":[],"inFlight":[],"finished":[],"idempotency":[]}}',
    );
    expect(await reopenView(options)).toEqual(expected);

    // And the next snapshot replaces it cleanly.
    const again = StateStore.open(options);
    await again.snapshot();
    await again.close();
    expect(existsSync(join(walDir, 'snapshot.json.tmp'))).toBe(false);
    expect(await reopenView(options)).toEqual(expected);
  });

  test(
    'a temp snapshot with no snapshot.json at all ' +
      '(first snapshot interrupted) replays the log',
    async () => {
      const dataDir = dirs.make();
      const walDir = join(dataDir, 'wal');
      const options = storeOptions(dataDir);
      const store = StateStore.open(options);
      await firstHistory(store);
      const expected = view(store.state);
      await store.close();
      writeFileSync(join(walDir, 'snapshot.json.tmp'), 'garbage');
      expect(await reopenView(options)).toEqual(expected);
    },
  );

  test(
    'crash after the snapshot is renamed but before old segments are removed: replay skips what ' +
      'it covers',
    async () => {
      const dataDir = dirs.make();
      const walDir = join(dataDir, 'wal');
      const backupDir = dirs.make();
      const options = storeOptions(dataDir, { segmentBytes: 512 });
      const store = StateStore.open(options);
      await firstHistory(store);
      const oldSegments = segmentFiles(walDir);
      for (const name of oldSegments) copyFileSync(join(walDir, name), join(backupDir, name));
      await store.snapshot();
      await secondHistory(store);
      const expected = view(store.state);
      await store.close();

      // Put the covered segments back, as if the process died right after the rename.
      for (const name of oldSegments) copyFileSync(join(backupDir, name), join(walDir, name));
      expect(segmentFiles(walDir).filter((name) => oldSegments.includes(name))).toEqual(
        oldSegments,
      );
      // Applying the covered records again would break (key k1 exists); skipping them is what makes
      // this pass.
      expect(await reopenView(options)).toEqual(expected);

      // The next snapshot cleans them up.
      const again = StateStore.open(options);
      await again.snapshot();
      await again.close();
      expect(segmentFiles(walDir).filter((name) => oldSegments.includes(name))).toEqual([]);
      expect(await reopenView(options)).toEqual(expected);
    },
  );

  test(
    'crash after the roll but before the ' + 'snapshot is written: the log alone replays',
    async () => {
      const dataDir = dirs.make();
      const walDir = join(dataDir, 'wal');
      const options = storeOptions(dataDir);
      const store = StateStore.open(options);
      await firstHistory(store);
      await store.close();
      // The roll leaves an empty next segment; the snapshot never arrived.
      const last = segmentFiles(walDir).at(-1)!;
      const nextIndex = Number(/\d{12}/.exec(last)![0]) + 1;
      writeFileSync(
        join(walDir, `segment-${String(nextIndex).padStart(12, '0')}.wal`),
        new Uint8Array(0),
      );
      const reopened = StateStore.open(options);
      await secondHistory(reopened);
      const expected = view(reopened.state);
      await reopened.close();
      expect(await reopenView(options)).toEqual(expected);
    },
  );

  /** A closed store after the first history and a snapshot: its options and the snapshot's path. */
  async function snapshotted(): Promise<{ options: StoreOptions; path: string }> {
    const dataDir = dirs.make();
    const options = storeOptions(dataDir);
    const store = StateStore.open(options);
    await firstHistory(store);
    await store.snapshot();
    await store.close();
    return { options, path: join(dataDir, 'wal', 'snapshot.json') };
  }

  test('a snapshot that is not JSON refuses to start', async () => {
    const { options, path } = await snapshotted();
    writeFileSync(path, readFileSync(path, 'utf8').slice(0, 40));
    expect(() => StateStore.open(options)).toThrow(WalCorruptionError);
  });

  test('a snapshot with a changed byte, or cut short, refuses to start', async () => {
    const { options, path } = await snapshotted();
    const good = readFileSync(path);
    const flipped = Buffer.from(good);
    flipped[flipped.length - 3]! ^= 0x10; // inside the record columns
    writeFileSync(path, flipped);
    expect(() => StateStore.open(options)).toThrow(/checksum mismatch/);
    writeFileSync(path, good.subarray(0, good.length - 1));
    expect(() => StateStore.open(options)).toThrow(WalCorruptionError);
    // The header's seq decides which records replay skips: a changed one must not pass either.
    const text = good.toString('latin1');
    const seq = Number(/"seq":(\d+)/.exec(text)![1]);
    writeFileSync(path, Buffer.from(text.replace(`"seq":${seq}`, `"seq":${seq + 1}`), 'latin1'));
    expect(() => StateStore.open(options)).toThrow(/checksum mismatch/);
    writeFileSync(path, good);
    await StateStore.open(options).close();
  });

  test(
    'two snapshots asked for at once are written ' + 'one after the other, and nothing is lost',
    async () => {
      const dataDir = dirs.make();
      const options = storeOptions(dataDir, { segmentBytes: 1 });
      const store = StateStore.open(options);
      await firstHistory(store);
      const first = store.snapshot();
      await secondHistory(store);
      const second = store.snapshot();
      await Promise.all([first, second]);
      const expected = view(store.state);
      await store.close();
      expect(await reopenView(options)).toEqual(expected);
    },
  );

  test('a format 1 snapshot (written only by unreleased builds) refuses to start', async () => {
    const dataDir = dirs.make();
    const options = storeOptions(dataDir);
    const store = StateStore.open(options);
    await firstHistory(store);
    const { state } = store;
    const v1 = {
      keys: [...state.keys.values()],
      inFlight: [...state.inFlight.values()],
      finished: [...state.finished.values()],
      idempotency: [...state.idempotency.entries(Date.now())],
    };
    const seq = (store as unknown as { wal: { lastSeq: number } }).wal.lastSeq;
    await store.close();
    const path = join(dataDir, 'wal', 'snapshot.json');
    writeFileSync(path, JSON.stringify({ format: 1, seq, state: v1 }));
    // Its reader is gone, and starting without it would lose what it holds (the segments it
    // covers are removed once it is durable): the file is named and the start refused.
    expect(() => StateStore.open(options)).toThrow(WalCorruptionError);
    expect(() => StateStore.open(options)).toThrow(`${path}: unknown format; refusing to start`);
    expect(readdirSync(join(dataDir, 'wal'))).toContain('snapshot.json');
  });

  test(
    'a snapshot whose following records were lost ' + 'refuses to start (gap after the snapshot)',
    async () => {
      const dataDir = dirs.make();
      const walDir = join(dataDir, 'wal');
      const options = storeOptions(dataDir, { segmentBytes: 1 });
      const store = StateStore.open(options);
      await firstHistory(store);
      await store.snapshot();
      await secondHistory(store);
      await store.close();
      // With one record per segment, dropping the first segment after the snapshot leaves a hole.
      const first = segmentFiles(walDir)[0]!;
      writeFileSync(join(walDir, first), new Uint8Array(0));
      expect(() => StateStore.open(options)).toThrow(WalCorruptionError);
      expect(readdirSync(walDir)).toContain('snapshot.json');
    },
  );
});

describe('a snapshot that cannot be written', () => {
  test(
    'is tried again after snapshot_every_records ' + 'more records, not at every commit',
    async () => {
      const dataDir = dirs.make();
      const failures: string[] = [];
      const pino = (await import('pino')).default;
      const logger = pino({ level: 'error' }, { write: (line: string) => failures.push(line) });
      const store = StateStore.open(storeOptions(dataDir, { snapshotEveryRecords: 5, logger }));
      // The snapshot's temporary file cannot be created (a directory stands in its place).
      const { mkdirSync } = await import('node:fs');
      mkdirSync(join(dataDir, 'wal', 'snapshot.json.tmp'));
      await store.commit([keyCreated('k1', 1_000_000)]);
      for (let i = 0; i < 24; i++) {
        await store.commit([keyCredited('k1', 1)]);
        // Two turns of the event loop: an attempt this commit started has failed before the next
        // commit.
        for (let turn = 0; turn < 2; turn++) await new Promise((resolve) => setImmediate(resolve));
      }
      await store.close();
      const attempts = failures.filter((line) => line.includes('snapshot failed')).length;
      expect(attempts).toBeGreaterThanOrEqual(3);
      expect(attempts).toBeLessThanOrEqual(5);
      // Every record is still in the log.
      const reopened = StateStore.open(storeOptions(dataDir));
      expect(reopened.state.account('k1').creditsAddedMicro).toBe(1_000_024);
      await reopened.close();
    },
  );

  test('ends its capture: records evicted afterwards are not kept for it', async () => {
    const dataDir = dirs.make();
    const logger = (await import('pino')).default({ level: 'silent' });
    const store = StateStore.open(storeOptions(dataDir, { logger }));
    await store.commit([keyCreated('k1', 1e12)]);
    for (let n = 0; n < 50; n++)
      await store.commit([requestStarted(`r${n}`, 'k1', 1), requestFinished(`r${n}`, 1)]);
    mkdirSync(join(dataDir, 'wal', 'snapshot.json.tmp'));
    await store.snapshot();
    // The table's captures (private): a capture left behind has no other outward sign.
    expect((store.state.finished as unknown as { captures: unknown[] }).captures).toEqual([]);
    await store.close();
  });
});

describe('dropping covered segments', () => {
  test(
    'a covered segment larger than a step is cut down before it goes (the log fsync beside it ' +
      'does not wait for one big removal), and only covered segments go',
    async () => {
      const dir = dirs.make();
      const dirFd = openSync(dir, 'r');
      const big = join(dir, 'segment-000000000001.wal');
      const kept = join(dir, 'segment-000000000002.wal');
      const bigBytes = 12 * 1024 * 1024;
      writeFileSync(big, '');
      truncateSync(big, bigBytes);
      writeFileSync(kept, 'x');
      const segments = new Map([
        [1, 10],
        [2, 11],
      ]);
      const sizes = new Set<number>();
      let done = false;
      const reserve = new FdReserve();
      const dropping = dropCoveredSegments(dir, dirFd, reserve, segments, 2, 10).finally(() => {
        done = true;
      });
      while (!done) {
        try {
          sizes.add(statSync(`${big}.dropped`).size);
        } catch {
          // not renamed yet, or already removed (the thread pool works beside this loop)
        }
        await new Promise((resolve) => setImmediate(resolve));
      }
      await dropping;
      closeSync(dirFd);
      reserve.close();
      // Seen part way: renamed first (replay never reads it), then smaller than it was, in steps.
      expect([...sizes].some((size) => size > 0 && size < bigBytes)).toBe(true);
      expect(readdirSync(dir)).toEqual(['segment-000000000002.wal']);
      expect([...segments.keys()]).toEqual([2]);
    },
  );

  test('a dropped segment a crash left behind is removed on open; replay ignores it', async () => {
    const dataDir = dirs.make();
    const options = storeOptions(dataDir);
    const store = StateStore.open(options);
    await firstHistory(store);
    await store.snapshot();
    const expected = view(store.state);
    await store.close();
    // As if the process died while a covered segment was being cut down: a torn, renamed file.
    const dropped = join(dataDir, 'wal', 'segment-000000000000.wal.dropped');
    writeFileSync(dropped, Buffer.from('{"seq":1,"torn'));
    expect(await reopenView(options)).toEqual(expected);
    expect(existsSync(dropped)).toBe(false);
  });

  test('a snapshot stops keeping evicted records once its file is durable', async () => {
    const dataDir = dirs.make();
    const walDir = join(dataDir, 'wal');
    const store = StateStore.open(storeOptions(dataDir));
    await store.commit([keyCreated('k1', 1e12)]);
    // Enough log for a covered segment of several drop steps.
    let n = 0;
    while (n < 40_000) {
      const batch: Promise<void>[] = [];
      for (let i = 0; i < 1000; i++, n++)
        batch.push(store.commit([requestStarted(`r${n}`, 'k1', 1), requestFinished(`r${n}`, 1)]));
      await Promise.all(batch);
    }
    // The table's captures (private): what the test is about has no other outward sign.
    const captures = (store.state.finished as unknown as { captures: unknown[] }).captures;
    const snapshotting = store.snapshot();
    while (!readdirSync(walDir).some((name) => name.endsWith('.dropped')))
      await new Promise((resolve) => setImmediate(resolve));
    expect(existsSync(join(walDir, 'snapshot.json'))).toBe(true);
    const heldWhileDropping = captures.length;
    await snapshotting;
    await store.close();
    expect(heldWhileDropping).toBe(0);
  });

  test('a leftover that cannot be removed does not stop the start; other names stay', async () => {
    const dataDir = dirs.make();
    const options = storeOptions(dataDir);
    const store = StateStore.open(options);
    await store.commit([keyCreated('k1', 1)]);
    await store.snapshot();
    await store.close();
    mkdirSync(join(dataDir, 'wal', 'segment-000000000000.wal.dropped'));
    writeFileSync(join(dataDir, 'wal', 'operator-notes.dropped'), 'mine');
    await StateStore.open(options).close();
    expect(existsSync(join(dataDir, 'wal', 'operator-notes.dropped'))).toBe(true);
  });
});
