// The decision endpoint's status table (spec 001), row by row through HTTP: status, code, type,
// detail, no charge, X-Request-ID.
import { describe, expect, test } from 'bun:test';
import { randomBytes } from 'node:crypto';
import { countTokens } from 'gpt-tokenizer/encoding/o200k_base';
import {
  answerValidly,
  closedPortUrl,
  DEFAULT_USAGE,
  type DecisionUpstream,
  decisionUpstreamOverrides,
  startDecisionUpstream,
  type UpstreamCall,
  type UpstreamReply,
  validArguments,
} from '../support/decision-upstream.ts';
import { ADMIN_TOKEN, bearer, closedAfterEach, type TestGateway } from '../support/gateway.ts';

const DECIDE = '/decision/v1/decide/';
const REQUEST_ID_RE = /^dec_[A-Za-z0-9]+$/;
const DAY_MS = 86_400_000;
const FOUR_MB = 4 * 1024 * 1024;

/** CONTRACT §2: the error type follows the status. */
const TYPE_BY_STATUS: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'billing_error',
  404: 'invalid_request_error',
  409: 'invalid_request_error',
  413: 'invalid_request_error',
  422: 'invalid_request_error',
  429: 'rate_limit_error',
  499: 'cancelled_error',
  502: 'upstream_error',
  503: 'service_unavailable_error',
  504: 'timeout_error',
};

const cleanup = closedAfterEach();
const gateway = cleanup.gateway;
const server = cleanup.server;

function upstream(script?: (call: UpstreamCall) => UpstreamReply): DecisionUpstream {
  return cleanup.track(startDecisionUpstream(script));
}

/** A gateway whose decision-fast model (model_03) is served by a fake upstream running `script`. */
function gatewayWithUpstream(
  script?: (call: UpstreamCall) => UpstreamReply,
  extra: Record<string, unknown> = {},
): { t: TestGateway; fake: DecisionUpstream } {
  const fake = upstream(script);
  return { t: gateway(decisionUpstreamOverrides(fake.url, extra)), fake };
}

const STATE = {
  ticket: 'The checkout page returns 500 for every customer.',
  customer: 'acme',
  plan: 'enterprise',
};

function decisionBody(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    model: 'decision-fast',
    state: STATE,
    questions: {
      urgency: {
        type: 'choice',
        prompt: 'How urgent is this ticket?',
        criteria: { urgent: 'needs action today', routine: 'can wait' },
      },
      quality: {
        type: 'score',
        prompt: 'How complete is the report?',
        criteria: ['missing', 'partial', 'complete'],
      },
    },
    ...extra,
  };
}

/** What the fake upstream's valid answer (first label, highest level) reads as. */
const VALID_ANSWERS = {
  urgency: { type: 'choice', label: 'urgent' },
  quality: { type: 'score', score: 2, level: 'complete' },
};

function post(
  t: TestGateway,
  key: string | null,
  body: unknown,
  headers: Record<string, string> = {},
  signal?: AbortSignal,
): Promise<Response> {
  const base: Record<string, string> =
    key === null ? { 'content-type': 'application/json' } : bearer(key);
  return t.request(DECIDE, {
    method: 'POST',
    headers: { ...base, ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
    signal,
  });
}

interface Balances {
  credits: number;
  held: number;
  charged: number;
  credits_added: number;
  token_wallet: number;
}

async function balances(t: TestGateway, keyId: string): Promise<Balances> {
  const response = await t.request(`/admin/v1/keys/${keyId}`, {
    headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
  });
  expect(response.status).toBe(200);
  return ((await response.json()) as any).balances;
}

async function lookup(
  t: TestGateway,
  key: string,
  id: string,
): Promise<{ status: number; requestId: string | null; body: any }> {
  const response = await t.request(`/decision/v1/requests/${id}/`, { headers: bearer(key) });
  return {
    status: response.status,
    requestId: response.headers.get('x-request-id'),
    body: await response.json(),
  };
}

interface ExpectedError {
  status: number;
  code: string;
  param?: string | null;
  detail?: unknown;
  /** Extra fields inside `error` (reason, reset_at). */
  fields?: Record<string, unknown>;
  /** Fields beside `error` (the 409s' request_id, request_status, status_url). */
  topLevel?: Record<string, unknown>;
}

/**
 * Asserts one refusal: status, X-Request-ID dec_…, and the whole body — message, type (from the
 * status), code, param, and detail only where given.
 */
/** CONTRACT §2: the decision service names what is wrong with the request, these two included. */
const TOO_LARGE_DETAIL = expect.stringContaining('at most 4194304 bytes');
const REUSED_DETAIL = expect.stringContaining('different content');

async function expectError(
  response: Response,
  expected: ExpectedError,
): Promise<{ requestId: string; body: any }> {
  const body = (await response.json()) as any;
  expect({ status: response.status, code: body?.error?.code }).toEqual({
    status: expected.status,
    code: expected.code,
  });
  const requestId = response.headers.get('x-request-id');
  expect(requestId).toMatch(REQUEST_ID_RE);
  const error: Record<string, unknown> = {
    message: expect.any(String),
    type: TYPE_BY_STATUS[expected.status],
    code: expected.code,
    param: expected.param ?? null,
    ...(expected.detail === undefined ? {} : { detail: expected.detail }),
    ...expected.fields,
  };
  expect(body).toEqual({ error, ...expected.topLevel });
  return { requestId: requestId!, body };
}

/** A key's balances with nothing held: the baseline an error must leave exactly as it was. */
async function settledBalances(t: TestGateway, keyId: string): Promise<Balances> {
  const now = await balances(t, keyId);
  expect(now.held).toBe(0);
  return now;
}

function nextUtcMidnight(nowMs: number): string {
  return new Date((Math.floor(nowMs / DAY_MS) + 1) * DAY_MS).toISOString().replace('.000Z', 'Z');
}

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('200: a decision', () => {
  test.each(['sse', 'json'] as const)(
    'the exact shape, billed to the token wallet first ' +
      '(%s reply): tokens charged, credits untouched',
    async (format) => {
      const { t, fake } = gatewayWithUpstream((call) => ({
        kind: 'tool',
        arguments: validArguments(call.body),
        usage: DEFAULT_USAGE,
        format,
      }));
      const { id: keyId, key } = await t.createKey({ credits: 1000, token_wallet: 100_000 });
      const beforeS = Math.floor(Date.now() / 1000);
      const response = await post(t, key, decisionBody());
      const afterS = Math.floor(Date.now() / 1000);
      expect(response.status).toBe(200);
      const body = (await response.json()) as any;
      const total = DEFAULT_USAGE.prompt_tokens + DEFAULT_USAGE.completion_tokens;
      expect(body).toEqual({
        id: expect.stringMatching(REQUEST_ID_RE),
        object: 'decision',
        created: expect.any(Number),
        model: 'decision-fast',
        answers: VALID_ANSWERS,
        usage: {
          prompt_tokens: DEFAULT_USAGE.prompt_tokens,
          completion_tokens: DEFAULT_USAGE.completion_tokens,
          total_tokens: total,
        },
        charged: { tokens: total, credits: 0 },
      });
      expect(body.created).toBeGreaterThanOrEqual(beforeS);
      expect(body.created).toBeLessThanOrEqual(afterS);
      expect(response.headers.get('x-request-id')).toBe(body.id);
      expect(await balances(t, keyId)).toEqual({
        credits: 1000,
        held: 0,
        charged: 0,
        credits_added: 1000,
        token_wallet: 100_000 - total,
      });

      // The model was asked through a submit_decision function whose schema enumerates labels and
      // levels.
      expect(fake.calls).toBe(1);
      const sent = fake.bodies[0];
      // A decision is one answer: asked without stream, so a server that honours that sends one
      // JSON body.
      expect(sent.stream).toBeUndefined();
      expect(sent.model).toBe('up');
      expect(sent.tools).toEqual([
        {
          type: 'function',
          function: {
            name: 'submit_decision',
            description: expect.any(String),
            parameters: {
              type: 'object',
              properties: {
                urgency: { type: 'string', enum: ['urgent', 'routine'] },
                quality: { type: 'integer', minimum: 0, maximum: 2 },
              },
              required: ['urgency', 'quality'],
              additionalProperties: false,
            },
          },
        },
      ]);
      expect(sent.tool_choice).toEqual({ type: 'function', function: { name: 'submit_decision' } });
      expect(JSON.stringify(sent.messages)).toContain(
        'The checkout page returns 500 for every customer.',
      );
    },
  );

  test(
    'billed to credits when the wallet cannot cover the estimate: usage at model_03 rates (5 / ' +
      '14 µcr per token)',
    async () => {
      const { t } = gatewayWithUpstream();
      // 500 tokens cannot cover the estimate (input + the 1,024-token answer budget).
      const { id: keyId, key } = await t.createKey({ credits: 10, token_wallet: 500 });
      const response = await post(t, key, decisionBody());
      expect(response.status).toBe(200);
      const body = (await response.json()) as any;
      const chargedMicro = DEFAULT_USAGE.prompt_tokens * 5 + DEFAULT_USAGE.completion_tokens * 14;
      expect(body.charged).toEqual({ tokens: 0, credits: chargedMicro / 1e6 });
      expect(body.answers).toEqual(VALID_ANSWERS);
      expect(await balances(t, keyId)).toEqual({
        credits: (10_000_000 - chargedMicro) / 1e6,
        held: 0,
        charged: chargedMicro / 1e6,
        credits_added: 10,
        token_wallet: 500,
      });
    },
  );

  test('a credit charge is capped at the hold', async () => {
    const release = Promise.withResolvers<void>();
    const huge = { prompt_tokens: 1_000_000, completion_tokens: 1_000_000 };
    const { t, fake } = gatewayWithUpstream((call) => ({
      kind: 'wait',
      until: release.promise,
      then: { kind: 'tool', arguments: validArguments(call.body), usage: huge },
    }));
    const { id: keyId, key } = await t.createKey({ credits: 100 });
    const called = fake.nextCall.promise;
    const pending = post(t, key, decisionBody());
    await called;
    const during = await balances(t, keyId);
    expect(during.held).toBeGreaterThan(0);
    release.resolve();
    const response = await pending;
    expect(response.status).toBe(200);
    const body = (await response.json()) as any;
    expect(body.usage).toEqual({
      prompt_tokens: 1_000_000,
      completion_tokens: 1_000_000,
      total_tokens: 2_000_000,
    });
    expect(body.charged).toEqual({ tokens: 0, credits: during.held });
    expect(await balances(t, keyId)).toEqual({
      credits: 100 - during.held,
      held: 0,
      charged: during.held,
      credits_added: 100,
      token_wallet: 0,
    });
  });

  test('a token charge is capped at the token hold', async () => {
    const release = Promise.withResolvers<void>();
    const huge = { prompt_tokens: 1_000_000, completion_tokens: 1_000_000 };
    const { t, fake } = gatewayWithUpstream((call) => ({
      kind: 'wait',
      until: release.promise,
      then: { kind: 'tool', arguments: validArguments(call.body), usage: huge },
    }));
    const { id: keyId, key } = await t.createKey({ credits: 1, token_wallet: 50_000 });
    const called = fake.nextCall.promise;
    const pending = post(t, key, decisionBody());
    await called;
    const during = await balances(t, keyId);
    const heldTokens = 50_000 - during.token_wallet;
    expect(heldTokens).toBeGreaterThan(1024);
    expect(during.held).toBe(0);
    release.resolve();
    const body = (await (await pending).json()) as any;
    expect(body.charged).toEqual({ tokens: heldTokens, credits: 0 });
    expect(await balances(t, keyId)).toEqual({
      credits: 1,
      held: 0,
      charged: 0,
      credits_added: 1,
      token_wallet: 50_000 - heldTokens,
    });
  });

  test(
    'an answer outside the labels is asked once more; a valid second answer is a 200 with both ' +
      'calls counted',
    async () => {
      const { t, fake } = gatewayWithUpstream((call) =>
        call.index === 0
          ? { kind: 'tool', arguments: { urgency: 'whenever', quality: 2 } }
          : answerValidly(call),
      );
      const { key } = await t.createKey({ credits: 10 });
      const response = await post(t, key, decisionBody());
      expect(response.status).toBe(200);
      const body = (await response.json()) as any;
      expect(fake.calls).toBe(2);
      expect(body.answers).toEqual(VALID_ANSWERS);
      expect(body.usage).toEqual({ prompt_tokens: 600, completion_tokens: 40, total_tokens: 640 });
    },
  );

  test(
    'SRC BUG prompt.ts answerSchema/readAnswers: a valid question id "__proto__" is asked and ' +
      'answered like any other',
    async () => {
      // "__proto__" is 1-64 characters of A-Z a-z 0-9 _ -, so the contract accepts it as a question
      // id.
      const { t, fake } = gatewayWithUpstream(() => ({
        kind: 'tool',
        arguments: '{"__proto__":"yes","other":1}',
      }));
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const text = JSON.stringify(decisionBody({ questions: {} })).replace(
        '"questions":{}',
        '"questions":{"__proto__":{"type":"choice","prompt":"Proceed?",' +
          '"criteria":{"yes":"go","no":"stop"}},' +
          '"other":{"type":"score","prompt":"How sure?","criteria":["unsure","sure"]}}',
      );
      const response = await post(t, key, text);
      // The model must be offered the question: the answer schema has it as its own property.
      const properties = fake.bodies[0]?.tools?.[0]?.function?.parameters?.properties ?? {};
      expect(Object.keys(properties).sort()).toEqual(['__proto__', 'other']);
      expect(response.status).toBe(200);
      const body = (await response.json()) as any;
      expect(Object.keys(body.answers).sort()).toEqual(['__proto__', 'other']);
      expect(Object.getOwnPropertyDescriptor(body.answers, '__proto__')?.value).toEqual({
        type: 'choice',
        label: 'yes',
      });
      expect((await balances(t, keyId)).held).toBe(0);
    },
  );
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('the answer budget covers the longest valid answer', () => {
  /** `count` choice questions with ids of `idChars` and two labels of `labelChars` each. */
  const manyQuestions = (count: number, idChars: number, labelChars: number) => {
    const questions: Record<string, unknown> = {};
    for (let i = 0; i < count; i++) {
      const id = `q${String(i).padStart(idChars - 1, '0')}`;
      const label = (letter: string) => `${letter}${String(i)}`.padEnd(labelChars, letter);
      questions[id] = {
        type: 'choice',
        prompt: `Question ${i}?`,
        criteria: { [label('y')]: 'yes', [label('n')]: 'no' },
      };
    }
    return questions;
  };

  test.each([
    ['64 questions, labels of 48 characters', 64, 8, 48],
    ['64 questions, ids of 64 and labels of 128 characters', 64, 64, 128],
  ] as const)(
    '%s: a 200 on both models (a fixed 1,024-token budget cut every answer off: 502)',
    async (_name, count, idChars, labelChars) => {
      const t = gateway();
      const { key } = await t.createKey({ credits: 100 });
      for (const model of ['decision-fast', 'decision-accurate']) {
        const questions = manyQuestions(count, idChars, labelChars);
        const response = await post(t, key, decisionBody({ model, questions }));
        const body = (await response.json()) as any;
        expect({ model, status: response.status }).toEqual({ model, status: 200 });
        expect(Object.keys(body.answers)).toEqual(Object.keys(questions));
        for (const [id, answer] of Object.entries<any>(body.answers))
          expect(Object.keys((questions[id] as any).criteria)).toContain(answer.label);
      }
    },
  );

  test(
    'the budget is the configured one until the longest answer may need more; the hold and the ' +
      'upstream limit follow it',
    async () => {
      let release = Promise.withResolvers<void>();
      const { t, fake } = gatewayWithUpstream((call) => ({
        kind: 'wait',
        until: release.promise,
        then: answerValidly(call),
      }));
      const { id: keyId, key } = await t.createKey({ credits: 1, token_wallet: 100_000 });
      /** The tokens held while the upstream is asked, and the output limit it was sent. */
      const holdOf = async (body: unknown) => {
        release = Promise.withResolvers<void>();
        const before = (await balances(t, keyId)).token_wallet;
        const called = fake.nextCall.promise;
        const pending = post(t, key, body);
        await called;
        const held = before - (await balances(t, keyId)).token_wallet;
        const sent = fake.bodies.at(-1).max_completion_tokens;
        release.resolve();
        expect((await pending).status).toBe(200);
        return { held, sent };
      };
      const small = await holdOf(decisionBody());
      expect(small.sent).toBe(1024);
      const questions = manyQuestions(64, 64, 128);
      const large = await holdOf(decisionBody({ questions }));
      // {} + per question "id": , and two spaces + the longest label in JSON (its quotes too).
      const longest = 2 + 64 * (64 + 6 + 130);
      expect(large.sent).toBe(longest);
      expect(large.held - small.held).toBeGreaterThan(longest - 1024);
    },
  );
});

test('the answer budget never passes the model output limit (providers refuse more)', async () => {
  const fake = upstream(answerValidly);
  const t = gateway({
    providers: { fake: { type: 'openai', base_url: fake.url, timeout_ms: 5_000 } },
    models: { model_03: { provider: 'fake', upstream_model: 'up', max_output_tokens: 2_000 } },
  });
  const { key } = await t.createKey({ credits: 100 });
  const questions: Record<string, unknown> = {};
  for (let i = 0; i < 24; i++) {
    // Control characters print as \u00XX in JSON: 6 bytes each, ~730 bytes a label.
    const label = (c: string) => `${c}${i}${'\u0001'.repeat(120)}`;
    const criteria = { [label('y')]: 'y', [label('n')]: 'n' };
    questions[`q${i}`] = { type: 'choice', prompt: `Q${i}?`, criteria };
  }
  const response = await post(t, key, decisionBody({ questions }));
  expect(response.status).toBe(200);
  expect(fake.bodies.at(-1).max_completion_tokens).toBe(2_000);
});

describe('lookup: GET /decision/v1/requests/<dec_id>/', () => {
  test(
    'the owner reads the outcome with its answers; another ' +
      'key and an unknown id get 404 request_not_found',
    async () => {
      const { t } = gatewayWithUpstream();
      const owner = await t.createKey({ credits: 10 });
      const other = await t.createKey({ credits: 10 });
      const decision = (await (await post(t, owner.key, decisionBody())).json()) as any;

      const own = await lookup(t, owner.key, decision.id);
      expect(own.status).toBe(200);
      expect(own.requestId).toMatch(REQUEST_ID_RE);
      expect(own.body).toEqual({
        id: decision.id,
        object: 'decision.request',
        status: 'completed',
        http_status: 200,
        created: decision.created,
        finished: expect.any(Number),
        model: 'decision-fast',
        error_code: null,
        answers: VALID_ANSWERS,
        usage: decision.usage,
        charged: decision.charged,
        attempts: [
          {
            provider: 'fake',
            upstream_model: 'up',
            outcome: 'ok',
            error_code: null,
            latency_ms: expect.any(Number),
          },
        ],
      });
      expect(own.body.finished).toBeGreaterThanOrEqual(decision.created);

      for (const [key, id] of [
        [other.key, decision.id],
        [owner.key, 'dec_doesnotexist000000000000'],
      ] as const) {
        const response = await t.request(`/decision/v1/requests/${id}/`, { headers: bearer(key) });
        await expectError(response, { status: 404, code: 'request_not_found' });
      }
    },
  );

  test(
    'a refused request (400) leaves nothing behind: its dec_ id is not found and the log did ' +
      'not grow',
    async () => {
      const t = gateway();
      const { key } = await t.createKey({ credits: 10 });
      const wal = (t.gateway.store as unknown as { wal: { lastSeq: number } }).wal;
      const seqBefore = wal.lastSeq;
      const response = await post(
        t,
        key,
        decisionBody({
          questions: { urgency: { type: 'choice', prompt: 'Urgent?', criteria: ['a', 'b'] } },
        }),
      );
      const { requestId } = await expectError(response, {
        status: 400,
        code: 'invalid_request_error',
        param: 'questions.urgency.criteria',
        detail: expect.any(String),
      });
      // CONTRACT §8: a request refused before a task is created writes nothing to the log and keeps
      // nothing.
      expect(wal.lastSeq).toBe(seqBefore);
      expect(t.gateway.store.state.finished.size).toBe(0);
      const found = await lookup(t, key, requestId);
      expect(found.status).toBe(404);
      expect(found.body.error.code).toBe('request_not_found');
    },
  );
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('400 invalid_request_error: detail names the question id and the expected shape', () => {
  const choice = (criteria: unknown) => ({
    urgency: { type: 'choice', prompt: 'How urgent?', criteria },
  });
  const score = (criteria: unknown) => ({
    quality: { type: 'score', prompt: 'How complete?', criteria },
  });
  const labels = (n: number) =>
    Object.fromEntries(Array.from({ length: n }, (_, i) => [`label_${i}`, `description ${i}`]));
  const questions = (n: number) =>
    Object.fromEntries(
      Array.from({ length: n }, (_, i) => [
        `q${i}`,
        { type: 'choice', prompt: `Question ${i}?`, criteria: { yes: 'yes', no: 'no' } },
      ]),
    );
  const cases: Array<[string, Record<string, unknown>, string, RegExp]> = [
    [
      'a choice question with an array',
      choice(['urgent', 'routine']),
      'questions.urgency.criteria',
      /"urgency".*\bobject\b/,
    ],
    [
      'a score question with an object',
      score({ low: 'missing', high: 'complete' }),
      'questions.quality.criteria',
      /"quality".*\barray\b/,
    ],
    ['empty choice criteria', choice({}), 'questions.urgency.criteria', /"urgency".*\bobject\b/],
    ['empty score criteria', score([]), 'questions.quality.criteria', /"quality".*\barray\b/],
    [
      'too many labels (33)',
      choice(labels(33)),
      'questions.urgency.criteria',
      /"urgency".*\bobject\b.*\b32\b/,
    ],
    [
      'too many levels (12)',
      score(Array.from({ length: 12 }, (_, i) => `level ${i}`)),
      'questions.quality.criteria',
      /"quality".*\barray\b.*\b11\b/,
    ],
    [
      'a bad question id',
      { 'bad id!': { type: 'choice', prompt: 'Bad?', criteria: { yes: 'y', no: 'n' } } },
      'questions',
      /"bad id!".*1-64/,
    ],
    [
      'a question id over 64 characters',
      { ['x'.repeat(65)]: { type: 'choice', prompt: 'Long?', criteria: { yes: 'y', no: 'n' } } },
      'questions',
      new RegExp(`"${'x'.repeat(65)}"`),
    ],
    ['too many questions (65)', questions(65), 'questions', /\b64\b/],
    [
      'an empty label (the label named, not its description)',
      choice({ '': 'a', y: 'b' }),
      'questions.urgency.criteria',
      /"urgency".*; label "" is empty$/,
    ],
    [
      'a question id of a megabyte (quoted in part)',
      {
        ['x'.repeat(1024 * 1024)]: {
          type: 'choice',
          prompt: 'Long?',
          criteria: { a: 'a', b: 'b' },
        },
      },
      'questions',
      /^question "x{128}"… \(1048576 characters\): a question id must be 1-64 characters/,
    ],
    [
      'a label of a megabyte with an empty description (quoted in part)',
      choice({ [`${'l'.repeat(1024 * 1024)}`]: '', y: 'b' }),
      'questions.urgency.criteria',
      /"urgency".*; label "l{128}"… \(1048576 characters\) has an empty description$/,
    ],
    [
      'a blank description',
      choice({ x: '  ', y: 'b' }),
      'questions.urgency.criteria',
      /"urgency".*; label "x" has an empty description$/,
    ],
    [
      'a description that is a number',
      choice({ x: 7, y: 'b' }),
      'questions.urgency.criteria',
      /"urgency".*; label "x" has a description that is a number$/,
    ],
    [
      'an empty level',
      score(['low', '']),
      'questions.quality.criteria[1]',
      /"quality".*; level 1 has an empty description$/,
    ],
    [
      'missing criteria',
      { urgency: { type: 'choice', prompt: 'How urgent?' } },
      'questions.urgency.criteria',
      /"urgency".*, got nothing \(the field is missing\)$/,
    ],
  ];

  test.each(cases)('%s', async (_name, questionsBody, param, detail) => {
    const t = gateway();
    const { id: keyId, key } = await t.createKey({ credits: 10, token_wallet: 100_000 });
    const before = await settledBalances(t, keyId);
    const response = await post(t, key, decisionBody({ questions: questionsBody }));
    await expectError(response, {
      status: 400,
      code: 'invalid_request_error',
      param,
      detail: expect.stringMatching(detail),
    });
    expect(await balances(t, keyId)).toEqual(before);
  });

  test(
    'prompts, labels and descriptions have no length of their own: long ones well within ' +
      '32,000 tokens are answered (they were 400s past 8,192 / 128 / 4,096 characters)',
    async () => {
      const t = gateway();
      const { key } = await t.createKey({ credits: 10 });
      const longLabel = `needs-${'a'.repeat(300)}`;
      const response = await post(
        t,
        key,
        decisionBody({
          questions: {
            urgency: {
              type: 'choice',
              prompt: `How urgent is it? ${'Consider the whole ticket. '.repeat(400)}`,
              criteria: { [longLabel]: 'word '.repeat(1_200), routine: 'can wait' },
            },
            quality: {
              type: 'score',
              prompt: 'How complete?',
              criteria: ['missing', 'level '.repeat(900)],
            },
          },
        }),
      );
      const body = (await response.json()) as any;
      expect(response.status).toBe(200);
      expect([longLabel, 'routine']).toContain(body.answers.urgency.label);
      expect([0, 1]).toContain(body.answers.quality.score);
    },
  );

  test(
    'a record keeps 4,096 characters of labels and levels: longer ones are cut in the lookup ' +
      '(the 200 has them whole; 64 levels of 13,000 characters made 0.84 MB records)',
    async () => {
      const t = gateway();
      const { key } = await t.createKey({ credits: 10 });
      const level = (name: string) => `${name} ${'- '.repeat(5_000)}`;
      const questions = Object.fromEntries(
        ['__proto__', 'q2', 'q3'].map((id) => [
          id,
          { type: 'score', prompt: 'How complete?', criteria: [level('low'), level('high')] },
        ]),
      );
      const response = await post(t, key, decisionBody({ questions }));
      expect(response.status).toBe(200);
      const body = (await response.json()) as any;
      const ids = Object.keys(questions);
      for (const id of ids) expect([level('low'), level('high')]).toContain(body.answers[id].level);
      const { body: record } = await lookup(t, key, body.id);
      expect(Object.keys(record.answers)).toEqual(ids);
      for (const id of ids) {
        const kept = record.answers[id];
        expect(kept.score).toBe(body.answers[id].score);
        expect(kept.level.length).toBe(Math.floor(4_096 / 3));
        expect(kept.level.endsWith('…')).toBe(true);
        expect(body.answers[id].level.startsWith(kept.level.slice(0, -1))).toBe(true);
      }
      // Short answers are kept whole.
      const plain = (await (await post(t, key, decisionBody())).json()) as any;
      expect((await lookup(t, key, plain.id)).body.answers).toEqual(plain.answers);
      // A cut never splits a surrogate pair (a lone half is JSON strict decoders refuse).
      const emoji = (await (
        await post(
          t,
          key,
          decisionBody({
            questions: {
              q: {
                type: 'score',
                prompt: 'Mood?',
                criteria: ['😀'.repeat(3_000), '🙁'.repeat(3_000)],
              },
            },
          }),
        )
      ).json()) as any;
      const kept = (await lookup(t, key, emoji.id)).body.answers.q.level as string;
      expect(kept.endsWith('…')).toBe(true);
      expect(kept.isWellFormed()).toBe(true);
    },
  );

  test('64 questions and 32 labels are accepted (the limits are inclusive)', async () => {
    const t = gateway();
    const { key } = await t.createKey({ credits: 10 });
    const response = await post(
      t,
      key,
      decisionBody({
        questions: {
          ...questions(63),
          urgency: { type: 'choice', prompt: 'Urgent?', criteria: labels(32) },
        },
      }),
    );
    expect(response.status).toBe(200);
  });

  test(
    'SRC BUG fingerprint.ts canonicalJson recursion: a state nested 100,000 deep is refused as a ' +
      '400, with a dec_ id, not a 500',
    async () => {
      const t = gateway();
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const before = await settledBalances(t, keyId);
      const depth = 100_000;
      const text = JSON.stringify(decisionBody({ state: 'DEEP' })).replace(
        '"DEEP"',
        '['.repeat(depth) + ']'.repeat(depth),
      );
      expect(text.length).toBeLessThan(FOUR_MB);
      const response = await post(t, key, text);
      // Every response carries X-Request-ID: dec_… (issue 4), a 5xx included; this one is the
      // request's fault.
      expect(response.headers.get('x-request-id')).toMatch(REQUEST_ID_RE);
      expect({
        status: response.status,
        type: ((await response.json()) as any).error.type,
      }).toEqual({
        status: 400,
        type: 'invalid_request_error',
      });
      expect(await balances(t, keyId)).toEqual(before);
    },
  );

  test('no route under /decision/v1 (or a broken path): the 404 has a dec_ id', async () => {
    const t = gateway();
    const { key } = await t.createKey({ credits: 10 });
    const cases: Array<[string, string]> = [
      ['GET', '/decision/v1/decide'],
      ['GET', '/decision/v1/nope'],
      ['GET', '/decision/v1'],
      ['POST', '/decision/v1/requests/x/'],
      ['GET', '/decision/v1/requests/%zz/'],
    ];
    for (const [method, path] of cases) {
      const response = await t.request(path, { method, headers: bearer(key) });
      expect({ path, status: response.status }).toEqual({ path, status: 404 });
      expect(response.headers.get('x-request-id')).toMatch(REQUEST_ID_RE);
      await response.body?.cancel();
    }
    // Outside the decision service such an answer is no decision's.
    for (const path of ['/decision/v10/x', '/decisionx', '/api/v1/nope']) {
      const response = await t.request(path, { headers: bearer(key) });
      expect(response.status).toBe(404);
      expect(response.headers.get('x-request-id')).toMatch(/^req_/);
      await response.body?.cancel();
    }
  });

  test('malformed JSON is 400 invalid_request_error', async () => {
    const t = gateway();
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const before = await settledBalances(t, keyId);
    const response = await post(t, key, '{"model": "decision-fast", "questions": ');
    expect(response.status).toBe(400);
    expect(response.headers.get('x-request-id')).toMatch(REQUEST_ID_RE);
    const body = (await response.json()) as any;
    expect(body.error).toMatchObject({
      type: 'invalid_request_error',
      code: 'invalid_request_error',
      // The problem is in the request and can be named (CONTRACT §2).
      detail: expect.stringMatching(/^the body is not valid JSON \(.+\)$/),
    });
    expect(await balances(t, keyId)).toEqual(before);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('400 invalid_idempotency_key', () => {
  test(
    'outside 8–255 characters of A-Z a-z 0-9 . _ ' + ': - is refused; the boundaries are accepted',
    async () => {
      const t = gateway();
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      for (const bad of ['seven77', 'has space!', 'x'.repeat(256), 'slash/not-ok']) {
        const before = await settledBalances(t, keyId);
        const response = await post(t, key, decisionBody(), { 'idempotency-key': bad });
        await expectError(response, {
          status: 400,
          code: 'invalid_idempotency_key',
          param: 'Idempotency-Key',
          // What is wrong with it, never the key itself.
          detail: expect.stringContaining(
            bad.length < 8 || bad.length > 255
              ? `has ${bad.length} characters`
              : 'holds a character outside that set',
          ),
        });
        expect(await balances(t, keyId)).toEqual(before);
      }
      for (const good of ['eight888', `a.b_c:d-${'y'.repeat(247)}`]) {
        expect(good.length === 8 || good.length === 255).toBe(true);
        expect((await post(t, key, decisionBody(), { 'idempotency-key': good })).status).toBe(200);
      }
    },
  );
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('401 invalid_api_key with reason', () => {
  test.each(['missing', 'unknown', 'revoked', 'wrong_type'] as const)('%s', async (reason) => {
    const t = gateway();
    const chatOnly = await t.createKey({ credits: 10, services: ['chat'] });
    const revoked = await t.createKey({ credits: 10 });
    const revoke = await t.request(`/admin/v1/keys/${revoked.id}/revoke`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
    });
    expect(revoke.status).toBe(200);
    const keyFor = {
      missing: null,
      unknown: `tg-${'A'.repeat(43)}`,
      revoked: revoked.key,
      wrong_type: chatOnly.key,
    }[reason];
    const owner = reason === 'revoked' ? revoked.id : chatOnly.id;
    const before = await settledBalances(t, owner);
    const response = await post(t, keyFor, decisionBody());
    await expectError(response, { status: 401, code: 'invalid_api_key', fields: { reason } });
    expect(await balances(t, owner)).toEqual(before);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('402 insufficient_quota', () => {
  test('neither the token wallet nor credits cover the call', async () => {
    const t = gateway();
    for (const funds of [
      { credits: 0, token_wallet: 0 },
      // A wallet and credits that each fall short of the estimate (input + the 1,024-token answer
      // budget).
      { credits: 0.001, token_wallet: 1000 },
    ]) {
      const { id: keyId, key } = await t.createKey(funds);
      const before = await settledBalances(t, keyId);
      const response = await post(t, key, decisionBody());
      await expectError(response, { status: 402, code: 'insufficient_quota' });
      expect(await balances(t, keyId)).toEqual(before);
    }
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('404 model_not_found', () => {
  test('a model name of a megabyte is quoted in part, not echoed', async () => {
    const t = gateway();
    const { key } = await t.createKey({ credits: 10 });
    const response = await post(t, key, decisionBody({ model: 'm'.repeat(1024 * 1024) }));
    const text = await response.clone().text();
    expect(text.length).toBeLessThan(1024);
    await expectError(response, {
      status: 404,
      code: 'model_not_found',
      param: 'model',
      detail: expect.stringContaining('decision-fast'),
      fields: { message: expect.stringContaining(`"${'m'.repeat(128)}"… (1048576 characters)`) },
    });
  });

  test('model is not one of the two decision models', async () => {
    const t = gateway();
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    for (const model of ['decision-slow', 'model_03']) {
      const before = await settledBalances(t, keyId);
      const response = await post(t, key, decisionBody({ model }));
      await expectError(response, {
        status: 404,
        code: 'model_not_found',
        param: 'model',
        detail: expect.stringContaining('decision-fast'),
      });
      expect(await balances(t, keyId)).toEqual(before);
    }
    expect((await post(t, key, decisionBody({ model: 'decision-accurate' }))).status).toBe(200);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('409 Idempotency-Key collisions', () => {
  test('request_in_progress: the original is held open by the upstream', async () => {
    const release = Promise.withResolvers<void>();
    const { t, fake } = gatewayWithUpstream((call) => ({
      kind: 'wait',
      until: release.promise,
      then: answerValidly(call),
    }));
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const headers = { 'idempotency-key': 'in-progress-0001' };
    const called = fake.nextCall.promise;
    const original = post(t, key, decisionBody(), headers);
    await called;
    const during = await balances(t, keyId);
    expect(during.held).toBeGreaterThan(0);

    const response = await post(t, key, decisionBody(), headers);
    const { body } = await expectError(response, {
      status: 409,
      code: 'request_in_progress',
      param: 'Idempotency-Key',
      topLevel: {
        request_id: expect.stringMatching(REQUEST_ID_RE),
        request_status: 'in_progress',
        status_url: expect.any(String),
      },
    });
    expect(body.status_url).toBe(`/decision/v1/requests/${body.request_id}/`);
    expect(response.headers.get('x-service-request-status')).toBe(body.status_url);
    // CONTRACT §8: a 409 for an existing request names that request in X-Request-ID (a fresh id
    // nobody can look up helps no one).
    expect(response.headers.get('x-request-id')).toBe(body.request_id);
    expect(await balances(t, keyId)).toEqual(during);
    const running = (await lookup(t, key, body.request_id)).body;
    expect(running.status).toBe('in_progress');
    // The attempt the upstream holds is shown as running, not as an `ok` of 0 ms (audit O).
    expect(running.attempts).toEqual([
      {
        provider: expect.any(String),
        upstream_model: expect.any(String),
        outcome: 'in_progress',
        error_code: null,
        latency_ms: expect.any(Number),
      },
    ]);

    release.resolve();
    const done = await original;
    expect(done.status).toBe(200);
    expect(((await done.json()) as any).id).toBe(body.request_id);
    expect(fake.calls).toBe(1);
    expect((await lookup(t, key, body.request_id)).body.attempts[0].outcome).toBe('ok');
  });

  test(
    'request_already_completed: after a 200, ' + 'the same key and body point at the original',
    async () => {
      const t = gateway();
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const headers = { 'idempotency-key': 'completed-0001' };
      const first = await post(t, key, decisionBody(), headers);
      expect(first.status).toBe(200);
      const original = (await first.json()) as any;
      const before = await settledBalances(t, keyId);
      // Same content in another key order is the same request.
      const { model, state, questions } = decisionBody() as any;
      const response = await post(t, key, { questions, state, model }, headers);
      const statusUrl = `/decision/v1/requests/${original.id}/`;
      await expectError(response, {
        status: 409,
        code: 'request_already_completed',
        param: 'Idempotency-Key',
        topLevel: { request_id: original.id, request_status: 'completed', status_url: statusUrl },
      });
      expect(response.headers.get('x-service-request-status')).toBe(statusUrl);
      expect(await balances(t, keyId)).toEqual(before);
    },
  );

  test('idempotency_key_reused: the same key with a different body', async () => {
    const t = gateway();
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const headers = { 'idempotency-key': 'reused-key-0001' };
    const original = await post(t, key, decisionBody(), headers);
    expect(original.status).toBe(200);
    const before = await settledBalances(t, keyId);
    const response = await post(
      t,
      key,
      decisionBody({ state: { ticket: 'something else' } }),
      headers,
    );
    // CONTRACT §2 gives the top-level request_id / request_status / status_url to in-progress and
    // completed only.
    await expectError(response, {
      status: 409,
      code: 'idempotency_key_reused',
      param: 'Idempotency-Key',
      detail: REUSED_DETAIL,
    });
    // A 409 about an existing request names it (CONTRACT §8), not the refused attempt.
    expect(original.headers.get('x-request-id')).toMatch(REQUEST_ID_RE);
    expect(response.headers.get('x-request-id')).toBe(original.headers.get('x-request-id'));
    expect(await balances(t, keyId)).toEqual(before);
  });

  test(
    'one Idempotency-Key on both services: each 409 carries an X-Request-ID of its own ' +
      'surface, never the other service id',
    async () => {
      const t = gateway();
      const { key } = await t.createKey({ credits: 10, services: ['chat', 'decision'] });
      const chat = (headers: Record<string, string>) =>
        t.request('/api/v1/chat/completions', {
          method: 'POST',
          headers: bearer(key, headers),
          body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'hi' }] }),
        });
      const chatFirst = { 'idempotency-key': 'cross-service-1' };
      const chatOriginal = await chat(chatFirst);
      expect(chatOriginal.status).toBe(200);
      await chatOriginal.text();
      const decision = await post(t, key, decisionBody(), chatFirst);
      await expectError(decision, {
        status: 409,
        code: 'idempotency_key_reused',
        param: 'Idempotency-Key',
        detail: REUSED_DETAIL,
      });
      expect(decision.headers.get('x-request-id')).toMatch(REQUEST_ID_RE);

      const decisionFirst = { 'idempotency-key': 'cross-service-2' };
      expect((await post(t, key, decisionBody(), decisionFirst)).status).toBe(200);
      const chatAfter = await chat(decisionFirst);
      expect(chatAfter.status).toBe(409);
      expect(((await chatAfter.json()) as any).error.code).toBe('idempotency_key_reused');
      expect(chatAfter.headers.get('x-request-id')).toMatch(/^chatcmpl-/);
    },
  );

  test(
    'identical requests arriving together with one Idempotency-Key make exactly one decision and ' +
      'one charge',
    async () => {
      const release = Promise.withResolvers<void>();
      const { t, fake } = gatewayWithUpstream((call) => ({
        kind: 'wait',
        until: release.promise,
        then: answerValidly(call),
      }));
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const headers = { 'idempotency-key': 'together-0001' };
      const called = fake.nextCall.promise;
      const all = Array.from({ length: 12 }, () => post(t, key, decisionBody(), headers));
      await called;
      release.resolve();
      const responses = await Promise.all(all);
      const bodies = (await Promise.all(responses.map((response) => response.json()))) as any[];
      const decided = bodies.filter((_, i) => responses[i]!.status === 200);
      const conflicts = bodies.filter((_, i) => responses[i]!.status === 409);
      expect({ decided: decided.length, conflicts: conflicts.length }).toEqual({
        decided: 1,
        conflicts: 11,
      });
      for (const conflict of conflicts) {
        expect(conflict.error.code).toBe('request_in_progress');
        expect(conflict.request_id).toBe(decided[0].id);
      }
      expect(fake.calls).toBe(1);
      const chargedMicro = DEFAULT_USAGE.prompt_tokens * 5 + DEFAULT_USAGE.completion_tokens * 14;
      expect(await balances(t, keyId)).toEqual({
        credits: (10_000_000 - chargedMicro) / 1e6,
        held: 0,
        charged: chargedMicro / 1e6,
        credits_added: 10,
        token_wallet: 0,
      });
    },
  );

  test(
    'the decision difference: an original that ended in error frees its key, the retry runs; ' +
      'after a 200 it is 409',
    async () => {
      const { t, fake } = gatewayWithUpstream((call) =>
        call.index === 0 ? { kind: 'status', status: 500 } : answerValidly(call),
      );
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const headers = { 'idempotency-key': 'retry-after-error-1' };
      const failed = await post(t, key, decisionBody(), headers);
      const { requestId: failedId } = await expectError(failed, {
        status: 502,
        code: 'upstream_error',
      });
      expect(await balances(t, keyId)).toEqual({
        credits: 10,
        held: 0,
        charged: 0,
        credits_added: 10,
        token_wallet: 0,
      });

      const retried = await post(t, key, decisionBody(), headers);
      expect(retried.status).toBe(200);
      const decision = (await retried.json()) as any;
      expect(decision.id).not.toBe(failedId);
      const chargedMicro = DEFAULT_USAGE.prompt_tokens * 5 + DEFAULT_USAGE.completion_tokens * 14;
      expect(await balances(t, keyId)).toEqual({
        credits: (10_000_000 - chargedMicro) / 1e6,
        held: 0,
        charged: chargedMicro / 1e6,
        credits_added: 10,
        token_wallet: 0,
      });

      const third = await post(t, key, decisionBody(), headers);
      await expectError(third, {
        status: 409,
        code: 'request_already_completed',
        param: 'Idempotency-Key',
        topLevel: {
          request_id: decision.id,
          request_status: 'completed',
          status_url: `/decision/v1/requests/${decision.id}/`,
        },
      });
      expect(fake.calls).toBe(2);
      expect((await balances(t, keyId)).charged).toBe(chargedMicro / 1e6);
    },
  );
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('413 request_too_large', () => {
  test('a body over 4 MB with Content-Length, through a real server', async () => {
    const t = await server();
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const before = await settledBalances(t, keyId);
    const body = JSON.stringify(decisionBody({ state: { blob: 'a'.repeat(FOUR_MB) } }));
    expect(body.length).toBeGreaterThan(FOUR_MB);
    const response = await fetch(`${t.baseUrl}${DECIDE}`, {
      method: 'POST',
      headers: bearer(key),
      body,
    });
    await expectError(response, {
      status: 413,
      code: 'request_too_large',
      detail: TOO_LARGE_DETAIL,
    });
    expect(await balances(t, keyId)).toEqual(before);
  });

  test(
    'SRC BUG server.ts maxRequestBodySize: a 17 MB body through a real server still gets the ' +
      'envelope and X-Request-ID',
    async () => {
      const t = await server();
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const before = await settledBalances(t, keyId);
      const body = JSON.stringify(decisionBody({ state: { blob: 'a'.repeat(17 * 1024 * 1024) } }));
      const response = await fetch(`${t.baseUrl}${DECIDE}`, {
        method: 'POST',
        headers: bearer(key),
        body,
      });
      expect(response.status).toBe(413);
      expect(response.headers.get('x-request-id')).toMatch(REQUEST_ID_RE);
      await expectError(response, {
        status: 413,
        code: 'request_too_large',
        detail: TOO_LARGE_DETAIL,
      });
      expect(await balances(t, keyId)).toEqual(before);
    },
  );

  test('a chunked body over 4 MB without Content-Length', async () => {
    const t = gateway();
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const before = await settledBalances(t, keyId);
    const piece = new TextEncoder().encode('a'.repeat(64 * 1024));
    let sentBytes = 0;
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(new TextEncoder().encode('{"model":"decision-fast","state":"'));
      },
      pull(controller) {
        // Endless: only a reader that stops at the limit ends this request.
        sentBytes += piece.byteLength;
        controller.enqueue(piece);
      },
    });
    const request = new Request(`http://gateway.test${DECIDE}`, {
      method: 'POST',
      headers: bearer(key),
      body: stream,
      duplex: 'half',
    } as RequestInit);
    expect(request.headers.get('content-length')).toBeNull();
    const response = await t.app.handle(request);
    await expectError(response, {
      status: 413,
      code: 'request_too_large',
      detail: TOO_LARGE_DETAIL,
    });
    expect(sentBytes).toBeGreaterThan(FOUR_MB - piece.byteLength);
    expect(await balances(t, keyId)).toEqual(before);
  });

  test('just under 4 MB is read (the limit is the body size, not a guess)', async () => {
    const t = gateway();
    const { key } = await t.createKey({ credits: 10 });
    // A body of exactly 4 MB gets past the size check to the next one (here 422: far too many
    // tokens).
    const prefix = JSON.stringify(decisionBody({ state: '' }));
    const filler = 'word '.repeat(Math.floor((FOUR_MB - prefix.length) / 5));
    const body = JSON.stringify(decisionBody({ state: filler }));
    expect(body.length).toBeLessThanOrEqual(FOUR_MB);
    const response = await post(t, key, body);
    expect(response.status).toBe(422);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('422 input_too_large', () => {
  // Many short records: pretty-printed, the whitespace alone would be tens of thousands of tokens.
  const bigState = {
    records: Array.from({ length: 6000 }, (_, i) => ({
      id: i,
      name: `customer ${i}`,
      active: i % 2 === 0,
    })),
  };

  test(
    'state over 32,000 tokens; pretty-printed or ' +
      'compact, the count and the answer are the same',
    async () => {
      const t = gateway();
      const { id: keyId, key } = await t.createKey({ credits: 100 });
      const before = await settledBalances(t, keyId);
      const compact = await post(t, key, JSON.stringify(decisionBody({ state: bigState })));
      const pretty = await post(t, key, JSON.stringify(decisionBody({ state: bigState }), null, 8));
      const compactError = await expectError(compact, {
        status: 422,
        code: 'input_too_large',
        param: 'state',
        detail: expect.stringMatching(/32,?000/),
      });
      const prettyError = await expectError(pretty, {
        status: 422,
        code: 'input_too_large',
        param: 'state',
        detail: expect.stringMatching(/32,?000/),
      });
      // The token count named in the answer is the content's, not the bytes'.
      expect(prettyError.body).toEqual(compactError.body);
      expect(await balances(t, keyId)).toEqual(before);
    },
  );

  test(
    'a state near 4 MB of one long word is refused ' +
      'in bounded work (counting it whole took hours)',
    async () => {
      const t = gateway();
      const { key } = await t.createKey({ credits: 100 });
      const response = await post(
        t,
        key,
        JSON.stringify(
          decisionBody({ state: { blob: randomBytes(3_000_000).toString('base64') } }),
        ),
      );
      await expectError(response, {
        status: 422,
        code: 'input_too_large',
        param: 'state',
        detail: expect.stringMatching(/32,?000/),
      });
    },
  );

  test(
    'content under the limit passes even when its ' +
      'pretty-printed text alone is over 32,000 tokens',
    async () => {
      const t = gateway();
      const { key } = await t.createKey({ credits: 100 });
      const smallerState = { records: bigState.records.slice(0, 1600) };
      const pretty = JSON.stringify(decisionBody({ state: smallerState }), null, 8);
      // Counted as sent, the formatting would push it over; counted as content it fits.
      expect(countTokens(pretty)).toBeGreaterThan(32_000);
      expect(countTokens(JSON.stringify(smallerState))).toBeLessThan(30_000);
      const response = await post(t, key, pretty);
      expect(response.status).toBe(200);
    },
  );
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('429 rate_limit_exceeded', () => {
  test(
    'key rate_limit_rpm 1: the second call ' + 'waits, Retry-After in whole seconds ≥ 1',
    async () => {
      const t = gateway();
      const { id: keyId, key } = await t.createKey({ credits: 10, rate_limit_rpm: 1 });
      expect((await post(t, key, decisionBody())).status).toBe(200);
      const before = await settledBalances(t, keyId);
      const response = await post(t, key, decisionBody());
      const retryAfter = response.headers.get('retry-after');
      await expectError(response, { status: 429, code: 'rate_limit_exceeded' });
      expect(retryAfter).toMatch(/^[1-9][0-9]*$/);
      expect(Number(retryAfter)).toBeGreaterThanOrEqual(1);
      expect(Number(retryAfter)).toBeLessThanOrEqual(60);
      expect(await balances(t, keyId)).toEqual(before);
    },
  );
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('429 api_key_spend_limit_exceeded', () => {
  test('a tiny daily decision budget: reset_at is the next 00:00 UTC in RFC 3339', async () => {
    const t = gateway();
    const { id: keyId, key } = await t.createKey({ credits: 10, daily_decision_budget: 0.001 });
    const before = await settledBalances(t, keyId);
    const beforeMs = Date.now();
    const response = await post(t, key, decisionBody());
    const afterMs = Date.now();
    const { body } = await expectError(response, {
      status: 429,
      code: 'api_key_spend_limit_exceeded',
      fields: { reset_at: expect.any(String) },
    });
    expect(body.error.reset_at).toMatch(/^\d{4}-\d{2}-\d{2}T00:00:00(\.000)?Z$/);
    expect([nextUtcMidnight(beforeMs), nextUtcMidnight(afterMs)]).toContain(
      body.error.reset_at.replace('.000Z', 'Z'),
    );
    expect(await balances(t, keyId)).toEqual(before);

    // The same request under a budget that covers it is decided.
    const roomy = await t.createKey({ credits: 10, daily_decision_budget: 1 });
    expect((await post(t, roomy.key, decisionBody())).status).toBe(200);
  });

  test('the budget counts what was charged, not a usage past the hold', async () => {
    // Asked twice (the first answer invalid), each ask reporting a million tokens each way: the
    // charge is capped at the hold, and so is what the day's budget counts.
    const huge = { prompt_tokens: 1_000_000, completion_tokens: 1_000_000 };
    const { t } = gatewayWithUpstream((call) =>
      call.index === 0
        ? { kind: 'tool', arguments: { urgency: 'not-a-label' }, usage: huge }
        : {
            kind: 'tool',
            arguments: validArguments(call.body),
            usage: call.index === 1 ? huge : undefined,
          },
    );
    const { key } = await t.createKey({ credits: 10, daily_decision_budget: 0.05 });
    const first = await post(t, key, decisionBody());
    expect(first.status).toBe(200);
    const charged = ((await first.json()) as any).charged.credits;
    expect(charged).toBeLessThan(0.025);
    // Another decision fits what is left of the budget (it did not: the uncapped cost was counted).
    expect((await post(t, key, decisionBody())).status).toBe(200);
  });

  test('the budget counts spend paid from the token wallet too', async () => {
    // Each decision reports 100 + 1,000 tokens: 100 × 5 + 1,000 × 14 = 14,500 µcr of spend, paid in
    // tokens.
    const { t } = gatewayWithUpstream((call) => ({
      kind: 'tool',
      arguments: validArguments(call.body),
      usage: { prompt_tokens: 100, completion_tokens: 1000 },
    }));
    // The estimate is input × 5 + 1,024 × 14 ≥ 14,336 µcr, so a 25,000 µcr budget fits one
    // decision, then not another.
    const { id: keyId, key } = await t.createKey({
      credits: 10,
      token_wallet: 1_000_000,
      daily_decision_budget: 0.025,
    });
    const first = await post(t, key, decisionBody());
    expect(first.status).toBe(200);
    expect(((await first.json()) as any).charged).toEqual({ tokens: 1100, credits: 0 });
    const before = await settledBalances(t, keyId);
    const response = await post(t, key, decisionBody());
    await expectError(response, {
      status: 429,
      code: 'api_key_spend_limit_exceeded',
      fields: { reset_at: expect.any(String) },
    });
    expect(await balances(t, keyId)).toEqual(before);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('499 request_cancelled', () => {
  test(
    'the client goes away (real server): the upstream sees the abort, the lookup says cancelled, ' +
      'nothing charged',
    async () => {
      const fake = upstream(() => ({ kind: 'hang' }));
      const t = await server(decisionUpstreamOverrides(fake.url));
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const before = await settledBalances(t, keyId);
      const headers = { ...bearer(key), 'idempotency-key': 'client-goes-away-1' };
      const body = JSON.stringify(decisionBody());
      const controller = new AbortController();
      const called = fake.nextCall.promise;
      const pending = fetch(`${t.baseUrl}${DECIDE}`, {
        method: 'POST',
        headers,
        body,
        signal: controller.signal,
      }).catch((error) => error);
      await called;
      // The caller learns the running request's id by repeating it with the same Idempotency-Key.
      const probe = (await (
        await fetch(`${t.baseUrl}${DECIDE}`, { method: 'POST', headers, body })
      ).json()) as any;
      expect(probe.error.code).toBe('request_in_progress');
      const id = probe.request_id as string;

      const sawAbort = fake.nextAbort.promise;
      controller.abort();
      expect(await pending).toBeInstanceOf(Error);
      await sawAbort;
      expect(fake.aborts).toBe(1);
      await t.gateway.registry.get(id)?.settled;
      const found = await lookup(t, key, id);
      expect(found.body).toEqual({
        id,
        object: 'decision.request',
        status: 'cancelled',
        http_status: 499,
        created: expect.any(Number),
        finished: expect.any(Number),
        model: 'decision-fast',
        error_code: 'request_cancelled',
        answers: null,
        usage: null,
        charged: { tokens: 0, credits: 0 },
        attempts: [
          {
            provider: 'fake',
            upstream_model: 'up',
            outcome: 'cancelled',
            error_code: null,
            latency_ms: expect.any(Number),
          },
        ],
      });
      expect(await balances(t, keyId)).toEqual(before);
    },
  );

  test(
    'SRC BUG decision/index.ts abort listener: a client already gone when its request is ' +
      'admitted gets 499 and no charge',
    async () => {
      // The client went away while its body was being read (here: its signal is aborted before the
      // handler runs).
      const t = gateway();
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const before = await settledBalances(t, keyId);
      const request = new Request(`http://gateway.test${DECIDE}`, {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify(decisionBody()),
        signal: AbortSignal.abort(),
      });
      const response = await t.app.handle(request);
      await expectError(response, { status: 499, code: 'request_cancelled' });
      expect(await balances(t, keyId)).toEqual(before);
    },
  );

  test('the 499 answer itself: envelope, X-Request-ID, the record cancelled', async () => {
    const { t, fake } = gatewayWithUpstream(() => ({ kind: 'hang' }));
    const { id: keyId, key } = await t.createKey({ credits: 10, token_wallet: 100_000 });
    const before = await settledBalances(t, keyId);
    const controller = new AbortController();
    const called = fake.nextCall.promise;
    const pending = post(t, key, decisionBody(), {}, controller.signal);
    await called;
    expect((await balances(t, keyId)).token_wallet).toBeLessThan(100_000);
    const sawAbort = fake.nextAbort.promise;
    controller.abort();
    const { requestId } = await expectError(await pending, {
      status: 499,
      code: 'request_cancelled',
    });
    await sawAbort;
    expect((await lookup(t, key, requestId)).body).toMatchObject({
      status: 'cancelled',
      http_status: 499,
      error_code: 'request_cancelled',
    });
    expect(await balances(t, keyId)).toEqual(before);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('502', () => {
  test('upstream_unreachable: the provider base_url points at a closed port', async () => {
    const t = gateway(decisionUpstreamOverrides(closedPortUrl()));
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const before = await settledBalances(t, keyId);
    const { requestId } = await expectError(await post(t, key, decisionBody()), {
      status: 502,
      code: 'upstream_unreachable',
    });
    expect((await lookup(t, key, requestId)).body).toMatchObject({
      status: 'error',
      http_status: 502,
      error_code: 'upstream_unreachable',
    });
    expect(await balances(t, keyId)).toEqual(before);
  });

  test(
    'upstream_invalid_response: a label that does not ' +
      'exist, retried once (exactly 2 upstream calls)',
    async () => {
      const { t, fake } = gatewayWithUpstream(() => ({
        kind: 'tool',
        arguments: { urgency: 'catastrophic', quality: 2 },
      }));
      const { id: keyId, key } = await t.createKey({ credits: 10 });
      const before = await settledBalances(t, keyId);
      const { requestId } = await expectError(await post(t, key, decisionBody()), {
        status: 502,
        code: 'upstream_invalid_response',
      });
      expect(fake.calls).toBe(2);
      expect((await lookup(t, key, requestId)).body).toMatchObject({
        status: 'error',
        http_status: 502,
        error_code: 'upstream_invalid_response',
      });
      expect(await balances(t, keyId)).toEqual(before);
    },
  );

  test('upstream_invalid_response: a score level out of range, twice', async () => {
    const { t, fake } = gatewayWithUpstream(() => ({
      kind: 'tool',
      arguments: { urgency: 'urgent', quality: 3 },
      format: 'json',
    }));
    const { id: keyId, key } = await t.createKey({ credits: 10, token_wallet: 100_000 });
    const before = await settledBalances(t, keyId);
    await expectError(await post(t, key, decisionBody()), {
      status: 502,
      code: 'upstream_invalid_response',
    });
    expect(fake.calls).toBe(2);
    expect(await balances(t, keyId)).toEqual(before);
  });

  test('upstream_error: the upstream answers 500', async () => {
    const { t } = gatewayWithUpstream(() => ({ kind: 'status', status: 500 }));
    const { id: keyId, key } = await t.createKey({ credits: 10, token_wallet: 100_000 });
    const before = await settledBalances(t, keyId);
    const { requestId } = await expectError(await post(t, key, decisionBody()), {
      status: 502,
      code: 'upstream_error',
    });
    expect((await lookup(t, key, requestId)).body).toMatchObject({
      status: 'error',
      http_status: 502,
      error_code: 'upstream_error',
      charged: { tokens: 0, credits: 0 },
    });
    expect(await balances(t, keyId)).toEqual(before);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('503 service_unavailable', () => {
  test('the gateway is draining; a key and balance that are fine', async () => {
    const t = gateway();
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const before = await settledBalances(t, keyId);
    t.gateway.draining = true;
    await expectError(await post(t, key, decisionBody()), {
      status: 503,
      code: 'service_unavailable',
    });
    t.gateway.draining = false;
    expect(await balances(t, keyId)).toEqual(before);
    expect((await post(t, key, decisionBody())).status).toBe(200);
  });
});

// ──────────────────────────────────────────────────────────────────────────────────────────
describe('504 upstream_timeout', () => {
  test('the upstream does not answer within decision.timeout_ms', async () => {
    const { t, fake } = gatewayWithUpstream(() => ({ kind: 'hang' }), {
      decision: { timeout_ms: 200 },
    });
    const { id: keyId, key } = await t.createKey({ credits: 10 });
    const before = await settledBalances(t, keyId);
    const sawAbort = fake.nextAbort.promise;
    const { requestId } = await expectError(await post(t, key, decisionBody()), {
      status: 504,
      code: 'upstream_timeout',
    });
    await sawAbort;
    expect((await lookup(t, key, requestId)).body).toMatchObject({
      status: 'error',
      http_status: 504,
      error_code: 'upstream_timeout',
    });
    expect(await balances(t, keyId)).toEqual(before);
  });
});
