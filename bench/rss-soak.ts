// Memory over a long run (issue 15): tollgate under steady load for N minutes, its RSS sampled
// every second and reported per minute, beside the trivial proxy's under the same load for the
// first minute. The goal: RSS after the last minute within 10 % of RSS after the first.
//
// Usage: bun bench/rss-soak.ts [minutes=10] [--mode nonstream|stream] [--fsync always|off] Same
// layout as bench/run.ts (gateway on core 0; upstream and wrk on core 1). Writes
// bench/results/rss-soak.json (not committed).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import {
  cleanup,
  ensureWrk,
  type FsyncPolicy,
  fmt,
  installSignalCleanup,
  median,
  ROOT,
  rssMiB,
  runWrk,
  startProxyProcess,
  startTollgate,
  startUpstreamProcess,
  stopChild,
  table,
  tempDir,
  wrkScript,
} from './lib.ts';

const args = process.argv.slice(2);
const option = (name: string, fallback: string) => {
  const at = args.indexOf(`--${name}`);
  return at === -1 ? fallback : args[at + 1]!;
};
const MINUTES = Number(args.find((arg) => /^\d+$/.test(arg)) ?? 10);
const MODE = option('mode', 'nonstream') as 'nonstream' | 'stream';
const FSYNC = option('fsync', 'always') as FsyncPolicy;
const CONNECTIONS = 32;

interface Minute {
  minute: number;
  requests: number;
  rssEndMiB: number;
  rssPeakMiB: number;
  /**
   * The median of the minute's 1 s samples: snapshots (every ~6 s at these rates) copy the record
   * table (~20 MB) and the collector frees the copy when it runs, so a single sample at the
   * minute's end lands anywhere in a ~30 MiB swing; the median does not.
   */
  rssMedianMiB: number;
  p99Ms: number;
}

/** Runs wrk one minute at a time against `url`, sampling `pid`'s RSS every second. */
async function loadFor(
  pid: number,
  url: string,
  script: string,
  minutes: number,
): Promise<{ startMiB: number; minutes: Minute[] }> {
  const startMiB = rssMiB(pid);
  const result: Minute[] = [];
  for (let minute = 1; minute <= minutes; minute++) {
    let peak = rssMiB(pid);
    const samples: number[] = [];
    const sampler = setInterval(() => {
      const now = rssMiB(pid);
      samples.push(now);
      peak = Math.max(peak, now);
    }, 1_000);
    const wrk = await runWrk(url, script, CONNECTIONS, 60);
    clearInterval(sampler);
    const rssEndMiB = rssMiB(pid);
    result.push({
      minute,
      requests: wrk.requests,
      rssEndMiB,
      rssPeakMiB: Math.max(peak, rssEndMiB),
      rssMedianMiB: median([...samples, rssEndMiB]),
      p99Ms: wrk.p99Ms,
    });
    console.error(
      `minute ${minute}: ${wrk.requests} requests, RSS ${fmt(rssEndMiB, 1)} MiB ` +
        `(peak ${fmt(peak, 1)}), p99 ${fmt(wrk.p99Ms)} ms`,
    );
  }
  return { startMiB, minutes: result };
}

function body(model: string): string {
  return JSON.stringify({
    model,
    stream: MODE === 'stream',
    messages: [{ role: 'user', content: 'Say hello.' }],
  });
}

async function main(): Promise<void> {
  installSignalCleanup();
  await ensureWrk();
  const upstream = await startUpstreamProcess();
  const dir = tempDir('rss-soak');
  const json = { 'content-type': 'application/json' };
  console.error(`proxy: 1 minute of ${MODE} at c=${CONNECTIONS}`);
  const proxy = await startProxyProcess(upstream.url);
  const proxyRun = await loadFor(
    proxy.pid,
    `${proxy.url}/v1/chat/completions`,
    wrkScript(dir, 'proxy', body('up'), json),
    1,
  );
  await stopChild(proxy.child);
  console.error(`tollgate (fsync ${FSYNC}): ${MINUTES} minutes of ${MODE} at c=${CONNECTIONS}`);
  const tollgate = await startTollgate(upstream.url, FSYNC);
  const headers = { ...json, authorization: `Bearer ${tollgate.key}` };
  const run = await loadFor(
    tollgate.pid,
    `${tollgate.url}/api/v1/chat/completions`,
    wrkScript(dir, 'tollgate', body('model_03'), headers),
    MINUTES,
  );
  await stopChild(tollgate.child);
  await stopChild(upstream.child);
  const first = run.minutes[0]!;
  const last = run.minutes.at(-1)!;
  const proxyPeak = proxyRun.minutes[0]!.rssPeakMiB;
  const peak = Math.max(...run.minutes.map((m) => m.rssPeakMiB));
  console.log(
    table(
      ['minute', 'requests', 'RSS at its end MiB', 'RSS median MiB', 'RSS peak MiB', 'p99 ms'],
      run.minutes.map((m) => [
        String(m.minute),
        String(m.requests),
        fmt(m.rssEndMiB, 1),
        fmt(m.rssMedianMiB, 1),
        fmt(m.rssPeakMiB, 1),
        fmt(m.p99Ms),
      ]),
    ),
  );
  console.log(
    `\nRSS after start ${fmt(run.startMiB, 1)} MiB; ` +
      `after minute ${last.minute} ÷ after minute 1: ` +
      `${fmt(last.rssEndMiB / first.rssEndMiB, 3)} (goal within 10 %), the minutes' medians ` +
      `${fmt(last.rssMedianMiB / first.rssMedianMiB, 3)}, their peaks ` +
      `${fmt(last.rssPeakMiB / first.rssPeakMiB, 3)}; peak ${fmt(peak, 1)} MiB ` +
      `against the proxy's ${fmt(proxyPeak, 1)} (goal ≤ 2× + 32 = ${fmt(2 * proxyPeak + 32, 1)})`,
  );
  mkdirSync(join(ROOT, 'bench/results'), { recursive: true });
  writeFileSync(
    join(ROOT, 'bench/results/rss-soak.json'),
    JSON.stringify({ mode: MODE, fsync: FSYNC, proxy: proxyRun, tollgate: run }, null, 2),
  );
}

try {
  await main();
} finally {
  await cleanup();
}
