// The count worker and its pool: the same counts as the event loop, keys served in turns, bounds,
// dropped and crashed jobs.
import { afterEach, describe, expect, test } from 'bun:test';
import { randomBytes } from 'node:crypto';
import { type CountJob, type CountResult, runCountJob } from '../../src/billing/count-jobs.ts';
import { CountPool, type JobOwner } from '../../src/billing/count-pool.ts';
import { COUNT_WORKER_URL } from '../../src/billing/offload.ts';
import { countPromptTokensOf, countTextTokens } from '../../src/billing/tokens.ts';
import type { DecisionBodyJob, DecisionBodyResult } from '../../src/decision/count-job.ts';
import type { ProviderMessage } from '../../src/providers/provider.ts';
import { GatewayError } from '../../src/util/errors.ts';
import { createLogger } from '../../src/util/log.ts';
import type { TestJob, TestResult } from './fixtures/test-worker.ts';

const LOGGER = createLogger('silent');
const TEST_WORKER_URL = new URL('./fixtures/test-worker.ts', import.meta.url);

const pools: Array<CountPool<unknown, unknown>> = [];
afterEach(() => {
  for (const pool of pools.splice(0)) pool.close();
});

/** A pool on the real count worker; its jobs are billing's unless the caller names a kind. */
function countPool<Job = CountJob, Result = CountResult>(): CountPool<Job, Result> {
  const pool = new CountPool<Job, Result>({
    workerUrl: COUNT_WORKER_URL,
    jobsMax: 64,
    keyJobsMax: 64,
    sliceDeadlineMs: 30_000,
  });
  pools.push(pool as CountPool<unknown, unknown>);
  return pool;
}

function testPool(
  options: { jobsMax?: number; keyJobsMax?: number; sliceDeadlineMs?: number } = {},
): CountPool<TestJob, TestResult> {
  const pool = new CountPool<TestJob, TestResult>({
    workerUrl: TEST_WORKER_URL,
    jobsMax: 64,
    keyJobsMax: 64,
    sliceDeadlineMs: 30_000,
    ...options,
  });
  pools.push(pool as CountPool<unknown, unknown>);
  return pool;
}

function owner(keyId: string, signal: AbortSignal | null = null): JobOwner {
  return { keyId, signal, logger: LOGGER };
}

/** The error a promise rejects with, as {status, code} (and Retry-After, if any). */
async function refusal(
  promise: Promise<unknown>,
): Promise<{ status: number; code: string; retryAfter?: string }> {
  try {
    await promise;
  } catch (error) {
    expect(error).toBeInstanceOf(GatewayError);
    const { status, code, headers } = error as GatewayError;
    return headers?.['retry-after']
      ? { status, code, retryAfter: headers['retry-after'] }
      : { status, code };
  }
  throw new Error('expected a refusal');
}

/**
 * Varied text: words, code, numbers, unicode, whitespace runs, special-token spellings, long runs.
 */
function mixedText(chars: number, seed: number): string {
  const parts = [
    'The',
    'quick',
    "don't",
    'Zoë',
    '日本語',
    '🙂',
    '123',
    '4567',
    'x=1;',
    'if (a) {',
    '}',
    '\n',
    '\n\n',
    '   ',
    '\t',
    '<|endoftext|>',
    'CamelCase',
  ];
  let state = seed;
  let text = '';
  while (text.length < chars) {
    state = (Math.imul(state, 1_103_515_245) + 12_345) >>> 0;
    text += parts[state % parts.length]! + (state % 5 === 0 ? '' : ' ');
    if (state % 97 === 0) text += randomBytes(300 + (state % 700)).toString('base64');
  }
  return text;
}

function randomCjk(chars: number): string {
  const bytes = randomBytes(2 * chars);
  let text = '';
  for (let i = 0; i < chars; i++)
    text += String.fromCharCode(0x4e00 + (bytes.readUInt16LE(2 * i) % 20_000));
  return text;
}

/**
 * A fresh prompt (never counted before, in either thread): texts of several kinds, tool calls,
 * tools.
 */
function freshPrompt(seed: number): { messages: ProviderMessage[]; toolsJson: string | null } {
  const messages: ProviderMessage[] = [
    { role: 'system', content: mixedText(2_000 + seed * 37, seed) },
    { role: 'user', content: mixedText(20_000 + ((seed * 7_919) % 40_000), seed + 1_000) },
    {
      role: 'assistant',
      content: seed % 2 ? null : randomCjk(3_000),
      tool_calls: [
        {
          id: `c${seed}`,
          type: 'function',
          function: {
            name: 'lookup',
            arguments: JSON.stringify({ q: randomBytes(5_000).toString('base64') }),
          },
        },
      ],
    },
    { role: 'tool', content: randomBytes(20_000).toString('base64'), tool_call_id: `c${seed}` },
    { role: 'user', content: `${'   '.repeat(seed)}${mixedText(30_000, seed + 2_000)}` },
  ];
  const toolsJson =
    seed % 3 === 0
      ? null
      : JSON.stringify([
          {
            type: 'function',
            function: {
              name: 'lookup',
              description: mixedText(5_000, seed + 3_000),
              parameters: { type: 'object' },
            },
          },
        ]);
  return { messages, toolsJson };
}

function promptJob(messages: ProviderMessage[], toolsJson: string | null, limit: number): CountJob {
  return {
    body: null,
    fingerprintPath: null,
    prompt: { messages, toolsJson, toolsInBody: false, limit },
  };
}

describe('the count worker', () => {
  test('counts exactly as the event loop does, with and without a limit', async () => {
    const pool = countPool();
    const limits = [Number.POSITIVE_INFINITY, 1_000_000, 30_000, 12_345, 1_000, 10];
    for (let seed = 1; seed <= 12; seed++) {
      const limit = limits[seed % limits.length]!;
      // Each side counts its own fresh copy (the count caches are per thread, and a cached text is
      // counted whole).
      const { messages, toolsJson } = freshPrompt(seed);
      const copy = structuredClone({ messages, toolsJson });
      const worker = await pool.run(promptJob(messages, toolsJson, limit), owner('key_a'));
      const inline = countPromptTokensOf(copy.messages, copy.toolsJson, limit);
      expect({ seed, limit, tokens: worker.tokens }).toEqual({ seed, limit, tokens: inline });
    }
  }, 60_000);

  test(
    'the same steps run in this thread give the same ' +
      'count (the job is the event loop code, paused)',
    () => {
      for (let seed = 20; seed <= 24; seed++) {
        const { messages, toolsJson } = freshPrompt(seed);
        const copy = structuredClone({ messages, toolsJson });
        const steps = runCountJob(promptJob(messages, toolsJson, 50_000));
        let step = steps.next();
        let pauses = 0;
        for (; !step.done; step = steps.next()) pauses++;
        expect(pauses).toBeGreaterThan(1);
        expect(step.value.tokens).toBe(countPromptTokensOf(copy.messages, copy.toolsJson, 50_000));
      }
    },
  );

  test('stops past its limit, like the event loop, ' +
    'and reports which contents it counted whole', async () => {
    const pool = countPool();
    const text = mixedText(1_000_000, 77);
    const short = 'a short system prompt';
    const messages: ProviderMessage[] = [
      { role: 'system', content: short },
      { role: 'user', content: text },
    ];
    // On this thread: stopped first (a stopped count is not cached), then the full count without
    // the cache.
    const inline = countPromptTokensOf(structuredClone(messages), null, 1_000);
    const full = countTextTokens(text);
    const stopped = await pool.run(promptJob(messages, null, 1_000), owner('key_a'));
    expect(stopped.tokens).toBeGreaterThan(1_000);
    expect(stopped.tokens).toBeLessThan(full / 10);
    expect(stopped.tokens).toBe(inline);
    // The short text was counted whole (cacheable); the long one was not.
    expect(stopped.contentCounts).toEqual([
      countPromptTokensOf([{ role: 'user', content: short }], null) - 6,
      -1,
    ]);
  }, 60_000);

  test('a large decision body: parsed, validated, fingerprinted, its prompt built and counted as ' +
    'the event loop would', async () => {
    const { requestFingerprint } = await import('../../src/idempotency/fingerprint.ts');
    const { buildPrompt } = await import('../../src/decision/prompt.ts');
    const { validateDecisionRequest } = await import('../../src/decision/model.ts');
    const { defaultConfig } = await import('../../src/config/defaults.ts');
    const pool = countPool<DecisionBodyJob, DecisionBodyResult>();
    const body = JSON.stringify({
      model: 'decision-fast',
      state: { b: [1, { z: 'x', a: mixedText(50_000, 5) }], a: null },
      questions: {
        q: { type: 'choice', prompt: 'p?', criteria: { ['__proto__']: 'one', b: 'two' } },
      },
    });
    const json = JSON.parse(body);
    const config = defaultConfig();
    const decisionConfig = {
      models: config.decision.models,
      tools: { 'decision-fast': true, 'decision-accurate': true },
    };
    const job = {
      body: null,
      fingerprintPath: '/decision/v1/decide/',
      prompt: null,
      decisionBody: { text: body, config: decisionConfig, limit: 32_000 },
    };
    const result = await pool.run(job, owner('key_a'));
    const decision = validateDecisionRequest(json, config);
    const prompt = buildPrompt(json.state, decision.questions, true);
    expect(result.decision).toEqual({ modelName: 'decision-fast', questions: decision.questions });
    expect(result.fingerprint).toBe(requestFingerprint('POST', '/decision/v1/decide/', json));
    expect(JSON.stringify(result.prompt)).toBe(JSON.stringify(prompt));
    expect(result.tokens).toBe(
      countPromptTokensOf(prompt.messages, JSON.stringify(prompt.tools), 32_000),
    );
    // What validation refuses comes back as the error to answer with.
    const refused = await pool.run(
      {
        ...job,
        decisionBody: {
          ...job.decisionBody,
          text: JSON.stringify({ ...json, model: 'decision-slow' }),
        },
      },
      owner('key_a'),
    );
    expect(refused.error).toMatchObject({ code: 'model_not_found', param: 'model' });
  }, 30_000);
});

describe('CountPool', () => {
  test("keys take turns: one key's queued jobs delay " +
    "another key's job by a slice, not by whole jobs", async () => {
    const pool = testPool();
    const done: string[] = [];
    const jobs: Array<Promise<unknown>> = [];
    const submit = (keyId: string, tag: string, steps: number) =>
      jobs.push(pool.run({ tag, steps, stepMs: 2 }, owner(keyId)).then(() => done.push(tag)));
    // Key A queues four jobs of ~20 slices each, then B and C one job of ~20 slices and D a tiny
    // one.
    for (let i = 1; i <= 4; i++) submit('key_a', `a${i}`, 100);
    submit('key_b', 'b1', 100);
    submit('key_c', 'c1', 100);
    submit('key_d', 'd1', 1);
    await Promise.all(jobs);
    expect(done.indexOf('d1')).toBe(0);
    // A's first job, B's and C's run side by side; A's second waits for them.
    expect(done.slice(1, 4).sort()).toEqual(['a1', 'b1', 'c1']);
    expect(done.slice(4)).toEqual(['a2', 'a3', 'a4']);
  }, 30_000);

  test('a key past its bound is refused (429); at the overall bound the key holding the most ' +
    'gives ' +
    'up its newest job, and only then is anyone refused (503)', async () => {
    const pool = testPool({ keyJobsMax: 2, jobsMax: 3 });
    const long = { steps: 20, stepMs: 2 };
    const a1 = pool.run({ tag: 'a1', ...long }, owner('key_a'));
    const a2 = pool.run({ tag: 'a2', ...long }, owner('key_a'));
    expect(await refusal(pool.run({ tag: 'a3', ...long }, owner('key_a')))).toEqual({
      status: 429,
      code: 'rate_limit_exceeded',
      retryAfter: '1',
    });
    const b1 = pool.run({ tag: 'b1', ...long }, owner('key_b'));
    // Full (a1, a2, b1): key_c holds nothing, key_a the most; key_a's newest waiting job makes
    // room.
    const c1 = pool.run({ tag: 'c1', ...long }, owner('key_c'));
    expect(await refusal(a2)).toEqual({
      status: 429,
      code: 'rate_limit_exceeded',
      retryAfter: '1',
    });
    expect(pool.size).toBe(3);
    // Now every key holds one: nobody holds more than key_d would, so key_d is refused.
    expect(await refusal(pool.run({ tag: 'd1', ...long }, owner('key_d')))).toEqual({
      status: 503,
      code: 'service_unavailable',
    });
    // Admitted work (an answer already served) is never refused for room, and never given up.
    const admitted = pool.run({ tag: 'd2', ...long }, owner('key_d'), true);
    expect(pool.size).toBe(4);
    expect((await Promise.all([a1, b1, c1, admitted])).map((result) => result.tag)).toEqual([
      'a1',
      'b1',
      'c1',
      'd2',
    ]);
    expect(pool.size).toBe(0);
    expect((await pool.run({ tag: 'a4', steps: 1, stepMs: 0 }, owner('key_a'))).tag).toBe('a4');
  }, 30_000);

  test('a job whose client has gone is dropped, queued or running', async () => {
    const pool = testPool();
    const gone = new AbortController();
    gone.abort();
    expect(
      await refusal(pool.run({ tag: 'x', steps: 1, stepMs: 0 }, owner('key_a', gone.signal))),
    ).toEqual({ status: 499, code: 'request_cancelled' });
    expect(pool.size).toBe(0);

    // A's job runs first (a thousand slices); B's waits behind it; both clients leave.
    const leaveRunning = new AbortController();
    const leaveQueued = new AbortController();
    const running = pool.run(
      { tag: 'a1', steps: 5_000, stepMs: 2 },
      owner('key_a', leaveRunning.signal),
    );
    const queued = pool.run(
      { tag: 'b1', steps: 5_000, stepMs: 2 },
      owner('key_b', leaveQueued.signal),
    );
    const other = pool.run({ tag: 'c1', steps: 3, stepMs: 1 }, owner('key_c'));
    leaveQueued.abort();
    expect(await refusal(queued)).toEqual({ status: 499, code: 'request_cancelled' });
    leaveRunning.abort();
    expect(await refusal(running)).toEqual({ status: 499, code: 'request_cancelled' });
    expect((await other).tag).toBe('c1');
    // Both left the queue: nothing more is served for them.
    expect(pool.size).toBe(0);
  }, 30_000);

  for (const fail of ['throw', 'exit', 'hang'] as const) {
    test(`a worker that dies or hangs (${fail}) fails its job with 503; the queue goes on in a ` +
      `new worker`, async () => {
      const pool = testPool({ sliceDeadlineMs: 1_000 });
      // B's job starts first (and pauses in the worker that dies); A's second job waits behind the
      // failing one.
      const before = pool.run({ tag: 'b1', steps: 30, stepMs: 2 }, owner('key_b'));
      const failing = pool.run({ tag: 'a1', steps: 1, stepMs: 0, fail }, owner('key_a'));
      const after = pool.run({ tag: 'a2', steps: 3, stepMs: 1 }, owner('key_a'));
      expect(await refusal(failing)).toEqual({ status: 503, code: 'service_unavailable' });
      const [b1, a2] = await Promise.all([before, after]);
      expect([b1.tag, a2.tag]).toEqual(['b1', 'a2']);
      expect(b1.threadId).toBe(a2.threadId);
      expect(pool.size).toBe(0);
      // And the worker after that is a live one.
      expect((await pool.run({ tag: 'c1', steps: 1, stepMs: 0 }, owner('key_c'))).threadId).toBe(
        a2.threadId,
      );
    }, 30_000);
  }
});
