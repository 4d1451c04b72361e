import { describe, expect, test } from 'bun:test';
import {
  type FifoTimerEntry,
  FifoTimers,
  fifoTimersFor,
  NOT_QUEUED,
} from '../../src/util/fifo-timers.ts';

class Entry implements FifoTimerEntry {
  timerPrev: FifoTimerEntry | null = null;
  timerNext: FifoTimerEntry | null = null;
  timerDueMs = NOT_QUEUED;
  armedAtMs = 0;
  firedAtMs: number | null = null;

  constructor(
    readonly name: string,
    private readonly fired: string[],
    private readonly then: () => void = () => {},
  ) {}

  onTimer(): void {
    this.firedAtMs = performance.now();
    this.fired.push(this.name);
    this.then();
  }
}

function armed(timers: FifoTimers, entry: Entry): Entry {
  entry.armedAtMs = performance.now();
  timers.arm(entry);
  return entry;
}

describe('FifoTimers', () => {
  test('entries fire in the order armed, none before its delay', async () => {
    const timers = new FifoTimers(5);
    const fired: string[] = [];
    const last = Promise.withResolvers<void>();
    const entries = ['a', 'b', 'c'].map((name) =>
      armed(timers, new Entry(name, fired, name === 'c' ? last.resolve : undefined)),
    );
    await last.promise;
    expect(fired).toEqual(['a', 'b', 'c']);
    for (const entry of entries) {
      expect(entry.firedAtMs! - entry.armedAtMs).toBeGreaterThanOrEqual(5);
      expect(entry.timerDueMs).toBe(NOT_QUEUED);
    }
    expect(timers.empty).toBe(true);
  });

  test('a cancelled entry never fires, wherever it is in the list; none is left', async () => {
    const timers = new FifoTimers(2);
    const fired: string[] = [];
    const last = Promise.withResolvers<void>();
    const [first, middle, , end] = ['first', 'middle', 'kept', 'end'].map((name) =>
      armed(timers, new Entry(name, fired)),
    );
    timers.cancel(first!);
    timers.cancel(middle!);
    timers.cancel(end!);
    timers.cancel(end!); // twice: a no-op
    armed(timers, new Entry('after', fired, last.resolve));
    await last.promise;
    expect(fired).toEqual(['kept', 'after']);
    expect(timers.empty).toBe(true);
  });

  test('an entry re-armed goes behind the others, timed from then', async () => {
    const timers = new FifoTimers(3);
    const fired: string[] = [];
    const last = Promise.withResolvers<void>();
    const moved = armed(timers, new Entry('moved', fired, last.resolve));
    armed(timers, new Entry('stayed', fired));
    timers.cancel(moved);
    armed(timers, moved);
    await last.promise;
    expect(fired).toEqual(['stayed', 'moved']);
  });

  test('an entry armed from a firing one fires in its turn', async () => {
    const timers = new FifoTimers(1);
    const fired: string[] = [];
    const last = Promise.withResolvers<void>();
    const second = new Entry('second', fired, last.resolve);
    armed(timers, new Entry('first', fired, () => armed(timers, second)));
    await last.promise;
    expect(fired).toEqual(['first', 'second']);
    expect(second.firedAtMs! - second.armedAtMs).toBeGreaterThanOrEqual(1);
  });

  test('arming an entry already armed is a bug', () => {
    const timers = new FifoTimers(1_000);
    const entry = armed(timers, new Entry('once', []));
    expect(() => timers.arm(entry)).toThrow('armed twice');
    timers.cancel(entry);
  });

  test('a hundred thousand entries armed and cancelled keep nothing', () => {
    const timers = new FifoTimers(60_000);
    const entries = Array.from({ length: 100_000 }, (_, i) => new Entry(String(i), []));
    for (const entry of entries) timers.arm(entry);
    // Out of order: every other one first, then the rest from the end.
    for (let i = 0; i < entries.length; i += 2) timers.cancel(entries[i]!);
    for (let i = entries.length - 1; i > 0; i -= 2) timers.cancel(entries[i]!);
    expect(timers.empty).toBe(true);
    for (const entry of entries) {
      expect(entry.timerPrev).toBeNull();
      expect(entry.timerNext).toBeNull();
    }
  });

  test('one list per delay is shared', () => {
    expect(fifoTimersFor(12_345)).toBe(fifoTimersFor(12_345));
    expect(fifoTimersFor(12_345)).not.toBe(fifoTimersFor(12_346));
    expect(fifoTimersFor(12_345).delayMs).toBe(12_345);
  });
});

test('an entry armed from a firing one does not hold back those already waiting', async () => {
  // A fires and arms C; B, armed between A and C, is due well before C and must not wait for it.
  const delayMs = 40;
  const timers = new FifoTimers(delayMs);
  const fired: string[] = [];
  const bFired = Promise.withResolvers<void>();
  const c = new Entry('c', fired);
  const b = new Entry('b', fired, bFired.resolve);
  armed(timers, new Entry('a', fired, () => armed(timers, c)));
  // B is armed half a delay after A (through a timer list of its own, not a sleep).
  const half = new FifoTimers(delayMs / 2);
  half.arm(new Entry('half', [], () => armed(timers, b)));
  await bFired.promise;
  expect(fired).toEqual(['a', 'b']);
  expect(b.firedAtMs!).toBeLessThan(c.armedAtMs + delayMs);
  timers.cancel(c);
});

const MODULE = JSON.stringify(`${import.meta.dir}/../../src/util/fifo-timers.ts`);

/**
 * Runs `body` in a process of its own (nothing of the test runner's keeps its loop alive), with
 * FifoTimers imported and `entry(onTimer)` making an entry; its stdout is piped.
 */
function runApart(body: string) {
  const script = `
    import { DELAYS_MAX, FifoTimers, fifoTimersFor, NOT_QUEUED } from ${MODULE};
    const entry = (onTimer = () => {}) =>
      ({ timerPrev: null, timerNext: null, timerDueMs: NOT_QUEUED, onTimer });
    ${body}
  `;
  return Bun.spawn([process.execPath, '-e', script], { stdout: 'pipe', stderr: 'pipe' });
}

test('a list left empty keeps no process alive', async () => {
  // The process must end at once, not when the cancelled entry would have fired (a minute later).
  const child = runApart(`
    const timers = new FifoTimers(60_000);
    const first = entry();
    timers.arm(first);
    timers.cancel(first);
    const again = entry();
    timers.arm(again);
    timers.cancel(again);
  `);
  const exited = await Promise.race([
    child.exited,
    new Promise<'alive'>((resolve) => setTimeout(() => resolve('alive'), 10_000)),
  ]);
  if (exited === 'alive') child.kill();
  expect(exited).toBe(0);
});

test('an entry armed after the list emptied keeps the process alive until it fires', async () => {
  const child = runApart(`
    const timers = new FifoTimers(20);
    const first = entry();
    timers.arm(first);
    timers.cancel(first);
    timers.arm(entry(() => console.log('fired')));
  `);
  expect(await child.exited).toBe(0);
  expect(await new Response(child.stdout).text()).toBe('fired\n');
});

test('past DELAYS_MAX distinct delays, lists are no longer kept, and still fire', async () => {
  // Apart, so that the test runner's own shared lists are not crowded out.
  const child = runApart(`
    const first = fifoTimersFor(1);
    for (let delayMs = 2; delayMs <= DELAYS_MAX + 100; delayMs++) fifoTimersFor(delayMs);
    const past = DELAYS_MAX + 50;
    console.log(fifoTimersFor(1) === first, fifoTimersFor(past) === fifoTimersFor(past));
    fifoTimersFor(past).arm(entry(() => console.log('fired')));
  `);
  expect(await child.exited).toBe(0);
  expect(await new Response(child.stdout).text()).toBe('true false\nfired\n');
});
