// The chat controller (/api/v1): completions (JSON and SSE), models, request status and cancel.
import { Elysia } from 'elysia';
import { measureChat } from '../billing/offload.ts';
import { statusUrl, type Gateway } from '../gateway.ts';
import { parseJsonBody, readBodyText } from '../http/body.ts';
import { asGatewayError, errorResponse, GatewayError } from '../http/errors.ts';
import { nativePost, type NativeRoutes } from '../http/routes.ts';
import { parseIdempotencyKey } from '../idempotency/store.ts';
import { authenticate, microToCredits } from '../keys/store.ts';
import type { RequestRecord } from '../state/apply.ts';
import { newChatRequestId } from '../util/ids.ts';
import { validateChatRequest } from './model.ts';
import { admitChat, runChat, type ChatResult, type ChatSink } from './service.ts';
import { ChunkEncoder, completionBody, DONE_FRAME, errorFrame } from './stream.ts';

const PREFIX = '/api/v1';
const COMPLETIONS_ROUTE = '/chat/completions';
const COMPLETIONS_PATH = PREFIX + COMPLETIONS_ROUTE;
const JSON_HEADERS = { 'content-type': 'application/json' };
/** Bytes a slow reader may leave queued before the run loop waits (backpressure). */
const STREAM_QUEUE_BYTES_MAX = 64 * 1024;
const ENCODER = new TextEncoder();

/**
 * Relays a stream as SSE. `opened` resolves when the first output is ready (then the caller answers
 * 200 with `body`), or with the error when the run failed before any output (then a plain error reply).
 *
 * Frames are gathered as text and handed to the response once per event-loop turn: the deltas of one
 * upstream read become one encode and one socket write instead of one each, and every frame is still
 * its own SSE event. A slow reader is felt through the stream's byte budget (backpressure).
 */
class SseSink implements ChatSink {
  readonly opened = Promise.withResolvers<GatewayError | null>();
  readonly body: ReadableStream<Uint8Array>;
  private controller!: ReadableStreamDefaultController<Uint8Array>;
  private wake: (() => void) | null = null;
  private closed = false;
  private started = false;
  /** Frames not yet handed to the response. */
  private pending = '';
  private flushQueued = false;
  private readonly flushQueuedFrames = (): void => {
    this.flushQueued = false;
    this.flush();
  };

  constructor(
    private readonly encoder: ChunkEncoder,
    onCancel: () => void,
  ) {
    this.body = new ReadableStream<Uint8Array>(
      {
        start: (controller) => {
          this.controller = controller;
        },
        pull: () => this.resume(),
        cancel: () => {
          this.closed = true;
          this.pending = '';
          this.resume();
          onCancel();
        },
      },
      { highWaterMark: STREAM_QUEUE_BYTES_MAX, size: (chunk) => chunk?.byteLength ?? 0 },
    );
  }

  private resume(): void {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }

  private flush(): void {
    if (this.closed || this.pending.length === 0) return;
    const bytes = ENCODER.encode(this.pending);
    this.pending = '';
    this.controller.enqueue(bytes);
  }

  private write(frame: string): void | Promise<void> {
    if (this.closed) return;
    this.pending += frame;
    if (!this.flushQueued) {
      this.flushQueued = true;
      setImmediate(this.flushQueuedFrames);
    }
    // Frames are mostly ASCII JSON, so their length stands for their bytes here.
    if ((this.controller.desiredSize ?? 1) - this.pending.length > 0) return;
    this.flush();
    if ((this.controller.desiredSize ?? 1) > 0) return;
    return new Promise<void>((resolve) => (this.wake = resolve));
  }

  begin(): void | Promise<void> {
    this.started = true;
    this.opened.resolve(null);
    return this.write(this.encoder.role());
  }

  text(text: string): void | Promise<void> {
    return this.write(this.encoder.text(text));
  }

  toolCall(index: number, id: string | null, name: string | null, args: string): void | Promise<void> {
    return this.write(this.encoder.toolCall(index, id, name, args));
  }

  end(result: ChatResult): void {
    if (!this.started) {
      this.opened.resolve(result.ok ? null : result.error);
      if (!result.ok) return;
    }
    if (this.closed) return;
    this.pending += result.ok
      ? this.encoder.finish(result.finishReason) + this.encoder.usage(result.usage) + DONE_FRAME
      : errorFrame(result.error);
    this.flush();
    this.closed = true;
    this.controller.close();
  }
}

async function completions(gateway: Gateway, request: Request): Promise<Response> {
  const requestId = newChatRequestId();
  const idHeader = { 'x-request-id': requestId };
  try {
    if (gateway.draining) throw new GatewayError('service_unavailable', 'The gateway is shutting down; retry shortly.');
    const unavailable = gateway.store.unavailableReason;
    if (unavailable) throw new GatewayError('service_unavailable', 'The gateway cannot record requests right now; retry later.');
    const text = await readBodyText(request, gateway.config.limits.max_body_bytes);
    const account = authenticate(gateway.store, request.headers.get('authorization'), 'chat');
    const json = parseJsonBody(text);
    const chat = validateChatRequest(json, gateway.config);
    const idempotencyKey = parseIdempotencyKey(request.headers.get('idempotency-key'));
    // Fingerprinted and counted before admission so that admission itself stays synchronous (check and
    // bind are atomic): here for a small request, off the event loop for a large one (CONTRACT §8).
    // Past the model's window the count may stop early (the request is refused either way).
    const measuring = measureChat(gateway, account, chat, text, json, idempotencyKey, COMPLETIONS_PATH, request.signal);
    const { idempotency, promptTokens } = measuring instanceof Promise ? await measuring : measuring;
    const admission = admitChat(gateway, account, requestId, chat, idempotency, promptTokens);
    const { actor } = admission;
    if (idempotency) {
      // A request with an Idempotency-Key must not reach the provider before its binding is durable.
      await admission.durable;
    }
    // The actor listens itself (handleEvent: the client went away). Never removed: once the actor is
    // over, abort() is a no-op, and both die with the request.
    const clientSignal = request.signal;
    clientSignal.addEventListener('abort', actor);
    // A client that left while the body was read or the binding became durable is gone already.
    if (clientSignal.aborted) actor.abort('disconnected');

    if (chat.stream) {
      const sink = new SseSink(new ChunkEncoder(requestId, admission.createdS, chat.modelId), () => actor.abort('disconnected'));
      void runChat(gateway, admission, chat, sink);
      const early = await sink.opened.promise;
      if (early) return errorResponse(early, idHeader, holdKept(gateway, requestId));
      return new Response(sink.body, {
        status: 200,
        headers: { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive', 'x-request-id': requestId },
      });
    }
    const result = await runChat(gateway, admission, chat, null);
    if (!result.ok) return errorResponse(result.error, idHeader, holdKept(gateway, requestId));
    const body = completionBody(requestId, admission.createdS, chat.modelId, result.content, result.toolCalls, result.finishReason, result.usage);
    return new Response(JSON.stringify(body), { status: 200, headers: { 'content-type': 'application/json', 'x-request-id': requestId } });
  } catch (thrown) {
    const error = asGatewayError(gateway, thrown, requestId);
    if (error.settleFirst) await error.settleFirst;
    gateway.metrics.requestRefused('chat', error.code);
    return errorResponse(error, idHeader);
  }
}

/** Whether the finished request `id` was charged although it failed (its hold kept under on_error "keep"). */
function holdKept(gateway: Gateway, id: string): boolean {
  return (gateway.store.state.request(id)?.charge.credits_micro ?? 0) > 0;
}

function statusView(gateway: Gateway, record: RequestRecord): Record<string, unknown> {
  return {
    object: 'request.status',
    request_id: record.id,
    request_status: record.status,
    status_url: statusUrl(gateway.config, 'chat', record.id),
    model: record.model,
    stream: record.stream,
    created: Math.floor(record.createdAtMs / 1000),
    finished: record.finishedAtMs === null ? null : Math.floor(record.finishedAtMs / 1000),
    usage: record.usage,
    reserved_credits: microToCredits(record.hold.credits_micro),
    charged_credits: microToCredits(record.charge.credits_micro),
    error_code: record.errorCode,
  };
}

/** The caller's own chat request, or 404 (another key's id is not revealed). */
function ownRecord(gateway: Gateway, keyId: string, id: string): RequestRecord {
  const record = gateway.store.state.request(id);
  if (!record || record.keyId !== keyId || record.service !== 'chat') {
    throw new GatewayError('request_not_found', `No request ${id} for this API key.`, { param: null });
  }
  return record;
}

/** How long a cancel waits for the provider to stop and the hold to be released before it answers. */
const CANCEL_SETTLE_MS_MAX = 2_000;

/**
 * The completions endpoint for Bun's own router (server.ts): the busiest route skips Elysia's router and
 * request context. It is the same function as the Elysia route below, which `app.handle` (the tests) uses.
 */
export function chatNativeRoutes(gateway: Gateway): NativeRoutes {
  return nativePost(COMPLETIONS_PATH, (request) => completions(gateway, request));
}

export function chatController(gateway: Gateway) {
  const { config } = gateway;
  return new Elysia({ name: 'chat', prefix: PREFIX })
    .post(COMPLETIONS_ROUTE, ({ request }) => completions(gateway, request), { parse: 'none' })
    .get('/models', ({ request }) => {
      authenticate(gateway.store, request.headers.get('authorization'), 'chat');
      const data = Object.entries(config.models).map(([id, model]) => ({ id, object: 'model', created: model.created, owned_by: model.provider }));
      return Response.json({ object: 'list', data });
    })
    .get('/requests/:id', async ({ request, params }) => {
      const account = authenticate(gateway.store, request.headers.get('authorization'), 'chat');
      gateway.store.checkAvailable();
      ownRecord(gateway, account.id, params.id);
      // Memory may be ahead of the disk by one commit; report only what a crash cannot take back.
      await gateway.registry.get(params.id)?.durable;
      return Response.json(statusView(gateway, ownRecord(gateway, account.id, params.id)));
    })
    .post(
      '/requests/:id/cancel',
      async ({ request, params }) => {
        const account = authenticate(gateway.store, request.headers.get('authorization'), 'chat');
        gateway.store.checkAvailable();
        const record = ownRecord(gateway, account.id, params.id);
        const url = statusUrl(config, 'chat', record.id);
        const actor = gateway.registry.get(record.id);
        if (record.status !== 'in_progress' || !actor || !actor.abort('cancelled')) {
          const current = gateway.store.state.request(record.id)?.status ?? record.status;
          if (current !== 'in_progress' || !actor) {
            throw new GatewayError('request_already_completed', `The request ${record.id} has already finished (${current}).`, {
              param: null,
              topLevel: { request_id: record.id, request_status: current, status_url: url },
              headers: { 'x-service-request-status': url, 'x-request-id': record.id },
            });
          }
        }
        // Answer once the provider has stopped and the hold is released, so a status read that follows sees it.
        let timer: ReturnType<typeof setTimeout> | undefined;
        await Promise.race([actor!.settled, new Promise<void>((resolve) => (timer = setTimeout(resolve, CANCEL_SETTLE_MS_MAX)))]);
        clearTimeout(timer);
        const status = gateway.store.state.request(record.id)?.status ?? 'cancelled';
        return new Response(JSON.stringify({ request_id: record.id, cancel_requested: true, request_status: status, status_url: url }), {
          status: 202,
          headers: JSON_HEADERS,
        });
      },
      { parse: 'none' },
    );
}
