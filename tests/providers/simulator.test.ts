// Simulator specifics beyond the shared contract: its vocabulary, pacing, limits and schema values.
import { describe, expect, test } from 'bun:test';
import { type TSchema, Type } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import Ajv2020 from 'ajv/dist/2020';
import addFormats from 'ajv-formats';
import { countTextTokens, countTextTokensYielding } from '../../src/billing/tokens.ts';
import type { SimulatorProviderConfig } from '../../src/config/model.ts';
import type { Delta, ProviderRequest, ToolDefinition } from '../../src/providers/provider.ts';
import { SIMULATOR_WORDS, SimulatorProvider } from '../../src/providers/simulator/index.ts';
import { SeededRandom } from '../../src/providers/simulator/random.ts';
import {
  SearchBudget,
  smallestInstance,
  valueForSchema,
} from '../../src/providers/simulator/schema-value.ts';
import { stringForPattern } from '../../src/providers/simulator/string-value.ts';

function stringFor(pattern: string): string | symbol | null {
  const anyLength = Number.POSITIVE_INFINITY;
  return stringForPattern({}, pattern, new SeededRandom(1), 0, anyLength, 1024, 10_000, () => {});
}

/** limits.simulator_tool_arguments_bytes by default. */
const ARGUMENTS_BYTES_MAX = 64 * 1024;
const FAST: SimulatorProviderConfig = {
  type: 'simulator',
  ttft_ms: 0,
  tokens_per_second: 100_000,
  completion_tokens: 24,
};

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

async function collect(
  config: SimulatorProviderConfig,
  request: ProviderRequest,
): Promise<Delta[]> {
  const deltas: Delta[] = [];
  for await (const delta of new SimulatorProvider('sim', config, countTextTokensYielding).stream(
    request,
    new AbortController().signal,
  ))
    deltas.push(delta);
  return deltas;
}

function textOf(deltas: Delta[]): string {
  return deltas.map((delta) => (delta.type === 'text' ? delta.text : '')).join('');
}

describe('simulator text', () => {
  test('every vocabulary word is exactly one o200k token, alone and after a space', () => {
    expect(new Set(SIMULATOR_WORDS).size).toBe(SIMULATOR_WORDS.length);
    const wrong = SIMULATOR_WORDS.filter(
      (word) => countTextTokens(word) !== 1 || countTextTokens(` ${word}`) !== 1,
    );
    expect(wrong).toEqual([]);
  });

  test('a long answer is exactly completion_tokens tokens, and its usage says so', async () => {
    const deltas = await collect({ ...FAST, completion_tokens: 600 }, makeRequest());
    expect(countTextTokens(textOf(deltas))).toBe(600);
    expect(deltas.at(-1)).toEqual({
      type: 'finish',
      reason: 'stop',
      usage: { promptTokens: 12, completionTokens: 600 },
    });
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
    for await (const delta of new SimulatorProvider(
      'sim',
      {
        type: 'simulator',
        ttft_ms: 30,
        tokens_per_second: 1_000,
        completion_tokens: 40,
      },
      countTextTokensYielding,
    ).stream(makeRequest(), new AbortController().signal)) {
      if (delta.type === 'text') arrivalsMs.push(performance.now() - startedMs);
    }
    // Lower bounds only: timers never fire early by more than a millisecond, but they may fire
    // late. Token k is due at ttft + k ms after the start (not after the first arrival, which may
    // be late and then carry the tokens due by then), so the 40th is due at 30 + 39 ms.
    expect(arrivalsMs[0]!).toBeGreaterThanOrEqual(29);
    expect(arrivalsMs.at(-1)!).toBeGreaterThanOrEqual(68);
  });

  test('an output limit at or above completion_tokens finishes with stop', async () => {
    const deltas = await collect(FAST, makeRequest({ maxOutputTokens: 24 }));
    expect(deltas.at(-1)).toEqual({
      type: 'finish',
      reason: 'stop',
      usage: { promptTokens: 12, completionTokens: 24 },
    });
  });

  test('a stop sequence at the very start gives an empty answer', async () => {
    const full = textOf(await collect(FAST, makeRequest()));
    const deltas = await collect(FAST, makeRequest({ stop: [full.slice(0, 3)] }));
    expect(deltas).toEqual([
      { type: 'finish', reason: 'stop', usage: { promptTokens: 12, completionTokens: 0 } },
    ]);
  });

  test('a stop sequence inside a word cuts that word and counts it as generated', async () => {
    const full = textOf(await collect(FAST, makeRequest()));
    const words = full.split(' ');
    const stop = `${words[3]!.slice(1)} ${words[4]}`;
    const cut = full.indexOf(stop);
    const deltas = await collect(FAST, makeRequest({ stop: [stop] }));
    expect(textOf(deltas)).toBe(full.slice(0, cut));
    const wholeWords = full.slice(0, cut).split(' ').length - 1;
    expect(deltas.at(-1)).toEqual({
      type: 'finish',
      reason: 'stop',
      usage: { promptTokens: 12, completionTokens: wholeWords + 1 },
    });
  });

  test('the stop sequence found earliest wins', async () => {
    const full = textOf(await collect(FAST, makeRequest()));
    const words = full.split(' ');
    const deltas = await collect(FAST, makeRequest({ stop: [` ${words[8]}`, ` ${words[2]}`] }));
    expect(textOf(deltas)).toBe(
      full.slice(0, Math.min(full.indexOf(` ${words[8]}`), full.indexOf(` ${words[2]}`))),
    );
  });
});

describe('simulator tool calls', () => {
  const tool: ToolDefinition = {
    type: 'function',
    function: {
      name: 'search',
      parameters: {
        type: 'object',
        properties: { query: { type: 'string', minLength: 40 } },
        required: ['query'],
      },
    },
  };

  test('a tool without parameters gets {}', async () => {
    const deltas = await collect(
      FAST,
      makeRequest({
        tools: [{ type: 'function', function: { name: 'ping' } }],
        toolChoice: 'required',
      }),
    );
    expect(deltas[0]).toMatchObject({ type: 'tool_call', index: 0, name: 'ping', arguments: '' });
    expect(deltas.slice(1)).toEqual([
      { type: 'tool_call', index: 0, id: null, name: null, arguments: '{}' },
      {
        type: 'finish',
        reason: 'tool_calls',
        usage: { promptTokens: 12, completionTokens: countTextTokens('ping{}') },
      },
    ]);
  });

  test('arguments stream as fragments after a first delta with id and name', async () => {
    const deltas = await collect(
      { ...FAST, tokens_per_second: 1_000 },
      makeRequest({ tools: [tool], toolChoice: 'required' }),
    );
    const calls = deltas.filter((delta) => delta.type === 'tool_call');
    expect(calls[0]).toEqual({
      type: 'tool_call',
      index: 0,
      id: expect.stringMatching(/^call_[A-Za-z0-9]{24}$/),
      name: 'search',
      arguments: '',
    });
    expect(calls.length).toBeGreaterThan(2);
    const args = JSON.parse(calls.map((delta) => delta.arguments).join('')) as { query: string };
    expect(args.query.length).toBeGreaterThanOrEqual(40);
  });

  test('an output limit below the call cuts the arguments and finishes with length', async () => {
    const deltas = await collect(
      FAST,
      makeRequest({ tools: [tool], toolChoice: 'required', maxOutputTokens: 4 }),
    );
    const finish = deltas.at(-1);
    expect(finish).toMatchObject({ type: 'finish', reason: 'length' });
    const args = deltas
      .map((delta) => (delta.type === 'tool_call' ? delta.arguments : ''))
      .join('');
    expect(countTextTokens(`search${args}`)).toBeLessThanOrEqual(4);
    expect(finish!.type === 'finish' && finish!.usage!.completionTokens).toBeLessThanOrEqual(4);
  });

  test('a named tool that is not in tools falls back to text', async () => {
    const deltas = await collect(
      FAST,
      makeRequest({
        tools: [tool],
        toolChoice: { type: 'function', function: { name: 'missing' } },
      }),
    );
    expect(countTextTokens(textOf(deltas))).toBe(24);
  });
});

/** Schemas TypeBox can check a generated value against. */
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
        items: Type.Array(
          Type.Object(
            { sku: Type.String(), qty: Type.Integer({ minimum: 1 }) },
            { additionalProperties: false },
          ),
          {
            minItems: 1,
          },
        ),
        pair: Type.Tuple([Type.String(), Type.Integer()]),
        choice: Type.Union([Type.Literal('red'), Type.Literal('green')]),
        maybe: Type.Optional(Type.Union([Type.String(), Type.Null()])),
        unique: Type.Array(Type.Union([Type.Literal(1), Type.Literal(2), Type.Literal(3)]), {
          uniqueItems: true,
          maxItems: 3,
        }),
      },
      { additionalProperties: false },
    ),
  },
  {
    name: 'a number with only a maximum',
    schema: Type.Object({ n: Type.Number({ maximum: -1000 }) }),
  },
  { name: 'a literal', schema: Type.Literal('fixed') },
];

describe('schema values', () => {
  const SEEDS = 300;

  for (const { name, schema } of checked) {
    test(`${name}: valid for ${SEEDS} seeds`, () => {
      // The JSON round trip drops TypeBox's symbols: the generator sees what a client would send.
      const plain = JSON.parse(JSON.stringify(schema)) as unknown;
      for (let seed = 0; seed < SEEDS; seed++) {
        const value = valueForSchema(plain, new SeededRandom(seed), ARGUMENTS_BYTES_MAX);
        if (!Value.Check(schema, value))
          throw new Error(`seed ${seed}: ${JSON.stringify(value)} does not match ${name}`);
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
        merged: {
          allOf: [
            { type: 'object', properties: { a: { type: 'boolean' } }, required: ['a'] },
            { properties: { b: { const: 2 } } },
          ],
        },
        anything: {},
      },
      required: ['level', 'extraRequired'],
      additionalProperties: { type: 'integer', minimum: 100, maximum: 100 },
    };
    for (let seed = 0; seed < SEEDS; seed++) {
      const value = valueForSchema(schema, new SeededRandom(seed), ARGUMENTS_BYTES_MAX) as Record<
        string,
        unknown
      >;
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
    const schema = {
      type: 'object',
      properties: { a: { type: 'integer' }, b: { type: 'array', items: { type: 'string' } } },
    };
    expect(valueForSchema(schema, new SeededRandom(42), ARGUMENTS_BYTES_MAX)).toEqual(
      valueForSchema(schema, new SeededRandom(42), ARGUMENTS_BYTES_MAX),
    );
  });

  test('a recursive $ref that is optional ends, and stays valid', () => {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string' }, left: { $ref: '#' }, right: { $ref: '#' } },
      required: ['name'],
    };
    const Tree = Type.Recursive((This) =>
      Type.Object({ name: Type.String(), left: Type.Optional(This), right: Type.Optional(This) }),
    );
    for (let seed = 0; seed < 20; seed++)
      expect(
        Value.Check(Tree, valueForSchema(schema, new SeededRandom(seed), ARGUMENTS_BYTES_MAX)),
      ).toBe(true);
  });

  test('a required recursive $ref has no finite instance: the answer ends at once as {}', () => {
    const schema = {
      $defs: {
        node: {
          type: 'object',
          properties: { child: { $ref: '#/$defs/node' } },
          required: ['child'],
        },
      },
      $ref: '#/$defs/node',
    };
    expect(valueForSchema(schema, new SeededRandom(1), ARGUMENTS_BYTES_MAX)).toEqual({});
    expect(smallestInstance(schema, ARGUMENTS_BYTES_MAX)).toEqual({
      fits: false,
      reason: 'too_large',
    });
  });

  test(
    'property names are plain data: __proto__, ' +
      'constructor and toString are own keys of the value',
    () => {
      const schema = JSON.parse(
        '{"type": "object", "properties": {"__proto__": {"const": 1}, "constructor": {"const": ' +
          '2}}, "required": ["__proto__", "toString"]}',
      );
      for (const value of [
        valueForSchema(schema, new SeededRandom(3), ARGUMENTS_BYTES_MAX),
        smallestInstance(schema, ARGUMENTS_BYTES_MAX).fits &&
          (smallestInstance(schema, ARGUMENTS_BYTES_MAX) as any).value,
      ]) {
        const text = JSON.stringify(value);
        expect(Object.keys(JSON.parse(text))).toEqual(
          expect.arrayContaining(['__proto__', 'toString']),
        );
        expect(Object.getOwnPropertyDescriptor(JSON.parse(text), '__proto__')?.value).toBe(1);
        expect(Object.getPrototypeOf(value)).toBe(Object.prototype);
      }
    },
  );

  test(
    'pattern, format, a property bounded by two allOf parts, maxProperties: valid by Ajv ' +
      '(formats asserted) for 200 seeds, the smallest instance too',
    () => {
      const ajv = new Ajv2020({ strict: false, logger: false });
      addFormats(ajv);
      const one = (property: Record<string, unknown>) => ({
        type: 'object',
        properties: { v: { type: 'string', ...property } },
        required: ['v'],
      });
      const schemas: unknown[] = [
        // The audit's cases (stop 33): each came back invalid.
        one({ pattern: '^[A-Z]{3}$' }),
        one({ pattern: '^\\d{5}$' }),
        {
          type: 'object',
          properties: { nights: { type: 'integer', minimum: 1 } },
          allOf: [{ properties: { nights: { maximum: 14 } } }],
          required: ['nights'],
        },
        {
          type: 'object',
          allOf: [
            { properties: { a: { type: 'integer', minimum: 5 } } },
            { properties: { a: { maximum: 6 } } },
          ],
          required: ['a'],
        },
        {
          type: 'object',
          maxProperties: 1,
          properties: { a: { type: 'string' }, b: { type: 'string' }, c: { type: 'string' } },
        },
        {
          type: 'object',
          maxProperties: 2,
          required: ['c'],
          properties: { a: { type: 'string' }, b: { type: 'string' }, c: { type: 'string' } },
        },
        ...['date', 'time', 'date-time', 'duration', 'email', 'hostname', 'ipv4', 'ipv6', 'uri']
          .concat(['uri-reference', 'uri-template', 'uuid', 'json-pointer', 'regex'])
          .concat(['relative-json-pointer'])
          .map((format) => one({ format })),
        ...[
          '^\\+?[1-9]\\d{1,14}$',
          '^(foo|bar)baz?$',
          '[^abc]{2,4}',
          '^#?([a-fA-F0-9]{6}|[a-fA-F0-9]{3})$',
          '^(?:[01]\\d|2[0-3]):[0-5]\\d$',
          '^\\S+$',
          '^.{3,8}$',
          '^[^\\s@]+@[^\\s@]+\\.[^\\s@]+$',
          '^(?<year>\\d{4})$',
          '^[-a-z]{2}$',
          '^\\u00e9+$',
          '^a{2,}b*c?$',
          '^[\\d\\s]+$',
          '^$',
          '\\$\\d+\\.\\d{2}',
          '^[\\]a]$',
          '^v\\d+(\\.\\d+){2}(-[a-z]+)?$',
        ].map((pattern) => one({ pattern })),
        // A known format wins over a pattern beside it, which mostly restates it.
        one({ pattern: '^\\d{4}-\\d{2}-\\d{2}$', format: 'date' }),
        one({ pattern: '^[a-z]+-\\d$', format: 'not-a-known-format' }),
        // Lengths beside a pattern or a format (review of stop 33: they were not read).
        one({ pattern: '^[a-z]+$', minLength: 10 }),
        one({ pattern: '^[a-z0-9_-]{3,16}$', maxLength: 5 }),
        one({ pattern: '^[a-z0-9_-]{3,16}$', minLength: 12, maxLength: 13 }),
        one({ pattern: '^\\d+(\\.\\d+)?$', minLength: 8, maxLength: 9 }),
        one({ pattern: '^(ab)+$', minLength: 7 }),
        one({ pattern: '^(ab|c)+$', minLength: 7, maxLength: 7 }),
        one({ pattern: '^[A-Z]{2}(-[a-z]{1,3})*$', minLength: 20, maxLength: 24 }),
        one({ pattern: '^(?:x{200}|yy)$', maxLength: 2 }),
        one({ pattern: '^.{3,8}$', minLength: 8 }),
        one({ format: 'email', maxLength: 200, minLength: 3 }),
        // Review of stop 34: a format's free part grows to its minLength.
        one({ format: 'email', minLength: 30 }),
        one({ format: 'uri', minLength: 40 }),
        ...[64, 65, 100, 128, 253].map((minLength) => one({ format: 'hostname', minLength })),
        one({ format: 'uri-reference', minLength: 10 }),
        one({ format: 'json-pointer', minLength: 5 }),
        one({ format: 'regex', minLength: 12 }),
        one({ format: 'uri-template', minLength: 30, maxLength: 30 }),
        // Review of stop 34: {0} on an unbounded group (0 × Infinity had made its lengths NaN).
        one({ pattern: '^(?:a*){0}b+$', minLength: 3 }),
        // … branches of other lengths than the one aimed at: the nearest longer or shorter one.
        one({ pattern: '^(?:[0-9]{4}|[0-9]{6})$', minLength: 5 }),
        one({ pattern: '^$|^[0-9]{9}$', minLength: 1 }),
        one({ pattern: '^#([0-9a-f]{3}|[0-9a-f]{6})$', minLength: 7 }),
        one({ pattern: '^(?:[A-Z]{2}|[0-9]{8})$', minLength: 3 }),
        // … a pattern without `$` is padded to its minLength: what follows a match keeps it one.
        one({ pattern: '^[A-Z]', minLength: 3 }),
        one({ pattern: '\\d', minLength: 8 }),
        one({ pattern: '^https://', minLength: 12 }),
        // … an escaped surrogate pair is one character (Ajv reads patterns with the u flag).
        one({ pattern: '^\\uD83D\\uDE00{2}$', maxLength: 2 }),
      ];
      for (const schema of schemas) {
        const validate = ajv.compile(schema as object);
        for (let seed = 0; seed < 200; seed++) {
          const value = valueForSchema(schema, new SeededRandom(seed), ARGUMENTS_BYTES_MAX);
          if (!validate(value))
            throw new Error(`seed ${seed}: ${JSON.stringify(value)} for ${JSON.stringify(schema)}`);
        }
        const smallest = smallestInstance(schema, ARGUMENTS_BYTES_MAX);
        expect(smallest.fits && validate(smallest.value)).toBe(true);
      }
    },
  );

  test('the shortest string of a pattern is the shortest branch by length, not by nodes', () => {
    for (const pattern of ['^(x{65535}|yy)$', '^(?:a{3}|b{2}|c{40})$', '^(x+y{9}|z{4})$']) {
      const smallest = smallestInstance({ type: 'string', pattern }, 1024);
      expect(smallest.fits && new RegExp(pattern, 'u').test(smallest.value as string)).toBe(true);
      const shortest = { '^(x{65535}|yy)$': 'yy', '^(?:a{3}|b{2}|c{40})$': 'bb' }[pattern];
      if (shortest !== undefined) expect(smallest.fits && smallest.value).toBe(shortest);
      for (let seed = 0; seed < 50; seed++) {
        const value = valueForSchema({ type: 'string', pattern }, new SeededRandom(seed), 1024);
        expect(new RegExp(pattern, 'u').test(value as string)).toBe(true);
      }
    }
  });

  test('a pattern whose every string is too long has no instance that fits: too_large', () => {
    for (const pattern of ['^x{2000}$', '^(a{600}|b{700})c{500}$', '^[ab]{1023}$']) {
      expect(smallestInstance({ type: 'string', pattern }, 1024)).toEqual({
        fits: false,
        reason: 'too_large',
      });
      // Unsupported syntax is still a word (best effort), not a refusal.
      expect(smallestInstance({ type: 'string', pattern: `${pattern}(?=z)` }, 1024).fits).toBe(
        true,
      );
    }
    // One character under: the quotes make 1,024 bytes.
    const fitting = smallestInstance({ type: 'string', pattern: '^[ab]{1022}$' }, 1024);
    expect(fitting.fits && fitting.bytes).toBe(1024);
  });

  test('allOf inside allOf parts, a part with $ref and keywords, multipleOf in two parts', () => {
    const ajv = new Ajv2020({ strict: false, logger: false });
    const schemas: unknown[] = [
      {
        type: 'object',
        allOf: [
          { allOf: [{ properties: { n: { type: 'integer', minimum: 10 } }, required: ['n'] }] },
          { properties: { n: { maximum: 12 } } },
        ],
      },
      {
        $defs: { base: { type: 'integer', minimum: 5 } },
        allOf: [{ $ref: '#/$defs/base', maximum: 7 }],
      },
      { type: 'integer', allOf: [{ multipleOf: 3 }, { multipleOf: 4 }], minimum: 1 },
      // Review of stop 34: a part's $ref to a $ref, and a $ref beside keywords in its target.
      {
        allOf: [{ $ref: '#/$defs/A' }],
        $defs: {
          A: { $ref: '#/$defs/B', required: ['a'], properties: { a: { type: 'integer' } } },
          B: { type: 'object', required: ['b'], properties: { b: { const: 1 } } },
        },
      },
      {
        type: 'object',
        properties: { n: { type: 'integer', multipleOf: 6, minimum: 1, maximum: 100 } },
        allOf: [{ properties: { n: { multipleOf: 10 } } }],
        required: ['n'],
      },
    ];
    for (const schema of schemas) {
      const validate = ajv.compile(schema as object);
      for (let seed = 0; seed < 100; seed++) {
        const value = valueForSchema(schema, new SeededRandom(seed), ARGUMENTS_BYTES_MAX);
        if (!validate(value))
          throw new Error(`seed ${seed}: ${JSON.stringify(value)} for ${JSON.stringify(schema)}`);
      }
      const smallest = smallestInstance(schema, ARGUMENTS_BYTES_MAX);
      expect(smallest.fits && validate(smallest.value)).toBe(true);
    }
    // A part that refers to the schema it is part of, twice at every level: bounded, no error.
    const cyclic = { type: 'integer', allOf: [{ $ref: '#' }, { $ref: '#' }] };
    const startedMs = performance.now();
    expect(Number.isInteger(valueForSchema(cyclic, new SeededRandom(1), 1024))).toBe(true);
    smallestInstance(cyclic, 1024);
    expect(performance.now() - startedMs).toBeLessThan(QUICK_MS);
  });

  test('review of stop 33: classes as ECMAScript reads them, a property in 3 allOf parts', () => {
    const matches = (pattern: string) => {
      for (let seed = 0; seed < 50; seed++) {
        const value = valueForSchema({ type: 'string', pattern }, new SeededRandom(seed), 1024);
        expect(new RegExp(pattern, 'u').test(value as string)).toBe(true);
      }
      const smallest = smallestInstance({ type: 'string', pattern }, 1024);
      expect(smallest.fits && new RegExp(pattern, 'u').test(smallest.value as string)).toBe(true);
    };
    // `[^]` is any character (not a class holding `]`); \0-\uffef leaves one BMP character out.
    matches('^[^][a]$');
    matches('^[^\\0-\\uffef]{3}$');
    matches('^[^\\0-\\uffff]$');
    // \B is a boundary, not the letter B: not built, so a word (no error).
    expect(stringFor('a\\Bb')).toBeNull();
    const schema = {
      type: 'object',
      allOf: [
        { properties: { n: { type: 'integer', minimum: 50 } } },
        { properties: { n: { maximum: 60 } } },
        { properties: { n: { type: 'integer' } } },
      ],
      required: ['n'],
    };
    for (let seed = 0; seed < 50; seed++) {
      const { n } = valueForSchema(schema, new SeededRandom(seed), 1024) as { n: number };
      expect(n >= 50 && n <= 60).toBe(true);
    }
  });

  test(
    'a pattern costly to build, in every item of a long array: its work counts against the ' +
      "value's budget, built once",
    () => {
      for (const pattern of ['((){60000}){60000}', '(a?){30000}', '[ab]{20000}']) {
        const schema = { type: 'array', minItems: 20_000, items: { type: 'string', pattern } };
        const startedMs = performance.now();
        const value = valueForSchema(schema, new SeededRandom(3), ARGUMENTS_BYTES_MAX);
        smallestInstance(schema, ARGUMENTS_BYTES_MAX);
        expect(performance.now() - startedMs).toBeLessThan(QUICK_MS);
        expect(Buffer.byteLength(JSON.stringify(value))).toBeLessThanOrEqual(ARGUMENTS_BYTES_MAX);
      }
    },
  );

  test('a pattern is read up to 1,024 characters; a longer one is not built (a word)', () => {
    expect(stringFor('a'.repeat(1_024))).toBe('a'.repeat(1_024));
    expect(stringFor('a'.repeat(1_025))).toBeNull();
  });

  test('a hostile class is a lookup per character, and a bad \\u{} escape no error', () => {
    const cjk = Array.from({ length: 4_000 }, (_, i) => String.fromCharCode(0x4e00 + i)).join('');
    const startedMs = performance.now();
    for (const pattern of [
      `[^${cjk}\\0-\\uffef]{3}`,
      `[^${cjk}\\0-\\uffff]{3}`,
      `[${cjk}]{20000}`,
    ]) {
      const schema = { type: 'array', minItems: 5, items: { type: 'string', pattern } };
      valueForSchema(schema, new SeededRandom(1), ARGUMENTS_BYTES_MAX);
      smallestInstance(schema, ARGUMENTS_BYTES_MAX);
    }
    expect(performance.now() - startedMs).toBeLessThan(QUICK_MS);
    for (const pattern of ['\\u{-1}', '[\\u{-5}]', '\\u{+1}', '\\u{110000}']) {
      expect(() =>
        valueForSchema({ type: 'string', pattern }, new SeededRandom(1), ARGUMENTS_BYTES_MAX),
      ).not.toThrow();
      expect(stringFor(pattern)).toBeNull();
    }
  });

  test('a pattern past what is built (lookaround, a backreference) gets a word, no error', () => {
    for (const pattern of ['^(?=a)a$', '^(a)\\1$', '\\bword\\b', '^\\p{L}+$', '[z-a]', '(']) {
      const schema = { type: 'string', pattern };
      expect(typeof valueForSchema(schema, new SeededRandom(1), ARGUMENTS_BYTES_MAX)).toBe(
        'string',
      );
      expect(smallestInstance(schema, ARGUMENTS_BYTES_MAX).fits).toBe(true);
    }
  });

  test('a $ref with a malformed percent-escape names nothing instead of throwing', () => {
    const schema = { type: 'object', properties: { a: { $ref: '#/%E0%A4%A' } }, required: ['a'] };
    expect(() => valueForSchema(schema, new SeededRandom(1), ARGUMENTS_BYTES_MAX)).not.toThrow();
    expect(smallestInstance(schema, ARGUMENTS_BYTES_MAX).fits).toBe(true);
  });
});

/**
 * A generous ceiling that only an unbounded generator (the 7-20 s stalls this replaced) could pass.
 */
const QUICK_MS = 1_000;

/**
 * The cycle of unions above, with a long required name on every node, which the search meets again
 * and again.
 */
function longNamesOnACycle(): unknown {
  const name = 'k'.repeat(200_000);
  const cycle: { $defs: Record<string, unknown>; $ref: string } = { $defs: {}, $ref: '#/$defs/n0' };
  for (let i = 0; i < 30; i++) {
    const next = { $ref: `#/$defs/n${(i + 1) % 30}` };
    cycle.$defs[`n${i}`] = {
      anyOf: [next, { type: 'object', properties: { [name]: next }, required: [name] }],
    };
  }
  return cycle;
}

/**
 * An array whose item may be any of 2,000 allOf nodes, each merging the same large part: every
 * merge is charged.
 */
function manyMerges(): unknown {
  const part = {
    properties: Object.fromEntries(
      Array.from({ length: 30_000 }, (_, i) => [`p${i}`, { type: 'integer' }]),
    ),
  };
  const branches = Array.from({ length: 2_000 }, () => ({
    allOf: [{ $ref: '#/$defs/part' }],
    type: 'object',
  }));
  return { $defs: { part }, type: 'array', minItems: 2, items: { anyOf: branches } };
}

/** Schemas that asked for gigabytes or unbounded work (CONTRACT §8: generated work is bounded). */
function attackSchemas(): Array<{ name: string; schema: unknown }> {
  const nested = (levels: number, items: number): unknown =>
    levels === 0
      ? { type: 'integer' }
      : { type: 'array', minItems: items, items: nested(levels - 1, items) };
  const cycle: { $defs: Record<string, unknown>; $ref: string } = { $defs: {}, $ref: '#/$defs/n0' };
  for (let i = 0; i < 30; i++) {
    const next = { $ref: `#/$defs/n${(i + 1) % 30}` };
    cycle.$defs[`n${i}`] = {
      anyOf: [next, { type: 'object', properties: { x: next }, required: ['x'] }],
    };
  }
  return [
    { name: 'minItems 1e8', schema: { type: 'array', minItems: 1e8 } },
    { name: 'minLength 1e9', schema: { type: 'string', minLength: 1e9 } },
    { name: 'minProperties 1e8', schema: { type: 'object', minProperties: 1e8 } },
    { name: 'nested arrays with minItems 100 at five levels', schema: nested(5, 100) },
    { name: 'nested arrays with minItems 2 at sixteen levels', schema: nested(16, 2) },
    {
      name: 'a required recursive $ref',
      schema: { type: 'object', properties: { next: { $ref: '#' } }, required: ['next'] },
    },
    { name: 'a recursive cycle of unions', schema: cycle },
    { name: 'a huge enum member', schema: { enum: ['x'.repeat(200_000)] } },
    {
      name: 'a huge const',
      schema: {
        type: 'object',
        properties: { c: { const: 'y'.repeat(200_000) } },
        required: ['c'],
      },
    },
    {
      name: 'uniqueItems over a two-value enum, minItems 1e7',
      schema: { type: 'array', uniqueItems: true, minItems: 1e7, items: { enum: [1, 2] } },
    },
    {
      name: 'uniqueItems over strings, minItems 1e6',
      schema: { type: 'array', uniqueItems: true, minItems: 1e6, items: { type: 'string' } },
    },
    {
      name: 'minProperties 1e6 of large values',
      schema: {
        type: 'object',
        minProperties: 1e6,
        additionalProperties: { type: 'string', minLength: 100 },
      },
    },
    {
      name: 'a required list of 100,000 names',
      schema: { type: 'object', required: Array.from({ length: 100_000 }, (_, i) => `k${i}`) },
    },
    {
      name: 'required names of 200,000 characters on a recursive cycle',
      schema: longNamesOnACycle(),
    },
    { name: '2,000 allOf nodes merging one part of 30,000 properties', schema: manyMerges() },
  ];
}

describe('generated work is bounded (CONTRACT §8)', () => {
  test('a pattern is charged for its parsing: 1,536 pattern properties spend the steps', () => {
    // Audit J: charged a step a visit, they fit the budget and held the event loop 30-60 ms (a
    // pattern's parse and classes cost as much as ~25-40 other steps).
    const pattern = '^[a-z]{3,9}(-[0-9]{2,5}){1,4}$';
    const budget = new SearchBudget(1_000);
    expect(smallestInstance({ type: 'string', pattern }, ARGUMENTS_BYTES_MAX, budget).fits).toBe(
      true,
    );
    expect(1_000 - budget.stepsLeft).toBeGreaterThanOrEqual(8 + Math.ceil(pattern.length / 2));
    const schema = (properties: number) => ({
      type: 'object',
      properties: Object.fromEntries(
        Array.from({ length: properties }, (_, i) => [`p${i}`, { type: 'string', pattern }]),
      ),
      required: Array.from({ length: properties }, (_, i) => `p${i}`),
    });
    expect(smallestInstance(schema(1_536), ARGUMENTS_BYTES_MAX)).toEqual({
      fits: false,
      reason: 'too_complex',
    });
    // An ordinary schema's patterns are nowhere near it.
    expect(smallestInstance(schema(100), ARGUMENTS_BYTES_MAX).fits).toBe(true);
  });

  for (const { name, schema } of attackSchemas()) {
    test(
      `${name}: the value is at most the byte limit, at once; the smallest instance is found ` +
        `not to fit`,
      () => {
        const startedMs = performance.now();
        const value = valueForSchema(schema, new SeededRandom(7), ARGUMENTS_BYTES_MAX);
        const smallest = smallestInstance(JSON.parse(JSON.stringify(schema)), ARGUMENTS_BYTES_MAX);
        expect(performance.now() - startedMs).toBeLessThan(QUICK_MS);
        expect(Buffer.byteLength(JSON.stringify(value))).toBeLessThanOrEqual(ARGUMENTS_BYTES_MAX);
        expect(smallest.fits).toBe(false);
      },
    );
  }

  test(
    'a hostile pattern is built in bounded work and bytes, never run: nested empty repeats, ' +
      'a repeat past the limit, a catastrophic-backtracking one',
    () => {
      for (const pattern of [
        '((){60000}){60000}',
        '(((a?){60000}){60000}){60000}',
        'a{70000}',
        `${'(a|b)'.repeat(2_000)}`,
        '^(a|aa)+$',
        '^(\\w+\\s?)*$',
        'x'.repeat(100_000),
      ]) {
        const schema = { type: 'object', properties: { v: { type: 'string', pattern } } };
        const startedMs = performance.now();
        const value = valueForSchema(schema, new SeededRandom(7), ARGUMENTS_BYTES_MAX);
        smallestInstance(schema, ARGUMENTS_BYTES_MAX);
        expect(performance.now() - startedMs).toBeLessThan(QUICK_MS);
        expect(Buffer.byteLength(JSON.stringify(value))).toBeLessThanOrEqual(ARGUMENTS_BYTES_MAX);
      }
    },
  );

  test(
    'review of stop 34: a wide alternation repeated many times, with lengths or not, is cheap: ' +
      'a branch looked at is a visit, and what makes nothing is not built',
    () => {
      const bars = '|'.repeat(1_000);
      const startedMs = performance.now();
      for (const pattern of [
        `^(?:${bars}){300000}$`,
        `^(?:(?:${'|'.repeat(990)}){1000}){1000}$`,
        `^(?:a${'|a'.repeat(490)}){100000}$`,
        `^(?:${bars}){100000}a?$`,
        `${'('.repeat(340)}a${')'.repeat(340)}+`,
        `${'(?:'.repeat(250)}a?${')'.repeat(250)}{65530}`,
      ]) {
        for (const lengths of [{}, { minLength: 1 }, { minLength: 1, maxLength: 1 }]) {
          const schema = {
            type: 'object',
            properties: { x: { type: 'string', pattern, ...lengths } },
            required: ['x'],
          };
          valueForSchema(schema, new SeededRandom(1), ARGUMENTS_BYTES_MAX);
          smallestInstance(schema, ARGUMENTS_BYTES_MAX);
        }
      }
      // All 18 together (each of the first four had taken 0.6-1.7 s).
      expect(performance.now() - startedMs).toBeLessThan(QUICK_MS);
    },
  );

  test(
    'uniqueItems over a two-value enum with ' + 'minItems 50 stops short after the two values',
    () => {
      const schema = { type: 'array', uniqueItems: true, minItems: 50, items: { enum: [1, 2] } };
      expect(
        (valueForSchema(schema, new SeededRandom(1), ARGUMENTS_BYTES_MAX) as number[]).toSorted(),
      ).toEqual([1, 2]);
      expect(smallestInstance(schema, ARGUMENTS_BYTES_MAX)).toEqual({
        fits: true,
        value: [1, 2],
        bytes: 5,
      });
    },
  );

  test(
    'the limit is exact: a string of 65,534 ' +
      'characters fits in 65,536 bytes, one more does not',
    () => {
      const fits = smallestInstance({ type: 'string', minLength: 65_534 }, ARGUMENTS_BYTES_MAX);
      expect(fits.fits && fits.bytes).toBe(ARGUMENTS_BYTES_MAX);
      expect(smallestInstance({ type: 'string', minLength: 65_535 }, ARGUMENTS_BYTES_MAX)).toEqual({
        fits: false,
        reason: 'too_large',
      });
      const value = valueForSchema(
        { type: 'string', minLength: 65_534 },
        new SeededRandom(1),
        ARGUMENTS_BYTES_MAX,
      ) as string;
      expect(value.length).toBeGreaterThanOrEqual(65_534);
      expect(Buffer.byteLength(JSON.stringify(value))).toBeLessThanOrEqual(ARGUMENTS_BYTES_MAX);
    },
  );

  test('a varied value past the limit falls back to the smallest instance, which is valid', () => {
    // The varied value fills the optional 500-character field; 100 bytes only hold the required
    // one.
    const schema = {
      type: 'object',
      properties: { note: { type: 'string', minLength: 500 }, id: { type: 'integer', minimum: 7 } },
      required: ['id'],
    };
    expect(valueForSchema(schema, new SeededRandom(1), 100)).toEqual({ id: 7 });
    expect(valueForSchema(schema, new SeededRandom(1), ARGUMENTS_BYTES_MAX)).toEqual({
      note: expect.any(String),
      id: expect.any(Number),
    });
  });

  test('the smallest instance is valid and its size is what it prints to', () => {
    const schemas: unknown[] = [
      ...checked.map(({ schema }) => JSON.parse(JSON.stringify(schema))),
      {
        type: 'array',
        minItems: 300,
        items: {
          type: 'object',
          properties: { a: { type: 'string', minLength: 3 } },
          required: ['a'],
        },
      },
      { type: 'array', minItems: 40, uniqueItems: true, items: { type: 'integer', minimum: -3 } },
      {
        type: 'array',
        minItems: 40,
        uniqueItems: true,
        items: { type: 'string', minLength: 2, maxLength: 2 },
      },
      {
        type: 'array',
        prefixItems: [{ const: 'é' }, { enum: ['long', 'xy', 'z'] }],
        minItems: 4,
        items: { type: 'boolean' },
      },
      {
        type: 'object',
        minProperties: 3,
        additionalProperties: { type: 'number', exclusiveMinimum: 5, maximum: 9 },
      },
      {
        anyOf: [
          { type: 'string', minLength: 30 },
          { type: 'integer', minimum: 10_000 },
          { type: 'null' },
        ],
      },
    ];
    for (const schema of schemas) {
      const smallest = smallestInstance(schema, ARGUMENTS_BYTES_MAX);
      if (!smallest.fits) throw new Error(`${JSON.stringify(schema)}: ${smallest.reason}`);
      expect(Buffer.byteLength(JSON.stringify(smallest.value))).toBe(smallest.bytes);
    }
    for (const { name, schema } of checked) {
      const smallest = smallestInstance(JSON.parse(JSON.stringify(schema)), ARGUMENTS_BYTES_MAX);
      if (!smallest.fits || !Value.Check(schema, smallest.value))
        throw new Error(`${name}: ${JSON.stringify(smallest)}`);
    }
  });

  test(
    'a tool call whose arguments pass the output limit is cut in bounded work to the longest ' +
      'prefix that fits',
    async () => {
      const big: ToolDefinition = {
        type: 'function',
        function: {
          name: 'many',
          parameters: { type: 'array', minItems: 6_000, items: { type: 'string', minLength: 3 } },
        },
      };
      const whole = await collect(FAST, makeRequest({ tools: [big], toolChoice: 'required' }));
      const wholeArgs = whole
        .map((delta) => (delta.type === 'tool_call' ? delta.arguments : ''))
        .join('');
      expect(Buffer.byteLength(wholeArgs)).toBeLessThanOrEqual(ARGUMENTS_BYTES_MAX);
      const limit = Math.floor(countTextTokens(`many${wholeArgs}`) * 0.7);
      const startedMs = performance.now();
      const cut = await collect(
        FAST,
        makeRequest({ tools: [big], toolChoice: 'required', maxOutputTokens: limit }),
      );
      expect(performance.now() - startedMs).toBeLessThan(QUICK_MS);
      const args = cut.map((delta) => (delta.type === 'tool_call' ? delta.arguments : '')).join('');
      expect(wholeArgs.startsWith(args)).toBe(true);
      expect(countTextTokens(`many${args}`)).toBeLessThanOrEqual(limit);
      expect(countTextTokens(`many${wholeArgs.slice(0, args.length + 1)}`)).toBeGreaterThan(limit);
      expect(cut.at(-1)).toEqual({
        type: 'finish',
        reason: 'length',
        usage: { promptTokens: 12, completionTokens: countTextTokens(`many${args}`) },
      });
    },
  );
});
