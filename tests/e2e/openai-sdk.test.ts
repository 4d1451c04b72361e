// End to end with the official openai SDK, unmodified: only base URL, key and model change.
import { afterAll, beforeAll, describe, expect, test } from 'bun:test';
import Ajv2020 from 'ajv/dist/2020';
import addFormats from 'ajv-formats';
import OpenAI, { APIError } from 'openai';
import { startTestServer, type TestServer } from '../support/gateway.ts';

let t: TestServer;
let client: OpenAI;

beforeAll(async () => {
  t = await startTestServer();
  const { key } = await t.createKey({ credits: 1000 });
  client = new OpenAI({ baseURL: `${t.baseUrl}/api/v1`, apiKey: key, maxRetries: 0 });
});

afterAll(() => t.close());

const weatherTool = {
  type: 'function' as const,
  function: {
    name: 'get_weather',
    description: 'Current weather for a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string' },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};

describe('openai SDK', () => {
  test('non-stream completion', async () => {
    const completion = await client.chat.completions.create({
      model: 'model_03',
      messages: [
        { role: 'system', content: 'You are terse.' },
        { role: 'user', content: 'Say hello.' },
      ],
    });
    expect(completion.id).toMatch(/^chatcmpl-/);
    expect(completion.object).toBe('chat.completion');
    expect(completion.model).toBe('model_03');
    expect(completion.choices).toHaveLength(1);
    expect(completion.choices[0]!.message.role).toBe('assistant');
    expect(completion.choices[0]!.message.content!.length).toBeGreaterThan(0);
    expect(completion.choices[0]!.finish_reason).toBe('stop');
    const usage = completion.usage!;
    expect(usage.total_tokens).toBe(usage.prompt_tokens + usage.completion_tokens);
    expect(usage.completion_tokens).toBeGreaterThan(0);
    expect((usage as any).cost).toBeUndefined();
    expect(usage.prompt_tokens_details).toBeUndefined();
    expect(completion.system_fingerprint).toBeUndefined();
    expect(completion.service_tier).toBeUndefined();
  });

  test('the X-Request-ID header is the completion id', async () => {
    const { data, response } = await client.chat.completions
      .create({ model: 'model_03', messages: [{ role: 'user', content: 'hi' }] })
      .withResponse();
    expect(response.headers.get('x-request-id')).toBe(data.id);
  });

  test('stream: chunks, role first, usage last, then the end', async () => {
    const stream = await client.chat.completions.create({
      model: 'model_03',
      stream: true,
      messages: [{ role: 'user', content: 'Tell me something.' }],
    });
    const chunks = [];
    for await (const chunk of stream) chunks.push(chunk);
    expect(chunks.length).toBeGreaterThan(3);
    const ids = new Set(chunks.map((chunk) => chunk.id));
    expect(ids.size).toBe(1);
    expect([...ids][0]).toMatch(/^chatcmpl-/);
    for (const chunk of chunks) {
      expect(chunk.object).toBe('chat.completion.chunk');
      expect(chunk.model).toBe('model_03');
    }
    expect(chunks[0]!.choices[0]!.delta.role).toBe('assistant');
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage!.total_tokens).toBe(
      last.usage!.prompt_tokens + last.usage!.completion_tokens,
    );
    const text = chunks.map((chunk) => chunk.choices[0]?.delta?.content ?? '').join('');
    expect(text.length).toBeGreaterThan(0);
    const finish = chunks.map((chunk) => chunk.choices[0]?.finish_reason).filter(Boolean);
    expect(finish).toEqual(['stop']);
  });

  test('the stream equals the non-stream answer for the same request and seed', async () => {
    const request = {
      model: 'model_03',
      seed: 42,
      messages: [{ role: 'user' as const, content: 'Same answer twice?' }],
    };
    const whole = await client.chat.completions.create(request);
    const stream = await client.chat.completions.create({ ...request, stream: true });
    let text = '';
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    expect(text).toBe(whole.choices[0]!.message.content!);
  });

  test(
    'tools: a required tool call with ' + 'schema-valid arguments, then the tool result',
    async () => {
      const first = await client.chat.completions.create({
        model: 'model_03',
        messages: [{ role: 'user', content: 'Weather in Paris?' }],
        tools: [weatherTool],
        tool_choice: 'required',
      });
      const message = first.choices[0]!.message;
      expect(first.choices[0]!.finish_reason).toBe('tool_calls');
      expect(message.content).toBeNull();
      expect(message.tool_calls).toHaveLength(1);
      const call = message.tool_calls![0]! as {
        id: string;
        type: 'function';
        function: { name: string; arguments: string };
      };
      expect(call.type).toBe('function');
      expect(call.function.name).toBe('get_weather');
      const args = JSON.parse(call.function.arguments);
      expect(typeof args.city).toBe('string');
      expect(['celsius', 'fahrenheit']).toContain(args.unit);

      const second = await client.chat.completions.create({
        model: 'model_03',
        messages: [
          { role: 'user', content: 'Weather in Paris?' },
          message,
          { role: 'tool', tool_call_id: call.id, content: '18 degrees' },
        ],
        tools: [weatherTool],
      });
      expect(second.choices[0]!.finish_reason).toBe('stop');
      expect(second.choices[0]!.message.content!.length).toBeGreaterThan(0);
    },
  );

  test(
    'a required tool whose schema has patterns, formats, allOf bounds and maxProperties: ' +
      'its arguments validate (CONTRACT §7), streamed or not',
    async () => {
      const parameters = {
        type: 'object',
        properties: {
          currency: { type: 'string', pattern: '^[A-Z]{3}$' },
          zip: { type: 'string', pattern: '^\\d{5}(-\\d{4})?$' },
          check_in: { type: 'string', format: 'date' },
          contact: { type: 'string', format: 'email' },
          booking_id: { type: 'string', format: 'uuid' },
          nights: { type: 'integer', minimum: 1 },
          extras: {
            type: 'object',
            maxProperties: 1,
            properties: { breakfast: { type: 'boolean' }, parking: { type: 'boolean' } },
          },
        },
        allOf: [{ properties: { nights: { maximum: 14 } } }],
        required: ['currency', 'zip', 'check_in', 'contact', 'booking_id', 'nights', 'extras'],
        additionalProperties: false,
      };
      const ajv = new Ajv2020({ strict: false, logger: false });
      addFormats(ajv);
      const validate = ajv.compile(parameters);
      const tools = [{ type: 'function' as const, function: { name: 'book_room', parameters } }];
      for (let i = 0; i < 5; i++) {
        const content = `Book room ${i}`;
        const plain = await client.chat.completions.create({
          model: 'model_03',
          messages: [{ role: 'user', content }],
          tools,
          tool_choice: 'required',
        });
        const streamed = await client.chat.completions
          .stream({
            model: 'model_03',
            messages: [{ role: 'user', content: `${content}, streamed` }],
            tools,
            tool_choice: { type: 'function', function: { name: 'book_room' } },
          })
          .finalChatCompletion();
        for (const completion of [plain, streamed]) {
          const call = completion.choices[0]!.message.tool_calls![0]! as {
            function: { arguments: string };
          };
          const args = JSON.parse(call.function.arguments);
          if (!validate(args))
            throw new Error(`${call.function.arguments}: ${ajv.errorsText(validate.errors)}`);
        }
      }
    },
  );

  test('tools streamed: the SDK reassembles tool_calls deltas', async () => {
    const stream = client.chat.completions.stream({
      model: 'model_03',
      messages: [{ role: 'user', content: 'Weather in Oslo?' }],
      tools: [weatherTool],
      tool_choice: { type: 'function', function: { name: 'get_weather' } },
    });
    const final = await stream.finalChatCompletion();
    const call = final.choices[0]!.message.tool_calls![0]! as {
      function: { name: string; arguments: string };
    };
    expect(call.function.name).toBe('get_weather');
    expect(Object.keys(JSON.parse(call.function.arguments)).sort()).toEqual(['city', 'unit']);
    expect(final.choices[0]!.finish_reason).toBe('tool_calls');
  });

  test('models list', async () => {
    const models = [];
    for await (const model of client.models.list()) models.push(model);
    expect(models.map((model) => model.id).sort()).toEqual([
      'model_01',
      'model_02',
      'model_03',
      'model_04',
      'model_05',
      'model_06',
      'model_07',
      'model_08',
      'model_09',
      'model_10',
      'model_11',
    ]);
    for (const model of models) {
      expect(model).toEqual({
        id: model.id,
        object: 'model',
        created: expect.any(Number),
        owned_by: 'simulator',
      });
    }
  });

  test(
    'models retrieve: a catalogue model as the list shows it; an unknown one or an alias is 404 ' +
      'model_not_found',
    async () => {
      expect(await client.models.retrieve('model_03')).toEqual({
        id: 'model_03',
        object: 'model',
        created: expect.any(Number),
        owned_by: 'simulator',
      });
      for (const id of ['model_99', 'legacy_fast_1', '__proto__']) {
        const error = await client.models.retrieve(id).catch((thrown: unknown) => thrown);
        expect(error).toBeInstanceOf(OpenAI.NotFoundError);
        expect((error as APIError).code).toBe('model_not_found');
        expect((error as APIError).type).toBe('invalid_request_error');
      }
    },
  );

  test(
    'the README way to an Idempotency-Key: a per-request header; the repeat is a 409 naming ' +
      'the original',
    async () => {
      const body = {
        model: 'model_03',
        messages: [{ role: 'user' as const, content: 'Summarise order 4711' }],
      };
      const options = { headers: { 'Idempotency-Key': 'order-4711-summary' } };
      const first = await client.chat.completions.create(body, options);
      const repeat = await client.chat.completions
        .create(body, options)
        .catch((error: unknown) => error);
      expect(repeat).toBeInstanceOf(APIError);
      expect((repeat as APIError).status).toBe(409);
      expect((repeat as APIError).code).toBe('request_already_completed');
      expect((repeat as APIError).headers?.get('x-request-id')).toBe(first.id);
      // The SDK's own idempotencyKey option sends no header on chat calls: both of these run and
      // are charged.
      const a = await client.chat.completions.create(body, { idempotencyKey: 'sdk-option-0001' });
      const b = await client.chat.completions.create(body, { idempotencyKey: 'sdk-option-0001' });
      expect(a.id).not.toBe(b.id);
    },
  );
});

describe('errors surface as APIError with the contract status and code', () => {
  async function apiError(promise: Promise<unknown>): Promise<APIError> {
    try {
      await promise;
    } catch (error) {
      if (error instanceof APIError) return error;
      throw error;
    }
    throw new Error('expected an APIError');
  }

  test('404 model_not_found', async () => {
    const error = await apiError(
      client.chat.completions.create({
        model: 'model_99',
        messages: [{ role: 'user', content: 'x' }],
      }),
    );
    expect(error.status).toBe(404);
    expect(error.code).toBe('model_not_found');
    expect(error.type).toBe('invalid_request_error');
    expect(error.param).toBeNull();
  });

  test('400 unsupported_parameter for tools on model_09', async () => {
    const error = await apiError(
      client.chat.completions.create({
        model: 'model_09',
        messages: [{ role: 'user', content: 'x' }],
        tools: [weatherTool],
      }),
    );
    expect(error.status).toBe(400);
    expect(error.code).toBe('unsupported_parameter');
    expect(error.param).toBe('tools');
  });

  test('401 invalid_api_key', async () => {
    const stranger = new OpenAI({
      baseURL: `${t.baseUrl}/api/v1`,
      apiKey: 'tg-nobodynobodynobodynobodynobodynobodynobody',
      maxRetries: 0,
    });
    const error = await apiError(
      stranger.chat.completions.create({
        model: 'model_03',
        messages: [{ role: 'user', content: 'x' }],
      }),
    );
    expect(error.status).toBe(401);
    expect(error.code).toBe('invalid_api_key');
    expect((error.error as any).reason).toBe('unknown');
  });

  test('402 insufficient_quota, stream or not', async () => {
    const { key } = await t.createKey({ credits: 0 });
    const broke = new OpenAI({ baseURL: `${t.baseUrl}/api/v1`, apiKey: key, maxRetries: 0 });
    const error = await apiError(
      broke.chat.completions.create({
        model: 'model_03',
        messages: [{ role: 'user', content: 'x' }],
      }),
    );
    expect(error.status).toBe(402);
    expect(error.code).toBe('insufficient_quota');
    const streamError = await apiError(
      broke.chat.completions.create({
        model: 'model_03',
        stream: true,
        messages: [{ role: 'user', content: 'x' }],
      }),
    );
    expect(streamError.status).toBe(402);
  });

  test('400 invalid_request_error for a tool message without its tool call', async () => {
    const error = await apiError(
      client.chat.completions.create({
        model: 'model_03',
        messages: [
          { role: 'user', content: 'x' },
          { role: 'tool', tool_call_id: 'call_missing', content: 'r' },
        ],
      }),
    );
    expect(error.status).toBe(400);
    expect(error.code).toBe('invalid_request_error');
    expect(error.param).toBe('messages[1].tool_call_id');
  });
});
