// What finished requests leave to the collector: nothing a young collection has to keep. Each
// request's actor (and with it its abort, its upstream call, its stream) used to outlive its end in
// the gateway's Maps until the next full collection (src/util/id-map.ts explains how), so young
// collections found megabytes alive and paused for tens of ms (bench/README.md, "Where the tail
// comes from").

import { edenGC, fullGC, heapStats } from 'bun:jsc';
import { expect, test } from 'bun:test';
import { bearer, chatBody, closedAfterEach } from '../support/gateway.ts';

const cleanup = closedAfterEach();

/**
 * Requests per batch, and batches. The tables of requests in flight fill and are remade many times
 * in each batch.
 */
const BATCH_REQUESTS = 200;
const BATCHES = 6;
const CONCURRENCY = 16;
/**
 * Plain objects a young collection may still find once a batch has ended: a few (1–5 seen), never
 * one per request. A request kept alive keeps several (its actor, its init, its record, its
 * events): with the registry's actors in a Map (the bug util/id-map.ts fixed), the fewest a batch
 * left was 571.
 */
const LEFT_MAX = BATCH_REQUESTS / 2;

/**
 * Plain objects: an actor holds no native object of its own (its abort is util/abort.ts), so what a
 * kept request shows in the heap is its plain objects.
 */
function plainObjects(): number {
  return heapStats().objectTypeCounts.Object ?? 0;
}

async function turn(): Promise<void> {
  await new Promise((resolve) => setImmediate(resolve));
}

test('a young collection frees the requests that finished, streamed or not', async () => {
  const t = cleanup.gateway({ limits: { default_rate_limit_rpm: 1_000_000 } });
  const { key } = await t.createKey({ credits: 1_000_000 });
  const send = async (i: number): Promise<void> => {
    const response = await t.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody(i % 2 === 1 ? { stream: true } : {})),
    });
    expect(response.status).toBe(200);
    await response.text();
  };
  const load = async (requests: number): Promise<void> => {
    let sent = 0;
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (sent < requests) await send(sent++);
      }),
    );
  };
  // Warmed up, then the gateway's long-lived objects (its tables of requests in flight among them)
  // go to the old generation, as they do under load.
  await load(CONCURRENCY);
  // A young collection that runs during a batch keeps what the requests then in flight hold (on
  // both sides of the socket) until the next full one, as it should: how often that happens depends
  // on the heap the earlier tests left. What this test looks for, a structure that keeps finished
  // requests, keeps them in every batch, so the fewest left by any batch is what counts.
  const left: number[] = [];
  for (let batch = 0; batch < BATCHES; batch++) {
    fullGC();
    const before = plainObjects();
    await load(BATCH_REQUESTS);
    while (t.gateway.registry.size > 0 || t.gateway.endingStreams.size > 0) await turn();
    edenGC();
    left.push(plainObjects() - before);
  }
  expect(Math.min(...left)).toBeLessThan(LEFT_MAX);
});
