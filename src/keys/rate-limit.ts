// Per-key token buckets: rate_limit_rpm requests per minute, shared by both services.
import { LRUCache } from 'lru-cache';
import { GatewayError } from '../util/errors.ts';

const MINUTE_MS = 60_000;

interface Bucket {
  tokens: number;
  updatedAtMs: number;
}

export class RateLimiter {
  // A bucket untouched for a minute is full again, so forgetting it after that loses nothing.
  private readonly buckets: LRUCache<string, Bucket>;

  constructor(keysMax: number) {
    // Bounded by size, one per bucket, not by `max`: lru-cache allocates `max` slots up front (4 MB
    // at the default 100,000 keys, resident from the start), by size it grows with the keys in use.
    this.buckets = new LRUCache({
      maxSize: keysMax,
      sizeCalculation: () => 1,
      ttl: MINUTE_MS,
      updateAgeOnGet: true,
    });
  }

  /**
   * Takes one request from the key's bucket, or throws 429 with Retry-After in whole seconds (≥ 1).
   */
  take(keyId: string, ratePerMinute: number, nowMs: number): void {
    let bucket = this.buckets.get(keyId);
    if (!bucket) {
      bucket = { tokens: ratePerMinute, updatedAtMs: nowMs };
      this.buckets.set(keyId, bucket);
    } else {
      const refill = ((nowMs - bucket.updatedAtMs) * ratePerMinute) / MINUTE_MS;
      bucket.tokens = Math.min(ratePerMinute, bucket.tokens + Math.max(0, refill));
      bucket.updatedAtMs = nowMs;
    }
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1;
      return;
    }
    throw limited(bucket.tokens, ratePerMinute);
  }

  /** Buckets held (at most the keys bound). */
  get size(): number {
    return this.buckets.size;
  }

  /**
   * Throws the 429 that `take` would throw now, but takes nothing and changes nothing: a request
   * that must do expensive work before it reaches `take` (counting a large prompt) is refused
   * before it.
   */
  peek(keyId: string, ratePerMinute: number, nowMs: number): void {
    const bucket = this.buckets.peek(keyId);
    if (!bucket) return;
    const refill = ((nowMs - bucket.updatedAtMs) * ratePerMinute) / MINUTE_MS;
    const tokens = Math.min(ratePerMinute, bucket.tokens + Math.max(0, refill));
    if (tokens < 1) throw limited(tokens, ratePerMinute);
  }
}

/** 429 with Retry-After: the whole seconds (≥ 1) until the bucket holds a token again. */
function limited(tokens: number, ratePerMinute: number): GatewayError {
  const waitMs = ((1 - tokens) * MINUTE_MS) / ratePerMinute;
  const retryAfterS = Math.max(1, Math.ceil(waitMs / 1000));
  return new GatewayError(
    'rate_limit_exceeded',
    `Rate limit of ${ratePerMinute} requests per minute reached; retry after ${retryAfterS} s.`,
    {
      headers: { 'retry-after': String(retryAfterS) },
    },
  );
}
