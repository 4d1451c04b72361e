// Shared benchmark plumbing: child processes that always get cleaned up, /proc readings, wrk,
// statistics.
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { Subprocess } from 'bun';

export const ROOT = resolve(import.meta.dir, '..');
export const BUN = process.execPath;
export const CORE_GATEWAY = '0';
export const CORE_LOAD = '1';
/** Clock ticks per second for /proc/<pid>/stat (getconf CLK_TCK; 100 on every Linux we run on). */
export const CLK_TCK = 100;

// ------------------------------------------------------------------------------------------
// Children and temp dirs: everything started here is stopped in `cleanup()`, which also runs on
// SIGINT.

const children = new Set<Subprocess>();
const tempDirs = new Set<string>();

export function tempDir(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), `tollgate-bench-${prefix}-`));
  tempDirs.add(dir);
  return dir;
}

/** Bun.spawn with all three pipes, remembered so that `cleanup()` (and SIGINT) stops it. */
export function spawnChild(
  argv: string[],
  options: { env?: Record<string, string | undefined> } = {},
): Subprocess<'pipe', 'pipe', 'pipe'> {
  const child = Bun.spawn(argv, {
    cwd: ROOT,
    env: options.env ?? process.env,
    stdin: 'pipe',
    stdout: 'pipe',
    stderr: 'pipe',
  });
  children.add(child);
  void child.exited.then(() => children.delete(child));
  return child;
}

/** Stops one child: SIGTERM, then SIGKILL after `graceMs`. */
export async function stopChild(child: Subprocess, graceMs = 3_000): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill('SIGTERM');
    const killed = await Promise.race([
      child.exited.then(() => true),
      Bun.sleep(graceMs).then(() => false),
    ]);
    if (!killed) {
      child.kill('SIGKILL');
      await child.exited;
    }
  }
  children.delete(child);
}

export async function cleanup(): Promise<void> {
  await Promise.all([...children].map((child) => stopChild(child)));
  for (const dir of tempDirs) rmSync(dir, { recursive: true, force: true });
  tempDirs.clear();
}

let signalsInstalled = false;
export function installSignalCleanup(): void {
  if (signalsInstalled) return;
  signalsInstalled = true;
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      process.stderr.write(`\nbench: ${signal}, stopping children\n`);
      void cleanup().finally(() => process.exit(130));
    });
  }
}

export function pinned(core: string, argv: string[]): string[] {
  return ['taskset', '-c', core, ...argv];
}

export interface Service {
  child: Subprocess<'pipe', 'pipe', 'pipe'>;
  pid: number;
  url: string;
  /** The last lines the child wrote, for error messages. */
  tail: string[];
}

/**
 * Spawns a long-running child and waits for the JSON line whose `msg` is `readyMsg`; its `url` is
 * the service's address. Stdout and stderr are drained for the child's whole life (a full pipe
 * would block a synchronous logger), keeping the last lines for diagnostics.
 */
export async function startService(
  name: string,
  argv: string[],
  options: { env?: Record<string, string>; readyMsg: string; timeoutMs?: number },
): Promise<Service> {
  const child = Bun.spawn(argv, {
    cwd: ROOT,
    env: { ...process.env, ...options.env },
    stdin: 'pipe',
    stdout: 'pipe',
    stderr: 'pipe',
  });
  children.add(child);
  const tail: string[] = [];
  const ready = Promise.withResolvers<string>();
  const remember = (line: string) => {
    tail.push(line);
    if (tail.length > 20) tail.shift();
  };
  void drainLines(child.stdout, (line) => {
    remember(line);
    if (!line.startsWith('{')) return;
    try {
      const json = JSON.parse(line) as { msg?: string; url?: string };
      if (json.msg === options.readyMsg && json.url) ready.resolve(json.url);
    } catch {
      // not a JSON line
    }
  });
  void drainLines(child.stderr, remember);
  void child.exited.then((code) =>
    ready.reject(new Error(`${name} exited with ${code} before it was ready:\n${tail.join('\n')}`)),
  );
  const timeoutMs = options.timeoutMs ?? 15_000;
  const timer = setTimeout(
    () => ready.reject(new Error(`${name} not ready within ${timeoutMs} ms:\n${tail.join('\n')}`)),
    timeoutMs,
  );
  try {
    const url = await ready.promise;
    return { child, pid: child.pid, url, tail };
  } catch (error) {
    await stopChild(child);
    throw error;
  } finally {
    clearTimeout(timer);
  }
}

export async function drainLines(
  stream: ReadableStream<Uint8Array>,
  onLine: (line: string) => void,
): Promise<void> {
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for await (const bytes of stream) {
      buffer += decoder.decode(bytes, { stream: true });
      let newline: number;
      while ((newline = buffer.indexOf('\n')) !== -1) {
        onLine(buffer.slice(0, newline));
        buffer = buffer.slice(newline + 1);
      }
    }
  } catch {
    // the child went away
  }
  if (buffer.length > 0) onLine(buffer);
}

// ------------------------------------------------------------------------------------------
// The services under test.

export const ADMIN_TOKEN = 'bench-admin-token-0123456789abcdef';

export async function startUpstreamProcess(): Promise<Service> {
  return startService('upstream', pinned(CORE_LOAD, [BUN, 'bench/upstream.ts', '0']), {
    readyMsg: 'upstream listening',
  });
}

export async function startProxyProcess(
  target: string,
  env: Record<string, string> = {},
): Promise<Service> {
  return startService('proxy', pinned(CORE_GATEWAY, [BUN, 'bench/proxy.ts', target, '0']), {
    readyMsg: 'proxy listening',
    env,
  });
}

export type FsyncPolicy = 'always' | 'interval' | 'off';

/**
 * The model every tollgate serves through its `anthropic` provider on the same fake upstream: the
 * same settings as model_03 (rates, windows), so the two differ only in the adapter.
 */
export const ANTHROPIC_MODEL = 'model_03_anthropic';

export interface Tollgate extends Service {
  key: string;
  dataDir: string;
}

/**
 * Starts `bun src/main.ts serve` on core 0 with model_03 (and model_02 for held streams) on the
 * fake upstream through the `openai` provider, ANTHROPIC_MODEL on it through the `anthropic` one,
 * then creates one key with plenty of credits.
 */
export async function startTollgate(
  upstreamUrl: string,
  fsync: FsyncPolicy,
  options: {
    env?: Record<string, string>;
    bunFlags?: string[];
    name?: string;
    /** Sections added to the config (an experiment's limits, say). */
    config?: Record<string, unknown>;
    /** Another checkout to run (bench/ab.ts): its src/main.ts instead of this one's. */
    root?: string;
  } = {},
): Promise<Tollgate> {
  const dir = tempDir(`tollgate-${fsync}`);
  const configPath = join(dir, 'config.json');
  writeFileSync(
    configPath,
    JSON.stringify({
      providers: {
        fake: { type: 'openai', base_url: `${upstreamUrl}/v1` },
        fake_anthropic: { type: 'anthropic', base_url: `${upstreamUrl}/v1` },
      },
      models: {
        model_03: { provider: 'fake', upstream_model: 'up' },
        model_02: { provider: 'fake', upstream_model: 'hold' },
        // model_03's figures from src/config/defaults.ts.
        [ANTHROPIC_MODEL]: {
          provider: 'fake_anthropic',
          upstream_model: 'up',
          tools: true,
          top_k: false,
          seed: true,
          rates: { input: 5, output: 14 },
          context_window: 400_000,
          max_output_tokens: 128_000,
          long_context: null,
          created: 1_767_225_600,
        },
      },
      wal: { fsync },
      limits: { default_rate_limit_rpm: 100_000_000 },
      ...options.config,
    }),
  );
  const service = await startService(
    options.name ?? `tollgate (fsync ${fsync})`,
    pinned(CORE_GATEWAY, [
      BUN,
      ...(options.bunFlags ?? []),
      join(options.root ?? ROOT, 'src/main.ts'),
      'serve',
    ]),
    {
      env: {
        PORT: '0',
        DATA_DIR: join(dir, 'data'),
        ADMIN_TOKEN,
        LOG_LEVEL: 'info',
        GATEWAY_CONFIG: configPath,
        ...options.env,
      },
      readyMsg: 'tollgate listening',
    },
  );
  const response = await fetch(`${service.url}/admin/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'bench', credits: 1_000_000_000 }),
  });
  const created = (await response.json()) as { key?: string };
  if (!response.ok || !created.key)
    throw new Error(
      `tollgate: creating a key failed: ${response.status} ${JSON.stringify(created)}`,
    );
  return { ...service, key: created.key, dataDir: dir };
}

// ------------------------------------------------------------------------------------------
// /proc

/** User + system CPU time of the whole process (all threads), in seconds. */
export function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name and state.
  return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
}

/**
 * User + system CPU time, in seconds, of each of the process's threads whose name starts with
 * `prefix`, by thread id (JavaScriptCore's compiler threads are `JITWorker`): how much of a run's
 * CPU went to compiling rather than serving, which says whether the warm-up was long enough. See
 * threadCpuSince.
 */
export function threadCpu(pid: number, prefix: string): Map<string, number> {
  const seconds = new Map<string, number>();
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return seconds;
  }
  for (const tid of tids) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
      const name = stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
      if (!name.startsWith(prefix)) continue;
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      seconds.set(tid, (Number(fields[11]) + Number(fields[12])) / CLK_TCK);
    } catch {
      // the thread ended meanwhile
    }
  }
  return seconds;
}

/**
 * CPU seconds those threads used since `before` (threadCpu then): a thread that came since counts
 * whole. JSC's compiler threads come and go, and one that ended takes its time since `before`
 * with it, so this is a lower bound.
 */
export function threadCpuSince(pid: number, prefix: string, before: Map<string, number>): number {
  let seconds = 0;
  for (const [tid, now] of threadCpu(pid, prefix)) seconds += now - (before.get(tid) ?? 0);
  return seconds;
}

/**
 * Milliseconds so far in which some task of this machine waited on the disk (PSI, "some" total of
 * /proc/pressure/io); null where the kernel has no PSI. Over a run, an fsync-always gateway's own
 * fsyncs are most of it; a run well above others of the same target had a slower (shared) disk.
 */
export function ioStallMs(): number | null {
  try {
    const match = /^some .*total=(\d+)/m.exec(readFileSync('/proc/pressure/io', 'utf8'));
    return match ? Number(match[1]) / 1000 : null;
  } catch {
    return null;
  }
}

export function rssMiB(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const match = /VmRSS:\s+(\d+) kB/.exec(status);
  return match ? Number(match[1]) / 1024 : NaN;
}

// ------------------------------------------------------------------------------------------
// wrk

export interface WrkResult {
  requests: number;
  durationS: number;
  rps: number;
  p50Ms: number;
  p90Ms: number;
  p99Ms: number;
  p999Ms: number;
  errors: number;
  non2xx: number;
}

export async function ensureWrk(): Promise<void> {
  if (Bun.which('wrk')) return;
  if (process.getuid?.() === 0 && Bun.which('apt-get')) {
    console.error('bench: wrk not found; installing it with apt-get (Debian package "wrk")');
    const install = Bun.spawnSync(['apt-get', 'install', '-y', 'wrk'], {
      stdout: 'inherit',
      stderr: 'inherit',
    });
    if (install.exitCode === 0 && Bun.which('wrk')) return;
  }
  throw new Error(
    'bench: wrk is required (Debian/Ubuntu: `apt-get ' +
      'install wrk`) and could not be installed; aborting.',
  );
}

/** A wrk Lua script for one POST body; `done` prints one machine-readable line. */
export function wrkScript(
  dir: string,
  name: string,
  body: string,
  headers: Record<string, string>,
): string {
  const lua = [
    'wrk.method = "POST"',
    `wrk.body = ${luaString(body)}`,
    ...Object.entries(headers).map(
      ([key, value]) => `wrk.headers[${luaString(key)}] = ${luaString(value)}`,
    ),
    'done = function(summary, latency, requests)',
    '  local e = summary.errors',
    "  io.write(string.format('WRKJSON " +
      '{"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,' +
      '"status":%d,"timeout":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"p999_us":%d}\\n\',',
    '    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,',
    '    latency:percentile(50), latency:percentile(90), latency:percentile(99),',
    '    latency:percentile(99.9)))',
    'end',
  ].join('\n');
  const path = join(dir, `${name}.lua`);
  writeFileSync(path, lua);
  return path;
}

function luaString(text: string): string {
  return `"${text.replaceAll('\\', '\\\\').replaceAll('"', '\\"')}"`;
}

export async function runWrk(
  url: string,
  script: string,
  connections: number,
  durationS: number,
): Promise<WrkResult> {
  const argv = pinned(CORE_LOAD, [
    'wrk',
    '-t1',
    `-c${connections}`,
    `-d${durationS}s`,
    '--timeout',
    '10s',
    '--latency',
    '-s',
    script,
    url,
  ]);
  const child = Bun.spawn(argv, { stdout: 'pipe', stderr: 'pipe' });
  children.add(child);
  const [out, err] = await Promise.all([
    new Response(child.stdout).text(),
    new Response(child.stderr).text(),
  ]);
  await child.exited;
  children.delete(child);
  const line = out.split('\n').find((l) => l.startsWith('WRKJSON '));
  if (!line) throw new Error(`wrk gave no result for ${url}:\n${out}\n${err}`);
  const json = JSON.parse(line.slice(8)) as Record<string, number>;
  const durationS2 = json.duration_us! / 1e6;
  return {
    requests: json.requests!,
    durationS: durationS2,
    rps: json.requests! / durationS2,
    p50Ms: json.p50_us! / 1000,
    p90Ms: json.p90_us! / 1000,
    p99Ms: json.p99_us! / 1000,
    p999Ms: json.p999_us! / 1000,
    errors: json.connect! + json.read! + json.write! + json.timeout!,
    non2xx: json.status!,
  };
}

// ------------------------------------------------------------------------------------------
// Statistics

export function median(values: readonly number[]): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** Nearest-rank percentile (p in 0–100) of unsorted values. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = Float64Array.from(values).sort();
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank]!;
}

export function range(values: readonly number[]): [number, number] {
  return [Math.min(...values), Math.max(...values)];
}

export function fmt(value: number, digits = 2): string {
  if (!Number.isFinite(value)) return 'n/a';
  return value.toFixed(digits);
}

export function fmtInt(value: number): string {
  if (!Number.isFinite(value)) return 'n/a';
  return Math.round(value).toLocaleString('en-US');
}

/** "median (min–max)" of ratios. */
export function fmtRatio(values: readonly number[], digits = 2): string {
  if (values.length === 0) return 'n/a';
  const [low, high] = range(values);
  return `${fmt(median(values), digits)} (${fmt(low, digits)}–${fmt(high, digits)})`;
}

/** A markdown table from a header row and rows of cells. */
export function table(header: string[], rows: string[][]): string {
  const lines = [
    `| ${header.join(' | ')} |`,
    `|${header.map((_, i) => (i === 0 ? ' --- ' : ' ---: ')).join('|')}|`,
  ];
  for (const row of rows) lines.push(`| ${row.join(' | ')} |`);
  return lines.join('\n');
}
