// The request actor: one per accepted request; owns its state machine, AbortController and credit
// hold.

import type { Amount, RequestStatus, Service, Usage } from '../state/events.ts';
import type { StateStore } from '../state/store.ts';
import { assert } from '../util/assert.ts';
import { type ErrorCode, GatewayError } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
import { ignore, RESOLVED } from '../util/promise.ts';

export type TerminalStatus = Exclude<RequestStatus, 'in_progress'>;

/** Why an actor's AbortController fired; the run loop turns it into the terminal state. */
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

export interface Outcome {
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

export interface ActorInit {
  id: string;
  keyId: string;
  service: Service;
  model: string;
  stream: boolean;
  hold: Amount;
}

/** A timer's callback (setTimeout passes the actor and kind): no closure per request. */
export function abortOnTimer(actor: RequestActor, kind: AbortKind): void {
  actor.abort(kind);
}

const LEGAL: Record<RequestStatus, readonly RequestStatus[]> = {
  in_progress: ['completed', 'cancelled', 'error'],
  completed: [],
  cancelled: [],
  error: [],
};

export class RequestActor {
  private current: RequestStatus = 'in_progress';
  readonly controller = new AbortController();
  /**
   * Made when someone waits for the end (cancel, shutdown, a status read): most requests have
   * nobody.
   */
  private done: PromiseWithResolvers<void> | null = null;
  private over = false;
  private finishing = false;
  /** The commit that started this request (hold and binding); never rejects. */
  private startCommit: Promise<void> = RESOLVED;
  private childLogger: Logger | null = null;

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
      requestId: this.init.id,
      keyId: this.init.keyId,
      model: this.init.model,
    });
    return this.childLogger;
  }

  get id(): string {
    return this.init.id;
  }

  get status(): RequestStatus {
    return this.current;
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** Records the commit that started this request (hold and binding), once the actor exists. */
  started(durable: Promise<void>): void {
    if (durable !== RESOLVED) this.startCommit = durable.catch(ignore);
  }

  /**
   * Resolves when what is known of this request in memory is durable: its start, or once it is
   * finishing, its finish (whoever reads it from then on, even re-entrantly inside the commit,
   * waits).
   */
  get durable(): Promise<void> {
    return this.finishing ? this.settled : this.startCommit;
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

  /** The one way the state changes; terminal states are one-way. */
  transition(next: TerminalStatus): void {
    assert(
      LEGAL[this.current].includes(next),
      `illegal transition ${this.current} → ${next} for ${this.id}`,
    );
    this.current = next;
  }

  /**
   * Aborts the provider call (the only thing that closes the upstream socket). False when already
   * over.
   */
  abort(kind: AbortKind): boolean {
    if (this.current !== 'in_progress' || this.finishing || this.controller.signal.aborted)
      return false;
    this.controller.abort(new AbortReason(kind));
    return true;
  }

  /** The abort that ended the run, if one did. */
  get abortKind(): AbortKind | null {
    const reason = this.controller.signal.reason;
    return this.controller.signal.aborted && reason instanceof AbortReason ? reason.kind : null;
  }

  /**
   * Moves to the terminal state and commits it: the hold is settled (charge) or released. Called
   * exactly once, from the run loop's `finally`. Resolves with whether the finish is durable: a
   * failing log is logged, not thrown, and the caller must then not answer as if it were (§8: 503
   * instead of a 200).
   */
  async finish(outcome: Outcome): Promise<boolean> {
    assert(!this.finishing, `finish twice for ${this.id}`);
    this.finishing = true;
    this.transition(outcome.status);
    let durable = false;
    try {
      const commit = this.store.commit([
        {
          type: 'request.finished',
          request_id: this.id,
          status: outcome.status,
          error_code: outcome.error?.code ?? null,
          http_status: outcome.httpStatus,
          usage: outcome.usage,
          charge: outcome.charge,
          budget_spend_micro: outcome.budgetSpendMicro,
          answers: outcome.answers,
          at_ms: Date.now(),
        },
      ]);
      await commit;
      durable = true;
    } catch (error) {
      this.logger.error(
        { err: (error as Error).message },
        'request: could not record the terminal state',
      );
    } finally {
      this.over = true;
      this.onSettled(this, outcome);
      this.done?.resolve();
    }
    return durable;
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
      return new GatewayError('interrupted', 'The gateway shut down before the request finished.');
  }
}

export function statusForAbort(kind: AbortKind): TerminalStatus {
  return kind === 'cancelled' || kind === 'disconnected' ? 'cancelled' : 'error';
}

export type { ErrorCode };
