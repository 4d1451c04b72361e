// Routes mounted in Bun's own router (server.ts) beside the Elysia app: the busiest endpoints skip
// Elysia's routing and request context there. Each is the same handler as its Elysia route.

export type NativeRoutes = Record<string, { POST: (request: Request) => Promise<Response> }>;

/** A POST route at `path`, with and without a trailing slash, as the Elysia route answers both. */
export function nativePost(path: string, handler: (request: Request) => Promise<Response>): NativeRoutes {
  const route = { POST: handler };
  return { [path]: route, [`${path}/`]: route };
}
