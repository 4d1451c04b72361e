// The edges of a request's life that a review found open: a body that finishes arriving after
// shutdown began, and a finished stream whose slow client hangs up.
import { expect, test } from 'bun:test';
import { bearer, chatBody, closedAfterEach } from '../support/gateway.ts';
import {
  CHAT,
  Client,
  DECISION,
  lifecycleOverrides,
  type ServiceUnderTest,
  sendTo,
  startLifecycleUpstream,
} from '../support/lifecycle-harness.ts';
import { postHead, rawConnect } from '../support/raw-http.ts';

const cleanup = closedAfterEach();

/** Lets the event loop run once (the server reads and answers in this process). */
const turn = () => new Promise((resolve) => setImmediate(resolve));

for (const svc of [CHAT, DECISION] as ServiceUnderTest[]) {
  test(`${svc.label}: a body finishing after shutdown began is refused 503`, async () => {
    const up = cleanup.track(startLifecycleUpstream(() => ({ kind: 'silent' })));
    const t = await cleanup.server(
      lifecycleOverrides(up, { limits: { shutdown_grace_ms: 5_000 } }),
    );
    const client = await Client.create(svc, sendTo(t.baseUrl));
    // A keeps the shutdown waiting; B's headers are in, its body is not.
    const a = client.post({ idempotencyKey: 'request-a-0001' });
    await up.call(0);
    const body = new TextEncoder().encode(JSON.stringify(svc.body()));
    const rest = Promise.withResolvers<void>();
    const b = fetch(`${t.baseUrl}${svc.path}`, {
      method: 'POST',
      headers: bearer(client.key, { 'content-length': String(body.length) }),
      body: new ReadableStream<Uint8Array>({
        async start(controller) {
          controller.enqueue(body.subarray(0, 10));
          await rest.promise;
          controller.enqueue(body.subarray(10));
          controller.close();
        },
      }),
      duplex: 'half',
    } as RequestInit);
    while (t.server.server.pendingRequests < 2) await turn();
    const stopping = t.server.shutdown(5_000);
    rest.resolve();
    const refused = await b;
    expect(refused.status).toBe(503);
    expect(((await refused.json()) as any).error.code).toBe('service_unavailable');
    expect(up.calls.length).toBe(1);
    // A would be interrupted when the grace ends; interrupted now, as the grace's end does.
    for (const actor of t.gateway.registry.all()) actor.abort('interrupted');
    await a;
    await stopping;
    expect(t.gateway.registry.size).toBe(0);
  });
}

test('a finished stream whose slow client hangs up leaves the ending set at once', async () => {
  // An answer far larger than the socket buffers, so its last frames wait for a reader.
  const frame = `data: ${JSON.stringify({
    id: 'up-1',
    object: 'chat.completion.chunk',
    created: 0,
    model: 'up',
    choices: [{ index: 0, delta: { content: 'flood '.repeat(400) }, finish_reason: null }],
  })}\n\n`;
  const tail = `data: ${JSON.stringify({
    id: 'up-1',
    object: 'chat.completion.chunk',
    created: 0,
    model: 'up',
    choices: [{ index: 0, delta: {}, finish_reason: 'stop' }],
    usage: { prompt_tokens: 10, completion_tokens: 20, total_tokens: 30 },
  })}\n\ndata: [DONE]\n\n`;
  const upstream = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    async fetch(request) {
      await request.json();
      return new Response(frame.repeat(4000) + tail, {
        headers: { 'content-type': 'text/event-stream' },
      });
    },
  });
  cleanup.track({ stop: () => upstream.stop(true) });
  const t = await cleanup.server({
    providers: {
      fake: {
        type: 'openai',
        base_url: `http://127.0.0.1:${upstream.port}/v1`,
        timeout_ms: 30_000,
      },
    },
    models: { model_03: { provider: 'fake', upstream_model: 'up' } },
    // The whole answer fits the sink's buffer: the run ends while the client still owes reads.
    limits: { stream_buffer_bytes: 64 * 1024 * 1024, stream_timeout_ms: 60_000 },
  });
  const { key } = await t.createKey({ credits: 100 });
  const client = await rawConnect(t.server.port);
  client.stopReading();
  const body = JSON.stringify(chatBody({ stream: true }));
  client.write(
    postHead('/api/v1/chat/completions', { authorization: `Bearer ${key}` }, body.length) + body,
  );
  while (t.gateway.registry.size > 0 || t.gateway.endingStreams.size === 0) await turn();
  expect(t.gateway.endingStreams.size).toBe(1);
  client.destroy();
  // Without the fix the sink stayed until shutdown (its drop timer found it closed and left it).
  while (t.gateway.endingStreams.size > 0) await turn();
  expect(t.gateway.endingStreams.size).toBe(0);
});
