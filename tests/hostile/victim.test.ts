// Every attack of CONTRACT §8 at once, against one real server: the victim key's balance, bindings
// and records come out exactly as its own requests left them, and it is served throughout.
import { describe, expect, test } from 'bun:test';
import { randomBase62 } from '../../src/util/ids.ts';
import {
  ADMIN_TOKEN,
  bearer,
  chatBody,
  closedAfterEach,
  type TestServer,
} from '../support/gateway.ts';
import { rawConnect } from '../support/raw-http.ts';

const t = closedAfterEach();
const MIB = 1024 * 1024;

/** An upstream whose answers are all hostile, picked by the upstream model name. */
function hostileUpstream() {
  const encoder = new TextEncoder();
  const frame = encoder.encode(
    `data: ${JSON.stringify({
      choices: [{ index: 0, delta: { content: 'x'.repeat(512) }, finish_reason: null }],
    })}\n\n`,
  );
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    development: false,
    async fetch(request) {
      const { model } = (await request.json()) as { model: string };
      if (model === 'endless') {
        return new Response(
          new ReadableStream<Uint8Array>({
            pull(controller) {
              controller.enqueue(frame);
            },
          }),
          { headers: { 'content-type': 'text/event-stream' } },
        );
      }
      if (model === 'huge')
        return new Response(`{"choices":[{"message":{"content":"${'y'.repeat(20 * MIB)}"}}]}`, {
          headers: { 'content-type': 'application/json' },
        });
      return Response.json({
        choices: [
          { index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' },
        ],
        usage: {
          prompt_tokens: Number.MAX_SAFE_INTEGER,
          completion_tokens: 1,
          total_tokens: Number.MAX_SAFE_INTEGER,
        },
      });
    },
  });
  return { url: `http://127.0.0.1:${server.port}/v1`, stop: () => server.stop(true) };
}

async function balances(server: TestServer, id: string) {
  const response = await fetch(`${server.baseUrl}/admin/v1/keys/${id}`, {
    headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
  });
  return (
    (await response.json()) as {
      balances: { credits: number; held: number; charged: number; credits_added: number };
    }
  ).balances;
}

function post(
  server: TestServer,
  key: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Response> {
  return fetch(`${server.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(key, headers),
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

describe('the victim of every attack at once', () => {
  test('keeps its balance, its binding and its records, and is served', async () => {
    const upstream = t.track(hostileUpstream());
    const server = await t.server({
      providers: { hostile: { type: 'openai', base_url: upstream.url, timeout_ms: 5_000 } },
      models: {
        model_05: { provider: 'hostile', upstream_model: 'endless' },
        model_06: { provider: 'hostile', upstream_model: 'huge' },
        model_08: { provider: 'hostile', upstream_model: 'badusage' },
      },
      limits: {
        idempotency_keys_max: 60,
        request_records_max: 60,
        request_read_timeout_ms: 500,
        stream_timeout_ms: 1_500,
        default_rate_limit_rpm: 1_000_000,
      },
    });
    const victim = await server.createKey({ credits: 100 });
    const attacker = await server.createKey({ credits: 1_000 });
    const broke = await server.createKey({ credits: 0 });

    // The victim's own work: a call bound to an Idempotency-Key, and a stream.
    const bodyOnce = chatBody({ messages: [{ role: 'user', content: 'Bill me once.' }] });
    const first = await post(server, victim.key, bodyOnce, {
      'idempotency-key': 'victim-order-0001',
    });
    expect(first.status).toBe(200);
    const firstId = first.headers.get('x-request-id')!;
    await first.arrayBuffer();
    const streamed = await post(server, victim.key, chatBody({ stream: true }));
    const streamId = streamed.headers.get('x-request-id')!;
    await streamed.text();
    const before = await balances(server, victim.id);
    expect(before.held).toBe(0);

    const port = Number(new URL(server.baseUrl).port);
    const fourMegabytes = 'river stone light quiet '.repeat((4 * MIB - 4096) / 24);
    const attacks = [
      // Retention flood: many times the shared tables, each with a new Idempotency-Key.
      (async () => {
        for (let i = 0; i < 300; i++)
          await (
            await post(server, attacker.key, chatBody(), {
              'idempotency-key': `flood-${i}-${randomBase62(8)}`,
            })
          ).arrayBuffer();
      })(),
      // 4 MB prompts with no credit.
      ...[0, 1].map(async () => {
        const response = await post(server, broke.key, {
          model: 'model_01',
          messages: [{ role: 'user', content: fourMegabytes }],
        });
        expect([400, 402]).toContain(response.status);
      }),
      // Hostile upstream answers: endless, huge, a usage of 2^53 − 1; streamed and not.
      ...['model_05', 'model_06', 'model_08'].flatMap((model) =>
        [false, true].map(async (stream) => {
          const response = await post(server, attacker.key, {
            model,
            stream,
            messages: [{ role: 'user', content: 'x' }],
          });
          const text = await response.text();
          expect(response.status === 502 || text.includes('"error"')).toBe(true);
        }),
      ),
      // A schema whose smallest instance is far over the simulator's bound.
      (async () => {
        const tools = [
          {
            type: 'function',
            function: {
              name: 'bomb',
              parameters: {
                type: 'object',
                properties: { a: { type: 'array', minItems: 1e8 } },
                required: ['a'],
              },
            },
          },
        ];
        const response = await post(server, attacker.key, {
          model: 'model_04',
          tool_choice: 'required',
          tools,
          messages: [{ role: 'user', content: 'x' }],
        });
        expect(response.status).toBe(400);
      })(),
      // Refusals with model names nobody knows.
      (async () => {
        for (let i = 0; i < 200; i++)
          await (
            await post(server, attacker.key, chatBody({ model: `m-${randomBase62(40)}` }))
          ).arrayBuffer();
      })(),
      // Slow bodies: closed at the read deadline.
      ...[0, 1, 2].map(async () => {
        const connection = await rawConnect(port);
        connection.write(
          `POST /api/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ` +
            `${attacker.key}\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{`,
        );
        connection.trickle('"model"', 200);
        await connection.closed;
      }),
      // A stream whose client never reads: ended by stream_timeout_ms, its connection closed.
      (async () => {
        const connection = await rawConnect(port);
        const body = JSON.stringify({
          model: 'model_05',
          stream: true,
          messages: [{ role: 'user', content: 'x' }],
        });
        connection.stopReading();
        connection.write(
          `POST /api/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ` +
            `${attacker.key}\r\ncontent-type: application/json\r\ncontent-length: ` +
            `${Buffer.byteLength(body)}\r\n\r\n${body}`,
        );
        await connection.closed;
      })(),
    ];
    // The victim is served while all of it goes on.
    const servedIds: string[] = [];
    for (let i = 0; i < 5; i++) {
      const served = await post(server, victim.key, chatBody({ max_completion_tokens: 5 }));
      expect(served.status).toBe(200);
      servedIds.push(((await served.json()) as { id: string }).id);
    }
    await Promise.all(attacks);

    // Its ledger moved only by its own five calls; its binding and its records are all there.
    const after = await balances(server, victim.id);
    expect(after.held).toBe(0);
    expect(after.credits_added).toBe(before.credits_added);
    let ownChargesMicro = 0;
    for (const id of servedIds) {
      const status = await fetch(`${server.baseUrl}/api/v1/requests/${id}`, {
        headers: bearer(victim.key),
      });
      ownChargesMicro += Math.round(
        ((await status.json()) as { charged_credits: number }).charged_credits * 1e6,
      );
    }
    expect(Math.round(after.charged * 1e6)).toBe(
      Math.round(before.charged * 1e6) + ownChargesMicro,
    );
    expect(Math.round(after.credits * 1e6)).toBe(
      Math.round(before.credits * 1e6) - ownChargesMicro,
    );
    const retry = await post(server, victim.key, bodyOnce, {
      'idempotency-key': 'victim-order-0001',
    });
    expect(retry.status).toBe(409);
    expect(retry.headers.get('x-request-id')).toBe(firstId);
    await retry.arrayBuffer();
    for (const id of [firstId, streamId]) {
      const status = await fetch(`${server.baseUrl}/api/v1/requests/${id}`, {
        headers: bearer(victim.key),
      });
      expect(((await status.json()) as { request_status: string }).request_status).toBe(
        'completed',
      );
    }
    expect((await balances(server, victim.id)).charged).toBe(after.charged);
  });
});
