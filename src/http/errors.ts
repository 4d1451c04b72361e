// Operating errors: one code table fixes each code's status and type; one envelope renders them
// all.

const TYPE_BY_STATUS = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'billing_error',
  404: 'invalid_request_error',
  409: 'invalid_request_error',
  413: 'invalid_request_error',
  422: 'invalid_request_error',
  429: 'rate_limit_error',
  499: 'cancelled_error',
  500: 'internal_error',
  502: 'upstream_error',
  503: 'service_unavailable_error',
  504: 'timeout_error',
} as const;

export type ErrorStatus = keyof typeof TYPE_BY_STATUS;

/** Every code a client can see, with the status it always answers with. */
export const ERROR_CODES = {
  invalid_request_error: 400,
  invalid_idempotency_key: 400,
  unsupported_parameter: 400,
  context_length_exceeded: 400,
  invalid_api_key: 401,
  unauthorized: 401,
  insufficient_quota: 402,
  model_not_found: 404,
  request_not_found: 404,
  not_found: 404,
  idempotency_key_reused: 409,
  request_in_progress: 409,
  request_already_completed: 409,
  request_too_large: 413,
  input_too_large: 422,
  rate_limit_exceeded: 429,
  api_key_spend_limit_exceeded: 429,
  request_cancelled: 499,
  internal_error: 500,
  upstream_unreachable: 502,
  upstream_invalid_response: 502,
  upstream_error: 502,
  service_unavailable: 503,
  upstream_timeout: 504,
  // Only ever inside a stream (after 200) or in a request record; the status is what a record
  // reports.
  stream_timeout: 504,
  interrupted: 503,
} as const satisfies Record<string, ErrorStatus>;

export type ErrorCode = keyof typeof ERROR_CODES;

export interface GatewayErrorOptions {
  param?: string | null;
  /** Decision service: names the question and the expected shape; never infrastructure. */
  detail?: string;
  /** Fields placed inside the error object (`reason`, `reset_at`). */
  fields?: Record<string, unknown>;
  /**
   * Fields placed beside `error` at the top level (the 409s' request_id, request_status,
   * status_url).
   */
  topLevel?: Record<string, unknown>;
  headers?: Record<string, string>;
  /** The answer must wait for this (a durable commit the error reports on) before it is sent. */
  settleFirst?: Promise<void>;
  cause?: unknown;
}

export class GatewayError extends Error {
  override name = 'GatewayError';
  readonly code: ErrorCode;
  readonly status: ErrorStatus;
  readonly param: string | null;
  readonly detail: string | undefined;
  readonly fields: Record<string, unknown> | undefined;
  readonly topLevel: Record<string, unknown> | undefined;
  readonly headers: Record<string, string> | undefined;
  readonly settleFirst: Promise<void> | undefined;

  constructor(code: ErrorCode, message: string, options: GatewayErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.code = code;
    this.status = ERROR_CODES[code];
    this.param = options.param ?? null;
    this.detail = options.detail;
    this.fields = options.fields;
    this.topLevel = options.topLevel;
    this.headers = options.headers;
    this.settleFirst = options.settleFirst;
  }

  get type(): string {
    return TYPE_BY_STATUS[this.status];
  }
}

export function errorType(status: ErrorStatus): string {
  return TYPE_BY_STATUS[status];
}

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

/** A bug or an unknown failure: a 500 that never carries a stack, a key or a prompt. */
export function internalError(): GatewayError {
  return new GatewayError(
    'internal_error',
    'The gateway failed unexpectedly; the failure was logged.',
  );
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
