// Request bodies (src/http/body.ts): a large body reaches its handler a turn of the event loop
// after the turn that decoded it, so decoding and parsing 4 MB never share one turn (CONTRACT §8:
// no request holds the loop for 50 ms); a small one goes straight on.
import { describe, expect, test } from 'bun:test';
import { BODY_YIELD_CHARS, readBodyText } from '../../src/http/body.ts';
import { ByteBudget } from '../../src/util/byte-budget.ts';
import type { GatewayError } from '../../src/util/errors.ts';

/** Event loop turns (setImmediate callbacks) that pass before `promise` settles. */
async function turnsUntil(promise: Promise<unknown>): Promise<number> {
  let turns = 0;
  let settled = false;
  void promise.finally(() => {
    settled = true;
  });
  while (!settled) {
    await new Promise((resolve) => setImmediate(resolve));
    turns++;
  }
  return turns;
}

function post(body: string | ReadableStream<Uint8Array>, length?: number): Request {
  const headers: Record<string, string> = {};
  if (length !== undefined) headers['content-length'] = String(length);
  return new Request('http://gateway.test/', { method: 'POST', body, headers });
}

function chunked(text: string): ReadableStream<Uint8Array> {
  const bytes = new TextEncoder().encode(text);
  return new ReadableStream({
    start(controller) {
      for (let i = 0; i < bytes.length; i += 64 * 1024)
        controller.enqueue(bytes.slice(i, i + 64 * 1024));
      controller.close();
    },
  });
}

const budget = new ByteBudget(Number.POSITIVE_INFINITY);

describe('a large body is handed on in the next turn of the event loop', () => {
  const small = 'x'.repeat(1024);
  const large = 'x'.repeat(BODY_YIELD_CHARS + 1);

  test('with Content-Length: one turn more than a small body, and the same text', async () => {
    const smallRead = readBodyText(post(small, small.length), 4 * 1024 * 1024, 10_000, budget);
    const smallTurns = await turnsUntil(smallRead);
    const largeRead = readBodyText(post(large, large.length), 4 * 1024 * 1024, 10_000, budget);
    const largeTurns = await turnsUntil(largeRead);
    expect(largeTurns).toBe(smallTurns + 1);
    expect(await largeRead).toBe(large);
    expect(await smallRead).toBe(small);
  });

  test('chunked: one turn more than a small chunked body, and the same text', async () => {
    const smallRead = readBodyText(post(chunked(small)), 4 * 1024 * 1024, 10_000, budget);
    const smallTurns = await turnsUntil(smallRead);
    const largeRead = readBodyText(post(chunked(large)), 4 * 1024 * 1024, 10_000, budget);
    const largeTurns = await turnsUntil(largeRead);
    expect(largeTurns).toBeGreaterThan(smallTurns);
    expect(await largeRead).toBe(large);
    expect(await smallRead).toBe(small);
  });
});

describe('request bodies being read at once are bounded, all connections together', () => {
  test('past the bound a body is 503 at once; its bytes come back at its end', async () => {
    const tight = new ByteBudget(3_000);
    const body = 'x'.repeat(2_000);
    // A body that has not all arrived holds its share meanwhile.
    const pending = Promise.withResolvers<void>();
    const stream = new ReadableStream<Uint8Array>({
      async pull(controller) {
        controller.enqueue(new TextEncoder().encode(body));
        await pending.promise;
        controller.close();
      },
    });
    const holding = readBodyText(
      new Request('http://x/', { method: 'POST', body: stream, duplex: 'half' } as RequestInit),
      4 * 1024 * 1024,
      10_000,
      tight,
    );
    while (tight.bytes === 0) await new Promise((resolve) => setImmediate(resolve));
    expect(tight.bytes).toBe(2_000);
    const refused = await readBodyText(
      post(body, body.length),
      4 * 1024 * 1024,
      10_000,
      tight,
    ).then(
      () => null,
      (error: GatewayError) => error,
    );
    expect(refused).toMatchObject({ code: 'service_unavailable', status: 503 });
    pending.resolve();
    expect(await holding).toBe(body);
    expect(tight.bytes).toBe(0);
    // With the room back, the same body is read.
    expect(await readBodyText(post(body, body.length), 4 * 1024 * 1024, 10_000, tight)).toBe(body);
    expect(tight.bytes).toBe(0);
  });
});
