// Routes mounted in Bun's own router (server.ts) beside the Elysia app, and the idle timer of the
// connection a request came on. Each native route is the same handler as its Elysia route.
import type { Server } from 'bun';

/**
 * Bun's router passes its server; `app.handle` (the tests) passes none, and then there is no
 * connection to time.
 */
export type NativeHandler = (request: Request, server?: Server<unknown>) => Promise<Response>;

export type NativeRoutes = Record<string, { POST: NativeHandler }>;

/** A POST route at `path`, with and without a trailing slash, as the Elysia route answers both. */
export function nativePost(path: string, handler: NativeHandler): NativeRoutes {
  const route = { POST: handler };
  return { [path]: route, [`${path}/`]: route };
}

/** Bun's idle timeout is whole seconds, at most 255; 0 turns it off. */
const IDLE_S_MAX = 255;

/**
 * Bun's idle timers are counted in sweeps of 4 s: a timeout of s seconds is ceil(s / 4) sweeps, the
 * first of them whatever is left of the current one, so it fires between 4 × (ceil(s / 4) − 1) and
 * 4 × ceil(s / 4) seconds after it is armed (measured in Bun 1.4.5: 1–4 s all fire within 0–4 s,
 * 5–8 s within 4–8 s).
 */
export const IDLE_SWEEP_S = 4;

/**
 * The idle timeout Bun.serve gets: the read deadline in whole seconds (at least 1, at most Bun's
 * 255). Bun arms it at each request and after each answer, so it bounds a keep-alive connection's
 * idle time and the headers of its next request; the headers of a connection's first request have
 * uWS's own fixed 10 s. Swept every 4 s (IDLE_SWEEP_S): it fires up to 4 s early or late.
 */
export function readIdleSeconds(readTimeoutMs: number): number {
  return Math.min(IDLE_S_MAX, Math.max(1, Math.ceil(readTimeoutMs / 1000)));
}

/**
 * Lifts the idle timer of `request`'s connection for a stream. uWS stops the timer once a request's
 * body is in, so a provider may take its time before the answer starts; but each write of an answer
 * re-arms it, so a stream silent between tokens for longer than the read deadline would be cut.
 * `waitMs` is the stream's own time limit, enforced by the actor: the socket timer is only a
 * backstop behind it, off when that limit is past Bun's maximum. What is set lasts for the
 * connection, not the request, so every lift needs its `settleIdle` when the answer ends (a
 * connection dropped needs none).
 */
export function liftIdle(
  request: Request,
  server: Server<unknown> | undefined,
  waitMs: number,
): void {
  if (server === undefined) return;
  server.timeout(request, backstopSeconds(waitMs));
}

/**
 * What the backstop leaves the stream past its own deadline at the least: time for its deadline
 * timer to run late on a busy loop and for its error event to be written.
 */
const BACKSTOP_MARGIN_MS = 1_000;

/**
 * The idle timeout that fires no sooner than `waitMs` + BACKSTOP_MARGIN_MS after it is armed,
 * whenever in Bun's sweep that is (IDLE_SWEEP_S): one whole sweep more than that takes. 0 (off)
 * past Bun's maximum. A backstop of ceil(wait) + 1 s fired before a 3 s stream deadline in ~3
 * streams of 4, resetting the client's connection before its stream_timeout event (billed as a
 * cancel).
 */
export function backstopSeconds(waitMs: number): number {
  const sweepMs = IDLE_SWEEP_S * 1000;
  const seconds = IDLE_SWEEP_S * (Math.ceil((waitMs + BACKSTOP_MARGIN_MS) / sweepMs) + 1);
  return seconds > IDLE_S_MAX ? 0 : seconds;
}

/** The connection idles under the read deadline (`readTimeoutMs`) again, after `liftIdle`. */
export function settleIdle(
  request: Request,
  server: Server<unknown> | undefined,
  readTimeoutMs: number,
): void {
  server?.timeout(request, readIdleSeconds(readTimeoutMs));
}

/**
 * The path of a request URL, whatever its form (Bun gives a bare path when the Host header is
 * unusable); never throws.
 */
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
