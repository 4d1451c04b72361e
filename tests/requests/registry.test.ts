// The registry's count of the commits a group commit may wait for: requests whose answer is one
// body commit as their provider answers; a stream mid-way commits nothing until its end.
import { expect, test } from 'bun:test';
import { bearer, chatBody, closedAfterEach } from '../support/gateway.ts';
import { startFakeUpstream, upstreamOverrides } from '../support/upstream.ts';

const cleanup = closedAfterEach();

/** Lets the event loop run once. */
const turn = () => new Promise((resolve) => setImmediate(resolve));

test('only requests answered in one body count as commits expected soon', async () => {
  const fake = cleanup.track(startFakeUpstream('gated'));
  const t = cleanup.gateway(upstreamOverrides(fake));
  const { key } = await t.createKey({ credits: 10 });
  const post = (stream: boolean) =>
    t.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody({ stream })),
    });
  const streamed = post(true);
  const whole = post(false);
  while (t.gateway.registry.size < 2) await turn();
  expect(t.gateway.registry.unstreamedSize).toBe(1);
  fake.gate.resolve();
  expect((await whole).status).toBe(200);
  const stream = await streamed;
  expect(stream.status).toBe(200);
  expect(await stream.text()).toContain('[DONE]');
  while (t.gateway.registry.size > 0) await turn();
  expect(t.gateway.registry.unstreamedSize).toBe(0);
});
