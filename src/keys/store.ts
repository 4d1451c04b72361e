// API keys: creation (secret shown once, SHA-256 stored), import, revoke, top-up, and
// authentication.

import type { KeyAccount } from '../state/apply.ts';
import * as commands from '../state/commands.ts';
import type { Service } from '../state/events.ts';
import type { StateStore } from '../state/store.ts';
import { GatewayError } from '../util/errors.ts';
import { newKeyId, randomBase62, sha256Hex } from '../util/ids.ts';
import { CREDITS_ADDED_MICRO_MAX, type KeyView } from './model.ts';

export const KEY_PREFIX = 'tg-';
const KEY_RANDOM_CHARS = 43; // ≈ 256 bits of base62
const MICRO_PER_CREDIT = 1_000_000;
/**
 * An imported secret: any printable token of a sane length (clients migrate with what they have).
 */
const IMPORTED_SECRET_RE = /^[A-Za-z0-9._~+/=:-]{20,256}$/;

export interface CreateKeyInput {
  name: string;
  services: Service[];
  creditsMicro: number;
  tokenWallet: number;
  dailyDecisionBudgetMicro: number | null;
  rateLimitRpm: number | null;
  /** An existing secret to import instead of generating one. */
  secret?: string | undefined;
}

export function generateSecret(): string {
  return KEY_PREFIX + randomBase62(KEY_RANDOM_CHARS);
}

/** Credits as the API shows them (a JSON number) to whole µcr, refusing what cannot be exact. */
export function creditsToMicro(credits: number, param: string): number {
  // Credits arrive as JSON numbers; they must name whole µcr (0.1 is fine: its float error is far
  // below 1 µcr), so nothing is silently rounded away.
  const micro = Math.round(credits * MICRO_PER_CREDIT);
  if (
    !Number.isFinite(credits) ||
    credits < 0 ||
    !Number.isSafeInteger(micro) ||
    Math.abs(credits * MICRO_PER_CREDIT - micro) > 1e-6
  ) {
    throw new GatewayError(
      'invalid_request_error',
      `${param} must be a non-negative number of credits ` +
        `in whole micro-credits (at most 6 decimals)`,
      { param },
    );
  }
  return micro;
}

export function microToCredits(micro: number): number {
  return micro / MICRO_PER_CREDIT;
}

export async function createKey(
  store: StateStore,
  input: CreateKeyInput,
  keysMax: number,
): Promise<{ account: KeyAccount; secret: string }> {
  if (store.state.keys.size >= keysMax) {
    throw new GatewayError(
      'invalid_request_error',
      `the gateway holds its maximum of ${keysMax} keys`,
    );
  }
  if (input.secret !== undefined && !IMPORTED_SECRET_RE.test(input.secret)) {
    throw new GatewayError(
      'invalid_request_error',
      'key must be 20-256 characters of A-Z a-z 0-9 . _ ~ + / = : -',
      { param: 'key' },
    );
  }
  const secret = input.secret ?? generateSecret();
  const secretSha256 = sha256Hex(secret);
  if (store.state.keysBySecret.has(secretSha256)) {
    throw new GatewayError('invalid_request_error', 'that key is already registered', {
      param: 'key',
    });
  }
  const id = newKeyId();
  await commands.addKey(store, {
    keyId: id,
    name: input.name,
    secretSha256,
    services: [...new Set(input.services)],
    creditsMicro: input.creditsMicro,
    tokenWallet: input.tokenWallet,
    dailyDecisionBudgetMicro: input.dailyDecisionBudgetMicro,
    rateLimitRpm: input.rateLimitRpm,
    atMs: Date.now(),
  });
  return { account: store.state.account(id), secret };
}

export function findKey(store: StateStore, id: string): KeyAccount {
  const account = store.state.keys.get(id);
  if (!account) throw new GatewayError('not_found', `no key ${id}`);
  return account;
}

export async function revokeKey(store: StateStore, id: string): Promise<KeyAccount> {
  const account = findKey(store, id);
  if (!account.revoked) await commands.revokeKey(store, id, Date.now());
  return account;
}

export async function creditKey(
  store: StateStore,
  id: string,
  creditsMicro: number,
  tokens: number,
): Promise<KeyAccount> {
  const account = findKey(store, id);
  // The param names the pocket that would overflow.
  // Only credits added count: a key given more before this bound may still take tokens.
  if (creditsMicro > 0 && account.creditsAddedMicro + creditsMicro > CREDITS_ADDED_MICRO_MAX)
    throw new GatewayError(
      'invalid_request_error',
      `the top-up would take the key past ${CREDITS_ADDED_MICRO_MAX / 1_000_000} credits in ` +
        'all, the most its balances show exactly',
      { param: 'credits' },
    );
  if (!Number.isSafeInteger(account.tokensAdded + tokens))
    throw new GatewayError('invalid_request_error', 'the top-up would overflow the token wallet', {
      param: 'tokens',
    });
  await commands.topUp(store, id, creditsMicro, tokens, Date.now());
  return account;
}

/**
 * Resolves the bearer token of a request to a key allowed to use `service`.
 * 401 invalid_api_key with `reason`: missing, unknown, revoked or wrong_type.
 */
export function authenticate(
  store: StateStore,
  authorization: string | null,
  service: Service,
): KeyAccount {
  const token = bearerToken(authorization);
  if (token === null) throw invalidKey('missing', 'No API key: send Authorization: Bearer <key>.');
  const account = store.state.keysBySecret.get(sha256Hex(token));
  if (!account) throw invalidKey('unknown', 'The API key is not known.');
  if (account.revoked) throw invalidKey('revoked', 'The API key has been revoked.');
  if (!account.services.includes(service))
    throw invalidKey('wrong_type', `The API key is not valid for the ${service} service.`);
  return account;
}

export function bearerToken(authorization: string | null): string | null {
  if (!authorization) return null;
  // The scheme is case-insensitive (RFC 9110); the token is whatever follows one or more spaces.
  if (authorization.length < 8 || !startsWithBearer(authorization)) return null;
  const token = authorization.slice(7).trim();
  return token.length > 0 && token.length <= 512 ? token : null;
}

const BEARER = 'bearer ';

/**
 * Whether `text` starts with `bearer ` in any case, read in place: every request is authenticated,
 * and a slice and its lower-case copy would be two strings each time. Setting bit 0x20 folds only
 * an ASCII capital onto its small letter, and no other character lower-cases to one of these (only
 * the Kelvin sign and İ lower-case to ASCII, to `k` and `i`), so this is `toLowerCase()`'s answer.
 */
function startsWithBearer(text: string): boolean {
  for (let i = 0; i < BEARER.length - 1; i++)
    if ((text.charCodeAt(i) | 0x20) !== BEARER.charCodeAt(i)) return false;
  return text.charCodeAt(BEARER.length - 1) === 32 /* ' ' */;
}

function invalidKey(
  reason: 'missing' | 'unknown' | 'revoked' | 'wrong_type',
  message: string,
): GatewayError {
  return new GatewayError('invalid_api_key', message, { fields: { reason } });
}

/** The admin view of a key (CONTRACT §6): never the secret or its hash. */
export function keyView(account: KeyAccount, defaultRateLimitRpm: number): KeyView {
  return {
    id: account.id,
    name: account.name,
    services: account.services,
    revoked: account.revoked,
    created: Math.floor(account.createdAtMs / 1000),
    limits: {
      // As the key has it (null: the default, CONTRACT §3, as a null daily budget is none), and
      // what that means now.
      rate_limit_rpm: account.rateLimitRpm,
      rate_limit_rpm_in_force: account.rateLimitRpm ?? defaultRateLimitRpm,
      daily_decision_budget:
        account.dailyDecisionBudgetMicro === null
          ? null
          : microToCredits(account.dailyDecisionBudgetMicro),
    },
    balances: {
      credits: microToCredits(account.balanceMicro),
      held: microToCredits(account.heldMicro),
      charged: microToCredits(account.chargedMicro),
      credits_added: microToCredits(account.creditsAddedMicro),
      token_wallet: account.tokenWallet,
    },
  };
}
