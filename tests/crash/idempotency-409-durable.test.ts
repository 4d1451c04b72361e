// A 409 that names the original request is sent only once that request's start is durable. Found by
// the crash loop: a twin answered request_in_progress with an id the restarted gateway had never
// logged. Here the order is observed in process, without a kill: the durable commit of the
// original's request.started must come before the twin's 409 exists.
import { afterEach, expect, test } from 'bun:test';
import type { Event } from '../../src/state/events.ts';
import { bearer, chatBody, openTestGateway, type TestGateway } from '../support/gateway.ts';

let opened: TestGateway | null = null;
afterEach(async () => {
  await opened?.close();
  opened = null;
});

test('a twin hears request_in_progress only after the original start is on disk', async () => {
  const t = (opened = openTestGateway({ wal: { fsync: 'always' } }));
  const { key } = await t.createKey({ credits: 100 });
  const order: string[] = [];
  const store = t.gateway.store;
  const commit = store.commit.bind(store);
  // Observe, without changing behaviour, when each request.started becomes durable.
  store.commit = (events: Event[]) => {
    const durable = commit(events);
    for (const event of events) {
      if (event.type === 'request.started')
        void durable.then(
          () => order.push(`durable ${event.request_id}`),
          () => {},
        );
    }
    return durable;
  };

  const rounds = 10;
  const refusedBeforeDurable: string[] = [];
  let refusals = 0;
  for (let round = 0; round < rounds; round++) {
    order.length = 0;
    const init = () => ({
      method: 'POST',
      headers: bearer(key, { 'idempotency-key': `twin-409-${round}` }),
      body: JSON.stringify(chatBody({ messages: [{ role: 'user', content: `round ${round}` }] })),
    });
    const original = t.request('/api/v1/chat/completions', init());
    const twin = t.request('/api/v1/chat/completions', init()).then((response) => {
      // Noted the moment the answer exists (its header names the original), before any further
      // tick.
      if (response.status === 409)
        order.push(`409 ${response.headers.get('x-service-request-status')?.split('/').at(-1)}`);
      return response.text();
    });
    await Promise.all([original.then((r) => r.text()), twin]);
    const answered = order.findIndex((line) => line.startsWith('409 '));
    if (answered === -1) continue;
    refusals++;
    const id = order[answered]!.slice(4);
    const durableAt = order.indexOf(`durable ${id}`);
    if (durableAt === -1 || durableAt > answered)
      refusedBeforeDurable.push(`round ${round}: ${order.join(' → ')}`);
  }
  // Both arrive together, so the twin is refused while the original runs: the case under test
  // happened.
  expect(refusals).toBe(rounds);
  expect(refusedBeforeDurable).toEqual([]);
});
