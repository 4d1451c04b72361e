// `npm run bench`: the whole server side by side (direct, trivial proxy, tollgate), memory under
// 1,000 open streams, the WAL per fsync policy and the micro benchmarks, in one run; writes
// bench/results/latest.{md,json}.
//
// Usage: bun bench/run.ts [--rounds N] [--quick] [--skip micro,wal,memory,latency,server]
//   BENCH_JSON=1 prints the JSON instead of the markdown (both files are written either way).
//   Layout: every gateway (proxy, tollgate) runs on core 0; the upstream, wrk and the Bun clients
//   on core 1.
import { mkdirSync, writeFileSync } from 'node:fs';
import { arch, cpus, release } from 'node:os';
import { join } from 'node:path';
import type { LatencySamples, LatencySpec } from './client.ts';
import {
  ANTHROPIC_MODEL,
  BUN,
  CORE_GATEWAY,
  CORE_LOAD,
  cleanup,
  cpuSeconds,
  drainLines,
  ensureWrk,
  fmt,
  fmtInt,
  fmtRatio,
  installSignalCleanup,
  ioStallMs,
  median,
  percentile,
  pinned,
  ROOT,
  range,
  rssMiB,
  runWrk,
  type Service,
  spawnChild,
  startProxyProcess,
  startTollgate,
  startUpstreamProcess,
  stopChild,
  type Tollgate,
  table,
  tempDir,
  threadCpu,
  threadCpuSince,
  type WrkResult,
  wrkScript,
} from './lib.ts';
import type { MicroResult } from './micro.ts';
import { CHUNKS_PER_STREAM } from './upstream.ts';
import { type WalReport, walMarkdown } from './wal.ts';

// ------------------------------------------------------------------------------------------
// Options

const argv = process.argv.slice(2);
const quick = argv.includes('--quick');
const roundsAt = argv.indexOf('--rounds');
const ROUNDS = roundsAt >= 0 ? Math.max(1, Number(argv[roundsAt + 1])) : quick ? 1 : 3;
const skipAt = argv.indexOf('--skip');
const SKIP = new Set(skipAt >= 0 ? (argv[skipAt + 1] ?? '').split(',') : []);
const LOAD_SECONDS = quick ? 1 : 3; // per wrk run at 32 connections
const LATENCY_SECONDS = quick ? 1 : 2; // per wrk run at 1 connection
// Per target and mode. A fresh tollgate's JIT threads take ~160 ms a second of its core through
// its first 3 s of load and under 15 after (bench/README, issue 15): a 1 s warm-up left that in the
// first round's figures. What is measured is a gateway that has been running, as users run it.
const WARMUP_SECONDS = quick ? 1 : 3;
// Then each gateway process goes on taking both kinds of load, WARMUP_STEP_SECONDS at a time, until
// its compiler threads used under JIT_SETTLED_SHARE of the step's time (at most
// WARMUP_MAX_SECONDS): on a slower machine (the VM of 2026-11-24 charges about twice the old one's
// CPU per request) 3 s left tollgate's JIT at 30-40 µs of a stream's ~500 in the first two rounds,
// on the same core as the gateway, in its CPU and its p99 (bench/README, issue 15).
const WARMUP_STEP_SECONDS = 2;
const JIT_SETTLED_SHARE = 0.02;
const WARMUP_MAX_SECONDS = quick ? 0 : 40;
// Every round runs one mode on all targets, then the other. JavaScriptCore compiles each function
// for the shapes it has seen, so a gateway's first seconds of a mode after the other mode recompile
// what both share (the actor, the router, the answer): 0.3-0.5 s of its core per switch here, a
// JIT burst that landed in the first run after it (bench/README, stop 32). A gateway's traffic does
// not change mode every 3 s, so before a mode's runs each gateway takes that mode unmeasured for
// this long, and what its JIT threads took meanwhile is reported on its own.
const SWITCH_WARMUP_SECONDS = quick ? 0 : 2;
/** JavaScriptCore's compiler threads' name (see threadCpu). */
const JIT_THREAD = 'JITWorker';
const LATENCY_REQUESTS = quick ? 100 : 300; // per target and mode, in the sequential client
const OPEN_STREAMS = 1_000;
/** How often a run samples the gateway's RSS for its peak. */
const RSS_SAMPLE_MS = 50;
const MEMORY_ROUNDS = quick ? 2 : 5;

const log = (line: string) => process.stderr.write(`${line}\n`);

// ------------------------------------------------------------------------------------------
// Targets

type Mode = 'nonstream' | 'stream';
type TargetName =
  | 'direct'
  | 'proxy'
  | 'tollgate'
  | 'tollgate-interval'
  | 'tollgate-off'
  | 'tollgate-anthropic';

interface Target {
  name: TargetName;
  label: string;
  url: string;
  /** The process whose CPU and RSS count as the gateway's (null for direct). */
  pid: number | null;
  headers: Record<string, string>;
}

const BODY_BASE = {
  model: 'model_03',
  messages: [{ role: 'user', content: 'hello' }],
  max_completion_tokens: 64,
};
function bodyFor(target: Target, mode: Mode): string {
  // Direct and proxy reach the fake upstream, whose model is "up"; tollgate maps model_03 onto it
  // through its openai provider, ANTHROPIC_MODEL through its anthropic one.
  const model =
    target.name === 'direct' || target.name === 'proxy'
      ? 'up'
      : target.name === 'tollgate-anthropic'
        ? ANTHROPIC_MODEL
        : 'model_03';
  return JSON.stringify({ ...BODY_BASE, model, ...(mode === 'stream' ? { stream: true } : {}) });
}

const EXPECTED_TEXT = Array.from(
  { length: CHUNKS_PER_STREAM },
  (_, i) => `tok${String(i + 1).padStart(2, '0')} `,
).join('');

/** One request per target and mode before measuring: a wrong answer must not be benchmarked. */
async function sanityCheck(target: Target, mode: Mode): Promise<void> {
  const response = await fetch(target.url, {
    method: 'POST',
    headers: target.headers,
    body: bodyFor(target, mode),
  });
  const text = await response.text();
  const fail = (why: string) => {
    throw new Error(`sanity check ${target.label} ${mode}: ${why}\n${text.slice(0, 500)}`);
  };
  if (response.status !== 200) fail(`HTTP ${response.status}`);
  if (mode === 'nonstream') {
    const json = JSON.parse(text) as { choices?: Array<{ message?: { content?: string } }> };
    if (json.choices?.[0]?.message?.content !== EXPECTED_TEXT) fail('unexpected content');
    return;
  }
  let content = '';
  let events = 0;
  for (const block of text.split('\n\n')) {
    if (!block.startsWith('data: ')) continue;
    events++;
    const data = block.slice(6);
    if (data === '[DONE]') continue;
    const chunk = JSON.parse(data) as { choices?: Array<{ delta?: { content?: string } }> };
    content += chunk.choices?.[0]?.delta?.content ?? '';
  }
  if (content !== EXPECTED_TEXT) fail(`unexpected streamed content ${JSON.stringify(content)}`);
  if (!text.includes('data: [DONE]')) fail('no [DONE]');
  if (events < CHUNKS_PER_STREAM + 2) fail(`only ${events} events`);
}

// ------------------------------------------------------------------------------------------
// Whole server

interface ServerRun {
  round: number;
  mode: Mode;
  connections: number;
  target: TargetName;
  wrk: WrkResult;
  gatewayCpuUsPerRequest: number | null;
  /** The part of it spent by the JIT's compiler threads: near 0 once the warm-up did its work. */
  gatewayJitUsPerRequest: number | null;
  upstreamCpuUsPerRequest: number;
  gatewayRssMiB: number | null;
  /** The most RSS seen during the run (sampled every 50 ms), issue 15's peak. */
  gatewayRssPeakMiB: number | null;
  /** Milliseconds of the run in which the machine waited on its disk (PSI), null without PSI. */
  ioStallMs: number | null;
}

/**
 * A gateway process's unmeasured load of a mode before that mode's runs in a round (see
 * SWITCH_WARMUP_SECONDS): each target it serves, in turn.
 */
interface SwitchWarmup {
  round: number;
  mode: Mode;
  /** The labels of the targets the process serves, joined. */
  gateway: string;
  /** CPU milliseconds its JIT threads took during it: the recompiling a mode switch costs. */
  jitMs: number;
}

/** Each run's disk stall (PSI, ms), in round order: which rounds the disk disturbed. */
function diskStalls(runs: ServerRun[]): string {
  return runs.some((run) => run.ioStallMs === null)
    ? 'n/a'
    : runs.map((run) => fmt(run.ioStallMs!, 0)).join(' / ');
}

async function measure(
  target: Target,
  mode: Mode,
  connections: number,
  seconds: number,
  script: string,
  upstreamPid: number,
): Promise<Omit<ServerRun, 'round'>> {
  const cpuBefore = target.pid === null ? 0 : cpuSeconds(target.pid);
  const jitBefore = target.pid === null ? null : threadCpu(target.pid, JIT_THREAD);
  const upstreamBefore = cpuSeconds(upstreamPid);
  const ioStallBefore = ioStallMs();
  let peakMiB = target.pid === null ? 0 : rssMiB(target.pid);
  const sampler =
    target.pid === null
      ? null
      : setInterval(() => (peakMiB = Math.max(peakMiB, rssMiB(target.pid!))), RSS_SAMPLE_MS);
  const wrk = await runWrk(target.url, script, connections, seconds).finally(() =>
    clearInterval(sampler ?? undefined),
  );
  const cpuAfter = target.pid === null ? 0 : cpuSeconds(target.pid);
  const jitS =
    target.pid === null ? 0 : threadCpuSince(target.pid, JIT_THREAD, jitBefore ?? new Map());
  const upstreamAfter = cpuSeconds(upstreamPid);
  const ioStallAfter = ioStallMs();
  if (wrk.errors > 0 || wrk.non2xx > 0) {
    log(
      `  ! ${target.label} ${mode} c${connections}: ${wrk.errors} socket errors, ${wrk.non2xx} ` +
        `non-2xx answers`,
    );
  }
  return {
    mode,
    connections,
    target: target.name,
    wrk,
    gatewayCpuUsPerRequest:
      target.pid === null ? null : ((cpuAfter - cpuBefore) * 1e6) / Math.max(1, wrk.requests),
    gatewayJitUsPerRequest: target.pid === null ? null : (jitS * 1e6) / Math.max(1, wrk.requests),
    upstreamCpuUsPerRequest: ((upstreamAfter - upstreamBefore) * 1e6) / Math.max(1, wrk.requests),
    gatewayRssMiB: target.pid === null ? null : rssMiB(target.pid),
    gatewayRssPeakMiB: target.pid === null ? null : Math.max(peakMiB, rssMiB(target.pid)),
    ioStallMs:
      ioStallBefore === null || ioStallAfter === null ? null : ioStallAfter - ioStallBefore,
  };
}

/**
 * Which targets run at which connection count. The anthropic adapter (issue 14) runs at 32 only:
 * its CPU per request beside the openai adapter's is the figure; the latency rows would add time,
 * not information (both share everything above the provider).
 */
const PLAN: Array<{ connections: number; targets: TargetName[]; seconds: number }> = [
  {
    connections: 32,
    targets: ['direct', 'proxy', 'tollgate', 'tollgate-anthropic', 'tollgate-off'],
    seconds: LOAD_SECONDS,
  },
  {
    connections: 1,
    targets: ['direct', 'proxy', 'tollgate', 'tollgate-interval', 'tollgate-off'],
    seconds: LATENCY_SECONDS,
  },
];

/**
 * The order of one round's runs at one connection count: the plan's targets rotated by the round,
 * so no target always runs first (or right after the same one). The anthropic adapter then runs
 * next to the openai one, after it in even rounds and before it in odd ones: their ratio is the
 * figure, and two runs back to back see more of the same load from the rest of this shared machine
 * than two with other runs between them; the swap keeps either from always inheriting the other's
 * garbage (they share one process).
 */
function runOrder(names: readonly TargetName[], round: number): TargetName[] {
  const rest: TargetName[] = names.filter((name) => name !== 'tollgate-anthropic');
  const order = rest.map((_, i) => rest[(i + round) % rest.length]!);
  if (rest.length === names.length) return order;
  const openai = order.indexOf('tollgate');
  order.splice(round % 2 === 0 ? openai + 1 : openai, 0, 'tollgate-anthropic');
  return order;
}

/**
 * Each gateway process (the targets sharing one are loaded in turn) takes both kinds of load until
 * its compiler threads went quiet: under JIT_SETTLED_SHARE of a step's wall time.
 */
async function warmUntilJitSettles(
  targets: Record<TargetName, Target>,
  scripts: Map<string, string>,
): Promise<void> {
  for (const [pid, sharing] of byProcess(targets)) {
    let spentS = 0;
    let share = 1;
    while (spentS < WARMUP_MAX_SECONDS) {
      const jitBefore = threadCpu(pid, JIT_THREAD);
      const startedMs = performance.now();
      for (const target of sharing) {
        for (const mode of ['nonstream', 'stream'] as const) {
          await runWrk(
            target.url,
            scripts.get(`${target.name}/${mode}`)!,
            32,
            WARMUP_STEP_SECONDS / 2,
          );
        }
      }
      const wallS = (performance.now() - startedMs) / 1000;
      spentS += wallS;
      share = threadCpuSince(pid, JIT_THREAD, jitBefore) / wallS;
      if (share < JIT_SETTLED_SHARE) break;
    }
    log(
      `warm-up: ${sharing.map((t) => t.label).join(' + ')}: ${fmt(spentS, 0)} s more, ` +
        `JIT threads ${fmt(share * 100, 1)} % of the last step`,
    );
  }
}

/** The targets by the gateway process serving them (direct, with none, left out). */
function byProcess(targets: Record<TargetName, Target>): Map<number, Target[]> {
  const out = new Map<number, Target[]>();
  for (const target of Object.values(targets)) {
    if (target.pid === null) continue;
    const sharing = out.get(target.pid) ?? [];
    sharing.push(target);
    out.set(target.pid, sharing);
  }
  return out;
}

/** Each gateway takes `mode` unmeasured before the round's runs of it; its JIT time is kept. */
async function switchWarmup(
  targets: Record<TargetName, Target>,
  scripts: Map<string, string>,
  mode: Mode,
  round: number,
): Promise<SwitchWarmup[]> {
  const out: SwitchWarmup[] = [];
  if (SWITCH_WARMUP_SECONDS === 0) return out;
  for (const [pid, sharing] of byProcess(targets)) {
    const jitBefore = threadCpu(pid, JIT_THREAD);
    for (const target of sharing)
      await runWrk(target.url, scripts.get(`${target.name}/${mode}`)!, 32, SWITCH_WARMUP_SECONDS);
    const jitMs = threadCpuSince(pid, JIT_THREAD, jitBefore) * 1000;
    out.push({ round, mode, gateway: sharing.map((t) => t.label).join(' + '), jitMs });
  }
  log(
    `round ${round + 1}/${ROUNDS} ${mode}: ${SWITCH_WARMUP_SECONDS} s of it first, JIT ms: ` +
      out.map((w) => `${w.gateway} ${fmt(w.jitMs, 0)}`).join(', '),
  );
  return out;
}

async function serverBench(
  targets: Record<TargetName, Target>,
  upstream: Service,
): Promise<{ runs: ServerRun[]; switches: SwitchWarmup[] }> {
  const dir = tempDir('wrk');
  const scripts = new Map<string, string>();
  for (const target of Object.values(targets)) {
    for (const mode of ['nonstream', 'stream'] as const) {
      await sanityCheck(target, mode);
      scripts.set(
        `${target.name}/${mode}`,
        wrkScript(dir, `${target.name}-${mode}`, bodyFor(target, mode), target.headers),
      );
    }
  }
  log(`warm-up: ${WARMUP_SECONDS} s per target and mode`);
  for (const target of Object.values(targets)) {
    for (const mode of ['nonstream', 'stream'] as const)
      await runWrk(target.url, scripts.get(`${target.name}/${mode}`)!, 32, WARMUP_SECONDS);
  }
  await warmUntilJitSettles(targets, scripts);
  const runs: ServerRun[] = [];
  const switches: SwitchWarmup[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    for (const mode of ['nonstream', 'stream'] as const) {
      switches.push(...(await switchWarmup(targets, scripts, mode, round)));
      for (const { connections, targets: names, seconds } of PLAN) {
        for (const name of runOrder(names, round)) {
          const result = await measure(
            targets[name],
            mode,
            connections,
            seconds,
            scripts.get(`${name}/${mode}`)!,
            upstream.pid,
          );
          runs.push({ round, ...result });
          log(
            `round ${round + 1}/${ROUNDS} ${mode.padEnd(9)} c${String(connections).padEnd(2)} ` +
              `${targets[name].label.padEnd(22)} ` +
              `${fmtInt(result.wrk.rps).padStart(7)} req/s  p50 ${fmt(result.wrk.p50Ms, 3)} ms  ` +
              `p99 ${fmt(result.wrk.p99Ms, 3)} ms  p99.9 ${fmt(result.wrk.p999Ms, 3)} ms` +
              (result.gatewayCpuUsPerRequest === null
                ? ''
                : `  cpu ${fmt(result.gatewayCpuUsPerRequest, 1)} µs/req` +
                  ` (jit ${fmt(result.gatewayJitUsPerRequest ?? 0, 1)})`) +
              (result.ioStallMs === null ? '' : `  disk stall ${fmt(result.ioStallMs, 0)} ms`),
          );
        }
      }
    }
  }
  return { runs, switches };
}

// ------------------------------------------------------------------------------------------
// Sequential latency client: time to first token, and non-stream latency, interleaved over targets.

async function latencyBench(
  targets: Record<TargetName, Target>,
): Promise<Record<string, LatencySamples>> {
  const dir = tempDir('latency');
  const spec: LatencySpec = { targets: [], warmup: 30, requests: LATENCY_REQUESTS };
  for (const name of [
    'direct',
    'proxy',
    'tollgate',
    'tollgate-interval',
    'tollgate-off',
  ] as const) {
    const target = targets[name];
    for (const mode of ['nonstream', 'stream'] as const) {
      spec.targets.push({
        name: `${name}/${mode}`,
        url: target.url,
        headers: target.headers,
        body: bodyFor(target, mode),
        stream: mode === 'stream',
      });
    }
  }
  const specPath = join(dir, 'spec.json');
  writeFileSync(specPath, JSON.stringify(spec));
  const child = spawnChild(pinned(CORE_LOAD, [BUN, 'bench/client.ts', 'latency', specPath]));
  const [out, err] = await Promise.all([
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
  ]);
  const code = await child.exited;
  const line = out.split('\n').find((l) => l.includes('"msg":"latency"'));
  if (code !== 0 || !line) throw new Error(`latency client failed (${code}):\n${out}\n${err}`);
  return (JSON.parse(line) as { results: Record<string, LatencySamples> }).results;
}

// ------------------------------------------------------------------------------------------
// Memory: RSS of a fresh tollgate idle, with 1,000 open streams, and after they end, over several
// rounds.
//
// RSS moves with the garbage collector, not with the requests: after a burst it first rises
// (garbage), drops within ~2 s, and the allocator hands most of the rest back only ~10–12 s later.
// So the idle baseline and the final reading each wait QUIET_MS; the per-round "after" is read
// AFTER_MS after the end.

const QUIET_MS = quick ? 6_000 : 13_000;
const AFTER_MS = 2_000;

interface MemoryRound {
  round: number;
  beforeMiB: number;
  openMiB: number;
  afterMiB: number;
  opened: number;
  completed: number;
  openMs: number;
}

interface MemoryReport {
  fetchLimitProbe: { opened: number; of: number; envNeeded: boolean };
  startMiB: number;
  finalMiB: number;
  rounds: MemoryRound[];
  envNote: string | null;
  /**
   * The same first round through the trivial proxy: the floor any Bun gateway pays for open
   * streams.
   */
  proxy: { startMiB: number; openMiB: number; opened: number } | null;
}

class LineChild {
  readonly child;
  private readonly waiters: Array<{
    msg: string;
    resolve: (value: Record<string, unknown>) => void;
  }> = [];
  private readonly queue: Record<string, unknown>[] = [];
  constructor(argv: string[], env: Record<string, string>) {
    this.child = spawnChild(argv, { env: { ...process.env, ...env } });
    void drainLines(this.child.stderr, (line) => process.stderr.write(`client: ${line}\n`));
    void drainLines(this.child.stdout, (line) => {
      if (!line.startsWith('{')) return;
      const json = JSON.parse(line) as Record<string, unknown>;
      const at = this.waiters.findIndex((w) => w.msg === json.msg);
      if (at >= 0) this.waiters.splice(at, 1)[0]!.resolve(json);
      else this.queue.push(json);
    });
  }
  send(line: string): void {
    if (this.child.exitCode !== null) return;
    this.child.stdin.write(`${line}\n`);
    this.child.stdin.flush();
  }
  next(msg: string, timeoutMs: number): Promise<Record<string, unknown> | null> {
    const queued = this.queue.findIndex((q) => q.msg === msg);
    if (queued >= 0) return Promise.resolve(this.queue.splice(queued, 1)[0]!);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        const at = this.waiters.indexOf(waiter);
        if (at >= 0) this.waiters.splice(at, 1);
        resolve(null);
      }, timeoutMs);
      const waiter = {
        msg,
        resolve: (value: Record<string, unknown>) => {
          clearTimeout(timer);
          resolve(value);
        },
      };
      this.waiters.push(waiter);
    });
  }
  async stop(): Promise<void> {
    await stopChild(this.child, 2_000);
  }
}

/** One open → release → end cycle; RSS read when all are open and AFTER_MS after they ended. */
async function memoryRound(
  client: LineChild,
  pid: number,
  release: () => Promise<unknown>,
  round: number,
): Promise<MemoryRound> {
  const beforeMiB = rssMiB(pid);
  client.send('open');
  const opened = await client.next('opened', 30_000);
  if (!opened) throw new Error('memory: the open streams did not all start within 30 s');
  const openMiB = rssMiB(pid);
  await release();
  const closed = await client.next('closed', 30_000);
  if (!closed) throw new Error('memory: the streams did not all end within 30 s of their release');
  await Bun.sleep(AFTER_MS);
  return {
    round,
    beforeMiB,
    openMiB,
    afterMiB: rssMiB(pid),
    opened: Number(opened.opened),
    completed: Number(closed.completed),
    openMs: Number(opened.ms),
  };
}

async function memoryBench(upstream: Service): Promise<MemoryReport> {
  const release = () =>
    fetch(`${upstream.url}/bench/release`, { method: 'POST' }).then((r) => r.json());
  const clientEnv = { BUN_CONFIG_MAX_HTTP_REQUESTS: String(OPEN_STREAMS * 4) };
  const start = async (env: Record<string, string>) => {
    const tollgate = await startTollgate(upstream.url, 'always', {
      name: 'tollgate (memory)',
      env,
    });
    const dir = tempDir('memwarm');
    const target: Target = {
      name: 'tollgate',
      label: 'tollgate',
      url: `${tollgate.url}/api/v1/chat/completions`,
      pid: tollgate.pid,
      headers: { authorization: `Bearer ${tollgate.key}`, 'content-type': 'application/json' },
    };
    await runWrk(
      target.url,
      wrkScript(dir, 'warm', bodyFor(target, 'stream'), target.headers),
      32,
      WARMUP_SECONDS,
    );
    const client = new LineChild(
      pinned(CORE_LOAD, [
        BUN,
        'bench/client.ts',
        'open',
        tollgate.url,
        tollgate.key,
        String(OPEN_STREAMS),
      ]),
      clientEnv,
    );
    if (!(await client.next('client ready', 10_000)))
      throw new Error('memory: the client did not start');
    return { tollgate, client };
  };

  // Probe: does a tollgate with the default environment get 1,000 upstream streams going at once?
  // Bun's fetch allows BUN_CONFIG_MAX_HTTP_REQUESTS (default 256) requests in flight per process.
  let { tollgate, client } = await start({});
  let envNote: string | null = null;
  let probeOpened = OPEN_STREAMS;
  try {
    client.send('open');
    const opened = await client.next('opened', 4_000);
    if (opened && Number(opened.opened) === OPEN_STREAMS) {
      await release();
      await client.next('closed', 30_000);
    } else {
      probeOpened = opened
        ? Number(opened.opened)
        : ((await (await fetch(`${upstream.url}/bench/stats`)).json()) as { held: number }).held;
      log(
        `memory: only ${probeOpened}/${OPEN_STREAMS} streams opened with the default env; ` +
          `restarting tollgate with BUN_CONFIG_MAX_HTTP_REQUESTS`,
      );
      await client.stop();
      await stopChild(tollgate.child, 1_000);
      await release();
      const env = { BUN_CONFIG_MAX_HTTP_REQUESTS: String(OPEN_STREAMS * 4) };
      envNote =
        `with the default environment only ${probeOpened} of ${OPEN_STREAMS} streams reached ` +
        `the upstream (Bun's fetch allows ` +
        `BUN_CONFIG_MAX_HTTP_REQUESTS, default 256, requests in flight); this tollgate ran ` +
        `with BUN_CONFIG_MAX_HTTP_REQUESTS=${env.BUN_CONFIG_MAX_HTTP_REQUESTS}.`;
      ({ tollgate, client } = await start(env));
    }

    await Bun.sleep(QUIET_MS);
    const startMiB = rssMiB(tollgate.pid);
    const rounds: MemoryRound[] = [];
    while (rounds.length < MEMORY_ROUNDS) {
      const round = await memoryRound(client, tollgate.pid, release, rounds.length + 1);
      rounds.push(round);
      log(
        `memory round ${round.round}: idle ${fmt(startMiB, 1)} MiB, ${round.opened} open ` +
          `${fmt(round.openMiB, 1)} MiB, ${AFTER_MS / 1000} s after ${fmt(round.afterMiB, 1)} MiB`,
      );
    }
    await Bun.sleep(QUIET_MS - AFTER_MS);
    const finalMiB = rssMiB(tollgate.pid);
    log(`memory: ${QUIET_MS / 1000} s after the last round ${fmt(finalMiB, 1)} MiB`);
    return {
      fetchLimitProbe: { opened: probeOpened, of: OPEN_STREAMS, envNeeded: envNote !== null },
      startMiB,
      finalMiB,
      rounds,
      envNote,
      proxy: null,
    };
  } finally {
    client.send('quit');
    await client.stop();
    await stopChild(tollgate.child, 2_000);
  }
}

/**
 * Round 1 of the memory benchmark through the trivial proxy (same warm-up, quiet wait and streams).
 */
async function proxyMemoryReference(upstream: Service): Promise<MemoryReport['proxy']> {
  const env = { BUN_CONFIG_MAX_HTTP_REQUESTS: String(OPEN_STREAMS * 4) };
  const proxy = await startProxyProcess(upstream.url, env);
  const client = new LineChild(
    pinned(CORE_LOAD, [
      BUN,
      'bench/client.ts',
      'open',
      proxy.url,
      'none',
      String(OPEN_STREAMS),
      'hold',
    ]),
    env,
  );
  try {
    const headers = { 'content-type': 'application/json' };
    const body = JSON.stringify({
      model: 'model_03',
      messages: [{ role: 'user', content: 'hello' }],
      max_completion_tokens: 64,
      stream: true,
    });
    await runWrk(
      `${proxy.url}/api/v1/chat/completions`,
      wrkScript(tempDir('memproxy'), 'warm', body, headers),
      32,
      WARMUP_SECONDS,
    );
    if (!(await client.next('client ready', 10_000)))
      throw new Error('memory: the client did not start');
    await Bun.sleep(QUIET_MS);
    const round = await memoryRound(
      client,
      proxy.pid,
      () => fetch(`${upstream.url}/bench/release`, { method: 'POST' }).then((r) => r.json()),
      1,
    );
    log(
      `memory (trivial proxy): idle ${fmt(round.beforeMiB, 1)} MiB, ${round.opened} open ` +
        `${fmt(round.openMiB, 1)} MiB`,
    );
    return { startMiB: round.beforeMiB, openMiB: round.openMiB, opened: round.opened };
  } finally {
    client.send('quit');
    await client.stop();
    await stopChild(proxy.child, 2_000);
  }
}

// ------------------------------------------------------------------------------------------
// Sub-benchmarks in their own processes (pinned to the gateway core, which is otherwise idle by
// then).

async function runJsonChild<T>(argv: string[]): Promise<T> {
  const child = spawnChild(pinned(CORE_GATEWAY, [BUN, ...argv]), {
    env: { ...process.env, BENCH_JSON: '1' },
  });
  const [out, err] = await Promise.all([
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
  ]);
  const code = await child.exited;
  const line = out.trim().split('\n').at(-1);
  if (code !== 0 || !line) throw new Error(`${argv.join(' ')} failed (${code}):\n${out}\n${err}`);
  return JSON.parse(line) as T;
}

// ------------------------------------------------------------------------------------------
// Report

interface Check {
  figure: string;
  target: string;
  measured: string;
  pass: boolean | null;
}

function runsOf(
  runs: ServerRun[],
  mode: Mode,
  connections: number,
  target: TargetName,
): ServerRun[] {
  return runs.filter(
    (r) => r.mode === mode && r.connections === connections && r.target === target,
  );
}

/** Per round: f(tollgate run, reference run); then median and range over rounds. */
function perRound(
  runs: ServerRun[],
  mode: Mode,
  connections: number,
  a: TargetName,
  b: TargetName,
  f: (a: ServerRun, b: ServerRun) => number,
): number[] {
  const values: number[] = [];
  for (let round = 0; round < ROUNDS; round++) {
    const ra = runs.find(
      (r) =>
        r.round === round && r.mode === mode && r.connections === connections && r.target === a,
    );
    const rb = runs.find(
      (r) =>
        r.round === round && r.mode === mode && r.connections === connections && r.target === b,
    );
    if (ra && rb) values.push(f(ra, rb));
  }
  return values;
}

const LABELS: Record<TargetName, string> = {
  direct: 'direct (upstream)',
  proxy: 'trivial proxy',
  tollgate: 'tollgate (fsync always)',
  'tollgate-interval': 'tollgate (fsync interval)',
  'tollgate-off': 'tollgate (fsync off)',
  'tollgate-anthropic': 'tollgate, anthropic (fsync always)',
};

function serverTables(runs: ServerRun[]): string {
  const out: string[] = [];
  for (const mode of ['nonstream', 'stream'] as const) {
    for (const { connections, targets } of PLAN) {
      out.push(
        `#### ${
          mode === 'stream'
            ? `Stream (${CHUNKS_PER_STREAM} chunks; latency = time to last byte)`
            : 'Non-stream'
        }, ${connections} connection${connections > 1 ? 's' : ''}`,
        '',
      );
      const rows = targets.map((name) => {
        const rs = runsOf(runs, mode, connections, name);
        const rps = rs.map((r) => r.wrk.rps);
        const cpu = rs.map((r) => r.gatewayCpuUsPerRequest ?? NaN);
        const jit = rs.map((r) => r.gatewayJitUsPerRequest ?? NaN);
        const rss = rs.map((r) => r.gatewayRssMiB ?? NaN);
        const peak = rs.map((r) => r.gatewayRssPeakMiB ?? NaN);
        const [rpsLow, rpsHigh] = range(rps);
        const bad = rs.reduce((sum, r) => sum + r.wrk.errors + r.wrk.non2xx, 0);
        return [
          LABELS[name],
          `${fmtInt(median(rps))} (${fmtInt(rpsLow)}–${fmtInt(rpsHigh)})`,
          fmt(median(rs.map((r) => r.wrk.p50Ms)), 3),
          fmt(median(rs.map((r) => r.wrk.p99Ms)), 3),
          fmt(median(rs.map((r) => r.wrk.p999Ms)), 3),
          name === 'direct' ? '—' : fmt(median(cpu), 1),
          name === 'direct' ? '—' : fmt(Math.max(...jit), 1),
          fmt(median(rs.map((r) => r.upstreamCpuUsPerRequest)), 1),
          name === 'direct' ? '—' : fmt(Math.max(...rss), 1),
          name === 'direct' ? '—' : fmt(Math.max(...peak), 1),
          diskStalls(rs),
          String(bad),
        ];
      });
      out.push(
        table(
          [
            'target',
            'req/s median (range)',
            'p50 ms',
            'p99 ms',
            'p99.9 ms',
            'gateway CPU µs/req',
            'of it JIT threads (max)',
            'upstream CPU µs/req',
            'gateway RSS MiB after (max)',
            'gateway RSS MiB peak (max)',
            'disk stall ms per run',
            'errors',
          ],
          rows,
        ),
        '',
      );
      const ratioRows: string[][] = [];
      for (const name of targets.filter((t) => t.startsWith('tollgate'))) {
        ratioRows.push([
          LABELS[name],
          fmtRatio(
            perRound(runs, mode, connections, name, 'proxy', (a, b) => a.wrk.rps / b.wrk.rps),
          ),
          fmtRatio(
            perRound(runs, mode, connections, name, 'direct', (a, b) => a.wrk.rps / b.wrk.rps),
          ),
          fmtRatio(
            perRound(
              runs,
              mode,
              connections,
              name,
              'proxy',
              (a, b) => a.gatewayCpuUsPerRequest! / b.gatewayCpuUsPerRequest!,
            ),
          ),
          fmtRatio(
            perRound(runs, mode, connections, name, 'proxy', (a, b) => a.wrk.p50Ms / b.wrk.p50Ms),
          ),
          fmtRatio(
            perRound(runs, mode, connections, name, 'proxy', (a, b) => a.wrk.p99Ms / b.wrk.p99Ms),
          ),
          fmtRatio(
            perRound(runs, mode, connections, name, 'proxy', (a, b) => a.wrk.p999Ms / b.wrk.p999Ms),
          ),
          fmtRatio(
            perRound(runs, mode, connections, name, 'direct', (a, b) => a.wrk.p50Ms - b.wrk.p50Ms),
            3,
          ),
        ]);
      }
      out.push(
        table(
          [
            'per round, median (range)',
            'req/s ÷ proxy',
            'req/s ÷ direct',
            'CPU/req ÷ proxy',
            'p50 ÷ proxy',
            'p99 ÷ proxy',
            'p99.9 ÷ proxy',
            'p50 − direct (ms)',
          ],
          ratioRows,
        ),
        '',
      );
    }
  }
  return out.join('\n');
}

function latencyTable(samples: Record<string, LatencySamples>): {
  markdown: string;
  addedMs: Record<string, number>;
} {
  const addedMs: Record<string, number> = {};
  const directTtft = percentile(samples['direct/stream']!.ttftMs, 50);
  const directTotal = percentile(samples['direct/nonstream']!.totalMs, 50);
  const rows: string[][] = [];
  for (const name of [
    'direct',
    'proxy',
    'tollgate',
    'tollgate-interval',
    'tollgate-off',
  ] as const) {
    const stream = samples[`${name}/stream`]!;
    const nonstream = samples[`${name}/nonstream`]!;
    const ttft = percentile(stream.ttftMs, 50);
    const total = percentile(nonstream.totalMs, 50);
    addedMs[`${name}/ttft`] = ttft - directTtft;
    addedMs[`${name}/nonstream`] = total - directTotal;
    rows.push([
      LABELS[name],
      fmt(ttft, 3),
      fmt(percentile(stream.ttftMs, 99), 3),
      name === 'direct' ? '—' : fmt(ttft - directTtft, 3),
      fmt(total, 3),
      name === 'direct' ? '—' : fmt(total - directTotal, 3),
    ]);
  }
  return {
    markdown: table(
      [
        'target',
        'TTFT p50 ms',
        'TTFT p99 ms',
        'TTFT p50 − direct (ms)',
        'non-stream p50 ms',
        'non-stream p50 − direct (ms)',
      ],
      rows,
    ),
    addedMs,
  };
}

function microTable(results: MicroResult[]): string {
  const ns = (value: number) =>
    value >= 1e6
      ? `${fmt(value / 1e6, 2)} ms`
      : value >= 1e3
        ? `${fmt(value / 1e3, 2)} µs`
        : `${fmt(value, 0)} ns`;
  const rows = results.map((r) => [
    r.name,
    ns(r.avgNs),
    ns(r.p50Ns),
    ns(r.p99Ns),
    r.perIteration > 1 ? ns(r.avgNs / r.perIteration) : '',
  ]);
  return table(['benchmark', 'avg / iter', 'p50', 'p99', 'avg / item'], rows);
}

function verdict(pass: boolean | null): string {
  return pass === null ? 'n/a' : pass ? 'PASS' : 'MISS';
}

// ------------------------------------------------------------------------------------------

/** bench/results/latest.json; the optional parts are added in this order as their phases run. */
interface Report {
  startedAt: string;
  command: string;
  machine: {
    cpu: string;
    cores: number;
    arch: string;
    kernel: string;
    bun: string;
    loadAvgAtStart: string;
  };
  settings: Record<string, number>;
  server?: { idleRssMiB: Record<string, number>; runs: ServerRun[]; switches: SwitchWarmup[] };
  latency?: {
    addedMs: Record<string, number>;
    p50Ms: Record<string, { ttft: number; total: number }>;
  };
  memory?: MemoryReport;
  wal?: WalReport;
  micro?: MicroResult[];
  checks?: Check[];
  elapsedS?: number;
}

type LatencyTable = ReturnType<typeof latencyTable>;

/** What the phases measured, for the checks and the markdown; empty or null when skipped. */
interface Measured {
  runs: ServerRun[];
  switches: SwitchWarmup[];
  /** Each gateway's RSS once started and idle, before any load. */
  idleRssMiB?: Record<string, number>;
  latency: LatencyTable | null;
  memory: MemoryReport | null;
  wal: WalReport | null;
  micro: MicroResult[] | null;
}

async function main(): Promise<void> {
  installSignalCleanup();
  const startedMs = Date.now();
  const report = await startReport(startedMs);
  const measured = await measureAll(report);
  const checks = allChecks(measured);
  report.checks = checks;
  report.elapsedS = (Date.now() - startedMs) / 1000;
  writeResults(report, renderMarkdown(report, measured, checks));
}

/** The report's head: when, how invoked, on what machine, with which settings. */
async function startReport(startedMs: number): Promise<Report> {
  return {
    startedAt: new Date(startedMs).toISOString(),
    command: `bun bench/run.ts ${argv.join(' ')}`.trim(),
    machine: {
      cpu: cpus()[0]?.model ?? 'unknown',
      cores: cpus().length,
      arch: arch(),
      kernel: release(),
      bun: Bun.version,
      loadAvgAtStart: (await Bun.file('/proc/loadavg').text()).trim(),
    },
    settings: {
      rounds: ROUNDS,
      loadSeconds: LOAD_SECONDS,
      latencySeconds: LATENCY_SECONDS,
      latencyRequests: LATENCY_REQUESTS,
      openStreams: OPEN_STREAMS,
      memoryRounds: MEMORY_ROUNDS,
    },
  };
}

/**
 * Every phase not skipped, in order: those that need the fake upstream (server, latency, memory),
 * then the WAL and micro benchmarks in their own processes.
 */
async function measureAll(report: Report): Promise<Measured> {
  const measured: Measured = {
    runs: [],
    switches: [],
    latency: null,
    memory: null,
    wal: null,
    micro: null,
  };
  if (!SKIP.has('server') || !SKIP.has('latency') || !SKIP.has('memory'))
    await upstreamPhases(report, measured);
  if (!SKIP.has('wal')) {
    log('wal: appends/s and append-to-durable latency per fsync policy');
    measured.wal = await runJsonChild<WalReport>([
      'bench/wal.ts',
      '--seconds',
      quick ? '0.5' : '1.5',
    ]);
    report.wal = measured.wal;
  }
  if (!SKIP.has('micro')) {
    log('micro: mitata');
    measured.micro = await runJsonChild<MicroResult[]>(['bench/micro.ts']);
    report.micro = measured.micro;
  }
  return measured;
}

/** The phases against one fake upstream: the gateways side by side, then memory. */
async function upstreamPhases(report: Report, measured: Measured): Promise<void> {
  await ensureWrk();
  const upstream = await startUpstreamProcess();
  if (!SKIP.has('server') || !SKIP.has('latency')) await gatewayPhases(report, measured, upstream);
  if (!SKIP.has('memory')) {
    log(`memory: ${OPEN_STREAMS} open streams through a fresh tollgate, ${MEMORY_ROUNDS} rounds`);
    const memory = await memoryBench(upstream);
    memory.proxy = await proxyMemoryReference(upstream);
    report.memory = memory;
    measured.memory = memory;
  }
  await stopChild(upstream.child);
}

/** The server and latency phases, over the same five targets (started once, stopped after). */
async function gatewayPhases(report: Report, measured: Measured, upstream: Service): Promise<void> {
  log(
    `upstream ${upstream.url}; starting the proxy and three tollgates (fsync always, ` +
      `interval, off)`,
  );
  const { targets, gateways } = await startTargets(upstream);
  const idleRss = Object.fromEntries(
    Object.values(targets)
      .filter((t) => t.pid !== null)
      .map((t) => [t.name, rssMiB(t.pid!)]),
  );
  if (!SKIP.has('server')) {
    ({ runs: measured.runs, switches: measured.switches } = await serverBench(targets, upstream));
    measured.idleRssMiB = idleRss;
    report.server = { idleRssMiB: idleRss, runs: measured.runs, switches: measured.switches };
  }
  if (!SKIP.has('latency')) measured.latency = await latencyPhase(report, targets);
  for (const service of gateways) await stopChild(service.child);
}

/** The proxy and three tollgates (fsync always, interval, off), and the upstream itself. */
async function startTargets(
  upstream: Service,
): Promise<{ targets: Record<TargetName, Target>; gateways: Service[] }> {
  const proxy = await startProxyProcess(upstream.url);
  const [always, interval, off] = [
    await startTollgate(upstream.url, 'always'),
    await startTollgate(upstream.url, 'interval'),
    await startTollgate(upstream.url, 'off'),
  ];
  const json = { 'content-type': 'application/json' };
  const tollgateTarget = (name: TargetName, t: Tollgate): Target => ({
    name,
    label: LABELS[name],
    url: `${t.url}/api/v1/chat/completions`,
    pid: t.pid,
    headers: { ...json, authorization: `Bearer ${t.key}` },
  });
  const targets: Record<TargetName, Target> = {
    direct: {
      name: 'direct',
      label: LABELS.direct,
      url: `${upstream.url}/v1/chat/completions`,
      pid: null,
      headers: { ...json, authorization: 'Bearer direct' },
    },
    proxy: {
      name: 'proxy',
      label: LABELS.proxy,
      url: `${proxy.url}/v1/chat/completions`,
      pid: proxy.pid,
      headers: { ...json, authorization: 'Bearer direct' },
    },
    tollgate: tollgateTarget('tollgate', always),
    'tollgate-interval': tollgateTarget('tollgate-interval', interval),
    'tollgate-off': tollgateTarget('tollgate-off', off),
    // The same process as `tollgate`, another model: the two adapters side by side in one round.
    'tollgate-anthropic': tollgateTarget('tollgate-anthropic', always),
  };
  return { targets, gateways: [proxy, always, interval, off] };
}

/** The sequential latency client over all targets; its table and the report's p50s. */
async function latencyPhase(
  report: Report,
  targets: Record<TargetName, Target>,
): Promise<LatencyTable> {
  log(`latency client: ${LATENCY_REQUESTS} sequential requests per target and mode, interleaved`);
  const samples = await latencyBench(targets);
  const latency = latencyTable(samples);
  report.latency = {
    addedMs: latency.addedMs,
    p50Ms: Object.fromEntries(
      Object.entries(samples).map(([k, v]) => [
        k,
        { ttft: percentile(v.ttftMs, 50), total: percentile(v.totalMs, 50) },
      ]),
    ),
  };
  return latency;
}

// ---- checks against the issue's figures

function allChecks(measured: Measured): Check[] {
  const { runs, latency, memory } = measured;
  const checks: Check[] = [];
  if (runs.length > 0) checks.push(...serverChecks(runs));
  if (runs.length > 0) checks.push(...tailChecks(runs, measured.idleRssMiB ?? {}));
  // The client's non-stream figure stands in for wrk's only when the server phase was skipped.
  if (latency) checks.push(...latencyChecks(latency, runs.length === 0));
  if (memory && memory.rounds.length > 0) checks.push(...memoryChecks(memory));
  return checks;
}

type RunRatio = (a: ServerRun, b: ServerRun) => number;

/** Tollgate ÷ proxy at 32 connections: per round, then the median over the rounds. */
function c32Ratio(runs: ServerRun[], mode: Mode, f: RunRatio): number {
  return median(perRound(runs, mode, 32, 'tollgate', 'proxy', f));
}

/**
 * Issue 15's figures (tail and memory): p99 and CPU per request ÷ the proxy's at 32 connections
 * (per round, then the median), RSS after start, and the peak RSS of the c32 runs against twice
 * the proxy's plus 32 MiB.
 */
function tailChecks(runs: ServerRun[], idleRssMiB: Record<string, number>): Check[] {
  const ratio = (mode: Mode, f: RunRatio) => c32Ratio(runs, mode, f);
  const p99 = (a: ServerRun, b: ServerRun) => a.wrk.p99Ms / b.wrk.p99Ms;
  const p999 = (a: ServerRun, b: ServerRun) => a.wrk.p999Ms / b.wrk.p999Ms;
  const cpu = (a: ServerRun, b: ServerRun) => a.gatewayCpuUsPerRequest! / b.gatewayCpuUsPerRequest!;
  const limited = (figure: string, limit: number, value: number): Check => ({
    figure,
    target: `≤ ${limit}`,
    measured: fmt(value),
    pass: value <= limit,
  });
  const peakOf = (name: TargetName) =>
    Math.max(
      ...runs
        .filter((r) => r.target === name && r.connections === 32)
        .map((r) => r.gatewayRssPeakMiB ?? 0),
    );
  const proxyPeak = peakOf('proxy');
  const peak = peakOf('tollgate');
  const checks = [
    limited('Issue 15: non-stream p99 ÷ proxy (c32)', 2, ratio('nonstream', p99)),
    {
      figure: '(reference) non-stream p99.9 ÷ proxy (c32)',
      target: '—',
      measured: fmt(ratio('nonstream', p999)),
      pass: null,
    },
    limited('Issue 15: stream p99 ÷ proxy (c32)', 1.3, ratio('stream', p99)),
    limited('Issue 15: non-stream CPU/request ÷ proxy (c32)', 1.5, ratio('nonstream', cpu)),
    limited('Issue 15: stream CPU/request ÷ proxy (c32)', 1.05, ratio('stream', cpu)),
    {
      figure: 'Issue 15: RSS peak in the c32 runs (tollgate, fsync always)',
      target: `≤ 2 × proxy + 32 = ${fmt(2 * proxyPeak + 32, 1)} MiB`,
      measured: `${fmt(peak, 1)} MiB`,
      pass: peak <= 2 * proxyPeak + 32,
    },
  ];
  const idle = idleRssMiB.tollgate;
  if (idle !== undefined)
    checks.push({
      figure: 'Issue 15: RSS after start (tollgate, fsync always)',
      target: '≤ 64 MiB',
      measured: `${fmt(idle, 1)} MiB`,
      pass: idle <= 64,
    });
  return checks;
}

/** Tollgate ÷ proxy at 32 connections, and the p50 wrk adds over direct at 1. */
function serverChecks(runs: ServerRun[]): Check[] {
  const ratio = (mode: Mode, f: RunRatio) => c32Ratio(runs, mode, f);
  const cpuNs = ratio('nonstream', (a, b) => a.gatewayCpuUsPerRequest! / b.gatewayCpuUsPerRequest!);
  const rpsNs = ratio('nonstream', (a, b) => a.wrk.rps / b.wrk.rps);
  const cpuSt = ratio('stream', (a, b) => a.gatewayCpuUsPerRequest! / b.gatewayCpuUsPerRequest!);
  const rpsSt = ratio('stream', (a, b) => a.wrk.rps / b.wrk.rps);
  const checks: Check[] = [
    {
      figure: 'Non-stream CPU/request ÷ proxy (c32)',
      target: '≤ 2.0',
      measured: fmt(cpuNs),
      pass: cpuNs <= 2.0,
    },
    {
      figure: 'Non-stream req/s ÷ proxy (c32)',
      target: '≥ 0.5',
      measured: fmt(rpsNs),
      pass: rpsNs >= 0.5,
    },
    {
      figure: 'Stream CPU/request ÷ proxy (c32)',
      target: '≤ 1.5',
      measured: fmt(cpuSt),
      pass: cpuSt <= 1.5,
    },
    {
      figure: 'Stream req/s ÷ proxy (c32)',
      target: '≥ 0.7',
      measured: fmt(rpsSt),
      pass: rpsSt >= 0.7,
    },
  ];
  checks.push(...anthropicChecks(runs));
  for (const [name, limit] of ADDED_LIMITS_MS) {
    const added = median(
      perRound(runs, 'nonstream', 1, name, 'direct', (a, b) => a.wrk.p50Ms - b.wrk.p50Ms),
    );
    checks.push({
      figure: `Non-stream p50 added over direct, c1, wrk (${LABELS[name]})`,
      target: `≤ ${limit} ms`,
      measured: `${fmt(added, 3)} ms`,
      pass: added <= limit,
    });
  }
  return checks;
}

/** Issue 14: the anthropic adapter's CPU per request within 10 % of the openai adapter's. */
const ANTHROPIC_CPU_RATIO_MAX = 1.1;

/** Per round, the anthropic adapter's run ÷ the openai adapter's (same tollgate), at c32. */
function anthropicVsOpenai(
  runs: ServerRun[],
  mode: Mode,
  f: (a: ServerRun, b: ServerRun) => number,
): number[] {
  return perRound(runs, mode, 32, 'tollgate-anthropic', 'tollgate', f);
}

const cpuRatio = (a: ServerRun, b: ServerRun) =>
  a.gatewayCpuUsPerRequest! / b.gatewayCpuUsPerRequest!;

function anthropicChecks(runs: ServerRun[]): Check[] {
  const stream = anthropicVsOpenai(runs, 'stream', cpuRatio);
  const nonstream = anthropicVsOpenai(runs, 'nonstream', cpuRatio);
  if (stream.length === 0) return [];
  return [
    {
      figure: 'Anthropic adapter: stream CPU/request ÷ openai adapter (c32, same tollgate)',
      target: `≤ ${fmt(ANTHROPIC_CPU_RATIO_MAX)}`,
      measured: fmtRatio(stream),
      pass: median(stream) <= ANTHROPIC_CPU_RATIO_MAX,
    },
    {
      figure: '(reference) Anthropic adapter: non-stream CPU/request ÷ openai adapter (c32)',
      target: '—',
      measured: fmtRatio(nonstream),
      pass: null,
    },
  ];
}

/** The two adapters side by side: gateway and fake-upstream figures, per round, at c32. */
function anthropicTable(runs: ServerRun[]): string {
  const rows = (['nonstream', 'stream'] as const).map((mode) => {
    const cpu = (name: TargetName) =>
      fmt(median(runsOf(runs, mode, 32, name).map((r) => r.gatewayCpuUsPerRequest!)), 1);
    return [
      mode,
      cpu('tollgate'),
      cpu('tollgate-anthropic'),
      fmtRatio(anthropicVsOpenai(runs, mode, cpuRatio)),
      fmtRatio(anthropicVsOpenai(runs, mode, (a, b) => a.wrk.rps / b.wrk.rps)),
      fmtRatio(anthropicVsOpenai(runs, mode, (a, b) => a.wrk.p50Ms / b.wrk.p50Ms)),
      fmtRatio(anthropicVsOpenai(runs, mode, (a, b) => a.wrk.p99Ms / b.wrk.p99Ms)),
      fmtRatio(
        anthropicVsOpenai(
          runs,
          mode,
          (a, b) => a.upstreamCpuUsPerRequest / b.upstreamCpuUsPerRequest,
        ),
      ),
    ];
  });
  return table(
    [
      'mode (c32)',
      'openai CPU µs/req',
      'anthropic CPU µs/req',
      'CPU/req anthropic ÷ openai',
      'req/s ÷',
      'p50 ÷',
      'p99 ÷',
      'fake upstream CPU/req ÷',
    ],
    rows,
  );
}

/** The most latency a tollgate may add over direct at 1 connection, per fsync policy. */
const ADDED_LIMITS_MS = [
  ['tollgate', 0.5],
  ['tollgate-interval', 0.25],
] as const;

/** TTFT added over direct, and (without wrk's figure) the client's non-stream p50 added. */
function latencyChecks(latency: LatencyTable, withNonstream: boolean): Check[] {
  const checks: Check[] = [];
  for (const [name, limit] of ADDED_LIMITS_MS) {
    const ttft = latency.addedMs[`${name}/ttft`]!;
    checks.push({
      figure: `TTFT p50 added over direct, c1 (${LABELS[name]})`,
      target: `≤ ${limit} ms`,
      measured: `${fmt(ttft, 3)} ms`,
      pass: ttft <= limit,
    });
    if (withNonstream) {
      const ns = latency.addedMs[`${name}/nonstream`]!;
      checks.push({
        figure: `Non-stream p50 added over direct, c1, client (${LABELS[name]})`,
        target: `≤ ${limit} ms`,
        measured: `${fmt(ns, 3)} ms`,
        pass: ns <= limit,
      });
    }
  }
  return checks;
}

/** The cost of the open streams, the memory given back after them, the fetch-limit finding. */
function memoryChecks(memory: MemoryReport): Check[] {
  // Round 1 starts from the quiet idle baseline; later rounds also carry the garbage earlier
  // rounds left.
  const openCost = memory.rounds[0]!.openMiB - memory.startMiB;
  const growth = (memory.finalMiB - memory.startMiB) / memory.startMiB;
  return [
    {
      figure: `RSS with ${OPEN_STREAMS} open streams over quiet idle (round 1)`,
      target: '≤ 30 MiB',
      measured: `${fmt(openCost, 1)} MiB`,
      pass: openCost <= 30,
    },
    {
      figure:
        `RSS after the streams end vs idle start (${QUIET_MS / 1000} s after ` +
        `${memory.rounds.length} rounds)`,
      target: 'within 10 %',
      measured:
        `${growth >= 0 ? '+' : ''}${fmt(growth * 100, 1)} % (${fmt(memory.startMiB, 1)} → ` +
        `${fmt(memory.finalMiB, 1)} MiB)`,
      pass: Math.abs(growth) <= 0.1,
    },
    ...(memory.proxy
      ? [
          {
            figure:
              `(reference) trivial proxy: RSS with ${OPEN_STREAMS} open streams over ` +
              `quiet idle`,
            target: '—',
            measured: `${fmt(memory.proxy.openMiB - memory.proxy.startMiB, 1)} MiB`,
            pass: null,
          },
        ]
      : []),
    {
      figure: `(finding) ${OPEN_STREAMS} streams open at once with tollgate's default environment`,
      target: `${OPEN_STREAMS}`,
      measured: `${memory.fetchLimitProbe.opened}`,
      pass: !memory.fetchLimitProbe.envNeeded,
    },
  ];
}

// ---- markdown

/** The whole markdown: a head, then one section per phase that ran. */
function renderMarkdown(report: Report, measured: Measured, checks: Check[]): string {
  const { runs, latency, memory, wal, micro } = measured;
  const sections = headSection(report);
  if (checks.length > 0) {
    sections.push(
      '## Targets (issues 5, 14 and 15)',
      '',
      table(
        ['figure', 'target', 'measured', ''],
        checks.map((c) => [c.figure, c.target, c.measured, verdict(c.pass)]),
      ),
      '',
    );
  }
  if (runs.length > 0) sections.push(...serverSection(runs, measured.switches));
  if (latency) sections.push(...latencySection(latency));
  if (memory) sections.push(...memorySection(memory));
  if (wal)
    sections.push(
      '## WAL per fsync policy (issue 3)',
      '',
      '`bun bench/wal.ts`: concurrent appenders in one ' +
        'process, records shaped like `request.started`.',
      '',
      walMarkdown(wal),
      '',
    );
  if (micro)
    sections.push(
      '## Micro (mitata)',
      '',
      '`bun bench/micro.ts`, pinned to the gateway core.',
      '',
      microTable(micro),
      '',
    );
  return sections.join('\n');
}

function headSection(report: Report): string[] {
  const m = report.machine;
  return [
    '# tollgate benchmarks — latest run',
    '',
    `Produced by \`${report.command}\` (\`npm run bench\`) at ${report.startedAt}, in ` +
      `${fmt(report.elapsedS!, 0)} s.`,
    `Machine: ${m.cpu}, ${m.cores} cores, ${m.arch}, Linux ${m.kernel}, Bun ${m.bun}; load ` +
      `average at start ${m.loadAvgAtStart}.`,
    `Gateways (proxy, tollgate) pinned to core ${CORE_GATEWAY}; upstream, wrk and clients to ` +
      `core ${CORE_LOAD}. ` +
      `All figures come from this one run; ratios are taken per round, then the median (and ` +
      `range) over ${ROUNDS} rounds.`,
    '',
  ];
}

/**
 * What the switch warm-ups say, or nothing when there were none (--quick): per gateway process,
 * the JIT milliseconds of its warm-ups, median (range).
 */
function switchSentence(switches: SwitchWarmup[]): string {
  if (switches.length === 0) return '';
  const byGateway = new Map<string, number[]>();
  for (const w of switches)
    byGateway.set(w.gateway, [...(byGateway.get(w.gateway) ?? []), w.jitMs]);
  const figures = [...byGateway]
    .map(([gateway, ms]) => {
      const [low, high] = range(ms);
      return `${gateway} ${fmt(median(ms), 0)} (${fmt(low, 0)}–${fmt(high, 0)})`;
    })
    .join('; ');
  return (
    `In each round, before the runs of a mode, every gateway first takes ` +
    `${SWITCH_WARMUP_SECONDS} s of that mode at 32 connections per target it serves, unmeasured: ` +
    'the recompiling a change of mode costs is not spread over the next run. What its JIT ' +
    `threads took meanwhile, ms median (range) over the switches: ${figures}. `
  );
}

function serverSection(runs: ServerRun[], switches: SwitchWarmup[]): string[] {
  return [
    '## Whole server, side by side',
    '',
    `wrk -t1, ${LOAD_SECONDS} s per run at 32 connections and ${LATENCY_SECONDS} s at 1, ` +
      `after a ${WARMUP_SECONDS} s warm-up per target and mode, then more of both on each ` +
      `gateway until its JIT threads use under ${JIT_SETTLED_SHARE * 100} % of its time ` +
      `(at most ${WARMUP_MAX_SECONDS} s; the JIT column says what was left). ` +
      switchSentence(switches) +
      "Direct and proxy pass the client's `stream` flag to the upstream (non-stream = one JSON " +
      'reply); so does tollgate (since 8200c6f; before, it always streamed from the ' +
      'upstream). ' +
      'Gateway CPU = utime+stime of the gateway process from /proc over the run ÷ requests; ' +
      'RSS after the run. Disk stall: the milliseconds of each run (in round order) in which ' +
      'some task of the machine waited on the disk (/proc/pressure/io): the fsyncs of an ' +
      'fsync-always gateway are most of it (~200 ms per 3 s run here); a run well above its ' +
      'siblings had a slower disk (it is shared), which only fsync-always latency shows.',
    '',
    serverTables(runs),
    '### The anthropic adapter beside the openai adapter (issue 14)',
    '',
    `One tollgate (fsync always) serves model_03 through its \`openai\` provider and ` +
      `${ANTHROPIC_MODEL} (same rates and windows) through its \`anthropic\` provider, both on ` +
      'the same fake upstream, which answers each protocol with the same text in the same ' +
      'writes. Ratios are anthropic ÷ openai within each round; the last column checks that ' +
      'the fake costs the same for both.',
    '',
    anthropicTable(runs),
    '',
    '### Added latency of fsync `always` over `off` (issue 3, from the runs above)',
    '',
    fsyncTable(runs),
    '',
  ];
}

/** Tollgate with fsync always against fsync off, per mode and connection count. */
function fsyncTable(runs: ServerRun[]): string {
  const vsOff = (mode: Mode, c: number, f: (a: ServerRun, b: ServerRun) => number) =>
    perRound(runs, mode, c, 'tollgate', 'tollgate-off', f);
  return table(
    ['mode', 'connections', 'p50 always − off (ms)', 'p99 always − off (ms)', 'req/s always ÷ off'],
    (['nonstream', 'stream'] as const).flatMap((mode) =>
      [1, 32].map((c) => [
        mode,
        String(c),
        fmtRatio(
          vsOff(mode, c, (a, b) => a.wrk.p50Ms - b.wrk.p50Ms),
          3,
        ),
        fmtRatio(
          vsOff(mode, c, (a, b) => a.wrk.p99Ms - b.wrk.p99Ms),
          3,
        ),
        fmtRatio(vsOff(mode, c, (a, b) => a.wrk.rps / b.wrk.rps)),
      ]),
    ),
  );
}

function latencySection(latency: LatencyTable): string[] {
  return [
    '## Time to first token and non-stream latency, 1 connection',
    '',
    `A sequential Bun client on core ${CORE_LOAD}, ${LATENCY_REQUESTS} requests per target ` +
      `and mode after 30 warm-up, interleaved over the targets. ` +
      'TTFT = time from sending the request to the first SSE `data:` bytes.',
    '',
    latency.markdown,
    '',
  ];
}

function memorySection(memory: MemoryReport): string[] {
  return [
    `## Memory: ${OPEN_STREAMS} concurrent open streams (tollgate, fsync always)`,
    '',
    `A fresh tollgate, ${WARMUP_SECONDS} s of streaming load, then idle ${QUIET_MS / 1000} ` +
      `s: that RSS is the start. Per round, ${OPEN_STREAMS} streams ` +
      `are opened (each has had its first chunk), RSS is read, the upstream finishes them ` +
      `all, RSS is read again ${AFTER_MS / 1000} s after the last ends. ` +
      `The final reading is ${QUIET_MS / 1000} s after the last round (the garbage collector ` +
      `and allocator return memory late). ` +
      'Only round 1 starts from the quiet idle, so it is the one checked; later rounds open ' +
      'while earlier garbage is still resident.' +
      (memory.envNote ? ` Note: ${memory.envNote}` : ''),
    '',
    memoryRoundsTable(memory),
    '',
    `Start (idle): ${fmt(memory.startMiB, 1)} MiB; final (${QUIET_MS / 1000} s after the ` +
      `last round): ${fmt(memory.finalMiB, 1)} MiB.`,
    '',
    ...(memory.proxy ? [proxyReference(memory, memory.proxy), ''] : []),
  ];
}

function memoryRoundsTable(memory: MemoryReport): string {
  return table(
    [
      'round',
      'before MiB',
      'open MiB',
      'open − start MiB',
      'open − before MiB',
      `${AFTER_MS / 1000} s after MiB`,
      'opened',
      'completed with [DONE]',
      'all open in ms',
    ],
    memory.rounds.map((r) => [
      String(r.round),
      fmt(r.beforeMiB, 1),
      fmt(r.openMiB, 1),
      fmt(r.openMiB - memory.startMiB, 1),
      fmt(r.openMiB - r.beforeMiB, 1),
      fmt(r.afterMiB, 1),
      String(r.opened),
      String(r.completed),
      fmt(r.openMs, 0),
    ]),
  );
}

/** The trivial proxy's round 1, and how much more tollgate's costs. */
function proxyReference(memory: MemoryReport, proxy: NonNullable<MemoryReport['proxy']>): string {
  const proxyCost = proxy.openMiB - proxy.startMiB;
  return (
    `Reference, the trivial proxy through the same round 1 (warm-up, quiet wait, ` +
    `${OPEN_STREAMS} streams held by the upstream): ` +
    `${fmt(proxy.startMiB, 1)} → ${fmt(proxy.openMiB, 1)} MiB, ` +
    `+${fmt(proxyCost, 1)} MiB ` +
    `(${proxy.opened} opened). Tollgate's round 1 above costs ` +
    `${fmt(memory.rounds[0]!.openMiB - memory.startMiB - proxyCost, 1)} MiB more.`
  );
}

/** bench/results/latest.{md,json}, and the chosen one of them on stdout. */
function writeResults(report: Report, markdown: string): void {
  const dir = join(ROOT, 'bench', 'results');
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'latest.md'), markdown);
  writeFileSync(join(dir, 'latest.json'), JSON.stringify(report, null, 2));
  if (process.env.BENCH_JSON === '1') console.log(JSON.stringify(report));
  else console.log(markdown);
  log(
    `bench: done in ${fmt(report.elapsedS!, 0)} ` +
      `s; wrote bench/results/latest.md and latest.json`,
  );
}

try {
  await main();
} catch (error) {
  process.stderr.write(`bench failed: ${(error as Error).stack ?? error}\n`);
  process.exitCode = 1;
} finally {
  await cleanup();
}
