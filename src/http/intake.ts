// The start and the refusal of an inference request, the same for chat and decision: a gateway
// that can take work, the body read within its deadline, the key; and one way to answer a refusal.
import type { Config } from '../config/model.ts';
import { authenticate } from '../keys/store.ts';
import type { KeyAccount } from '../state/apply.ts';
import type { Service } from '../state/events.ts';
import { type StateStore, unavailableError } from '../state/store.ts';
import type { ByteBudget } from '../util/byte-budget.ts';
import { GatewayError } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
import { readBodyText } from './body.ts';
import { asGatewayError, errorResponse } from './errors.ts';

/** What intake uses of the gateway (the Gateway satisfies it). */
export interface IntakeContext {
  config: Config;
  store: StateStore;
  logger: Logger;
  draining: boolean;
  bodyBudget: ByteBudget;
  metrics: { requestRefused(service: Service, code: string): void };
  onFatal?: (error: Error) => void;
}

/** What the messages call each service. */
const NAMES: Record<Service, string> = { chat: 'gateway', decision: 'decision service' };

/**
 * Refuses at once (throws) when the gateway is draining or its log has failed; else reads the body
 * (within max_body_bytes and the read deadline). The key is authenticated next, by `requestAccount`
 * once the body is in: a body refused (413, 400) is refused before its key is looked at. Not an
 * async function: the read is the body's own promise, and every request comes through here.
 */
export function readRequest(
  ctx: IntakeContext,
  request: Request,
  service: Service,
): Promise<string> {
  if (ctx.draining) {
    throw new GatewayError(
      'service_unavailable',
      `The ${NAMES[service]} is shutting down; retry shortly.`,
    );
  }
  if (ctx.store.unavailableReason) {
    throw new GatewayError(
      'service_unavailable',
      `The ${NAMES[service]} cannot record requests right now; retry later.`,
    );
  }
  const { limits } = ctx.config;
  return readBodyText(
    request,
    limits.max_body_bytes,
    limits.request_read_timeout_ms,
    ctx.bodyBudget,
  );
}

/** The account of the request's key for `service` (after `readRequest`), or its 401. */
export function requestAccount(ctx: IntakeContext, request: Request, service: Service): KeyAccount {
  return authenticate(ctx.store, request.headers.get('authorization'), service);
}

/**
 * The answer to a request that was not admitted (or a bug on its way): a refusal leaves no trace
 * but a counter (§8: refusals are cheap), and a 409 that reports on another request waits until
 * what it reports is durable.
 */
export async function refusalResponse(
  ctx: IntakeContext,
  thrown: unknown,
  requestId: string,
  service: Service,
): Promise<Response> {
  let error = asGatewayError(ctx, thrown, requestId);
  if (service === 'chat') error = error.withoutDetail();
  if (error.settleFirst) {
    await error.settleFirst;
    // What the 409 reports may be what the log just failed to record.
    if (ctx.store.unavailableReason) error = unavailableError();
  }
  // A 499 here: the client left before its request was admitted (mid-body, or while its prompt
  // was counted): one line, no stack; it is no bug.
  if (error.status === 499) {
    ctx.logger.info(
      { requestId, status: 499, code: error.code },
      `${service}: the client went away before its request was admitted`,
    );
  }
  ctx.metrics.requestRefused(service, error.code);
  return errorResponse(error, { 'x-request-id': requestId });
}
