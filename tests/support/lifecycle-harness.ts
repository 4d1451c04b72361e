// One harness for a request's lifecycle through HTTP, parameterised by service: chat (JSON or SSE)
// and decision, a fake upstream whose every call the test scripts, and the observers (status
// record, key balances, metrics) a path is judged by.
import { expect } from 'bun:test';
import { validArguments } from './decision-upstream.ts';
import { ADMIN_TOKEN, bearer } from './gateway.ts';
import { SseReader } from './sse.ts';

/** What the fake upstream does with one call. */
export type UpstreamAct =
  /** A complete answer with USAGE: text for chat, a valid submit_decision call for a decision. */
  | { kind: 'answer' }
  /** Nothing at all, not even headers, until the caller goes away. */
  | { kind: 'silent' }
  /**
   * A stream's headers and first chunk, then nothing until the caller goes away; a call that did
   * not ask for a stream gets nothing (as `silent`).
   */
  | { kind: 'hold' }
  /** An HTTP error status with an OpenAI-style error body. */
  | { kind: 'fail'; status: number }
  /** Nothing until `until` resolves, then a complete answer. */
  | { kind: 'answerAfter'; until: Promise<unknown> };

/** The usage every answer reports: at model_03's 5 / 14 µcr per token, 1,780 µcr. */
export const USAGE = { prompt_tokens: 300, completion_tokens: 20 };
export const ANSWER_COST_MICRO = USAGE.prompt_tokens * 5 + USAGE.completion_tokens * 14;

export interface SeenCall {
  index: number;
  body: any;
  /** Resolves when the gateway abandons this call (it hangs up before the answer ends). */
  aborted: Promise<void>;
  wasAborted: boolean;
}

export interface LifecycleUpstream {
  url: string;
  calls: SeenCall[];
  /** Resolves with call `index` (0-based) once the upstream has read its body. */
  call(index: number): Promise<SeenCall>;
  /** Decides each call's act; tests may replace it at any time. */
  act: (call: SeenCall) => UpstreamAct;
  stop(): void;
}

const encoder = new TextEncoder();

function chunk(choices: unknown[], extra: Record<string, unknown> = {}): Uint8Array {
  const body = { id: 'up-1', object: 'chat.completion.chunk', created: 0, model: 'up', choices };
  return encoder.encode(`data: ${JSON.stringify({ ...body, ...extra })}\n\n`);
}

const USAGE_BLOCK = { ...USAGE, total_tokens: USAGE.prompt_tokens + USAGE.completion_tokens };

/** A complete answer: a decision (the request offers submit_decision) or chat text, as asked. */
function answer(body: any): Response {
  const tool = body?.tools?.[0]?.function?.name === 'submit_decision';
  const toolCall = {
    index: 0,
    id: 'call_1',
    type: 'function',
    function: { name: 'submit_decision', arguments: JSON.stringify(validArguments(body)) },
  };
  if (body?.stream !== true) {
    const message = tool
      ? { role: 'assistant', content: null, tool_calls: [toolCall] }
      : { role: 'assistant', content: 'Hello there' };
    return Response.json({
      id: 'up-1',
      object: 'chat.completion',
      created: 0,
      model: 'up',
      choices: [{ index: 0, message, finish_reason: tool ? 'tool_calls' : 'stop' }],
      usage: USAGE_BLOCK,
    });
  }
  const delta = tool ? { tool_calls: [toolCall] } : { content: 'Hello there' };
  const frames = [
    chunk([{ index: 0, delta: { role: 'assistant' }, finish_reason: null }]),
    chunk([{ index: 0, delta, finish_reason: null }]),
    chunk([{ index: 0, delta: {}, finish_reason: tool ? 'tool_calls' : 'stop' }]),
    chunk([], { usage: USAGE_BLOCK }),
    encoder.encode('data: [DONE]\n\n'),
  ];
  return new Response(new Blob(frames), { headers: { 'content-type': 'text/event-stream' } });
}

/** Headers and one chunk, then an open stream that ends only when the reader goes away. */
function heldStream(): Response {
  const stream = new ReadableStream<Uint8Array>({
    start(controller) {
      controller.enqueue(
        chunk([{ index: 0, delta: { role: 'assistant', content: 'first ' }, finish_reason: null }]),
      );
    },
  });
  return new Response(stream, { headers: { 'content-type': 'text/event-stream' } });
}

export function startLifecycleUpstream(
  act: (call: SeenCall) => UpstreamAct = () => ({ kind: 'answer' }),
): LifecycleUpstream {
  const arrivals: PromiseWithResolvers<SeenCall>[] = [];
  const arrival = (index: number) => {
    while (arrivals.length <= index) arrivals.push(Promise.withResolvers<SeenCall>());
    return arrivals[index]!;
  };
  const state: LifecycleUpstream = {
    url: '',
    calls: [],
    call: (index) => arrival(index).promise,
    act,
    stop: () => server.stop(true),
  };
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    async fetch(request) {
      const abort = Promise.withResolvers<void>();
      const seen: SeenCall = {
        index: state.calls.length,
        body: null,
        aborted: abort.promise,
        wasAborted: false,
      };
      state.calls.push(seen);
      request.signal.addEventListener('abort', () => {
        seen.wasAborted = true;
        abort.resolve();
      });
      seen.body = await request.json();
      const what = state.act(seen);
      arrival(seen.index).resolve(seen);
      switch (what.kind) {
        case 'answer':
          return answer(seen.body);
        case 'fail':
          return Response.json(
            { error: { message: 'fake upstream failure', type: 'server_error' } },
            { status: what.status },
          );
        case 'hold':
          if (seen.body?.stream === true) return heldStream();
          return new Promise<Response>(() => {});
        case 'silent':
          return new Promise<Response>(() => {});
        case 'answerAfter':
          await what.until;
          return answer(seen.body);
      }
    },
  });
  state.url = `http://127.0.0.1:${server.port}/v1`;
  return state;
}

/** Config overrides that put model_03 (chat, and decision-fast) on the fake upstream. */
export function lifecycleOverrides(
  upstream: LifecycleUpstream,
  extra: Record<string, any> = {},
): Record<string, unknown> {
  return {
    ...extra,
    // No provider timeout_ms: the provider's deadline is limits.upstream_timeout_ms, streams too.
    providers: { fake: { type: 'openai', base_url: upstream.url } },
    models: { model_03: { provider: 'fake', upstream_model: 'up' } },
  };
}

/** A request record as the service's status endpoint shows it, in the units the test compares. */
export interface RecordView {
  status: string;
  errorCode: string | null;
  chargedMicro: number;
  /** The hold the record shows (chat's reserved_credits); null where the service shows none. */
  reservedMicro: number | null;
}

/** One service, as a client sees it: where it posts, what it sends, how it reads a record. */
export interface ServiceUnderTest {
  /** The name in test titles. */
  label: string;
  service: 'chat' | 'decision';
  /** Chat as an SSE stream (the id comes in the first chunk, late errors as an event). */
  stream: boolean;
  path: string;
  body(): Record<string, unknown>;
  recordPath(id: string): string;
  readRecord(body: any): RecordView;
  /** Config for a provider that must answer within `ms`. */
  timeoutOverrides(ms: number): Record<string, unknown>;
  /**
   * What an upstream error or timeout charges (CONTRACT §3): chat keeps the hold under
   * billing.on_error "keep"; a decision is charged only on 200.
   */
  errorChargeMicro(record: RecordView): number;
}

const micro = (credits: number) => Math.round(credits * 1e6);

function chatService(stream: boolean): ServiceUnderTest {
  return {
    label: stream ? 'chat stream' : 'chat',
    service: 'chat',
    stream,
    path: '/api/v1/chat/completions',
    // An output cap whose reservation (≈ 14,000 µcr) is well above the answer's cost: the charge is
    // the usage, not the cap.
    body: () => ({
      model: 'model_03',
      messages: [{ role: 'user', content: 'Say hello.' }],
      max_completion_tokens: 1000,
      ...(stream ? { stream: true } : {}),
    }),
    recordPath: (id) => `/api/v1/requests/${id}`,
    readRecord: (body) => ({
      status: body.request_status,
      errorCode: body.error_code,
      chargedMicro: micro(body.charged_credits),
      reservedMicro: micro(body.reserved_credits),
    }),
    timeoutOverrides: (ms) => ({ limits: { upstream_timeout_ms: ms } }),
    errorChargeMicro: (record) => record.reservedMicro!,
  };
}

export const CHAT = chatService(false);
export const CHAT_STREAM = chatService(true);
export const DECISION: ServiceUnderTest = {
  label: 'decision',
  service: 'decision',
  stream: false,
  path: '/decision/v1/decide/',
  body: () => ({
    model: 'decision-fast',
    state: { ticket: 'The checkout page returns 500 for every customer.' },
    questions: {
      urgency: {
        type: 'choice',
        prompt: 'How urgent is this ticket?',
        criteria: { urgent: 'needs action today', routine: 'can wait' },
      },
    },
  }),
  recordPath: (id) => `/decision/v1/requests/${id}/`,
  readRecord: (body) => {
    // Credits pay (the test keys have no token wallet): the token side stays 0 whatever happens.
    expect(body.charged.tokens).toBe(0);
    return {
      status: body.status,
      errorCode: body.error_code,
      chargedMicro: micro(body.charged.credits),
      reservedMicro: null,
    };
  },
  timeoutOverrides: (ms) => ({ decision: { timeout_ms: ms } }),
  errorChargeMicro: () => 0,
};

/** How a test reaches a gateway: a live server by fetch, or a reopened one by app.handle. */
export type Send = (path: string, init?: RequestInit) => Promise<Response>;

export function sendTo(baseUrl: string): Send {
  return (path, init) => fetch(`${baseUrl}${path}`, init);
}

export const CREDITS = 10;
const CREDITS_MICRO = CREDITS * 1_000_000;

/** A key of `svc`'s service, CREDITS credits and no token wallet, on the gateway `send` reaches. */
export class Client {
  constructor(
    readonly svc: ServiceUnderTest,
    readonly send: Send,
    readonly keyId: string,
    readonly key: string,
  ) {}

  static async create(svc: ServiceUnderTest, send: Send): Promise<Client> {
    const response = await send('/admin/v1/keys', {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'lifecycle', services: [svc.service], credits: CREDITS }),
    });
    expect(response.status).toBe(201);
    const { id, key } = (await response.json()) as { id: string; key: string };
    return new Client(svc, send, id, key);
  }

  /** The same key on another gateway over the same data (a restart). */
  on(send: Send): Client {
    return new Client(this.svc, send, this.keyId, this.key);
  }

  post(options: { idempotencyKey?: string; signal?: AbortSignal } = {}): Promise<Response> {
    const extra: Record<string, string> = options.idempotencyKey
      ? { 'idempotency-key': options.idempotencyKey }
      : {};
    return this.send(this.svc.path, {
      method: 'POST',
      headers: bearer(this.key, extra),
      body: JSON.stringify(this.svc.body()),
      signal: options.signal,
    });
  }

  /**
   * The running request's id, as the contract lets its caller learn it: a stream's first chunk, or
   * for a call that answers only at its end, the 409 request_in_progress of the same call repeated
   * with the same Idempotency-Key.
   */
  async runningId(response: Promise<Response>, idempotencyKey?: string): Promise<RunningRequest> {
    if (this.svc.stream) {
      const started = await response;
      expect(started.status).toBe(200);
      const reader = new SseReader(started);
      const first = JSON.parse((await reader.next())!);
      expect(started.headers.get('x-request-id')).toBe(first.id);
      return { id: first.id, reader };
    }
    if (idempotencyKey === undefined) throw new Error('a non-stream call is found by its key');
    const probe = await this.post({ idempotencyKey });
    const body = (await probe.json()) as any;
    expect({ status: probe.status, code: body.error.code }).toEqual({
      status: 409,
      code: 'request_in_progress',
    });
    expect(probe.headers.get('x-request-id')).toBe(body.request_id);
    return { id: body.request_id, reader: null };
  }

  async record(id: string): Promise<RecordView> {
    const response = await this.send(this.svc.recordPath(id), { headers: bearer(this.key) });
    expect(response.status).toBe(200);
    return this.svc.readRecord(await response.json());
  }

  /**
   * The record once it has left in_progress. The end of a run the client walked away from is seen
   * by nothing but the record itself, so it is read until it changes: each read is a round trip
   * through the gateway, which is what lets the run move on.
   */
  async finishedRecord(id: string): Promise<RecordView> {
    for (;;) {
      const record = await this.record(id);
      if (record.status !== 'in_progress') return record;
    }
  }

  /** The key's balances in µcr. */
  async balances(): Promise<{
    credits: number;
    held: number;
    charged: number;
    credits_added: number;
    token_wallet: number;
  }> {
    const response = await this.send(`/admin/v1/keys/${this.keyId}`, {
      headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
    });
    expect(response.status).toBe(200);
    const { balances } = (await response.json()) as any;
    return {
      credits: micro(balances.credits),
      held: micro(balances.held),
      charged: micro(balances.charged),
      credits_added: micro(balances.credits_added),
      token_wallet: balances.token_wallet,
    };
  }

  /** The ledger after a finished request: nothing held, exactly `chargedMicro` charged. */
  async expectLedger(chargedMicro: number): Promise<void> {
    expect(await this.balances()).toEqual({
      credits: CREDITS_MICRO - chargedMicro,
      held: 0,
      charged: chargedMicro,
      credits_added: CREDITS_MICRO,
      token_wallet: 0,
    });
  }

  /** The hold a running request placed (there must be one for its release to mean anything). */
  async expectHeld(): Promise<number> {
    const { held, credits, charged } = await this.balances();
    expect(held).toBeGreaterThan(0);
    expect({ credits: credits + held, charged }).toEqual({ credits: CREDITS_MICRO, charged: 0 });
    return held;
  }

  /**
   * /metrics counts exactly one finished request of this service, with this status and code, and
   * none in flight.
   */
  async expectFinishedMetric(status: string, code: string | null): Promise<void> {
    const text = await (await this.send('/metrics')).text();
    const finished = text
      .split('\n')
      .filter(
        (line) =>
          line.startsWith(`tollgate_requests_finished_total{service="${this.svc.service}",`) &&
          !line.endsWith(' 0'),
      );
    expect(finished).toEqual([
      `tollgate_requests_finished_total{service="${this.svc.service}",status="${status}",` +
        `code="${code ?? ''}"} 1`,
    ]);
    expect(text).toContain('\ntollgate_requests_in_flight 0\n');
  }
}

export interface RunningRequest {
  id: string;
  /** A stream's reader, past its first chunk; null for a call that answers at its end. */
  reader: SseReader | null;
}

/** CONTRACT §2: the error type follows the status. */
const TYPE_BY_STATUS: Record<number, string> = {
  499: 'cancelled_error',
  502: 'upstream_error',
  503: 'service_unavailable_error',
  504: 'timeout_error',
};

/**
 * An error answered as HTTP (before any byte of a stream): status, envelope, X-Request-ID (the
 * request's own id when `id` is given) and x-should-retry. Returns the X-Request-ID.
 */
export async function expectHttpError(
  response: Response,
  expected: { status: number; code: string; shouldRetry: boolean; id?: string },
): Promise<string> {
  const body = (await response.json()) as any;
  expect({ status: response.status, error: body.error }).toEqual({
    status: expected.status,
    error: {
      message: expect.any(String),
      type: TYPE_BY_STATUS[expected.status],
      code: expected.code,
      param: null,
    },
  });
  expect(response.headers.get('x-should-retry')).toBe(String(expected.shouldRetry));
  const id = response.headers.get('x-request-id');
  expect(id).toMatch(/^(chatcmpl-|dec_)/);
  if (expected.id) expect(id).toBe(expected.id);
  return id!;
}

/**
 * A stream that ends with one error event of `code` (CONTRACT §2: after HTTP 200 an error is an
 * event, then the end, no [DONE]).
 */
export async function expectStreamError(reader: SseReader, code: string): Promise<void> {
  const events = await reader.rest();
  expect(events).not.toContain('[DONE]');
  const last = JSON.parse(events.at(-1)!);
  expect(last.error.code).toBe(code);
  // Nothing but content chunks before it.
  for (const event of events.slice(0, -1))
    expect(JSON.parse(event).object).toBe('chat.completion.chunk');
}
