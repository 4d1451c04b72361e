// Test support for state tests: event builders with every field filled, and store options on a temp
// dir.

import type { StateLimits } from '../../src/state/apply.ts';
import type { KeyCreated, RequestFinished, RequestStarted } from '../../src/state/events.ts';
import type { StoreOptions } from '../../src/state/store.ts';
import { createLogger } from '../../src/util/log.ts';

/** Event times: recent, since finished records expire `requestRecordTtlMs` after their finish. */
export const T0_MS = Date.now();

export const LIMITS: StateLimits = {
  requestRecordsMax: 1000,
  requestRecordTtlMs: 3_600_000,
  idempotencyKeysMax: 1000,
  requestRecordsPerKey: 1000,
  idempotencyKeysPerKey: 1000,
  usageRetentionDays: 400,
};

export function storeOptions(dataDir: string, overrides: Partial<StoreOptions> = {}): StoreOptions {
  return {
    dataDir,
    fsync: 'off',
    fsyncIntervalMs: 5,
    segmentBytes: 64 * 1024 * 1024,
    snapshotEveryRecords: 1_000_000,
    limits: LIMITS,
    logger: createLogger('silent'),
    ...overrides,
  };
}

/** A distinct 64-hex secret hash per key id. */
function secretOf(keyId: string): string {
  const hex = [...keyId].map((c) => c.charCodeAt(0).toString(16).padStart(2, '0')).join('');
  return hex.padEnd(64, '0').slice(0, 64);
}

export function keyCreated(
  keyId: string,
  creditsMicro = 0,
  overrides: Partial<KeyCreated> = {},
): KeyCreated {
  return {
    type: 'key.created',
    key_id: keyId,
    name: `key ${keyId}`,
    secret_sha256: secretOf(keyId),
    services: ['chat', 'decision'],
    credits_micro: creditsMicro,
    token_wallet: 0,
    daily_decision_budget_micro: null,
    rate_limit_rpm: null,
    at_ms: T0_MS + 0,
    ...overrides,
  };
}

export function keyCredited(keyId: string, creditsMicro: number, tokens = 0) {
  return {
    type: 'key.credited' as const,
    key_id: keyId,
    credits_micro: creditsMicro,
    tokens,
    at_ms: T0_MS + 1,
  };
}

export function requestStarted(
  requestId: string,
  keyId: string,
  holdMicro: number,
  overrides: Partial<RequestStarted> = {},
): RequestStarted {
  return {
    type: 'request.started',
    request_id: requestId,
    key_id: keyId,
    service: 'chat',
    model: 'sim-1',
    stream: false,
    hold: { credits_micro: holdMicro, tokens: 0 },
    idempotency: null,
    budget_hold_micro: 0,
    at_ms: T0_MS + 2,
    ...overrides,
  };
}

export function requestFinished(
  requestId: string,
  chargeMicro: number,
  overrides: Partial<RequestFinished> = {},
): RequestFinished {
  return {
    type: 'request.finished',
    request_id: requestId,
    status: 'completed',
    error_code: null,
    http_status: 200,
    usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
    charge: { credits_micro: chargeMicro, tokens: 0 },
    budget_spend_micro: 0,
    answers: null,
    at_ms: T0_MS + 3,
    ...overrides,
  };
}
