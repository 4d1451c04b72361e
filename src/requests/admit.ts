// Admission, the same for both services: idempotency → rate → the service's own checks (context,
// budget, quota) in the contract's order → a fair in-flight slot → the hold, and the actor that
// owns the request from then on.
import type { Config } from '../config/model.ts';
import { checkIdempotency } from '../idempotency/store.ts';
import type { KeyAccount } from '../state/apply.ts';
import { placeHold } from '../state/commands.ts';
import type { Amount, RequestStatus, Service } from '../state/events.ts';
import type { StateStore } from '../state/store.ts';
import type { ClientConnection } from '../util/abort.ts';
import { GatewayError } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
import { type ActorInit, type Outcome, RequestActor } from './actor.ts';
import type { ActorRegistry } from './registry.ts';

/** What admission uses of the gateway (the Gateway satisfies it). */
export interface AdmitContext {
  config: Config;
  store: StateStore;
  registry: ActorRegistry;
  rateLimiter: { take(keyId: string, rpm: number, nowMs: number): void };
  metrics: {
    requestFinished(
      service: Service,
      status: RequestStatus,
      code: string | null,
      chargedMicro: number,
    ): void;
  };
  logger: Logger;
  /** Shutdown began: nothing new is admitted (a body that finished arriving after it, too). */
  readonly draining: boolean;
}

/** What a request holds while it runs. */
export interface Reservation {
  hold: Amount;
  /** Decision only: the credits-equivalent reserved against the key's daily budget. */
  budgetHoldMicro: number;
}

export interface AdmitCommand {
  service: Service;
  requestId: string;
  account: KeyAccount;
  /** The model name the request's record shows. */
  model: string;
  stream: boolean;
  idempotency: { key: string; fingerprint: string } | null;
  /** The client's connection: its going away cancels the request (`disconnected`). */
  client: ClientConnection | null;
  /**
   * The service's checks after the rate limit, in the contract's order; throws its refusal or
   * returns what to hold.
   */
  reserve(account: KeyAccount, nowMs: number): Reservation;
}

export interface Admission {
  actor: RequestActor;
  createdMs: number;
  createdS: number;
}

/**
 * Admits a request or throws its refusal. Synchronous from the first check to the hold, so two
 * identical requests can never both pass; a refusal writes nothing (CONTRACT §8).
 */
export function admit(ctx: AdmitContext, command: AdmitCommand): Admission {
  const { config, store, registry } = ctx;
  const { account, idempotency, service, requestId } = command;
  // The intake refused while draining already, but a body can finish arriving after shutdown began
  // (even after the log was closed): checked again here, synchronously with the hold.
  if (ctx.draining) {
    throw new GatewayError('service_unavailable', 'The gateway is shutting down; retry shortly.');
  }
  const nowMs = Date.now();
  if (idempotency) {
    checkIdempotency(
      store.state,
      registry,
      service,
      account.id,
      idempotency.key,
      idempotency.fingerprint,
      nowMs,
      (id) => statusUrl(config, service, id),
    );
  }
  ctx.rateLimiter.take(
    account.id,
    account.rateLimitRpm ?? config.limits.default_rate_limit_rpm,
    nowMs,
  );
  const { hold, budgetHoldMicro } = command.reserve(account, nowMs);
  if (!registry.admits(account.id)) {
    throw new GatewayError(
      'service_unavailable',
      "The gateway is at its limit of requests in flight for this key's share; retry shortly.",
    );
  }
  // The placement of the hold is the actor's init as well: one object for both.
  const init: ActorInit = {
    requestId,
    keyId: account.id,
    service,
    model: command.model,
    stream: command.stream,
    hold,
    budgetHoldMicro,
    idempotency: idempotency
      ? { ...idempotency, expiresAtMs: nowMs + config.idempotency_ttl_s * 1000 }
      : null,
    atMs: nowMs,
    idempotent: idempotency !== null,
  };
  const durable = placeHold(store, init);
  const actor = new RequestActor(init, store, settledBy(ctx), ctx.logger);
  actor.started(durable);
  registry.add(actor);
  if (command.client) actor.watchClient(command.client);
  return { actor, createdMs: nowMs, createdS: Math.floor(nowMs / 1000) };
}

/** One callback per context, not per request: the actor leaves the registry and is counted. */
const settledCallbacks = new WeakMap<
  AdmitContext,
  (actor: RequestActor, outcome: Outcome) => void
>();

function settledBy(ctx: AdmitContext): (actor: RequestActor, outcome: Outcome) => void {
  let callback = settledCallbacks.get(ctx);
  if (!callback) {
    callback = (actor, outcome) => {
      ctx.registry.remove(actor);
      ctx.metrics.requestFinished(
        actor.init.service,
        outcome.status,
        // The record's code: a shutdown's interrupt is `interrupted` here, not the 503 its client
        // was told (a rolling restart must not look like a failing log).
        outcome.errorCode,
        outcome.charge.credits_micro,
      );
    };
    settledCallbacks.set(ctx, callback);
  }
  return callback;
}

/** The status endpoint of a request: a path, or an absolute URL when public_base_url is set. */
export function statusUrl(config: Config, service: Service, requestId: string): string {
  const path =
    service === 'chat' ? `/api/v1/requests/${requestId}` : `/decision/v1/requests/${requestId}/`;
  return config.public_base_url ? config.public_base_url.replace(/\/+$/, '') + path : path;
}
