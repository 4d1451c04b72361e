// Verbs → events: the only module that builds an event and decides when it is logged. Services
// call these verbs, never the store.
import type { Amount, Attempt, RequestFinished, RequestStarted, Service, Usage } from './events.ts';
import type { StateStore } from './store.ts';

export interface HoldPlacement {
  requestId: string;
  keyId: string;
  service: Service;
  model: string;
  stream: boolean;
  hold: Amount;
  /** Decision only: the credits-equivalent reserved against the key's daily budget. */
  budgetHoldMicro: number;
  idempotency: { key: string; fingerprint: string; expiresAtMs: number } | null;
  atMs: number;
}

/**
 * Places a request's hold and binds its Idempotency-Key, in one event applied at once (the next
 * admission sees it); resolves when it is durable, and rejects with the store's 503 if it cannot
 * be.
 *
 * Every start is logged, overlapping the provider call. A stream's and a keyed call's are
 * written at once: they wait for it before their first byte or their provider call. A plain call
 * (non-stream, no Idempotency-Key) waits for nobody's: its start goes with the next write, within
 * START_WRITE_DELAY_MS at the latest, so a provider that answers sooner has start and finish
 * share one fsync. (Until stop 32 such a start was logged only with its finish; but the live list
 * names the call while it runs, and a crash then lost a request that had reached the provider: no
 * error/interrupted record, CONTRACT §3, no count in the usage. Now a crash loses at most a call
 * admitted in the last few ms, whose client has been told nothing, as one whose start's fsync
 * was still running.)
 */
export function placeHold(store: StateStore, placement: HoldPlacement): Promise<void> {
  const { idempotency } = placement;
  const started: RequestStarted = {
    type: 'request.started',
    request_id: placement.requestId,
    key_id: placement.keyId,
    service: placement.service,
    model: placement.model,
    stream: placement.stream,
    hold: placement.hold,
    idempotency: idempotency
      ? {
          key: idempotency.key,
          fingerprint: idempotency.fingerprint,
          expires_at_ms: idempotency.expiresAtMs,
        }
      : null,
    budget_hold_micro: placement.budgetHoldMicro,
    at_ms: placement.atMs,
  };
  if (placement.stream || idempotency) return store.commit([started]);
  return store.commit([started], START_WRITE_DELAY_MS);
}

/** How long a plain call's start may wait for another write to take it (see placeHold). */
const START_WRITE_DELAY_MS = 2;

export interface Finish {
  status: RequestFinished['status'];
  errorCode: string | null;
  httpStatus: number | null;
  usage: Usage | null;
  /** What the hold turns into; the rest returns to the balance. */
  charge: Amount;
  budgetSpendMicro: number;
  answers: Record<string, unknown> | null;
  /** The deployments tried (none when no provider was called). */
  attempts?: readonly Attempt[];
  atMs: number;
}

/** Ends a request: its hold is settled (the charge) or released; resolves when durable. */
export function finish(store: StateStore, requestId: string, end: Finish): Promise<void> {
  return store.commit([finishedEvent(requestId, end)]);
}

/**
 * Ends every request a previous run left in flight: a crash is none of cancel, completion or a
 * provider's error, so each hold is released and the request reads `error`/`interrupted`.
 */
export function finishInterrupted(store: StateStore, ids: string[], atMs: number): Promise<void> {
  const end: Finish = {
    status: 'error',
    errorCode: 'interrupted',
    httpStatus: null,
    usage: null,
    charge: { credits_micro: 0, tokens: 0 },
    budgetSpendMicro: 0,
    answers: null,
    atMs,
  };
  return store.commit(ids.map((id) => finishedEvent(id, end)));
}

function finishedEvent(requestId: string, end: Finish): RequestFinished {
  return {
    type: 'request.finished',
    request_id: requestId,
    status: end.status,
    error_code: end.errorCode,
    http_status: end.httpStatus,
    usage: end.usage,
    charge: end.charge,
    budget_spend_micro: end.budgetSpendMicro,
    answers: end.answers,
    // Left undefined when there are none: JSON.stringify then writes no field, as the record was
    // without one before (the schema's Optional checks undefined as absent), and no second object
    // is spread into this one.
    attempts:
      end.attempts !== undefined && end.attempts.length > 0
        ? (end.attempts as Attempt[])
        : undefined,
    at_ms: end.atMs,
  };
}

export interface NewKey {
  keyId: string;
  name: string;
  secretSha256: string;
  services: Service[];
  creditsMicro: number;
  tokenWallet: number;
  dailyDecisionBudgetMicro: number | null;
  rateLimitRpm: number | null;
  atMs: number;
}

export function addKey(store: StateStore, key: NewKey): Promise<void> {
  return store.commit([
    {
      type: 'key.created',
      key_id: key.keyId,
      name: key.name,
      secret_sha256: key.secretSha256,
      services: key.services,
      credits_micro: key.creditsMicro,
      token_wallet: key.tokenWallet,
      daily_decision_budget_micro: key.dailyDecisionBudgetMicro,
      rate_limit_rpm: key.rateLimitRpm,
      at_ms: key.atMs,
    },
  ]);
}

export function revokeKey(store: StateStore, keyId: string, atMs: number): Promise<void> {
  return store.commit([{ type: 'key.revoked', key_id: keyId, at_ms: atMs }]);
}

/** Adds credits (µcr) and wallet tokens to a key. */
export function topUp(
  store: StateStore,
  keyId: string,
  creditsMicro: number,
  tokens: number,
  atMs: number,
): Promise<void> {
  return store.commit([
    { type: 'key.credited', key_id: keyId, credits_micro: creditsMicro, tokens, at_ms: atMs },
  ]);
}
