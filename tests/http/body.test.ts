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
const MIB = 1024 * 1024;

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
  const KIB = 1024;
  const never = () => new Promise<void>(() => {});

  /** A body whose first `firstBytes` arrive at once, the rest when `rest` resolves (or never). */
  function trickled(firstBytes: number, rest: Promise<void>): ReadableStream<Uint8Array> {
    let sent = false;
    return new ReadableStream<Uint8Array>({
      async pull(controller) {
        if (!sent) {
          sent = true;
          controller.enqueue(new Uint8Array(firstBytes).fill(120));
          return;
        }
        await rest;
        controller.close();
      },
    });
  }

  async function turnsUntilHeld(budget: ByteBudget, bytes: number): Promise<void> {
    while (budget.bytes < bytes) await new Promise((resolve) => setImmediate(resolve));
  }

  test('past the bound a body is 503 at once; its bytes come back at its end', async () => {
    const tight = new ByteBudget(100 * KIB);
    const release = Promise.withResolvers<void>();
    const holding = readBodyText(post(trickled(70 * KIB, release.promise)), 4 * MIB, 10_000, tight);
    await turnsUntilHeld(tight, 70 * KIB);
    // A declared 70 KiB body is read as it arrives, and its bytes do not fit.
    const body = 'x'.repeat(70 * KIB);
    const refused = await readBodyText(post(body, body.length), 4 * MIB, 10_000, tight).then(
      () => null,
      (error: GatewayError) => error,
    );
    expect(refused).toMatchObject({ code: 'service_unavailable', status: 503 });
    release.resolve();
    expect((await holding).length).toBe(70 * KIB);
    expect(tight.bytes).toBe(0);
    expect(await readBodyText(post(body, body.length), 4 * MIB, 10_000, tight)).toBe(body);
    expect(tight.bytes).toBe(0);
  });

  test('a declared length is no claim on the budget: only bytes that arrived are', async () => {
    const tight = new ByteBudget(100 * KIB);
    // Declares 4 MiB, sends 1 KiB, then nothing: 1 KiB held, not 4 MiB.
    const stalled = readBodyText(post(trickled(KIB, never()), 4 * MIB), 4 * MIB, 60_000, tight);
    stalled.catch(() => {});
    await turnsUntilHeld(tight, KIB);
    expect(tight.bytes).toBe(KIB);
    const body = 'y'.repeat(80 * KIB);
    expect(await readBodyText(post(body, body.length), 4 * MIB, 10_000, tight)).toBe(body);
  });

  test('every end of a read gives its bytes back: deadline, too large, client gone', async () => {
    const tight = new ByteBudget(8 * MIB);
    const late = readBodyText(post(trickled(100 * KIB, never())), 4 * MIB, 50, tight);
    await expect(late).rejects.toMatchObject({ code: 'invalid_request_error' });
    const huge = readBodyText(post(trickled(5 * MIB, never())), 4 * MIB, 10_000, tight);
    await expect(huge).rejects.toMatchObject({ code: 'request_too_large' });
    const broken = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new Uint8Array(100 * KIB));
        controller.error(new Error('connection reset'));
      },
    });
    const gone = readBodyText(post(broken), 4 * MIB, 10_000, tight);
    await expect(gone).rejects.toMatchObject({ code: 'request_cancelled' });
    expect(tight.bytes).toBe(0);
  });
});
