// The chat controller (/api/v1): completions (JSON and SSE), models, request status and cancel.
import type { Server } from 'bun';
import { Elysia } from 'elysia';
import type { Gateway } from '../gateway.ts';
import { ServedClient } from '../http/client-connection.ts';
import { errorResponse } from '../http/errors.ts';
import { readRequest, refusalResponse, requestAccount } from '../http/intake.ts';
import { describeRoute } from '../http/openapi.ts';
import { liftIdle, type NativeRoutes, nativePost, settleIdle } from '../http/routes.ts';
import { parseIdempotencyKey } from '../idempotency/store.ts';
import { authenticate, microToCredits } from '../keys/store.ts';
import { attemptView } from '../providers/router.ts';
import { statusUrl } from '../requests/admit.ts';
import { CancelAnswerSchema, cancelRequest } from '../requests/cancel.ts';
import type { RequestRecord } from '../state/records.ts';
import { GatewayError } from '../util/errors.ts';
import { newChatRequestId } from '../util/ids.ts';
import { JSON_MEMBERS_PARSED_MAX, parseJsonBody } from '../util/json.ts';
import { quoted } from '../util/validation.ts';
import { measureChat } from './measure.ts';
import {
  ChatCompletionSchema,
  type ChatRequest,
  ChatRequestDocumentSchema,
  type ChatRequestStatus,
  ChatRequestStatusSchema,
  type Model,
  type ModelList,
  ModelListSchema,
  ModelSchema,
  validateChatRequest,
} from './model.ts';
import { admitChat, type ChatAdmission, runChat } from './service.ts';
import { ChunkEncoder, SseSink } from './sse.ts';
import { completionBody } from './stream.ts';

const PREFIX = '/api/v1';
const COMPLETIONS_ROUTE = '/chat/completions';
const COMPLETIONS_PATH = PREFIX + COMPLETIONS_ROUTE;
const JSON_HEADERS = { 'content-type': 'application/json' };

async function completions(
  gateway: Gateway,
  request: Request,
  server?: Server<unknown>,
): Promise<Response> {
  const requestId = newChatRequestId();
  try {
    const text = await readRequest(gateway, request, 'chat');
    const account = requestAccount(gateway, request, 'chat');
    // Bounded in members too: a body is parsed on the event loop.
    const json = parseJsonBody(
      text,
      gateway.config.limits.max_body_json_values,
      JSON_MEMBERS_PARSED_MAX,
    );
    const chat = validateChatRequest(json, gateway.config);
    const idempotencyKey = parseIdempotencyKey(request.headers.get('idempotency-key'));
    const client = new ServedClient(request, server);
    // Fingerprinted and counted before admission so that admission itself stays synchronous (check
    // and bind are atomic): here for a small request, off the event loop for a large one (CONTRACT
    // §8). Past the model's window the count may stop early (the request is refused either way).
    const measuring = measureChat(
      gateway,
      account,
      chat,
      text,
      json,
      idempotencyKey,
      COMPLETIONS_PATH,
      client,
    );
    const { idempotency, promptTokens } =
      measuring instanceof Promise ? await measuring : measuring;
    const admission = admitChat(
      gateway,
      account,
      requestId,
      chat,
      idempotency,
      promptTokens,
      client,
    );
    if (chat.stream) return streamResponse(gateway, request, server, admission, chat);
    const result = await runChat(gateway, admission, chat, null);
    if (!result.ok) {
      const headers = { 'x-request-id': requestId };
      return errorResponse(result.error, headers, holdKept(gateway, requestId));
    }
    const { value } = result;
    const body = completionBody(
      requestId,
      admission.createdS,
      chat.modelId,
      value.content,
      value.toolCalls,
      value.finishReason,
      value.usage,
    );
    return new Response(JSON.stringify(body), {
      status: 200,
      headers: { 'content-type': 'application/json', 'x-request-id': requestId },
    });
  } catch (thrown) {
    return refusalResponse(gateway, thrown, requestId, 'chat');
  }
}

/**
 * Starts the run of a stream and answers with its body, or with the error that ended it before its
 * first byte (then a plain JSON error, as for a non-stream call).
 */
async function streamResponse(
  gateway: Gateway,
  request: Request,
  server: Server<unknown> | undefined,
  admission: ChatAdmission,
  chat: ChatRequest,
): Promise<Response> {
  const { actor } = admission;
  const requestId = actor.id;
  const { limits } = gateway.config;
  // A stream may be silent between tokens for longer than the read deadline: its connection's
  // idle timer is lifted from here to the stream's end (lifted before the run starts, so its
  // end, which settles it, always comes after).
  liftIdle(request, server, limits.stream_timeout_ms);
  const sink = new SseSink({
    encoder: new ChunkEncoder(requestId, admission.createdS, chat.modelId),
    bufferBytesMax: limits.stream_buffer_bytes,
    signal: actor.signal,
    onCancel: () => actor.abort('disconnected'),
    onEnd: server
      ? (stopped) => settleIdle(request, server, stopped ? 1 : limits.request_read_timeout_ms)
      : undefined,
    deadlineMs: admission.createdMs + limits.stream_timeout_ms,
    ending: gateway.endingStreams,
    id: requestId,
  });
  void runChat(gateway, admission, chat, sink);
  const early = await sink.opened.promise;
  if (early) {
    settleIdle(request, server, limits.request_read_timeout_ms);
    return errorResponse(early, { 'x-request-id': requestId }, holdKept(gateway, requestId));
  }
  return new Response(sink.body, {
    status: 200,
    headers: {
      'content-type': 'text/event-stream',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      'x-request-id': requestId,
    },
  });
}

/**
 * Whether the finished request `id` was charged although it failed (its hold kept under on_error
 * "keep").
 */
function holdKept(gateway: Gateway, id: string): boolean {
  return (gateway.store.state.request(id)?.charge.credits_micro ?? 0) > 0;
}

/** A catalogue model as the list and the retrieve show it (`id` is a catalogue id). */
function modelView(config: Gateway['config'], id: string): Model {
  return {
    id,
    object: 'model',
    created: config.models[id]!.created,
    owned_by: config.models[id]!.provider,
  };
}

function statusView(gateway: Gateway, record: RequestRecord): ChatRequestStatus {
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
    attempts: gateway.registry.attemptsOf(record).map(attemptView),
  };
}

/** The caller's own chat request, or 404 (another key's id is not revealed). */
function ownRecord(gateway: Gateway, keyId: string, id: string): RequestRecord {
  const record = gateway.store.state.request(id);
  if (!record || record.keyId !== keyId || record.service !== 'chat') {
    throw new GatewayError('request_not_found', `No request ${id} for this API key.`, {
      param: null,
    });
  }
  return record;
}

/**
 * The completions endpoint for Bun's own router (server.ts): the busiest route skips Elysia's
 * router and request context. It is the same function as the Elysia route below, which `app.handle`
 * (the tests) uses.
 */
export function chatNativeRoutes(gateway: Gateway): NativeRoutes {
  return nativePost(COMPLETIONS_PATH, (request, server) => completions(gateway, request, server));
}

/** What every call with a chat key may answer before its own checks (CONTRACT §2). */
const KEY_ERRORS = ['invalid_api_key', 'service_unavailable'] as const;

/**
 * The completion's answers, in the contract's check order, then what the run itself may end with
 * (a provider's own 400 included).
 */
const COMPLETION_ERRORS = [
  'request_too_large',
  'invalid_api_key',
  'invalid_request_error',
  'model_not_found',
  'unsupported_parameter',
  'invalid_idempotency_key',
  'idempotency_key_reused',
  'request_in_progress',
  'request_already_completed',
  'rate_limit_exceeded',
  'context_length_exceeded',
  'insufficient_quota',
  'request_cancelled',
  'upstream_unreachable',
  'upstream_invalid_response',
  'upstream_error',
  'upstream_timeout',
  // A stream that reaches stream_timeout_ms before its first byte (failover attempts used it up, or
  // a provider timeout_ms above it) answers a plain 504 with the code its in-stream event has.
  'stream_timeout',
  'service_unavailable',
] as const;

const COMPLETIONS_DOC = describeRoute({
  summary: 'Create a chat completion (JSON, or SSE with `stream: true`)',
  description:
    'OpenAI Chat Completions. Fields not listed are accepted and ignored. A stream sends ' +
    '`chat.completion.chunk` events, a last chunk with `usage`, then `data: [DONE]`; an error ' +
    'after the stream started is one `data: {"error": {...}}` event (e.g. `stream_timeout`) ' +
    'and no `[DONE]`.',
  tag: 'chat',
  auth: 'api_key',
  body: ChatRequestDocumentSchema,
  example: { model: 'model_03', messages: [{ role: 'user', content: 'Say hello.' }] },
  idempotencyKey: true,
  answers: {
    200: {
      description:
        'The completion (`chat.completion`), or with `stream: true` its SSE stream of ' +
        '`chat.completion.chunk` events.',
      content: { 'application/json': ChatCompletionSchema, 'text/event-stream': {} },
      requestId: true,
    },
  },
  errors: COMPLETION_ERRORS,
});

const MODELS_DOC = describeRoute({
  summary: 'List the catalogue models',
  description: '`{"object": "list", "data": [{id, object: "model", created, owned_by}]}`.',
  tag: 'chat',
  auth: 'api_key',
  answers: {
    200: { description: 'The models.', content: { 'application/json': ModelListSchema } },
  },
  errors: KEY_ERRORS,
});

const MODEL_DOC = describeRoute({
  summary: 'Read one catalogue model',
  description:
    '`{id, object: "model", created, owned_by}`, as in the list (what the OpenAI SDK\'s ' +
    '`models.retrieve` reads). An alias is not a model of its own: 404, as an unknown id.',
  tag: 'chat',
  auth: 'api_key',
  answers: {
    200: { description: 'The model.', content: { 'application/json': ModelSchema } },
  },
  errors: [...KEY_ERRORS, 'model_not_found'],
});

const STATUS_DOC = describeRoute({
  summary: "Read the status, usage and charge of one of the key's requests",
  description:
    '`request.status`: request_status (in_progress, completed, cancelled, error), usage, ' +
    'reserved and charged credits, error_code, attempts; never the completion text. Another ' +
    "key's request is 404, as an unknown one.",
  tag: 'chat',
  auth: 'api_key',
  answers: {
    200: {
      description: "The request's status.",
      content: { 'application/json': ChatRequestStatusSchema },
    },
  },
  errors: [...KEY_ERRORS, 'request_not_found', 'not_found'],
});

const CANCEL_DOC = describeRoute({
  summary: "Cancel one of the key's running requests; its hold is released",
  description:
    'The provider call is aborted; the waiting call ends with 499 request_cancelled (or that ' +
    'error event in its stream). A finished request is 409 request_already_completed.',
  tag: 'chat',
  auth: 'api_key',
  answers: {
    202: {
      description: 'The cancel was done (or the request ended meanwhile).',
      content: { 'application/json': CancelAnswerSchema },
    },
  },
  errors: [...KEY_ERRORS, 'request_not_found', 'not_found', 'request_already_completed'],
});

// One Elysia chain (long because each route is a stanza of it; split, the chain would lose the
// types Elysia infers along it).
export function chatController(gateway: Gateway) {
  const { config } = gateway;
  return new Elysia({ name: 'chat', prefix: PREFIX })
    .post(COMPLETIONS_ROUTE, ({ request }) => completions(gateway, request), {
      parse: 'none',
      detail: COMPLETIONS_DOC,
    })
    .get(
      '/models',
      ({ request }) => {
        authenticate(gateway.store, request.headers.get('authorization'), 'chat');
        gateway.store.checkAvailable();
        const list: ModelList = {
          object: 'list',
          data: Object.keys(config.models).map((id) => modelView(config, id)),
        };
        return Response.json(list);
      },
      { detail: MODELS_DOC },
    )
    .get(
      '/models/:id',
      ({ request, params }) => {
        authenticate(gateway.store, request.headers.get('authorization'), 'chat');
        gateway.store.checkAvailable();
        // Own keys only: "__proto__" or "constructor" is just an unknown model.
        if (!Object.hasOwn(config.models, params.id) || !config.models[params.id])
          throw new GatewayError(
            'model_not_found',
            `The model ${quoted(params.id)} does not exist.`,
            { param: null },
          );
        return Response.json(modelView(config, params.id));
      },
      { detail: MODEL_DOC },
    )
    .get(
      '/requests/:id',
      async ({ request, params }) => {
        const account = authenticate(gateway.store, request.headers.get('authorization'), 'chat');
        gateway.store.checkAvailable();
        ownRecord(gateway, account.id, params.id);
        // Memory may be ahead of the disk by one commit; report only what a crash cannot take back
        // (and nothing, should that commit fail).
        await gateway.registry.durable(params.id);
        gateway.store.checkAvailable();
        return Response.json(statusView(gateway, ownRecord(gateway, account.id, params.id)));
      },
      { detail: STATUS_DOC },
    )
    .post(
      '/requests/:id/cancel',
      async ({ request, params }) => {
        const account = authenticate(gateway.store, request.headers.get('authorization'), 'chat');
        gateway.store.checkAvailable();
        const record = ownRecord(gateway, account.id, params.id);
        const answer = await cancelRequest(gateway.store, gateway.registry, config, record);
        return new Response(JSON.stringify(answer), { status: 202, headers: JSON_HEADERS });
      },
      { parse: 'none', detail: CANCEL_DOC },
    );
}
