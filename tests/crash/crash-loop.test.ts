// Crash loop: the real server under concurrent load, SIGKILLed on events of the load (after N
// acknowledged finishes, never on a timer) and restarted at once on its data dir. After every
// restart: the ledger invariant per key to the µcr with nothing held, no second task or charge for
// a retried acknowledged Idempotency-Key, and every acknowledged request's record readable and
// unchanged.
import { expect, test } from 'bun:test';
import { type CrashLoopResult, runCrashLoop, summarize } from './harness.ts';

/**
 * A fixed seed replays the same load mix and kill schedule (CRASH_SEED overrides it to explore
 * others).
 */
const SEED = Number(process.env.CRASH_SEED ?? 20_260_101);

function expectSound(result: CrashLoopResult, cycles: number): void {
  if (result.violations.length > 0) console.log(summarize(result));
  expect(result.violations).toEqual([]);
  expect(result.cycles).toBe(cycles);
  // The load must have exercised what the checks are about, or the test proves nothing.
  expect(result.acknowledged).toBeGreaterThan(0);
  expect(result.completed).toBeGreaterThan(0);
  expect(result.quotaRefused).toBeGreaterThan(0);
  expect(result.cutOff).toBeGreaterThan(0);
  expect(result.interruptedRecovered).toBeGreaterThan(0);
  expect(result.idempotentRetriesChecked).toBeGreaterThan(0);
  expect(result.recordsChecked).toBeGreaterThan(0);
  // Kills landed before any answer (N = 0) and after some (N > 0).
  expect(result.killAfterFinishes).toContain(0);
  expect(result.killAfterFinishes.some((n) => n > 0)).toBe(true);
}

test('survives 24 SIGKILLs under load with its ' +
  'ledger, idempotency keys and records intact', async () => {
  const result = await runCrashLoop({
    cycles: 24,
    seed: SEED,
    requestsPerCycle: 16,
    killAfterFinishesMax: 8,
  });
  expectSound(result, 24);
}, 60_000);

test('survives 12 SIGKILLs while snapshots and compaction run every few records', async () => {
  // About one snapshot per cycle, so kills land before, during and after snapshot + segment
  // removal.
  const result = await runCrashLoop({
    cycles: 12,
    seed: SEED + 1,
    requestsPerCycle: 16,
    killAfterFinishesMax: 8,
    configOverrides: { wal: { snapshot_every_records: 20 } },
  });
  expectSound(result, 12);
  // The log did snapshot and drop the segments it covered between the kills.
  expect(result.snapshotsSeen).toBeGreaterThan(1);
  expect(result.segmentsRemoved).toBeGreaterThan(0);
}, 60_000);
