// A stream whose client stops reading still obeys cancel, stream_timeout_ms and shutdown within 1
// s, and its connection, hold and slot go with it (CONTRACT §8, slow and stuck clients).
import { describe, expect, test } from 'bun:test';
import {
  ADMIN_TOKEN,
  bearer,
  chatBody,
  closedAfterEach,
  type TestServer,
} from '../support/gateway.ts';
import { postHead, type RawConnection, rawConnect } from '../support/raw-http.ts';

const cleanup = closedAfterEach();

/**
 * How long the upstream must stay unread before the gateway counts as waiting on its stuck client.
 * The gateway also stops reading for a moment when relaying keeps it busy; that pause ends within
 * milliseconds, while one caused by a client that stopped reading never does.
 */
const STALLED_MS = 400;

interface FloodUpstream {
  url: string;
  /**
   * Resolves once the gateway has left this upstream unread for STALLED_MS: it waits on its client.
   */
  stalled: Promise<void>;
  stop(): void;
}

/**
 * An OpenAI-compatible upstream that streams as fast as the gateway reads and never finishes. Its
 * writes report backpressure when the gateway does not read; when that lasts, everything between
 * the gateway's stuck client and this upstream is full and the gateway's run loop waits on the
 * client.
 */
function startFloodUpstream(): FloodUpstream {
  const stalled = Promise.withResolvers<void>();
  const frame = `data: ${JSON.stringify({
    id: 'up-1',
    object: 'chat.completion.chunk',
    created: 0,
    model: 'up',
    choices: [{ index: 0, delta: { content: 'flood '.repeat(40) }, finish_reason: null }],
  })}\n\n`;
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    development: false,
    async fetch(request) {
      await request.json();
      return new Response(
        new ReadableStream<Uint8Array>({
          type: 'direct',
          async pull(controller) {
            for (let frames = 1; !request.signal.aborted; frames++) {
              const written = controller.write(frame);
              if (written === 0) return;
              if (typeof written !== 'number') {
                const timer = setTimeout(stalled.resolve, STALLED_MS);
                await written;
                clearTimeout(timer);
              } else if (frames % 256 === 0) {
                await new Promise((resolve) => setImmediate(resolve));
              }
            }
          },
        }),
        { headers: { 'content-type': 'text/event-stream' } },
      );
    },
  });
  return {
    url: `http://127.0.0.1:${server.port}/v1`,
    stalled: stalled.promise,
    stop: () => server.stop(true),
  };
}

function floodOverrides(
  upstream: FloodUpstream,
  limits: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    providers: { fake: { type: 'openai', base_url: upstream.url, timeout_ms: 30_000 } },
    models: { model_03: { provider: 'fake', upstream_model: 'up' } },
    limits,
  };
}

interface StuckStream {
  t: TestServer;
  keyId: string;
  key: string;
  client: RawConnection;
  requestId: string;
}

/**
 * A stream whose client sent its request and never reads; resolves once the gateway waits on it.
 */
async function stuckStream(limits: Record<string, unknown> = {}): Promise<StuckStream> {
  const upstream = cleanup.track(startFloodUpstream());
  const t = await cleanup.server(floodOverrides(upstream, limits));
  const { id: keyId, key } = await t.createKey({ credits: 10 });
  const client = await rawConnect(t.server.port);
  client.stopReading();
  const body = JSON.stringify(chatBody({ stream: true }));
  client.write(
    postHead('/api/v1/chat/completions', { authorization: `Bearer ${key}` }, body.length) + body,
  );
  await upstream.stalled;
  const actors = t.gateway.registry.all();
  // Still running: what follows stops a run that is waiting on its stuck client.
  expect(actors.length).toBe(1);
  return { t, keyId, key, client, requestId: actors[0]!.id };
}

async function balances(
  t: TestServer,
  keyId: string,
): Promise<{ held: number; charged: number; credits: number }> {
  const response = await fetch(`${t.baseUrl}/admin/v1/keys/${keyId}`, {
    headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
  });
  return ((await response.json()) as any).balances;
}

async function status(t: TestServer, key: string, id: string): Promise<any> {
  return (await fetch(`${t.baseUrl}/api/v1/requests/${id}`, { headers: bearer(key) })).json();
}

describe('a stream whose client stops reading', () => {
  test('cancel: 202 within 1 s, after the hold is released; the connection is closed', async () => {
    const { t, keyId, key, client, requestId } = await stuckStream();
    const startMs = Date.now();
    const response = await fetch(`${t.baseUrl}/api/v1/requests/${requestId}/cancel`, {
      method: 'POST',
      headers: bearer(key),
    });
    expect(response.status).toBe(202);
    expect(((await response.json()) as any).request_status).toBe('cancelled');
    expect(Date.now() - startMs).toBeLessThan(1000);
    // The answer came after the release: what a caller reads next is final.
    expect(await status(t, key, requestId)).toMatchObject({
      request_status: 'cancelled',
      error_code: 'request_cancelled',
      charged_credits: 0,
    });
    expect(await balances(t, keyId)).toMatchObject({ held: 0, charged: 0 });
    expect(t.gateway.registry.size).toBe(0);
    await client.closed;
    expect(Date.now() - startMs).toBeLessThan(1000);
  });

  test(
    'stream_timeout_ms: the run ends on time (the hold kept, per billing) and the connection ' +
      'is closed',
    async () => {
      const streamTimeoutMs = 1500;
      const startMs = Date.now();
      const { t, keyId, key, client, requestId } = await stuckStream({
        stream_timeout_ms: streamTimeoutMs,
      });
      await client.closed;
      expect(Date.now() - startMs).toBeLessThan(streamTimeoutMs + 1000);
      const record = await status(t, key, requestId);
      expect(record).toMatchObject({ request_status: 'error', error_code: 'stream_timeout' });
      // billing.on_error = keep: the reservation is charged, nothing stays held.
      expect(record.charged_credits).toBe(record.reserved_credits);
      expect((await balances(t, keyId)).held).toBe(0);
      expect(t.gateway.registry.size).toBe(0);
    },
  );

  test(
    'shutdown: done within the grace + 1 s, the run interrupted and its hold released, the ' +
      'connection closed',
    async () => {
      const { t, client, requestId } = await stuckStream();
      const graceMs = 200;
      const startMs = Date.now();
      await t.server.shutdown(graceMs);
      expect(Date.now() - startMs).toBeLessThan(graceMs + 1000);
      const record = t.gateway.store.state.request(requestId)!;
      expect(record.status).toBe('error');
      expect(record.errorCode).toBe('interrupted');
      expect(record.charge.credits_micro).toBe(0);
      // Counted as an interrupt, not as the 503 its client was told (a failing log's code).
      const { text } = await t.gateway.metrics.expose();
      expect(text).toMatch(/tollgate_requests_finished_total\{[^}]*code="interrupted"[^}]*\} 1/);
      await client.closed;
      expect(Date.now() - startMs).toBeLessThan(graceMs + 1000);
    },
  );

  test(
    'a client that goes away while the stream ' + 'waits on it: cancelled, hold released',
    async () => {
      const { t, keyId, key, client, requestId } = await stuckStream();
      const settled = t.gateway.registry.get(requestId)!.settled;
      client.destroy();
      await settled;
      expect(await status(t, key, requestId)).toMatchObject({
        request_status: 'cancelled',
        charged_credits: 0,
      });
      expect((await balances(t, keyId)).held).toBe(0);
    },
  );
});
