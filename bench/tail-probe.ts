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
// `TAILPROBE heap <json>` (sizes in bytes; the 12 commonest object types). heapStats walks the
// heap, so it is never taken while the load runs.
process.on('SIGUSR2', () => {
  const stats = heapStats();
  const top = Object.entries(stats.objectTypeCounts)
    .sort((a, b) => b[1] - a[1])
    .slice(0, 12);
  const line = JSON.stringify({
    heapSize: stats.heapSize,
    heapCapacity: stats.heapCapacity,
    extraMemorySize: stats.extraMemorySize,
    objectCount: stats.objectCount,
    protectedObjectCount: stats.protectedObjectCount,
    top,
  });
  writeSync(2, `TAILPROBE heap ${line}\n`);
});
