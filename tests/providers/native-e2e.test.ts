// End to end through the official openai SDK against faithful fake Anthropic and Gemini upstreams:
// text, stream, tools round trip, usage and exact charge, errors, cancel mid-stream (CONTRACT §7).
import { describe, expect, test } from 'bun:test';
import OpenAI, { APIError } from 'openai';
import { countTextTokens } from '../../src/billing/tokens.ts';
import { ANTHROPIC_USAGE, startFakeAnthropic } from '../support/fake-anthropic.ts';
import { GEMINI_THOUGHT_SIGNATURE, GEMINI_USAGE, startFakeGemini } from '../support/fake-gemini.ts';
import {
  ANSWER_TEXT,
  type FakeVendor,
  SECRET_PROMPT,
  TOOL_INPUT,
  type VendorMode,
} from '../support/fake-vendor.ts';
import { bearer, closedAfterEach, type TestServer } from '../support/gateway.ts';

const cleanup = closedAfterEach();

const KEY_ENV = 'TOLLGATE_NATIVE_E2E_UPSTREAM_KEY';
const UPSTREAM_KEY = 'sk-native-e2e-0123456789';
/** model_03's rates in µcr per token (CONTRACT §3: an integer rate R costs R µcr per token). */
const INPUT_RATE = 5;
const OUTPUT_RATE = 14;

interface Vendor {
  type: 'anthropic' | 'gemini';
  start(mode: VendorMode): FakeVendor;
  usage: { prompt: number; completion: number };
  /** The key and version headers the gateway must have sent. */
  expectAuthHeaders(headers: Record<string, string>): void;
}

const VENDORS: Vendor[] = [
  {
    type: 'anthropic',
    start: startFakeAnthropic,
    usage: {
      prompt:
        ANTHROPIC_USAGE.input_tokens +
        ANTHROPIC_USAGE.cache_creation_input_tokens +
        ANTHROPIC_USAGE.cache_read_input_tokens,
      completion: ANTHROPIC_USAGE.output_tokens,
    },
    expectAuthHeaders(headers) {
      expect(headers['x-api-key']).toBe(UPSTREAM_KEY);
      expect(headers['anthropic-version']).toBe('2023-06-01');
    },
  },
  {
    type: 'gemini',
    start: startFakeGemini,
    usage: {
      prompt: GEMINI_USAGE.promptTokenCount,
      completion: GEMINI_USAGE.candidatesTokenCount + GEMINI_USAGE.thoughtsTokenCount,
    },
    expectAuthHeaders(headers) {
      expect(headers['x-goog-api-key']).toBe(UPSTREAM_KEY);
    },
  },
];

const weatherTool = {
  type: 'function' as const,
  function: {
    name: 'get_weather',
    description: 'Current weather for a city',
    parameters: {
      type: 'object',
      properties: {
        location: { type: 'string' },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['location', 'unit'],
    },
  },
};

interface Setup {
  fake: FakeVendor;
  server: TestServer;
  client: OpenAI;
  key: string;
}

async function setup(
  vendor: Vendor,
  mode: VendorMode,
  provider: Record<string, unknown> = {},
): Promise<Setup> {
  process.env[KEY_ENV] = UPSTREAM_KEY;
  const fake = cleanup.track(vendor.start(mode));
  const server = await cleanup.server({
    providers: {
      up: { type: vendor.type, base_url: fake.url, api_key_env: KEY_ENV, ...provider },
    },
    models: { model_03: { provider: 'up', upstream_model: 'vendor-model' } },
  });
  const { key } = await server.createKey({ credits: 1000 });
  const client = new OpenAI({ baseURL: `${server.baseUrl}/api/v1`, apiKey: key, maxRetries: 0 });
  return { fake, server, client, key };
}

async function statusOf(s: Setup, id: string): Promise<any> {
  const response = await s.server.request(`/api/v1/requests/${id}`, { headers: bearer(s.key) });
  expect(response.status).toBe(200);
  return response.json();
}

function expectedChargeMicro(vendor: Vendor): number {
  return vendor.usage.prompt * INPUT_RATE + vendor.usage.completion * OUTPUT_RATE;
}

async function failure(promise: Promise<unknown>): Promise<APIError> {
  const error = await promise.then(
    () => {
      throw new Error('the call succeeded');
    },
    (caught: unknown) => caught,
  );
  expect(error).toBeInstanceOf(APIError);
  return error as APIError;
}

describe.each(VENDORS)('$type through the openai SDK', (vendor) => {
  test('non-stream text: content, usage, exact charge, attempts, upstream headers', async () => {
    const s = await setup(vendor, 'text');
    const completion = await s.client.chat.completions.create({
      model: 'model_03',
      messages: [
        { role: 'system', content: 'You are terse.' },
        { role: 'user', content: 'Say hello.' },
      ],
    });
    expect(completion.model).toBe('model_03');
    expect(completion.choices[0]!.message.content).toBe(ANSWER_TEXT);
    expect(completion.choices[0]!.finish_reason).toBe('stop');
    expect(completion.usage).toMatchObject({
      prompt_tokens: vendor.usage.prompt,
      completion_tokens: vendor.usage.completion,
      total_tokens: vendor.usage.prompt + vendor.usage.completion,
    });
    expect(s.fake.calls).toBe(1);
    vendor.expectAuthHeaders(s.fake.requests[0]!.headers);

    const status = await statusOf(s, completion.id);
    expect(status.request_status).toBe('completed');
    expect(Math.round(status.charged_credits * 1e6)).toBe(expectedChargeMicro(vendor));
    expect(status.usage).toMatchObject({
      prompt_tokens: vendor.usage.prompt,
      completion_tokens: vendor.usage.completion,
    });
    expect(status.attempts).toEqual([
      {
        provider: 'up',
        upstream_model: 'vendor-model',
        outcome: 'ok',
        error_code: null,
        latency_ms: expect.any(Number),
      },
    ]);
  });

  test('stream text: deltas add up to the answer, usage comes last, same charge', async () => {
    const s = await setup(vendor, 'text');
    const stream = await s.client.chat.completions.create({
      model: 'model_03',
      stream: true,
      stream_options: { include_usage: true },
      messages: [{ role: 'user', content: 'Say hello.' }],
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
    const text = chunks.map((chunk) => chunk.choices[0]?.delta?.content ?? '').join('');
    expect(text).toBe(ANSWER_TEXT);
    const finish = chunks.map((chunk) => chunk.choices[0]?.finish_reason).filter(Boolean);
    expect(finish).toEqual(['stop']);
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toMatchObject({
      prompt_tokens: vendor.usage.prompt,
      completion_tokens: vendor.usage.completion,
      total_tokens: vendor.usage.prompt + vendor.usage.completion,
    });
    if (vendor.type === 'gemini') {
      expect(s.fake.requests[0]!.path).toBe(
        '/v1beta/models/vendor-model:streamGenerateContent?alt=sse',
      );
    } else {
      expect(s.fake.requests[0]!.body.stream).toBe(true);
    }
    const status = await statusOf(s, chunks[0]!.id);
    expect(status.request_status).toBe('completed');
    expect(Math.round(status.charged_credits * 1e6)).toBe(expectedChargeMicro(vendor));
  });

  test.each([false, true])(
    'tools round trip (stream %p): tool_calls out, tool result back in the vendor shape',
    async (streamed) => {
      const s = await setup(vendor, 'tools');
      const messages: OpenAI.ChatCompletionMessageParam[] = [
        { role: 'system', content: 'You are a weather bot.' },
        { role: 'user', content: 'Weather in Paris?' },
      ];
      let calls: { id: string; name: string; arguments: string }[];
      let finishReason: string | null | undefined;
      if (streamed) {
        const stream = await s.client.chat.completions.create({
          model: 'model_03',
          stream: true,
          messages,
          tools: [weatherTool],
        });
        const byIndex = new Map<number, { id: string; name: string; arguments: string }>();
        for await (const chunk of stream) {
          const choice = chunk.choices[0];
          if (choice?.finish_reason) finishReason = choice.finish_reason;
          for (const delta of choice?.delta?.tool_calls ?? []) {
            const call = byIndex.get(delta.index) ?? { id: '', name: '', arguments: '' };
            call.id += delta.id ?? '';
            call.name += delta.function?.name ?? '';
            call.arguments += delta.function?.arguments ?? '';
            byIndex.set(delta.index, call);
          }
        }
        calls = [...byIndex.values()];
      } else {
        const completion = await s.client.chat.completions.create({
          model: 'model_03',
          messages,
          tools: [weatherTool],
        });
        finishReason = completion.choices[0]!.finish_reason;
        calls = (completion.choices[0]!.message.tool_calls ?? []).map((call: any) => ({
          id: call.id,
          name: call.function.name,
          arguments: call.function.arguments,
        }));
      }
      expect(finishReason).toBe('tool_calls');
      expect(calls).toHaveLength(1);
      const call = calls[0]!;
      expect(call.name).toBe('get_weather');
      expect(JSON.parse(call.arguments)).toEqual(TOOL_INPUT);
      expect(call.id.length).toBeGreaterThan(0);
      if (vendor.type === 'gemini') expect(call.id).toMatch(/^call_/);

      // The system message went to the vendor's own place, the tool to its declaration form.
      const first = s.fake.requests[0]!.body;
      if (vendor.type === 'anthropic') {
        expect(JSON.stringify(first.system)).toContain('You are a weather bot.');
        expect(first.messages.some((m: any) => m.role === 'system')).toBe(false);
        expect(first.tools[0].name).toBe('get_weather');
      } else {
        expect(JSON.stringify(first.systemInstruction)).toContain('You are a weather bot.');
        expect(first.tools[0].functionDeclarations[0].name).toBe('get_weather');
      }

      s.fake.mode = 'text';
      const followUp = await s.client.chat.completions.create({
        model: 'model_03',
        tools: [weatherTool],
        messages: [
          ...messages,
          {
            role: 'assistant',
            content: null,
            tool_calls: [
              {
                id: call.id,
                type: 'function',
                function: { name: call.name, arguments: call.arguments },
              },
            ],
          },
          { role: 'tool', tool_call_id: call.id, content: '{"temperature":18}' },
        ],
      });
      expect(followUp.choices[0]!.message.content).toBe(ANSWER_TEXT);
      expect(s.fake.calls).toBe(2);
      const second = s.fake.requests[1]!.body;
      if (vendor.type === 'anthropic') {
        const blocks = second.messages.flatMap((m: any) =>
          Array.isArray(m.content) ? m.content.map((b: any) => ({ role: m.role, ...b })) : [],
        );
        const use = blocks.find((b: any) => b.type === 'tool_use');
        const result = blocks.find((b: any) => b.type === 'tool_result');
        expect(use).toMatchObject({
          role: 'assistant',
          id: call.id,
          name: 'get_weather',
          input: TOOL_INPUT,
        });
        expect(result).toMatchObject({ role: 'user', tool_use_id: call.id });
        expect(JSON.stringify(result.content)).toContain('temperature');
      } else {
        const parts = second.contents.flatMap((c: any) =>
          (c.parts ?? []).map((p: any) => ({ role: c.role, ...p })),
        );
        const fnCall = parts.find((p: any) => p.functionCall);
        const fnResponse = parts.find((p: any) => p.functionResponse);
        // The call's thought signature came back with it, carried inside its id.
        expect(call.id).toMatch(/^call_[A-Za-z0-9]{24}__sig_[A-Za-z0-9_-]+$/);
        expect(fnCall).toMatchObject({
          role: 'model',
          functionCall: { name: 'get_weather', args: TOOL_INPUT },
          thoughtSignature: GEMINI_THOUGHT_SIGNATURE,
        });
        expect(fnResponse.role).toBe('user');
        expect(fnResponse.functionResponse.name).toBe('get_weather');
        expect(JSON.stringify(fnResponse.functionResponse.response)).toContain('temperature');
        expect(JSON.stringify(second)).not.toContain(call.id);
      }
    },
  );

  test.each([
    ['error429', 502, 'upstream_error'],
    ['error500', 502, 'upstream_error'],
    ['error529', 502, 'upstream_error'],
    ['garbage', 502, 'upstream_invalid_response'],
  ] as const)('%s → %d %s (non-stream)', async (mode, status, code) => {
    const s = await setup(vendor, mode);
    const error = await failure(
      s.client.chat.completions.create({
        model: 'model_03',
        messages: [{ role: 'user', content: 'hi' }],
      }),
    );
    expect(error.status).toBe(status);
    expect(error.code).toBe(code);
    expect(s.fake.calls).toBeGreaterThanOrEqual(1);
  });

  test.each([
    ['error429', 502, 'upstream_error'],
    ['error500', 502, 'upstream_error'],
    ['error529', 502, 'upstream_error'],
    ['garbage', 502, 'upstream_invalid_response'],
  ] as const)('%s → %d %s (stream, before any byte)', async (mode, status, code) => {
    const s = await setup(vendor, mode);
    const error = await failure(
      (async () => {
        const stream = await s.client.chat.completions.create({
          model: 'model_03',
          stream: true,
          messages: [{ role: 'user', content: 'hi' }],
        });
        for await (const _ of stream);
      })(),
    );
    // Nothing reached the client yet: an HTTP error, not a 200 with an error event.
    expect(error.status).toBe(status);
    expect(error.code).toBe(code);
  });

  test.each([false, true])(
    'a tool without parameters (stream %p): its arguments are "{}", JSON as the SDK parses them',
    async (streamed) => {
      const s = await setup(vendor, 'tools');
      const messages: OpenAI.ChatCompletionMessageParam[] = [
        { role: 'user', content: 'What time is it?' },
      ];
      const timeTool = {
        type: 'function' as const,
        function: { name: 'get_time', description: 'The current time' },
      };
      let args = '';
      if (streamed) {
        const stream = await s.client.chat.completions.create({
          model: 'model_03',
          stream: true,
          messages,
          tools: [timeTool],
        });
        for await (const chunk of stream)
          for (const delta of chunk.choices[0]?.delta?.tool_calls ?? [])
            args += delta.function?.arguments ?? '';
      } else {
        const completion = await s.client.chat.completions.create({
          model: 'model_03',
          messages,
          tools: [timeTool],
        });
        args = (completion.choices[0]!.message.tool_calls![0] as any).function.arguments;
      }
      expect(args).toBe('{}');
    },
  );

  test(
    'a conversation another deployment made: foreign tool call ids, blank and image-only ' +
      'messages are taken (the vendor refuses them as they are: 502, hold kept)',
    async () => {
      const s = await setup(vendor, 'text');
      // Ids as a vLLM server, a client and a Gemini call with its signature write them.
      const ids = ['functions.get_weather:0', 'call abc/1', `call_x__sig_${'A'.repeat(800)}`];
      const messages: OpenAI.ChatCompletionMessageParam[] = [
        { role: 'system', content: '' },
        {
          role: 'user',
          content: [{ type: 'image_url', image_url: { url: 'https://x.invalid/a.png' } }],
        },
        { role: 'user', content: 'Weather in Paris, Rome and Oslo?' },
        {
          role: 'assistant',
          content: '',
          tool_calls: ids.map((id) => ({
            id,
            type: 'function' as const,
            function: { name: 'get_weather', arguments: '{"location":"Paris","unit":"celsius"}' },
          })),
        },
        ...ids.map((id) => ({ role: 'tool' as const, tool_call_id: id, content: '21 C' })),
        { role: 'assistant', content: '' },
        { role: 'user', content: '   ' },
        { role: 'user', content: 'Thanks.' },
      ];
      for (const stream of [false, true]) {
        const response = await s.server.request('/api/v1/chat/completions', {
          method: 'POST',
          headers: bearer(s.key),
          body: JSON.stringify({ model: 'model_03', messages, tools: [weatherTool], stream }),
        });
        expect({ stream, status: response.status }).toEqual({ stream, status: 200 });
        const text = await response.text();
        expect(text).not.toContain('"error"');
        expect(text).toContain(stream ? '[DONE]' : ANSWER_TEXT);
      }
      // Calls and their results still pair up, each id as the vendor takes it.
      const sent = JSON.stringify(s.fake.requests.at(-1)!.body);
      if (vendor.type === 'anthropic') {
        const body = s.fake.requests.at(-1)!.body;
        const uses = body.messages
          .flatMap((m: any) => m.content)
          .filter((b: any) => b.type === 'tool_use');
        const results = body.messages
          .flatMap((m: any) => m.content)
          .filter((b: any) => b.type === 'tool_result');
        expect(uses.map((b: any) => b.id)).toEqual(results.map((b: any) => b.tool_use_id));
        expect(new Set(uses.map((b: any) => b.id)).size).toBe(3);
        expect(uses[0].id).toMatch(/^toolu_[A-Za-z0-9_-]{32}$/);
      }
      expect(sent).not.toContain('functions.get_weather:0');
      // Nothing left to say: the one placeholder turn the APIs take.
      const blank = await s.server.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(s.key),
        body: JSON.stringify({
          model: 'model_03',
          messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }],
        }),
      });
      expect(blank.status).toBe(200);
    },
  );

  test('sampling OpenAI takes is taken: temperature 1.5 with top_p, a blank stop', async () => {
    const s = await setup(vendor, 'text');
    const response = await s.server.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(s.key),
      body: JSON.stringify({
        model: 'model_03',
        messages: [{ role: 'user', content: 'Hi' }],
        temperature: 1.5,
        top_p: 0.9,
        stop: [' ', 'END'],
      }),
    });
    expect(response.status).toBe(200);
    const sent = s.fake.requests.at(-1)!.body;
    // Anthropic's range is 0-1 and newer models refuse both settings: the temperature, clamped.
    if (vendor.type === 'anthropic')
      expect([sent.temperature, sent.top_p, sent.stop_sequences]).toEqual([1, undefined, ['END']]);
  });

  test('a blank last user turn left out does not make the assistant’s turn a prefill', async () => {
    const s = await setup(vendor, 'text');
    // Nor does a system message after the assistant's turn (OpenAI's model answers anew).
    for (const last of [
      { role: 'user', content: '   ' },
      { role: 'system', content: 'Now reply in French.' },
    ]) {
      const messages = [
        { role: 'user', content: 'Hi' },
        { role: 'assistant', content: 'Hello!' },
        last,
      ];
      const response = await s.server.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(s.key),
        body: JSON.stringify({ model: 'model_03', messages }),
      });
      expect(response.status).toBe(200);
      const sent = s.fake.requests.at(-1)!.body;
      const turns = vendor.type === 'anthropic' ? sent.messages : sent.contents;
      expect(turns.map((turn: any) => turn.role)).toEqual(
        vendor.type === 'anthropic' ? ['user', 'assistant', 'user'] : ['user', 'model', 'user'],
      );
    }
  });

  test('hang with a short provider timeout_ms → 504 upstream_timeout', async () => {
    const s = await setup(vendor, 'hang', { timeout_ms: 200 });
    const error = await failure(
      s.client.chat.completions.create({
        model: 'model_03',
        messages: [{ role: 'user', content: 'hi' }],
      }),
    );
    expect(error.status).toBe(504);
    expect(error.code).toBe('upstream_timeout');
  });

  test('stream: hang with a short provider timeout_ms → 504 upstream_timeout', async () => {
    const s = await setup(vendor, 'hang', { timeout_ms: 200 });
    const error = await failure(
      (async () => {
        const stream = await s.client.chat.completions.create({
          model: 'model_03',
          stream: true,
          messages: [{ role: 'user', content: 'hi' }],
        });
        for await (const _ of stream);
      })(),
    );
    expect(error.status).toBe(504);
    expect(error.code).toBe('upstream_timeout');
  });

  test('error400: no failover, and the provider body never reaches the client', async () => {
    const s = await setup(vendor, 'error400');
    const response = await fetch(`${s.server.baseUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: bearer(s.key),
      body: JSON.stringify({
        model: 'model_03',
        messages: [{ role: 'user', content: 'what is the weather' }],
      }),
    });
    const body = await response.text();
    expect(body).not.toContain(SECRET_PROMPT);
    // Anthropic's "prompt is too long" is recognised as the contract's context error; Gemini's
    // fake message is not one the adapter knows, so it is a plain provider error.
    const expected =
      vendor.type === 'anthropic'
        ? { status: 400, code: 'context_length_exceeded' }
        : { status: 502, code: 'upstream_error' };
    expect({ status: response.status, code: JSON.parse(body).error.code }).toEqual(expected);
    expect(s.fake.calls).toBe(1);
    const id = response.headers.get('x-request-id')!;
    const status = await statusOf(s, id);
    expect(status.request_status).toBe('error');
    expect(JSON.stringify(status)).not.toContain(SECRET_PROMPT);
  });

  test('a failure after the first streamed text is an error event, no retry', async () => {
    const s = await setup(vendor, 'midstream_error');
    const stream = await s.client.chat.completions.create({
      model: 'model_03',
      stream: true,
      messages: [{ role: 'user', content: 'hi' }],
    });
    let text = '';
    let id = '';
    const error = await failure(
      (async () => {
        for await (const chunk of stream) {
          id ||= chunk.id;
          text += chunk.choices[0]?.delta?.content ?? '';
        }
      })(),
    );
    expect(text).toBe('Hello');
    // Anthropic sends an `event: error`; Gemini's bare JSON error is no `data:` event, so the
    // gateway sees a stream that ends without a finish reason.
    expect(error.code).toBe(
      vendor.type === 'anthropic' ? 'upstream_error' : 'upstream_invalid_response',
    );
    expect(s.fake.calls).toBe(1);
    const status = await statusOf(s, id);
    expect(status.request_status).toBe('error');
    expect(status.attempts).toHaveLength(1);
  });

  test('cancel mid-stream: the upstream is aborted, the status is cancelled', async () => {
    const s = await setup(vendor, 'endless');
    const stream = await s.client.chat.completions.create({
      model: 'model_03',
      stream: true,
      messages: [{ role: 'user', content: 'Go on forever.' }],
    });
    const iterator = stream[Symbol.asyncIterator]();
    const first = await iterator.next();
    expect(first.done).toBe(false);
    const id = first.value!.id;
    const aborted = s.fake.nextAbort.promise;
    const cancelled = await s.server.request(`/api/v1/requests/${id}/cancel`, {
      method: 'POST',
      headers: bearer(s.key),
    });
    expect(cancelled.status).toBe(202);
    await aborted;
    expect(s.fake.aborts).toBe(1);
    const error = await failure(
      (async () => {
        for (let next = await iterator.next(); !next.done; next = await iterator.next());
      })(),
    );
    expect(error.code).toBe('request_cancelled');
    const status = await statusOf(s, id);
    expect(status.request_status).toBe('cancelled');
    expect(status.charged_credits).toBe(0);
    expect(status.attempts).toEqual([
      expect.objectContaining({ provider: 'up', outcome: 'cancelled' }),
    ]);
  });
});

describe('gemini: an answer without a finished candidate', () => {
  /** A chat call to model_03 on a gemini upstream that answers every call with `answer`. */
  async function chatAgainst(answer: unknown): Promise<Response> {
    const upstream = cleanup.track(Bun.serve({ port: 0, fetch: () => Response.json(answer) }));
    const server = await cleanup.server({
      providers: { up: { type: 'gemini', base_url: `http://127.0.0.1:${upstream.port}/v1beta` } },
      models: { model_03: { provider: 'up', upstream_model: 'vendor-model' } },
    });
    const { key } = await server.createKey({ credits: 1000 });
    return server.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'hi' }] }),
    });
  }

  test.each([
    ['{}', {}],
    ['no candidates', { candidates: [], usageMetadata: { promptTokenCount: 3 } }],
    ['a candidate without a finish reason', { candidates: [{ content: { parts: [] } }] }],
  ])('%s → 502 upstream_invalid_response', async (_, answer) => {
    const response = await chatAgainst(answer);
    expect(response.status).toBe(502);
    expect(((await response.json()) as any).error.code).toBe('upstream_invalid_response');
  });

  test.each([
    ['no candidates', {}],
    ['an empty list of them', { candidates: [] }],
  ])(
    'a blocked prompt (promptFeedback.blockReason), %s: an empty answer',
    async (_, candidates) => {
      const response = await chatAgainst({
        ...candidates,
        promptFeedback: { blockReason: 'SAFETY' },
        usageMetadata: { promptTokenCount: 3 },
      });
      expect(response.status).toBe(200);
      const body = (await response.json()) as any;
      expect(body.choices[0].message.content).toBe('');
    },
  );
});

test('gemini: a seed past int32 is wrapped into one, the same each time', async () => {
  process.env[KEY_ENV] = UPSTREAM_KEY;
  const fake = cleanup.track(startFakeGemini('text'));
  const server = await cleanup.server({
    providers: { up: { type: 'gemini', base_url: fake.url, api_key_env: KEY_ENV } },
    models: { model_03: { provider: 'up', upstream_model: 'vendor-model', seed: true } },
  });
  const { key } = await server.createKey({ credits: 1000 });
  for (const seed of [2 ** 40 + 5, 2 ** 40 + 5, -(2 ** 33) - 7, 12]) {
    const response = await server.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify({
        model: 'model_03',
        seed,
        messages: [{ role: 'user', content: 'hi' }],
      }),
    });
    expect(response.status).toBe(200);
    await response.text();
  }
  expect(fake.requests.map((r) => r.body.generationConfig.seed)).toEqual([5, 5, -7, 12]);
});

test(
  'anthropic: a stream cut after message_delta (no content_block_stop, no message_stop) still ' +
    'gives a tool without input "{}"',
  async () => {
    const event = (type: string, data: object) =>
      `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
    const frames = [
      event('message_start', {
        message: { id: 'msg_1', type: 'message', role: 'assistant', content: [], model: 'm' },
      }),
      event('content_block_start', {
        index: 0,
        content_block: { type: 'tool_use', id: 'toolu_1', name: 'get_time', input: {} },
      }),
      event('message_delta', {
        delta: { stop_reason: 'tool_use', stop_sequence: null },
        usage: { input_tokens: 5, output_tokens: 3 },
      }),
    ].join('');
    const upstream = cleanup.track(
      Bun.serve({
        port: 0,
        fetch: () => new Response(frames, { headers: { 'content-type': 'text/event-stream' } }),
      }),
    );
    const server = await cleanup.server({
      providers: { up: { type: 'anthropic', base_url: `http://127.0.0.1:${upstream.port}/v1` } },
      models: { model_03: { provider: 'up', upstream_model: 'vendor-model' } },
    });
    const { key } = await server.createKey({ credits: 1000 });
    const client = new OpenAI({ baseURL: `${server.baseUrl}/api/v1`, apiKey: key, maxRetries: 0 });
    const stream = await client.chat.completions.create({
      model: 'model_03',
      stream: true,
      messages: [{ role: 'user', content: 'What time is it?' }],
      tools: [{ type: 'function', function: { name: 'get_time' } }],
    });
    let args = '';
    for await (const chunk of stream)
      for (const delta of chunk.choices[0]?.delta?.tool_calls ?? [])
        args += delta.function?.arguments ?? '';
    expect(args).toBe('{}');
  },
);

test(
  'anthropic: tool blocks without input are bounded as tool calls are: 128 answer "{}" each, ' +
    '129 are upstream_invalid_response',
  async () => {
    const event = (type: string, data: object) =>
      `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
    const frames = (count: number) =>
      [
        event('message_start', {
          message: { id: 'msg_1', type: 'message', role: 'assistant', content: [], model: 'm' },
        }),
        ...Array.from({ length: count }, (_, index) =>
          event('content_block_start', {
            index,
            content_block: { type: 'tool_use', id: `toolu_${index}`, name: 'get_time', input: {} },
          }),
        ),
        event('message_delta', {
          delta: { stop_reason: 'tool_use', stop_sequence: null },
          usage: { input_tokens: 5, output_tokens: 3 },
        }),
        event('message_stop', {}),
      ].join('');
    let count = 128;
    const upstream = cleanup.track(
      Bun.serve({
        port: 0,
        fetch: () =>
          new Response(frames(count), { headers: { 'content-type': 'text/event-stream' } }),
      }),
    );
    const server = await cleanup.server({
      providers: { up: { type: 'anthropic', base_url: `http://127.0.0.1:${upstream.port}/v1` } },
      models: { model_03: { provider: 'up', upstream_model: 'vendor-model' } },
    });
    const { key } = await server.createKey({ credits: 1000 });
    const ask = () =>
      server.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify({
          model: 'model_03',
          stream: true,
          messages: [{ role: 'user', content: 'What time is it?' }],
          tools: [{ type: 'function', function: { name: 'get_time' } }],
        }),
      });
    const text = await (await ask()).text();
    const args = new Map<number, string>();
    for (const line of text.split('\n')) {
      if (!line.startsWith('data: {')) continue;
      for (const call of JSON.parse(line.slice(6)).choices[0]?.delta?.tool_calls ?? [])
        args.set(call.index, (args.get(call.index) ?? '') + (call.function?.arguments ?? ''));
    }
    expect(args.size).toBe(128);
    expect([...args.values()].every((value) => value === '{}')).toBe(true);
    count = 129;
    const refused = await ask();
    expect(refused.status).toBe(502);
    expect(((await refused.json()) as any).error.code).toBe('upstream_invalid_response');
  },
);

describe('anthropic: a stop of whitespace, which the API refuses, is cut by the gateway', () => {
  test.each([false, true])(
    'stream %p: the answer ends before it, billed for what was sent',
    async (streamed) => {
      const s = await setup(VENDORS[0]!, 'text');
      // ANSWER_TEXT is "Hello there": the API would have stopped at its space.
      const stop = ['\n', ' ', 'END'];
      let content: string;
      let id: string;
      let usage: OpenAI.CompletionUsage | undefined;
      if (streamed) {
        const stream = await s.client.chat.completions.create({
          model: 'model_03',
          stream: true,
          stop,
          messages: [{ role: 'user', content: 'Say hello.' }],
        });
        const chunks = [];
        for await (const chunk of stream) chunks.push(chunk);
        content = chunks.map((chunk) => chunk.choices[0]?.delta?.content ?? '').join('');
        expect(chunks.map((chunk) => chunk.choices[0]?.finish_reason).filter(Boolean)).toEqual([
          'stop',
        ]);
        id = chunks[0]!.id;
        usage = chunks.at(-1)!.usage ?? undefined;
      } else {
        const completion = await s.client.chat.completions.create({
          model: 'model_03',
          stop,
          messages: [{ role: 'user', content: 'Say hello.' }],
        });
        content = completion.choices[0]!.message.content!;
        expect(completion.choices[0]!.finish_reason).toBe('stop');
        id = completion.id;
        usage = completion.usage;
      }
      expect(content).toBe('Hello');
      expect(s.fake.requests.at(-1)!.body.stop_sequences).toEqual(['END']);
      // Anthropic's output_tokens counts what it generated past the stop: the gateway counts what
      // the client got, and charges that.
      expect(usage!.completion_tokens).toBe(countTextTokens('Hello'));
      expect(usage!.completion_tokens).not.toBe(ANTHROPIC_USAGE.output_tokens);
      // Its input count stands: the gateway's own estimate is not what Anthropic read.
      expect(usage!.prompt_tokens).toBe(VENDORS[0]!.usage.prompt);
      const status = await statusOf(s, id);
      expect(status.request_status).toBe('completed');
      expect(status.usage).toMatchObject({ completion_tokens: countTextTokens('Hello') });
      expect(Math.round(status.charged_credits * 1e6)).toBe(
        usage!.prompt_tokens * INPUT_RATE + usage!.completion_tokens * OUTPUT_RATE,
      );
    },
  );

  test('a whole answer is cut in block order: a tool call before the stop is kept', async () => {
    const upstream = cleanup.track(
      Bun.serve({
        port: 0,
        fetch: () =>
          Response.json({
            id: 'msg_1',
            type: 'message',
            role: 'assistant',
            model: 'vendor-model',
            content: [
              { type: 'text', text: 'Checking.' },
              { type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { location: 'Oslo' } },
              { type: 'text', text: 'Done\nmore' },
            ],
            stop_reason: 'tool_use',
            stop_sequence: null,
            usage: { input_tokens: 5, output_tokens: 30 },
          }),
      }),
    );
    const server = await cleanup.server({
      providers: { up: { type: 'anthropic', base_url: `http://127.0.0.1:${upstream.port}/v1` } },
      models: { model_03: { provider: 'up', upstream_model: 'vendor-model' } },
    });
    const { key } = await server.createKey({ credits: 1000 });
    const client = new OpenAI({ baseURL: `${server.baseUrl}/api/v1`, apiKey: key, maxRetries: 0 });
    const completion = await client.chat.completions.create({
      model: 'model_03',
      stop: '\n',
      tools: [weatherTool],
      messages: [{ role: 'user', content: 'Weather in Oslo?' }],
    });
    const choice = completion.choices[0]!;
    expect(choice.message.content).toBe('Checking.Done');
    expect(choice.message.tool_calls?.map((call: any) => call.function)).toEqual([
      { name: 'get_weather', arguments: '{"location":"Oslo"}' },
    ]);
    expect(choice.finish_reason).toBe('tool_calls');
    expect(completion.usage?.prompt_tokens).toBe(5);
    expect(completion.usage?.completion_tokens).not.toBe(30);
  });

  test('the provider, still generating past the stop, is hung up on at once', async () => {
    // An answer that never ends: "Hi there", then pings for as long as anyone reads them.
    let pingsAfterText = 0;
    const hungUp = Promise.withResolvers<number>();
    const encoder = new TextEncoder();
    const event = (type: string, data: object) =>
      encoder.encode(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
    const upstream = cleanup.track(
      Bun.serve({
        port: 0,
        fetch(request) {
          request.signal.addEventListener('abort', () => hungUp.resolve(pingsAfterText));
          const opening = [
            event('message_start', {
              message: {
                id: 'msg_1',
                type: 'message',
                role: 'assistant',
                model: 'vendor-model',
                content: [],
                stop_reason: null,
                usage: { input_tokens: 5, output_tokens: 1 },
              },
            }),
            event('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
            event('content_block_delta', {
              index: 0,
              delta: { type: 'text_delta', text: 'Hi there' },
            }),
          ];
          const ping = event('ping', { padding: 'x'.repeat(1024) });
          return new Response(
            new ReadableStream({
              pull(controller) {
                const next = opening.shift();
                if (next !== undefined) controller.enqueue(next);
                else {
                  pingsAfterText++;
                  controller.enqueue(ping);
                }
              },
            }),
            { headers: { 'content-type': 'text/event-stream' } },
          );
        },
      }),
    );
    const server = await cleanup.server({
      providers: { up: { type: 'anthropic', base_url: `http://127.0.0.1:${upstream.port}/v1` } },
      models: { model_03: { provider: 'up', upstream_model: 'vendor-model' } },
    });
    const { key } = await server.createKey({ credits: 1000 });
    const response = await server.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify({
        model: 'model_03',
        stream: true,
        stop: [' '],
        messages: [{ role: 'user', content: 'hi' }],
      }),
    });
    const body = await response.text();
    expect(body).toContain('"content":"Hi"');
    expect(body).toEndWith('data: [DONE]\n\n');
    // What fills the sockets' buffers is sent before the hang-up reaches it (~4,000 pings, 4 MB);
    // drained for the rest of the answer instead, the connection read about a second of pings
    // (~490,000 here) before it was dropped.
    expect(await hungUp.promise).toBeLessThan(50_000);
  });
});
