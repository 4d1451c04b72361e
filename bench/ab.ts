// Two builds of tollgate, A and B, side by side: does a change move the CPU per request? On this
// shared 2-core machine one run of each varies by ±10 %, more than most changes are worth; what
// holds still is the difference between A and B measured back to back. So this alternates short
// c=32 runs of A and B (the order flips each round) and reports the per-round differences B − A:
// their median and quartiles. A change whose quartiles straddle 0 did not measurably move.
//
// Usage: bun bench/ab.ts <checkout A> <checkout B> [--rounds N] [--seconds S] [--stream]
//   [--env-a K=V,…] [--env-b K=V,…]
// A checkout is a directory with src/main.ts (a `git worktree add ../base HEAD~1` with a
// node_modules symlink will do); the same directory twice with different --env-a / --env-b
// compares settings (JSC or mimalloc options, say). Layout as bench/run.ts: each tollgate on core
// 0, the fake upstream and wrk on core 1, fsync `always`.
import { resolve } from 'node:path';
import {
  cleanup,
  cpuSeconds,
  ensureWrk,
  installSignalCleanup,
  median,
  percentile,
  runWrk,
  startTollgate,
  startUpstreamProcess,
  stopChild,
  type Tollgate,
  tempDir,
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

const VALUE_OPTIONS = new Set(['--rounds', '--seconds', '--env-a', '--env-b']);
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

installSignalCleanup();
await ensureWrk();
const upstream = await startUpstreamProcess();
const targets: Array<{ name: string; tollgate: Tollgate; script: string }> = [];
const dir = tempDir('ab');
const body = JSON.stringify({
  model: 'model_03',
  messages: [{ role: 'user', content: 'hello' }],
  max_completion_tokens: 64,
  ...(STREAM ? { stream: true } : {}),
});
for (const [name, root, env] of [
  ['A', dirA, envOption('--env-a')],
  ['B', dirB, envOption('--env-b')],
] as const) {
  const tollgate = await startTollgate(upstream.url, 'always', {
    root: resolve(root),
    env,
    name: `tollgate ${name}`,
  });
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${tollgate.key}` };
  targets.push({ name, tollgate, script: wrkScript(dir, name, body, headers) });
}

const url = (target: (typeof targets)[number]) => `${target.tollgate.url}/api/v1/chat/completions`;
for (const target of targets) await runWrk(url(target), target.script, 32, 1); // warm-up

const cpu: Record<string, number[]> = { A: [], B: [] };
const p99: Record<string, number[]> = { A: [], B: [] };
for (let round = 0; round < ROUNDS; round++) {
  for (const target of round % 2 === 0 ? targets : [...targets].reverse()) {
    const before = cpuSeconds(target.tollgate.pid);
    const result = await runWrk(url(target), target.script, 32, SECONDS);
    cpu[target.name]!.push(((cpuSeconds(target.tollgate.pid) - before) * 1e6) / result.requests);
    p99[target.name]!.push(result.p99Ms);
  }
}
const differences = cpu.B!.map((b, i) => b - cpu.A![i]!).sort((x, y) => x - y);
const fmt = (value: number) => value.toFixed(1);
console.log(`${STREAM ? 'stream' : 'non-stream'}, c=32, ${ROUNDS} rounds of ${SECONDS} s each`);
for (const name of ['A', 'B']) {
  console.log(
    `${name}: CPU ${fmt(median(cpu[name]!))} µs/request (${fmt(Math.min(...cpu[name]!))}–` +
      `${fmt(Math.max(...cpu[name]!))}), p99 ${median(p99[name]!).toFixed(2)} ms (median)`,
  );
}
console.log(
  `B − A per round: median ${fmt(median(differences))} µs/request, quartiles ` +
    `${fmt(percentile(differences, 25))} … ${fmt(percentile(differences, 75))}`,
);
for (const target of targets) await stopChild(target.tollgate.child);
await stopChild(upstream.child);
await cleanup();
