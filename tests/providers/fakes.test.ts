// The fake Anthropic and Gemini upstreams, parsed by the vendors' own SDKs: a fake that drifts from
// the real wire format (a renamed field, a wrong frame, a lost usage figure) turns these red.
import { afterAll, beforeEach, describe, expect, test } from 'bun:test';
import Anthropic from '@anthropic-ai/sdk';
import { ApiError, type GenerateContentResponse, GoogleGenAI } from '@google/genai';
import {
  ANTHROPIC_TOOL_PREAMBLE,
  ANTHROPIC_USAGE,
  startFakeAnthropic,
} from '../support/fake-anthropic.ts';
import {
  GEMINI_TEXT_PIECES,
  GEMINI_THOUGHT_SIGNATURE,
  GEMINI_USAGE,
  startFakeGemini,
} from '../support/fake-gemini.ts';
import {
  ANSWER_TEXT,
  FALLBACK_TOOL,
  MAX_RECORDED_REQUESTS,
  SECRET_PROMPT,
  TOOL_INPUT,
  type VendorMode,
} from '../support/fake-vendor.ts';

const TOOL = 'lookup_weather';

/** What `run` throws; a test fails if it does not throw. */
async function failure(run: () => PromiseLike<unknown>): Promise<any> {
  try {
    await run();
  } catch (error) {
    return error;
  }
  throw new Error('expected a failure, got an answer');
}

describe('fake Anthropic, read by @anthropic-ai/sdk', () => {
  const fake = startFakeAnthropic();
  // No retries: one SDK call is one request, so the fake's counters say what the SDK did.
  const client = new Anthropic({
    apiKey: 'x',
    baseURL: fake.origin,
    maxRetries: 0,
    logLevel: 'off',
  });
  const base = {
    model: 'claude-fake-1',
    max_tokens: 64,
    messages: [{ role: 'user' as const, content: 'Hi' }],
  };
  const tools = [
    {
      name: TOOL,
      description: 'Weather at a place',
      input_schema: {
        type: 'object' as const,
        properties: { location: { type: 'string' }, unit: { type: 'string' } },
      },
    },
  ];
  afterAll(() => fake.stop());
  beforeEach(() => {
    fake.mode = 'text';
  });

  test('non-stream text: the Message, its usage with cache figures, the auth headers', async () => {
    const message = await client.messages.create(base);
    expect(message.id).toStartWith('msg_');
    expect(message.type).toBe('message');
    expect(message.role).toBe('assistant');
    expect(message.model).toBe('claude-fake-1');
    expect(message.content).toEqual([{ type: 'text', text: ANSWER_TEXT }] as any);
    expect(message.stop_reason).toBe('end_turn');
    expect(message.stop_sequence).toBeNull();
    expect(message.usage).toMatchObject(ANTHROPIC_USAGE);
    const seen = fake.requests.at(-1)!;
    expect(seen.path).toBe('/v1/messages');
    // SDK 1.x sends the key as a bearer token; the gateway sends x-api-key (checked below).
    expect(seen.headers.authorization).toBe('Bearer x');
    expect(seen.headers['anthropic-version']).toMatch(/^\d{4}-\d{2}-\d{2}$/);
    expect(seen.body).toMatchObject({ model: 'claude-fake-1', max_tokens: 64 });
  });

  test('non-stream tools: a text block, then tool_use named after the first tool', async () => {
    fake.mode = 'tools';
    const message = await client.messages.create({ ...base, tools });
    expect(message.stop_reason).toBe('tool_use');
    expect(message.content).toHaveLength(2);
    const [text, call] = message.content;
    expect(text).toEqual({ type: 'text', text: ANTHROPIC_TOOL_PREAMBLE } as any);
    if (call?.type !== 'tool_use') throw new Error(`expected tool_use, got ${call?.type}`);
    expect(call.id).toStartWith('toolu_');
    expect(call.name).toBe(TOOL);
    expect(call.input).toEqual(TOOL_INPUT);
    expect(message.usage).toMatchObject(ANTHROPIC_USAGE);
    const fallback = await client.messages.create(base);
    expect(fallback.content[1]).toMatchObject({ type: 'tool_use', name: FALLBACK_TOOL });
  });

  test('stream text: deltas add up; message_delta settles usage and stop', async () => {
    const stream = client.messages.stream(base);
    const deltas: string[] = [];
    stream.on('text', (delta) => deltas.push(delta));
    const message = await stream.finalMessage();
    expect(deltas.length).toBeGreaterThan(1);
    expect(deltas.join('')).toBe(ANSWER_TEXT);
    expect(message.id).toStartWith('msg_');
    expect(message.content).toEqual([{ type: 'text', text: ANSWER_TEXT }] as any);
    expect(message.stop_reason).toBe('end_turn');
    expect(message.usage).toMatchObject(ANTHROPIC_USAGE);
    expect(fake.requests.at(-1)!.body.stream).toBe(true);
  });

  test('stream tools: input_json_delta pieces parse into the tool input', async () => {
    fake.mode = 'tools';
    const stream = client.messages.stream({ ...base, tools });
    const pieces: string[] = [];
    stream.on('inputJson', (partial) => pieces.push(partial));
    const message = await stream.finalMessage();
    expect(pieces.filter((piece) => piece.length > 0).length).toBeGreaterThan(1);
    expect(JSON.parse(pieces.join(''))).toEqual(TOOL_INPUT);
    expect(message.stop_reason).toBe('tool_use');
    expect(message.content[0]).toEqual({ type: 'text', text: ANTHROPIC_TOOL_PREAMBLE } as any);
    const call = message.content[1];
    if (call?.type !== 'tool_use') throw new Error(`expected tool_use, got ${call?.type}`);
    expect(call.id).toStartWith('toolu_');
    expect(call.name).toBe(TOOL);
    expect(call.input).toEqual(TOOL_INPUT);
    expect(message.usage).toMatchObject(ANTHROPIC_USAGE);
  });

  test('a tool without parameters: input {} whole, and streamed as one empty delta', async () => {
    fake.mode = 'tools';
    const bare = [{ name: 'get_time', input_schema: { type: 'object' as const } }];
    const message = await client.messages.create({ ...base, tools: bare });
    expect(message.content[1]).toMatchObject({ type: 'tool_use', name: 'get_time', input: {} });
    const stream = client.messages.stream({ ...base, tools: bare });
    const pieces: string[] = [];
    stream.on('inputJson', (partial) => pieces.push(partial));
    const streamed = await stream.finalMessage();
    expect(pieces.join('')).toBe('');
    expect(streamed.content[1]).toMatchObject({ type: 'tool_use', name: 'get_time', input: {} });
  });

  const errors: [VendorMode, number, string][] = [
    ['error400', 400, 'invalid_request_error'],
    ['error429', 429, 'rate_limit_error'],
    ['error500', 500, 'api_error'],
    ['error529', 529, 'overloaded_error'],
  ];
  for (const [mode, status, type] of errors) {
    test(`${mode}: the SDK throws an APIError ${status} ${type}, stream or not`, async () => {
      fake.mode = mode;
      const calls = fake.calls;
      const unary = await failure(() => client.messages.create(base));
      const streamed = await failure(() => client.messages.stream(base).finalMessage());
      for (const error of [unary, streamed]) {
        expect(error).toBeInstanceOf(Anthropic.APIError);
        expect(error.status).toBe(status);
        expect(error.type).toBe(type);
        expect(error.requestID).toStartWith('req_');
      }
      expect(fake.calls - calls).toBe(2);
    });
  }

  test('error400 carries the fake prompt, so a test can check it never leaks', async () => {
    fake.mode = 'error400';
    const error = await failure(() => client.messages.create(base));
    expect(error.apiMessage).toContain(SECRET_PROMPT);
  });

  test('midstream_error: text, then event: error overloaded_error, thrown by the SDK', async () => {
    fake.mode = 'midstream_error';
    const stream = client.messages.stream(base);
    const deltas: string[] = [];
    stream.on('text', (delta) => deltas.push(delta));
    const error = await failure(() => stream.finalMessage());
    expect(deltas.join('')).toBe('Hello');
    expect(error).toBeInstanceOf(Anthropic.APIError);
    expect(error.type).toBe('overloaded_error');
    expect(fake.calls).toBe(fake.requests.length);
  });

  test('garbage: the SDK cannot parse the body, stream or not', async () => {
    fake.mode = 'garbage';
    expect(await failure(() => client.messages.create(base))).toBeInstanceOf(SyntaxError);
    const streamed = await failure(() => client.messages.stream(base).finalMessage());
    expect(streamed).toBeInstanceOf(Anthropic.AnthropicError);
    expect(streamed.message).toMatch(/JSON/);
  });

  test('endless streams text until the client aborts, and the fake sees the abort', async () => {
    fake.mode = 'endless';
    const aborted = fake.nextAbort.promise;
    const stream = client.messages.stream(base);
    let deltas = 0;
    for await (const event of stream) {
      if (event.type === 'content_block_delta' && ++deltas === 5) break;
    }
    await aborted;
    expect(deltas).toBe(5);
  });

  test('hang never answers; gated answers when the gate opens', async () => {
    fake.mode = 'hang';
    const controller = new AbortController();
    const called = fake.nextCall.promise;
    const aborted = fake.nextAbort.promise;
    const hung = failure(() => client.messages.create(base, { signal: controller.signal }));
    await called;
    controller.abort();
    await aborted;
    expect(await hung).toBeInstanceOf(Anthropic.APIUserAbortError);
    fake.mode = 'gated';
    const gatedCall = fake.nextCall.promise;
    const gated = client.messages.create(base);
    await gatedCall;
    fake.gate.resolve();
    expect((await gated).content).toEqual([{ type: 'text', text: ANSWER_TEXT }] as any);
  });

  test('requests the real API refuses are refused the same way', async () => {
    const noMaxTokens = { model: base.model, messages: base.messages } as any;
    const error = await failure(() => client.messages.create(noMaxTokens));
    expect(error.status).toBe(400);
    expect(error.apiMessage).toBe('max_tokens: Field required');
    const system = { ...base, messages: [{ role: 'system', content: 'Be brief' }] } as any;
    const roleError = await failure(() => client.messages.create(system));
    expect(roleError.apiMessage).toContain('Unexpected role "system"');
    // The gateway's way in (CONTRACT §7): x-api-key, no bearer token.
    const keyed = new Anthropic({
      apiKey: null,
      authToken: null,
      baseURL: fake.origin,
      defaultHeaders: { 'x-api-key': 'k' },
    });
    expect((await keyed.messages.create(base)).content).toHaveLength(1);
    expect(fake.requests.at(-1)!.headers['x-api-key']).toBe('k');
    expect(fake.requests.at(-1)!.headers.authorization).toBeUndefined();
    const keyless = await fetch(`${fake.url}/messages`, {
      method: 'POST',
      headers: { 'anthropic-version': '2023-06-01', 'content-type': 'application/json' },
      body: JSON.stringify(base),
    });
    expect(keyless.status).toBe(401);
    expect(await keyless.json()).toMatchObject({ error: { type: 'authentication_error' } });
  });

  test(`the request log keeps the last ${MAX_RECORDED_REQUESTS}`, async () => {
    for (let index = 0; index <= MAX_RECORDED_REQUESTS; index++) {
      await fetch(`${fake.origin}/v1/unknown/${index}`, { method: 'POST', body: '{}' });
    }
    expect(fake.requests).toHaveLength(MAX_RECORDED_REQUESTS);
    expect(fake.requests[0]!.path).toBe('/v1/unknown/1');
    expect(fake.requests.at(-1)!.path).toBe(`/v1/unknown/${MAX_RECORDED_REQUESTS}`);
  });
});

describe('fake Gemini, read by @google/genai', () => {
  const fake = startFakeGemini();
  const ai = new GoogleGenAI({ apiKey: 'x', httpOptions: { baseUrl: fake.origin } });
  const model = 'gemini-fake-1.5';
  const base = { model, contents: 'Hi' };
  const tools = [
    {
      functionDeclarations: [
        {
          name: TOOL,
          description: 'Weather at a place',
          parametersJsonSchema: {
            type: 'object',
            properties: { location: { type: 'string' }, unit: { type: 'string' } },
          },
        },
      ],
    },
  ];
  const finalUsage = {
    ...GEMINI_USAGE,
    promptTokensDetails: [{ modality: 'TEXT', tokenCount: GEMINI_USAGE.promptTokenCount }],
  };
  afterAll(() => fake.stop());
  beforeEach(() => {
    fake.mode = 'text';
  });

  async function collect(params: object): Promise<GenerateContentResponse[]> {
    const chunks: GenerateContentResponse[] = [];
    for await (const chunk of await ai.models.generateContentStream(params as any)) {
      chunks.push(chunk);
    }
    return chunks;
  }

  test('generateContent text: text, finishReason, usage with thoughts, key header', async () => {
    const response = await ai.models.generateContent(base);
    expect(response.text).toBe(ANSWER_TEXT);
    expect(response.candidates?.[0]?.finishReason).toBe('STOP' as any);
    expect(response.candidates?.[0]?.content?.role).toBe('model');
    expect(response.usageMetadata).toEqual(finalUsage as any);
    expect(response.modelVersion).toBe(model);
    expect(response.responseId).toBeString();
    const seen = fake.requests.at(-1)!;
    expect(seen.path).toBe(`/v1beta/models/${model}:generateContent`);
    expect(seen.headers['x-goog-api-key']).toBe('x');
    expect(seen.body.contents).toEqual([{ role: 'user', parts: [{ text: 'Hi' }] }]);
  });

  test('generateContent tools: one functionCall named after the first declaration', async () => {
    fake.mode = 'tools';
    const response = await ai.models.generateContent({ ...base, config: { tools } });
    expect(response.functionCalls).toEqual([{ name: TOOL, args: TOOL_INPUT }]);
    expect(response.candidates?.[0]?.content?.parts?.[0]?.thoughtSignature).toBe(
      GEMINI_THOUGHT_SIGNATURE,
    );
    expect(response.candidates?.[0]?.finishReason).toBe('STOP' as any);
    expect(response.usageMetadata).toEqual(finalUsage as any);
    expect(fake.requests.at(-1)!.body.tools[0].functionDeclarations[0].name).toBe(TOOL);
    const fallback = await ai.models.generateContent(base);
    expect(fallback.functionCalls).toEqual([{ name: FALLBACK_TOOL, args: TOOL_INPUT }]);
  });

  test('generateContentStream text: pieces add up; the last chunk has final usage', async () => {
    const chunks = await collect(base);
    expect(chunks.map((chunk) => chunk.text)).toEqual([...GEMINI_TEXT_PIECES]);
    expect(chunks.map((chunk) => chunk.text).join('')).toBe(ANSWER_TEXT);
    const last = chunks.at(-1)!;
    expect(last.candidates?.[0]?.finishReason).toBe('STOP' as any);
    expect(last.usageMetadata).toEqual(finalUsage as any);
    // Earlier chunks carry the running total so far: no candidates counted yet.
    expect(chunks[0]!.usageMetadata?.promptTokenCount).toBe(GEMINI_USAGE.promptTokenCount);
    expect(chunks[0]!.usageMetadata?.candidatesTokenCount).toBeUndefined();
    expect(fake.requests.at(-1)!.path).toBe(
      `/v1beta/models/${model}:streamGenerateContent?alt=sse`,
    );
  });

  test('generateContentStream tools: the functionCall arrives whole', async () => {
    fake.mode = 'tools';
    const chunks = await collect({ ...base, config: { tools } });
    expect(chunks.flatMap((chunk) => chunk.functionCalls ?? [])).toEqual([
      { name: TOOL, args: TOOL_INPUT },
    ]);
    expect(chunks.at(-1)!.usageMetadata).toEqual(finalUsage as any);
  });

  test('a function without parameters: args {}, whole and streamed', async () => {
    fake.mode = 'tools';
    const bare = [{ functionDeclarations: [{ name: 'get_time', description: 'The time' }] }];
    const response = await ai.models.generateContent({ ...base, config: { tools: bare } });
    expect(response.functionCalls).toEqual([{ name: 'get_time', args: {} }]);
    const chunks = await collect({ ...base, config: { tools: bare } });
    expect(chunks.flatMap((chunk) => chunk.functionCalls ?? [])).toEqual([
      { name: 'get_time', args: {} },
    ]);
  });

  const errors: [VendorMode, number, string][] = [
    ['error400', 400, 'INVALID_ARGUMENT'],
    ['error429', 429, 'RESOURCE_EXHAUSTED'],
    ['error500', 500, 'INTERNAL'],
    ['error529', 503, 'UNAVAILABLE'],
  ];
  for (const [mode, status, name] of errors) {
    test(`${mode}: the SDK throws an ApiError ${status} ${name}, stream or not`, async () => {
      fake.mode = mode;
      const calls = fake.calls;
      const unary = await failure(() => ai.models.generateContent(base));
      expect(unary).toBeInstanceOf(ApiError);
      expect(unary.status).toBe(status);
      expect(JSON.parse(unary.message)).toMatchObject({ error: { code: status, status: name } });
      // On a stream request the error comes as text/event-stream: the SDK keeps it as text.
      const streamed = await failure(() => collect(base));
      expect(streamed).toBeInstanceOf(ApiError);
      expect(streamed.status).toBe(status);
      expect(streamed.message).toContain(name);
      expect(fake.calls - calls).toBe(2);
    });
  }

  test('error400 carries the fake prompt, so a test can check it never leaks', async () => {
    fake.mode = 'error400';
    const error = await failure(() => ai.models.generateContent(base));
    expect(JSON.parse(error.message).error.message).toContain(SECRET_PROMPT);
  });

  test('midstream_error: one chunk, then a bare error JSON thrown as ApiError', async () => {
    fake.mode = 'midstream_error';
    const texts: (string | undefined)[] = [];
    const error = await failure(async () => {
      for await (const chunk of await ai.models.generateContentStream(base)) texts.push(chunk.text);
    });
    expect(texts).toEqual(['Hello']);
    expect(error).toBeInstanceOf(ApiError);
    expect(error.status).toBe(503);
    expect(error.message).toContain('UNAVAILABLE');
    expect(fake.calls).toBe(fake.requests.length);
  });

  test('garbage: the SDK cannot parse the body, stream or not', async () => {
    fake.mode = 'garbage';
    expect((await failure(() => ai.models.generateContent(base))).message).toMatch(/JSON/);
    expect((await failure(() => collect(base))).message).toMatch(/JSON/);
  });

  test('endless streams until the client aborts, and the fake sees the abort', async () => {
    fake.mode = 'endless';
    const controller = new AbortController();
    const aborted = fake.nextAbort.promise;
    const stream = await ai.models.generateContentStream({
      ...base,
      config: { abortSignal: controller.signal },
    });
    let chunks = 0;
    const texts: string[] = [];
    const reading = failure(async () => {
      for await (const chunk of stream) {
        texts.push(chunk.text ?? '');
        if (++chunks === 5) controller.abort();
      }
    });
    await aborted;
    expect((await reading).name).toBe('AbortError');
    expect(texts.slice(0, 2)).toEqual(['first ', 'more ']);
  });

  test('hang never answers; gated answers when the gate opens', async () => {
    fake.mode = 'hang';
    const controller = new AbortController();
    const called = fake.nextCall.promise;
    const aborted = fake.nextAbort.promise;
    const hung = failure(() =>
      ai.models.generateContent({ ...base, config: { abortSignal: controller.signal } }),
    );
    await called;
    controller.abort();
    await aborted;
    expect((await hung).name).toBe('AbortError');
    fake.mode = 'gated';
    const gatedCall = fake.nextCall.promise;
    const gated = ai.models.generateContent(base);
    await gatedCall;
    fake.gate.resolve();
    expect((await gated).text).toBe(ANSWER_TEXT);
  });

  test('requests the real API refuses are refused the same way', async () => {
    const assistant = { model, contents: [{ role: 'assistant', parts: [{ text: 'Hi' }] }] };
    const error = await failure(() => ai.models.generateContent(assistant));
    expect(error.status).toBe(400);
    expect(error.message).toContain('valid role: user, model');
    const keyless = await fetch(`${fake.url}/models/${model}:generateContent`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ contents: [{ role: 'user', parts: [{ text: 'Hi' }] }] }),
    });
    expect(keyless.status).toBe(403);
    expect(await keyless.json()).toMatchObject({ error: { status: 'PERMISSION_DENIED' } });
  });
});
