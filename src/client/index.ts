// tollgate's own TypeScript client: typed calls for both services and the spec's retry rule built
// in.
import { SseParser } from '../util/sse-parse.ts';

/**
 * Statuses worth retrying (decision spec, rule 4); everything else needs a change by the caller.
 */
export const RETRYABLE_STATUSES: ReadonlySet<number> = new Set([429, 499, 502, 503, 504]);
export const RETRIES_MAX = 3;
export const BACKOFF_BASE_MS = 500;

export interface ClientOptions {
  /** The gateway's address, e.g. http://127.0.0.1:8080 (no /api/v1). */
  baseUrl: string;
  apiKey: string;
  /** Retries after the first attempt; the spec's rule is 3. */
  maxRetries?: number;
  fetch?: typeof fetch;
  /** How waiting happens; tests inject a clock instead of sleeping. */
  sleep?: (ms: number) => Promise<void>;
  /** Makes an Idempotency-Key when the caller gives none. */
  newIdempotencyKey?: () => string;
}

export interface CallOptions {
  idempotencyKey?: string;
  signal?: AbortSignal;
}

export interface ErrorBody {
  message: string;
  type: string;
  code: string;
  param: string | null;
  detail?: string;
  reason?: string;
  reset_at?: string;
  [field: string]: unknown;
}

/** A non-2xx answer: branch on `code`. */
export class TollgateError extends Error {
  override name = 'TollgateError';
  constructor(
    readonly status: number,
    readonly error: ErrorBody,
    readonly requestId: string | null,
    /** The whole body (409s carry request_id, request_status and status_url beside `error`). */
    readonly body: Record<string, unknown>,
    readonly attempts: number,
  ) {
    super(`${status} ${error.code}: ${error.message}`);
  }

  get code(): string {
    return this.error.code;
  }
}

export interface DecisionQuestionChoice {
  type: 'choice';
  prompt: string;
  criteria: Record<string, string>;
}
export interface DecisionQuestionScore {
  type: 'score';
  prompt: string;
  criteria: string[];
}
export interface DecideRequest {
  model: 'decision-fast' | 'decision-accurate';
  state: unknown;
  questions: Record<string, DecisionQuestionChoice | DecisionQuestionScore>;
}
export type DecisionAnswer =
  | { type: 'choice'; label: string }
  | { type: 'score'; score: number; level: string };
export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}
export interface Decision {
  id: string;
  object: 'decision';
  created: number;
  model: string;
  answers: Record<string, DecisionAnswer>;
  usage: Usage;
  charged: { tokens: number; credits: number };
}
export interface DecisionLookup {
  id: string;
  object: 'decision.request';
  status: 'in_progress' | 'completed' | 'cancelled' | 'error';
  http_status: number | null;
  created: number;
  finished: number | null;
  model: string;
  error_code: string | null;
  answers: Record<string, DecisionAnswer> | null;
  usage: Usage | null;
  charged: { tokens: number; credits: number };
  /** The deployments tried, in order (CONTRACT §7). */
  attempts: DeploymentAttempt[];
}
/** One try of one deployment of the model. */
export interface DeploymentAttempt {
  provider: string;
  upstream_model: string;
  outcome: 'ok' | 'error' | 'cancelled';
  error_code: string | null;
  latency_ms: number;
}
export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string | null | Array<{ type: string; text?: string }>;
  tool_calls?: Array<{
    id: string;
    type: 'function';
    function: { name: string; arguments: string };
  }>;
  tool_call_id?: string;
}
export interface ChatRequest {
  model: string;
  messages: ChatMessage[];
  max_completion_tokens?: number;
  temperature?: number;
  top_p?: number;
  top_k?: number;
  seed?: number;
  stop?: string | string[];
  tools?: Array<{
    type: 'function';
    function: { name: string; description?: string; parameters?: Record<string, unknown> };
  }>;
  tool_choice?: 'auto' | 'none' | 'required' | { type: 'function'; function: { name: string } };
  [field: string]: unknown;
}
export interface ChatCompletion {
  id: string;
  object: 'chat.completion';
  created: number;
  model: string;
  choices: Array<{ index: number; message: ChatMessage; finish_reason: 'stop' | 'tool_calls' }>;
  usage: Usage;
}
export interface ChatRequestStatus {
  object: 'request.status';
  request_id: string;
  request_status: 'in_progress' | 'completed' | 'cancelled' | 'error';
  status_url: string;
  model: string;
  stream: boolean;
  created: number;
  finished: number | null;
  usage: Usage | null;
  reserved_credits: number;
  charged_credits: number;
  error_code: string | null;
  /** The deployments tried, in order (CONTRACT §7). */
  attempts: DeploymentAttempt[];
}

/**
 * The wait before retry `attempt` (0-based): Retry-After seconds when positive, else 500 ms ×
 * 2^attempt.
 */
export function retryDelayMs(attempt: number, retryAfter: string | null): number {
  if (retryAfter !== null) {
    const seconds = Number(retryAfter);
    if (Number.isFinite(seconds) && seconds > 0) return seconds * 1000;
  }
  return BACKOFF_BASE_MS * 2 ** attempt;
}

const sleepFor = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

type Service = 'decision' | 'chat';

/**
 * What an answered attempt allows: the same call again, the call under a new Idempotency-Key, or
 * no retry. `service` is null for a read (no key).
 *
 * - A status outside rule 4's, or `x-should-retry: false` (the gateway's word that a retry cannot
 *   help: a chat hold kept on a 502/504, a spent daily budget; CONTRACT §8): none.
 * - A decision: the same key, since a decision that ended without a 200 frees it (CONTRACT §5).
 * - A chat call: its key stays bound to the request it started, whatever its end, so a retry
 *   under it could only be a 409. A 499 was a cancel (a cancel call, or the client going away) and
 *   is not the client's to undo: none. With `x-should-retry: true` nothing was charged: a key the
 *   client made is replaced; a key the caller chose is kept for a 429 or 503 (a refusal, mostly,
 *   which binds nothing; else the retry's 409 says what became of the first), and for a 502/504
 *   the caller decides. An answer without the header is not the gateway's (a proxy's 504 while
 *   the request still runs): the same key, so that it cannot run twice.
 */
function retryOf(
  response: Response,
  service: Service | null,
  ownKey: boolean,
): 'same' | 'fresh' | 'none' {
  const { status } = response;
  if (!RETRYABLE_STATUSES.has(status)) return 'none';
  const advice = response.headers.get('x-should-retry');
  if (advice === 'false') return 'none';
  if (service !== 'chat') return 'same';
  if (status === 499) return 'none';
  // Without the gateway's word (a proxy in between timed out, say) the request may still run:
  // only its own key makes a retry safe, and a 409 then tells what became of it.
  if (advice !== 'true') return 'same';
  if (ownKey) return 'fresh';
  return status === 429 || status === 503 ? 'same' : 'none';
}

export class TollgateClient {
  private readonly baseUrl: string;
  private readonly fetch: typeof fetch;
  private readonly sleep: (ms: number) => Promise<void>;
  private readonly maxRetries: number;
  private readonly newKey: () => string;

  constructor(private readonly options: ClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, '');
    this.fetch = options.fetch ?? globalThis.fetch;
    this.sleep = options.sleep ?? sleepFor;
    this.maxRetries = options.maxRetries ?? RETRIES_MAX;
    this.newKey = options.newIdempotencyKey ?? (() => `tgc-${crypto.randomUUID()}`);
  }

  /**
   * One logical call: retryable statuses and network failures are retried up to maxRetries times,
   * as far as a retry can help (see `retryOf`). A decision keeps its Idempotency-Key on every
   * attempt, so a retry can never produce a second decision or charge; so does a chat call after a
   * network failure (its first attempt may have run).
   */
  private async send(
    method: 'GET' | 'POST',
    path: string,
    body: unknown,
    call: CallOptions = {},
    service: Service = 'decision',
  ): Promise<Response> {
    const ownKey = method === 'POST' && call.idempotencyKey === undefined;
    const headers: Record<string, string> = { authorization: `Bearer ${this.options.apiKey}` };
    if (body !== undefined) headers['content-type'] = 'application/json';
    if (method === 'POST') headers['idempotency-key'] = call.idempotencyKey ?? this.newKey();
    const payload = body === undefined ? undefined : JSON.stringify(body);
    for (let attempt = 0; ; attempt++) {
      let response: Response | null = null;
      try {
        response = await this.fetch(`${this.baseUrl}${path}`, {
          method,
          headers,
          body: payload,
          signal: call.signal,
        });
      } catch (error) {
        if (call.signal?.aborted || attempt >= this.maxRetries) throw error;
      }
      if (response?.ok) return response;
      const retry =
        response === null ? 'same' : retryOf(response, method === 'POST' ? service : null, ownKey);
      if (response !== null && (retry === 'none' || attempt >= this.maxRetries)) {
        const parsed = (await response.json().catch(() => ({}))) as Record<string, unknown>;
        const error = (parsed.error as ErrorBody | undefined) ?? {
          message: `HTTP ${response.status}`,
          type: 'unknown',
          code: 'unknown',
          param: null,
        };
        throw new TollgateError(
          response.status,
          error,
          response.headers.get('x-request-id'),
          parsed,
          attempt + 1,
        );
      }
      if (retry === 'fresh') headers['idempotency-key'] = this.newKey();
      const retryAfter = response?.headers.get('retry-after') ?? null;
      if (response) await response.body?.cancel();
      await this.sleep(retryDelayMs(attempt, retryAfter));
    }
  }

  private async json<T>(
    method: 'GET' | 'POST',
    path: string,
    body?: unknown,
    call?: CallOptions,
    service?: Service,
  ): Promise<T> {
    return (await (await this.send(method, path, body, call, service)).json()) as T;
  }

  /** POST /decision/v1/decide/ */
  decide(request: DecideRequest, call?: CallOptions): Promise<Decision> {
    return this.json('POST', '/decision/v1/decide/', request, call);
  }

  /** GET /decision/v1/requests/<dec_id>/ */
  getDecision(id: string, call?: CallOptions): Promise<DecisionLookup> {
    return this.json('GET', `/decision/v1/requests/${encodeURIComponent(id)}/`, undefined, call);
  }

  /** POST /api/v1/chat/completions (stream false). */
  chatCompletion(request: ChatRequest, call?: CallOptions): Promise<ChatCompletion> {
    return this.json(
      'POST',
      '/api/v1/chat/completions',
      { ...request, stream: false },
      call,
      'chat',
    );
  }

  /**
   * POST /api/v1/chat/completions with stream true: yields each chunk object. Retries happen only
   * before the stream starts; an error event inside the stream is thrown as a TollgateError with
   * status 200.
   */
  async *chatCompletionStream(
    request: ChatRequest,
    call?: CallOptions,
  ): AsyncGenerator<Record<string, unknown>> {
    const response = await this.send(
      'POST',
      '/api/v1/chat/completions',
      { ...request, stream: true },
      call,
      'chat',
    );
    const parser = new SseParser();
    const reader = response.body!.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        for (const data of parser.feed(value)) {
          if (data === '[DONE]') return;
          const chunk = JSON.parse(data) as Record<string, unknown>;
          if (chunk.error)
            throw new TollgateError(
              200,
              chunk.error as ErrorBody,
              response.headers.get('x-request-id'),
              chunk,
              1,
            );
          yield chunk;
        }
      }
    } finally {
      await reader.cancel().catch(() => {});
    }
  }

  /** GET /api/v1/requests/<id> */
  getRequest(id: string, call?: CallOptions): Promise<ChatRequestStatus> {
    return this.json('GET', `/api/v1/requests/${encodeURIComponent(id)}`, undefined, call);
  }

  /** POST /api/v1/requests/<id>/cancel */
  cancelRequest(
    id: string,
    call?: CallOptions,
  ): Promise<{
    request_id: string;
    cancel_requested: true;
    request_status: string;
    status_url: string;
  }> {
    return this.json('POST', `/api/v1/requests/${encodeURIComponent(id)}/cancel`, undefined, {
      ...call,
      idempotencyKey: call?.idempotencyKey,
    });
  }

  /** GET /api/v1/models */
  async models(
    call?: CallOptions,
  ): Promise<Array<{ id: string; object: 'model'; created: number; owned_by: string }>> {
    return (
      await this.json<{
        data: Array<{ id: string; object: 'model'; created: number; owned_by: string }>;
      }>('GET', '/api/v1/models', undefined, call)
    ).data;
  }
}
