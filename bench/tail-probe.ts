// Preloaded into a server under `bun bench/profile.ts tail` (`bun --preload`): a timeline of the
// event loop's stalls, on the bench's clock, written to stderr beside the collector's own lines.
//
// A 5 ms interval timer that fires late saw the loop busy (JavaScript, a collector pause, a
// synchronous syscall) for that long. Each late tick ≥ 1 ms is one line
// `TAILPROBE late <fired at, epoch ms> <late ms>`, and every 100 ms a `TAILPROBE mark <epoch ms>`
// lets the reader measure how late lines reach it. Clock: performance.timeOrigin +
// performance.now(), as in the load client. writeSync: a line leaves when it is written, not when
// a stream buffer drains, and it keeps its place among the collector's lines on the same fd.
import { heapStats } from 'bun:jsc';
import { writeSync } from 'node:fs';

const TICK_MS = 5;
const REPORT_LATE_MS = 1;
const MARK_EVERY_MS = 100;

const origin = performance.timeOrigin;
let lastMs = performance.now();
let lastMarkMs = lastMs;
const timer = setInterval(() => {
  const nowMs = performance.now();
  const lateMs = nowMs - lastMs - TICK_MS;
  lastMs = nowMs;
  if (lateMs >= REPORT_LATE_MS)
    writeSync(2, `TAILPROBE late ${(origin + nowMs).toFixed(3)} ${lateMs.toFixed(3)}\n`);
  if (nowMs - lastMarkMs >= MARK_EVERY_MS) {
    lastMarkMs = nowMs;
    writeSync(2, `TAILPROBE mark ${(origin + performance.now()).toFixed(3)}\n`);
  }
}, TICK_MS);
// The probe never keeps a process alive that would otherwise exit.
timer.unref();

// SIGUSR2 (sent by the bench before and after the load): what the heap holds, as one line
// `TAILPROBE heap <json>` (sizes in bytes; the 12 commonest object types), once as it is (dead
// objects not yet collected included) and once after a full collection (what is really kept).
// Both walk the heap, so this is never asked while the load runs.
function heapLine(stats: ReturnType<typeof heapStats>) {
  return {
    heapSize: stats.heapSize,
    extraMemorySize: stats.extraMemorySize,
    objectCount: stats.objectCount,
    top: Object.entries(stats.objectTypeCounts)
      .sort((a, b) => b[1] - a[1])
      .slice(0, 12),
  };
}

process.on('SIGUSR2', () => {
  const asIs = heapLine(heapStats());
  Bun.gc(true);
  const live = heapLine(heapStats());
  writeSync(2, `TAILPROBE heap ${JSON.stringify({ asIs, live })}\n`);
});
