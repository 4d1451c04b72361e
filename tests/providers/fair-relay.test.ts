// An upstream faster than its consumer cannot hold the event loop (§8): the relay lets the loop run
// every few hundred deltas, however many events one socket read brings.
import { afterEach, expect, test } from 'bun:test';
import { countPromptTokens } from '../../src/billing/tokens.ts';
import { OpenAIProvider } from '../../src/providers/openai/index.ts';
import type { ProviderRequest } from '../../src/providers/provider.ts';
import { createLogger } from '../../src/util/log.ts';
import { type FakeUpstream, sseResponse, startUpstream } from './fake-upstream.ts';

const upstreams: FakeUpstream[] = [];
afterEach(() => {
  for (const upstream of upstreams.splice(0)) upstream.stop();
});

const EVENTS = 40_000;

function request(stream: boolean): ProviderRequest {
  const messages: ProviderRequest['messages'] = [{ role: 'user', content: 'Flood me.' }];
  return {
    model: 'up',
    messages,
    maxOutputTokens: null,
    temperature: null,
    topP: null,
    topK: null,
    seed: null,
    stop: null,
    tools: null,
    toolChoice: null,
    promptTokens: countPromptTokens(messages, null),
    stream,
  };
}

test(
  'forty thousand one-character events in a few large reads: the loop runs between every few ' +
    'hundred deltas',
  async () => {
    const frame = `data: ${JSON.stringify({
      choices: [{ index: 0, delta: { content: 'a' }, finish_reason: null }],
    })}\n\n`;
    const parts: string[] = [];
    for (let i = 0; i < EVENTS; i += 4_000) parts.push(frame.repeat(4_000));
    parts.push(
      `data: ${JSON.stringify({
        choices: [{ index: 0, delta: {}, finish_reason: 'stop' }],
      })}\n\ndata: [DONE]\n\n`,
    );
    const upstream = startUpstream(() => sseResponse(parts));
    upstreams.push(upstream);
    const provider = new OpenAIProvider(
      'flood',
      { type: 'openai', base_url: upstream.baseUrl },
      {
        defaultTimeoutMs: 5_000,
        bodyBytesMax: 16 * 1024 * 1024,
        eventBytesMax: 1024 * 1024,
        logger: createLogger('silent'),
      },
    );

    // A turn counter: it moves only when the event loop gets to run (a macrotask).
    let turns = 0;
    let ticking = true;
    const tick = () => {
      turns++;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    let deltas = 0;
    let deltasThisTurn = 0;
    let worstRun = 0;
    let lastTurn = turns;
    try {
      for await (const delta of provider.stream(request(true), new AbortController().signal)) {
        if (delta.type !== 'text') continue;
        deltas++;
        if (turns === lastTurn) deltasThisTurn++;
        else {
          lastTurn = turns;
          deltasThisTurn = 1;
        }
        worstRun = Math.max(worstRun, deltasThisTurn);
      }
    } finally {
      ticking = false;
      provider.close();
    }
    expect(deltas).toBe(EVENTS);
    expect(worstRun).toBeLessThanOrEqual(512);
  },
);
