// Simulator specifics beyond the shared contract: its vocabulary, pacing, limits and schema values.
import { describe, expect, test } from 'bun:test';
import { Type, type TSchema } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { countTextTokens } from '../../src/billing/tokens.ts';
import type { SimulatorProviderConfig } from '../../src/config/model.ts';
import type { Delta, ProviderRequest, ToolDefinition } from '../../src/providers/provider.ts';
import { SIMULATOR_WORDS, SimulatorProvider } from '../../src/providers/simulator/index.ts';
import { SeededRandom } from '../../src/providers/simulator/random.ts';
import { valueForSchema } from '../../src/providers/simulator/schema-value.ts';

const FAST: SimulatorProviderConfig = { type: 'simulator', ttft_ms: 0, tokens_per_second: 100_000, completion_tokens: 24 };

function makeRequest(overrides: Partial<ProviderRequest> = {}): ProviderRequest {
  return {
    model: 'sim',
    messages: [{ role: 'user', content: 'Hello there.' }],
    maxOutputTokens: null,
    temperature: null,
    topP: null,
    topK: null,
    seed: 1,
    stop: null,
    tools: null,
    toolChoice: null,
    promptTokens: 12,
    stream: true,
    ...overrides,
  };
}

async function collect(config: SimulatorProviderConfig, request: ProviderRequest): Promise<Delta[]> {
  const deltas: Delta[] = [];
  for await (const delta of new SimulatorProvider('sim', config).stream(request, new AbortController().signal)) deltas.push(delta);
  return deltas;
}

function textOf(deltas: Delta[]): string {
  return deltas.map((delta) => (delta.type === 'text' ? delta.text : '')).join('');
}

describe('simulator text', () => {
  test('every vocabulary word is exactly one o200k token, alone and after a space', () => {
    expect(new Set(SIMULATOR_WORDS).size).toBe(SIMULATOR_WORDS.length);
    const wrong = SIMULATOR_WORDS.filter((word) => countTextTokens(word) !== 1 || countTextTokens(' ' + word) !== 1);
    expect(wrong).toEqual([]);
  });

  test('a long answer is exactly completion_tokens tokens, and its usage says so', async () => {
    const deltas = await collect({ ...FAST, completion_tokens: 600 }, makeRequest());
    expect(countTextTokens(textOf(deltas))).toBe(600);
    expect(deltas.at(-1)).toEqual({ type: 'finish', reason: 'stop', usage: { promptTokens: 12, completionTokens: 600 } });
  });

  test('a high rate batches many tokens per delta instead of one timer per token', async () => {
    const deltas = await collect({ ...FAST, completion_tokens: 2_000 }, makeRequest());
    expect(countTextTokens(textOf(deltas))).toBe(2_000);
    // 2000 tokens at 100k/s is 20 ms of output; at one tick per 4 ms that is a handful of deltas.
    expect(deltas.length).toBeLessThan(20);
  });

  test('ttft_ms delays the first delta and the rate spaces the rest', async () => {
    const startedMs = performance.now();
    const arrivalsMs: number[] = [];
    for await (const delta of new SimulatorProvider('sim', { type: 'simulator', ttft_ms: 30, tokens_per_second: 1_000, completion_tokens: 40 }).stream(
      makeRequest(),
      new AbortController().signal,
    )) {
      if (delta.type === 'text') arrivalsMs.push(performance.now() - startedMs);
    }
    // Lower bounds only: timers never fire early by more than a millisecond, but they may fire late.
    // Token k is due at ttft + k ms after the start (not after the first arrival, which may be late and
    // then carry the tokens due by then), so the 40th is due at 30 + 39 ms.
    expect(arrivalsMs[0]!).toBeGreaterThanOrEqual(29);
    expect(arrivalsMs.at(-1)!).toBeGreaterThanOrEqual(68);
  });

  test('an output limit at or above completion_tokens finishes with stop', async () => {
    const deltas = await collect(FAST, makeRequest({ maxOutputTokens: 24 }));
    expect(deltas.at(-1)).toEqual({ type: 'finish', reason: 'stop', usage: { promptTokens: 12, completionTokens: 24 } });
  });

  test('a stop sequence at the very start gives an empty answer', async () => {
    const full = textOf(await collect(FAST, makeRequest()));
    const deltas = await collect(FAST, makeRequest({ stop: [full.slice(0, 3)] }));
    expect(deltas).toEqual([{ type: 'finish', reason: 'stop', usage: { promptTokens: 12, completionTokens: 0 } }]);
  });

  test('a stop sequence inside a word cuts that word and counts it as generated', async () => {
    const full = textOf(await collect(FAST, makeRequest()));
    const words = full.split(' ');
    const stop = words[3]!.slice(1) + ' ' + words[4];
    const cut = full.indexOf(stop);
    const deltas = await collect(FAST, makeRequest({ stop: [stop] }));
    expect(textOf(deltas)).toBe(full.slice(0, cut));
    const wholeWords = full.slice(0, cut).split(' ').length - 1;
    expect(deltas.at(-1)).toEqual({ type: 'finish', reason: 'stop', usage: { promptTokens: 12, completionTokens: wholeWords + 1 } });
  });

  test('the stop sequence found earliest wins', async () => {
    const full = textOf(await collect(FAST, makeRequest()));
    const words = full.split(' ');
    const deltas = await collect(FAST, makeRequest({ stop: [' ' + words[8], ' ' + words[2]] }));
    expect(textOf(deltas)).toBe(full.slice(0, Math.min(full.indexOf(' ' + words[8]), full.indexOf(' ' + words[2]))));
  });
});

describe('simulator tool calls', () => {
  const tool: ToolDefinition = {
    type: 'function',
    function: {
      name: 'search',
      parameters: { type: 'object', properties: { query: { type: 'string', minLength: 40 } }, required: ['query'] },
    },
  };

  test('a tool without parameters gets {}', async () => {
    const deltas = await collect(FAST, makeRequest({ tools: [{ type: 'function', function: { name: 'ping' } }], toolChoice: 'required' }));
    expect(deltas[0]).toMatchObject({ type: 'tool_call', index: 0, name: 'ping', arguments: '' });
    expect(deltas.slice(1)).toEqual([
      { type: 'tool_call', index: 0, id: null, name: null, arguments: '{}' },
      { type: 'finish', reason: 'tool_calls', usage: { promptTokens: 12, completionTokens: countTextTokens('ping{}') } },
    ]);
  });

  test('arguments stream as fragments after a first delta with id and name', async () => {
    const deltas = await collect({ ...FAST, tokens_per_second: 1_000 }, makeRequest({ tools: [tool], toolChoice: 'required' }));
    const calls = deltas.filter((delta) => delta.type === 'tool_call');
    expect(calls[0]).toEqual({ type: 'tool_call', index: 0, id: expect.stringMatching(/^call_[A-Za-z0-9]{24}$/), name: 'search', arguments: '' });
    expect(calls.length).toBeGreaterThan(2);
    const args = JSON.parse(calls.map((delta) => delta.arguments).join('')) as { query: string };
    expect(args.query.length).toBeGreaterThanOrEqual(40);
  });

  test('an output limit below the call cuts the arguments and finishes with length', async () => {
    const deltas = await collect(FAST, makeRequest({ tools: [tool], toolChoice: 'required', maxOutputTokens: 4 }));
    const finish = deltas.at(-1);
    expect(finish).toMatchObject({ type: 'finish', reason: 'length' });
    const args = deltas.map((delta) => (delta.type === 'tool_call' ? delta.arguments : '')).join('');
    expect(countTextTokens('search' + args)).toBeLessThanOrEqual(4);
    expect(finish!.type === 'finish' && finish!.usage!.completionTokens).toBeLessThanOrEqual(4);
  });

  test('a named tool that is not in tools falls back to text', async () => {
    const deltas = await collect(FAST, makeRequest({ tools: [tool], toolChoice: { type: 'function', function: { name: 'missing' } } }));
    expect(countTextTokens(textOf(deltas))).toBe(24);
  });
});

describe('schema values', () => {
  const SEEDS = 300;

  const checked: { name: string; schema: TSchema }[] = [
    {
      name: 'nested objects, arrays and bounds',
      schema: Type.Object(
        {
          id: Type.Integer({ minimum: 10, maximum: 12 }),
          ratio: Type.Number({ exclusiveMinimum: 0, exclusiveMaximum: 1 }),
          even: Type.Integer({ minimum: -5, maximum: -3, multipleOf: 2 }),
          name: Type.String({ minLength: 5, maxLength: 6 }),
          short: Type.String({ maxLength: 2 }),
          flag: Type.Boolean(),
          nothing: Type.Null(),
          tags: Type.Array(Type.String({ minLength: 1 }), { minItems: 2, maxItems: 3 }),
          items: Type.Array(Type.Object({ sku: Type.String(), qty: Type.Integer({ minimum: 1 }) }, { additionalProperties: false }), {
            minItems: 1,
          }),
          pair: Type.Tuple([Type.String(), Type.Integer()]),
          choice: Type.Union([Type.Literal('red'), Type.Literal('green')]),
          maybe: Type.Optional(Type.Union([Type.String(), Type.Null()])),
          unique: Type.Array(Type.Union([Type.Literal(1), Type.Literal(2), Type.Literal(3)]), { uniqueItems: true, maxItems: 3 }),
        },
        { additionalProperties: false },
      ),
    },
    { name: 'a number with only a maximum', schema: Type.Object({ n: Type.Number({ maximum: -1000 }) }) },
    { name: 'a literal', schema: Type.Literal('fixed') },
  ];

  for (const { name, schema } of checked) {
    test(`${name}: valid for ${SEEDS} seeds`, () => {
      // The JSON round trip drops TypeBox's symbols: the generator sees what a client would send.
      const plain = JSON.parse(JSON.stringify(schema)) as unknown;
      for (let seed = 0; seed < SEEDS; seed++) {
        const value = valueForSchema(plain, new SeededRandom(seed));
        if (!Value.Check(schema, value)) throw new Error(`seed ${seed}: ${JSON.stringify(value)} does not match ${name}`);
      }
    });
  }

  test('keywords TypeBox cannot check: enum, const, type lists, anyOf, $ref, allOf', () => {
    const schema = {
      type: 'object',
      $defs: { level: { type: 'string', enum: ['low', 'high'] } },
      properties: {
        level: { $ref: '#/$defs/level' },
        plain: { enum: [1, 'two', null] },
        fixed: { const: { a: [1] } },
        nullableText: { type: ['string', 'null'], minLength: 2 },
        onlyNull: { type: ['null'] },
        first: { oneOf: [{ type: 'integer', minimum: 5, maximum: 5 }, { type: 'string' }] },
        merged: { allOf: [{ type: 'object', properties: { a: { type: 'boolean' } }, required: ['a'] }, { properties: { b: { const: 2 } } }] },
        anything: {},
      },
      required: ['level', 'extraRequired'],
      additionalProperties: { type: 'integer', minimum: 100, maximum: 100 },
    };
    for (let seed = 0; seed < SEEDS; seed++) {
      const value = valueForSchema(schema, new SeededRandom(seed)) as Record<string, unknown>;
      expect(['low', 'high']).toContain(value.level as string);
      expect([1, 'two', null]).toContain(value.plain as never);
      expect(value.fixed).toEqual({ a: [1] });
      expect(typeof value.nullableText === 'string' && value.nullableText.length >= 2).toBe(true);
      expect(value.onlyNull).toBeNull();
      expect(value.first).toBe(5);
      expect(value.merged).toEqual({ a: expect.any(Boolean), b: 2 });
      expect(typeof value.anything).toBe('string');
      expect(value.extraRequired).toBe(100);
    }
  });

  test('the same seed gives the same value', () => {
    const schema = { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'array', items: { type: 'string' } } } };
    expect(valueForSchema(schema, new SeededRandom(42))).toEqual(valueForSchema(schema, new SeededRandom(42)));
  });

  test('a recursive $ref ends', () => {
    const schema = {
      $defs: { node: { type: 'object', properties: { child: { $ref: '#/$defs/node' } }, required: ['child'] } },
      $ref: '#/$defs/node',
    };
    expect(JSON.stringify(valueForSchema(schema, new SeededRandom(1)))).toContain('"child":null');
  });
});
