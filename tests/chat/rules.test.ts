// The request rules of spec 000 and CONTRACT §4 as one table: each rule, the status, code and param
// it gets.
import { afterAll, beforeAll, describe, expect, test } from 'bun:test';
import { randomBytes } from 'node:crypto';
import { JSON_SCHEMA_MARKER } from '../../src/providers/provider.ts';
import { JSON_DEPTH_MAX } from '../../src/util/json.ts';
import {
  ADMIN_TOKEN,
  bearer,
  chatBody,
  openTestGateway,
  type TestGateway,
} from '../support/gateway.ts';

let t: TestGateway;
let key: string;
let decisionOnlyKey: string;
let revokedKey: string;
let brokeKey: string;

beforeAll(async () => {
  t = openTestGateway({
    models: {
      // A tiny window so context rules can be hit with small bodies.
      model_tiny: {
        provider: 'simulator',
        tools: true,
        top_k: false,
        seed: false,
        rates: { input: 1, output: 1 },
        context_window: 64,
        max_output_tokens: 32,
        created: 0,
      },
    },
  });
  key = (await t.createKey({ credits: 1_000_000 })).key;
  decisionOnlyKey = (await t.createKey({ services: ['decision'] })).key;
  const revoked = await t.createKey();
  revokedKey = revoked.key;
  await t.request(`/admin/v1/keys/${revoked.id}/revoke`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
  });
  brokeKey = (await t.createKey({ credits: 0 })).key;
});

afterAll(() => t.close());

function post(body: unknown, headers: Record<string, string> = bearer(key)): Promise<Response> {
  return t.request('/api/v1/chat/completions', {
    method: 'POST',
    headers,
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

const toolCallHistory = [
  { role: 'user', content: 'weather?' },
  {
    role: 'assistant',
    content: null,
    tool_calls: [
      { id: 'call_1', type: 'function', function: { name: 'weather', arguments: '{}' } },
    ],
  },
];
const weatherTool = {
  type: 'function',
  function: { name: 'weather', parameters: { type: 'object', properties: {} } },
};

/** A chat body whose one tool's parameters schema nests `levels` objects deep. */
function deepToolBody(levels: number): string {
  const open = '{"type":"object","properties":{"a":'.repeat(levels);
  return (
    '{"model":"model_03","messages":[{"role":"user","content":"hi"}],' +
    '"tools":[{"type":"function","function":{"name":"f","parameters":' +
    open +
    '{"type":"object"}' +
    '}}'.repeat(levels) +
    '}}],"tool_choice":"required"}'
  );
}

interface Rule {
  name: string;
  body: unknown;
  headers?: () => Record<string, string>;
  status: number;
  code: string;
  param?: string | null;
  reason?: string;
  /**
   * The exact message, where it names the field and the bound (CONTRACT §8: never "Expected union
   * value").
   */
  message?: string;
}

const ROLES = 'must be one of "system", "developer", "user", "assistant" or "tool"';

const rules: Rule[] = [
  {
    name: 'missing key',
    body: chatBody(),
    headers: () => ({ 'content-type': 'application/json' }),
    status: 401,
    code: 'invalid_api_key',
    reason: 'missing',
  },
  {
    name: 'unknown key',
    body: chatBody(),
    headers: () => bearer('tg-unknownunknownunknownunknownunknownunknown'),
    status: 401,
    code: 'invalid_api_key',
    reason: 'unknown',
  },
  {
    name: 'revoked key',
    body: chatBody(),
    headers: () => bearer(revokedKey),
    status: 401,
    code: 'invalid_api_key',
    reason: 'revoked',
  },
  {
    name: 'decision-only key',
    body: chatBody(),
    headers: () => bearer(decisionOnlyKey),
    status: 401,
    code: 'invalid_api_key',
    reason: 'wrong_type',
  },
  {
    name: 'malformed JSON',
    body: '{"model": ',
    status: 400,
    code: 'invalid_request_error',
    param: null,
  },
  {
    name: 'body not an object',
    body: '[1,2]',
    status: 400,
    code: 'invalid_request_error',
    param: null,
  },
  // Every later step may recurse (validation, token counts, fingerprints); a stack overflow would
  // be a 500.
  {
    name: 'tool parameters nested 300 levels deep',
    body: deepToolBody(300),
    status: 400,
    code: 'invalid_request_error',
    param: null,
  },
  {
    name: 'tool parameters nested 20,000 levels deep (was a 500)',
    body: deepToolBody(20_000),
    status: 400,
    code: 'invalid_request_error',
    param: null,
  },
  {
    name: 'model missing',
    body: { messages: [{ role: 'user', content: 'x' }] },
    status: 400,
    code: 'invalid_request_error',
    param: 'model',
  },
  {
    name: 'messages missing',
    body: { model: 'model_03' },
    status: 400,
    code: 'invalid_request_error',
    param: 'messages',
  },
  {
    name: 'messages empty',
    body: chatBody({ messages: [] }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages',
  },
  {
    name: 'unknown role',
    body: chatBody({ messages: [{ role: 'wizard', content: 'x' }] }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[0].role',
    message: `messages[0].role ${ROLES}`,
  },
  // Object.prototype's names are plain data: a role lookup must not find them (these were 500s).
  ...['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf'].map((role) => ({
    name: `role ${role}`,
    body: chatBody({
      messages: [
        { role: 'user', content: 'a' },
        { role, content: 'x' },
      ],
    }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[1].role',
    message: `messages[1].role ${ROLES}`,
  })),
  {
    name: 'model __proto__',
    body: chatBody({ model: '__proto__' }),
    status: 404,
    code: 'model_not_found',
    param: null,
    message: 'The model "__proto__" does not exist.',
  },
  {
    name: 'model constructor',
    body: chatBody({ model: 'constructor' }),
    status: 404,
    code: 'model_not_found',
    param: null,
    message: 'The model "constructor" does not exist.',
  },
  // Spec 000: a name that is no model of GET /models is a 404 with param null, whatever its length
  // (these were 400s naming `model`); the message quotes only the start of a long one.
  {
    name: 'model the empty string',
    body: chatBody({ model: '' }),
    status: 404,
    code: 'model_not_found',
    param: null,
    message: 'The model "" does not exist.',
  },
  {
    name: 'model a megabyte long',
    body: chatBody({ model: 'm'.repeat(1024 * 1024) }),
    status: 404,
    code: 'model_not_found',
    param: null,
    message: `The model "${'m'.repeat(128)}"… (1048576 characters) does not exist.`,
  },
  {
    name: 'user content a number',
    body: chatBody({ messages: [{ role: 'user', content: 7 }] }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[0].content',
  },
  {
    name: 'text part without text',
    body: chatBody({ messages: [{ role: 'user', content: [{ type: 'text' }] }] }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[0].content[0].text',
  },
  {
    name: 'assistant with neither content nor tool_calls',
    body: chatBody({
      messages: [
        { role: 'user', content: 'a' },
        { role: 'assistant', content: null },
      ],
    }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[1].content',
  },
  {
    name: 'tool message without a matching earlier tool call',
    body: chatBody({
      messages: [
        { role: 'user', content: 'a' },
        { role: 'tool', tool_call_id: 'call_9', content: 'r' },
      ],
    }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[1].tool_call_id',
  },
  {
    name: 'tool message before its tool call',
    body: chatBody({
      messages: [{ role: 'tool', tool_call_id: 'call_1', content: 'r' }, ...toolCallHistory],
    }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[0].tool_call_id',
  },
  {
    name: 'tool message without tool_call_id',
    body: chatBody({ messages: [...toolCallHistory, { role: 'tool', content: 'r' }] }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[2].tool_call_id',
  },
  {
    name: 'tool_choice naming an unknown function',
    body: chatBody({
      tools: [weatherTool],
      tool_choice: { type: 'function', function: { name: 'nope' } },
    }),
    status: 400,
    code: 'invalid_request_error',
    param: 'tool_choice.function.name',
  },
  {
    name: 'tool_choice not a known value',
    body: chatBody({ tools: [weatherTool], tool_choice: 'sometimes' }),
    status: 400,
    code: 'invalid_request_error',
    param: 'tool_choice',
    message: 'tool_choice must be "auto", "none", "required", an object or null',
  },
  {
    name: 'tool_choice required without tools',
    body: chatBody({ tool_choice: 'required' }),
    status: 400,
    code: 'invalid_request_error',
    param: 'tool_choice',
  },
  {
    name: 'tool without a name',
    body: chatBody({ tools: [{ type: 'function', function: {} }] }),
    status: 400,
    code: 'invalid_request_error',
    param: 'tools[0].function.name',
  },
  // Numbers outside their range name the field and the bound (CONTRACT §8).
  {
    name: 'max_tokens zero',
    body: chatBody({ max_tokens: 0 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'max_tokens',
    message: 'max_tokens must be ≥ 1',
  },
  {
    name: 'max_completion_tokens negative',
    body: chatBody({ max_completion_tokens: -5 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'max_completion_tokens',
    message: 'max_completion_tokens must be ≥ 1',
  },
  {
    name: 'max_completion_tokens not an integer',
    body: chatBody({ max_completion_tokens: 1.5 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'max_completion_tokens',
    message: 'max_completion_tokens must be an integer',
  },
  {
    name: 'temperature out of range',
    body: chatBody({ temperature: 3 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'temperature',
    message: 'temperature must be ≤ 2',
  },
  {
    name: 'temperature 5',
    body: chatBody({ temperature: 5 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'temperature',
    message: 'temperature must be ≤ 2',
  },
  {
    name: 'temperature negative',
    body: chatBody({ temperature: -0.5 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'temperature',
    message: 'temperature must be ≥ 0',
  },
  {
    name: 'temperature a string',
    body: chatBody({ temperature: 'hot' }),
    status: 400,
    code: 'invalid_request_error',
    param: 'temperature',
    message: 'temperature must be a number or null',
  },
  {
    name: 'top_p 2',
    body: chatBody({ top_p: 2 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'top_p',
    message: 'top_p must be ≤ 1',
  },
  {
    name: 'top_k negative',
    body: chatBody({ top_k: -1 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'top_k',
    message: 'top_k must be ≥ 0',
  },
  {
    name: 'top_k past an int32',
    body: chatBody({ top_k: 1e12 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'top_k',
    message: 'top_k must be ≤ 2147483647',
  },
  {
    name: 'seed past what JSON carries exactly',
    body: chatBody({ seed: 1e30 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'seed',
    message: 'seed must be ≤ 9007199254740991',
  },
  {
    name: 'seed far below',
    body: chatBody({ seed: -(2 ** 63) }),
    status: 400,
    code: 'invalid_request_error',
    param: 'seed',
    message: 'seed must be ≥ -9007199254740991',
  },
  {
    name: 'seed not an integer',
    body: chatBody({ seed: 1.5 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'seed',
    message: 'seed must be an integer',
  },
  {
    name: 'stream not a boolean',
    body: chatBody({ stream: 'yes' }),
    status: 400,
    code: 'invalid_request_error',
    param: 'stream',
    message: 'stream must be a boolean or null',
  },
  {
    name: 'stop not a string or array',
    body: chatBody({ stop: 5 }),
    status: 400,
    code: 'invalid_request_error',
    param: 'stop',
    message: 'stop must be a string, an array or null',
  },
  {
    name: 'stop holding a number',
    body: chatBody({ stop: ['a', 5] }),
    status: 400,
    code: 'invalid_request_error',
    param: 'stop[1]',
    message: 'stop[1] must be a string',
  },
  {
    name: 'a tool call id empty',
    body: chatBody({
      messages: [
        { role: 'user', content: 'a' },
        {
          role: 'assistant',
          tool_calls: [{ id: '', type: 'function', function: { name: 'f', arguments: '{}' } }],
        },
      ],
    }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[1].tool_calls[0].id',
    message: 'messages[1].tool_calls[0].id must not be empty',
  },
  {
    // Room for a Gemini call's thought signature (a few KB), still bounded (32 KiB).
    name: 'a tool call id over 32 KiB',
    body: chatBody({
      messages: [
        { role: 'user', content: 'a' },
        {
          role: 'assistant',
          tool_calls: [
            {
              id: 'x'.repeat(32 * 1024 + 1),
              type: 'function',
              function: { name: 'f', arguments: '{}' },
            },
          ],
        },
      ],
    }),
    status: 400,
    code: 'invalid_request_error',
    param: 'messages[1].tool_calls[0].id',
    message: 'messages[1].tool_calls[0].id must be at most 32768 characters',
  },
  {
    name: 'tool_choice an object without its type',
    body: chatBody({ tools: [weatherTool], tool_choice: { function: { name: 'weather' } } }),
    status: 400,
    code: 'invalid_request_error',
    param: 'tool_choice.type',
    message: 'tool_choice.type is required',
  },
  {
    name: 'tool_choice an object without its function',
    body: chatBody({ tools: [weatherTool], tool_choice: { type: 'function' } }),
    status: 400,
    code: 'invalid_request_error',
    param: 'tool_choice.function',
    message: 'tool_choice.function is required',
  },
  {
    name: 'unknown model',
    body: chatBody({ model: 'model_99' }),
    status: 404,
    code: 'model_not_found',
    param: null,
  },
  {
    name: 'tools on model_09',
    body: chatBody({ model: 'model_09', tools: [weatherTool] }),
    status: 400,
    code: 'unsupported_parameter',
    param: 'tools',
  },
  {
    // The field is accepted only for models with tools (spec 000), empty or not.
    name: 'an empty tools array on model_09',
    body: chatBody({ model: 'model_09', tools: [] }),
    status: 400,
    code: 'unsupported_parameter',
    param: 'tools',
  },
  {
    name: 'malformed Idempotency-Key',
    body: chatBody(),
    headers: () => bearer(key, { 'idempotency-key': 'short' }),
    status: 400,
    code: 'invalid_idempotency_key',
  },
  {
    name: 'Idempotency-Key with a bad character',
    body: chatBody(),
    headers: () => bearer(key, { 'idempotency-key': 'has space in it' }),
    status: 400,
    code: 'invalid_idempotency_key',
  },
  {
    name: 'messages over the context window',
    body: chatBody({
      model: 'model_tiny',
      messages: [{ role: 'user', content: 'word '.repeat(200) }],
    }),
    status: 400,
    code: 'context_length_exceeded',
    param: 'messages',
  },
  {
    name: 'output limit over the model maximum',
    body: chatBody({ model: 'model_tiny', max_completion_tokens: 33 }),
    status: 400,
    code: 'context_length_exceeded',
    param: 'max_completion_tokens',
  },
  {
    name: 'input plus output limit over the window',
    body: chatBody({
      model: 'model_tiny',
      messages: [{ role: 'user', content: 'word '.repeat(40) }],
      max_tokens: 30,
    }),
    status: 400,
    code: 'context_length_exceeded',
    param: 'max_completion_tokens',
  },
  {
    name: 'balance cannot cover the reservation',
    body: chatBody(),
    headers: () => bearer(brokeKey),
    status: 402,
    code: 'insufficient_quota',
  },
  // The check order: the first failure answers.
  {
    name: 'order: auth before JSON',
    body: '{nope',
    headers: () => ({}),
    status: 401,
    code: 'invalid_api_key',
    reason: 'missing',
  },
  {
    name: 'order: shape before model',
    body: { model: 'model_99', messages: [] },
    status: 400,
    code: 'invalid_request_error',
    param: 'messages',
  },
  {
    name: 'order: model before capability',
    body: chatBody({ model: 'model_99', tools: [weatherTool] }),
    status: 404,
    code: 'model_not_found',
    param: null,
  },
  {
    name: 'order: capability before idempotency',
    body: chatBody({ model: 'model_09', tools: [weatherTool] }),
    headers: () => bearer(key, { 'idempotency-key': 'x' }),
    status: 400,
    code: 'unsupported_parameter',
    param: 'tools',
  },
  {
    name: 'order: idempotency before context',
    body: chatBody({ model: 'model_tiny', max_tokens: 999 }),
    headers: () => bearer(key, { 'idempotency-key': 'x' }),
    status: 400,
    code: 'invalid_idempotency_key',
  },
  {
    name: 'order: context before quota',
    body: chatBody({ model: 'model_tiny', max_tokens: 999 }),
    headers: () => bearer(brokeKey),
    status: 400,
    code: 'context_length_exceeded',
    param: 'max_completion_tokens',
  },
];

const TYPE_BY_STATUS: Record<number, string> = {
  400: 'invalid_request_error',
  401: 'authentication_error',
  402: 'billing_error',
  404: 'invalid_request_error',
  413: 'invalid_request_error',
  429: 'rate_limit_error',
};

describe('chat request rules', () => {
  for (const rule of rules) {
    test(`${rule.name} → ${rule.status} ${rule.code}`, async () => {
      const response = await post(rule.body, rule.headers?.());
      const body = (await response.json()) as { error: Record<string, unknown> };
      expect(response.status).toBe(rule.status);
      expect(response.headers.get('x-request-id')).toMatch(/^chatcmpl-/);
      expect(body.error.code).toBe(rule.code);
      expect(body.error.type).toBe(TYPE_BY_STATUS[rule.status]!);
      expect(typeof body.error.message).toBe('string');
      if (rule.param !== undefined) expect(body.error.param).toBe(rule.param);
      else expect('param' in body.error).toBe(true);
      if (rule.reason) expect(body.error.reason).toBe(rule.reason);
      if (rule.message !== undefined) expect(body.error.message).toBe(rule.message);
      // `detail` is the decision service's (CONTRACT §2), though chat shares its parsers.
      expect('detail' in body.error).toBe(false);
    });
  }

  test('a body over 4 MB is refused with 413 before it is parsed (Content-Length)', async () => {
    const response = await post('x'.repeat(4 * 1024 * 1024 + 1), {});
    expect(response.status).toBe(413);
    expect(((await response.json()) as any).error).toEqual({
      message: expect.any(String),
      type: 'invalid_request_error',
      code: 'request_too_large',
      param: null,
    });
  });

  test('a chunked body over 4 MB without Content-Length is refused with 413', async () => {
    const piece = new Uint8Array(256 * 1024).fill(0x20);
    let sent = 0;
    const body = new ReadableStream<Uint8Array>({
      pull(controller) {
        if (sent >= 20) return controller.close();
        sent++;
        controller.enqueue(piece);
      },
    });
    const response = await t.app.handle(
      new Request('http://gateway.test/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body,
        duplex: 'half',
      } as RequestInit),
    );
    expect(response.status).toBe(413);
    expect(((await response.json()) as any).error.code).toBe('request_too_large');
    // Reading stopped at the limit: not all 5 MB were pulled.
    expect(sent).toBeLessThan(20);
  });

  test('a body of exactly 4 MB is read and parsed', async () => {
    const base = JSON.stringify(chatBody());
    const padded = `${base.slice(0, -1)},"pad":"${'p'.repeat(4 * 1024 * 1024 - base.length - 9)}"}`;
    expect(padded.length).toBe(4 * 1024 * 1024);
    const response = await post(padded);
    expect(response.status).toBe(200);
  });
});

describe('what the rules accept', () => {
  test(
    'a tool call the output limit cuts off ends with finish_reason stop, not tool_calls, and a ' +
      'plain answer leaves it out (its arguments are a fragment no client should run)',
    async () => {
      const tools = [
        {
          type: 'function',
          function: {
            name: 'lookup',
            parameters: {
              type: 'object',
              properties: { query: { type: 'string', minLength: 200 } },
              required: ['query'],
            },
          },
        },
      ];
      for (const stream of [false, true]) {
        const response = await post(
          chatBody({ tools, tool_choice: 'required', max_completion_tokens: 3, stream }),
        );
        expect(response.status).toBe(200);
        const text = await response.text();
        const finishes = stream
          ? [...text.matchAll(/"finish_reason":"(\w+)"/g)].map((match) => match[1])
          : [JSON.parse(text).choices[0].finish_reason];
        expect({ stream, finishes }).toEqual({ stream, finishes: ['stop'] });
        // A stream has sent the fragment before it knew; a plain answer leaves it out.
        if (stream) expect(text).toContain('"name":"lookup"');
        else
          expect(JSON.parse(text).choices[0].message).toEqual({ role: 'assistant', content: '' });
      }
      const whole = await post(chatBody({ tools, tool_choice: 'required' }));
      const completion = (await whole.json()) as any;
      expect(completion.choices[0].finish_reason).toBe('tool_calls');
      const args = completion.choices[0].message.tool_calls[0].function.arguments;
      expect(JSON.parse(args).query.length).toBeGreaterThanOrEqual(200);
    },
  );

  test('non-text content parts are dropped, not refused', async () => {
    const response = await post(
      chatBody({
        messages: [
          {
            role: 'user',
            content: [
              { type: 'text', text: 'Describe' },
              { type: 'image_url', image_url: { url: 'https://example.invalid/a.png' } },
              { type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } },
            ],
          },
        ],
      }),
    );
    expect(response.status).toBe(200);
  });

  test('ignored fields are ignored', async () => {
    const response = await post(
      chatBody({
        response_format: { type: 'json_object' },
        frequency_penalty: 1,
        presence_penalty: 1,
        repetition_penalty: 1.1,
        logit_bias: { '50256': -100 },
        logprobs: true,
        top_logprobs: 3,
        reasoning: { effort: 'high' },
        reasoning_effort: 'high',
        modalities: ['text'],
        audio: { voice: 'x' },
        image_config: {},
        stream_options: { include_usage: true },
        service_tier: 'flex',
        prediction: { type: 'content', content: 'x' },
        parallel_tool_calls: false,
        user: 'someone',
        some_future_field: 1,
      }),
    );
    expect(response.status).toBe(200);
    const body = (await response.json()) as Record<string, any>;
    expect(body.choices[0].logprobs).toBeUndefined();
    expect(body.service_tier).toBeUndefined();
  });

  test('legacy aliases resolve to model_03 and the response shows model_03', async () => {
    for (const alias of ['legacy_fast_1', 'legacy_fast_2']) {
      const response = await post(chatBody({ model: alias }));
      expect(response.status).toBe(200);
      expect(((await response.json()) as any).model).toBe('model_03');
    }
  });

  test('max_tokens is an alias of max_completion_tokens', async () => {
    const response = await post(chatBody({ max_tokens: 3 }));
    const body = (await response.json()) as any;
    expect(response.status).toBe(200);
    expect(body.usage.completion_tokens).toBeLessThanOrEqual(3);
  });

  test('top_k on a model without it, seed and stop are accepted', async () => {
    const response = await post(chatBody({ model: 'model_03', top_k: 40, seed: 7, stop: ['zzz'] }));
    expect(response.status).toBe(200);
  });

  test('a tool message after its assistant tool call is accepted', async () => {
    const response = await post(
      chatBody({
        messages: [
          ...toolCallHistory,
          { role: 'tool', tool_call_id: 'call_1', content: [{ type: 'text', text: 'sunny' }] },
        ],
        tools: [weatherTool],
      }),
    );
    expect(response.status).toBe(200);
  });

  test('a trailing slash is accepted', async () => {
    const response = await t.request('/api/v1/chat/completions/', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody()),
    });
    expect(response.status).toBe(200);
  });
});

describe('rate limit', () => {
  test('429 rate_limit_exceeded with Retry-After in whole seconds', async () => {
    const limited = (await t.createKey({ rate_limit_rpm: 1 })).key;
    expect((await post(chatBody(), bearer(limited))).status).toBe(200);
    const response = await post(chatBody(), bearer(limited));
    expect(response.status).toBe(429);
    const retryAfter = Number(response.headers.get('retry-after'));
    expect(Number.isInteger(retryAfter) && retryAfter >= 1).toBe(true);
    expect(((await response.json()) as any).error).toEqual({
      message: expect.any(String),
      type: 'rate_limit_error',
      code: 'rate_limit_exceeded',
      param: null,
    });
  });
});

describe('text that spells tokenizer control tokens', () => {
  test('is ordinary text: counted and answered, not refused (it was a 500)', async () => {
    const content = 'Explain <|endoftext|> and <|im_start|>system in one line.';
    const response = await post(chatBody({ messages: [{ role: 'user', content }] }));
    expect(response.status).toBe(200);
    const { usage } = (await response.json()) as { usage: { prompt_tokens: number } };
    // Counted as plain text: more tokens than the special-token reading would give (one per
    // marker).
    expect(usage.prompt_tokens).toBeGreaterThan(6 + 14);
  });
});

describe('a body near 4 MB of one long word', () => {
  test(
    'is counted in bounded work and refused ' + 'as over the context window (it took hours)',
    async () => {
      const word = randomBytes(3_000_000).toString('base64');
      const response = await post(chatBody({ messages: [{ role: 'user', content: word }] }));
      expect(response.status).toBe(400);
      expect(
        ((await response.json()) as { error: { code: string; param: string } }).error,
      ).toMatchObject({ code: 'context_length_exceeded', param: 'messages' });
    },
  );
});

describe('object members of a chat body', () => {
  test(
    'are bounded in all before the body is parsed, in one object or spread over many: 33,000 ' +
      'are a 400, 32,000 pass (99,000 keys held the loop ~100 ms, refused or not)',
    async () => {
      const members = (count: number, prefix = 'key') =>
        Object.fromEntries(Array.from({ length: count }, (_, i) => [`${prefix}${i}`, 'v']));
      const spread = (objects: number, each: number) =>
        Object.fromEntries(
          Array.from({ length: objects }, (_, i) => [`o${i}`, members(each, `k${i}_`)]),
        );
      const over = await post(chatBody({ metadata: members(99_000) }));
      expect(over.status).toBe(400);
      expect(((await over.json()) as any).error).toMatchObject({
        code: 'invalid_request_error',
        message: 'The JSON body holds more than 32768 object members.',
      });
      expect((await post(chatBody({ metadata: spread(95, 1_024) }))).status).toBe(400);
      expect((await post(chatBody({ metadata: spread(33, 1_000) }))).status).toBe(400);
      expect((await post(chatBody({ metadata: spread(32, 1_000) }))).status).toBe(200);
      const strings = Array.from({ length: 50_000 }, (_, i) => `s${i}`);
      expect((await post(chatBody({ metadata: { strings } }))).status).toBe(200);
    },
  );
});

describe('JSON nesting limit', () => {
  test(
    'the shortest bodies at the limit: 256 nested ' +
      'arrays are only not an object, 257 nest too deep',
    async () => {
      const message = async (levels: number) => {
        const response = await post('['.repeat(levels) + ']'.repeat(levels));
        expect(response.status).toBe(400);
        return ((await response.json()) as { error: { message: string } }).error.message;
      };
      expect(await message(256)).toBe('The body must be a JSON object.');
      expect(await message(257)).toBe(`The JSON body nests deeper than ${JSON_DEPTH_MAX} levels.`);
    },
  );
});

describe(
  'generated work is bounded (CONTRACT §8): a tool schema the simulator cannot answer within 64 ' +
    'KiB is a 400',
  () => {
    /**
     * A generous ceiling only an unbounded generator could pass (minItems 1e8 took 19.6 s and 1.7
     * GB).
     */
    const QUICK_MS = 2_000;
    const LIMIT = 64 * 1024;
    const tooLarge = (param: string) =>
      `${param}: the smallest value this schema allows is larger than the ${LIMIT} bytes the ` +
      `simulator writes for tool arguments`;
    const tooComplex = (param: string) =>
      `${param}: the simulator cannot find a value of this schema within ${LIMIT} bytes in ` +
      `bounded work; simplify the schema`;
    const nested = (levels: number, items: number): unknown =>
      levels === 0
        ? { type: 'integer' }
        : { type: 'array', minItems: items, items: nested(levels - 1, items) };
    const cycle: { $defs: Record<string, unknown>; $ref: string } = {
      $defs: {},
      $ref: '#/$defs/n0',
    };
    for (let i = 0; i < 30; i++) {
      const next = { $ref: `#/$defs/n${(i + 1) % 30}` };
      cycle.$defs[`n${i}`] = {
        anyOf: [next, { type: 'object', properties: { x: next }, required: ['x'] }],
      };
    }
    const tool = (name: string, parameters: unknown) => ({
      type: 'function',
      function: { name, parameters },
    });

    const attacks: Array<{
      name: string;
      parameters: unknown;
      message: (param: string) => string;
    }> = [
      { name: 'minItems 1e8', parameters: { type: 'array', minItems: 1e8 }, message: tooLarge },
      {
        name: 'minLength 1e9',
        parameters: {
          type: 'object',
          properties: { s: { type: 'string', minLength: 1e9 } },
          required: ['s'],
        },
        message: tooLarge,
      },
      {
        name: 'minProperties 1e8',
        parameters: { type: 'object', minProperties: 1e8 },
        message: tooLarge,
      },
      {
        name: 'nested arrays with minItems 100 at every level',
        parameters: nested(4, 100),
        message: tooLarge,
      },
      {
        name: 'a required recursive $ref',
        parameters: { type: 'object', properties: { next: { $ref: '#' } }, required: ['next'] },
        message: tooLarge,
      },
      {
        name: 'an enum whose every member is over the limit',
        parameters: {
          type: 'object',
          properties: { e: { enum: ['x'.repeat(70_000), 'y'.repeat(80_000)] } },
          required: ['e'],
        },
        message: tooLarge,
      },
      {
        name: 'uniqueItems over a tiny enum, minItems 1e7',
        parameters: { type: 'array', uniqueItems: true, minItems: 1e7, items: { enum: [1, 2] } },
        message: tooLarge,
      },
      {
        name: 'a string one byte over the limit',
        parameters: { type: 'string', minLength: LIMIT - 1 },
        message: tooLarge,
      },
      {
        // A pattern open at its end is padded to its minLength: to what fits, no further.
        name: 'an open pattern of minLength 1e9',
        parameters: { type: 'string', pattern: '^a', minLength: 1e9 },
        message: tooLarge,
      },
      {
        // A format's free part grows to the minLength: to what fits, not to 1e9 (8.5 s and 1 GB).
        name: 'an email of minLength 1e9',
        parameters: { type: 'string', format: 'email', minLength: 1e9 },
        message: tooLarge,
      },
      {
        // Each string of the pattern is 70,000 characters long (a word had been sent instead).
        name: 'a pattern whose every string is over the limit',
        parameters: { type: 'string', pattern: '^(x{70000}|y{80000})$' },
        message: tooLarge,
      },
      { name: 'a recursive cycle of unions', parameters: cycle, message: tooComplex },
    ];

    let keyId: string;
    let attackKey: string;
    beforeAll(async () => {
      ({ id: keyId, key: attackKey } = await t.createKey({ credits: 5 }));
    });

    async function balances(): Promise<Record<string, number>> {
      return (
        (await (
          await t.request(`/admin/v1/keys/${keyId}`, {
            headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
          })
        ).json()) as any
      ).balances;
    }

    for (const attack of attacks) {
      for (const [choice, toolChoice] of [
        ['required', 'required'],
        ['auto (no tool_choice)', undefined],
      ] as const) {
        test(
          `${attack.name}, tool_choice ${choice} → ` + `400 naming the tool, at once, nothing held`,
          async () => {
            const before = await balances();
            const startedMs = performance.now();
            const response = await post(
              chatBody({
                tools: [weatherTool, tool('attack', attack.parameters)],
                tool_choice: toolChoice,
              }),
              bearer(attackKey),
            );
            const body = (await response.json()) as any;
            expect(performance.now() - startedMs).toBeLessThan(QUICK_MS);
            expect(response.status).toBe(400);
            const param = 'tools[1].function.parameters';
            expect(body.error).toEqual({
              message: attack.message(param),
              type: 'invalid_request_error',
              code: 'invalid_request_error',
              param,
            });
            expect(await balances()).toEqual(before);
          },
        );
      }
    }

    test('a schema at the limit is answered: 65,536 bytes of arguments', async () => {
      const response = await post(
        chatBody({
          tools: [tool('edge', { type: 'string', minLength: LIMIT - 2 })],
          tool_choice: 'required',
        }),
      );
      expect(response.status).toBe(200);
      const args = ((await response.json()) as any).choices[0].message.tool_calls[0].function
        .arguments as string;
      expect(Buffer.byteLength(args)).toBeLessThanOrEqual(LIMIT);
      expect((JSON.parse(args) as string).length).toBeGreaterThanOrEqual(LIMIT - 2);
    });

    test('a large but small-enough schema gets arguments that satisfy it', async () => {
      const parameters = {
        type: 'object',
        properties: {
          rows: {
            type: 'array',
            minItems: 2_000,
            items: { type: 'integer', minimum: 1, maximum: 9 },
          },
        },
        required: ['rows'],
      };
      const response = await post(
        chatBody({ tools: [tool('rows', parameters)], tool_choice: 'required' }),
      );
      expect(response.status).toBe(200);
      const args = JSON.parse(
        ((await response.json()) as any).choices[0].message.tool_calls[0].function.arguments,
      ) as { rows: number[] };
      expect(args.rows.length).toBeGreaterThanOrEqual(2_000);
      expect(args.rows.every((n) => Number.isInteger(n) && n >= 1 && n <= 9)).toBe(true);
    });

    test(
      'a JSON-schema request written into a system ' +
        'message is answered within the limit, at once',
      async () => {
        // The simulator honours JSON_SCHEMA_MARKER for the decision service; any caller can write
        // it too.
        const system = `${JSON_SCHEMA_MARKER}\n${JSON.stringify({
          type: 'array',
          minItems: 1e8,
          items: { type: 'string', minLength: 1e6 },
        })}`;
        const startedMs = performance.now();
        const response = await post(
          chatBody({
            messages: [
              { role: 'system', content: system },
              { role: 'user', content: 'go' },
            ],
          }),
        );
        expect(performance.now() - startedMs).toBeLessThan(QUICK_MS);
        expect(response.status).toBe(200);
        const content = ((await response.json()) as any).choices[0].message.content as string;
        expect(Buffer.byteLength(content)).toBeLessThanOrEqual(LIMIT);
      },
    );

    test(
      'a system message’s JSON schema is parsed within a body’s bounds (members, depth): past ' +
        'them it is no schema, and the answer is text',
      async () => {
        const answerTo = async (schema: string) => {
          const response = await post(
            chatBody({
              messages: [
                { role: 'system', content: `${JSON_SCHEMA_MARKER}\n${schema}` },
                { role: 'user', content: 'go' },
              ],
            }),
          );
          expect(response.status).toBe(200);
          return ((await response.json()) as any).choices[0].message.content as string;
        };
        // Keys are what JSON.parse is slowest at: 180,000 of them held the event loop 40-190 ms.
        const withKeys = (keys: number) =>
          JSON.stringify({
            type: 'object',
            properties: { a: { const: 1 } },
            required: ['a'],
            description: Object.fromEntries(Array.from({ length: keys }, (_, i) => [`k${i}`, 0])),
          });
        expect(await answerTo(withKeys(32_000))).toBe('{"a":1}');
        expect(await answerTo(withKeys(33_000))).not.toStartWith('{');
        const deep = (levels: number) =>
          `{"type":"object","properties":{"a":{"const":1}},"required":["a"],"x":${'['.repeat(
            levels,
          )}${']'.repeat(levels)}}`;
        expect(await answerTo(deep(JSON_DEPTH_MAX - 2))).toBe('{"a":1}');
        expect(await answerTo(deep(JSON_DEPTH_MAX))).not.toStartWith('{');
      },
    );
  },
);

describe('tool-call arguments sent back to a model with an anthropic or gemini deployment', () => {
  // A model served by Anthropic (whose tool_use.input is an object) beside the simulator (which
  // takes OpenAI's string as is). The anthropic deployment is a dead port: nothing here reaches it.
  let mixed: TestGateway;
  let mixedKey: { id: string; key: string };
  beforeAll(async () => {
    mixed = openTestGateway({
      providers: { claude: { type: 'anthropic', base_url: 'http://127.0.0.1:9/v1' } },
      models: {
        model_mixed: {
          deployments: [
            { provider: 'claude', upstream_model: 'claude-x' },
            { provider: 'simulator', upstream_model: 'sim' },
          ],
          tools: true,
          top_k: false,
          seed: false,
          rates: { input: 1, output: 1 },
          context_window: 1_000_000,
          max_output_tokens: 1_000,
          created: 0,
        },
      },
    });
    mixedKey = await mixed.createKey({ credits: 1_000 });
  });
  afterAll(() => mixed.close());

  /** A chat call to model_mixed whose history's second tool call has `args` as its arguments. */
  const postMixed = (args: string, headers: Record<string, string> = bearer(mixedKey.key)) =>
    mixed.request('/api/v1/chat/completions', {
      method: 'POST',
      headers,
      body: JSON.stringify({ model: 'model_mixed', messages: history(args), tools: [weatherTool] }),
    });

  const history = (args: string) => [
    { role: 'user', content: 'weather?' },
    { role: 'assistant', content: 'let me look' },
    {
      role: 'assistant',
      content: null,
      tool_calls: [
        { id: 'call_1', type: 'function', function: { name: 'weather', arguments: '{}' } },
        { id: 'call_2', type: 'function', function: { name: 'weather', arguments: args } },
      ],
    },
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny' },
    { role: 'tool', tool_call_id: 'call_2', content: 'rainy' },
  ];

  test.each([
    ['not JSON', 'not json'],
    ['a JSON array', '[1,2]'],
    ['a JSON string', '"city"'],
    ['null', 'null'],
  ])('%s: 400 naming the message and the call, before any hold or binding', async (_, args) => {
    const headers = { ...bearer(mixedKey.key), 'idempotency-key': 'tool-args-check-1' };
    // Several times: whichever deployment the pick would choose, the same answer.
    for (let i = 0; i < 4; i++) {
      const response = await postMixed(args, headers);
      expect(response.status).toBe(400);
      const { error } = (await response.json()) as { error: Record<string, unknown> };
      expect(error).toMatchObject({
        code: 'invalid_request_error',
        param: 'messages[2].tool_calls[1].function.arguments',
      });
    }
    const view = (await (
      await mixed.request(`/admin/v1/keys/${mixedKey.id}`, {
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
      })
    ).json()) as { balances: Record<string, number> };
    expect(view.balances).toMatchObject({ held: 0, charged: 0, credits: 1_000 });
  });

  test.each([
    ['too many values in all', 25_001, 1, 'hold at most 25000 JSON values'],
    ['nested too deep', 1, 300, 'nests deeper than 256 levels'],
  ])('arguments %s: 400 before they are parsed', async (_, keys, depth, words) => {
    const object = `{${Array.from({ length: keys }, (_, k) => `"k${k}":0`).join(',')}}`;
    const args = '{"a":'.repeat(depth - 1) + object + '}'.repeat(depth - 1);
    const response = await postMixed(args);
    expect(response.status).toBe(400);
    const { error } = (await response.json()) as { error: { param: string; message: string } };
    expect(error.param).toBe('messages[2].tool_calls[1].function.arguments');
    expect(error.message).toContain(words);
  });

  test('arguments just within the bound are parsed and pass', async () => {
    // `{}` of the first call is 2 values (see countJsonValues); n keys are n + 1.
    const object = `{${Array.from({ length: 24_997 }, (_, k) => `"k${k}":0`).join(',')}}`;
    const response = await postMixed(object);
    expect(response.status).toBe(200);
    await response.text();
  });

  test('an object, or nothing, passes; an OpenAI-style model takes any string', async () => {
    for (const args of ['{"city":"Paris"}', '', '  ']) {
      const response = await postMixed(args);
      // Served by the simulator, or failed over to it from the dead anthropic port: never a 400.
      expect(response.status).toBe(200);
      await response.text();
    }
    const response = await post({
      model: 'model_03',
      messages: history('not json'),
      tools: [weatherTool],
    });
    expect(response.status).toBe(200);
    await response.text();
  });
});
