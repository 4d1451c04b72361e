// The trivial reverse proxy: Bun.serve + fetch, nothing else. The floor any Bun gateway is measured
// against. Usage: bun bench/proxy.ts <target-origin> [port]   (or TARGET=…, PORT=…); prints
// {"msg":"proxy listening","url":…}.
const target = new URL(process.argv[2] ?? process.env.TARGET ?? '').origin;
const server = Bun.serve({
  hostname: '127.0.0.1',
  port: Number(process.argv[3] ?? process.env.PORT ?? 0),
  idleTimeout: 0,
  async fetch(request) {
    const url = new URL(request.url);
    const headers = new Headers(request.headers);
    headers.delete('host');
    const body =
      request.method === 'GET' || request.method === 'HEAD' ? null : await request.arrayBuffer();
    // The response body is a stream: it is relayed as it arrives, chunk by chunk.
    return fetch(target + url.pathname + url.search, {
      method: request.method,
      headers,
      body,
      signal: request.signal,
    });
  },
});
console.log(JSON.stringify({ msg: 'proxy listening', url: `http://127.0.0.1:${server.port}` }));
for (const signal of ['SIGTERM', 'SIGINT'] as const)
  process.once(signal, () => {
    server.stop(true);
    process.exit(0);
  });
