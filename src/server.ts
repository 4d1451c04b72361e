// Listening: the Bun server around the app, and the graceful stop that drains it.
import { createApp } from './app.ts';
import { chatNativeRoutes } from './chat/index.ts';
import { STOPPED_DRAIN_MS_MAX } from './chat/sse.ts';
import { decisionNativeRoutes } from './decision/index.ts';
import type { Gateway } from './gateway.ts';
import { readIdleSeconds } from './http/routes.ts';
import { finishInterrupted } from './requests/recovery.ts';

export interface RunningServer {
  /** Where it listens, as the log says it (an IPv6 host in brackets). */
  url: string;
  /** Where a client on this machine reaches it: a wildcard host is the loopback of its family. */
  localUrl: string;
  port: number;
  server: ReturnType<typeof Bun.serve>;
  /**
   * SIGTERM behaviour: refuse new work, let in-flight requests finish within the grace, interrupt
   * the rest.
   */
  shutdown(graceMs?: number): Promise<void>;
}

/**
 * The origin given to a request whose Host header Bun could not use (its URL is then a bare path).
 */
const FALLBACK_ORIGIN = 'http://localhost';

/**
 * Elysia reads the path as the text after the first '/' past `http://` (app.ts sets
 * `standardHostname: false`), so any Host header works, except one Bun refuses to put in the URL
 * (empty, or with a space, '/', '?', '#' or a non-ASCII character): then `request.url` is the bare
 * path, and the request gets a URL with a fixed origin. Only those odd requests pay for the copy.
 */
function withUsableUrl(request: Request): Request {
  const url = request.url;
  return url.charCodeAt(0) === 47 /* '/' */ ? new Request(FALLBACK_ORIGIN + url, request) : request;
}

export async function startServer(
  gateway: Gateway,
  options: { hostname?: string; port?: number } = {},
): Promise<RunningServer> {
  // Requests a previous run left in flight end now, before anything new is admitted.
  await finishInterrupted(gateway.store, gateway.logger);
  const app = createApp(gateway);
  const server = Bun.serve({
    hostname: options.hostname ?? gateway.config.server.host,
    port: options.port ?? gateway.config.server.port,
    // Our own reader enforces max_body_bytes with the contract's 413 and envelope (it refuses on
    // Content-Length without reading, and stops a chunked body at the limit), so Bun's own limit,
    // which would answer a bare 413, must never be the one that fires.
    maxRequestBodySize: Number.MAX_SAFE_INTEGER,
    // Slow and idle clients: the read deadline bounds a kept-alive connection's idle time and its
    // next request's headers (see readIdleSeconds for what Bun allows); bodies have their own
    // precise deadline (readBodyText). Once a body is in, uWS stops the timer until the answer is
    // written, so a provider may take its time; a stream lifts it until its end (chat/index.ts).
    idleTimeout: readIdleSeconds(gateway.config.limits.request_read_timeout_ms),
    // Errors are ours to render and log. Development mode would also print to stderr the reason a
    // dropped stream was aborted with (chat/sse.ts), once per client that stopped reading.
    development: false,
    // Bun turns SO_REUSEPORT on by default outside development: a second gateway on the same port
    // (another data dir) would then start and take part of every client's connections, answering
    // with its own keys. Off, the second start fails with EADDRINUSE (main.ts: exit 69).
    reusePort: false,
    // The two inference endpoints are matched by Bun's router and called directly (every other
    // path, and another method on theirs, falls through to the app): Elysia's routing and context
    // are several µs of a request that the trivial proxy does in ~25 (bench/README).
    routes: { ...chatNativeRoutes(gateway), ...decisionNativeRoutes(gateway) },
    fetch: (request) => app.handle(withUsableUrl(request)),
  });
  const shutdown = drainThenStop(gateway, server);
  // Bun's own URL: an IPv6 host bracketed once and canonical, whether HOST was `::1` or `[::1]`.
  const url = new URL(String(server.url));
  const listening = url.origin;
  if (url.hostname === '0.0.0.0') url.hostname = '127.0.0.1';
  else if (url.hostname === '[::]') url.hostname = '[::1]';
  return {
    url: listening,
    localUrl: url.origin,
    port: server.port ?? 0,
    server,
    shutdown,
  };
}

/**
 * Shutdown (§8): stop admitting, let requests in flight finish within the grace, interrupt the
 * rest, close the log, then the listener. Called once; later calls get the same promise.
 */
function drainThenStop(
  gateway: Gateway,
  server: ReturnType<typeof Bun.serve>,
): (graceMs?: number) => Promise<void> {
  let stopping: Promise<void> | null = null;
  return (graceMs = gateway.config.limits.shutdown_grace_ms): Promise<void> => {
    stopping ??= (async () => {
      gateway.draining = true;
      const deadline = Date.now() + graceMs;
      while (gateway.registry.size > 0 && Date.now() < deadline) {
        const pending = gateway.registry.all().map((actor) => actor.settled);
        let timer: ReturnType<typeof setTimeout> | undefined;
        await Promise.race([
          Promise.all(pending),
          new Promise((resolve) => (timer = setTimeout(resolve, deadline - Date.now()))),
        ]);
        clearTimeout(timer);
      }
      const rest = gateway.registry.all();
      for (const actor of rest) actor.abort('interrupted');
      await Promise.all(rest.map((actor) => actor.settled));
      await gateway.store.close();
      for (const provider of gateway.providers.values()) provider.close?.();
      // An interrupted stream ends with its error event, and its connection is dropped if the
      // client is still behind after STOPPED_DRAIN_MS_MAX (chat/sse.ts). server.stop leaves such a
      // connection open and detaches the response, after which the drop does nothing: it must come
      // first.
      if (rest.some((actor) => actor.init.stream))
        await new Promise((resolve) => setTimeout(resolve, STOPPED_DRAIN_MS_MAX));
      // Completed streams whose clients are still behind: dropped, or server.stop would leave them
      // open.
      for (const stream of gateway.endingStreams.values()) stream.drop();
      server.stop(true);
    })();
    return stopping;
  };
}
