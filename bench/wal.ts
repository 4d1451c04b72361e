// WAL throughput and latency per fsync policy (issue 3's "Measure"): appends/s and p99
// append-to-durable.
//
// Usage: bun bench/wal.ts [--seconds S]   (BENCH_JSON=1 prints one JSON line instead of a table)
// For each policy and for 1 and 32 concurrent appenders, each appender loops `await
// wal.append(record)` (then one event-loop turn, as a request arriving from a socket would) for S
// seconds, with a record shaped like a real `request.started`. Reported per run: appends/s, p50/p99
// of append → acknowledged (the promise resolving), and p50/p99 of append → durable:
//   always   durable = acknowledged (the ack waits for the group's fsync);
//   interval durable = the end of the first interval fsync that started after the record was
//            written (observed by wrapping the log's own interval tick on the instance, no change
//            to src/);
//   off      never by the log's own doing (the OS writes back within ~30 s): reported as n/a. Also:
//   the raw write+fsync latency of this disk, the floor for `always`.
import { closeSync, fsyncSync, mkdtempSync, openSync, rmSync, writeSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLogger } from '../src/util/log.ts';
import { type FsyncPolicy, WriteAheadLog } from '../src/wal/log.ts';
import { fmt, fmtInt, percentile, table } from './lib.ts';

export interface WalRun {
  policy: FsyncPolicy;
  concurrency: number;
  appends: number;
  seconds: number;
  appendsPerS: number;
  ackP50Ms: number;
  ackP99Ms: number;
  durableP50Ms: number;
  durableP99Ms: number;
  fsyncs: number | null;
}

export interface WalReport {
  seconds: number;
  rawFsync: { p50Ms: number; p99Ms: number; samples: number };
  runs: WalRun[];
}

const FSYNC_INTERVAL_MS = 10; // the default wal.fsync_interval_ms
const logger = createLogger('silent');

/** One commit as the gateway logs a stream's start: the shape every WAL benchmark appends. */
export function benchRecord(i: number, nowMs = Date.now()): unknown[] {
  return [
    {
      type: 'request.started',
      request_id: `chatcmpl-bench${String(i).padStart(16, '0')}`,
      key_id: 'key_benchbenchbench01',
      service: 'chat',
      model: 'model_03',
      stream: true,
      hold: { credits_micro: 1_234, tokens: 0 },
      idempotency: null,
      budget_hold_micro: 0,
      at_ms: nowMs,
    },
  ];
}

function rawFsyncLatency(seconds: number): WalReport['rawFsync'] {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-bench-rawfsync-'));
  const fd = openSync(join(dir, 'raw'), 'a');
  const bytes = new Uint8Array(400).fill(120);
  const samples: number[] = [];
  try {
    const endMs = performance.now() + seconds * 1000;
    while (performance.now() < endMs) {
      const start = performance.now();
      writeSync(fd, bytes);
      fsyncSync(fd);
      samples.push(performance.now() - start);
    }
  } finally {
    closeSync(fd);
    rmSync(dir, { recursive: true, force: true });
  }
  return {
    p50Ms: percentile(samples, 50),
    p99Ms: percentile(samples, 99),
    samples: samples.length,
  };
}

/** When the interval timer's real fsyncs started and ended, in order. */
interface IntervalSyncs {
  starts: number[];
  ends: number[];
}

/**
 * The interval timer calls `syncInterval()` on the log's segment files at each tick; wrapping it
 * there records when each real fsync started and ended. A sync started after a record was written
 * covers it.
 */
function recordIntervalSyncs(wal: WriteAheadLog): IntervalSyncs {
  const syncs: IntervalSyncs = { starts: [], ends: [] };
  const files = (
    wal as unknown as {
      files: { syncInterval: () => Promise<void>; dirty: boolean; syncing: unknown };
    }
  ).files;
  const original = files.syncInterval.bind(files);
  files.syncInterval = async () => {
    const willSync = files.dirty && !files.syncing;
    const start = performance.now();
    await original();
    if (willSync) {
      syncs.starts.push(start);
      syncs.ends.push(performance.now());
    }
  };
  return syncs;
}

/**
 * Under `interval`, each record's append → durable time: the end of the first sync whose start is
 * at or after its ack (both sorted by time).
 */
function intervalDurableMs(ackedAt: number[], ackMs: number[], syncs: IntervalSyncs): number[] {
  const durable: number[] = [];
  let s = 0;
  for (let i = 0; i < ackedAt.length; i++) {
    const acked = ackedAt[i]!;
    while (s < syncs.starts.length && syncs.starts[s]! < acked) s++;
    if (s === syncs.starts.length) break;
    durable.push(syncs.ends[s]! - (acked - ackMs[i]!));
  }
  return durable;
}

async function runOne(policy: FsyncPolicy, concurrency: number, seconds: number): Promise<WalRun> {
  const dir = mkdtempSync(join(tmpdir(), `tollgate-bench-wal-${policy}-`));
  const wal = WriteAheadLog.open(
    {
      dir,
      fsync: policy,
      fsyncIntervalMs: FSYNC_INTERVAL_MS,
      segmentBytes: 64 * 1024 * 1024,
      logger,
    },
    { loadSnapshot() {}, applyRecord() {} },
  );
  const syncs = policy === 'interval' ? recordIntervalSyncs(wal) : null;

  const ackedAt: number[] = [];
  const ackMs: number[] = [];
  let counter = 0;
  const endMs = performance.now() + seconds * 1000;
  const appender = async () => {
    while (performance.now() < endMs) {
      const start = performance.now();
      await wal.append(benchRecord(counter++));
      const now = performance.now();
      ackMs.push(now - start);
      ackedAt.push(now);
      // Appends in a server follow socket reads: one event-loop turn between them, as there.
      // Without it a microtask-only loop starves the interval timer and `interval` would look never
      // durable.
      await new Promise<void>((resolve) => setImmediate(resolve));
    }
  };
  const started = performance.now();
  await Promise.all(Array.from({ length: concurrency }, appender));
  const elapsedS = (performance.now() - started) / 1000;
  // Let the interval policy sync what was written last, so every record has a durable time.
  if (policy === 'interval') await Bun.sleep(FSYNC_INTERVAL_MS * 5);
  await wal.close();
  rmSync(dir, { recursive: true, force: true });

  let durable: number[] = [];
  if (policy === 'always') durable = ackMs;
  else if (syncs !== null) durable = intervalDurableMs(ackedAt, ackMs, syncs);
  return {
    policy,
    concurrency,
    appends: ackMs.length,
    seconds: elapsedS,
    appendsPerS: ackMs.length / elapsedS,
    ackP50Ms: percentile(ackMs, 50),
    ackP99Ms: percentile(ackMs, 99),
    durableP50Ms: durable.length ? percentile(durable, 50) : NaN,
    durableP99Ms: durable.length ? percentile(durable, 99) : NaN,
    fsyncs: syncs === null ? null : syncs.starts.length,
  };
}

export async function runWalBench(seconds = 1.5): Promise<WalReport> {
  const rawFsync = rawFsyncLatency(Math.min(1, seconds));
  const runs: WalRun[] = [];
  for (const policy of ['always', 'interval', 'off'] as const) {
    for (const concurrency of [1, 32]) runs.push(await runOne(policy, concurrency, seconds));
  }
  return { seconds, rawFsync, runs };
}

export function walMarkdown(report: WalReport): string {
  const rows = report.runs.map((run) => [
    `${run.policy}`,
    `${run.concurrency}`,
    fmtInt(run.appendsPerS),
    fmt(run.ackP50Ms, 3),
    fmt(run.ackP99Ms, 3),
    run.policy === 'off' ? 'never (OS writeback)' : fmt(run.durableP50Ms, 3),
    run.policy === 'off' ? 'never (OS writeback)' : fmt(run.durableP99Ms, 3),
  ]);
  return [
    table(
      [
        'fsync',
        'appenders',
        'appends/s',
        'ack p50 ms',
        'ack p99 ms',
        'durable p50 ms',
        'durable p99 ms',
      ],
      rows,
    ),
    '',
    `Raw write(400 B)+fsync on this disk: p50 ${fmt(report.rawFsync.p50Ms, 3)} ms, p99 ` +
      `${fmt(report.rawFsync.p99Ms, 3)} ms ` +
      `(${report.rawFsync.samples} samples) — the floor for \`always\`. ${report.seconds} s ` +
      `per row; interval = ${FSYNC_INTERVAL_MS} ms.`,
  ].join('\n');
}

if (import.meta.main) {
  const at = process.argv.indexOf('--seconds');
  const seconds = at > 0 ? Number(process.argv[at + 1]) : 1.5;
  const report = await runWalBench(seconds);
  if (process.env.BENCH_JSON === '1') console.log(JSON.stringify(report));
  else console.log(walMarkdown(report));
}
