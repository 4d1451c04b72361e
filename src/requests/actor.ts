// The request actor: one per accepted request; owns its state machine, its abort and its credit
// hold.

import * as commands from '../state/commands.ts';
import type { Amount, Attempt, RequestStatus, Usage } from '../state/events.ts';
import type { StateStore } from '../state/store.ts';
import { type ClientConnection, RunAbort, type RunSignal } from '../util/abort.ts';
import { AssertionError } from '../util/assert.ts';
import { GatewayError, internalError } from '../util/errors.ts';
import { type FifoTimerEntry, FifoTimers, NOT_QUEUED } from '../util/fifo-timers.ts';
import type { Logger } from '../util/log.ts';
import { ignore, RESOLVED } from '../util/promise.ts';

export type TerminalStatus = Exclude<RequestStatus, 'in_progress'>;

/** Why an actor's abort fired; the run loop turns it into the terminal state. */
export type AbortKind =
  | 'cancelled'
  | 'disconnected'
  | 'upstream_timeout'
  | 'stream_timeout'
  | 'interrupted';

export class AbortReason extends Error {
  override name = 'AbortReason';
  constructor(readonly kind: AbortKind) {
    super(`request aborted: ${kind}`);
  }
}

/**
 * How a run ended: what the caller sees (`error`) and, being a `commands.Finish` itself, what is
 * committed (one object per request for both).
 */
export interface Outcome extends commands.Finish {
  status: TerminalStatus;
  /** The error the caller sees (null when completed). */
  error: GatewayError | null;
  usage: Usage | null;
  /** What the hold turns into; the rest returns to the balance. */
  charge: Amount;
  budgetSpendMicro: number;
  answers: Record<string, unknown> | null;
  httpStatus: number | null;
}

/** What a service's `work` hands back when its answer is complete: the value and the bill. */
export interface Completion<T> {
  value: T;
  usage: Usage;
  charge: Amount;
  budgetSpendMicro: number;
  /** Decision: the answers the lookup endpoint shows. */
  answers: Record<string, unknown> | null;
}

export type RunResult<T> = { ok: true; value: T } | { ok: false; error: GatewayError };

/** What differs between the services' runs; everything else about a request's life is the same. */
export interface RunPolicy {
  /** The run's time limit, and the abort it fires. */
  deadlineMs: number;
  deadlineKind: AbortKind;
  /**
   * Whether a run that failed with `error` keeps its hold (billing.on_error "keep" for the
   * provider's failures): asked only for status `error`, never for a cancel or an interrupt.
   */
  keepsHold(error: GatewayError): boolean;
}

/**
 * What an actor starts from: the placement of its hold (admission hands the same object to
 * `commands.placeHold`, not a copy of it), and whether it is bound to an Idempotency-Key.
 */
export interface ActorInit extends commands.HoldPlacement {
  /** Bound to an Idempotency-Key: the provider is not called before that binding is durable. */
  idempotent: boolean;
}

/**
 * The run's deadline (setTimeout passes the actor): no closure per request, and one argument, not
 * two (Bun keeps two or more in an array of their own per timer).
 */
function abortOnDeadline(actor: RequestActor): void {
  actor.abortAtDeadline();
}

/**
 * How long a run goes before it listens to its client's connection (RequestActor.watchClient): a
 * run that ends sooner never makes the connection's AbortSignal (it asks once, at its end, whether
 * the client is gone); a longer one notices its client gone at most this late, well within the 50
 * ms in which a disconnect must stop the provider (CONTRACT §7).
 */
export const CLIENT_WATCH_DELAY_MS = 10;

/**
 * The client watches of every run: one delay, so one list behind one runtime timer (FifoTimers),
 * not a setTimeout and a clearTimeout per request. Most runs end before theirs fires and only
 * unlink.
 */
const CLIENT_WATCHES = new FifoTimers(CLIENT_WATCH_DELAY_MS);

const LEGAL: Record<RequestStatus, readonly RequestStatus[]> = {
  in_progress: ['completed', 'cancelled', 'error'],
  completed: [],
  cancelled: [],
  error: [],
};

export class RequestActor implements FifoTimerEntry {
  private current: RequestStatus = 'in_progress';
  /**
   * The run's abort, and the signal the work and the provider listen to: a plain object, not an
   * AbortController (util/abort.ts: ~1 µs less per request).
   */
  private readonly aborts = new RunAbort();
  /** The deployments tried so far (the router adds to it; the finish records it). */
  readonly attempts: Attempt[] = [];
  /**
   * Made when someone waits for the end (cancel, shutdown, a status read): most requests have
   * nobody.
   */
  private done: PromiseWithResolvers<void> | null = null;
  private over = false;
  private finishing = false;
  /** The commit that started this request (hold and binding), as the store returned it. */
  private startCommit: Promise<void> = RESOLVED;
  /** The same, for readers that only wait for it (never rejects). */
  private startSettled: Promise<void> = RESOLVED;
  private childLogger: Logger | null = null;
  /** The abort the run's deadline fires (its policy's), set when the run starts its timer. */
  private deadlineKind: AbortKind = 'upstream_timeout';
  /**
   * The run's deadline timer, armed at its start, or when it has a client to watch, once the watch
   * has fired (CLIENT_WATCHES).
   */
  private timer: ReturnType<typeof setTimeout> | undefined = undefined;
  /** The actor's link in CLIENT_WATCHES (FifoTimerEntry). */
  timerPrev: FifoTimerEntry | null = null;
  timerNext: FifoTimerEntry | null = null;
  timerDueMs = NOT_QUEUED;
  /**
   * What is left of the run's time limit when the client watch fires; -1 before the deadline
   * starts (a watch that fires while the run waits for its binding only listens).
   */
  private deadlineRestMs = -1;
  /** The client's connection, until the run starts watching it (watchClient). */
  private client: ClientConnection | null = null;

  constructor(
    readonly init: ActorInit,
    private readonly store: StateStore,
    private readonly onSettled: (actor: RequestActor, outcome: Outcome) => void,
    private readonly rootLogger: Logger,
  ) {}

  /**
   * A logger bound to this request; made on first use, since most requests never log (a pino child
   * costs µs).
   */
  get logger(): Logger {
    this.childLogger ??= this.rootLogger.child({
      requestId: this.init.requestId,
      keyId: this.init.keyId,
      model: this.init.model,
    });
    return this.childLogger;
  }

  get id(): string {
    return this.init.requestId;
  }

  get status(): RequestStatus {
    return this.current;
  }

  get signal(): RunSignal {
    return this.aborts;
  }

  /** Records the commit that started this request (hold and binding), once the actor exists. */
  started(durable: Promise<void>): void {
    if (durable === RESOLVED) return;
    this.startCommit = durable;
    // A rejection is the run's to handle (it ends the request); this copy only keeps readers from
    // seeing it, and the promise from being reported unhandled when no run awaits it.
    this.startSettled = durable.catch(ignore);
  }

  /**
   * Resolves when the start is durable, or rejects with the store's 503: what a stream must wait
   * for before its first byte reaches the client.
   */
  get startDurable(): Promise<void> {
    return this.startCommit;
  }

  /**
   * Resolves when what is known of this request in memory is durable: its start, or once it is
   * finishing, its finish (whoever reads it from then on, even re-entrantly inside the commit,
   * waits).
   */
  get durable(): Promise<void> {
    return this.finishing ? this.settled : this.startSettled;
  }

  /** Resolves once the terminal state is durable (the hold settled or released). */
  get settled(): Promise<void> {
    if (this.over) return RESOLVED;
    this.done ??= Promise.withResolvers<void>();
    return this.done.promise;
  }

  /**
   * An event listener (request.signal's abort): the client went away. An object, so no closure per
   * request.
   */
  handleEvent(): void {
    this.abort('disconnected');
  }

  /**
   * Cancels this request when the client's connection goes away: its signal is listened to from
   * CLIENT_WATCH_DELAY_MS into the run (a client that left earlier is seen then, as gone already),
   * counted from the start of the wait for a run that first waits for its binding to be durable
   * (a slow disk's). A run over sooner (most runs through a fast provider) never reads the signal:
   * it asks the connection once, at its end, whether the client is gone (see ClientConnection).
   */
  watchClient(client: ClientConnection): void {
    this.client = client;
  }

  /**
   * The client watch fired (CLIENT_WATCHES): listens to the client, and times the rest of the run
   * once its deadline has started.
   */
  onTimer(): void {
    if (this.deadlineRestMs >= 0)
      this.timer = setTimeout(abortOnDeadline, this.deadlineRestMs, this);
    this.listenToClient();
  }

  /**
   * The actor listens itself (handleEvent), so no closure per request; never removed: once the
   * actor is over, abort() is a no-op, and both die with the request.
   */
  private listenToClient(): void {
    const client = this.client;
    if (client === null) return;
    this.client = null;
    const signal = client.signal;
    signal.addEventListener('abort', this);
    if (signal.aborted) this.abort('disconnected');
  }

  /**
   * The run is over before its client watch fired: a client gone meanwhile cancels it all the same,
   * as the watch would have (the outcome reads the abort).
   */
  private askClientGone(): void {
    const client = this.client;
    if (client === null) return;
    this.client = null;
    if (client.gone()) this.abort('disconnected');
  }

  /**
   * Starts the run's deadline, through the client watch when there is a client (armed now, or
   * through the wait for the binding, when it fires sooner than its delay from now), else at once.
   */
  private startTimer(deadlineMs: number): void {
    if (this.client !== null && deadlineMs > CLIENT_WATCH_DELAY_MS) {
      if (this.timerDueMs === NOT_QUEUED) {
        this.deadlineRestMs = deadlineMs - CLIENT_WATCH_DELAY_MS;
        CLIENT_WATCHES.arm(this);
      } else {
        // The deadline counts from now, not from the watch's start: the wait for the disk was the
        // gateway's. Rounded up: setTimeout truncates its delay to whole ms (toInt32), so a rest
        // with a fraction would fire up to 1 ms early.
        this.deadlineRestMs = Math.ceil(
          deadlineMs - Math.max(0, this.timerDueMs - performance.now()),
        );
      }
      return;
    }
    CLIENT_WATCHES.cancel(this);
    this.listenToClient();
    this.timer = setTimeout(abortOnDeadline, deadlineMs, this);
  }

  /** The one way the state changes; terminal states are one-way. */
  transition(next: TerminalStatus): void {
    // The message is built only on failure: this runs for every request.
    if (!LEGAL[this.current].includes(next))
      throw new AssertionError(`illegal transition ${this.current} → ${next} for ${this.id}`);
    this.current = next;
  }

  /**
   * Aborts the provider call (the only thing that closes the upstream socket). False when already
   * over.
   */
  abort(kind: AbortKind): boolean {
    if (this.current !== 'in_progress' || this.finishing || this.aborts.aborted) return false;
    return this.aborts.abort(new AbortReason(kind));
  }

  /** The run's time limit passed (its timer's callback). */
  abortAtDeadline(): void {
    this.abort(this.deadlineKind);
  }

  /** The abort that ended the run, if one did. */
  get abortKind(): AbortKind | null {
    const reason = this.aborts.reason;
    return this.aborts.aborted && reason instanceof AbortReason ? reason.kind : null;
  }

  /**
   * Runs `work` (the service's part: turn the provider's deltas into its answer) as this request's
   * whole life: the time limit, the abort reasons mapped to a terminal state, and the finish, which
   * settles or releases the hold whatever happened. Resolves with what the caller gets, once the
   * end is durable. `work` is called with `context` and this actor: a service passes a module
   * function and its inputs, not a closure made per request.
   */
  async run<T, C>(
    work: (context: C, actor: RequestActor) => Promise<Completion<T>>,
    context: C,
    policy: RunPolicy,
  ): Promise<RunResult<T>> {
    let outcome: Outcome;
    let value: T | undefined;
    try {
      // A request with an Idempotency-Key must not reach the provider before its binding is
      // durable; any other start overlaps the provider call (a stream's work waits for it before
      // its first byte; a plain call's answer waits for its finish, which the log writes after the
      // start). The deadline starts after that wait: a slow disk is the gateway's, never a
      // provider timeout billed to the key.
      if (this.init.idempotent) {
        // Its wait for the fsync may be long (a slow disk): the client watch runs through it, so
        // a client gone meanwhile is heard within CLIENT_WATCH_DELAY_MS, and a quick disk still
        // makes no signal.
        if (this.client !== null) CLIENT_WATCHES.arm(this);
        await this.startCommit;
        // Gone, cancelled or shut down meanwhile: the work (the provider's call) never starts.
        this.aborts.throwIfAborted();
      }
      this.deadlineKind = policy.deadlineKind;
      this.startTimer(policy.deadlineMs);
      const done = await work(context, this);
      this.askClientGone();
      // An abort that came while the work was finishing wins: the caller has gone or asked to stop.
      if (this.aborts.aborted) throw this.aborts.reason;
      value = done.value;
      outcome = {
        status: 'completed',
        error: null,
        errorCode: null,
        usage: done.usage,
        charge: done.charge,
        budgetSpendMicro: done.budgetSpendMicro,
        answers: done.answers,
        httpStatus: 200,
        attempts: this.attempts,
        atMs: 0,
      };
    } catch (thrown) {
      this.askClientGone();
      outcome = this.failure(thrown, policy);
    } finally {
      CLIENT_WATCHES.cancel(this);
      if (this.timer !== undefined) clearTimeout(this.timer);
    }
    // The finish, here rather than in an async method of its own (a generator, a promise and a
    // scope per request): the hold is settled (charge) or released whatever happened. A failing
    // log is logged, not thrown, and the caller must then not answer as if the end were durable
    // (§8: 503 instead of a 200); a broken invariant in beginFinish is thrown.
    this.beginFinish(outcome);
    let durable = false;
    try {
      await this.commitFinish(outcome);
      durable = true;
    } catch (error) {
      this.logger.error(
        { err: (error as Error).message },
        'request: could not record the terminal state',
      );
    } finally {
      this.endFinish(outcome);
    }
    if (!durable) return { ok: false, error: notRecordedError() };
    return outcome.error === null
      ? { ok: true, value: value as T }
      : { ok: false, error: outcome.error };
  }

  /** The outcome of a run that threw: the abort's reason first, then the error, else a bug. */
  private failure(thrown: unknown, policy: RunPolicy): Outcome {
    const kind = this.abortKind;
    let error: GatewayError;
    if (kind !== null) error = abortError(kind);
    else if (thrown instanceof GatewayError) error = thrown;
    else {
      this.logger.error(
        { err: (thrown as Error)?.stack ?? String(thrown) },
        `${this.init.service}: run failed`,
      );
      error = internalError();
    }
    const status = kind !== null ? statusForAbort(kind) : 'error';
    // The gateway's own failures (an interrupt, a 503, a bug) never keep a hold; the service
    // decides for the provider's.
    const keep = status === 'error' && kind !== 'interrupted' && policy.keepsHold(error);
    return {
      status,
      error,
      errorCode: kind === 'interrupted' ? 'interrupted' : error.code,
      usage: null,
      charge: { credits_micro: keep ? this.init.hold.credits_micro : 0, tokens: 0 },
      budgetSpendMicro: 0,
      answers: null,
      httpStatus: error.status,
      attempts: this.attempts,
      atMs: 0,
    };
  }

  /** Moves to the terminal state; exactly once, by `run`. */
  private beginFinish(outcome: Outcome): void {
    if (this.finishing) throw new AssertionError(`finish twice for ${this.id}`);
    this.finishing = true;
    this.transition(outcome.status);
  }

  /**
   * Commits the terminal state: the hold is settled (charge) or released. Resolves when durable;
   * throws or rejects when the log cannot make it so.
   */
  private commitFinish(outcome: Outcome): Promise<void> {
    // Timed as the commit is made, as before the outcome doubled as the finish.
    outcome.atMs = Date.now();
    return commands.finish(this.store, this.id, outcome);
  }

  /** The end is durable, or will never be: the request is over for everyone waiting on it. */
  private endFinish(outcome: Outcome): void {
    this.over = true;
    this.onSettled(this, outcome);
    this.done?.resolve();
  }
}

/** What a caller gets instead of its answer when the request's end could not be made durable. */
export function notRecordedError(): GatewayError {
  return new GatewayError(
    'service_unavailable',
    'The gateway could not record the end of this request; retry later.',
  );
}

/** The error a caller sees for an abort of `kind`. */
export function abortError(kind: AbortKind): GatewayError {
  switch (kind) {
    case 'cancelled':
      return new GatewayError('request_cancelled', 'The request was cancelled.');
    case 'disconnected':
      return new GatewayError(
        'request_cancelled',
        'The client went away; the request was cancelled.',
      );
    case 'upstream_timeout':
      return new GatewayError('upstream_timeout', 'The provider did not answer in time.');
    case 'stream_timeout':
      return new GatewayError('stream_timeout', 'The stream ran past its time limit.');
    case 'interrupted':
      // The client's code is the table's for a gateway that is stopping (CONTRACT §2, §8); the
      // record keeps `interrupted`, as recovery writes it for a crash (see failure).
      return new GatewayError(
        'service_unavailable',
        'The gateway shut down before the request finished; retry shortly.',
      );
  }
}

export function statusForAbort(kind: AbortKind): TerminalStatus {
  return kind === 'cancelled' || kind === 'disconnected' ? 'cancelled' : 'error';
}
