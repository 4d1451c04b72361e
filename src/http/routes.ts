// Routes mounted in Bun's own router (server.ts) beside the Elysia app: the busiest endpoints skip
// Elysia's routing and request context there. Each is the same handler as its Elysia route.

export type NativeRoutes = Record<string, { POST: (request: Request) => Promise<Response> }>;

/** A POST route at `path`, with and without a trailing slash, as the Elysia route answers both. */
export function nativePost(path: string, handler: (request: Request) => Promise<Response>): NativeRoutes {
  const route = { POST: handler };
  return { [path]: route, [`${path}/`]: route };
}

/** Bun's idle timeout is whole seconds, at most 255; 0 turns it off. */
const IDLE_S_MAX = 255;

/**
 * The idle timeout Bun.serve gets: the read deadline in whole seconds (at least 1, at most Bun's 255).
 * Bun arms it at each request and after each answer, so it bounds a keep-alive connection's idle time
 * and the headers of its next request; the headers of a connection's first request have uWS's own
 * fixed 10 s. The timer is swept every 4 s, so it fires up to 4 s late.
 */
export function readIdleSeconds(readTimeoutMs: number): number {
  return Math.min(IDLE_S_MAX, Math.max(1, Math.ceil(readTimeoutMs / 1000)));
}

/** The path of a request URL, whatever its form (Bun gives a bare path when the Host header is unusable); never throws. */
export function urlPath(url: string): string {
  let start = 0;
  if (url.charCodeAt(0) !== 47 /* '/' */) {
    const scheme = url.indexOf('://');
    start = scheme === -1 ? -1 : url.indexOf('/', scheme + 3);
    if (start === -1) return '/';
  }
  const query = url.indexOf('?', start);
  return query === -1 ? url.slice(start) : url.slice(start, query);
}
