// The one renderer of operating errors: the contract's envelope and its retry advice.
import { GatewayError, internalError } from '../util/errors.ts';

/** The `{"error": {...}}` object of CONTRACT §2. */
export function errorBody(error: GatewayError): Record<string, unknown> {
  const inner: Record<string, unknown> = {
    message: error.message,
    type: error.type,
    code: error.code,
    param: error.param,
  };
  if (error.detail !== undefined) inner.detail = error.detail;
  if (error.fields) Object.assign(inner, error.fields);
  return error.topLevel ? { error: inner, ...error.topLevel } : { error: inner };
}

/**
 * CONTRACT §8 "Retry advice", the `x-should-retry` header the official OpenAI SDKs obey (they retry
 * 408/409/429/5xx on their own otherwise, so a kept hold would be paid again and a 409 retried):
 * worth retrying are a rate limit, a cancel, an unavailable gateway, and an upstream failure that
 * charged nothing; never a client error, a spent budget, or a failure whose hold was kept.
 */
export function shouldRetry(error: GatewayError, charged: boolean): boolean {
  switch (error.status) {
    case 429:
      return error.code === 'rate_limit_exceeded';
    case 499:
    case 503:
      return true;
    case 500:
    case 502:
    case 504:
      return !charged;
    default:
      return false;
  }
}

/**
 * The error as an HTTP answer; `charged`: the request's hold was kept (billing.on_error "keep").
 */
export function errorResponse(
  error: GatewayError,
  extraHeaders?: Record<string, string>,
  charged = false,
): Response {
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    'x-should-retry': shouldRetry(error, charged) ? 'true' : 'false',
    ...extraHeaders,
    ...error.headers,
  };
  return new Response(JSON.stringify(errorBody(error)), { status: error.status, headers });
}

/**
 * A handler's catch: operating errors pass through; anything else is a bug, logged with its stack
 * and answered as a 500 that still carries the request's id. A broken invariant also stops the
 * process.
 */
export function asGatewayError(
  context: { logger: { error(obj: object, msg: string): void }; onFatal?: (error: Error) => void },
  thrown: unknown,
  requestId: string,
): GatewayError {
  if (thrown instanceof GatewayError) return thrown;
  context.logger.error(
    { requestId, err: (thrown as Error)?.stack ?? String(thrown) },
    'http: unhandled error',
  );
  if ((thrown as Error)?.name === 'AssertionError')
    queueMicrotask(() => context.onFatal?.(thrown as Error));
  return internalError();
}
