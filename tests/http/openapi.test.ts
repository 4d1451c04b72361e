// GET /openapi.json (CONTRACT §6): a valid OpenAPI 3.1 document of every route the app serves, with
// the error table's codes per route, its request schemas the ones the controllers check.
import { describe, expect, test } from 'bun:test';
import { Validator } from '@seriousme/openapi-schema-validator';
import type { TSchema } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { version } from '../../package.json';
import {
  CreatedKeySchema,
  CreateKeySchema,
  CreditKeySchema,
  listOf,
} from '../../src/admin/model.ts';
import {
  ChatCompletionSchema,
  ChatRequestDocumentSchema,
  ChatRequestStatusSchema,
  ModelListSchema,
} from '../../src/chat/model.ts';
import {
  DecisionLookupSchema,
  DecisionRequestSchema,
  DecisionSchema,
} from '../../src/decision/model.ts';
import { ErrorEnvelopeSchema } from '../../src/http/openapi.ts';
import { KeyViewSchema } from '../../src/keys/model.ts';
import { HealthzSchema, ReadyzSchema } from '../../src/ops/health.ts';
import { CancelAnswerSchema } from '../../src/requests/cancel.ts';
import { ERROR_CODES, type ErrorStatus, TYPE_BY_STATUS } from '../../src/util/errors.ts';
import { ADMIN_TOKEN, bearer, closedAfterEach, type TestGateway } from '../support/gateway.ts';

const t = closedAfterEach();

interface Operation {
  summary?: string;
  tags?: string[];
  security?: Array<Record<string, string[]>>;
  parameters?: Array<Record<string, unknown>>;
  requestBody?: { content: Record<string, { schema: unknown; example?: unknown }> };
  responses?: Record<string, { content?: Record<string, { schema: unknown }> }>;
}

interface Document {
  openapi: string;
  info: { title: string; version: string };
  paths: Record<string, Record<string, Operation>>;
  components: { securitySchemes: Record<string, Record<string, string>> };
}

/** The document as a client gets it: through the app, no auth. */
async function fetchDocument(gateway: TestGateway): Promise<Document> {
  const response = await gateway.app.handle(new Request('http://x/openapi.json'));
  expect(response.status).toBe(200);
  expect(response.headers.get('content-type')).toBe('application/json');
  return (await response.json()) as Document;
}

function operations(document: Document): Array<[string, string, Operation]> {
  return Object.entries(document.paths).flatMap(([path, item]) =>
    Object.entries(item).map(([method, operation]): [string, string, Operation] => [
      method.toUpperCase(),
      path,
      operation,
    ]),
  );
}

/**
 * The routes the app serves (Elysia's own list) that the document does not describe: no
 * operation, or one without a summary, tags, a security decision and a success answer (the
 * generator lists every route, described or not).
 */
function undocumented(gateway: TestGateway, document: Document): string[] {
  const missing: string[] = [];
  for (const route of gateway.app.routes) {
    const path = route.path.replace(/:([^/]+)/g, '{$1}');
    // The document says every path is also served with (or without) its trailing slash: a route
    // whose twin is described is described.
    const twin = path.endsWith('/') ? path.slice(0, -1) : `${path}/`;
    const method = route.method.toLowerCase();
    const operation = document.paths[path]?.[method] ?? document.paths[twin]?.[method];
    const described =
      operation !== undefined &&
      typeof operation.summary === 'string' &&
      (operation.tags?.length ?? 0) > 0 &&
      Array.isArray(operation.security) &&
      Object.keys(operation.responses ?? {}).some((status) => /^2\d\d$/.test(status));
    if (!described) missing.push(`${route.method} ${route.path}`);
  }
  return missing;
}

/** The error answers of an operation: status → [type, codes], read from the document. */
function errorsOf(operation: Operation): Record<string, [unknown, unknown]> {
  const errors: Record<string, [unknown, unknown]> = {};
  for (const [status, answer] of Object.entries(operation.responses ?? {})) {
    if (Number(status) < 400) continue;
    const schema = answer.content?.['application/json']?.schema as
      | { allOf?: Array<Record<string, any>> }
      | undefined;
    if (!schema?.allOf) continue; // a probe's own 503 body, not the envelope
    expect(schema.allOf[0]).toEqual({ $ref: '#/components/schemas/Error' });
    const error = schema.allOf[1]!.properties.error.properties;
    errors[status] = [error.type.const, error.code.enum];
  }
  return errors;
}

const SERVICE_ROUTES = [
  'POST /api/v1/chat/completions',
  'GET /api/v1/models',
  'GET /api/v1/requests/{id}',
  'POST /api/v1/requests/{id}/cancel',
  'POST /decision/v1/decide/',
  'GET /decision/v1/requests/{id}/',
];
const ADMIN_ROUTES = [
  'POST /admin/v1/keys',
  'GET /admin/v1/keys',
  'GET /admin/v1/keys/{id}',
  'POST /admin/v1/keys/{id}/credits',
  'POST /admin/v1/keys/{id}/revoke',
];
const OPEN_ROUTES = ['GET /healthz', 'GET /readyz', 'GET /metrics', 'GET /openapi.json'];

describe('GET /openapi.json', () => {
  test('is served without auth as JSON: OpenAPI 3.1, title tollgate, its version', async () => {
    const document = await fetchDocument(t.gateway());
    expect(document.openapi).toMatch(/^3\.1\.\d+$/);
    expect(document.info.title).toBe('tollgate');
    expect(document.info.version).toBe(version);
  });

  test('is a valid OpenAPI 3.1 document (and the validator does refuse a broken one)', async () => {
    const document = await fetchDocument(t.gateway());
    const validator = new Validator();
    const result = await validator.validate(
      structuredClone(document) as unknown as Record<string, unknown>,
    );
    expect(result.errors ?? []).toEqual([]);
    expect(result.valid).toBe(true);
    expect(validator.version).toBe('3.1');
    // A check that cannot fail proves nothing: an answer without its required description.
    const broken = structuredClone(document);
    delete (broken.paths['/api/v1/models']!.get!.responses!['200'] as Record<string, unknown>)
      .description;
    expect(
      (await new Validator().validate(broken as unknown as Record<string, unknown>)).valid,
    ).toBe(false);
  });

  test('describes every route the app serves, and the contract routes among them', async () => {
    const gateway = t.gateway();
    const document = await fetchDocument(gateway);
    expect(gateway.app.routes.length).toBeGreaterThanOrEqual(15);
    expect(undocumented(gateway, document)).toEqual([]);
    const described = operations(document).map(([method, path]) => `${method} ${path}`);
    for (const route of [...SERVICE_ROUTES, ...ADMIN_ROUTES, ...OPEN_ROUTES])
      expect(described).toContain(route);
  });

  test('operationIds are unique, as OpenAPI requires', async () => {
    // /admin and /admin/ were both getAdmin.
    const document = await fetchDocument(t.gateway());
    const ids = Object.values(document.paths).flatMap((item) =>
      Object.values(item).map((operation) => (operation as { operationId?: string }).operationId),
    );
    expect(ids.every((id) => typeof id === 'string')).toBe(true);
    expect(ids.length).toBeGreaterThanOrEqual(15);
    expect(new Set(ids).size).toBe(ids.length);
  });

  test('a route added without a description is caught', async () => {
    const gateway = t.gateway();
    gateway.app.get('/undocumented/:id', () => 'x');
    const document = await fetchDocument(gateway);
    expect(undocumented(gateway, document)).toEqual(['GET /undocumented/:id']);
  });

  test('every documented operation is served, with and without a trailing slash', async () => {
    const gateway = t.gateway();
    const document = await fetchDocument(gateway);
    const notServed: string[] = [];
    for (const [method, path] of operations(document)) {
      const concrete = path.replace(/\{[^}]+\}/g, 'x1');
      const other = concrete.endsWith('/') ? concrete.slice(0, -1) : `${concrete}/`;
      for (const url of [concrete, other]) {
        // No credentials: a served route answers 401 (or its probe, or its own 404 for an unknown
        // name), the router 404 not_found with "No route".
        const response = await gateway.request(url, { method });
        const text = await response.text();
        if (
          response.status === 404 &&
          text.includes('"code":"not_found"') &&
          text.includes('No route')
        )
          notServed.push(`${method} ${url}`);
      }
    }
    expect(notServed).toEqual([]);
  });

  test('security: an API key for /api and /decision, the admin token for /admin/v1', async () => {
    const document = await fetchDocument(t.gateway());
    expect(document.components.securitySchemes).toEqual({
      apiKey: expect.objectContaining({ type: 'http', scheme: 'bearer' }),
      adminToken: expect.objectContaining({ type: 'http', scheme: 'bearer' }),
    });
    for (const [method, path, operation] of operations(document)) {
      const expected = /^\/(api|decision)\//.test(path)
        ? [{ apiKey: [] }]
        : // The admin API; a page served beside it signs in by itself.
          path.startsWith('/admin/v1/')
          ? [{ adminToken: [] }]
          : [];
      expect(`${method} ${path} ${JSON.stringify(operation.security)}`).toBe(
        `${method} ${path} ${JSON.stringify(expected)}`,
      );
    }
  });
});

describe('error answers', () => {
  test("every route's codes are the error table's, under their status and type", async () => {
    const document = await fetchDocument(t.gateway());
    let checked = 0;
    for (const [method, path, operation] of operations(document)) {
      for (const [status, [type, codes]] of Object.entries(errorsOf(operation))) {
        expect(`${method} ${path} ${status} ${type}`).toBe(
          `${method} ${path} ${status} ${TYPE_BY_STATUS[Number(status) as ErrorStatus]}`,
        );
        for (const code of codes as string[]) {
          expect(Object.keys(ERROR_CODES)).toContain(code);
          expect(`${code} ${ERROR_CODES[code as keyof typeof ERROR_CODES]}`).toBe(
            `${code} ${status}`,
          );
          checked++;
        }
      }
      // A bug is a 500 anywhere.
      expect(errorsOf(operation)['500']).toEqual(['internal_error', ['internal_error']]);
    }
    expect(checked).toBeGreaterThan(60);
  });

  test('chat completions and decide list the codes CONTRACT §2 gives them', async () => {
    const document = await fetchDocument(t.gateway());
    const upstream: Record<string, [string, string[]]> = {
      '499': ['cancelled_error', ['request_cancelled']],
      '500': ['internal_error', ['internal_error']],
      '502': [
        'upstream_error',
        ['upstream_unreachable', 'upstream_invalid_response', 'upstream_error'],
      ],
      '503': ['service_unavailable_error', ['service_unavailable']],
      '504': ['timeout_error', ['upstream_timeout']],
    };
    const idempotency: [string, string[]] = [
      'invalid_request_error',
      ['idempotency_key_reused', 'request_in_progress', 'request_already_completed'],
    ];
    expect(errorsOf(document.paths['/api/v1/chat/completions']!.post!)).toEqual({
      '400': [
        'invalid_request_error',
        [
          'invalid_request_error',
          'unsupported_parameter',
          'invalid_idempotency_key',
          'context_length_exceeded',
        ],
      ],
      '401': ['authentication_error', ['invalid_api_key']],
      '402': ['billing_error', ['insufficient_quota']],
      '404': ['invalid_request_error', ['model_not_found']],
      '409': idempotency,
      '413': ['invalid_request_error', ['request_too_large']],
      '429': ['rate_limit_error', ['rate_limit_exceeded']],
      ...upstream,
      // A stream that reaches stream_timeout_ms before its first byte.
      '504': ['timeout_error', ['upstream_timeout', 'stream_timeout']],
    });
    expect(errorsOf(document.paths['/decision/v1/decide/']!.post!)).toEqual({
      '400': [
        'invalid_request_error',
        // context_length_exceeded: a provider's own, for a model smaller than input_too_large.
        ['invalid_request_error', 'invalid_idempotency_key', 'context_length_exceeded'],
      ],
      '401': ['authentication_error', ['invalid_api_key']],
      '402': ['billing_error', ['insufficient_quota']],
      '404': ['invalid_request_error', ['model_not_found']],
      '409': idempotency,
      '413': ['invalid_request_error', ['request_too_large']],
      '422': ['invalid_request_error', ['input_too_large']],
      '429': ['rate_limit_error', ['rate_limit_exceeded', 'api_key_spend_limit_exceeded']],
      ...upstream,
    });
    expect(errorsOf(document.paths['/api/v1/requests/{id}/cancel']!.post!)).toEqual({
      '401': ['authentication_error', ['invalid_api_key']],
      '404': ['invalid_request_error', ['request_not_found', 'not_found']],
      '409': ['invalid_request_error', ['request_already_completed']],
      '500': ['internal_error', ['internal_error']],
      '503': ['service_unavailable_error', ['service_unavailable']],
    });
  });

  test('the errors the app answers are the envelope, with a code the route documents', async () => {
    const gateway = t.gateway();
    const document = await fetchDocument(gateway);
    const { key } = await gateway.createKey({ credits: 0 });
    const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };
    const cases: Array<[string, string, string, RequestInit]> = [
      ['POST', '/api/v1/chat/completions', '/api/v1/chat/completions', {}],
      [
        'POST',
        '/api/v1/chat/completions',
        '/api/v1/chat/completions',
        {
          headers: bearer(key),
          body: '{"model":',
        },
      ],
      [
        'POST',
        '/api/v1/chat/completions',
        '/api/v1/chat/completions',
        {
          headers: bearer(key),
          body: JSON.stringify({
            model: 'no-such-model',
            messages: [{ role: 'user', content: 'x' }],
          }),
        },
      ],
      [
        'POST',
        '/api/v1/chat/completions',
        '/api/v1/chat/completions',
        {
          headers: bearer(key),
          body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'x' }] }),
        },
      ],
      [
        'GET',
        '/api/v1/requests/{id}',
        '/api/v1/requests/chatcmpl-unknown',
        { headers: bearer(key) },
      ],
      [
        'POST',
        '/decision/v1/decide/',
        '/decision/v1/decide/',
        {
          headers: bearer(key),
          body: JSON.stringify({
            model: 'decision-fast',
            state: 1,
            questions: { q: { type: 'x' } },
          }),
        },
      ],
      [
        'GET',
        '/decision/v1/requests/{id}/',
        '/decision/v1/requests/dec_unknown/',
        {
          headers: bearer(key),
        },
      ],
      ['GET', '/admin/v1/keys', '/admin/v1/keys', {}],
      ['GET', '/admin/v1/keys/{id}', '/admin/v1/keys/key_unknown', { headers: admin }],
      ['POST', '/admin/v1/keys', '/admin/v1/keys', { headers: admin, body: '{"name": 7}' }],
    ];
    const seen: string[] = [];
    for (const [method, documented, url, init] of cases) {
      const response = await gateway.request(url, { method, ...init });
      const body = (await response.json()) as { error: { code: string } };
      expect(Value.Check(ErrorEnvelopeSchema, body)).toBe(true);
      const [type, codes] = errorsOf(document.paths[documented]![method.toLowerCase()]!)[
        String(response.status)
      ] ?? [null, []];
      expect(`${url} ${response.status} ${type}`).toBe(
        `${url} ${response.status} ${TYPE_BY_STATUS[response.status as ErrorStatus]}`,
      );
      expect(codes).toContain(body.error.code);
      seen.push(`${response.status} ${body.error.code}`);
    }
    // The cases reach the statuses they are meant to (a case that silently 200s checks nothing).
    expect(seen).toEqual([
      '401 invalid_api_key',
      '400 invalid_request_error',
      '404 model_not_found',
      '402 insufficient_quota',
      '404 request_not_found',
      '400 invalid_request_error',
      '404 request_not_found',
      '401 invalid_api_key',
      '404 not_found',
      '400 invalid_request_error',
    ]);
  });
});

describe('request bodies', () => {
  /** The documented body schema and example of an operation. */
  function bodyOf(document: Document, method: string, path: string) {
    const content = document.paths[path]![method]!.requestBody!.content['application/json']!;
    return { schema: content.schema, example: content.example };
  }

  test('are the TypeBox schemas the controllers check, and their examples pass them', async () => {
    const document = await fetchDocument(t.gateway());
    const cases = [
      ['post', '/api/v1/chat/completions', ChatRequestDocumentSchema],
      ['post', '/decision/v1/decide/', DecisionRequestSchema],
      ['post', '/admin/v1/keys', CreateKeySchema],
      ['post', '/admin/v1/keys/{id}/credits', CreditKeySchema],
    ] as const;
    for (const [method, path, schema] of cases) {
      const { schema: documented, example } = bodyOf(document, method, path);
      // The same schema, as JSON: what holds for the TypeBox schema holds for the document's.
      expect(documented).toEqual(JSON.parse(JSON.stringify(schema)));
      expect(example).toBeDefined();
      expect(Value.Check(schema, example)).toBe(true);
    }
  });

  test('the chat example is accepted by the app; a body the schema refuses is a 400', async () => {
    const gateway = t.gateway();
    const document = await fetchDocument(gateway);
    const { example } = bodyOf(document, 'post', '/api/v1/chat/completions');
    const { key } = await gateway.createKey({ credits: 1000 });
    const ok = await gateway.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(example),
    });
    expect(ok.status).toBe(200);
    expect(((await ok.json()) as { object: string }).object).toBe('chat.completion');
    // A message of a role no schema of the union has: refused by the document and by the app.
    const robot = { ...(example as object), messages: [{ role: 'robot', content: 'x' }] };
    expect(Value.Check(ChatRequestDocumentSchema, robot)).toBe(false);
    const refused = await gateway.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(robot),
    });
    expect(refused.status).toBe(400);
  });

  test('the decision and admin examples are accepted by the app', async () => {
    const gateway = t.gateway();
    const document = await fetchDocument(gateway);
    const admin = { ...bearer(ADMIN_TOKEN) };
    const created = await gateway.request('/admin/v1/keys', {
      method: 'POST',
      headers: admin,
      body: JSON.stringify(bodyOf(document, 'post', '/admin/v1/keys').example),
    });
    expect(created.status).toBe(201);
    const { id } = (await created.json()) as { id: string };
    const credited = await gateway.request(`/admin/v1/keys/${id}/credits`, {
      method: 'POST',
      headers: admin,
      body: JSON.stringify(bodyOf(document, 'post', '/admin/v1/keys/{id}/credits').example),
    });
    expect(credited.status).toBe(200);
    const { key } = await gateway.createKey({ credits: 1000 });
    const decided = await gateway.request('/decision/v1/decide/', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(bodyOf(document, 'post', '/decision/v1/decide/').example),
    });
    expect(decided.status).toBe(200);
  });
});

describe('the success answers in the document', () => {
  /** The documented JSON schema of an operation's answer with `status`. */
  function answerOf(document: Document, method: string, path: string, status: number): unknown {
    return document.paths[path]![method]!.responses![String(status)]!.content!['application/json']!
      .schema;
  }

  test('are the TypeBox schemas the views are typed by; the real answers pass them', async () => {
    const gateway = t.gateway();
    const document = await fetchDocument(gateway);
    const admin = bearer(ADMIN_TOKEN);
    const { id: keyId, key } = await gateway.createKey({ credits: 1000, token_wallet: 0 });
    const call = (path: string, init: RequestInit = {}) => gateway.request(path, init);
    const json = async (response: Response, status: number): Promise<any> => {
      expect(response.status).toBe(status);
      return response.json();
    };
    const chat = (body: unknown) =>
      call('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify(body),
      });
    const completion = await json(
      await chat({ model: 'model_03', messages: [{ role: 'user', content: 'Say hello.' }] }),
      200,
    );
    const toolCompletion = await json(
      await chat({
        model: 'model_03',
        messages: [{ role: 'user', content: 'Weather?' }],
        tools: [
          {
            type: 'function',
            function: {
              name: 'weather',
              parameters: { type: 'object', properties: { city: { type: 'string' } } },
            },
          },
        ],
        tool_choice: 'required',
      }),
      200,
    );
    expect(toolCompletion.choices[0].finish_reason).toBe('tool_calls');
    const decided = await json(
      await call('/decision/v1/decide/', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify(
          document.paths['/decision/v1/decide/']!.post!.requestBody!.content['application/json']!
            .example,
        ),
      }),
      200,
    );
    const created = await json(
      await call('/admin/v1/keys', {
        method: 'POST',
        headers: admin,
        body: JSON.stringify({ name: 'doc', credits: 5 }),
      }),
      201,
    );
    const listed = await json(await call('/admin/v1/keys', { headers: admin }), 200);
    const cases: Array<[string, string, number, TSchema, unknown]> = [
      ['post', '/api/v1/chat/completions', 200, ChatCompletionSchema, completion],
      ['post', '/api/v1/chat/completions', 200, ChatCompletionSchema, toolCompletion],
      [
        'get',
        '/api/v1/models',
        200,
        ModelListSchema,
        await json(await call('/api/v1/models', { headers: bearer(key) }), 200),
      ],
      [
        'get',
        '/api/v1/requests/{id}',
        200,
        ChatRequestStatusSchema,
        await json(await call(`/api/v1/requests/${completion.id}`, { headers: bearer(key) }), 200),
      ],
      ['post', '/decision/v1/decide/', 200, DecisionSchema, decided],
      [
        'get',
        '/decision/v1/requests/{id}/',
        200,
        DecisionLookupSchema,
        await json(
          await call(`/decision/v1/requests/${decided.id}/`, { headers: bearer(key) }),
          200,
        ),
      ],
      ['post', '/admin/v1/keys', 201, CreatedKeySchema, created],
      ['get', '/admin/v1/keys', 200, listOf(KeyViewSchema), listed],
      [
        'get',
        '/admin/v1/keys/{id}',
        200,
        KeyViewSchema,
        await json(await call(`/admin/v1/keys/${keyId}`, { headers: admin }), 200),
      ],
      [
        'post',
        '/admin/v1/keys/{id}/credits',
        200,
        KeyViewSchema,
        await json(
          await call(`/admin/v1/keys/${created.id}/credits`, {
            method: 'POST',
            headers: admin,
            body: JSON.stringify({ tokens: 10 }),
          }),
          200,
        ),
      ],
      [
        'post',
        '/admin/v1/keys/{id}/revoke',
        200,
        KeyViewSchema,
        await json(
          await call(`/admin/v1/keys/${created.id}/revoke`, { method: 'POST', headers: admin }),
          200,
        ),
      ],
      ['get', '/healthz', 200, HealthzSchema, await json(await call('/healthz'), 200)],
      ['get', '/readyz', 200, ReadyzSchema, await json(await call('/readyz'), 200)],
    ];
    for (const [method, path, status, schema, answer] of cases) {
      // The same schema, as JSON: what holds for the TypeBox schema holds for the document's.
      expect({ path, documented: answerOf(document, method, path, status) }).toEqual({
        path,
        documented: JSON.parse(JSON.stringify(schema)),
      });
      expect({ path, errors: [...Value.Errors(schema, answer)].map((e) => e.path) }).toEqual({
        path,
        errors: [],
      });
      // Nothing undocumented either: what the schema does not name, Clean removes.
      expect({ path, answer: Value.Clean(schema, structuredClone(answer)) }).toEqual({
        path,
        answer,
      });
    }
  });

  test("an upstream's tool call passes the documented completion, whatever its name", async () => {
    // What a provider says is relayed as it is; the request's bounds on a tool call (a client
    // sending one back) do not bound the answer.
    for (const [name, id] of [
      ['n'.repeat(100), 'call_1'],
      ['weather', 'c'.repeat(300)],
    ]) {
      const upstream = t.track(
        Bun.serve({
          port: 0,
          hostname: '127.0.0.1',
          async fetch(request) {
            await request.text();
            const call = { id, type: 'function', function: { name, arguments: '{}' } };
            return Response.json({
              id: 'up',
              object: 'chat.completion',
              created: 0,
              model: 'up',
              choices: [
                {
                  index: 0,
                  message: { role: 'assistant', content: null, tool_calls: [call] },
                  finish_reason: 'tool_calls',
                },
              ],
              usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 },
            });
          },
        }),
      );
      const gateway = t.gateway({
        providers: { fake: { type: 'openai', base_url: `http://127.0.0.1:${upstream.port}` } },
        models: { model_03: { provider: 'fake', upstream_model: 'up' } },
      });
      const { key } = await gateway.createKey({ credits: 10 });
      const response = await gateway.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'x' }] }),
      });
      expect(response.status).toBe(200);
      const body = (await response.json()) as any;
      expect(body.choices[0].message.tool_calls[0].function.name).toBe(name);
      expect([...Value.Errors(ChatCompletionSchema, body)].map((e) => e.path)).toEqual([]);
    }
  });

  test("a cancel answers the documented 202, the key's own and the admin's", async () => {
    const gateway = t.gateway({
      providers: { simulator: { type: 'simulator', ttft_ms: 60_000 } },
    });
    const document = await fetchDocument(gateway);
    const { key } = await gateway.createKey({ credits: 1000 });
    for (const [path, headers] of [
      ['/api/v1/requests/{id}/cancel', bearer(key)],
      ['/admin/v1/requests/{id}/cancel', bearer(ADMIN_TOKEN)],
    ] as const) {
      const running = gateway.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'x' }] }),
      });
      let id: string | undefined;
      while (id === undefined) {
        const live = await gateway.request('/admin/v1/requests?state=in_progress', {
          headers: bearer(ADMIN_TOKEN),
        });
        id = ((await live.json()) as { data: Array<{ id: string }> }).data[0]?.id;
      }
      const cancelled = await gateway.request(path.replace('{id}', id), {
        method: 'POST',
        headers,
      });
      expect(cancelled.status).toBe(202);
      const answer = await cancelled.json();
      expect(answerOf(document, 'post', path, 202)).toEqual(
        JSON.parse(JSON.stringify(CancelAnswerSchema)),
      );
      expect([...Value.Errors(CancelAnswerSchema, answer)]).toEqual([]);
      expect(Value.Clean(CancelAnswerSchema, structuredClone(answer))).toEqual(answer);
      expect((await running).status).toBe(499);
    }
  });
});

test('no documentation UI is served (it would load scripts from a CDN)', async () => {
  const gateway = t.gateway();
  for (const path of ['/openapi', '/swagger', '/openapi/json'])
    expect((await gateway.request(path)).status).toBe(404);
});
