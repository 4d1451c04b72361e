// Shared promise values for hot paths, one of each: identity checks against RESOLVED only work if
// every module hands around the same object.

/** An already-settled promise: "nothing to wait for", without a new promise per request. */
export const RESOLVED: Promise<void> = Promise.resolve();

/**
 * A rejection handler that drops the error: for promises whose failure is handled where they are
 * awaited.
 */
export function ignore(): void {}

/** Resolves on the event loop's next turn: long work gives other requests their turn by it. */
export function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}
