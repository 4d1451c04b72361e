// RateLimiter with an injected clock: a burst of rpm, then 429 with Retry-After in whole seconds,
// then refill.
import { describe, expect, test } from 'bun:test';
import { RateLimiter } from '../../src/keys/rate-limit.ts';
import { GatewayError } from '../../src/util/errors.ts';

const T0_MS = 1_800_000_000_000;

/** The 429 `take` throws, as {status, code, retryAfter}; null when the request was admitted. */
function attempt(
  limiter: RateLimiter,
  keyId: string,
  rpm: number,
  nowMs: number,
): { status: number; code: string; retryAfter: string | undefined } | null {
  try {
    limiter.take(keyId, rpm, nowMs);
    return null;
  } catch (error) {
    expect(error).toBeInstanceOf(GatewayError);
    const gatewayError = error as GatewayError;
    return {
      status: gatewayError.status,
      code: gatewayError.code,
      retryAfter: gatewayError.headers?.['retry-after'],
    };
  }
}

function limited(retryAfterS: number) {
  return { status: 429, code: 'rate_limit_exceeded', retryAfter: String(retryAfterS) };
}

/** Takes `count` requests at `nowMs`; every one must be admitted. */
function burst(limiter: RateLimiter, keyId: string, rpm: number, nowMs: number, count = rpm): void {
  for (let i = 0; i < count; i++)
    expect({ i, result: attempt(limiter, keyId, rpm, nowMs) }).toEqual({ i, result: null });
}

describe('RateLimiter', () => {
  test('a burst of rpm is admitted, the next is 429 rate_limit_exceeded with Retry-After', () => {
    const limiter = new RateLimiter(100);
    burst(limiter, 'key_a', 60, T0_MS);
    // 60 rpm: one token per second.
    expect(attempt(limiter, 'key_a', 60, T0_MS)).toEqual(limited(1));
  });

  test('refill after 60_000 / rpm ms, not before', () => {
    const rpm = 60;
    const refillMs = 60_000 / rpm;
    const limiter = new RateLimiter(100);
    burst(limiter, 'key_a', rpm, T0_MS);
    expect(attempt(limiter, 'key_a', rpm, T0_MS + refillMs - 1)).toEqual(limited(1));
    expect(attempt(limiter, 'key_a', rpm, T0_MS + refillMs)).toBeNull();
    // That token is spent: the next waits another interval.
    expect(attempt(limiter, 'key_a', rpm, T0_MS + refillMs)).toEqual(limited(1));
    expect(attempt(limiter, 'key_a', rpm, T0_MS + 2 * refillMs)).toBeNull();
  });

  test('Retry-After is the whole seconds until the next token, rounded up', () => {
    const rpm = 2; // one token every 30 s
    const limiter = new RateLimiter(100);
    burst(limiter, 'key_slow', rpm, T0_MS);
    expect(attempt(limiter, 'key_slow', rpm, T0_MS)).toEqual(limited(30));
    // 15 s later half a token has refilled: 15 s to go.
    expect(attempt(limiter, 'key_slow', rpm, T0_MS + 15_000)).toEqual(limited(15));
    // 0.4 s before the token: still a whole second.
    expect(attempt(limiter, 'key_slow', rpm, T0_MS + 29_600)).toEqual(limited(1));
    // 14.5 s to go rounds up to 15.
    const other = new RateLimiter(100);
    burst(other, 'key_slow', rpm, T0_MS);
    expect(attempt(other, 'key_slow', rpm, T0_MS + 15_500)).toEqual(limited(15));
    expect(attempt(limiter, 'key_slow', rpm, T0_MS + 30_000)).toBeNull();
  });

  test('Retry-After is at least 1 even when the next token is milliseconds away', () => {
    const rpm = 6_000; // one token every 10 ms
    const limiter = new RateLimiter(100);
    burst(limiter, 'key_fast', rpm, T0_MS);
    expect(attempt(limiter, 'key_fast', rpm, T0_MS)).toEqual(limited(1));
    expect(attempt(limiter, 'key_fast', rpm, T0_MS + 9)).toEqual(limited(1));
    expect(attempt(limiter, 'key_fast', rpm, T0_MS + 10)).toBeNull();
  });

  test('a long idle refills to rpm, never beyond', () => {
    const rpm = 5;
    const limiter = new RateLimiter(100);
    burst(limiter, 'key_a', rpm, T0_MS);
    expect(attempt(limiter, 'key_a', rpm, T0_MS)).not.toBeNull();
    const later = T0_MS + 3_600_000;
    burst(limiter, 'key_a', rpm, later);
    expect(attempt(limiter, 'key_a', rpm, later)).toEqual(limited(12));
  });

  test('a rejected request takes no token', () => {
    const rpm = 60;
    const limiter = new RateLimiter(100);
    burst(limiter, 'key_a', rpm, T0_MS);
    for (let i = 0; i < 10; i++)
      expect(attempt(limiter, 'key_a', rpm, T0_MS + 500)).toEqual(limited(1));
    expect(attempt(limiter, 'key_a', rpm, T0_MS + 1_000)).toBeNull();
  });

  test('keys have separate buckets', () => {
    const limiter = new RateLimiter(100);
    burst(limiter, 'key_a', 3, T0_MS);
    expect(attempt(limiter, 'key_a', 3, T0_MS)).toEqual(limited(20));
    burst(limiter, 'key_b', 3, T0_MS);
    expect(attempt(limiter, 'key_b', 3, T0_MS)).toEqual(limited(20));
  });

  test('a clock that goes backwards refills nothing', () => {
    const limiter = new RateLimiter(100);
    burst(limiter, 'key_a', 60, T0_MS);
    expect(attempt(limiter, 'key_a', 60, T0_MS - 120_000)).not.toBeNull();
  });
});

describe('RateLimiter.peek', () => {
  /** The 429 `peek` throws, as `attempt` reports it; null when `take` would admit the request. */
  function peeked(
    limiter: RateLimiter,
    keyId: string,
    rpm: number,
    nowMs: number,
  ): { status: number; code: string; retryAfter: string | undefined } | null {
    try {
      limiter.peek(keyId, rpm, nowMs);
      return null;
    } catch (error) {
      expect(error).toBeInstanceOf(GatewayError);
      const gatewayError = error as GatewayError;
      return {
        status: gatewayError.status,
        code: gatewayError.code,
        retryAfter: gatewayError.headers?.['retry-after'],
      };
    }
  }

  test('answers what take would, and takes nothing', () => {
    const limiter = new RateLimiter(100);
    // An unknown key has a full bucket; peeking many times spends none of it.
    for (let i = 0; i < 10; i++) expect(peeked(limiter, 'key_a', 2, T0_MS)).toBeNull();
    burst(limiter, 'key_a', 2, T0_MS);
    expect(peeked(limiter, 'key_a', 2, T0_MS)).toEqual(limited(30));
    expect(peeked(limiter, 'key_a', 2, T0_MS + 15_000)).toEqual(limited(15));
    expect(attempt(limiter, 'key_a', 2, T0_MS + 15_000)).toEqual(limited(15));
    // Once a token has refilled, peek admits, and so does the take after it (peek left the token
    // there).
    expect(peeked(limiter, 'key_a', 2, T0_MS + 30_000)).toBeNull();
    expect(attempt(limiter, 'key_a', 2, T0_MS + 30_000)).toBeNull();
    expect(peeked(limiter, 'key_a', 2, T0_MS + 30_000)).toEqual(limited(30));
    // Other keys are their own.
    expect(peeked(limiter, 'key_b', 2, T0_MS + 30_000)).toBeNull();
  });
});

test('buckets are bounded by the keys bound: a flood of key ids keeps at most that many', () => {
  const limiter = new RateLimiter(50);
  for (let i = 0; i < 5_000; i++) limiter.take(`key_${i}`, 10, 1_000);
  expect(limiter.size).toBe(50);
  // The newest keys keep their buckets (and their spent tokens).
  for (let i = 0; i < 9; i++) limiter.take('key_4999', 10, 1_000);
  expect(() => limiter.take('key_4999', 10, 1_000)).toThrow('Rate limit');
});
