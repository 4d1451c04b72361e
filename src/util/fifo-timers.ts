// Timers that all run the same delay, behind one runtime timer.
//
// Why: every request armed three runtime timers (its body's read deadline, its run's client watch,
// its upstream call's silence timer) and cleared them a few milliseconds later, almost always
// before they fired: setTimeout and clearTimeout were ~3 % of the gateway's JS profile under load,
// with a Timeout object each for the collector. Timers of one delay are due in the order they were
// armed, so a list in that order, with the entry itself as its link, needs no heap: arming
// appends, cancelling unlinks, and one runtime timer fires for the head, then for the next head.
// Under load that is one runtime timer a millisecond or so, whatever the request rate; no
// cancelled entry stays behind.
import { assert } from './assert.ts';

/**
 * What a FifoTimers holds: the object the timer is for, its own link (no node allocated per arm).
 * An entry is in at most one list at a time; `timerDueMs` is NOT_QUEUED when it is in none.
 */
export interface FifoTimerEntry {
  timerPrev: FifoTimerEntry | null;
  timerNext: FifoTimerEntry | null;
  timerDueMs: number;
  /** Called once when the timer is due; never after cancel. */
  onTimer(): void;
}

/** An entry's `timerDueMs` while it is in no list (what a new entry starts with). */
export const NOT_QUEUED = -1;

export class FifoTimers {
  private head: FifoTimerEntry | null = null;
  private tail: FifoTimerEntry | null = null;
  /**
   * The one runtime timer, armed for the head; it may outlive the entries it was armed for (it then
   * finds nothing due), and is unref'd while the list is empty, so that it keeps no process alive
   * that a cleared timer would have let exit.
   */
  private runtimeTimer: ReturnType<typeof setTimeout> | undefined = undefined;
  /** fire() is running the due entries (it arms for the head itself once they have run). */
  private firing = false;

  constructor(readonly delayMs: number) {
    assert(Number.isFinite(delayMs) && delayMs >= 0, 'a timer delay must be a finite ms count');
  }

  /** Whether any entry waits (tests; the runtime timer may still be armed for a cancelled one). */
  get empty(): boolean {
    return this.head === null;
  }

  /** How many entries wait: walks the list (tests and diagnostics, never a request's path). */
  get length(): number {
    let count = 0;
    for (let entry = this.head; entry !== null; entry = entry.timerNext) count++;
    return count;
  }

  /** Starts `entry`'s timer: its onTimer runs `delayMs` from now, unless cancelled first. */
  arm(entry: FifoTimerEntry): void {
    assert(entry.timerDueMs === NOT_QUEUED, 'a timer armed twice');
    entry.timerDueMs = performance.now() + this.delayMs;
    entry.timerNext = null;
    entry.timerPrev = this.tail;
    const wasEmpty = this.tail === null;
    if (wasEmpty) this.head = entry;
    else this.tail!.timerNext = entry;
    this.tail = entry;
    if (this.firing) return;
    // Armed once per head, not per entry: an entry behind the head is due no sooner than it.
    if (this.runtimeTimer === undefined)
      this.runtimeTimer = setTimeout(this.fire, Math.ceil(this.delayMs));
    else if (wasEmpty) this.runtimeTimer.ref();
  }

  /**
   * Stops `entry`'s timer; a no-op when it is not armed (fired, cancelled, never armed). The
   * runtime timer is left to fire (clearing it would cost what this class saves: the list of body
   * reads is empty between most requests): it finds nothing due and re-arms for the new head, or
   * stops.
   */
  cancel(entry: FifoTimerEntry): void {
    if (entry.timerDueMs === NOT_QUEUED) return;
    const prev = entry.timerPrev;
    const next = entry.timerNext;
    if (prev === null) this.head = next;
    else prev.timerNext = next;
    if (next === null) this.tail = prev;
    else next.timerPrev = prev;
    entry.timerPrev = null;
    entry.timerNext = null;
    entry.timerDueMs = NOT_QUEUED;
    if (this.head === null && !this.firing) this.runtimeTimer?.unref();
  }

  /**
   * The runtime timer: runs every entry now due, in order, then arms for the next head (never
   * sooner than a millisecond, Bun's timer resolution: what is due by then runs together). An entry
   * whose onTimer throws is reported, as an uncaught exception from a timer would be, and the
   * others still run.
   */
  private readonly fire = (): void => {
    // While the due entries run, an entry an onTimer arms must not start a runtime timer a whole
    // delay away, which the entries still waiting (due sooner) would wait for: `firing` keeps arm()
    // off the timer, which is armed for the head below, once they have run.
    this.firing = true;
    const nowMs = performance.now();
    let entry = this.head;
    while (entry !== null && entry.timerDueMs <= nowMs) {
      this.cancel(entry);
      try {
        entry.onTimer();
      } catch (error) {
        reportError(error);
      }
      entry = this.head;
    }
    this.firing = false;
    this.runtimeTimer =
      entry === null
        ? undefined
        : setTimeout(this.fire, Math.max(1, Math.ceil(entry.timerDueMs - nowMs)));
  };
}

/**
 * One FifoTimers per delay, shared, made on first use. The delays are the configuration's (the
 * read timeout, each provider's timeout), never a request's. Past DELAYS_MAX distinct ones (a
 * process running thousands of configurations) a delay gets a list of its own per call: correct,
 * but each such list's runtime timer stays until it would have fired, as a cleared one would not.
 */
const BY_DELAY = new Map<number, FifoTimers>();
export const DELAYS_MAX = 1024;

export function fifoTimersFor(delayMs: number): FifoTimers {
  const shared = BY_DELAY.get(delayMs);
  if (shared !== undefined) return shared;
  const timers = new FifoTimers(delayMs);
  if (BY_DELAY.size < DELAYS_MAX) BY_DELAY.set(delayMs, timers);
  return timers;
}
