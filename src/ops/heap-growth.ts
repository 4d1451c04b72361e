// How far JavaScriptCore lets the heap grow between collections, for `serve`: chosen by
// re-executing the process once with JSC options in its environment (Bun reads them only from the
// environment it starts with; there is no call to set one later).
//
// Why: on a machine with 16 GiB of RAM or more, JSC lets the heap grow to up to ~4× its size after
// each full collection (WebKit `proportionalHeapSize`, "aggressive" growth: 1 +
// `heapGrowthMaxIncrease`, 3 in Bun's WebKit; 2× below 16 GiB or once the heap passes a quarter of
// the RAM, `smallHeapGrowthFactor`), and the size it counts includes the bytes typed arrays own.
// The gateway keeps ~25 MB of them live (the record table, the o200k tables, the log's buffer)
// beside ~5 MB of objects, so ~60 MB of per-request garbage piled up between young collections: a
// c=32 peak RSS of 160–185 MiB against the trivial proxy's 52 (bench/README.md, issue 15).
//
// What sets the peak (JSC's `Heap::updateAllocationLimits`, read in Bun's WebKit and seen in
// `BUN_JSC_logGC`): a full collection leaves a live size S and a limit of growth × S (at least 32
// MiB, `largeHeapSize`: not reached at our S of ~30 MB), so the young generation's budget is
// (growth − 1) × S, and that budget stays fixed: each young collection raises the limit by what it
// promoted. A full collection comes once what is left under the limit, after what a young one
// promoted, is under `minEdenToOldGenerationRatio` of it (an option of Bun's WebKit only; upstream
// hard-codes 1/3), so the heap peaks near (growth − 1) × S ÷ ratio in JSC's accounting (objects
// plus the bytes they own). Under stream load every young collection promotes the ~32 streams in
// flight (~0.5 MB), which fills the old generation to that peak.
//  - growth 1.5, ratio 0.2 (until 2026-11-24): a peak of 2.5 S, RSS 135–145 MiB under streams.
//  - growth 1.4, ratio 0.2: 2 S, RSS ~10 MiB lower under streams, the same CPU per request within
//    ±1.5 µs (bench/ab.ts, 20 rounds non-stream, 14 stream). Young collections come 1.25× as
//    often; full ones ~1.7× (the old generation may grow by 0.6 S instead of S).
//  - growth 1.5, ratio 0.25: also 2 S, but full collections twice as often, and a full one's last
//    pause (~4 ms) is what the stream tail is made of.
// The ratio must stay under (growth − 1) ÷ growth (0.29 at 1.4), or every young collection is
// followed by a full one (measured at 1/3: pauses 20 → 80–135 ms/s).
//
// The operator's own values win: a variable already in the environment is kept. `execve` keeps the
// pid, the open descriptors and the terminal, so supervisors, `npm start` and the compiled binary
// see one process.

/** The JSC options, as Bun reads them from the environment, and our values. */
export const HEAP_OPTIONS: Readonly<Record<string, string>> = {
  // Growth after a collection, machines with ≥ 16 GiB: up to (1 + this) × the heap (JSC: 3).
  BUN_JSC_heapGrowthMaxIncrease: '0.4',
  // The same below 16 GiB or past a quarter of the RAM (JSC: 2).
  BUN_JSC_smallHeapGrowthFactor: '1.4',
  // See above (JSC: 1/3).
  BUN_JSC_minEdenToOldGenerationRatio: '0.2',
};

/**
 * Re-executes this process with HEAP_OPTIONS in its environment unless all of them are there
 * already (after the re-exec, or set by the operator). Returns only when it did not re-execute:
 * the process then runs with JSC's default growth, which is slower to give memory back but correct.
 */
export function execWithHeapOptions(): void {
  const missing = Object.keys(HEAP_OPTIONS).filter((name) => process.env[name] === undefined);
  if (missing.length === 0 || process.execve === undefined) return;
  // A compiled executable's argv[1] is its own embedded entry point, which it puts back itself; a
  // `bun src/main.ts` run needs bun's own flags (`--smol`, …) and the script again.
  const compiled = import.meta.path.startsWith('/$bunfs/');
  const args = compiled
    ? process.argv.slice(2)
    : [...bunFlags(process.execArgv), ...process.argv.slice(1)];
  const env: Record<string, string | undefined> = { ...process.env };
  for (const name of missing) env[name] = HEAP_OPTIONS[name];
  try {
    process.execve(process.execPath, [process.execPath, ...args], env);
  } catch {
    // execve failed (the binary moved, a seccomp filter, …): this image still runs; it is better
    // to serve with the default growth than not at all.
  }
}

/**
 * Bun's flags for the new image, without `--cwd`: Bun has already changed into that directory, and
 * execve keeps the cwd, so a relative one would be looked for inside itself and stop the start.
 */
function bunFlags(execArgv: readonly string[]): string[] {
  const flags: string[] = [];
  for (let at = 0; at < execArgv.length; at++) {
    const flag = execArgv[at]!;
    if (flag === '--cwd') at++;
    else if (!flag.startsWith('--cwd=')) flags.push(flag);
  }
  return flags;
}

/** The options this process runs with, for the log (null: JSC's default). */
export function heapOptionsInEffect(): Record<string, string | null> {
  const inEffect: Record<string, string | null> = {};
  for (const name of Object.keys(HEAP_OPTIONS)) inEffect[name] = process.env[name] ?? null;
  return inEffect;
}
