// The in-memory state and the one `apply` that changes it; live commands and replay both go through
// here.
import { AssertionError, assert } from '../util/assert.ts';
import { IdMap } from '../util/id-map.ts';
import { BindingTable, type IdempotencyBinding } from './bindings.ts';
import type {
  Amount,
  Event,
  RequestFinished,
  RequestRecorded,
  RequestStarted,
  Service,
} from './events.ts';
import { RecordTable, type RequestRecord } from './records.ts';
import { DAY_MS, UsageTable } from './usage.ts';

export { DAY_MS };

/**
 * Whether a request that ended without an answer (an error, a cancel) frees its Idempotency-Key,
 * per service (CONTRACT, decision service: "a key whose original ended without a decision is
 * freed"). A chat key stays bound to its original, whatever its end: the retry learns of it (409).
 */
const KEY_FREED_WITHOUT_ANSWER: Record<Service, boolean> = { chat: false, decision: true };

/**
 * The charge of a request in flight: one shared, frozen value (a record's charge is replaced at its
 * finish, never changed in place), not an object per request.
 */
const NOTHING_CHARGED: Amount = Object.freeze({ credits_micro: 0, tokens: 0 });

export interface KeyAccount {
  id: string;
  name: string;
  secretSha256: string;
  services: Service[];
  revoked: boolean;
  createdAtMs: number;
  rateLimitRpm: number | null;
  dailyDecisionBudgetMicro: number | null;
  // Ledger, in µcr: creditsAdded = balance + held + charged, always.
  creditsAddedMicro: number;
  balanceMicro: number;
  heldMicro: number;
  chargedMicro: number;
  // Token wallet (decision): tokensAdded = tokenWallet + tokensHeld + tokensCharged, always.
  tokensAdded: number;
  tokenWallet: number;
  tokensHeld: number;
  tokensCharged: number;
  // Daily decision budget: spend of UTC day `budgetDay` (days since the epoch) and what is held
  // now.
  budgetDay: number;
  budgetSpentMicro: number;
  budgetHeldMicro: number;
}

export interface StateLimits {
  requestRecordsMax: number;
  /**
   * `idempotency_ttl_s`: how long a finished request's record, and its Idempotency-Key binding,
   * live after its finish.
   */
  requestRecordTtlMs: number;
  idempotencyKeysMax: number;
  requestRecordsPerKey: number;
  idempotencyKeysPerKey: number;
  usageRetentionDays: number;
}

export class GatewayState {
  readonly keys = new Map<string, KeyAccount>();
  readonly keysBySecret = new Map<string, KeyAccount>();
  /**
   * Requests holding credits right now; never evicted, bounded by admission (max_in_flight). An
   * IdMap, not a Map: a record must not outlive its request (util/id-map.ts).
   */
  readonly inFlight = new IdMap<RequestRecord>();
  /** Finished requests, for the status endpoints; bounded, oldest go first. */
  readonly finished: RecordTable;
  /** Idempotency-Key bindings; bounded per key and in all. */
  readonly idempotency: BindingTable;
  /** Per day, key and model: what finished and what it was charged (CONTRACT §6). */
  readonly usage: UsageTable;

  constructor(readonly limits: StateLimits) {
    this.finished = new RecordTable(
      limits.requestRecordsMax,
      limits.requestRecordTtlMs,
      limits.requestRecordsPerKey,
    );
    this.idempotency = new BindingTable(
      limits.idempotencyKeysMax,
      limits.idempotencyKeysPerKey,
      (requestId) => this.inFlight.has(requestId),
    );
    this.usage = new UsageTable(limits.usageRetentionDays);
  }

  request(id: string): RequestRecord | undefined {
    return this.inFlight.get(id) ?? this.finished.get(id);
  }

  binding(keyId: string, idempotencyKey: string, nowMs: number): IdempotencyBinding | undefined {
    return this.idempotency.get(keyId, idempotencyKey, nowMs);
  }

  apply(event: Event): void {
    switch (event.type) {
      case 'key.created': {
        assert(!this.keys.has(event.key_id), `key ${event.key_id} exists`);
        assert(!this.keysBySecret.has(event.secret_sha256), 'secret already in use');
        const account: KeyAccount = {
          id: event.key_id,
          name: event.name,
          secretSha256: event.secret_sha256,
          services: [...event.services],
          revoked: false,
          createdAtMs: event.at_ms,
          rateLimitRpm: event.rate_limit_rpm,
          dailyDecisionBudgetMicro: event.daily_decision_budget_micro,
          creditsAddedMicro: event.credits_micro,
          balanceMicro: event.credits_micro,
          heldMicro: 0,
          chargedMicro: 0,
          tokensAdded: event.token_wallet,
          tokenWallet: event.token_wallet,
          tokensHeld: 0,
          tokensCharged: 0,
          budgetDay: 0,
          budgetSpentMicro: 0,
          budgetHeldMicro: 0,
        };
        this.keys.set(account.id, account);
        this.keysBySecret.set(account.secretSha256, account);
        return;
      }
      case 'key.revoked': {
        this.account(event.key_id).revoked = true;
        return;
      }
      case 'key.credited': {
        const account = this.account(event.key_id);
        account.creditsAddedMicro = safeAdd(account.creditsAddedMicro, event.credits_micro);
        account.balanceMicro = safeAdd(account.balanceMicro, event.credits_micro);
        account.tokensAdded = safeAdd(account.tokensAdded, event.tokens);
        account.tokenWallet = safeAdd(account.tokenWallet, event.tokens);
        checkLedger(account);
        return;
      }
      case 'request.started':
        this.applyStarted(event);
        return;
      case 'request.finished':
        this.applyFinished(event);
        return;
      case 'request.recorded':
        this.applyRecorded(event);
        return;
    }
  }

  private applyStarted(event: RequestStarted): void {
    if (this.inFlight.has(event.request_id) || this.finished.has(event.request_id))
      throw new AssertionError(`request ${event.request_id} exists`);
    const account = this.account(event.key_id);
    assert(account.balanceMicro >= event.hold.credits_micro, 'hold exceeds the balance');
    assert(account.tokenWallet >= event.hold.tokens, 'hold exceeds the token wallet');
    account.balanceMicro -= event.hold.credits_micro;
    account.heldMicro += event.hold.credits_micro;
    account.tokenWallet -= event.hold.tokens;
    account.tokensHeld += event.hold.tokens;
    account.budgetHeldMicro += event.budget_hold_micro;
    checkLedger(account);
    this.inFlight.set(event.request_id, {
      id: event.request_id,
      keyId: event.key_id,
      service: event.service,
      model: event.model,
      stream: event.stream,
      status: 'in_progress',
      createdAtMs: event.at_ms,
      finishedAtMs: null,
      hold: event.hold,
      charge: NOTHING_CHARGED,
      budgetHoldMicro: event.budget_hold_micro,
      usage: null,
      errorCode: null,
      httpStatus: null,
      answers: null,
      attempts: null,
      idempotencyKey: event.idempotency?.key ?? null,
    });
    if (event.idempotency) {
      // Bound even when replayed after its TTL: what the table holds must not depend on when the
      // log is read. An expired binding is never found, and it is the first to make room.
      this.idempotency.set(
        event.key_id,
        event.idempotency.key,
        {
          requestId: event.request_id,
          fingerprint: event.idempotency.fingerprint,
          expiresAtMs: event.idempotency.expires_at_ms,
        },
        event.at_ms,
      );
    }
  }

  private applyFinished(event: RequestFinished): void {
    const record = this.inFlight.get(event.request_id);
    if (!record)
      throw new AssertionError(`finish of unknown or finished request ${event.request_id}`);
    const account = this.account(record.keyId);
    const { hold } = record;
    assert(event.charge.credits_micro <= hold.credits_micro, 'charge exceeds the credit hold');
    assert(event.charge.tokens <= hold.tokens, 'charge exceeds the token hold');
    account.heldMicro -= hold.credits_micro;
    account.chargedMicro += event.charge.credits_micro;
    account.balanceMicro += hold.credits_micro - event.charge.credits_micro;
    account.tokensHeld -= hold.tokens;
    account.tokensCharged += event.charge.tokens;
    account.tokenWallet += hold.tokens - event.charge.tokens;
    account.budgetHeldMicro -= record.budgetHoldMicro;
    if (event.budget_spend_micro > 0) {
      const day = Math.floor(event.at_ms / DAY_MS);
      if (day !== account.budgetDay) {
        account.budgetDay = day;
        account.budgetSpentMicro = 0;
      }
      account.budgetSpentMicro += event.budget_spend_micro;
    }
    checkLedger(account);
    record.status = event.status;
    record.finishedAtMs = event.at_ms;
    record.charge = event.charge;
    record.usage = event.usage;
    record.errorCode = event.error_code;
    record.httpStatus = event.http_status;
    record.answers = event.answers;
    record.attempts = event.attempts ?? null;
    this.usage.add(record.keyId, record.model, event);
    this.inFlight.delete(record.id);
    this.finished.add(record);
    if (record.idempotencyKey !== null) {
      // The one rule for an Idempotency-Key whose request ended without an answer.
      if (event.status !== 'completed' && KEY_FREED_WITHOUT_ANSWER[record.service])
        this.idempotency.deleteIfBoundTo(record.keyId, record.idempotencyKey, record.id);
      // Its key lives the TTL from its end, as its record does: a request that ran longer than
      // the TTL keeps its key as long after its end as a quick one.
      else
        this.idempotency.extend(
          record.keyId,
          record.idempotencyKey,
          record.id,
          record.createdAtMs,
          event.at_ms,
        );
    }
  }

  private applyRecorded(event: RequestRecorded): void {
    this.account(event.key_id);
    // A refused request never held anything; an id seen again (cannot happen) keeps its first
    // record.
    if (this.inFlight.has(event.request_id) || this.finished.has(event.request_id)) return;
    const nothing = { credits_micro: 0, tokens: 0 };
    this.finished.add({
      id: event.request_id,
      keyId: event.key_id,
      service: event.service,
      model: event.model,
      stream: false,
      status: event.status,
      createdAtMs: event.at_ms,
      finishedAtMs: event.at_ms,
      hold: nothing,
      charge: nothing,
      budgetHoldMicro: 0,
      usage: null,
      errorCode: event.error_code,
      httpStatus: event.http_status,
      answers: null,
      attempts: null,
      idempotencyKey: null,
    });
  }

  account(keyId: string): KeyAccount {
    const account = this.keys.get(keyId);
    if (!account) throw new AssertionError(`unknown key ${keyId}`);
    return account;
  }
}

function safeAdd(a: number, b: number): number {
  const sum = a + b;
  assert(Number.isSafeInteger(sum), 'amount overflows a safe integer');
  return sum;
}

/** The ledger invariant, checked after every change to an account. */
export function checkLedger(account: KeyAccount): void {
  // Conditions first: the messages (with the key id) are built only when one fails; this runs per
  // commit.
  if (!(account.balanceMicro >= 0 && account.heldMicro >= 0 && account.chargedMicro >= 0)) {
    throw new AssertionError(`negative ledger on ${account.id}`);
  }
  if (
    account.creditsAddedMicro !==
    account.balanceMicro + account.heldMicro + account.chargedMicro
  ) {
    throw new AssertionError(`ledger invariant broken on ${account.id}`);
  }
  if (!(account.tokenWallet >= 0 && account.tokensHeld >= 0))
    throw new AssertionError(`negative token wallet on ${account.id}`);
  if (account.tokensAdded !== account.tokenWallet + account.tokensHeld + account.tokensCharged) {
    throw new AssertionError(`token ledger broken on ${account.id}`);
  }
}
