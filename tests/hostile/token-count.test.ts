// A key with no credit sending 4 MB prompts (CONTRACT §8): counted off the event loop, fairly,
// within bounds; other keys are not slowed.
import { describe, expect, test } from 'bun:test';
import { randomBytes } from 'node:crypto';
import { COUNT_KEY_JOBS_MAX, countPool } from '../../src/billing/offload.ts';
import { countPromptTokens } from '../../src/billing/tokens.ts';
import { bearer, chatBody, closedAfterEach, type TestServer } from '../support/gateway.ts';

const t = closedAfterEach();
const MAX_BODY_BYTES = 4_194_304;
const COMPLETIONS = '/api/v1/chat/completions';

/**
 * Random base64 (the tokenizer's slowest common text): a 4 MB prompt takes ~1.4 s to count (to
 * model_01's window of 1,050,000 tokens, which it passes), a 1 MB one ~0.9 s (716,000 tokens,
 * within it).
 */
function base64Prompt(bytes: number): string {
  return randomBytes(Math.ceil((bytes * 3) / 4))
    .toString('base64')
    .slice(0, bytes);
}

/** A chat body of at most 4 MB (the contract's limit) whose one message is `content`. */
function promptBody(model: string, content: string): string {
  const body = JSON.stringify({ model, messages: [{ role: 'user', content }] });
  expect(body.length).toBeLessThanOrEqual(MAX_BODY_BYTES);
  return body;
}

/**
 * The worst delay of this process's event loop (the gateway runs in it) while it runs: a 5 ms timer
 * that fires late by as much as the loop was blocked.
 */
function loopDelayMonitor(): { stop(): number } {
  const periodMs = 5;
  let lastMs = performance.now();
  let worstMs = 0;
  const timer = setInterval(() => {
    const nowMs = performance.now();
    worstMs = Math.max(worstMs, nowMs - lastMs - periodMs);
    lastMs = nowMs;
  }, periodMs);
  return {
    stop() {
      clearInterval(timer);
      return worstMs;
    },
  };
}

async function errorOf(
  response: Response,
): Promise<{ status: number; code: string; param?: string | null }> {
  const body = (await response.json()) as { error: { code: string; param: string | null } };
  return { status: response.status, code: body.error.code, param: body.error.param };
}

function post(
  server: TestServer,
  path: string,
  key: string,
  body: string,
  init: { headers?: Record<string, string>; signal?: AbortSignal } = {},
): Promise<Response> {
  return fetch(server.baseUrl + path, {
    method: 'POST',
    headers: bearer(key, init.headers),
    body,
    signal: init.signal,
  });
}

/** Waits (turn by turn, never a fixed sleep) until `condition` holds; fails after `deadlineMs`. */
async function until(condition: () => boolean, deadlineMs = 20_000): Promise<void> {
  const giveUpMs = performance.now() + deadlineMs;
  while (!condition()) {
    if (performance.now() > giveUpMs) throw new Error('condition not reached');
    await new Promise((resolve) => setImmediate(resolve));
  }
}

describe('4 MB prompts from a key with no credit', () => {
  test("are counted off the event loop: another key's calls go on, and the attacker gets its " +
    'right answers', async () => {
    const server = await t.server();
    const attacker = await server.createKey({ credits: 0 });
    const victim = await server.createKey({ credits: 100 });
    // Over model_01's window (400) and within it (402): both need the whole count, or most of it.
    const overWindow = Array.from({ length: 3 }, () =>
      promptBody('model_01', base64Prompt(MAX_BODY_BYTES - 100)),
    );
    const withinWindow = Array.from({ length: 1 }, () =>
      promptBody('model_01', base64Prompt(1024 * 1024)),
    );

    const monitor = loopDelayMonitor();
    let attackOver = false;
    const attack = Promise.all(
      [...overWindow, ...withinWindow].map(async (body) =>
        errorOf(await post(server, COMPLETIONS, attacker.key, body)),
      ),
    ).finally(() => (attackOver = true));
    // The victim calls one after another while the attack lasts; each must come back promptly.
    let victimCalls = 0;
    let victimWorstMs = 0;
    const victimStatuses = new Set<number>();
    while (!attackOver && victimCalls < 200) {
      const startMs = performance.now();
      const response = await post(server, COMPLETIONS, victim.key, JSON.stringify(chatBody()));
      await response.arrayBuffer();
      victimStatuses.add(response.status);
      victimWorstMs = Math.max(victimWorstMs, performance.now() - startMs);
      victimCalls++;
    }
    const answers = await attack;
    const loopWorstMs = monitor.stop();

    expect(answers).toEqual([
      ...overWindow.map(() => ({
        status: 400,
        code: 'context_length_exceeded',
        param: 'messages',
      })),
      ...withinWindow.map(() => ({ status: 402, code: 'insufficient_quota', param: null })),
    ]);
    expect([...victimStatuses]).toEqual([200]);
    expect(victimCalls).toBeGreaterThan(0);
    // Counted on the loop, each 4 MB prompt blocked it for ~1.4 s (the victim's calls for seconds
    // in all).
    expect(victimWorstMs).toBeLessThan(1_000);
    expect(loopWorstMs).toBeLessThan(500);
    expect(countPool().size).toBe(0);
  }, 120_000);

  test("keys take turns at the worker, a key's queue is bounded (429), and a job whose client " +
    'left ' +
    'is dropped', async () => {
    const server = await t.server();
    const attacker = await server.createKey({ credits: 0 });
    const victim = await server.createKey({ credits: 100 });
    const pool = countPool();
    // 2 MB prompts (each counted to model_01's window, ~1.4 s) fill the attacker's share of the
    // queue (~45 s of counting); two more are refused.
    const bodies = Array.from({ length: COUNT_KEY_JOBS_MAX + 2 }, () =>
      promptBody('model_01', base64Prompt(2 * 1024 * 1024)),
    );
    const leave = new AbortController();
    const settled: unknown[] = [];
    const attack = bodies.map((body) =>
      post(server, COMPLETIONS, attacker.key, body, { signal: leave.signal })
        .then(
          async (response) => errorOf(response),
          () => 'left' as const,
        )
        .then((answer) => {
          settled.push(answer);
          return answer;
        }),
    );
    await until(() => settled.length >= 2);
    expect(settled).toEqual([
      { status: 429, code: 'rate_limit_exceeded', param: null },
      { status: 429, code: 'rate_limit_exceeded', param: null },
    ]);
    await until(() => pool.size === COUNT_KEY_JOBS_MAX);

    // The victim's own large prompt (counted by the worker too) waits a slice per turn, not 45 s of
    // jobs.
    const victimPrompt =
      'The quick brown fox jumps over the lazy dog. '.repeat(5_000) + base64Prompt(20_000);
    const startMs = performance.now();
    const response = await post(
      server,
      COMPLETIONS,
      victim.key,
      promptBody('model_03', victimPrompt),
    );
    const elapsedMs = performance.now() - startMs;
    expect(response.status).toBe(200);
    const usage = ((await response.json()) as { usage: { prompt_tokens: number } }).usage;
    expect(usage.prompt_tokens).toBe(
      countPromptTokens([{ role: 'user', content: victimPrompt }], null),
    );
    expect(elapsedMs).toBeLessThan(1_000);

    // The attacker gives up: its queued and running jobs leave the queue (counted to the end, they
    // would take the worker ~40 s more).
    leave.abort();
    await until(() => pool.size === 0, 3_000);
    const answers = await Promise.all(attack);
    expect(answers.filter((answer) => answer === 'left').length).toBeGreaterThanOrEqual(
      COUNT_KEY_JOBS_MAX - 2,
    );
  }, 120_000);
});

describe('a burst of large requests from one key, under its bound', () => {
  // 16: twice what the bound was until stop 33, when a burst like this had some answered 429.
  const BURST = 16;

  test('gets the answers of the check order: 402 each for a key with no credit', async () => {
    const server = await t.server();
    const broke = await server.createKey({ credits: 0 });
    const bodies = Array.from({ length: BURST }, () =>
      promptBody('model_01', base64Prompt(200 * 1024)),
    );
    const answers = await Promise.all(
      bodies.map(async (body) => errorOf(await post(server, COMPLETIONS, broke.key, body))),
    );
    expect(answers).toEqual(
      bodies.map(() => ({ status: 402, code: 'insufficient_quota', param: null })),
    );
    expect(countPool().size).toBe(0);
  }, 60_000);

  test('one task for the same Idempotency-Key: 200 once, 409 for every repeat', async () => {
    const server = await t.server();
    const key = await server.createKey({ credits: 100_000 });
    const body = promptBody('model_01', base64Prompt(200 * 1024));
    const headers = { 'idempotency-key': `burst-${randomBytes(6).toString('hex')}` };
    const responses = await Promise.all(
      Array.from({ length: BURST }, () => post(server, COMPLETIONS, key.key, body, { headers })),
    );
    const statuses = responses.map((response) => response.status).sort();
    const ids = new Set(responses.map((response) => response.headers.get('x-request-id')));
    await Promise.all(responses.map((response) => response.arrayBuffer()));
    expect(statuses).toEqual([200, ...Array.from({ length: BURST - 1 }, () => 409)]);
    // Every 409 names the one task.
    expect(ids.size).toBe(1);
  }, 60_000);
});

describe('the checks before context answer without counting', () => {
  test('a rate-limited key and a bound Idempotency-Key ' +
    'are refused before their large prompt is counted', async () => {
    const server = await t.server();
    const pool = countPool();
    const slow = await server.createKey({ credits: 100, rate_limit_rpm: 1 });
    const bound = await server.createKey({ credits: 100 });
    // 100 KB of text nobody has counted: counted by the worker, were it to get that far.
    const large = (model = 'model_03') => promptBody(model, base64Prompt(100_000));

    expect((await post(server, COMPLETIONS, slow.key, JSON.stringify(chatBody()))).status).toBe(
      200,
    );
    let accepted = pool.jobsAccepted;
    const limited = await post(server, COMPLETIONS, slow.key, large());
    expect(await errorOf(limited)).toEqual({
      status: 429,
      code: 'rate_limit_exceeded',
      param: null,
    });
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    expect(pool.jobsAccepted).toBe(accepted);

    const idempotencyKey = { 'idempotency-key': 'token-count-precheck-1' };
    expect(
      (
        await post(server, COMPLETIONS, bound.key, JSON.stringify(chatBody()), {
          headers: idempotencyKey,
        })
      ).status,
    ).toBe(200);
    accepted = pool.jobsAccepted;
    const reused = await post(server, COMPLETIONS, bound.key, large(), { headers: idempotencyKey });
    expect(await errorOf(reused)).toEqual({
      status: 409,
      code: 'idempotency_key_reused',
      param: 'Idempotency-Key',
    });
    expect(pool.jobsAccepted).toBe(accepted);
  }, 60_000);

  test('a body too large to fingerprint on the loop ' +
    'is fingerprinted by the worker, bound or not', async () => {
    const server = await t.server();
    const key = await server.createKey({ credits: 100 });
    const body = promptBody('model_03', base64Prompt(300_000));
    const idempotencyKey = { 'idempotency-key': 'token-count-large-body-1' };
    const first = await post(server, COMPLETIONS, key.key, body, { headers: idempotencyKey });
    expect(first.status).toBe(200);
    const requestId = first.headers.get('x-request-id');
    // The same body again: the same fingerprint, so the original's answer, not a reuse.
    const again = await post(server, COMPLETIONS, key.key, body, { headers: idempotencyKey });
    expect(await errorOf(again)).toEqual({
      status: 409,
      code: 'request_already_completed',
      param: 'Idempotency-Key',
    });
    expect(again.headers.get('x-request-id')).toBe(requestId);
    const other = await post(
      server,
      COMPLETIONS,
      key.key,
      promptBody('model_03', base64Prompt(300_000)),
      { headers: idempotencyKey },
    );
    expect(await errorOf(other)).toEqual({
      status: 409,
      code: 'idempotency_key_reused',
      param: 'Idempotency-Key',
    });
  }, 60_000);
});

describe('large decision inputs', () => {
  test('a 4 MB state is refused 422 and a 130 KB one within the limit 402, made canonical and ' +
    'counted off the loop', async () => {
    const server = await t.server();
    const broke = await server.createKey({ credits: 0, services: ['decision'] });
    const questions = {
      q: { type: 'choice', prompt: 'Which?', criteria: { a: 'first', b: 'second' } },
    };
    const decide = (state: unknown, idempotencyKey: string) =>
      post(
        server,
        '/decision/v1/decide/',
        broke.key,
        JSON.stringify({ model: 'decision-fast', state, questions }),
        { headers: { 'idempotency-key': idempotencyKey } },
      );
    // Many small objects: their canonical JSON (the fingerprint's, then the prompt's) took ~130 ms
    // each on the loop.
    const objects = Array.from({ length: 290_000 }, (_, i) => ({ b: i % 10, a: 0 }));
    const monitor = loopDelayMonitor();
    const [huge, within] = await Promise.all([
      decide(objects, 'decision-huge-1'),
      decide({ text: ' hello'.repeat(22_000) }, 'decision-within-1'),
    ]);
    const loopWorstMs = monitor.stop();
    expect(await errorOf(huge)).toEqual({ status: 422, code: 'input_too_large', param: 'state' });
    expect(await errorOf(within)).toEqual({ status: 402, code: 'insufficient_quota', param: null });
    expect(loopWorstMs).toBeLessThan(200);
  }, 60_000);
});

describe('the count cache', () => {
  test("the worker's counts fill the loop's cache: a " +
    "conversation's next turn is counted on the loop", async () => {
    const server = await t.server();
    const pool = countPool();
    const key = await server.createKey({ credits: 100 });
    const history = [{ role: 'user', content: base64Prompt(60_000) }];
    let accepted = pool.jobsAccepted;
    const first = await post(
      server,
      COMPLETIONS,
      key.key,
      JSON.stringify({ model: 'model_03', messages: history }),
    );
    expect(first.status).toBe(200);
    expect(pool.jobsAccepted).toBe(accepted + 1);
    accepted = pool.jobsAccepted;
    const next = [
      ...history,
      { role: 'assistant', content: 'Noted.' },
      { role: 'user', content: 'And now?' },
    ];
    const second = await post(
      server,
      COMPLETIONS,
      key.key,
      JSON.stringify({ model: 'model_03', messages: next }),
    );
    expect(second.status).toBe(200);
    expect(
      ((await second.json()) as { usage: { prompt_tokens: number } }).usage.prompt_tokens,
    ).toBe(countPromptTokens(next as never, null));
    expect(pool.jobsAccepted).toBe(accepted);
  }, 60_000);
});
