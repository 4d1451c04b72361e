// The upstream HTTP/1.1 client against real sockets: keep-alive, stale connections, large bodies,
// TLS, aborts.
import { afterEach, describe, expect, test } from 'bun:test';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Socket } from 'bun';
import {
  type ExchangeHandler,
  HttpClient,
  HttpClientError,
  type HttpExchange,
} from '../../src/providers/http/client.ts';
import type { ResponseHead } from '../../src/providers/http/response-parser.ts';

const TLS_DIR = join(import.meta.dir, '../support/tls');
const decoder = new TextDecoder();

interface Answer {
  status: number;
  headers: Map<string, string>;
  body: string;
}

/** One request through `client`, collected; rejects with the client's error. */
function send(
  client: HttpClient,
  path: string,
  body = '',
  extra: Partial<ExchangeHandler> = {},
): { exchange: HttpExchange; answer: Promise<Answer> } {
  const { promise, resolve, reject } = Promise.withResolvers<Answer>();
  let head: ResponseHead | null = null;
  const parts: Uint8Array[] = [];
  const text =
    `POST ${path} HTTP/1.1\r\nhost: test\r\ncontent-length: ` +
    `${Buffer.byteLength(body)}\r\n\r\n${body}`;
  const exchange = client.request(text, Buffer.byteLength(text), {
    onHead(h) {
      head = h;
      extra.onHead?.(h);
    },
    onBody(bytes) {
      parts.push(bytes);
      extra.onBody?.(bytes);
    },
    onEnd() {
      resolve({
        status: head!.status,
        headers: head!.headers,
        body: decoder.decode(Buffer.concat(parts)),
      });
    },
    onError: reject,
  });
  return { exchange, answer: promise };
}

async function failure(answer: Promise<Answer>): Promise<HttpClientError> {
  const caught = await answer.then(
    () => null,
    (error: unknown) => error,
  );
  expect(caught).toBeInstanceOf(HttpClientError);
  return caught as HttpClientError;
}

const stops: (() => void)[] = [];
afterEach(() => {
  for (const stop of stops.splice(0)) stop();
});

/**
 * A Bun.serve upstream that echoes the path and body size, and counts its connections (by client
 * port).
 */
function echoServer(options: { tls?: boolean; hostname?: string } = {}) {
  const ports = new Set<number>();
  const hostname = options.hostname ?? '127.0.0.1';
  const server = Bun.serve({
    hostname,
    port: 0,
    ...(options.tls
      ? {
          tls: {
            key: Bun.file(join(TLS_DIR, 'server.key')),
            cert: Bun.file(join(TLS_DIR, 'server.crt')),
          },
        }
      : {}),
    async fetch(request, srv) {
      ports.add(srv.requestIP(request)!.port);
      const body = await request.arrayBuffer();
      return Response.json({ path: new URL(request.url).pathname, bytes: body.byteLength });
    },
  });
  stops.push(() => server.stop(true));
  const origin = `${options.tls ? 'https' : 'http'}://${hostname}:${server.port}`;
  return { origin, connections: () => ports.size };
}

/**
 * A raw TCP upstream; `onRequest` gets each request's socket, the count of requests on it so far,
 * and which connection it is (1 for the first the server accepted).
 */
function rawServer(
  onRequest: (socket: Socket<{ requests: number }>, nth: number, connection: number) => void,
) {
  const closed: Promise<void>[] = [];
  let connections = 0;
  const server = Bun.listen<{
    requests: number;
    connection: number;
    closed: PromiseWithResolvers<void>;
  }>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(socket) {
        connections++;
        socket.data = {
          requests: 0,
          connection: connections,
          closed: Promise.withResolvers<void>(),
        };
        closed.push(socket.data.closed.promise);
      },
      data(socket, bytes) {
        // Each test request fits in one read and carries an empty body.
        if (!decoder.decode(bytes).includes('\r\n\r\n')) return;
        socket.data.requests++;
        onRequest(
          socket as unknown as Socket<{ requests: number }>,
          socket.data.requests,
          socket.data.connection,
        );
      },
      close(socket) {
        socket.data.closed.resolve();
      },
    },
  });
  stops.push(() => server.stop(true));
  return { origin: `http://127.0.0.1:${server.port}`, connections: () => connections, closed };
}

describe('keep-alive', () => {
  test('sequential requests share one connection', async () => {
    const upstream = echoServer();
    const client = new HttpClient(new URL(upstream.origin));
    for (const path of ['/a', '/b', '/c']) {
      const answer = await send(client, path, 'hello').answer;
      expect({ status: answer.status, body: JSON.parse(answer.body) }).toEqual({
        status: 200,
        body: { path, bytes: 5 },
      });
    }
    expect(upstream.connections()).toBe(1);
    expect(client.idleCount).toBe(1);
    client.close();
  });

  test('concurrent requests open one connection each, and at most idleMax stay open', async () => {
    const upstream = echoServer();
    const client = new HttpClient(new URL(upstream.origin), { idleMax: 2 });
    const answers = await Promise.all(
      ['/1', '/2', '/3', '/4'].map((path) => send(client, path).answer),
    );
    expect(answers.map((answer) => JSON.parse(answer.body).path)).toEqual(['/1', '/2', '/3', '/4']);
    expect(upstream.connections()).toBe(4);
    expect(client.idleCount).toBe(2);
    client.close();
    expect(client.idleCount).toBe(0);
  });

  test(
    'a kept connection closed with no answer to the next request: that request is sent once ' +
      'more, on a new connection',
    async () => {
      // The upstream answers the first request on a connection and drops it, unanswered, when the
      // second one comes (its keep-alive timeout met our request): CONTRACT §7 asks for one try on
      // a fresh one.
      const seen: string[] = [];
      const upstream = rawServer((socket, nth, connection) => {
        seen.push(`connection ${connection} request ${nth}`);
        if (connection === 1 && nth === 2) socket.terminate();
        else socket.write(`HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n${connection}`);
      });
      const client = new HttpClient(new URL(upstream.origin));
      expect((await send(client, '/one').answer).body).toBe('1');
      expect((await send(client, '/two').answer).body).toBe('2');
      expect(seen).toEqual([
        'connection 1 request 1',
        'connection 1 request 2',
        'connection 2 request 1',
      ]);
      // The new connection is kept for the next request, as any other.
      expect((await send(client, '/three').answer).body).toBe('2');
      expect(upstream.connections()).toBe(2);
      client.close();
    },
  );

  test(
    'a kept connection that dies long after the request (the upstream was working on it) is an ' +
      'error, never a second send',
    async () => {
      let requests = 0;
      const upstream = rawServer((socket) => {
        requests++;
        if (requests === 1) socket.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
        else setTimeout(() => socket.terminate(), 150);
      });
      // A window shorter than the upstream's work: the close is no keep-alive race.
      const client = new HttpClient(new URL(upstream.origin), { resendWindowMs: 50 });
      expect((await send(client, '/one').answer).body).toBe('ok');
      const error = await failure(send(client, '/two').answer);
      expect(error.kind).toBe('closed');
      expect({ requests, connections: upstream.connections() }).toEqual({
        requests: 2,
        connections: 1,
      });
      client.close();
    },
  );

  test(
    'the resend happens once: a new connection ' + 'that closes with no answer too is an error',
    async () => {
      let requests = 0;
      const upstream = rawServer((socket) => {
        requests++;
        if (requests === 1) socket.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
        else socket.terminate();
      });
      const client = new HttpClient(new URL(upstream.origin));
      expect((await send(client, '/one').answer).body).toBe('ok');
      const error = await failure(send(client, '/two').answer);
      expect(error.kind).toBe('closed');
      expect({ requests, connections: upstream.connections() }).toEqual({
        requests: 3,
        connections: 2,
      });
      client.close();
    },
  );

  test(
    'a kept connection closed after the first byte ' +
      'of an answer is an error, never a second send',
    async () => {
      // A status line begun is an answer begun: the upstream did act on the request.
      const seen: number[] = [];
      const upstream = rawServer((socket, nth) => {
        seen.push(nth);
        if (nth === 1) socket.write('HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfirst');
        else socket.end('HTTP/1.1 5');
      });
      const client = new HttpClient(new URL(upstream.origin));
      expect((await send(client, '/one').answer).body).toBe('first');
      const error = await failure(send(client, '/two').answer);
      expect(error.kind).toBe('closed');
      expect(seen).toEqual([1, 2]);
      expect(upstream.connections()).toBe(1);
      client.close();
    },
  );

  test(
    'an abort while the resend waits for its answer ' +
      'closes the new connection and reports nothing',
    async () => {
      const resent = Promise.withResolvers<void>();
      const upstream = rawServer((socket, nth, connection) => {
        if (connection === 1 && nth === 1)
          socket.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
        else if (connection === 1) socket.terminate();
        else resent.resolve(); // silent
      });
      const client = new HttpClient(new URL(upstream.origin));
      expect((await send(client, '/one').answer).body).toBe('ok');
      const { exchange, answer } = send(client, '/two');
      let settled = false;
      void answer.then(
        () => (settled = true),
        () => (settled = true),
      );
      await resent.promise;
      exchange.abort();
      await upstream.closed[1];
      expect(settled).toBe(false);
      expect(upstream.connections()).toBe(2);
      expect(client.idleCount).toBe(0);
    },
  );

  test('a kept connection the upstream closed while idle is not reused', async () => {
    const upstream = rawServer((socket) => {
      socket.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
      // Closed after the answer, as a server whose keep-alive timeout is shorter than ours.
      setImmediate(() => socket.end());
    });
    const client = new HttpClient(new URL(upstream.origin));
    expect((await send(client, '/a').answer).body).toBe('ok');
    await upstream.closed[0];
    // The close reaches the client's socket within a few turns of the event loop.
    for (let turn = 0; turn < 100 && client.idleCount > 0; turn++)
      await new Promise((resolve) => setImmediate(resolve));
    expect(client.idleCount).toBe(0);
    expect((await send(client, '/b').answer).body).toBe('ok');
    expect(upstream.connections()).toBe(2);
    client.close();
  });

  test('a new connection closed before any answer is an error, not a retry', async () => {
    const upstream = rawServer((socket) => socket.terminate());
    const client = new HttpClient(new URL(upstream.origin));
    const error = await failure(send(client, '/x').answer);
    expect(error.kind).toBe('closed');
    expect(upstream.connections()).toBe(1);
  });

  test('an answer with connection: close, or without a length, is not kept', async () => {
    const upstream = rawServer((socket, nth) => {
      if (nth === 1)
        socket.write('HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok');
      else socket.write('unexpected');
    });
    const client = new HttpClient(new URL(upstream.origin));
    expect((await send(client, '/a').answer).body).toBe('ok');
    expect(client.idleCount).toBe(0);
    await upstream.closed[0];
    const untilClose = rawServer((socket) => {
      socket.write('HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"done":');
      socket.end('true}');
    });
    const second = new HttpClient(new URL(untilClose.origin));
    expect((await send(second, '/b').answer).body).toBe('{"done":true}');
    expect(second.idleCount).toBe(0);
  });
});

describe('bodies and failures', () => {
  test('a request body larger than the socket takes at once arrives whole', async () => {
    const upstream = echoServer();
    const client = new HttpClient(new URL(upstream.origin));
    const body = `${'x'.repeat(8 * 1024 * 1024)}é`;
    const answer = await send(client, '/big', body).answer;
    expect(JSON.parse(answer.body)).toEqual({ path: '/big', bytes: Buffer.byteLength(body) });
    client.close();
  });

  test('a refused connection is a connect error with its code', async () => {
    const listener = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } });
    const port = listener.port;
    listener.stop(true);
    const error = await failure(
      send(new HttpClient(new URL(`http://127.0.0.1:${port}`)), '/').answer,
    );
    expect({ kind: error.kind, code: error.code }).toEqual({
      kind: 'connect',
      code: 'ECONNREFUSED',
    });
  });

  test('a malformed answer is a protocol error and the connection is dropped', async () => {
    const upstream = rawServer((socket) =>
      socket.write('HTTP/1.1 200 OK\r\ncontent-length: nope\r\n\r\n'),
    );
    const client = new HttpClient(new URL(upstream.origin));
    const error = await failure(send(client, '/').answer);
    expect(error.kind).toBe('protocol');
    await upstream.closed[0];
    expect(client.idleCount).toBe(0);
  });

  test('an answer cut off mid-body is a closed error', async () => {
    const upstream = rawServer((socket) => {
      socket.write('HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial');
      socket.end();
    });
    const error = await failure(send(new HttpClient(new URL(upstream.origin)), '/').answer);
    expect(error.kind).toBe('closed');
  });

  test('abort closes the connection at once and reports nothing more', async () => {
    const headSent = Promise.withResolvers<void>();
    const upstream = rawServer((socket) => {
      socket.write('HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n');
      headSent.resolve();
    });
    const client = new HttpClient(new URL(upstream.origin));
    const seen: string[] = [];
    const firstBody = Promise.withResolvers<void>();
    const { exchange, answer } = send(client, '/', '', {
      onBody: (bytes) => {
        seen.push(decoder.decode(bytes));
        firstBody.resolve();
      },
    });
    let settled = false;
    void answer.then(
      () => (settled = true),
      () => (settled = true),
    );
    await headSent.promise;
    await firstBody.promise;
    exchange.abort();
    await upstream.closed[0];
    expect(seen).toEqual(['first']);
    expect(settled).toBe(false);
    expect(client.idleCount).toBe(0);
  });

  test(
    'an exchange aborted from inside its own body ' +
      'callback stops there, and the connection is dropped',
    async () => {
      const upstream = rawServer((socket) =>
        socket.write('HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nbody'),
      );
      const client = new HttpClient(new URL(upstream.origin));
      let ended = false;
      const bodySeen = Promise.withResolvers<void>();
      const { exchange, answer } = send(client, '/', '', {
        onBody: () => {
          exchange.abort();
          bodySeen.resolve();
        },
      });
      void answer.then(
        () => (ended = true),
        () => (ended = true),
      );
      await bodySeen.promise;
      await upstream.closed[0];
      expect(ended).toBe(false);
      expect(client.idleCount).toBe(0);
    },
  );

  test('a closed client refuses a request, and says nothing after an abort', async () => {
    const upstream = echoServer();
    const client = new HttpClient(new URL(upstream.origin));
    client.close();
    expect((await failure(send(client, '/').answer)).kind).toBe('connect');
    let called = false;
    const { exchange, answer } = send(client, '/');
    void answer.then(
      () => (called = true),
      () => (called = true),
    );
    exchange.abort();
    await new Promise((resolve) => setImmediate(resolve));
    expect(called).toBe(false);
  });

  test('a paused exchange gets the rest of its body after resume', async () => {
    const upstream = rawServer((socket) => {
      socket.write('HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nfirst');
      socket.flush();
      setImmediate(() => socket.write('-last'));
    });
    const client = new HttpClient(new URL(upstream.origin));
    const resumed = Promise.withResolvers<void>();
    const { exchange, answer } = send(client, '/', '', {
      onHead: () => {
        exchange.pause();
        setImmediate(() => {
          exchange.resume();
          resumed.resolve();
        });
      },
    });
    expect((await answer).body).toBe('first-last');
    await resumed.promise;
    client.close();
  });
});

describe('tls', () => {
  test('https with a trusted CA, verified against the host name', async () => {
    const upstream = echoServer({ tls: true });
    const client = new HttpClient(new URL(upstream.origin), {
      ca: await Bun.file(join(TLS_DIR, 'ca.crt')).text(),
    });
    expect(JSON.parse((await send(client, '/secure', 'abc').answer).body)).toEqual({
      path: '/secure',
      bytes: 3,
    });
    expect(JSON.parse((await send(client, '/again').answer).body)).toEqual({
      path: '/again',
      bytes: 0,
    });
    expect(upstream.connections()).toBe(1);
    client.close();
  });

  test('a certificate from an untrusted CA is refused with the reason', async () => {
    const upstream = echoServer({ tls: true });
    const client = new HttpClient(new URL(upstream.origin), {
      ca: await Bun.file(join(TLS_DIR, 'other-ca.crt')).text(),
    });
    const error = await failure(send(client, '/').answer);
    expect(error.kind).toBe('connect');
    expect(error.message).toMatch(/^TLS: /);
  });

  test(
    'https requests aborted while connecting close ' +
      'their sockets, even with no handshake coming',
    async () => {
      // A server that accepts TCP and never speaks TLS: the handshake never completes.
      const silent = rawServer(() => {});
      const client = new HttpClient(new URL(silent.origin.replace('http:', 'https:')), {
        ca: await Bun.file(join(TLS_DIR, 'ca.crt')).text(),
      });
      // Each request takes over the connect the one before it left: one connection in all.
      for (let i = 0; i < 3; i++) send(client, '/').exchange.abort();
      while (silent.closed.length < 1) await new Promise((resolve) => setImmediate(resolve));
      await Promise.all(silent.closed);
      expect(silent.connections()).toBe(1);
      expect(client.openingCount).toBe(0);
    },
  );

  test('a certificate for another address is refused', async () => {
    // The certificate names localhost and 127.0.0.1; the server answers on 127.0.0.2 (loopback
    // too).
    const upstream = echoServer({ tls: true, hostname: '127.0.0.2' });
    const client = new HttpClient(new URL(upstream.origin), {
      ca: await Bun.file(join(TLS_DIR, 'ca.crt')).text(),
    });
    const error = await failure(send(client, '/').answer);
    expect(error.kind).toBe('connect');
    expect(error.message).toMatch(/^TLS: .*127\.0\.0\.2/);
  });
});

/**
 * A host that drops SYNs: a listener (python, as Bun accepts every connection) whose accept queue
 * is full and never drained, so a new connect stays in SYN-SENT for the kernel's ~130 s.
 */
async function blackhole(): Promise<{ url: URL; stop(): void }> {
  const script = [
    'import socket, sys, time',
    's = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(0)',
    'port = s.getsockname()[1]',
    'fill = []',
    'for i in range(3):',
    '    c = socket.socket(); c.setblocking(False)',
    '    try: c.connect(("127.0.0.1", port))',
    '    except BlockingIOError: pass',
    '    fill.append(c)',
    'print(port, flush=True)',
    'sys.stdin.read()',
  ].join('\n');
  const child = Bun.spawn(['python3', '-c', script], { stdin: 'pipe', stdout: 'pipe' });
  const reader = child.stdout.getReader();
  let text = '';
  while (!text.includes('\n')) {
    const { value, done } = await reader.read();
    if (done) throw new Error('the blackhole listener did not start');
    text += decoder.decode(value);
  }
  return {
    url: new URL(`http://127.0.0.1:${Number.parseInt(text, 10)}`),
    stop: () => child.kill(),
  };
}

function openDescriptors(): number {
  return readdirSync('/proc/self/fd').length;
}

describe('a host that drops connects', () => {
  test(
    'requests aborted while connecting leave one connect in flight, not one each (a descriptor ' +
      'for ~130 s apiece piled up until the process ran out)',
    async () => {
      const hole = await blackhole();
      stops.push(hole.stop);
      const client = new HttpClient(hole.url);
      stops.push(() => client.close());
      const before = openDescriptors();
      for (let i = 0; i < 40; i++) {
        const { exchange, answer } = send(client, `/try-${i}`);
        answer.catch(() => {});
        // The request's deadline passes while the connect is still in SYN-SENT.
        exchange.abort();
      }
      // A turn for any connect the listener did take (then the host is no blackhole).
      await new Promise((resolve) => setImmediate(resolve));
      expect(openDescriptors() - before).toBeLessThanOrEqual(2);
      expect(client.openingCount).toBe(1);
    },
  );

  test('a burst past the bound to a healthy upstream is served whole: none fails', async () => {
    const upstream = echoServer();
    const client = new HttpClient(new URL(upstream.origin));
    stops.push(() => client.close());
    const burst = Array.from({ length: 400 }, (_, i) => send(client, `/burst-${i}`));
    expect(client.openingCount).toBe(256);
    expect(client.waitingCount).toBe(144);
    const answers = await Promise.all(burst.map(({ answer }) => answer));
    expect(answers.map((answer) => answer.status)).toEqual(burst.map(() => 200));
    expect(answers.map((answer) => JSON.parse(answer.body).path)).toEqual(
      burst.map((_, i) => `/burst-${i}`),
    );
    expect(client.waitingCount).toBe(0);
    expect(client.openingCount).toBe(0);
  });

  test('connects in flight to one origin are bounded: past 256 a request waits', async () => {
    const hole = await blackhole();
    stops.push(hole.stop);
    const client = new HttpClient(hole.url);
    stops.push(() => client.close());
    const pending = Array.from({ length: 258 }, (_, i) => send(client, `/wait-${i}`));
    for (const { answer } of pending) answer.catch(() => {});
    expect(client.openingCount).toBe(256);
    expect(client.waitingCount).toBe(2);
    // A waiting request that gives up leaves the queue (a deadline, a cancel).
    pending[257]!.exchange.abort();
    expect(client.waitingCount).toBe(1);
    for (const { exchange } of pending) exchange.abort();
    expect(client.waitingCount).toBe(0);
    // Aborted, the connects wait for the next requests instead of being opened again.
    const next = send(client, '/next');
    next.answer.catch(() => {});
    expect(client.openingCount).toBe(256);
    expect(client.waitingCount).toBe(0);
    next.exchange.abort();
  });
});
