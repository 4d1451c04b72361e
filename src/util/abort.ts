// A request's abort as a plain object: the part of AbortSignal the gateway uses (aborted, reason,
// throwIfAborted, 'abort' listeners), without a DOM AbortController and its signal per request.
//
// Why: an AbortController with its signal costs ~1 µs to make (two native objects and their
// wrappers) and every read of `aborted` crosses into native code, on every request; a listener on
// it is an opaque root the collector must visit (bench/README, "Where the tail comes from"). A
// real AbortSignal has everything RunSignal asks for, so code that takes a RunSignal takes either.

/**
 * The client's connection as the gateway watches it. Bun's Request has a `signal`, but reading it
 * makes an AbortSignal, and every young collection pays for the ones made since the last: more
 * than a third of each pause (bench/README, issue 15). So the signal is read only where it is
 * needed: by a run that outlives its first few milliseconds, a wait for its binding's fsync
 * included (RequestActor.watchClient), and by a prompt counted off the event loop. A run over
 * sooner asks `gone` instead, once.
 */
export interface ClientConnection {
  readonly signal: AbortSignal;
  /** Whether the client's connection is known to be closed; never reads `signal` when served. */
  gone(): boolean;
}

/** An abort listener: a function, or an object whose handleEvent is called (no closure needed). */
export type RunAbortListener = (() => void) | { handleEvent(): void };

/** What the gateway reads of an abort signal; AbortSignal satisfies it. */
export interface RunSignal {
  readonly aborted: boolean;
  readonly reason: unknown;
  throwIfAborted(): void;
  addEventListener(type: 'abort', listener: RunAbortListener, options?: { once?: boolean }): void;
  removeEventListener(type: 'abort', listener: RunAbortListener): void;
}

/**
 * An AbortController and its signal in one object, with AbortSignal's semantics for what RunSignal
 * covers: abort happens once, listeners run synchronously in the order they were added, a listener
 * added twice runs once, one added after the abort never runs, and a listener that throws is
 * reported (as an uncaught exception, like a DOM listener's) without stopping the others.
 */
export class RunAbort implements RunSignal {
  aborted = false;
  reason: unknown = undefined;
  /**
   * Most requests have one or two (the upstream call, a stream's sink): one is kept as it is, an
   * array is made for the second.
   */
  private listeners: RunAbortListener | RunAbortListener[] | null = null;

  throwIfAborted(): void {
    if (this.aborted) throw this.reason;
  }

  addEventListener(type: 'abort', listener: RunAbortListener): void {
    if (type !== 'abort' || this.aborted) return;
    const listeners = this.listeners;
    if (listeners === null) this.listeners = listener;
    else if (!Array.isArray(listeners)) {
      if (listeners !== listener) this.listeners = [listeners, listener];
    } else if (!listeners.includes(listener)) listeners.push(listener);
  }

  removeEventListener(type: 'abort', listener: RunAbortListener): void {
    const listeners = this.listeners;
    if (type !== 'abort' || listeners === null) return;
    if (!Array.isArray(listeners)) {
      if (listeners === listener) this.listeners = null;
      return;
    }
    const at = listeners.indexOf(listener);
    if (at !== -1) listeners.splice(at, 1);
  }

  /** Aborts with `reason` and runs the listeners; false when it was aborted already. */
  abort(reason: unknown): boolean {
    if (this.aborted) return false;
    this.aborted = true;
    this.reason = reason;
    const listeners = this.listeners;
    if (listeners === null) return true;
    if (!Array.isArray(listeners)) {
      this.listeners = null;
      dispatch(listeners);
      return true;
    }
    // As the DOM dispatches: over the list as it was, skipping a listener an earlier one removed
    // (none can be added now: the signal is aborted).
    for (const listener of listeners.slice()) {
      if (listeners.includes(listener)) dispatch(listener);
    }
    this.listeners = null;
    return true;
  }
}

/** Calls one abort listener; one that throws is reported and does not stop the others. */
function dispatch(listener: RunAbortListener): void {
  try {
    if (typeof listener === 'function') listener();
    else listener.handleEvent();
  } catch (error) {
    reportError(error);
  }
}
