// RunAbort: a request's abort as a plain object, which must behave as an AbortController's signal
// does for everything RunSignal covers.

import { describe, expect, test } from 'bun:test';
import { RunAbort, type RunAbortListener, type RunSignal } from '../../src/util/abort.ts';

/** The same steps on a RunAbort and on a real AbortController, each logging what listeners did. */
function both(steps: (signal: RunSignal, abort: (reason: unknown) => void, log: string[]) => void) {
  const runLog: string[] = [];
  const run = new RunAbort();
  steps(run, (reason) => run.abort(reason), runLog);
  const domLog: string[] = [];
  const controller = new AbortController();
  steps(controller.signal, (reason) => controller.abort(reason), domLog);
  return { runLog, domLog, run, dom: controller.signal };
}

describe('RunAbort does what an AbortSignal does', () => {
  test('listeners run once, in the order added; a function and a handleEvent object alike', () => {
    const { runLog, domLog } = both((signal, abort, log) => {
      signal.addEventListener('abort', () => log.push('first'));
      signal.addEventListener('abort', { handleEvent: () => log.push('object') });
      signal.addEventListener('abort', () => log.push('last'), { once: true });
      log.push(`before ${signal.aborted}`);
      abort(new Error('stop'));
      log.push(`after ${signal.aborted}`);
      abort(new Error('again'));
    });
    expect(runLog).toEqual(['before false', 'first', 'object', 'last', 'after true']);
    expect(runLog).toEqual(domLog);
  });

  test('a listener added twice runs once; one removed or added after the abort never', () => {
    const { runLog, domLog } = both((signal, abort, log) => {
      const twice: RunAbortListener = () => log.push('twice');
      const removed: RunAbortListener = { handleEvent: () => log.push('removed') };
      signal.addEventListener('abort', twice);
      signal.addEventListener('abort', removed);
      signal.addEventListener('abort', twice);
      signal.removeEventListener('abort', removed);
      signal.removeEventListener('abort', () => log.push('never added'));
      abort('why');
      signal.addEventListener('abort', () => log.push('late'));
      signal.removeEventListener('abort', twice);
    });
    expect(runLog).toEqual(['twice']);
    expect(runLog).toEqual(domLog);
  });

  test('a listener that removes a later one in the abort: both behave alike', () => {
    const { runLog, domLog } = both((signal, abort, log) => {
      const later: RunAbortListener = () => log.push('later');
      signal.addEventListener('abort', () => {
        log.push('first');
        signal.removeEventListener('abort', later);
      });
      signal.addEventListener('abort', later);
      abort('why');
    });
    // A listener removed during the dispatch is not called.
    expect(runLog).toEqual(['first']);
    expect(runLog).toEqual(domLog);
  });

  test('the reason, and throwIfAborted throwing it once aborted', () => {
    const reason = new Error('the reason');
    const { run, dom } = both((signal, abort) => {
      expect(signal.reason).toBeUndefined();
      expect(() => signal.throwIfAborted()).not.toThrow();
      abort(reason);
    });
    for (const signal of [run, dom]) {
      expect(signal.aborted).toBe(true);
      expect(signal.reason).toBe(reason);
      expect(() => signal.throwIfAborted()).toThrow(reason);
    }
    expect(run.abort(new Error('later'))).toBe(false);
    expect(run.reason).toBe(reason);
  });
});

/**
 * A listener that throws, in a process of its own: the test runner fails any test whose code
 * reports an uncaught exception, so the reporting is watched from outside.
 */
const THROWING_LISTENER = `
import { RunAbort } from './src/util/abort.ts';
const reported = [];
process.on('uncaughtException', (error) => reported.push(error.message));
function run(signal, abort) {
  const log = [];
  signal.addEventListener('abort', () => { throw new Error('listener bug'); });
  signal.addEventListener('abort', () => log.push('second'));
  abort();
  log.push('abort returned');
  return log;
}
const own = new RunAbort();
const controller = new AbortController();
const runLog = run(own, () => own.abort('why'));
const domLog = run(controller.signal, () => controller.abort('why'));
console.log(JSON.stringify({ runLog, domLog, reported }));
`;

test('a throwing listener is reported as uncaught, as a DOM one is; the others still run', () => {
  const child = Bun.spawnSync([process.execPath, '-e', THROWING_LISTENER], {
    cwd: `${import.meta.dir}/../..`,
  });
  expect(child.exitCode).toBe(0);
  expect(JSON.parse(child.stdout.toString())).toEqual({
    runLog: ['second', 'abort returned'],
    domLog: ['second', 'abort returned'],
    reported: ['listener bug', 'listener bug'],
  });
});
