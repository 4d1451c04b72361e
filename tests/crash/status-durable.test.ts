// A status read reports only what is durable: polled the moment a finish is applied in memory
// (inside the commit, before its fsync), it waits for the finish to reach the disk. Found by the
// crash loop's author: a crash in that window would have turned a reported "completed, charged"
// into "interrupted, free".
import { afterEach, expect, test } from 'bun:test';
import type { Event } from '../../src/state/events.ts';
import { bearer, chatBody, openTestGateway, type TestGateway } from '../support/gateway.ts';

let opened: TestGateway | null = null;
afterEach(async () => {
  await opened?.close();
  opened = null;
});

for (const service of ['chat', 'decision'] as const) {
  test(`${service}: a status read during the finish's fsync waits for it`, async () => {
    const t = (opened = openTestGateway({ wal: { fsync: 'always' } }));
    const { key } = await t.createKey({ credits: 100 });
    const store = t.gateway.store;
    const commit = store.commit.bind(store);
    const seen: Array<{ status: string; durable: boolean }> = [];
    const polls: Promise<void>[] = [];
    store.commit = (events: Event[]) => {
      const durable = commit(events);
      for (const event of events) {
        if (event.type !== 'request.finished') continue;
        let isDurable = false;
        void durable.then(
          () => (isDurable = true),
          () => {},
        );
        const path =
          service === 'chat'
            ? `/api/v1/requests/${event.request_id}`
            : `/decision/v1/requests/${event.request_id}/`;
        polls.push(
          t.request(path, { headers: bearer(key) }).then(async (response) => {
            const body = (await response.json()) as { request_status?: string; status?: string };
            seen.push({ status: (body.request_status ?? body.status)!, durable: isDurable });
          }),
        );
      }
      return durable;
    };
    const response =
      service === 'chat'
        ? await t.request('/api/v1/chat/completions', {
            method: 'POST',
            headers: bearer(key),
            body: JSON.stringify(chatBody({ stream: true })),
          })
        : await t.request('/decision/v1/decide/', {
            method: 'POST',
            headers: bearer(key),
            body: JSON.stringify({
              model: 'decision-fast',
              state: { ticket: 'down' },
              questions: {
                urgency: {
                  type: 'choice',
                  prompt: 'How urgent?',
                  criteria: { urgent: 'today', routine: 'later' },
                },
              },
            }),
          });
    expect(response.status).toBe(200);
    await response.text();
    await Promise.all(polls);
    expect(seen).toEqual([{ status: 'completed', durable: true }]);
  });
}
