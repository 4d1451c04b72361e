// Two builds of tollgate, A and B, side by side: does a change move the CPU per request? On this
// shared 2-core machine one run of each varies by ±10 %, more than most changes are worth; what
// holds still is the difference between A and B measured back to back. So this alternates short
// c=32 runs of A and B (the order flips each round) and reports the per-round differences B − A:
// their median and quartiles. A change whose quartiles straddle 0 did not measurably move.
//
// Usage: bun bench/ab.ts <checkout A> <checkout B> [--rounds N] [--seconds S] [--stream]
//   [--env-a K=V,…] [--env-b K=V,…] [--fsync-a P] [--fsync-b P] [--warmup S] [--switch]
// A checkout is a directory with src/main.ts (a `git worktree add ../base HEAD~1` with a
// node_modules symlink will do); the same directory twice with different --env-a / --env-b
// compares settings (JSC or mimalloc options, say; --fsync-a/-b a WAL policy other than `always`).
// Layout as bench/run.ts: each tollgate on core 0, the fake upstream and wrk on core 1. Each is
// warmed up first (--warmup, 8 s: on this VM a stream's JIT settles only after ~8 s of load).
import { resolve } from 'node:path';
import {
  cleanup,
  cpuSeconds,
  ensureWrk,
  type FsyncPolicy,
  installSignalCleanup,
  median,
  percentile,
  runWrk,
  startTollgate,
  startUpstreamProcess,
  stopChild,
  type Tollgate,
  tempDir,
  threadCpu,
  threadCpuSince,
  wrkScript,
} from './lib.ts';

function option(name: string, fallback: string): string {
  const at = process.argv.indexOf(name);
  return at === -1 ? fallback : (process.argv[at + 1] ?? fallback);
}

function envOption(name: string): Record<string, string> {
  const text = option(name, '');
  const env: Record<string, string> = {};
  for (const pair of text.split(',').filter(Boolean)) {
    const eq = pair.indexOf('=');
    if (eq <= 0) throw new Error(`${name}: expected K=V, got ${pair}`);
    env[pair.slice(0, eq)] = pair.slice(eq + 1);
  }
  return env;
}

const VALUE_OPTIONS = new Set([
  '--rounds',
  '--seconds',
  '--env-a',
  '--env-b',
  '--fsync-a',
  '--fsync-b',
  '--warmup',
]);
const positional: string[] = [];
for (let i = 2; i < process.argv.length; i++) {
  const arg = process.argv[i]!;
  if (VALUE_OPTIONS.has(arg)) i++;
  else if (!arg.startsWith('--')) positional.push(arg);
}
const [dirA, dirB] = positional;
if (!dirA || !dirB) {
  console.error('usage: bun bench/ab.ts <checkout A> <checkout B> [--rounds N] [--seconds S] …');
  process.exit(2);
}
const ROUNDS = Number(option('--rounds', '20'));
const SECONDS = Number(option('--seconds', '2'));
const STREAM = process.argv.includes('--stream');
const WARMUP_SECONDS = Number(option('--warmup', '8'));
const SWITCH = process.argv.includes('--switch');
function fsyncOption(name: string): FsyncPolicy {
  const policy = option(name, 'always');
  if (policy !== 'always' && policy !== 'interval' && policy !== 'off')
    throw new Error(`${name}: always, interval or off, got ${policy}`);
  return policy;
}

installSignalCleanup();
await ensureWrk();
const upstream = await startUpstreamProcess();
const targets: Array<{ name: string; tollgate: Tollgate; script: string; other: string }> = [];
const dir = tempDir('ab');
const bodyFor = (stream: boolean) =>
  JSON.stringify({
    model: 'model_03',
    messages: [{ role: 'user', content: 'hello' }],
    max_completion_tokens: 64,
    ...(stream ? { stream: true } : {}),
  });
const body = bodyFor(STREAM);
for (const [name, root, env, fsync] of [
  ['A', dirA, envOption('--env-a'), fsyncOption('--fsync-a')],
  ['B', dirB, envOption('--env-b'), fsyncOption('--fsync-b')],
] as const) {
  const tollgate = await startTollgate(upstream.url, fsync, {
    root: resolve(root),
    env,
    name: `tollgate ${name}`,
  });
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${tollgate.key}` };
  targets.push({
    name,
    tollgate,
    script: wrkScript(dir, name, body, headers),
    other: wrkScript(dir, `${name}-other`, bodyFor(!STREAM), headers),
  });
}

const url = (target: (typeof targets)[number]) => `${target.tollgate.url}/api/v1/chat/completions`;
for (const target of targets) await runWrk(url(target), target.script, 32, WARMUP_SECONDS);

const cpu: Record<string, number[]> = { A: [], B: [] };
const jit: Record<string, number[]> = { A: [], B: [] };
const p99: Record<string, number[]> = { A: [], B: [] };
for (let round = 0; round < ROUNDS; round++) {
  for (const target of round % 2 === 0 ? targets : [...targets].reverse()) {
    // --switch: the other mode first, unmeasured, then a pause as long: what coming back to a mode
    // after a while costs (bench/run.ts runs every target's non-stream half, then the streams).
    if (SWITCH) {
      await runWrk(url(target), target.other, 32, SECONDS);
      await Bun.sleep(SECONDS * 1000);
    }
    const before = cpuSeconds(target.tollgate.pid);
    const jitBefore = threadCpu(target.tollgate.pid, 'JITWorker');
    const result = await runWrk(url(target), target.script, 32, SECONDS);
    cpu[target.name]!.push(((cpuSeconds(target.tollgate.pid) - before) * 1e6) / result.requests);
    jit[target.name]!.push(
      (threadCpuSince(target.tollgate.pid, 'JITWorker', jitBefore) * 1e6) / result.requests,
    );
    p99[target.name]!.push(result.p99Ms);
  }
}
const differences = cpu.B!.map((b, i) => b - cpu.A![i]!).sort((x, y) => x - y);
const fmt = (value: number) => value.toFixed(1);
console.log(
  `${STREAM ? 'stream' : 'non-stream'}${SWITCH ? ' (each run after the other mode)' : ''}, ` +
    `c=32, ${ROUNDS} rounds of ${SECONDS} s each`,
);
for (const name of ['A', 'B']) {
  console.log(
    `${name}: CPU ${fmt(median(cpu[name]!))} µs/request (${fmt(Math.min(...cpu[name]!))}–` +
      `${fmt(Math.max(...cpu[name]!))}), of it JIT threads ${fmt(median(jit[name]!))} ` +
      `(${fmt(Math.min(...jit[name]!))}–${fmt(Math.max(...jit[name]!))}), ` +
      `p99 ${median(p99[name]!).toFixed(2)} ms (median)`,
  );
}
console.log(
  `B − A per round: median ${fmt(median(differences))} µs/request, quartiles ` +
    `${fmt(percentile(differences, 25))} … ${fmt(percentile(differences, 75))}`,
);
for (const target of targets) await stopChild(target.tollgate.child);
await stopChild(upstream.child);
await cleanup();
