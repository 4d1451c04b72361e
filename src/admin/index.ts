// The admin controller (/admin/v1): create, list, read, top up and revoke keys, read the usage
// history, list and cancel live requests, behind the admin token.
import { timingSafeEqual } from 'node:crypto';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import type { ValueErrorIterator } from '@sinclair/typebox/errors';
import { Elysia } from 'elysia';
import type { Gateway } from '../gateway.ts';
import { readBodyText } from '../http/body.ts';
import {
  bearerToken,
  createKey,
  creditKey,
  creditsToMicro,
  findKey,
  keyView,
  revokeKey,
} from '../keys/store.ts';
import { cancelRequest } from '../requests/cancel.ts';
import { GatewayError } from '../util/errors.ts';
import { parseJsonBody } from '../util/json.ts';
import { fieldPath, firstProblem } from '../util/validation.ts';
import { liveRequests } from './live.ts';
import {
  type CreateKeyBody,
  CreateKeySchema,
  type CreditKeyBody,
  CreditKeySchema,
} from './model.ts';
import { readOverview } from './overview.ts';
import { parseUsageQuery, readUsage } from './usage.ts';

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
  const json = parseJsonBody(
    await readBodyText(request, limits.max_body_bytes, limits.request_read_timeout_ms),
    limits.max_body_json_values,
  );
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

// One Elysia chain (long because each route is a stanza of it; split, the chain would lose the
// types Elysia infers along it).
export function adminController(gateway: Gateway) {
  const defaultRpm = gateway.config.limits.default_rate_limit_rpm;
  return new Elysia({ name: 'admin', prefix: '/admin/v1' })
    .onBeforeHandle(({ request }) => {
      checkAdmin(gateway, request.headers.get('authorization'));
      gateway.store.checkAvailable();
    })
    .get('/overview', async () => Response.json(await readOverview(gateway, Date.now())))
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
      { parse: 'none' },
    )
    .get('/keys', () =>
      Response.json({
        object: 'list',
        data: [...gateway.store.state.keys.values()].map((a) => keyView(a, defaultRpm)),
      }),
    )
    .get('/keys/:id', ({ params }) =>
      Response.json(keyView(findKey(gateway.store, params.id), defaultRpm)),
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
      { parse: 'none' },
    )
    .get('/usage', async ({ request }) => {
      const { state } = gateway.store;
      const query = parseUsageQuery(queryOf(request), state, Object.keys(gateway.config.models));
      return Response.json({ object: 'list', data: await readUsage(state, query) });
    })
    .get('/requests', ({ request }) => {
      const wanted = queryOf(request).get('state') ?? 'in_progress';
      if (wanted !== 'in_progress') {
        throw new GatewayError('invalid_request_error', 'state must be in_progress', {
          param: 'state',
        });
      }
      const { state } = gateway.store;
      return Response.json({
        object: 'list',
        data: liveRequests(state, gateway.registry, Date.now()),
      });
    })
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
      { parse: 'none' },
    )
    .post(
      '/keys/:id/revoke',
      async ({ params }) =>
        Response.json(keyView(await revokeKey(gateway.store, params.id), defaultRpm)),
      {
        parse: 'none',
      },
    );
}
