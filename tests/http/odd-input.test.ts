// Odd input is a 4xx (CONTRACT §8): any Host header routes like any other, and a path whose
// percent-encoding is broken is a 404 with the error envelope, never a 500.
import { describe, expect, test } from 'bun:test';
import { ADMIN_TOKEN, chatBody, closedAfterEach, type TestServer } from '../support/gateway.ts';
import { rawConnect } from '../support/raw-http.ts';

const cleanup = closedAfterEach();

interface RawAnswer {
  status: number;
  body: any;
}

/** One request written by hand on its own connection (`Connection: close`), and its answer. */
async function rawRequest(t: TestServer, head: string, body = ''): Promise<RawAnswer> {
  const client = await rawConnect(t.server.port);
  client.write(head + body);
  await client.closed;
  const text = client.received();
  const split = text.indexOf('\r\n\r\n');
  const status = Number(text.slice(9, 12));
  const rest = text.slice(split + 4);
  const chunked = /transfer-encoding: chunked/i.test(text.slice(0, split));
  const payload = chunked ? dechunk(rest) : rest;
  let parsed: unknown = payload;
  try {
    parsed = JSON.parse(payload);
  } catch {}
  return { status, body: parsed };
}

function dechunk(text: string): string {
  let out = '';
  let at = 0;
  for (;;) {
    const end = text.indexOf('\r\n', at);
    const size = Number.parseInt(text.slice(at, end), 16);
    if (!size) return out;
    out += text.slice(end + 2, end + 2 + size);
    at = end + 2 + size + 2;
  }
}

function head(
  method: string,
  path: string,
  host: string | null,
  headers: Record<string, string> = {},
  version = '1.1',
): string {
  const lines = [`${method} ${path} HTTP/${version}`];
  if (host !== null) lines.push(`Host: ${host}`);
  lines.push('Connection: close');
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  return `${lines.join('\r\n')}\r\n\r\n`;
}

const NOT_FOUND_ENVELOPE = {
  error: {
    message: expect.any(String),
    type: 'invalid_request_error',
    code: 'not_found',
    param: null,
  },
};
/** A broken percent-escape: in a request id request_not_found (no such request), else not_found. */
const badPercent = (path: string) => ({
  error: {
    message: 'The path is not valid percent-encoding.',
    type: 'invalid_request_error',
    code: path.includes('/requests/') ? 'request_not_found' : 'not_found',
    param: null,
  },
});

const HOSTS = [
  '',
  'a',
  'ab',
  'abc',
  '%zz',
  '[',
  '[::1]',
  'a b',
  'a/b',
  'a?b',
  'x'.repeat(4000),
  'localhost:8080',
  'ünïcode',
];

describe('any Host header', () => {
  for (const host of HOSTS) {
    const shown = host.length > 20 ? `${host.slice(0, 8)}… (${host.length} chars)` : host;
    test(`Host: ${JSON.stringify(shown)} routes like any other`, async () => {
      const t = await cleanup.server();
      const { key } = await t.createKey({ credits: 10 });
      const auth = { authorization: `Bearer ${key}` };
      const admin = {
        authorization: `Bearer ${ADMIN_TOKEN}`,
        'content-type': 'application/json',
      };

      const models = await rawRequest(t, head('GET', '/api/v1/models', host, auth));
      expect(models.status).toBe(200);
      expect(models.body.data.length).toBe(11);
      expect(await rawRequest(t, head('GET', '/api/v1/models/', host, auth))).toMatchObject({
        status: 200,
      });
      expect(await rawRequest(t, head('GET', '/nope', host))).toEqual({
        status: 404,
        body: NOT_FOUND_ENVELOPE,
      });
      expect(await rawRequest(t, head('GET', '/api/v1/requests/%ZZ', host, auth))).toEqual({
        status: 404,
        body: badPercent('/api/v1/requests/%ZZ'),
      });
      // A body reaches the handler whatever the Host (a copied request keeps it).
      const keyBody = JSON.stringify({ name: 'odd host', credits: 1 });
      const created = await rawRequest(
        t,
        head('POST', '/admin/v1/keys', host, {
          ...admin,
          'content-length': String(keyBody.length),
        }),
        keyBody,
      );
      expect(created.status).toBe(201);
      expect(created.body.name).toBe('odd host');
      const chat = JSON.stringify(chatBody());
      const completion = await rawRequest(
        t,
        head('POST', '/api/v1/chat/completions', host, {
          ...auth,
          'content-type': 'application/json',
          'content-length': String(chat.length),
        }),
        chat,
      );
      expect(completion.status).toBe(200);
      expect(completion.body.object).toBe('chat.completion');
    });
  }

  test('no Host at all: HTTP/1.0 routes; HTTP/1.1 is refused by Bun with a 400', async () => {
    const t = await cleanup.server();
    expect(await rawRequest(t, head('GET', '/healthz', null, {}, '1.0'))).toEqual({
      status: 200,
      body: { status: 'ok' },
    });
    expect(await rawRequest(t, head('GET', '/nope', null, {}, '1.0'))).toEqual({
      status: 404,
      body: NOT_FOUND_ENVELOPE,
    });
    expect((await rawRequest(t, head('GET', '/healthz', null))).status).toBe(400);
  });

  test('odd request targets are a 4xx', async () => {
    const t = await cleanup.server();
    for (const target of [
      '*',
      'http://elsewhere.example/api/v1/models',
      '//api/v1/models',
      '/%',
      '/?%ZZ',
    ]) {
      const { status } = await rawRequest(t, head('GET', target, 'a'));
      expect({ target, clientError: status >= 400 && status < 500 }).toEqual({
        target,
        clientError: true,
      });
    }
  });
});

/** Every route with a path parameter, under each service's prefix. */
const PARAM_ROUTES = [
  ['GET', '/api/v1/requests/{}'],
  ['POST', '/api/v1/requests/{}/cancel'],
  ['GET', '/decision/v1/requests/{}'],
  ['GET', '/decision/v1/requests/{}/'],
  ['GET', '/admin/v1/keys/{}'],
  ['POST', '/admin/v1/keys/{}/credits'],
  ['POST', '/admin/v1/keys/{}/revoke'],
] as const;
const BROKEN = ['%ZZ', '%', '%C0%AF', '%E2%82', 'ok%2', '%%'];

describe('broken percent-encoding in a path', () => {
  test('app.handle: 404 with the envelope, for every route and every breakage', async () => {
    const t = cleanup.gateway();
    const { key } = await t.createKey({ credits: 10 });
    for (const [method, pattern] of PARAM_ROUTES) {
      for (const broken of BROKEN) {
        const path = pattern.replace('{}', broken);
        const token = path.startsWith('/admin') ? ADMIN_TOKEN : key;
        const response = await t.request(path, {
          method,
          headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
          body: method === 'POST' ? '{"credits":1}' : undefined,
        });
        expect({ method, path, status: response.status, body: await response.json() }).toEqual({
          method,
          path,
          status: 404,
          body: badPercent(path),
        });
      }
    }
  });

  test('a listening server: the same, and elsewhere in a path a 404 too', async () => {
    const t = await cleanup.server();
    const { key } = await t.createKey({ credits: 10 });
    for (const [method, pattern] of PARAM_ROUTES) {
      const path = pattern.replace('{}', '%ZZ');
      const token = path.startsWith('/admin') ? ADMIN_TOKEN : key;
      const answer = await rawRequest(
        t,
        head(method, path, '127.0.0.1', {
          authorization: `Bearer ${token}`,
          'content-length': '0',
        }),
      );
      expect({ path, ...answer }).toEqual({ path, status: 404, body: badPercent(path) });
    }
    for (const path of [
      '/%ZZ',
      '/api/v1/%C0%AF',
      '/api/v1/chat/completions%ZZ',
      '/decision/v1/decide/%',
    ]) {
      const answer = await rawRequest(
        t,
        head('POST', path, '127.0.0.1', { authorization: `Bearer ${key}`, 'content-length': '0' }),
      );
      expect({ path, ...answer }).toEqual({ path, status: 404, body: NOT_FOUND_ENVELOPE });
    }
  });
});
