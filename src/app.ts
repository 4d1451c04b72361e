// Builds the Elysia app from the controllers; no listen here, so tests drive it with app.handle().
import { Elysia } from 'elysia';
import { dashboardController } from './admin/dashboard/index.ts';
import { adminController } from './admin/index.ts';
import { chatController } from './chat/index.ts';
import { decisionController } from './decision/index.ts';
import type { Gateway } from './gateway.ts';
import { errorResponse } from './http/errors.ts';
import { openapiController } from './http/openapi.ts';
import { urlPath } from './http/routes.ts';
import { healthController } from './ops/health.ts';
import { AssertionError } from './util/assert.ts';
import { GatewayError, internalError } from './util/errors.ts';
import { newDecisionRequestId, randomBase62 } from './util/ids.ts';

export function createApp(gateway: Gateway) {
  const { logger } = gateway;
  return (
    // Elysia's default (`standardHostname`) takes the path from a fixed offset, 11, as if every
    // Host had at least 4 characters: `Host: a` would route `/api/v1/models` as `/v1/models`. Off,
    // it looks for the first '/' past `http://` (server.ts gives a bare-path URL an origin first).
    new Elysia({ name: 'tollgate', handler: { standardHostname: false } })
      // The one place every operating error becomes the contract's envelope; nothing else renders
      // errors. Nothing here may throw on an odd URL (`Host: [` makes one `new URL` refuses).
      .onError(({ error, code, request }) => {
        const headers = { 'x-request-id': errorRequestId(request.url) };
        if (error instanceof GatewayError) return errorResponse(error, headers);
        if (code === 'NOT_FOUND') {
          return errorResponse(
            new GatewayError('not_found', `No route ${request.method} ${urlPath(request.url)}.`),
            headers,
          );
        }
        if (code === 'PARSE')
          return errorResponse(
            new GatewayError('invalid_request_error', 'The body is not valid JSON.'),
            headers,
          );
        if (code === 'VALIDATION')
          return errorResponse(
            new GatewayError('invalid_request_error', 'The request is not valid.'),
            headers,
          );
        // A bug: log it with its stack, answer 500 without one. A broken invariant is fatal (see
        // main.ts).
        logger.error(
          { err: (error as Error)?.stack ?? String(error), path: urlPath(request.url) },
          'http: unhandled error',
        );
        if (error instanceof AssertionError) queueMicrotask(() => gateway.onFatal?.(error));
        return errorResponse(internalError(), headers);
      })
      // Elysia's router decodes each path parameter and leaves null where the percent-encoding is
      // broken (`%ZZ`, a lone `%`, overlong UTF-8 such as `%C0%AF`): no such resource, before any
      // handler sees it.
      .onTransform(({ params, request }) => {
        for (const name in params) {
          if ((params as Record<string, string | null>)[name] === null) {
            // A request id that cannot be decoded names no request: the lookup's own 404 code
            // (CONTRACT §2), as for any id it does not know.
            const code = urlPath(request.url).includes('/requests/')
              ? 'request_not_found'
              : 'not_found';
            throw new GatewayError(code, 'The path is not valid percent-encoding.');
          }
        }
      })
      .use(healthController(gateway))
      .use(chatController(gateway))
      .use(decisionController(gateway))
      .use(adminController(gateway))
      .use(openapiController())
      .use(dashboardController())
  );
}

export type App = ReturnType<typeof createApp>;

const DECISION_PREFIX = '/decision/v1';

/**
 * The id of an answer no controller gave (no route, a broken path): under the decision service a
 * `dec_` id, as every answer of that service carries from its first byte (CONTRACT §5), elsewhere
 * a `req_` one.
 */
function errorRequestId(url: string): string {
  const path = urlPath(url);
  if (
    path.startsWith(DECISION_PREFIX) &&
    (path.length === DECISION_PREFIX.length || path.charCodeAt(DECISION_PREFIX.length) === 47)
  )
    return newDecisionRequestId();
  return `req_${randomBase62(20)}`;
}
