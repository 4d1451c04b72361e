// The admin controller (/admin/v1): create, list, read, top up and revoke keys, read the usage
// history, list and cancel live requests, behind the admin token.
import { timingSafeEqual } from 'node:crypto';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import type { ValueErrorIterator } from '@sinclair/typebox/errors';
import { Elysia } from 'elysia';
import type { Gateway } from '../gateway.ts';
import { readBodyText } from '../http/body.ts';
import { describeRoute, type RouteDoc } from '../http/openapi.ts';
import { KeyViewSchema } from '../keys/model.ts';
import {
  bearerToken,
  createKey,
  creditKey,
  creditsToMicro,
  findKey,
  keyView,
  revokeKey,
} from '../keys/store.ts';
import { CancelAnswerSchema, cancelRequest } from '../requests/cancel.ts';
import { GatewayError } from '../util/errors.ts';
import { parseJsonBody } from '../util/json.ts';
import { fieldPath, firstProblem } from '../util/validation.ts';
import { liveRequests } from './live.ts';
import {
  CreatedKeySchema,
  type CreateKeyBody,
  CreateKeySchema,
  type CreditKeyBody,
  CreditKeySchema,
  LiveRequestSchema,
  listOf,
  UsageRowSchema,
} from './model.ts';
import { readOverview } from './overview.ts';
import {
  parseUsageQuery,
  readUsage,
  USAGE_DAYS_MAX,
  USAGE_ROWS_MAX,
  usageModelNames,
} from './usage.ts';

const CreateKeyCheck = TypeCompiler.Compile(CreateKeySchema);
const CreditKeyCheck = TypeCompiler.Compile(CreditKeySchema);

/** The query string's parameters (never `new URL`: an odd Host makes one it refuses). */
function queryOf(request: Request): URLSearchParams {
  const url = request.url;
  const at = url.indexOf('?');
  return new URLSearchParams(at === -1 ? '' : url.slice(at + 1));
}

function checkAdmin(gateway: Gateway, authorization: string | null): void {
  const token = bearerToken(authorization);
  if (token === null) {
    throw new GatewayError(
      'invalid_api_key',
      'Admin calls need Authorization: Bearer <admin token>.',
      { fields: { reason: 'missing' } },
    );
  }
  const given = Buffer.from(token);
  const expected = Buffer.from(gateway.adminToken);
  if (given.length !== expected.length || !timingSafeEqual(given, expected)) {
    throw new GatewayError('invalid_api_key', 'The admin token is not valid.', {
      fields: { reason: 'unknown' },
    });
  }
}

async function readJson<T>(
  gateway: Gateway,
  request: Request,
  check: { Check(v: unknown): v is T; Errors(v: unknown): ValueErrorIterator },
): Promise<T> {
  const { limits } = gateway.config;
  const text = await readBodyText(
    request,
    limits.max_body_bytes,
    limits.request_read_timeout_ms,
    gateway.bodyBudget,
  );
  let json: unknown;
  try {
    json = parseJsonBody(text, limits.max_body_json_values);
  } catch (thrown) {
    // `detail` is the decision service's (CONTRACT §2); the parser names the problem for it.
    throw thrown instanceof GatewayError ? thrown.withoutDetail() : thrown;
  }
  if (!check.Check(json)) {
    // Named field and bound ("rate_limit_rpm must be ≤ 10000000"), never TypeBox's "Expected union
    // value".
    const problem = firstProblem(check.Errors(json));
    const param = problem ? fieldPath(json, problem.segments) || null : null;
    throw new GatewayError(
      'invalid_request_error',
      `${param ?? 'body'} ${problem?.problem ?? 'is not valid'}`,
      { param },
    );
  }
  return json;
}

/** What every admin call may answer before its own work: the token, then a failed log. */
const ADMIN_ERRORS = ['invalid_api_key', 'service_unavailable'] as const;
/** Reading a JSON body: too large, too slow or malformed, or the client gone before it arrived. */
const BODY_ERRORS = ['request_too_large', 'invalid_request_error', 'request_cancelled'] as const;
/** A key named in the path: unknown, or its id not valid percent-encoding. */
const KEY_ID_ERRORS = ['not_found'] as const;

/** The key as the admin API shows it (CONTRACT §6, keyView); never its secret's hash. */
const KEY_VIEW = '`{id, name, services, revoked, created, limits, balances}`, credits as numbers.';

function adminDoc(doc: Omit<RouteDoc, 'tag' | 'auth'>) {
  return describeRoute({ ...doc, tag: 'admin', auth: 'admin_token' });
}

const CREATE_DOC = adminDoc({
  summary: 'Create a key (or import an existing secret as `key`); the secret is shown once',
  body: CreateKeySchema,
  example: { name: 'team-a', services: ['chat'], credits: 100 },
  answers: {
    201: {
      description: `The key with its secret \`key\` (\`tg-…\`): ${KEY_VIEW}`,
      content: { 'application/json': CreatedKeySchema },
    },
  },
  errors: [...ADMIN_ERRORS, ...BODY_ERRORS],
});

const LIST_DOC = adminDoc({
  summary: 'List the keys',
  answers: {
    200: {
      description: `\`{"object": "list", "data": [key]}\`, each key ${KEY_VIEW}`,
      content: { 'application/json': listOf(KeyViewSchema) },
    },
  },
  errors: ADMIN_ERRORS,
});

const READ_DOC = adminDoc({
  summary: 'Read a key, its limits and balances',
  answers: { 200: { description: KEY_VIEW, content: { 'application/json': KeyViewSchema } } },
  errors: [...ADMIN_ERRORS, ...KEY_ID_ERRORS],
});

const CREDIT_DOC = adminDoc({
  summary: 'Top up a key: `{"credits": n}` or `{"tokens": n}` (token wallet)',
  body: CreditKeySchema,
  example: { credits: 50 },
  answers: {
    200: {
      description: `The key after the top-up: ${KEY_VIEW}`,
      content: { 'application/json': KeyViewSchema },
    },
  },
  errors: [...ADMIN_ERRORS, ...KEY_ID_ERRORS, ...BODY_ERRORS],
});

const REVOKE_DOC = adminDoc({
  summary: 'Revoke a key: its calls are refused from now on (401, reason revoked)',
  answers: {
    200: {
      description: `The revoked key: ${KEY_VIEW}`,
      content: { 'application/json': KeyViewSchema },
    },
  },
  errors: [...ADMIN_ERRORS, ...KEY_ID_ERRORS],
});

const DATE = { type: 'string', pattern: '^\\d{4}-\\d{2}-\\d{2}$' };

const OVERVIEW_DOC = adminDoc({
  summary: 'The gateway at a glance, for the dashboard: in flight, event loop, memory, deployments',
  answers: {
    200: {
      description:
        'In-flight requests, event-loop delay, uptime, RSS and heap, and each ' +
        'deployment’s state, failures in a row and attempts',
      content: { 'application/json': {} },
    },
  },
  errors: ADMIN_ERRORS,
});

const USAGE_DOC = adminDoc({
  summary: 'Usage history per UTC day, key and model (sums are the keys’ charged, exactly)',
  query: {
    from: { description: 'First UTC day, YYYY-MM-DD', required: true, schema: DATE },
    to: {
      description: `Last UTC day, YYYY-MM-DD; at most ${USAGE_DAYS_MAX} days from \`from\``,
      required: true,
      schema: DATE,
    },
    key_id: { description: 'Only this key', schema: { type: 'string' } },
    model: { description: 'Only this model', schema: { type: 'string' } },
    group_by: {
      description:
        'Comma-separated dimensions to keep: day, key, model (default all three); the others ' +
        `are summed over. At most ${USAGE_ROWS_MAX} rows.`,
      schema: { type: 'string' },
    },
  },
  answers: {
    200: {
      description:
        '`{"object": "list", "data": [{day, key_id, model, requests, completed, cancelled, ' +
        'errors, prompt_tokens, completion_tokens, charged_credits}]}`, the dimensions not ' +
        'grouped by left out.',
      content: { 'application/json': listOf(UsageRowSchema) },
    },
  },
  errors: [...ADMIN_ERRORS, 'invalid_request_error'],
});

const LIVE_DOC = adminDoc({
  summary: 'The requests running now, oldest first',
  query: {
    state: { description: 'Only `in_progress` (the default)', schema: { enum: ['in_progress'] } },
  },
  answers: {
    200: {
      description:
        '`{"object": "list", "data": [{id, key_id, service, model, stream, created, age_ms, ' +
        'held_credits, attempt}]}`',
      content: { 'application/json': listOf(LiveRequestSchema) },
    },
  },
  errors: [...ADMIN_ERRORS, 'invalid_request_error'],
});

const CANCEL_DOC = adminDoc({
  summary: 'Cancel any running request, as its key’s own cancel does',
  answers: {
    202: {
      description: 'The cancel was done (or the request ended meanwhile).',
      content: { 'application/json': CancelAnswerSchema },
    },
  },
  errors: [...ADMIN_ERRORS, 'request_not_found', 'not_found', 'request_already_completed'],
});

// One Elysia chain (long because each route is a stanza of it; split, the chain would lose the
// types Elysia infers along it).
export function adminController(gateway: Gateway) {
  const defaultRpm = gateway.config.limits.default_rate_limit_rpm;
  const modelNames = usageModelNames(gateway.config);
  return new Elysia({ name: 'admin', prefix: '/admin/v1' })
    .onBeforeHandle(({ request }) => {
      checkAdmin(gateway, request.headers.get('authorization'));
      gateway.store.checkAvailable();
    })
    .get('/overview', async () => Response.json(await readOverview(gateway, Date.now())), {
      detail: OVERVIEW_DOC,
    })
    .post(
      '/keys',
      async ({ request }) => {
        const body = await readJson<CreateKeyBody>(gateway, request, CreateKeyCheck);
        const { account, secret } = await createKey(
          gateway.store,
          {
            name: body.name,
            services: body.services ?? ['chat', 'decision'],
            creditsMicro: creditsToMicro(body.credits ?? 0, 'credits'),
            tokenWallet: body.token_wallet ?? 0,
            dailyDecisionBudgetMicro:
              body.daily_decision_budget === undefined || body.daily_decision_budget === null
                ? null
                : creditsToMicro(body.daily_decision_budget, 'daily_decision_budget'),
            rateLimitRpm: body.rate_limit_rpm ?? null,
            secret: body.key,
          },
          gateway.config.limits.max_keys,
        );
        return new Response(JSON.stringify({ ...keyView(account, defaultRpm), key: secret }), {
          status: 201,
          headers: { 'content-type': 'application/json' },
        });
      },
      { parse: 'none', detail: CREATE_DOC },
    )
    .get(
      '/keys',
      () =>
        Response.json({
          object: 'list',
          data: [...gateway.store.state.keys.values()].map((a) => keyView(a, defaultRpm)),
        }),
      { detail: LIST_DOC },
    )
    .get(
      '/keys/:id',
      ({ params }) => Response.json(keyView(findKey(gateway.store, params.id), defaultRpm)),
      { detail: READ_DOC },
    )
    .post(
      '/keys/:id/credits',
      async ({ request, params }) => {
        findKey(gateway.store, params.id);
        const body = await readJson<CreditKeyBody>(gateway, request, CreditKeyCheck);
        if (body.credits === undefined && body.tokens === undefined) {
          throw new GatewayError('invalid_request_error', 'Send {"credits": n} or {"tokens": n}.', {
            param: 'credits',
          });
        }
        const account = await creditKey(
          gateway.store,
          params.id,
          creditsToMicro(body.credits ?? 0, 'credits'),
          body.tokens ?? 0,
        );
        return Response.json(keyView(account, defaultRpm));
      },
      { parse: 'none', detail: CREDIT_DOC },
    )
    .get(
      '/usage',
      async ({ request }) => {
        const { state } = gateway.store;
        const query = parseUsageQuery(queryOf(request), state, modelNames);
        return Response.json({ object: 'list', data: await readUsage(state, query) });
      },
      { detail: USAGE_DOC },
    )
    .get(
      '/requests',
      async ({ request }) => {
        const wanted = queryOf(request).get('state') ?? 'in_progress';
        if (wanted !== 'in_progress') {
          throw new GatewayError('invalid_request_error', 'state must be in_progress', {
            param: 'state',
          });
        }
        const { store } = gateway;
        const data = liveRequests(store.state, gateway.registry, Date.now());
        // Every request listed is on disk before the list is answered: one the operator saw is
        // still there after a crash, as error/interrupted (CONTRACT §3).
        await store.durableSoFar();
        return Response.json({ object: 'list', data });
      },
      { detail: LIVE_DOC },
    )
    .post(
      '/requests/:id/cancel',
      async ({ params }) => {
        const record = gateway.store.state.request(params.id);
        if (!record)
          throw new GatewayError('request_not_found', `No request ${params.id}.`, { param: null });
        const answer = await cancelRequest(gateway.store, gateway.registry, gateway.config, record);
        return new Response(JSON.stringify(answer), {
          status: 202,
          headers: { 'content-type': 'application/json' },
        });
      },
      { parse: 'none', detail: CANCEL_DOC },
    )
    .post(
      '/keys/:id/revoke',
      async ({ params }) =>
        Response.json(keyView(await revokeKey(gateway.store, params.id), defaultRpm)),
      { parse: 'none', detail: REVOKE_DOC },
    );
}
