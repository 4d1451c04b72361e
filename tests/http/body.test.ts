// Request bodies (src/http/body.ts): a large body reaches its handler a turn of the event loop
// after the turn that decoded it, so decoding and parsing 4 MB never share one turn (CONTRACT §8:
// no request holds the loop for 50 ms); a small one goes straight on.
import { describe, expect, test } from 'bun:test';
import { BODY_YIELD_CHARS, readBodyText } from '../../src/http/body.ts';

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

describe('a large body is handed on in the next turn of the event loop', () => {
  const small = 'x'.repeat(1024);
  const large = 'x'.repeat(BODY_YIELD_CHARS + 1);

  test('with Content-Length: one turn more than a small body, and the same text', async () => {
    const smallRead = readBodyText(post(small, small.length), 4 * 1024 * 1024, 10_000);
    const smallTurns = await turnsUntil(smallRead);
    const largeRead = readBodyText(post(large, large.length), 4 * 1024 * 1024, 10_000);
    const largeTurns = await turnsUntil(largeRead);
    expect(largeTurns).toBe(smallTurns + 1);
    expect(await largeRead).toBe(large);
    expect(await smallRead).toBe(small);
  });

  test('chunked: one turn more than a small chunked body, and the same text', async () => {
    const smallRead = readBodyText(post(chunked(small)), 4 * 1024 * 1024, 10_000);
    const smallTurns = await turnsUntil(smallRead);
    const largeRead = readBodyText(post(chunked(large)), 4 * 1024 * 1024, 10_000);
    const largeTurns = await turnsUntil(largeRead);
    expect(largeTurns).toBeGreaterThan(smallTurns);
    expect(await largeRead).toBe(large);
    expect(await smallRead).toBe(small);
  });
});
