// An upstream that answers at length without reporting usage: its tokens are counted off the event
// loop, up to the output cap (a charge never passes the hold), and a decision's oversized answer is
// not parsed.
import { describe, expect, test } from 'bun:test';
import { countPool } from '../../src/billing/offload.ts';
import { countTextTokens } from '../../src/billing/tokens.ts';
import { bearer, closedAfterEach } from '../support/gateway.ts';

const t = closedAfterEach();

/** An OpenAI-compatible upstream whose every answer is `content`, with no usage. */
function wordyUpstream(content: string) {
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    async fetch(request) {
      await request.json();
      return Response.json({
        id: 'x',
        object: 'chat.completion',
        created: 0,
        model: 'w',
        choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
      });
    },
  });
  return { url: `http://127.0.0.1:${server.port}/v1`, stop: () => server.stop(true) };
}

const WORDS = ['river', 'stone', 'light', 'quiet', 'garden', 'signal', 'answer', 'token'];
const longText = (words: number) =>
  Array.from({ length: words }, (_, i) => WORDS[i % WORDS.length]).join(' ');

describe('an answer without usage', () => {
  test(
    'a long one is counted by the worker, exactly; with an output cap, the count stops past it ' +
      'and the charge is the hold',
    async () => {
      const content = longText(20_000);
      const upstream = t.track(wordyUpstream(content));
      const gateway = t.gateway({
        providers: { wordy: { type: 'openai', base_url: upstream.url } },
        models: { model_03: { provider: 'wordy', upstream_model: 'w' } },
      });
      const { key } = await gateway.createKey({ credits: 100 });
      const jobsBefore = countPool().jobsAccepted;
      const response = await gateway.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'Talk.' }] }),
      });
      expect(response.status).toBe(200);
      const body = (await response.json()) as { usage: { completion_tokens: number } };
      expect(body.usage.completion_tokens).toBe(countTextTokens(content));
      expect(countPool().jobsAccepted).toBe(jobsBefore + 1);

      const capped = await gateway.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify({
          model: 'model_03',
          max_completion_tokens: 100,
          messages: [{ role: 'user', content: 'Talk.' }],
        }),
      });
      expect(capped.status).toBe(200);
      const cappedBody = (await capped.json()) as {
        id: string;
        usage: { completion_tokens: number };
      };
      expect(cappedBody.usage.completion_tokens).toBeGreaterThan(100);
      expect(cappedBody.usage.completion_tokens).toBeLessThan(countTextTokens(content));
      const status = (await (
        await gateway.request(`/api/v1/requests/${cappedBody.id}`, { headers: bearer(key) })
      ).json()) as Record<string, number>;
      expect(status.charged_credits).toBe(status.reserved_credits);
    },
  );

  test(
    'a decision answer far longer than any labels is not read, even one that starts with valid ' +
      'answers: 502',
    async () => {
      // Valid answers, then 360 KB of words: an answer that long is refused unread (JSON-parsing 16
      // MiB of it would hold the event loop).
      const upstream = t.track(wordyUpstream(`{"q": "a"} ${longText(60_000)}`));
      const gateway = t.gateway({
        providers: { wordy: { type: 'openai', base_url: upstream.url } },
        models: { model_03: { provider: 'wordy', upstream_model: 'w' } },
      });
      const { key } = await gateway.createKey({ credits: 100 });
      const response = await gateway.request('/decision/v1/decide/', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify({
          model: 'decision-fast',
          state: {},
          questions: { q: { type: 'choice', prompt: 'Which?', criteria: { a: 'one', b: 'two' } } },
        }),
      });
      expect(response.status).toBe(502);
      expect(((await response.json()) as { error: { code: string } }).error.code).toBe(
        'upstream_invalid_response',
      );
    },
  );
});

describe('counting an answer for a key whose own queue is full', () => {
  test(
    'still goes to the worker (admitted work is ' +
      'never refused), never back onto the event loop',
    async () => {
      const { countAnswerTokens } = await import('../../src/billing/offload.ts');
      const { createLogger } = await import('../../src/util/log.ts');
      const logger = createLogger('silent');
      const abort = new AbortController();
      // Eight large prompts of the key fill its queue (the per-key bound).
      const filler = 'zq'.repeat(200_000);
      const queued = Array.from({ length: 8 }, (_, i) =>
        countPool()
          .run(
            {
              body: null,
              fingerprintPath: null,
              prompt: {
                messages: [{ role: 'user', content: `${i} ${filler}` }],
                toolsJson: null,
                toolsInBody: false,
                limit: 1e9,
              },
            },
            { keyId: 'key_full', signal: abort.signal, logger },
          )
          .catch(() => null),
      );
      const accepted = countPool().jobsAccepted;
      const answer = longText(2_000);
      const counting = countAnswerTokens('key_full', [answer], 1e9, null, logger);
      expect(counting).toBeInstanceOf(Promise);
      expect(countPool().jobsAccepted).toBe(accepted + 1);
      abort.abort();
      await Promise.all(queued);
      expect(await counting).toBe(countTextTokens(answer));
    },
  );
});
