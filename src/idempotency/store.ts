// Idempotency-Key rules: the key format, and what a bound (API key, Idempotency-Key) pair answers.

import type { GatewayState } from '../state/apply.ts';
import type { Service } from '../state/events.ts';
import { GatewayError } from '../util/errors.ts';
import { serviceOfRequestId } from '../util/ids.ts';

export const IDEMPOTENCY_KEY_RE = /^[A-Za-z0-9._:-]{8,255}$/;

/** The header's value, or null when absent; 400 invalid_idempotency_key when malformed. */
export function parseIdempotencyKey(value: string | null): string | null {
  if (value === null) return null;
  if (!IDEMPOTENCY_KEY_RE.test(value)) {
    throw new GatewayError(
      'invalid_idempotency_key',
      'Idempotency-Key must be 8 to 255 characters of ' +
        'A-Z, a-z, 0-9, dot, underscore, colon, hyphen.',
      {
        param: 'Idempotency-Key',
        // What is wrong with it, not its text: a header may be anything up to Bun's limit.
        detail: `the Idempotency-Key header must be 8-255 characters of A-Z a-z 0-9 . _ : -; it ${
          value.length < 8 || value.length > 255
            ? `has ${value.length} characters`
            : 'holds a character outside that set'
        }`,
      },
    );
  }
  return value;
}

/**
 * Refuses a request whose (API key, Idempotency-Key) is bound: 409 idempotency_key_reused for other
 * content, else request_in_progress or request_already_completed pointing at the original.
 */
export function checkIdempotency(
  state: GatewayState,
  live: { get(requestId: string): { durable: Promise<void> } | undefined },
  service: Service,
  keyId: string,
  idempotencyKey: string,
  fingerprint: string,
  nowMs: number,
  statusUrl: (requestId: string) => string,
): void {
  const binding = state.binding(keyId, idempotencyKey, nowMs);
  if (!binding) return;
  // The 409 names the original: it must not be answered before what it reports is durable, or a
  // crash in between would leave the client holding an id the restarted gateway has never heard of.
  const settleFirst = live.get(binding.requestId)?.durable;
  if (binding.fingerprint !== fingerprint) {
    // A 409 about an existing request carries its id (CONTRACT §8): the client's own earlier
    // request under this key, the one to look up. Not across services: each surface's
    // X-Request-ID is of its own kind (§4 chatcmpl-, §5 dec_), and the other's id could not be
    // looked up there; this refused request's own id stays. (Told by the id, which outlives an
    // evicted record.)
    const sameService = serviceOfRequestId(binding.requestId) === service;
    throw new GatewayError(
      'idempotency_key_reused',
      'This Idempotency-Key was used with a different request body.',
      {
        param: 'Idempotency-Key',
        detail:
          'this Idempotency-Key is bound to an earlier request with different content; ' +
          'send this one under a new key',
        ...(sameService ? { headers: { 'x-request-id': binding.requestId } } : {}),
        ...(settleFirst ? { settleFirst } : {}),
      },
    );
  }
  const record = state.request(binding.requestId);
  // A bound key whose record was evicted still names its request; it is finished by then.
  const status = record?.status ?? 'completed';
  const url = statusUrl(binding.requestId);
  const inProgress = status === 'in_progress';
  throw new GatewayError(
    inProgress ? 'request_in_progress' : 'request_already_completed',
    inProgress
      ? 'The original request with this Idempotency-Key is still running; poll status_url.'
      : 'The original request with this Idempotency-Key has finished; read it at status_url.',
    {
      param: 'Idempotency-Key',
      topLevel: { request_id: binding.requestId, request_status: status, status_url: url },
      // The answer is about the original request: its id, not this refused attempt's, is the one to
      // look up.
      headers: { 'x-service-request-status': url, 'x-request-id': binding.requestId },
      ...(settleFirst ? { settleFirst } : {}),
    },
  );
}
