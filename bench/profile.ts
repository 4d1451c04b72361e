// Where tollgate's CPU goes under load: `bun --cpu-prof` on the gateway while wrk drives it, then
// the top functions by self time (and by inclusive time) from the .cpuprofile.
//
// Usage: bun bench/profile.ts [nonstream|stream|both] [--seconds S] [--fsync always|interval|off]
//   [--provider openai|anthropic] [--top N] [--keep DIR]
// Same layout as bench/run.ts: tollgate on core 0, the fake upstream and wrk (32 connections) on
// core 1. One tollgate per mode, so each profile holds one workload. --provider picks the adapter
// between tollgate and the fake upstream (model_03 or ANTHROPIC_MODEL). --keep copies the
// .cpuprofile files to DIR (open them in Chrome DevTools or speedscope).
import { copyFileSync, mkdirSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import {
  ANTHROPIC_MODEL,
  cleanup,
  ensureWrk,
  type FsyncPolicy,
  fmt,
  installSignalCleanup,
  ROOT,
  runWrk,
  startTollgate,
  startUpstreamProcess,
  stopChild,
  table,
  tempDir,
  wrkScript,
} from './lib.ts';

interface CallFrame {
  functionName: string;
  url: string;
  lineNumber: number;
  columnNumber: number;
}
interface ProfileNode {
  id: number;
  callFrame: CallFrame;
  children?: number[];
}
interface CpuProfile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

export interface ProfileEntry {
  name: string;
  selfMs: number;
  selfPct: number;
  totalMs: number;
  totalPct: number;
}

function frameName(frame: CallFrame): string {
  const fn = frame.functionName || '(anonymous)';
  if (!frame.url) return fn;
  const path = frame.url.startsWith('file://') ? frame.url.slice(7) : frame.url;
  const short = path.startsWith(ROOT)
    ? relative(ROOT, path)
    : path.replace(/^.*node_modules\//, 'node_modules/');
  return `${fn} ${short}:${frame.lineNumber + 1}`;
}

/**
 * Self and inclusive time per function (by name, file and line) from a Chrome-format CPU profile.
 */
export function summarizeProfile(profile: CpuProfile): {
  entries: ProfileEntry[];
  totalMs: number;
  idleMs: number;
} {
  const byId = new Map<number, ProfileNode>();
  const parent = new Map<number, number>();
  for (const node of profile.nodes) {
    byId.set(node.id, node);
    for (const child of node.children ?? []) parent.set(child, node.id);
  }
  const self = new Map<string, number>();
  const total = new Map<string, number>();
  let totalUs = 0;
  let idleUs = 0;
  for (let i = 0; i < profile.samples.length; i++) {
    const deltaUs = profile.timeDeltas[i + 1] ?? 0; // a sample's time is the gap to the next one
    const node = byId.get(profile.samples[i]!);
    if (!node) continue;
    totalUs += deltaUs;
    const name = frameName(node.callFrame);
    if (node.callFrame.functionName === '(idle)' || node.callFrame.functionName === '(program)')
      idleUs += deltaUs;
    self.set(name, (self.get(name) ?? 0) + deltaUs);
    const seen = new Set<string>();
    for (let id: number | undefined = node.id; id !== undefined; id = parent.get(id)) {
      const n = frameName(byId.get(id)!.callFrame);
      if (seen.has(n)) continue;
      seen.add(n);
      total.set(n, (total.get(n) ?? 0) + deltaUs);
    }
  }
  const entries = [...total.keys()].map((name) => ({
    name,
    selfMs: (self.get(name) ?? 0) / 1000,
    selfPct: ((self.get(name) ?? 0) / totalUs) * 100,
    totalMs: total.get(name)! / 1000,
    totalPct: (total.get(name)! / totalUs) * 100,
  }));
  return { entries, totalMs: totalUs / 1000, idleMs: idleUs / 1000 };
}

/**
 * Self time grouped by source file (native and builtin frames, which have no file, grouped as one).
 */
export function selfByFile(
  entries: ProfileEntry[],
): Array<{ file: string; selfMs: number; selfPct: number }> {
  const files = new Map<string, { selfMs: number; selfPct: number }>();
  for (const entry of entries) {
    const match = / (\S+):\d+$/.exec(entry.name);
    let file = match ? match[1]! : '(native / builtin: fetch, JSON, streams, …)';
    if (file.startsWith('node_modules/')) file = file.split('/').slice(0, 2).join('/');
    const sum = files.get(file) ?? { selfMs: 0, selfPct: 0 };
    sum.selfMs += entry.selfMs;
    sum.selfPct += entry.selfPct;
    files.set(file, sum);
  }
  return [...files.entries()]
    .map(([file, sum]) => ({ file, ...sum }))
    .sort((a, b) => b.selfMs - a.selfMs);
}

type ProviderKind = 'openai' | 'anthropic';

async function profileMode(
  mode: 'nonstream' | 'stream',
  seconds: number,
  fsync: FsyncPolicy,
  provider: ProviderKind,
  top: number,
  keep: string | null,
): Promise<string> {
  const upstream = await startUpstreamProcess();
  const dir = tempDir(`cpuprof-${mode}`);
  const tollgate = await startTollgate(upstream.url, fsync, {
    bunFlags: ['--cpu-prof', `--cpu-prof-dir=${dir}`],
  });
  const url = `${tollgate.url}/api/v1/chat/completions`;
  const headers = { 'content-type': 'application/json', authorization: `Bearer ${tollgate.key}` };
  const body = JSON.stringify({
    // The same fake upstream through either adapter (bench/lib.ts's config).
    model: provider === 'anthropic' ? ANTHROPIC_MODEL : 'model_03',
    messages: [{ role: 'user', content: 'hello' }],
    max_completion_tokens: 64,
    ...(mode === 'stream' ? { stream: true } : {}),
  });
  const script = wrkScript(dir, mode, body, headers);
  const result = await runWrk(url, script, 32, seconds);
  await stopChild(tollgate.child, 15_000);
  await stopChild(upstream.child);
  const file = readdirSync(dir).find((name) => name.endsWith('.cpuprofile'));
  if (!file) throw new Error(`no .cpuprofile written in ${dir}`);
  if (keep) {
    mkdirSync(keep, { recursive: true });
    copyFileSync(join(dir, file), join(keep, `tollgate-${provider}-${mode}.cpuprofile`));
  }
  const profile = (await Bun.file(join(dir, file)).json()) as CpuProfile;
  const { entries, totalMs, idleMs } = summarizeProfile(profile);
  const row = (e: ProfileEntry) => [
    e.name.replaceAll('|', '\\|'),
    fmt(e.selfMs, 0),
    fmt(e.selfPct, 1),
    fmt(e.totalMs, 0),
    fmt(e.totalPct, 1),
  ];
  const header = ['function', 'self ms', 'self %', 'total ms', 'total %'];
  const bySelf = [...entries].sort((a, b) => b.selfMs - a.selfMs).slice(0, top);
  const byTotal = [...entries]
    .filter((e) => !e.name.startsWith('('))
    .sort((a, b) => b.totalMs - a.totalMs)
    .slice(0, top);
  return [
    `## ${mode}, ${provider} adapter, fsync ${fsync}: ${Math.round(result.rps)} req/s at 32 ` +
      `connections for ` +
      `${seconds} s`,
    '',
    `Profile: ${fmt(totalMs, 0)} ms sampled, of which ${fmt(idleMs, 0)} ms idle/program ` +
      `(includes start-up and shutdown).`,
    '',
    '### Top by self time',
    '',
    table(header, bySelf.map(row)),
    '',
    '### Top by inclusive time',
    '',
    table(header, byTotal.map(row)),
    '',
    '### Self time by file',
    '',
    table(
      ['file', 'self ms', 'self %'],
      selfByFile(entries)
        .slice(0, top)
        .map((f) => [f.file, fmt(f.selfMs, 0), fmt(f.selfPct, 1)]),
    ),
    '',
  ].join('\n');
}

// `bun bench/profile.ts tail …` is not a CPU profile: where the p99 comes from (bench/tail.ts).
if (import.meta.main && process.argv[2] === 'tail') {
  installSignalCleanup();
  let code = 1;
  try {
    const { tailMain } = await import('./tail.ts');
    code = await tailMain(process.argv.slice(3));
  } catch (error) {
    process.stderr.write(`profile tail failed: ${(error as Error).stack ?? error}\n`);
  } finally {
    await cleanup();
  }
  process.exit(code);
}

if (import.meta.main) {
  installSignalCleanup();
  const args = process.argv.slice(2);
  const option = (name: string, fallback: string) => {
    const at = args.indexOf(name);
    return at >= 0 ? args[at + 1]! : fallback;
  };
  const which = args.find((a) => a === 'nonstream' || a === 'stream' || a === 'both') ?? 'both';
  const seconds = Number(option('--seconds', '5'));
  const fsync = option('--fsync', 'always') as FsyncPolicy;
  const provider = option('--provider', 'openai') as ProviderKind;
  if (provider !== 'openai' && provider !== 'anthropic')
    throw new Error(`--provider must be openai or anthropic, not ${provider}`);
  const top = Number(option('--top', '25'));
  const keepAt = args.indexOf('--keep');
  const keep = keepAt >= 0 ? args[keepAt + 1]! : null;
  try {
    await ensureWrk();
    const modes =
      which === 'both' ? (['nonstream', 'stream'] as const) : [which as 'nonstream' | 'stream'];
    for (const mode of modes)
      console.log(await profileMode(mode, seconds, fsync, provider, top, keep));
  } catch (error) {
    process.stderr.write(`profile failed: ${(error as Error).stack ?? error}\n`);
    process.exitCode = 1;
  } finally {
    await cleanup();
  }
}
