// The OpenAPI 3.1 document, GET /openapi.json: how a route describes itself (`describeRoute`, kept
// in the route's own `detail`), and the route that assembles the document from the app's routes.
import { type TSchema, Type } from '@sinclair/typebox';
import { type AnyElysia, Elysia } from 'elysia';
import { version } from '../../package.json';
import { IDEMPOTENCY_KEY_RE } from '../idempotency/store.ts';
import { RequestStatusSchema } from '../state/events.ts';
import { ERROR_CODES, type ErrorCode, type ErrorStatus, TYPE_BY_STATUS } from '../util/errors.ts';

export const OPENAPI_PATH = '/openapi.json';

const ERROR_REF = '#/components/schemas/Error';

const HEADER_REFS = {
  requestId: '#/components/headers/X-Request-ID',
  shouldRetry: '#/components/headers/X-Should-Retry',
  retryAfter: '#/components/headers/Retry-After',
  serviceRequestStatus: '#/components/headers/X-Service-Request-Status',
} as const;

/**
 * The envelope of every error (CONTRACT §2), as `errorBody` (http/errors.ts) renders it: one
 * component that each error answer narrows to its status's type and codes.
 */
export const ErrorEnvelopeSchema = Type.Object(
  {
    error: Type.Object({
      message: Type.String({ description: 'For logs; clients branch on `code`.' }),
      type: Type.Union(
        [...new Set(Object.values(TYPE_BY_STATUS))].map((type) => Type.Literal(type)),
        { description: 'Follows the status.' },
      ),
      code: Type.Union(
        Object.keys(ERROR_CODES).map((code) => Type.Literal(code)),
        { description: 'What clients branch on.' },
      ),
      param: Type.Union([Type.String(), Type.Null()], {
        description: 'The field the error is about, e.g. `messages[2].tool_call_id`.',
      }),
      detail: Type.Optional(
        Type.String({
          description:
            'Decision service only: what in the request is wrong (the question and the shape it ' +
            'expected, the JSON, the header, the model); never infrastructure.',
        }),
      ),
      reason: Type.Optional(
        Type.String({ description: 'invalid_api_key: missing, unknown, revoked or wrong_type.' }),
      ),
      reset_at: Type.Optional(
        Type.String({
          format: 'date-time',
          description: 'api_key_spend_limit_exceeded: when the daily budget resets (00:00 UTC).',
        }),
      ),
    }),
    request_id: Type.Optional(
      Type.String({ description: '409 request_in_progress and request_already_completed.' }),
    ),
    request_status: Type.Optional(RequestStatusSchema),
    status_url: Type.Optional(Type.String()),
  },
  { description: 'Every error: `{"error": {message, type, code, param}}` (CONTRACT §2).' },
);

export type RouteAuth = 'api_key' | 'admin_token' | 'none';
export type RouteTag = 'chat' | 'decision' | 'admin' | 'operations';

const SECURITY: Record<RouteAuth, Array<Record<string, string[]>>> = {
  api_key: [{ apiKey: [] }],
  admin_token: [{ adminToken: [] }],
  none: [],
};

/** An answer other than an error. */
export interface AnswerDoc {
  description: string;
  /** Media type → the JSON Schema of the body (`{}` when its shape is only described in words). */
  content?: Record<string, TSchema | Record<string, unknown>>;
  /** Carries `X-Request-ID` (CONTRACT §4 and §5). */
  requestId?: boolean;
}

export interface RouteDoc {
  summary: string;
  description?: string;
  tag: RouteTag;
  auth: RouteAuth;
  /**
   * The JSON body, for the document only: the controllers read and check bodies themselves (their
   * bounds and §8's messages), so this is never handed to Elysia as `body`, which would validate.
   */
  body?: TSchema;
  /** An example body (tests check it against `body` and send it). */
  example?: unknown;
  /** Takes the Idempotency-Key header (CONTRACT §4). */
  idempotencyKey?: boolean;
  /** Query parameters, by name (checked by the controller, like bodies). */
  query?: Readonly<Record<string, { description: string; required?: boolean; schema: Json }>>;
  /** The answers other than errors, by status. */
  answers: Readonly<Record<number, AnswerDoc>>;
  /**
   * Every error code the route answers with. Statuses and types come from the error table
   * (util/errors.ts); internal_error (500, a bug) is added to every route.
   */
  errors: readonly ErrorCode[];
}

type Json = Record<string, unknown>;

/**
 * Where a route's `detail` keeps its description until the document is built: the generator copies
 * `detail` into the route's operation, where `describedOperation` expands it (JSON drops a symbol).
 * Kept as given, so that a gateway never asked for its document builds none of it.
 */
const ROUTE_DOC = Symbol('tollgate.routeDoc');

/** A route's `detail` (Elysia keeps it for documents and never acts on it). */
export function describeRoute(doc: RouteDoc): { summary: string; [ROUTE_DOC]: RouteDoc } {
  return { summary: doc.summary, [ROUTE_DOC]: doc };
}

/**
 * The generator's operation (its operationId and path parameters) with the route's description;
 * an operation whose route has none is left as it is (tests/http/openapi.test.ts catches it).
 */
function describedOperation(operation: Json & { [ROUTE_DOC]?: RouteDoc }): Json {
  const doc = operation[ROUTE_DOC];
  if (doc === undefined) return operation;
  const { [ROUTE_DOC]: _, parameters, ...generated } = operation;
  const responses: Record<string, Json> = {};
  for (const [status, answer] of Object.entries(doc.answers)) {
    responses[status] = {
      description: answer.description,
      ...(answer.requestId ? { headers: { 'X-Request-ID': { $ref: HEADER_REFS.requestId } } } : {}),
      ...(answer.content
        ? {
            content: Object.fromEntries(
              Object.entries(answer.content).map(([type, schema]) => [type, { schema }]),
            ),
          }
        : {}),
    };
  }
  Object.assign(responses, errorAnswers([...doc.errors, 'internal_error']));
  const headerParameters = doc.idempotencyKey
    ? [{ $ref: '#/components/parameters/IdempotencyKey' }]
    : [];
  const queryParameters = Object.entries(doc.query ?? {}).map(([name, parameter]) => ({
    name,
    in: 'query',
    required: parameter.required ?? false,
    description: parameter.description,
    schema: parameter.schema,
  }));
  const allParameters = [
    ...((parameters as Json[] | undefined) ?? []),
    ...headerParameters,
    ...queryParameters,
  ];
  return {
    ...generated,
    summary: doc.summary,
    ...(doc.description ? { description: doc.description } : {}),
    tags: [doc.tag],
    security: SECURITY[doc.auth],
    ...(allParameters.length > 0 ? { parameters: allParameters } : {}),
    ...(doc.body
      ? {
          requestBody: {
            required: true,
            content: {
              'application/json': {
                schema: doc.body,
                ...(doc.example === undefined ? {} : { example: doc.example }),
              },
            },
          },
        }
      : {}),
    responses,
  };
}

/**
 * One answer per status among `codes`: the envelope, its `type` fixed by the status and its `code`
 * one of the route's codes of that status.
 */
function errorAnswers(codes: readonly ErrorCode[]): Record<string, Json> {
  const byStatus = new Map<ErrorStatus, ErrorCode[]>();
  for (const code of new Set(codes)) {
    const status = ERROR_CODES[code];
    byStatus.set(status, [...(byStatus.get(status) ?? []), code]);
  }
  const answers: Record<string, Json> = {};
  for (const [status, list] of [...byStatus].sort(([a], [b]) => a - b)) {
    const type = TYPE_BY_STATUS[status];
    const headers: Record<string, Json> = {
      'X-Request-ID': { $ref: HEADER_REFS.requestId },
      'x-should-retry': { $ref: HEADER_REFS.shouldRetry },
    };
    if (list.includes('rate_limit_exceeded'))
      headers['Retry-After'] = { $ref: HEADER_REFS.retryAfter };
    if (list.includes('request_in_progress') || list.includes('request_already_completed'))
      headers['X-Service-Request-Status'] = { $ref: HEADER_REFS.serviceRequestStatus };
    answers[status] = {
      description: `type ${type}; code ${list.join(', ')}`,
      headers,
      content: {
        'application/json': {
          schema: {
            allOf: [
              { $ref: ERROR_REF },
              {
                type: 'object',
                properties: {
                  error: {
                    type: 'object',
                    properties: { type: { const: type }, code: { type: 'string', enum: list } },
                  },
                },
              },
            ],
          },
        },
      },
    };
  }
  return answers;
}

/** What the whole document shares: the envelope, the two bearer schemes, the common headers. */
function components(): Json {
  return {
    schemas: { Error: ErrorEnvelopeSchema },
    securitySchemes: {
      apiKey: {
        type: 'http',
        scheme: 'bearer',
        description: 'An API key (`tg-…`) for the chat or the decision service (/api, /decision).',
      },
      adminToken: {
        type: 'http',
        scheme: 'bearer',
        description: 'The admin token: ADMIN_TOKEN, or the file DATA_DIR/admin-token (/admin).',
      },
    },
    parameters: {
      IdempotencyKey: {
        name: 'Idempotency-Key',
        in: 'header',
        required: false,
        description:
          'Binds the request to this key while it runs and for idempotency_ttl_s after it ' +
          'ends: a repeat with the same content answers 409 with the original request, never ' +
          'a second charge.',
        schema: { type: 'string', pattern: IDEMPOTENCY_KEY_RE.source },
      },
    },
    headers: {
      'X-Request-ID': {
        description: 'The id of the request (chatcmpl-…, dec_…, or req_… for a refusal).',
        schema: { type: 'string' },
      },
      'X-Should-Retry': {
        description: 'Whether retrying the same request may succeed (CONTRACT §8).',
        schema: { type: 'string', enum: ['true', 'false'] },
      },
      'Retry-After': {
        description: 'Whole seconds until the key may send again (at least 1).',
        schema: { type: 'integer', minimum: 1 },
      },
      'X-Service-Request-Status': {
        description: 'The status URL of the original request.',
        schema: { type: 'string' },
      },
    },
  };
}

const TAGS = [
  { name: 'chat', description: 'OpenAI-compatible chat completions (/api/v1), API key auth.' },
  { name: 'decision', description: 'The decision endpoint (/decision/v1), API key auth.' },
  { name: 'admin', description: 'Keys and credits (/admin/v1), admin token auth.' },
  { name: 'operations', description: 'Probes, metrics and this document; no auth.' },
];

/**
 * The document of every route of the app `plugin` is mounted in (Elysia gives a mounted plugin its
 * parent's routes). The generator is loaded here, on the first request for the document, so that
 * a gateway that is never asked for it pays nothing at start.
 */
async function buildDocument(plugin: AnyElysia): Promise<Json> {
  const { toOpenAPISchema } = await import('@elysiajs/openapi/openapi');
  // staticFile off: the generator would otherwise skip every path with a dot, this one included.
  const generated = toOpenAPISchema(plugin, { staticFile: false }).paths as Record<string, Json>;
  const paths = Object.fromEntries(
    Object.entries(generated).map(([path, item]) => [
      path,
      Object.fromEntries(
        Object.entries(item).map(([method, operation]) => [
          method,
          describedOperation(operation as Json),
        ]),
      ),
    ]),
  );
  return {
    openapi: '3.1.1',
    info: {
      title: 'tollgate',
      version,
      description:
        'A self-hosted, OpenAI-compatible LLM gateway that bills API keys in credits. Every ' +
        'path is also served with (or without) a trailing slash. Every error is the envelope ' +
        '`Error`; clients branch on its `code`.',
    },
    tags: TAGS,
    paths,
    components: components(),
  };
}

/**
 * GET /openapi.json. No auth, on purpose: the document describes the routes, it exposes no key,
 * balance or request. It is built on the first request and kept (the routes are fixed once the app
 * is built); no UI page is served, so nothing is loaded from a CDN.
 */
export function openapiController() {
  const plugin = new Elysia({ name: 'openapi' });
  let text: Promise<string> | null = null;
  return plugin.get(
    OPENAPI_PATH,
    async () => {
      // A failed build (a bug) is not kept: the next request tries again.
      text ??= buildDocument(plugin).then(
        (document) => JSON.stringify(document),
        (error) => {
          text = null;
          throw error;
        },
      );
      return new Response(await text, { headers: { 'content-type': 'application/json' } });
    },
    {
      detail: describeRoute({
        summary: 'This document: the OpenAPI 3.1 description of every route',
        tag: 'operations',
        auth: 'none',
        answers: { 200: { description: 'The document.', content: { 'application/json': {} } } },
        errors: [],
      }),
    },
  );
}
