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

test('one key holding many answers in flight cannot stall the commits of another', async () => {
  // Each fsync waits up to two turns (1 ms) while more commits are expected; a key whose requests
  // hang keeps that count high for as long as it likes. The wait is capped, so a commit that has
  // nothing to wait for still lands: without the cap this request would never be answered.
  const fake = cleanup.track(startFakeUpstream('hang'));
  const t = cleanup.gateway(upstreamOverrides(fake, { wal: { fsync: 'always' } }));
  const attacker = await t.createKey({ credits: 100 });
  const victim = await t.createKey({ credits: 100 });
  const HUNG = 20;
  for (let i = 0; i < HUNG; i++) {
    void t.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(attacker.key),
      body: JSON.stringify(chatBody()),
    });
  }
  while (t.gateway.registry.unstreamedSize < HUNG) await turn();
  // On the simulator, with an Idempotency-Key: its start and its finish are both committed.
  const answer = await t.request('/api/v1/chat/completions', {
    method: 'POST',
    headers: bearer(victim.key, { 'idempotency-key': 'victim-request-0001' }),
    body: JSON.stringify(chatBody({ model: 'model_04' })),
  });
  expect(answer.status).toBe(200);
  expect(t.gateway.registry.unstreamedSize).toBe(HUNG);
});
