// Crash soak: the crash-loop test's cycle (load, SIGKILL after N acknowledged finishes, restart,
// check) many times over. Usage: bun bench/soak.ts [cycles=500] [--seed N] [--requests N]
// [--kill-after N] [--snapshot-every N] [--json] Prints a summary (cycles, requests sent,
// acknowledged, violations) and exits 1 on any violation.
import { runCrashLoop, summarize } from '../tests/crash/harness.ts';

function parseArgs(argv: string[]) {
  const options = {
    cycles: 500,
    seed: Date.now() % 2_147_483_647,
    requests: 16,
    killAfter: 8,
    snapshotEvery: 0,
    json: false,
  };
  const positional: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const value = () => {
      const next = argv[++i];
      if (next === undefined || !/^\d+$/.test(next)) throw new Error(`${arg} needs a whole number`);
      return Number(next);
    };
    if (arg === '--seed') options.seed = value();
    else if (arg === '--requests') options.requests = value();
    else if (arg === '--kill-after') options.killAfter = value();
    else if (arg === '--snapshot-every') options.snapshotEvery = value();
    else if (arg === '--json') options.json = true;
    else if (/^\d+$/.test(arg)) positional.push(arg);
    else throw new Error(`unknown argument ${arg}`);
  }
  if (positional[0]) options.cycles = Number(positional[0]);
  if (options.cycles < 1) throw new Error('cycles must be at least 1');
  return options;
}

let options: ReturnType<typeof parseArgs>;
try {
  options = parseArgs(process.argv.slice(2));
} catch (error) {
  console.error(`soak: ${(error as Error).message}`);
  console.error(
    'usage: bun bench/soak.ts [cycles=500] [--seed N] [--requests N] [--kill-after N] ' +
      '[--snapshot-every N] [--json]',
  );
  process.exit(64);
}

console.log(
  `crash soak: ${options.cycles} cycles, seed ${options.seed}, ${options.requests} requests per ` +
    `cycle, kill after 0–${options.killAfter} acknowledged finishes` +
    (options.snapshotEvery > 0 ? `, snapshot every ${options.snapshotEvery} records` : ''),
);
const result = await runCrashLoop({
  cycles: options.cycles,
  seed: options.seed,
  requestsPerCycle: options.requests,
  killAfterFinishesMax: options.killAfter,
  configOverrides:
    options.snapshotEvery > 0 ? { wal: { snapshot_every_records: options.snapshotEvery } } : {},
  log: (line) => console.log(line),
});
console.log(summarize(result));
if (options.json) {
  const { violations, ...numbers } = result;
  console.log(JSON.stringify({ ...numbers, violations: violations.length }));
}
const failed = result.violations.length > 0 || result.cycles < options.cycles;
process.exit(failed ? 1 : 0);
