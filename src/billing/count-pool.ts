// A worker thread for CPU-heavy request work (token counts, fingerprints), with a fair, bounded
// queue per API key.
import type { RunSignal } from '../util/abort.ts';
import { GatewayError } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';

/**
 * How long the worker runs one job before it reports back and the pool hands the thread to the next
 * key. A job pauses only between its steps (a 16 KB segment of text, a parse, a fingerprint), so a
 * slice may run over by one step (≤ ~65 ms of counting measured; a 4 MB parse or fingerprint ≤ ~250
 * ms).
 */
export const SLICE_MS = 10;

/**
 * Messages from the pool to the worker: start a job (and run a slice), run another slice, or forget
 * it.
 */
export type ToWorker<Job> =
  | { id: number; job: Job }
  | { id: number; resume: true }
  | { id: number; drop: true };
/** The worker's answer to a slice: still going, or done with the result. */
export type FromWorker<Result> =
  | { id: number; done: false }
  | { id: number; done: true; result: Result };

/**
 * The worker's side: runs each job as a generator (each `yield` is a point where it may pause) for
 * up to SLICE_MS per message, keeping paused jobs until they are resumed or dropped.
 */
export function serveSlices<Job, Result>(run: (job: Job) => Generator<void, Result>): void {
  const paused = new Map<number, Generator<void, Result>>();
  // Inside a worker the global scope is the worker's side of the channel.
  (globalThis as unknown as Worker).onmessage = (event: MessageEvent<ToWorker<Job>>) => {
    const message = event.data;
    if ('drop' in message) {
      paused.delete(message.id);
      return;
    }
    const steps = 'job' in message ? run(message.job) : paused.get(message.id);
    // The pool only resumes what it started and has not dropped.
    if (!steps) throw new Error(`count worker: no paused job ${message.id}`);
    const deadline = performance.now() + SLICE_MS;
    for (;;) {
      const step = steps.next();
      if (step.done) {
        paused.delete(message.id);
        postMessage({
          id: message.id,
          done: true,
          result: step.value,
        } satisfies FromWorker<Result>);
        return;
      }
      if (performance.now() >= deadline) {
        paused.set(message.id, steps);
        postMessage({ id: message.id, done: false } satisfies FromWorker<Result>);
        return;
      }
    }
  };
}

export interface CountPoolOptions {
  /** The worker's entry: a module that calls serveSlices. */
  workerUrl: string | URL;
  /** Jobs waiting or running, all keys together; past it 503 service_unavailable. */
  jobsMax: number;
  /** Jobs waiting or running for one API key; past it 429 rate_limit_exceeded. */
  keyJobsMax: number;
  /**
   * A slice the worker has not answered within this is a stuck worker: it is ended and restarted.
   */
  sliceDeadlineMs: number;
}

/**
 * Who asked for a job: its key (the unit of fairness), its client (gone: the job is dropped) and
 * where to log.
 */
export interface JobOwner {
  keyId: string;
  signal: RunSignal | null;
  logger: Logger;
}

interface Entry<Job, Result> {
  id: number;
  job: Job;
  owner: JobOwner;
  /**
   * The worker holds this job's paused state (it has run at least one slice in the current worker).
   */
  started: boolean;
  /** A request already admitted (its answer's tokens): never refused or given up for room. */
  admitted: boolean;
  settled: boolean;
  resolve(result: Result): void;
  reject(error: GatewayError): void;
  onAbort: (() => void) | null;
}

/**
 * One worker thread (this host has 2 cores: one for the event loop, one for this) serving jobs in
 * slices of time. Each key has its own FIFO and keys take turns, one slice each, so one key's
 * queued jobs delay another key's job by one slice per turn, never by whole jobs. Bounded per key
 * and overall; a job whose client has gone is dropped; a worker that crashes or hangs is replaced,
 * and only the job it was running fails (503): the others start again from their inputs in the new
 * worker.
 */
export class CountPool<Job, Result> {
  private readonly queues = new Map<string, Array<Entry<Job, Result>>>();
  /** Keys with queued jobs, in the order they get their next slice. */
  private readonly turns: string[] = [];
  private jobs = 0;
  private jobsAcceptedTotal = 0;
  private nextId = 1;
  private worker: Worker | null = null;
  /** The entry whose slice the worker is running; at most one at a time. */
  private running: Entry<Job, Result> | null = null;
  private watchdog: ReturnType<typeof setTimeout> | undefined;
  private readonly onMessage = (event: MessageEvent<FromWorker<Result>>): void =>
    this.answered(event.data);

  constructor(private readonly options: CountPoolOptions) {}

  /** Jobs waiting or running (for tests and metrics). */
  get size(): number {
    return this.jobs;
  }

  /** Jobs ever accepted (for tests and metrics: a request refused before counting adds none). */
  get jobsAccepted(): number {
    return this.jobsAcceptedTotal;
  }

  /**
   * Queues `job` for `owner`; refuses at once (429, 503, 499) when it cannot be queued. At the
   * overall bound the key holding the most jobs gives up its newest (429 for it) rather than a key
   * under its share being refused: one key cannot take the counter from another. An `admitted` job
   * (the tokens of an answer already served; bounded by the requests in flight) is never refused
   * for room.
   */
  run(job: Job, owner: JobOwner, admitted = false): Promise<Result> {
    if (owner.signal?.aborted) return Promise.reject(cancelled());
    let queue = this.queues.get(owner.keyId);
    if (!admitted) {
      if (queue && queue.length >= this.options.keyJobsMax)
        return Promise.reject(keyBusy(queue.length));
      if (this.jobs >= this.options.jobsMax && !this.giveUpHeaviest(queue?.length ?? 0)) {
        return Promise.reject(
          new GatewayError(
            'service_unavailable',
            'The gateway is counting as many large requests as it can; retry shortly.',
          ),
        );
      }
    }
    const { promise, resolve, reject } = Promise.withResolvers<Result>();
    const entry: Entry<Job, Result> = {
      id: this.nextId++,
      job,
      owner,
      started: false,
      admitted,
      settled: false,
      resolve,
      reject,
      onAbort: null,
    };
    if (!queue) {
      queue = [];
      this.queues.set(owner.keyId, queue);
      this.turns.push(owner.keyId);
    }
    queue.push(entry);
    this.jobs++;
    this.jobsAcceptedTotal++;
    if (owner.signal) {
      const onAbort = () => this.cancel(entry);
      entry.onAbort = onAbort;
      owner.signal.addEventListener('abort', onAbort, { once: true });
    }
    this.pump();
    return promise;
  }

  /**
   * Makes room for a key holding `ownJobs` jobs: the key holding the most gives up its newest job
   * not admitted nor running (429: that key's own load), if it holds more than the asking key
   * would. False when no key holds more (then the asker is refused).
   */
  private giveUpHeaviest(ownJobs: number): boolean {
    let victim: Entry<Job, Result> | null = null;
    let heaviest = ownJobs + 1;
    for (const queue of this.queues.values()) {
      if (queue.length <= heaviest) continue;
      for (let i = queue.length - 1; i >= 0; i--) {
        const entry = queue[i]!;
        if (entry.admitted || entry === this.running || entry.settled) continue;
        victim = entry;
        heaviest = queue.length;
        break;
      }
    }
    if (victim === null) return false;
    victim.owner.logger.warn(
      { keyId: victim.owner.keyId },
      'count pool: full; the key holding the most jobs gives up its newest',
    );
    this.settle(victim, keyBusy(heaviest), null);
    this.remove(victim);
    if (!this.queues.has(victim.owner.keyId)) {
      const turn = this.turns.indexOf(victim.owner.keyId);
      if (turn >= 0) this.turns.splice(turn, 1);
    }
    if (victim.started)
      this.worker?.postMessage({ id: victim.id, drop: true } satisfies ToWorker<Job>);
    return true;
  }

  /** Ends the worker (tests; a process exits without it, the worker is unref'd). */
  close(): void {
    const worker = this.worker;
    this.worker = null;
    clearTimeout(this.watchdog);
    worker?.terminate();
  }

  /** Gives the worker its next slice: the head job of the key whose turn it is. */
  private pump(): void {
    if (this.running !== null) return;
    const keyId = this.turns.shift();
    if (keyId === undefined) return;
    const entry = this.queues.get(keyId)![0]!;
    const worker = this.worker ?? this.startWorker();
    this.running = entry;
    worker.postMessage(
      entry.started
        ? ({ id: entry.id, resume: true } satisfies ToWorker<Job>)
        : ({ id: entry.id, job: entry.job } satisfies ToWorker<Job>),
    );
    entry.started = true;
    this.watchdog = setTimeout(this.stuck, this.options.sliceDeadlineMs);
    // A shutdown need not wait for it: the requests whose jobs these are keep the process alive
    // themselves.
    this.watchdog.unref();
  }

  private readonly stuck = (): void => {
    const entry = this.running;
    entry?.owner.logger.error(
      { sliceDeadlineMs: this.options.sliceDeadlineMs },
      'count worker: a slice did not finish in time; restarting the worker',
    );
    this.crashed(this.worker, 'stuck');
  };

  private answered(message: FromWorker<Result>): void {
    const entry = this.running;
    // A late answer from a worker already replaced, or for a job already failed, is nothing to act
    // on.
    if (entry === null || entry.id !== message.id) return;
    clearTimeout(this.watchdog);
    this.running = null;
    if (message.done) {
      this.remove(entry);
      if (!entry.settled) this.settle(entry, null, message.result);
    } else if (entry.settled) {
      // Its client left during the slice: it leaves the queue, and the worker forgets its paused
      // state.
      this.remove(entry);
      this.worker?.postMessage({ id: entry.id, drop: true } satisfies ToWorker<Job>);
    }
    // The key had its turn; with more to do it goes to the back of the line.
    if (this.queues.has(entry.owner.keyId)) this.turns.push(entry.owner.keyId);
    this.pump();
  }

  private startWorker(): Worker {
    const worker = new Worker(this.options.workerUrl);
    // The worker must never keep the process alive on its own.
    worker.unref();
    worker.addEventListener('message', this.onMessage);
    worker.addEventListener('error', (event) => {
      this.running?.owner.logger.error(
        { err: (event as ErrorEvent).message },
        'count worker: uncaught error',
      );
      this.crashed(worker, 'error');
    });
    worker.addEventListener('close', () => this.crashed(worker, 'exit'));
    this.worker = worker;
    return worker;
  }

  /**
   * The worker died (an uncaught error, an exit) or hung. The job it was running fails with 503,
   * since running it again could kill the next worker too; every other job keeps its place and
   * starts over from its inputs in a new worker, so the queue never wedges.
   */
  private crashed(worker: Worker | null, why: 'error' | 'exit' | 'stuck'): void {
    if (worker === null || worker !== this.worker) return;
    this.worker = null;
    clearTimeout(this.watchdog);
    worker.removeEventListener('message', this.onMessage);
    if (why !== 'exit') worker.terminate();
    for (const queue of this.queues.values()) for (const entry of queue) entry.started = false;
    const entry = this.running;
    this.running = null;
    if (entry !== null) {
      entry.owner.logger.error(
        { why },
        'count worker: lost while running a job; the job fails with 503',
      );
      this.remove(entry);
      if (this.queues.has(entry.owner.keyId)) this.turns.push(entry.owner.keyId);
      if (!entry.settled)
        this.settle(
          entry,
          new GatewayError(
            'service_unavailable',
            'The gateway could not count this request; retry shortly.',
          ),
          null,
        );
    }
    this.pump();
  }

  /**
   * The client went away: the job leaves the queue now (a running slice is dropped when it
   * answers).
   */
  private cancel(entry: Entry<Job, Result>): void {
    if (entry.settled) return;
    this.settle(entry, cancelled(), null);
    if (entry === this.running) return;
    const wasQueued = this.remove(entry);
    if (!wasQueued) return;
    if (!this.queues.has(entry.owner.keyId)) {
      const turn = this.turns.indexOf(entry.owner.keyId);
      if (turn >= 0) this.turns.splice(turn, 1);
    }
    if (entry.started)
      this.worker?.postMessage({ id: entry.id, drop: true } satisfies ToWorker<Job>);
  }

  /** Takes `entry` out of its key's queue; false when it was not there. */
  private remove(entry: Entry<Job, Result>): boolean {
    const queue = this.queues.get(entry.owner.keyId);
    const index = queue ? queue.indexOf(entry) : -1;
    if (index < 0) return false;
    queue!.splice(index, 1);
    this.jobs--;
    if (queue!.length === 0) this.queues.delete(entry.owner.keyId);
    return true;
  }

  private settle(
    entry: Entry<Job, Result>,
    error: GatewayError | null,
    result: Result | null,
  ): void {
    entry.settled = true;
    if (entry.onAbort) entry.owner.signal!.removeEventListener('abort', entry.onAbort);
    if (error) entry.reject(error);
    else entry.resolve(result as Result);
  }
}

function keyBusy(jobs: number): GatewayError {
  return new GatewayError(
    'rate_limit_exceeded',
    `This API key already has ${jobs} large requests waiting to be counted; retry after 1 s.`,
    {
      headers: { 'retry-after': '1' },
    },
  );
}

function cancelled(): GatewayError {
  return new GatewayError(
    'request_cancelled',
    'The client went away before its request was counted.',
  );
}
