// A streamed answer without usage is counted in parts as it goes, and the parts add up to the
// whole's count.
import { describe, expect, test } from 'bun:test';
import { randomBytes } from 'node:crypto';
import { StreamedText } from '../../src/billing/offload.ts';
import { countTextTokens, settledPrefixLength } from '../../src/billing/tokens.ts';
import { createLogger } from '../../src/util/log.ts';
import { bearer, closedAfterEach } from '../support/gateway.ts';
import { SseReader } from '../support/sse.ts';

const t = closedAfterEach();
const logger = createLogger('silent');

function prose(chars: number, seed: number): string {
  const words = [
    'river',
    'stone',
    'light',
    'quiet',
    "don't",
    '日本語',
    '🙂',
    '12345',
    'x=1;',
    '\n\n',
    '  ',
    'CamelCase',
  ];
  let text = '';
  for (let i = seed; text.length < chars; i++)
    text += words[(i * 7919) % words.length] + (i % 5 === 0 ? '' : ' ');
  return text;
}

const samples = () => [
  prose(300_000, 1),
  randomBytes(200_000).toString('base64'),
  '語'.repeat(150_000),
  prose(100_000, 2) + randomBytes(120_000).toString('base64') + prose(100_000, 3),
];

describe('settledPrefixLength', () => {
  test('the settled prefix and the rest count to the whole, whatever follows', () => {
    for (const text of samples()) {
      const cut = settledPrefixLength(text);
      expect(cut).toBeGreaterThan(0);
      expect(countTextTokens(text.slice(0, cut)) + countTextTokens(text.slice(cut))).toBe(
        countTextTokens(text),
      );
      // More text after it does not move it: the prefix is settled.
      const longer = text + prose(50_000, 9);
      expect(settledPrefixLength(longer)).toBeGreaterThanOrEqual(cut);
      expect(countTextTokens(longer.slice(0, cut)) + countTextTokens(longer.slice(cut))).toBe(
        countTextTokens(longer),
      );
    }
  });
});

describe('StreamedText', () => {
  test('counted in parts while it grows, it gives exactly the whole text’s count', async () => {
    for (const text of samples()) {
      const streamed = new StreamedText('key_parts', Number.POSITIVE_INFINITY, logger);
      for (let at = 0; at < text.length; at += 777) streamed.append(text.slice(at, at + 777));
      expect(await streamed.tokens()).toBe(countTextTokens(text));
    }
  });
});

describe('a stream without usage, through the gateway', () => {
  test(
    'its completion tokens are the count of all it relayed, though the gateway kept only the ' +
      'last part',
    async () => {
      // Over the 256 K characters kept, under model_03's output cap of 128,000 tokens (past it the
      // count stops).
      const text = prose(400_000, 4);
      const upstream = Bun.serve({
        port: 0,
        hostname: '127.0.0.1',
        async fetch(request) {
          await request.json();
          const encoder = new TextEncoder();
          let at = 0;
          return new Response(
            new ReadableStream<Uint8Array>({
              pull(controller) {
                if (at >= text.length) {
                  controller.enqueue(
                    encoder.encode(
                      `data: ${JSON.stringify({
                        choices: [{ index: 0, delta: {}, finish_reason: 'stop' }],
                      })}\n\ndata: [DONE]\n\n`,
                    ),
                  );
                  controller.close();
                  return;
                }
                const piece = text.slice(at, at + 1_000);
                at += 1_000;
                controller.enqueue(
                  encoder.encode(
                    `data: ${JSON.stringify({
                      choices: [{ index: 0, delta: { content: piece }, finish_reason: null }],
                    })}\n\n`,
                  ),
                );
              },
            }),
            { headers: { 'content-type': 'text/event-stream' } },
          );
        },
      });
      t.track({ stop: () => upstream.stop(true) });
      const gateway = t.gateway({
        providers: { up: { type: 'openai', base_url: `http://127.0.0.1:${upstream.port}/v1` } },
        models: { model_03: { provider: 'up', upstream_model: 'u' } },
      });
      const { key } = await gateway.createKey({ credits: 1_000 });
      const response = await gateway.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify({
          model: 'model_03',
          stream: true,
          messages: [{ role: 'user', content: 'Talk at length.' }],
        }),
      });
      const events = await new SseReader(response).rest();
      expect(events.at(-1)).toBe('[DONE]');
      const usage = JSON.parse(events.at(-2)!).usage as { completion_tokens: number };
      expect(usage.completion_tokens).toBe(countTextTokens(text));
    },
  );
});
