// Builds the Elysia app from the controllers; no listen here, so tests drive it with app.handle().
import { Elysia } from 'elysia';
import { adminController } from './admin/index.ts';
import { chatController } from './chat/index.ts';
import { decisionController } from './decision/index.ts';
import type { Gateway } from './gateway.ts';
import { errorResponse, GatewayError, internalError } from './http/errors.ts';
import { healthController } from './ops/health.ts';
import { AssertionError } from './util/assert.ts';
import { randomBase62 } from './util/ids.ts';

export function createApp(gateway: Gateway) {
  const { logger } = gateway;
  return (
    new Elysia({ name: 'tollgate' })
      // The one place every operating error becomes the contract's envelope; nothing else renders errors.
      .onError(({ error, code, request }) => {
        const headers = { 'x-request-id': `req_${randomBase62(20)}` };
        if (error instanceof GatewayError) return errorResponse(error, headers);
        if (code === 'NOT_FOUND') {
          return errorResponse(new GatewayError('not_found', `No route ${request.method} ${new URL(request.url).pathname}.`), headers);
        }
        if (code === 'PARSE') return errorResponse(new GatewayError('invalid_request_error', 'The body is not valid JSON.'), headers);
        if (code === 'VALIDATION') return errorResponse(new GatewayError('invalid_request_error', 'The request is not valid.'), headers);
        // A bug: log it with its stack, answer 500 without one. A broken invariant is fatal (see main.ts).
        logger.error({ err: (error as Error)?.stack ?? String(error), path: new URL(request.url).pathname }, 'http: unhandled error');
        if (error instanceof AssertionError) queueMicrotask(() => gateway.onFatal?.(error));
        return errorResponse(internalError(), headers);
      })
      .use(healthController(gateway))
      .use(chatController(gateway))
      .use(decisionController(gateway))
      .use(adminController(gateway))
  );
}

export type App = ReturnType<typeof createApp>;
