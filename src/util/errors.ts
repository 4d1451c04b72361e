// Operating errors: one code table fixes each code's status and type (CONTRACT §2); the HTTP
// layer renders them (http/errors.ts). At the bottom of the layers: every layer may throw one.

export const TYPE_BY_STATUS = {
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
  /**
   * A provider's failure that another deployment may not share (unreachable, 429, 5xx, timeout):
   * the router may try the next one (CONTRACT §7), if nothing reached the client yet.
   */
  failover?: boolean;
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
  readonly failover: boolean;

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
    this.failover = options.failover ?? false;
  }

  get type(): string {
    return TYPE_BY_STATUS[this.status];
  }

  /**
   * The same error without its `detail`, for the chat service: CONTRACT §2 gives `detail` to the
   * decision service only, and the parsers both services share name the problem for it.
   */
  withoutDetail(): GatewayError {
    if (this.detail === undefined) return this;
    const copy = new GatewayError(this.code, this.message, {
      param: this.param,
      ...(this.fields ? { fields: this.fields } : {}),
      ...(this.topLevel ? { topLevel: this.topLevel } : {}),
      ...(this.headers ? { headers: this.headers } : {}),
      ...(this.settleFirst ? { settleFirst: this.settleFirst } : {}),
      failover: this.failover,
      ...(this.cause === undefined ? {} : { cause: this.cause }),
    });
    return copy;
  }
}

/** A bug or an unknown failure: a 500 that never carries a stack, a key or a prompt. */
export function internalError(): GatewayError {
  return new GatewayError(
    'internal_error',
    'The gateway failed unexpectedly; the failure was logged.',
  );
}
