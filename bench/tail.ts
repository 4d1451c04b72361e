// Where the tail comes from (issue 15): `bun bench/profile.ts tail …` runs one load client against
// the trivial proxy and against tollgate, with every Bun process's collector and event loop on one
// timeline, and says what the requests slower than p99 and p99.9 overlapped.
//
// Usage: bun bench/profile.ts tail [nonstream|stream|both] [--seconds S] [--warmup S]
//   [--fsync always|interval|off] [--connections N] [--stall-ms T] [--snapshot-every N]
//   [--no-ablation] [--cpu-prof]
//
// Layout as bench/run.ts: the server under test (proxy, then tollgate) on core 0; the fake
// upstream and the load client (bench/tail-client.ts, `connections` loops of fetch) on core 1.
// Every Bun process runs with BUN_JSC_logGC=1 (JavaScriptCore prints a line at the end of each
// collector pause, `p=<ms>`, and the end of each collection, `cycle <ms> END`) and preloads
// bench/tail-probe.ts (a 5 ms timer's late ticks, i.e. event-loop stalls). Their stderr lines are
// stamped on arrival here with performance.timeOrigin + performance.now(), the clock the client
// stamps requests with; tollgate's snapshots are seen as file events in its log directory. The
// run with the other fsync policy (always ↔ off) is the ablation for group-commit waits.
// --cpu-prof runs tollgate under `bun --cpu-prof` (samples every ~1 ms, stamped in epoch µs) and
// lists what its JS thread ran inside its stalls; the profiler slows it, so the latency figures of
// such a run are not the ones to quote.
// Writes bench/results/tail-<mode>.json (not committed) and prints the tables.
import { readdirSync, readFileSync, watch } from 'node:fs';
import { join } from 'node:path';
import type { Subprocess } from 'bun';
import {
  ADMIN_TOKEN,
  BUN,
  CLK_TCK,
  CORE_GATEWAY,
  CORE_LOAD,
  cpuSeconds,
  drainLines,
  type FsyncPolicy,
  fmt,
  fmtInt,
  median,
  percentile,
  pinned,
  ROOT,
  rssMiB,
  spawnChild,
  stopChild,
  table,
  tempDir,
} from './lib.ts';
import type { TailClientSpec } from './tail-client.ts';

type Mode = 'nonstream' | 'stream';
type Source = 'gateway' | 'upstream' | 'client';

/** A line of a child's output and when it reached this process (epoch ms). */
interface TimedLine {
  atMs: number;
  text: string;
}

interface Observed {
  name: string;
  child: Subprocess<'pipe', 'pipe', 'pipe'>;
  pid: number;
  url: string;
  stdout: TimedLine[];
  stderr: TimedLine[];
}

const PROBE = join(ROOT, 'bench/tail-probe.ts');
const nowEpochMs = () => performance.timeOrigin + performance.now();

/**
 * Spawns a Bun process with the collector's log and the probe, keeping every line it writes with
 * its arrival time; resolves with its `url` once it prints `{"msg": readyMsg, "url": …}`.
 */
async function startObserved(
  name: string,
  core: string,
  bunArgs: string[],
  env: Record<string, string>,
  readyMsg: string,
): Promise<Observed> {
  const child = spawnChild(pinned(core, [BUN, '--preload', PROBE, ...bunArgs]), {
    env: { ...process.env, BUN_JSC_logGC: '1', ...env },
  });
  const stdout: TimedLine[] = [];
  const stderr: TimedLine[] = [];
  const ready = Promise.withResolvers<string>();
  void drainLines(child.stdout, (text) => {
    stdout.push({ atMs: nowEpochMs(), text });
    if (!text.startsWith('{')) return;
    try {
      const json = JSON.parse(text) as { msg?: string; url?: string };
      if (json.msg === readyMsg && json.url) ready.resolve(json.url);
    } catch {
      // not a JSON line
    }
  });
  void drainLines(child.stderr, (text) => stderr.push({ atMs: nowEpochMs(), text }));
  void child.exited.then((code) => {
    const tail = [...stdout, ...stderr].slice(-20).map((line) => line.text);
    ready.reject(new Error(`${name} exited with ${code} before it was ready:\n${tail.join('\n')}`));
  });
  const timer = setTimeout(() => ready.reject(new Error(`${name} not ready in 20 s`)), 20_000);
  try {
    const url = await ready.promise;
    return { name, child, pid: child.pid, url, stdout, stderr };
  } catch (error) {
    await stopChild(child);
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

interface TollgateRun extends Observed {
  key: string;
  walDir: string;
}

async function startObservedTollgate(
  upstreamUrl: string,
  fsync: FsyncPolicy,
  snapshotEvery: number | null,
  profileDir: string | null,
): Promise<TollgateRun> {
  const dir = tempDir(`tail-${fsync}`);
  const configPath = join(dir, 'config.json');
  await Bun.write(
    configPath,
    JSON.stringify({
      providers: { fake: { type: 'openai', base_url: `${upstreamUrl}/v1` } },
      models: { model_03: { provider: 'fake', upstream_model: 'up' } },
      wal: { fsync, ...(snapshotEvery ? { snapshot_every_records: snapshotEvery } : {}) },
      limits: { default_rate_limit_rpm: 100_000_000 },
    }),
  );
  const dataDir = join(dir, 'data');
  const service = await startObserved(
    `tollgate (fsync ${fsync})`,
    CORE_GATEWAY,
    [...(profileDir ? ['--cpu-prof', `--cpu-prof-dir=${profileDir}`] : []), 'src/main.ts', 'serve'],
    {
      PORT: '0',
      DATA_DIR: dataDir,
      ADMIN_TOKEN,
      LOG_LEVEL: 'info',
      GATEWAY_CONFIG: configPath,
    },
    'tollgate listening',
  );
  const response = await fetch(`${service.url}/admin/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'bench', credits: 1_000_000_000 }),
  });
  const created = (await response.json()) as { key?: string };
  if (!response.ok || !created.key)
    throw new Error(`tollgate: creating a key failed: ${response.status}`);
  return { ...service, key: created.key, walDir: join(dataDir, 'wal') };
}

// ------------------------------------------------------------------------------------------
// The timelines: collector pauses and cycles, loop stalls, snapshots.

/** One collection as JavaScriptCore's logGC tells it. */
interface Collection {
  kind: 'eden' | 'full';
  /** Heap size when it started and when it ended (KiB). */
  beforeKb: number;
  afterKb: number;
  /** Each stop of the mutator, [start, end] in epoch ms (arrival time minus `p=`). */
  pauses: Array<[number, number]>;
  /** From the start of the collection to its end, concurrent marking included. */
  cycle: [number, number];
  /**
   * What marking visited (KiB: what survived, for an eden collection) and the opaque roots it
   * found (`o=`: one per live wrapper of a native object with listeners, e.g. an AbortSignal).
   */
  visitedKb: number;
  opaqueRoots: number;
}

const START_RE = /START \w+ (\d+)kb => (Eden|Full)Collection/;
const PAUSE_RE = /p=([\d.]+) ?ms/;
const AFTER_RE = /=> (\d+)kb, p=/;
const END_RE = /cycle ([\d.]+) ?ms END\]/;
const VISITED_RE = / v=(\d+)kb/g;
const OPAQUE_RE = / o=(\d+)/g;
const EPILOGUE_RE = /(?:epilogue|finalize) ([\d.]+) ?ms\]/;

/** The collections in one process's stderr, in order. */
function parseCollections(lines: readonly TimedLine[]): Collection[] {
  const done: Collection[] = [];
  let open: Collection | null = null;
  for (const { atMs, text } of lines) {
    if (!text.startsWith('[GC<')) continue;
    const start = START_RE.exec(text);
    if (start) {
      open = {
        kind: start[2] === 'Eden' ? 'eden' : 'full',
        beforeKb: Number(start[1]),
        afterKb: NaN,
        pauses: [],
        cycle: [atMs, atMs],
        visitedKb: NaN,
        opaqueRoots: NaN,
      };
    }
    const epilogue = EPILOGUE_RE.exec(text);
    if (epilogue) {
      // The mutator's own work once the collection ended (finalizers, callbacks): a pause too.
      // (`epilogue` in Bun 1.4's JavaScriptCore, `finalize` in later ones.)
      const last = done.at(-1);
      if (last) last.pauses.push([atMs - Number(epilogue[1]), atMs]);
      continue;
    }
    if (!open) continue;
    const pause = PAUSE_RE.exec(text);
    if (pause) open.pauses.push([atMs - Number(pause[1]), atMs]);
    const after = AFTER_RE.exec(text);
    if (after) open.afterKb = Number(after[1]);
    const end = END_RE.exec(text);
    if (end) {
      open.cycle = [atMs - Number(end[1]), atMs];
      open.visitedKb = Number([...text.matchAll(VISITED_RE)].at(-1)?.[1] ?? NaN);
      open.opaqueRoots = Number([...text.matchAll(OPAQUE_RE)].at(-1)?.[1] ?? NaN);
      done.push(open);
      open = null;
    }
  }
  return done;
}

/** Late ticks of the probe's timer: the loop was busy over [due, fired]. */
function parseStalls(lines: readonly TimedLine[]): Array<[number, number]> {
  const stalls: Array<[number, number]> = [];
  for (const { text } of lines) {
    if (!text.startsWith('TAILPROBE late ')) continue;
    const [, , firedAt, late] = text.split(' ');
    stalls.push([Number(firedAt) - Number(late), Number(firedAt)]);
  }
  return stalls;
}

/** How late the probe's lines reached this process (ms): the error of every arrival stamp. */
function deliveryDelays(lines: readonly TimedLine[]): number[] {
  const delays: number[] = [];
  for (const { atMs, text } of lines)
    if (text.startsWith('TAILPROBE mark ')) delays.push(atMs - Number(text.slice(15)));
  return delays;
}

/** Disjoint, sorted intervals: how much of [start, end] they cover, by binary search. */
class Intervals {
  private readonly starts: Float64Array;
  private readonly ends: Float64Array;

  constructor(intervals: ReadonlyArray<readonly [number, number]>) {
    const sorted = [...intervals].filter(([a, b]) => b > a).sort((x, y) => x[0] - y[0]);
    const merged: Array<[number, number]> = [];
    for (const [a, b] of sorted) {
      const last = merged.at(-1);
      if (last && a <= last[1]) last[1] = Math.max(last[1], b);
      else merged.push([a, b]);
    }
    this.starts = Float64Array.from(merged, (i) => i[0]);
    this.ends = Float64Array.from(merged, (i) => i[1]);
  }

  get totalMs(): number {
    let sum = 0;
    for (let i = 0; i < this.starts.length; i++) sum += this.ends[i]! - this.starts[i]!;
    return sum;
  }

  /** Milliseconds of [start, end] inside these intervals. */
  overlapMs(start: number, end: number): number {
    let low = 0;
    let high = this.ends.length;
    while (low < high) {
      const mid = (low + high) >> 1;
      if (this.ends[mid]! <= start) low = mid + 1;
      else high = mid;
    }
    let sum = 0;
    for (let i = low; i < this.starts.length && this.starts[i]! < end; i++)
      sum += Math.min(end, this.ends[i]!) - Math.max(start, this.starts[i]!);
    return sum;
  }

  /** The parts of these intervals that lie inside `other`'s. */
  intersect(other: Intervals): Intervals {
    const parts: Array<[number, number]> = [];
    let j = 0;
    for (let i = 0; i < this.starts.length; i++) {
      while (j < other.ends.length && other.ends[j]! <= this.starts[i]!) j++;
      for (let k = j; k < other.starts.length && other.starts[k]! < this.ends[i]!; k++) {
        const a = Math.max(this.starts[i]!, other.starts[k]!);
        const b = Math.min(this.ends[i]!, other.ends[k]!);
        if (b > a) parts.push([a, b]);
      }
    }
    return new Intervals(parts);
  }

  /** The intervals as [start, end] pairs, merged and in order. */
  toArray(): Array<[number, number]> {
    return Array.from(this.starts, (start, i) => [start, this.ends[i]!]);
  }
}

/**
 * Snapshot windows from file events in the log directory (creations, renames and removals only;
 * every append changes the current segment): from the segment rolled for it (or the temp file) to
 * the last covered segment removed. The serialization before the roll (the record columns copied
 * at the call; bindings and answers in 4 ms steps) is not visible from outside: each window starts
 * SNAPSHOT_LEAD_MS early to cover it.
 */
const SNAPSHOT_LEAD_MS = 10;
const SNAPSHOT_GAP_MS = 2_000;

interface WalWatch {
  events: Array<{ atMs: number; file: string }>;
  close(): void;
}

function watchWal(dir: string): WalWatch {
  const events: WalWatch['events'] = [];
  const watcher = watch(dir, (type, file) => {
    if (type === 'rename' && file) events.push({ atMs: nowEpochMs(), file: String(file) });
  });
  return { events, close: () => watcher.close() };
}

function snapshotWindows(events: WalWatch['events']): Array<[number, number]> {
  const windows: Array<[number, number]> = [];
  for (const event of events) {
    if (event.file !== 'snapshot.json.tmp') continue;
    const last = windows.at(-1);
    // The temp file's creation opens a window; its rename (a second event) is inside it.
    if (last && event.atMs <= last[1]) continue;
    const rolled = events.filter(
      (e) => e.file.startsWith('segment-') && e.atMs >= event.atMs - 1_000 && e.atMs <= event.atMs,
    );
    const after = events.filter(
      (e) => e.atMs >= event.atMs && e.atMs <= event.atMs + SNAPSHOT_GAP_MS,
    );
    const first = rolled.at(-1)?.atMs ?? event.atMs;
    windows.push([first - SNAPSHOT_LEAD_MS, after.at(-1)!.atMs]);
  }
  return windows;
}

/** What the probe reports of the heap on SIGUSR2: as it is, and after a full collection. */
interface HeapStatsLine {
  heapSize: number;
  extraMemorySize: number;
  objectCount: number;
  top: Array<[string, number]>;
}
interface HeapReport {
  asIs: HeapStatsLine;
  live: HeapStatsLine;
}

/** Asks the probe in `server` for heap statistics (SIGUSR2) and waits for its line. */
async function heapReport(server: Observed): Promise<HeapReport | null> {
  const isHeap = (line: TimedLine) => line.text.startsWith('TAILPROBE heap ');
  const seen = server.stderr.filter(isHeap).length;
  server.child.kill('SIGUSR2');
  for (let waited = 0; waited < 5_000; waited += 20) {
    const lines = server.stderr.filter(isHeap);
    if (lines.length > seen) return JSON.parse(lines.at(-1)!.text.slice(15)) as HeapReport;
    await Bun.sleep(20);
  }
  return null;
}

// ------------------------------------------------------------------------------------------
// /metrics

async function scrapeMetrics(url: string): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const values = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line.startsWith('#') || line.length === 0) continue;
    const space = line.lastIndexOf(' ');
    values.set(line.slice(0, space), Number(line.slice(space + 1)));
  }
  return values;
}

/** The event-loop delay histogram's buckets over the run (after − before), non-cumulative. */
function loopDelayBuckets(
  before: Map<string, number>,
  after: Map<string, number>,
): Array<{ le: string; count: number }> {
  const prefix = 'tollgate_event_loop_delay_seconds_bucket{le="';
  const rows: Array<{ le: string; count: number }> = [];
  let previous = 0;
  for (const [name, value] of after) {
    if (!name.startsWith(prefix)) continue;
    const cumulative = value - (before.get(name) ?? 0);
    rows.push({ le: name.slice(prefix.length, -2), count: cumulative - previous });
    previous = cumulative;
  }
  return rows;
}

// ------------------------------------------------------------------------------------------
// One run: the client against one server.

interface Samples {
  starts: Float64Array;
  ends: Float64Array;
  latencies: Float64Array;
  errors: number;
}

async function runClient(
  spec: Omit<TailClientSpec, 'out'>,
  dir: string,
  name: string,
): Promise<{ samples: Samples; sent: number; cpuS: number; client: Observed }> {
  const out = join(dir, `${name}.f64`);
  const specPath = join(dir, `${name}.json`);
  await Bun.write(specPath, JSON.stringify({ ...spec, out } satisfies TailClientSpec));
  const done = Promise.withResolvers<{
    requests: number;
    sent: number;
    errors: number;
    firstError: string;
    cpuS: number;
  }>();
  const stdout: TimedLine[] = [];
  const stderr: TimedLine[] = [];
  const child = spawnChild(
    pinned(CORE_LOAD, [BUN, '--preload', PROBE, 'bench/tail-client.ts', specPath]),
    { env: { ...process.env, BUN_JSC_logGC: '1', BUN_CONFIG_MAX_HTTP_REQUESTS: '1024' } },
  );
  void drainLines(child.stdout, (text) => {
    stdout.push({ atMs: nowEpochMs(), text });
    if (text.includes('"tail client done"')) done.resolve(JSON.parse(text));
  });
  void drainLines(child.stderr, (text) => stderr.push({ atMs: nowEpochMs(), text }));
  void child.exited.then((code) =>
    done.reject(new Error(`client exited with ${code}: ${stdout.slice(-5).map((l) => l.text)}`)),
  );
  const summary = await done.promise;
  await child.exited;
  if (summary.errors > 0)
    process.stderr.write(`tail: ${name}: ${summary.errors} errors, first: ${summary.firstError}\n`);
  const pairs = new Float64Array(await Bun.file(out).arrayBuffer());
  const count = pairs.length / 2;
  const starts = new Float64Array(count);
  const ends = new Float64Array(count);
  const latencies = new Float64Array(count);
  for (let i = 0; i < count; i++) {
    starts[i] = pairs[i * 2]!;
    ends[i] = pairs[i * 2 + 1]!;
    latencies[i] = ends[i]! - starts[i]!;
  }
  const client: Observed = { name: 'client', child, pid: child.pid, url: '', stdout, stderr };
  return {
    samples: { starts, ends, latencies, errors: summary.errors },
    sent: summary.sent,
    cpuS: summary.cpuS,
    client,
  };
}

// ------------------------------------------------------------------------------------------
// /proc: who else used the cores, the server's threads, and when its JS thread waited for its core

/** Busy clock ticks per CPU (everything but idle and iowait) from /proc/stat. */
function busyTicksPerCpu(): number[] {
  const busy: number[] = [];
  for (const line of readFileSync('/proc/stat', 'utf8').split('\n')) {
    const match = /^cpu(\d+) (.*)$/.exec(line);
    if (!match) continue;
    const f = match[2]!.split(' ').map(Number);
    // user nice system idle iowait irq softirq steal
    busy[Number(match[1])] = f[0]! + f[1]! + f[2]! + f[5]! + f[6]! + f[7]!;
  }
  return busy;
}

/** CPU seconds per thread name (threads of one name summed) of a process. */
function threadCpu(pid: number): Map<string, { seconds: number; threads: number }> {
  const byName = new Map<string, { seconds: number; threads: number }>();
  let tids: string[] = [];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return byName;
  }
  for (const tid of tids) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
    } catch {
      continue; // the thread ended
    }
    // Thread names carry a number per pool member ("HeapHelper 3"): grouped without it.
    const name = stat
      .slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'))
      .replace(/[\s#-]*\d+$/, '');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const seconds = (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
    const cell = byName.get(name) ?? { seconds: 0, threads: 0 };
    cell.seconds += seconds;
    cell.threads++;
    byName.set(name, cell);
  }
  return byName;
}

/** Nanoseconds the thread has waited on a run queue (runnable, not running): schedstat's 2nd. */
function runQueueWaitNs(pid: number): number {
  return Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, 'utf8').split(' ')[1]);
}

/**
 * Samples the server's main (JS) thread's run-queue wait every ~5 ms: each sample that grew by
 * ≥ 0.5 ms becomes an interval ending at the sample (where in the last ~5 ms it fell is not
 * known). Also its RSS every 100 ms.
 */
function sampleServer(pid: number) {
  const waits: Array<[number, number]> = [];
  let lastNs = runQueueWaitNs(pid);
  let lastAt = nowEpochMs();
  let rssPeak = rssMiB(pid);
  let ticks = 0;
  const timer = setInterval(() => {
    try {
      const ns = runQueueWaitNs(pid);
      const at = nowEpochMs();
      const waitedMs = (ns - lastNs) / 1e6;
      if (waitedMs >= 0.5) waits.push([Math.max(lastAt, at - waitedMs), at]);
      lastNs = ns;
      lastAt = at;
      if (++ticks % 20 === 0) rssPeak = Math.max(rssPeak, rssMiB(pid));
    } catch {
      // the process ended
    }
  }, 5);
  return {
    stop: () => {
      clearInterval(timer);
      return { waits, rssPeak };
    },
  };
}

interface RunResult {
  target: string;
  fsync: FsyncPolicy | null;
  samples: Samples;
  windowMs: [number, number];
  cpuUsPerRequest: number;
  rssMiB: { start: number; peak: number; end: number };
  sources: Record<Source, Observed>;
  snapshots: Array<[number, number]>;
  /** When the server's JS thread waited for its core (run queue), from schedstat. */
  runQueueWaits: Array<[number, number]>;
  /** The probe's heap statistics just before and just after the load. */
  heap: { before: HeapReport | null; after: HeapReport | null };
  /** The server's CPU by thread over the run (ms per second of the run). */
  threads: Array<{ name: string; threads: number; msPerSecond: number }>;
  /** Share of each core's time used by processes other than ours (other benches, the system). */
  othersBusy: { gatewayCore: number; loadCore: number };
  metrics: { before: Map<string, number>; after: Map<string, number> } | null;
  /** The server's log lines (stdout) during the run. */
  logLines: TimedLine[];
  /** tollgate's CPU profile (--cpu-prof), read once it has exited. */
  cpuProfile?: CpuProfile;
}

async function measure(
  target: string,
  server: Observed,
  upstream: Observed,
  spec: Omit<TailClientSpec, 'out'>,
  dir: string,
  options: { fsync: FsyncPolicy | null; walDir: string | null; metrics: boolean },
): Promise<RunResult> {
  const metricsBefore = options.metrics ? await scrapeMetrics(server.url) : null;
  const heapBefore = await heapReport(server);
  const wal = options.walDir ? watchWal(options.walDir) : null;
  const rssStart = rssMiB(server.pid);
  const sampler = sampleServer(server.pid);
  const cpuBefore = cpuSeconds(server.pid);
  const upstreamCpuBefore = cpuSeconds(upstream.pid);
  const threadsBefore = threadCpu(server.pid);
  const busyBefore = busyTicksPerCpu();
  const startedAt = nowEpochMs();
  const logFrom = server.stdout.length;
  const { samples, sent, cpuS, client } = await runClient(
    spec,
    dir,
    target.replaceAll(/\W+/g, '-'),
  );
  const elapsedS = (nowEpochMs() - startedAt) / 1000;
  const busyAfter = busyTicksPerCpu();
  const threadsAfter = threadCpu(server.pid);
  const cpuAfter = cpuSeconds(server.pid);
  const upstreamCpu = cpuSeconds(upstream.pid) - upstreamCpuBefore;
  const { waits, rssPeak: peak } = sampler.stop();
  const rssEnd = rssMiB(server.pid);
  const rssPeak = Math.max(peak, rssEnd);
  const busyS = (core: string) => (busyAfter[Number(core)]! - busyBefore[Number(core)]!) / CLK_TCK;
  const threads = [...threadsAfter]
    .map(([name, after]) => ({
      name,
      threads: after.threads,
      msPerSecond: ((after.seconds - (threadsBefore.get(name)?.seconds ?? 0)) / elapsedS) * 1000,
    }))
    .filter((t) => t.msPerSecond > 0)
    .sort((a, b) => b.msPerSecond - a.msPerSecond);
  // The process's total counts threads that ended during the run (JavaScriptCore's collector
  // helpers come and go); /proc/<pid>/task no longer lists them.
  const listedMs = threads.reduce((sum, t) => sum + t.msPerSecond, 0);
  const endedMs = ((cpuAfter - cpuBefore) / elapsedS) * 1000 - listedMs;
  if (endedMs >= 1)
    threads.push({ name: '(threads that ended)', threads: 0, msPerSecond: endedMs });
  // Snapshot files may still be written (removed segments) just after the load: a little wait.
  if (wal) await Bun.sleep(300);
  wal?.close();
  const metricsAfter = options.metrics ? await scrapeMetrics(server.url) : null;
  const heapAfter = await heapReport(server);
  let first = Infinity;
  let last = -Infinity;
  for (let i = 0; i < samples.starts.length; i++) {
    first = Math.min(first, samples.starts[i]!);
    last = Math.max(last, samples.ends[i]!);
  }
  return {
    target,
    fsync: options.fsync,
    samples,
    windowMs: [first, last],
    // Over the whole client run, warm-up included, per request sent.
    cpuUsPerRequest: ((cpuAfter - cpuBefore) / sent) * 1e6,
    rssMiB: { start: rssStart, peak: rssPeak, end: rssEnd },
    sources: { gateway: server, upstream, client },
    snapshots: wal ? snapshotWindows(wal.events) : [],
    runQueueWaits: waits,
    heap: { before: heapBefore, after: heapAfter },
    threads,
    othersBusy: {
      gatewayCore: Math.max(0, busyS(CORE_GATEWAY) - (cpuAfter - cpuBefore)) / elapsedS,
      loadCore: Math.max(0, busyS(CORE_LOAD) - upstreamCpu - cpuS) / elapsedS,
    },
    metrics: metricsBefore && metricsAfter ? { before: metricsBefore, after: metricsAfter } : null,
    logLines: server.stdout.slice(logFrom),
  };
}

// ------------------------------------------------------------------------------------------
// Attribution

/** The causes a slow request is put down to, each one the largest overlap wins. */
const CAUSES = [
  'gateway full-GC pause',
  'gateway eden-GC pause',
  'gateway snapshot',
  'gateway JS thread waiting for its core',
  'gateway loop stall in a GC cycle (no pause, no wait)',
  'gateway loop stall outside GC cycles (no pause, no wait)',
  'client or upstream GC pause or stall',
] as const;
type Cause = (typeof CAUSES)[number] | 'only a gateway GC cycle (concurrent marking)' | 'none';
const ALL_CAUSES: Cause[] = [...CAUSES, 'only a gateway GC cycle (concurrent marking)', 'none'];
/** A cause must cover at least this much of a request to be its cause. */
const MIN_CAUSE_MS = 1;

interface SourceTimeline {
  collections: Collection[];
  edenPauses: Intervals;
  fullPauses: Intervals;
  pauses: Intervals;
  cycles: Intervals;
  stalls: Intervals;
  /** Pauses and stalls together (a pause is usually a stall too: counted once). */
  disturbances: Array<[number, number]>;
  stallCount: number;
  stallMaxMs: number;
  deliveryMs: number[];
}

function timeline(source: Observed, window: [number, number], stallMs: number): SourceTimeline {
  const inWindow = (a: number, b: number) => b >= window[0] && a <= window[1];
  const collections = parseCollections(source.stderr).filter((c) => inWindow(...c.cycle));
  const pausesOf = (kind: 'eden' | 'full' | null) =>
    collections.filter((c) => kind === null || c.kind === kind).flatMap((c) => c.pauses);
  const stalls = parseStalls(source.stderr).filter(([a, b]) => b - a >= stallMs && inWindow(a, b));
  return {
    collections,
    edenPauses: new Intervals(pausesOf('eden')),
    fullPauses: new Intervals(pausesOf('full')),
    pauses: new Intervals(pausesOf(null)),
    cycles: new Intervals(collections.map((c) => c.cycle)),
    stalls: new Intervals(stalls),
    disturbances: [...pausesOf(null), ...stalls],
    stallCount: stalls.length,
    stallMaxMs: Math.max(0, ...stalls.map(([a, b]) => b - a)),
    deliveryMs: deliveryDelays(source.stderr),
  };
}

/** The stalls minus the collector's pauses and the run-queue waits: the JS thread was busy. */
function jsBusyStalls(gateway: SourceTimeline, waits: Intervals): Intervals {
  const busy: Array<[number, number]> = [];
  const cut = new Intervals([...gateway.pauses.toArray(), ...waits.toArray()]).toArray();
  for (const [a, b] of gateway.stalls.toArray()) {
    let from = a;
    for (const [c, d] of cut) {
      if (d <= from || c >= b) continue;
      if (c > from) busy.push([from, c]);
      from = Math.max(from, d);
    }
    if (from < b) busy.push([from, b]);
  }
  return new Intervals(busy);
}

interface Attribution {
  thresholdMs: number;
  slow: number;
  /** Requests put down to each cause, and the median ms of them inside it. */
  primary: Record<Cause, { count: number; medianInsideMs: number }>;
  /** Share of these requests that overlap each kind of event at all (non-exclusive). */
  overlaps: Record<string, number>;
}

function attribute(
  run: RunResult,
  lines: Record<Source, SourceTimeline>,
  snapshots: Intervals,
  waits: Intervals,
  thresholdMs: number,
): Attribution {
  const { starts, ends, latencies } = run.samples;
  const gw = lines.gateway;
  const client = new Intervals(lines.client.disturbances);
  const upstream = new Intervals(lines.upstream.disturbances);
  const loadSide = new Intervals([...lines.client.disturbances, ...lines.upstream.disturbances]);
  const stallsInCycles = gw.stalls.intersect(gw.cycles);
  const waitsInCycles = waits.intersect(gw.cycles);
  const primary = Object.fromEntries(
    ALL_CAUSES.map((cause) => [cause, { count: 0, inside: [] as number[] }]),
  ) as Record<Cause, { count: number; inside: number[] }>;
  const overlapNames = [
    'gateway GC pause',
    'gateway GC cycle',
    'gateway loop stall',
    'gateway snapshot',
    'gateway JS thread waiting for its core',
    'client GC pause or stall',
    'upstream GC pause or stall',
  ];
  const overlapCounts = new Map(overlapNames.map((name) => [name, 0]));
  let slow = 0;
  for (let i = 0; i < latencies.length; i++) {
    if (latencies[i]! <= thresholdMs) continue;
    slow++;
    const s = starts[i]!;
    const e = ends[i]!;
    const full = gw.fullPauses.overlapMs(s, e);
    const eden = gw.edenPauses.overlapMs(s, e);
    const snapshot = snapshots.overlapMs(s, e);
    const wait = waits.overlapMs(s, e);
    // A stall in a collection's cycle that is neither a pause nor a wait is the JS thread's own
    // collector work between pauses (marking when it allocates, sweeping) or the request work
    // that happened to run then; outside any cycle it is only the latter.
    const stallAll = gw.stalls.overlapMs(s, e);
    const stallInCycle = stallsInCycles.overlapMs(s, e);
    const waitInCycle = waitsInCycles.overlapMs(s, e);
    const jsInCycle = Math.max(0, stallInCycle - full - eden - waitInCycle);
    const jsOutside = Math.max(0, stallAll - stallInCycle - (wait - waitInCycle));
    const clientMs = client.overlapMs(s, e);
    const upstreamMs = upstream.overlapMs(s, e);
    const cycle = gw.cycles.overlapMs(s, e);
    const candidates: Array<[Cause, number]> = [
      ['gateway full-GC pause', full],
      ['gateway eden-GC pause', eden],
      ['gateway snapshot', snapshot],
      ['gateway JS thread waiting for its core', wait],
      ['gateway loop stall in a GC cycle (no pause, no wait)', jsInCycle],
      ['gateway loop stall outside GC cycles (no pause, no wait)', jsOutside],
      ['client or upstream GC pause or stall', loadSide.overlapMs(s, e)],
    ];
    let best: [Cause, number] = ['none', 0];
    for (const candidate of candidates) if (candidate[1] > best[1]) best = candidate;
    if (best[1] < MIN_CAUSE_MS)
      best = cycle > 0 ? ['only a gateway GC cycle (concurrent marking)', cycle] : ['none', 0];
    primary[best[0]].count++;
    primary[best[0]].inside.push(best[1]);
    const seen: Array<[string, number]> = [
      ['gateway GC pause', full + eden],
      ['gateway GC cycle', cycle],
      ['gateway loop stall', stallAll],
      ['gateway snapshot', snapshot],
      ['gateway JS thread waiting for its core', wait],
      ['client GC pause or stall', clientMs],
      ['upstream GC pause or stall', upstreamMs],
    ];
    for (const [name, ms] of seen)
      if (ms > 0) overlapCounts.set(name, overlapCounts.get(name)! + 1);
  }
  return {
    thresholdMs,
    slow,
    primary: Object.fromEntries(
      ALL_CAUSES.map((cause) => [
        cause,
        {
          count: primary[cause].count,
          medianInsideMs: primary[cause].inside.length
            ? percentile(primary[cause].inside, 50)
            : NaN,
        },
      ]),
    ) as Attribution['primary'],
    overlaps: Object.fromEntries(
      overlapNames.map((name) => [name, slow ? overlapCounts.get(name)! / slow : NaN]),
    ),
  };
}

interface RunSummary {
  target: string;
  fsync: FsyncPolicy | null;
  requests: number;
  errors: number;
  seconds: number;
  rps: number;
  p50Ms: number;
  p99Ms: number;
  p999Ms: number;
  maxMs: number;
  cpuUsPerRequest: number;
  rssMiB: { start: number; peak: number; end: number };
  gc: Record<
    Source,
    {
      eden: number;
      full: number;
      per1000Requests: number;
      pauseMsPerSecond: number;
      cycleMsPerSecond: number;
      maxPauseMs: number;
      /** What an eden collection found alive (KiB, median): what outlived its request. */
      edenVisitedKbMedian: number;
      opaqueRootsMax: number;
      heapKb: { first: number; last: number; peak: number };
      stalls: number;
      stallMsPerSecond: number;
      stallMaxMs: number;
      deliveryP50Ms: number;
      deliveryP99Ms: number;
    }
  >;
  snapshots: number;
  runQueueWaitMsPerSecond: number;
  heap: RunResult['heap'];
  threads: RunResult['threads'];
  othersBusy: RunResult['othersBusy'];
  loopDelayBuckets: Array<{ le: string; count: number }> | null;
  p99: Attribution;
  p999: Attribution;
  /** Every request: how often any request overlaps each event (the baseline for the above). */
  all: Attribution;
  /** Everything slower than p99, for a look by hand: start (ms into the window) and latency. */
  slowRequests: Array<{ atMs: number; ms: number }>;
  logLines: Array<{ atMs: number; text: string }>;
  /** The server's collector lines during the run, as written (ms into the window). */
  gcLog: Array<{ atMs: number; text: string }>;
  /** With --cpu-prof: what the JS thread ran in the stalls that were no pause and no wait. */
  stallProfile: StallProfile | null;
  /** The server's timelines (ms into the window), for a look by hand. */
  timeline: {
    collections: Collection[];
    stalls: Array<[number, number]>;
    runQueueWaits: Array<[number, number]>;
    snapshots: Array<[number, number]>;
  };
}

function summarize(run: RunResult, stallMs: number): RunSummary {
  const { latencies } = run.samples;
  const seconds = (run.windowMs[1] - run.windowMs[0]) / 1000;
  const lines = {
    gateway: timeline(run.sources.gateway, run.windowMs, stallMs),
    upstream: timeline(run.sources.upstream, run.windowMs, stallMs),
    client: timeline(run.sources.client, run.windowMs, stallMs),
  };
  const snapshots = new Intervals(run.snapshots);
  const waits = new Intervals(run.runQueueWaits);
  const shift = ([a, b]: readonly [number, number]): [number, number] => [
    a - run.windowMs[0],
    b - run.windowMs[0],
  ];
  const sorted = Float64Array.from(latencies).sort();
  const p99 = rank(sorted, 99);
  const p999 = rank(sorted, 99.9);
  const gc = {} as RunSummary['gc'];
  for (const source of ['gateway', 'upstream', 'client'] as const) {
    const t = lines[source];
    const heaps = t.collections.flatMap((c) => [c.beforeKb, c.afterKb]).filter(Number.isFinite);
    gc[source] = {
      eden: t.collections.filter((c) => c.kind === 'eden').length,
      full: t.collections.filter((c) => c.kind === 'full').length,
      per1000Requests: (t.collections.length / latencies.length) * 1000,
      pauseMsPerSecond: t.pauses.totalMs / seconds,
      cycleMsPerSecond: t.cycles.totalMs / seconds,
      maxPauseMs: Math.max(0, ...t.collections.flatMap((c) => c.pauses.map(([a, b]) => b - a))),
      edenVisitedKbMedian: median(
        t.collections.filter((c) => c.kind === 'eden' && c.visitedKb >= 0).map((c) => c.visitedKb),
      ),
      opaqueRootsMax: Math.max(0, ...t.collections.map((c) => c.opaqueRoots || 0)),
      heapKb: {
        first: t.collections[0]?.beforeKb ?? NaN,
        last: t.collections.at(-1)?.afterKb ?? NaN,
        peak: heaps.length ? Math.max(...heaps) : NaN,
      },
      stalls: t.stallCount,
      stallMsPerSecond: t.stalls.totalMs / seconds,
      stallMaxMs: t.stallMaxMs,
      deliveryP50Ms: percentile(t.deliveryMs, 50),
      deliveryP99Ms: percentile(t.deliveryMs, 99),
    };
  }
  const slowRequests: RunSummary['slowRequests'] = [];
  for (let i = 0; i < latencies.length; i++)
    if (latencies[i]! > p99)
      slowRequests.push({ atMs: run.samples.starts[i]! - run.windowMs[0], ms: latencies[i]! });
  slowRequests.sort((a, b) => a.atMs - b.atMs);
  return {
    target: run.target,
    fsync: run.fsync,
    requests: latencies.length,
    errors: run.samples.errors,
    seconds,
    rps: latencies.length / seconds,
    p50Ms: rank(sorted, 50),
    p99Ms: p99,
    p999Ms: p999,
    maxMs: rank(sorted, 100),
    cpuUsPerRequest: run.cpuUsPerRequest,
    rssMiB: run.rssMiB,
    gc,
    snapshots: run.snapshots.length,
    runQueueWaitMsPerSecond: waits.totalMs / seconds,
    heap: run.heap,
    threads: run.threads,
    othersBusy: run.othersBusy,
    loopDelayBuckets: run.metrics ? loopDelayBuckets(run.metrics.before, run.metrics.after) : null,
    p99: attribute(run, lines, snapshots, waits, p99),
    p999: attribute(run, lines, snapshots, waits, p999),
    all: attribute(run, lines, snapshots, waits, -Infinity),
    slowRequests,
    logLines: run.logLines.map((line) => ({
      atMs: line.atMs - run.windowMs[0],
      text: line.text,
    })),
    stallProfile: run.cpuProfile
      ? stallProfile(run.cpuProfile, run.windowMs, jsBusyStalls(lines.gateway, waits))
      : null,
    timeline: {
      collections: lines.gateway.collections.map((c) => ({
        ...c,
        pauses: c.pauses.map(shift),
        cycle: shift(c.cycle),
      })),
      stalls: lines.gateway.stalls.toArray().map(shift),
      runQueueWaits: waits.toArray().map(shift),
      snapshots: run.snapshots.map(shift),
    },
    gcLog: run.sources.gateway.stderr
      .filter((l) => l.text.startsWith('[GC<') && l.atMs >= run.windowMs[0])
      .filter((l) => l.atMs <= run.windowMs[1])
      .map((l) => ({ atMs: l.atMs - run.windowMs[0], text: l.text })),
  };
}

// ------------------------------------------------------------------------------------------
// With --cpu-prof: what the JS thread ran during its stalls (its samples carry epoch µs).

interface CpuProfile {
  nodes: Array<{
    id: number;
    callFrame: { functionName: string; url: string; lineNumber: number };
    children?: number[];
  }>;
  samples: number[];
  timeDeltas: number[];
  startTime: number;
}

interface StallProfile {
  /** Samples inside the JS-busy parts of the stalls, and in the whole window. */
  samplesInStalls: number;
  samplesInWindow: number;
  /** By self frame: share of the stall samples, and of all samples in the window. */
  self: Array<{ frame: string; inStalls: number; overall: number }>;
  /** By the innermost frame of our own code (src/) on the stack. */
  ours: Array<{ frame: string; inStalls: number; overall: number }>;
  /**
   * Stretches of ≥ LONG_STRETCH_MS in which one src/ frame stayed on the JS thread's stack in every
   * sample (outermost such frame), ms into the window: one long call, or async continuations run
   * back to back without a return to the loop, or collector work done inside a JS frame (marking
   * on allocation, sweeping), or the thread preempted there (the sampler still sees its stack).
   */
  longCalls: Array<{ frame: string; atMs: number; ms: number }>;
}

const LONG_STRETCH_MS = 8;
/** The sampler's interval is ~1 ms; a longer silence ends every stretch. */
const SAMPLE_GAP_MS = 3;

function frameLabel(frame: { functionName: string; url: string; lineNumber: number }): string {
  const fn = frame.functionName || '(anonymous)';
  if (!frame.url) return fn;
  const path = frame.url.replace(/^file:\/\//, '');
  const short = path.startsWith(ROOT)
    ? path.slice(ROOT.length + 1)
    : path.replace(/^.*node_modules\//, '');
  return `${fn} ${short}:${frame.lineNumber + 1}`;
}

function stallProfile(
  profile: CpuProfile,
  window: [number, number],
  busy: Intervals,
  top = 12,
): StallProfile {
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const parent = new Map<number, number>();
  for (const node of profile.nodes)
    for (const child of node.children ?? []) parent.set(child, node.id);
  const oursOf = (id: number): string => {
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at)) {
      const frame = byId.get(at)!.callFrame;
      if (frame.url.includes('/src/')) return frameLabel(frame);
    }
    return '(no src/ frame: Bun, the collector or idle)';
  };
  const counts = (name: 'self' | 'ours') => ({
    stalls: new Map<string, number>(),
    all: new Map<string, number>(),
    name,
  });
  const self = counts('self');
  const ours = counts('ours');
  let inStalls = 0;
  let inWindow = 0;
  let atUs = profile.startTime;
  // Open stretches: src/ frame (by node id, so one call site) → first and last sample time.
  const open = new Map<number, { from: number; to: number }>();
  const longCalls: StallProfile['longCalls'] = [];
  let lastSampleMs = -Infinity;
  const close = (id: number, stretch: { from: number; to: number }) => {
    const ms = stretch.to - stretch.from;
    if (ms < LONG_STRETCH_MS) return;
    // Only the outermost frame of a stretch: its callees' stretches are inside it.
    for (let at = parent.get(id); at !== undefined; at = parent.get(at)) {
      const outer = open.get(at);
      if (outer && outer.from <= stretch.from && outer.to >= stretch.to) return;
    }
    longCalls.push({
      frame: frameLabel(byId.get(id)!.callFrame),
      atMs: stretch.from - window[0],
      ms,
    });
  };
  for (let i = 0; i < profile.samples.length; i++) {
    atUs += profile.timeDeltas[i] ?? 0;
    const atMs = atUs / 1000;
    if (atMs < window[0] || atMs > window[1]) continue;
    inWindow++;
    // A gap in the samples (the thread idle or descheduled): nothing is known to span it.
    if (atMs - lastSampleMs > SAMPLE_GAP_MS) {
      for (const [frameId, stretch] of open) close(frameId, stretch);
      open.clear();
    }
    lastSampleMs = atMs;
    const id = profile.samples[i]!;
    const onStack = new Set<number>();
    for (let at: number | undefined = id; at !== undefined; at = parent.get(at))
      if (byId.get(at)!.callFrame.url.includes('/src/')) onStack.add(at);
    for (const [frameId, stretch] of open) {
      if (onStack.has(frameId)) stretch.to = atMs;
      else {
        close(frameId, stretch);
        open.delete(frameId);
      }
    }
    for (const frameId of onStack)
      if (!open.has(frameId)) open.set(frameId, { from: atMs, to: atMs });
    const selfName = frameLabel(byId.get(id)!.callFrame);
    const oursName = oursOf(id);
    self.all.set(selfName, (self.all.get(selfName) ?? 0) + 1);
    ours.all.set(oursName, (ours.all.get(oursName) ?? 0) + 1);
    if (busy.overlapMs(atMs - 0.01, atMs + 0.01) > 0) {
      inStalls++;
      self.stalls.set(selfName, (self.stalls.get(selfName) ?? 0) + 1);
      ours.stalls.set(oursName, (ours.stalls.get(oursName) ?? 0) + 1);
    }
  }
  const rows = (c: ReturnType<typeof counts>) =>
    [...c.stalls]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([frame, n]) => ({
        frame,
        inStalls: n / inStalls,
        overall: (c.all.get(frame) ?? 0) / inWindow,
      }));
  for (const [frameId, stretch] of open) close(frameId, stretch);
  longCalls.sort((a, b) => b.ms - a.ms);
  return {
    samplesInStalls: inStalls,
    samplesInWindow: inWindow,
    self: rows(self),
    ours: rows(ours),
    longCalls: longCalls.slice(0, top),
  };
}

// ------------------------------------------------------------------------------------------
// Report

/** Nearest-rank percentile of already sorted values (lib.ts's `percentile` takes number[]). */
function rank(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return NaN;
  return sorted[
    Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  ]!;
}

const pct = (share: number) => (Number.isFinite(share) ? `${fmt(share * 100, 0)} %` : 'n/a');
const mib = (kb: number) => fmt(kb / 1024, 1);

function report(mode: Mode, runs: RunSummary[], connections: number, stallMs: number): string {
  const name = (r: RunSummary) => (r.fsync ? `${r.target} (fsync ${r.fsync})` : r.target);
  const proxy = runs.find((r) => r.target === 'proxy');
  const out: string[] = [
    `## ${mode}, ${connections} connections`,
    '',
    table(
      [
        'target',
        'requests',
        'req/s',
        'p50 ms',
        'p99 ms',
        'p99.9 ms',
        'max ms',
        'p99 ÷ proxy',
        'CPU µs/req',
        'RSS MiB start / peak / end',
        'JS thread run-queue wait ms/s',
        'others on core 0 / 1',
      ],
      runs.map((r) => [
        name(r),
        fmtInt(r.requests) + (r.errors ? ` (${r.errors} errors)` : ''),
        fmtInt(r.rps),
        fmt(r.p50Ms),
        fmt(r.p99Ms),
        fmt(r.p999Ms),
        fmt(r.maxMs),
        proxy ? fmt(r.p99Ms / proxy.p99Ms) : 'n/a',
        fmt(r.cpuUsPerRequest, 1),
        `${fmt(r.rssMiB.start, 0)} / ${fmt(r.rssMiB.peak, 0)} / ${fmt(r.rssMiB.end, 0)}`,
        fmt(r.runQueueWaitMsPerSecond, 0),
        `${pct(r.othersBusy.gatewayCore)} / ${pct(r.othersBusy.loadCore)}`,
      ]),
    ),
    '',
    `Collector and event loop per process over each run (stall: the probe's 5 ms timer late by ` +
      `≥ ${stallMs} ms; delivery: how late the probe's lines reached the bench, the error of ` +
      'every timestamp below):',
    '',
    table(
      [
        'run / process',
        'GCs eden + full',
        'GCs per 1k req',
        'pause ms/s',
        'max pause ms',
        'eden survivors KiB (median)',
        'opaque roots (max)',
        'cycle ms/s',
        'heap MiB first → last (peak)',
        'stalls',
        'stall ms/s',
        'max stall ms',
        'delivery p50 / p99 ms',
      ],
      runs.flatMap((r) =>
        (['gateway', 'upstream', 'client'] as const).map((source) => {
          const g = r.gc[source];
          return [
            `${name(r)} / ${source}`,
            `${g.eden} + ${g.full}`,
            fmt(g.per1000Requests, 1),
            fmt(g.pauseMsPerSecond, 1),
            fmt(g.maxPauseMs, 1),
            fmtInt(g.edenVisitedKbMedian),
            fmtInt(g.opaqueRootsMax),
            fmt(g.cycleMsPerSecond, 0),
            `${mib(g.heapKb.first)} → ${mib(g.heapKb.last)} (${mib(g.heapKb.peak)})`,
            String(g.stalls),
            fmt(g.stallMsPerSecond, 1),
            fmt(g.stallMaxMs, 1),
            `${fmt(g.deliveryP50Ms)} / ${fmt(g.deliveryP99Ms)}`,
          ];
        }),
      ),
    ),
    '',
  ];
  out.push(
    "The server's CPU by thread (ms per second of the run; all its threads share core " +
      `${CORE_GATEWAY}):`,
    '',
    table(
      ['run', 'threads'],
      runs.map((r) => [
        name(r),
        r.threads
          .slice(0, 8)
          .map((t) => `${t.name}${t.threads > 1 ? ` ×${t.threads}` : ''}: ${fmt(t.msPerSecond, 0)}`)
          .join(', '),
      ]),
    ),
    '',
    "The server's heap just before and just after the load (bun:jsc heapStats on SIGUSR2 to " +
      'the probe: as it is, dead objects not yet collected included, and what a full collection ' +
      'keeps; extra: memory outside the heap its objects own, e.g. buffers):',
    '',
    table(
      [
        'run',
        'heap MiB',
        'kept MiB',
        'extra MiB',
        'objects',
        'kept',
        'commonest types after the load',
      ],
      runs.map((r) => {
        const { before, after } = r.heap;
        const both = (f: (h: HeapReport) => string) =>
          `${before ? f(before) : 'n/a'} → ${after ? f(after) : 'n/a'}`;
        const types = (line: HeapStatsLine | undefined) =>
          (line?.top ?? [])
            .slice(0, 6)
            .map(([type, count]) => `${type} ${fmtInt(count)}`)
            .join(', ');
        return [
          name(r),
          both((h) => fmt(h.asIs.heapSize / 2 ** 20, 1)),
          both((h) => fmt(h.live.heapSize / 2 ** 20, 1)),
          both((h) => fmt(h.live.extraMemorySize / 2 ** 20, 1)),
          both((h) => fmtInt(h.asIs.objectCount)),
          both((h) => fmtInt(h.live.objectCount)),
          `as is: ${types(after?.asIs)}; kept: ${types(after?.live)}`,
        ];
      }),
    ),
    '',
  );
  for (const level of ['p99', 'p999'] as const) {
    out.push(
      `What the requests slower than ${level === 'p99' ? 'p99' : 'p99.9'} overlapped: each put ` +
        `down to the event that covers most of it (≥ ${MIN_CAUSE_MS} ms; "median ms" is how ` +
        'much of the request it covers):',
      '',
      table(
        ['cause', ...runs.map((r) => `${name(r)}: > ${fmt(r[level].thresholdMs, 1)} ms`)],
        ALL_CAUSES.map((cause) => [
          cause,
          ...runs.map((r) => {
            const a = r[level];
            const cell = a.primary[cause];
            if (cell.count === 0) return '–';
            const inside = Number.isFinite(cell.medianInsideMs)
              ? `, median ${fmt(cell.medianInsideMs, 1)} ms`
              : '';
            return `${pct(cell.count / a.slow)} (${cell.count}${inside})`;
          }),
        ]),
      ),
      '',
      'Share of them that overlap each event at all (not exclusive), and in brackets the ' +
        'share of all requests that do (what chance alone gives):',
      '',
      table(
        ['event', ...runs.map(name)],
        Object.keys(runs[0]![level].overlaps).map((event) => [
          event,
          ...runs.map((r) => `${pct(r[level].overlaps[event]!)} (${pct(r.all.overlaps[event]!)})`),
        ]),
      ),
      '',
    );
  }
  for (const r of runs) {
    const p = r.stallProfile;
    if (!p) continue;
    const rows = (list: StallProfile['self']) =>
      list.map((row) => [row.frame.replaceAll('|', '\\|'), pct(row.inStalls), pct(row.overall)]);
    out.push(
      `${name(r)}, CPU profile: ${fmtInt(p.samplesInStalls)} of ${fmtInt(p.samplesInWindow)} ` +
        'samples fell in JS-busy stalls (a stall minus pauses and run-queue waits). Where:',
      '',
      table(['self frame', 'in stalls', 'overall'], rows(p.self)),
      '',
      table(['innermost src/ frame on the stack', 'in stalls', 'overall'], rows(p.ours)),
      '',
      `Stretches ≥ ${LONG_STRETCH_MS} ms with one src/ frame on the stack in every sample ` +
        '(a long call, continuations back to back, collector work inside JS frames, or the ' +
        'thread preempted there): ' +
        (p.longCalls.length === 0
          ? 'none.'
          : p.longCalls
              .map((c) => `${c.frame} ${fmt(c.ms, 0)} ms at +${fmt(c.atMs / 1000, 2)} s`)
              .join('; ')),
      '',
    );
  }
  const tollgates = runs.filter((r) => r.loopDelayBuckets);
  if (tollgates.length > 0) {
    const les = tollgates[0]!.loopDelayBuckets!.map((b) => b.le);
    out.push(
      "tollgate's own event-loop delay histogram over the run (/metrics " +
        'tollgate_event_loop_delay_seconds, a 20 ms timer; ticks per bucket):',
      '',
      table(
        ['run', ...les.map((le) => `≤ ${le} s`)],
        tollgates.map((r) => [name(r), ...r.loopDelayBuckets!.map((b) => fmtInt(b.count))]),
      ),
      '',
    );
    for (const r of tollgates) {
      const lines = r.logLines.filter((l) => l.atMs >= -1000);
      out.push(
        `${name(r)}: ${r.snapshots} snapshot(s) in the run; its log lines during the run: ` +
          (lines.length === 0
            ? 'none'
            : lines
                .slice(0, 5)
                .map((l) => `+${fmt(l.atMs / 1000, 2)} s ${l.text.slice(0, 160)}`)
                .join('; ')),
      );
    }
    out.push('');
  }
  return out.join('\n');
}

// ------------------------------------------------------------------------------------------

function option(args: string[], name: string, fallback: string): string {
  const at = args.indexOf(name);
  return at >= 0 && args[at + 1] !== undefined ? args[at + 1]! : fallback;
}

async function tailMode(
  mode: Mode,
  settings: {
    seconds: number;
    warmupS: number;
    fsync: FsyncPolicy;
    connections: number;
    stallMs: number;
    snapshotEvery: number | null;
    ablation: boolean;
    cpuProf: boolean;
  },
): Promise<RunSummary[]> {
  const dir = tempDir(`tail-${mode}`);
  const upstream = await startObserved(
    'upstream',
    CORE_LOAD,
    ['bench/upstream.ts', '0'],
    {},
    'upstream listening',
  );
  const body = JSON.stringify({
    model: 'model_03',
    messages: [{ role: 'user', content: 'hello' }],
    max_completion_tokens: 64,
    ...(mode === 'stream' ? { stream: true } : {}),
  });
  const base = {
    body,
    stream: mode === 'stream',
    connections: settings.connections,
    warmupMs: settings.warmupS * 1000,
    measureMs: settings.seconds * 1000,
  };
  const runs: RunSummary[] = [];
  const proxy = await startObserved(
    'proxy',
    CORE_GATEWAY,
    ['bench/proxy.ts', upstream.url, '0'],
    {},
    'proxy listening',
  );
  const proxyRun = await measure(
    'proxy',
    proxy,
    upstream,
    {
      ...base,
      url: `${proxy.url}/v1/chat/completions`,
      headers: { 'content-type': 'application/json' },
    },
    dir,
    { fsync: null, walDir: null, metrics: false },
  );
  await stopChild(proxy.child);
  runs.push(summarize(proxyRun, settings.stallMs));
  const policies: FsyncPolicy[] = [settings.fsync];
  if (settings.ablation) policies.push(settings.fsync === 'off' ? 'always' : 'off');
  for (const fsync of policies) {
    const profileDir = settings.cpuProf ? tempDir(`tail-prof-${fsync}`) : null;
    const tollgate = await startObservedTollgate(
      upstream.url,
      fsync,
      settings.snapshotEvery,
      profileDir,
    );
    const run = await measure(
      'tollgate',
      tollgate,
      upstream,
      {
        ...base,
        url: `${tollgate.url}/api/v1/chat/completions`,
        headers: {
          'content-type': 'application/json',
          authorization: `Bearer ${tollgate.key}`,
        },
      },
      dir,
      { fsync, walDir: tollgate.walDir, metrics: true },
    );
    await stopChild(tollgate.child, 15_000);
    if (profileDir) {
      const file = readdirSync(profileDir).find((f) => f.endsWith('.cpuprofile'));
      if (file) run.cpuProfile = (await Bun.file(join(profileDir, file)).json()) as CpuProfile;
    }
    runs.push(summarize(run, settings.stallMs));
  }
  await stopChild(upstream.child);
  return runs;
}

/** `bun bench/profile.ts tail …` (the arguments after `tail`); returns the exit code. */
export async function tailMain(args: string[]): Promise<number> {
  const which = args.find((a) => a === 'nonstream' || a === 'stream' || a === 'both') ?? 'both';
  const fsync = option(args, '--fsync', 'always') as FsyncPolicy;
  if (!['always', 'interval', 'off'].includes(fsync))
    throw new Error(`--fsync must be always, interval or off, not ${fsync}`);
  const snapshotEvery = Number(option(args, '--snapshot-every', '0'));
  const settings = {
    seconds: Number(option(args, '--seconds', '15')),
    warmupS: Number(option(args, '--warmup', '2')),
    fsync,
    connections: Number(option(args, '--connections', '32')),
    stallMs: Number(option(args, '--stall-ms', '5')),
    snapshotEvery: snapshotEvery > 0 ? snapshotEvery : null,
    ablation: !args.includes('--no-ablation'),
    cpuProf: args.includes('--cpu-prof'),
  };
  const modes: Mode[] = which === 'both' ? ['nonstream', 'stream'] : [which as Mode];
  for (const mode of modes) {
    const runs = await tailMode(mode, settings);
    console.log(report(mode, runs, settings.connections, settings.stallMs));
    const path = join(ROOT, 'bench/results', `tail-${mode}.json`);
    await Bun.write(path, `${JSON.stringify({ mode, settings, runs }, null, 1)}\n`);
    console.log(`Written: ${path}\n`);
  }
  return 0;
}
