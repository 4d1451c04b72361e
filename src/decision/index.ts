// The decision controller (/decision/v1): decide, and the lookup of any decision request by its
// dec_ id.
import type { Server } from 'bun';
import { Elysia } from 'elysia';
import { OFFLOAD_BODY_CHARS } from '../billing/offload.ts';
import type { Gateway } from '../gateway.ts';
import { ServedClient } from '../http/client-connection.ts';
import { errorResponse } from '../http/errors.ts';
import { readRequest, refusalResponse, requestAccount } from '../http/intake.ts';
import { describeRoute } from '../http/openapi.ts';
import { type NativeRoutes, nativePost } from '../http/routes.ts';
import { parseIdempotencyKey } from '../idempotency/store.ts';
import { authenticate, microToCredits } from '../keys/store.ts';
import { attemptView } from '../providers/router.ts';
import type { KeyAccount } from '../state/apply.ts';
import type { RequestRecord } from '../state/records.ts';
import { GatewayError } from '../util/errors.ts';
import { newDecisionRequestId } from '../util/ids.ts';
import { parseJsonBody } from '../util/json.ts';
import { type DecisionMeasure, measureDecision, measureLargeDecision } from './measure.ts';
import {
  type DecisionLookup,
  DecisionLookupSchema,
  type DecisionRequest,
  DecisionRequestSchema,
  DecisionSchema,
  type DecisionView,
  validateDecisionRequest,
} from './model.ts';
import { admitDecision, runDecision } from './service.ts';

const PREFIX = '/decision/v1';
/**
 * The decision paths end with a slash as spec 001 spells them, so that the OpenAPI document (made
 * from the routes) names them so; Elysia serves each with and without it.
 */
const DECIDE_ROUTE = '/decide/';
/**
 * The path in Idempotency-Key fingerprints (with its slash: bindings already stored were made with
 * it).
 */
const DECIDE_PATH = PREFIX + DECIDE_ROUTE;
const JSON_HEADERS = { 'content-type': 'application/json' };

async function decide(
  gateway: Gateway,
  request: Request,
  server?: Server<unknown>,
): Promise<Response> {
  const requestId = newDecisionRequestId();
  const idHeader = { 'x-request-id': requestId };
  try {
    const text = await readRequest(gateway, request, 'decision');
    const account = requestAccount(gateway, request, 'decision');
    const client = new ServedClient(request, server);
    const { decision, prepared } = await prepareDecision(gateway, request, client, text, account);
    const admission = admitDecision(
      gateway,
      account,
      requestId,
      decision,
      prepared.idempotency,
      prepared,
      client,
    );
    const result = await runDecision(gateway, admission, decision);
    if (!result.ok) return errorResponse(result.error, idHeader);
    const body: DecisionView = {
      id: requestId,
      object: 'decision',
      created: admission.createdS,
      model: decision.modelName,
      answers: result.value.answers,
      usage: result.value.usage,
      charged: {
        tokens: result.value.charged.tokens,
        credits: microToCredits(result.value.charged.credits_micro),
      },
    };
    return new Response(JSON.stringify(body), {
      status: 200,
      headers: { ...JSON_HEADERS, ...idHeader },
    });
  } catch (thrown) {
    return refusalResponse(gateway, thrown, requestId, 'decision');
  }
}

/**
 * Parses and validates the body, and measures it for admission (fingerprint, prompt, tokens): here
 * for the usual request, off the event loop when the body or its prompt is large (CONTRACT §8).
 */
async function prepareDecision(
  gateway: Gateway,
  request: Request,
  client: ServedClient,
  text: string,
  account: KeyAccount,
): Promise<{ decision: DecisionRequest; prepared: DecisionMeasure }> {
  if (text.length > OFFLOAD_BODY_CHARS) {
    // Parsed, validated, fingerprinted and counted off the event loop, whatever its shape.
    const large = await measureLargeDecision(
      gateway,
      account,
      text,
      DECIDE_PATH,
      request.headers.has('idempotency-key'),
      client.signal,
    );
    const idempotencyKey = parseIdempotencyKey(request.headers.get('idempotency-key'));
    const prepared = {
      idempotency: idempotencyKey ? { key: idempotencyKey, fingerprint: large.fingerprint! } : null,
      prompt: large.prompt,
      promptTokens: large.promptTokens,
    };
    return { decision: large.decision, prepared };
  }
  const json = parseJsonBody(text, gateway.config.limits.max_body_json_values);
  const decision = validateDecisionRequest(json, gateway.config);
  const idempotencyKey = parseIdempotencyKey(request.headers.get('idempotency-key'));
  const measuring = measureDecision(
    gateway,
    account,
    decision,
    json,
    idempotencyKey,
    DECIDE_PATH,
    client,
  );
  return { decision, prepared: measuring instanceof Promise ? await measuring : measuring };
}

function lookupView(gateway: Gateway, record: RequestRecord): DecisionLookup {
  return {
    id: record.id,
    object: 'decision.request',
    status: record.status,
    http_status: record.httpStatus,
    created: Math.floor(record.createdAtMs / 1000),
    finished: record.finishedAtMs === null ? null : Math.floor(record.finishedAtMs / 1000),
    model: record.model,
    error_code: record.errorCode,
    // The log keeps what the decision service answered (its events type them loosely: JSON).
    answers: record.answers as DecisionLookup['answers'],
    usage: record.usage,
    charged: { tokens: record.charge.tokens, credits: microToCredits(record.charge.credits_micro) },
    attempts: gateway.registry.attemptsOf(record).map(attemptView),
  };
}

/**
 * The decide endpoint for Bun's own router (server.ts), like `chatNativeRoutes`: the same function
 * as the Elysia route.
 */
export function decisionNativeRoutes(gateway: Gateway): NativeRoutes {
  // nativePost adds the slash variant itself.
  return nativePost(DECIDE_PATH.slice(0, -1), (request, server) =>
    decide(gateway, request, server),
  );
}

/** The decide endpoint's answers, in the contract's check order, then what the run may end with. */
const DECIDE_ERRORS = [
  'request_too_large',
  'invalid_api_key',
  'invalid_request_error',
  'model_not_found',
  'invalid_idempotency_key',
  'idempotency_key_reused',
  'request_in_progress',
  'request_already_completed',
  'rate_limit_exceeded',
  'input_too_large',
  'api_key_spend_limit_exceeded',
  'insufficient_quota',
  'request_cancelled',
  // A provider that finds the prompt too long for its model (a model smaller than the 32,000
  // tokens input_too_large bounds) says so as a 400.
  'context_length_exceeded',
  'upstream_unreachable',
  'upstream_invalid_response',
  'upstream_error',
  'upstream_timeout',
  'service_unavailable',
] as const;

const DECIDE_DOC = describeRoute({
  summary: 'Answer questions about a state (choice and score questions)',
  description:
    'Charged only on 200, at the actual tokens, from the token wallet or credits; every failure ' +
    'releases the hold. A choice answer is `{type: "choice", label}`, a score answer `{type: ' +
    '"score", score, level}`. Every answer, error or not, carries `X-Request-ID: dec_…`.',
  tag: 'decision',
  auth: 'api_key',
  body: DecisionRequestSchema,
  example: {
    model: 'decision-fast',
    state: { ticket: 'The checkout page returns 500 for every customer.' },
    questions: {
      urgency: {
        type: 'choice',
        prompt: 'How urgent is this ticket?',
        criteria: { urgent: 'needs action today', routine: 'can wait' },
      },
      quality: {
        type: 'score',
        prompt: 'How complete is the report?',
        criteria: ['missing', 'partial', 'complete'],
      },
    },
  },
  idempotencyKey: true,
  answers: {
    200: {
      description:
        '`{id: "dec_…", object: "decision", created, model, answers, usage, charged: {tokens, ' +
        'credits}}`.',
      content: { 'application/json': DecisionSchema },
      requestId: true,
    },
  },
  errors: DECIDE_ERRORS,
});

const LOOKUP_DOC = describeRoute({
  summary: "Read one of the key's decision requests by its dec_ id",
  description:
    '`{id, object: "decision.request", status, http_status, created, finished, model, ' +
    "error_code, answers, usage, charged, attempts}`. Another key's request is 404, as an " +
    'unknown one.',
  tag: 'decision',
  auth: 'api_key',
  answers: {
    200: {
      description: 'The decision request.',
      content: { 'application/json': DecisionLookupSchema },
    },
  },
  errors: ['invalid_api_key', 'service_unavailable', 'request_not_found', 'not_found'],
});

export function decisionController(gateway: Gateway) {
  return new Elysia({ name: 'decision', prefix: PREFIX })
    .post(DECIDE_ROUTE, ({ request }) => decide(gateway, request), {
      parse: 'none',
      detail: DECIDE_DOC,
    })
    .get(
      '/requests/:id/',
      async ({ request, params }) => {
        const headers = { ...JSON_HEADERS, 'x-request-id': newDecisionRequestId() };
        try {
          const account = authenticate(
            gateway.store,
            request.headers.get('authorization'),
            'decision',
          );
          gateway.store.checkAvailable();
          // Memory may be ahead of the disk by one commit; report only what a crash cannot take
          // back.
          await gateway.registry.durable(params.id);
          gateway.store.checkAvailable();
          const record = gateway.store.state.request(params.id);
          if (!record || record.keyId !== account.id || record.service !== 'decision') {
            throw new GatewayError(
              'request_not_found',
              `No decision request ${params.id} for this API key.`,
              { param: null },
            );
          }
          return new Response(JSON.stringify(lookupView(gateway, record)), {
            status: 200,
            headers,
          });
        } catch (error) {
          if (error instanceof GatewayError)
            return errorResponse(error, { 'x-request-id': headers['x-request-id'] });
          throw error;
        }
      },
      { detail: LOOKUP_DOC },
    );
}
