// The validation helper: the first TypeBox error in words that name the field and the bound, a
// union's branch included.
import { describe, expect, test } from 'bun:test';
import { type TSchema, Type } from '@sinclair/typebox';
import { Value } from '@sinclair/typebox/value';
import { fieldPath, firstProblem, mustBe } from '../../src/util/validation.ts';

/** `field problem`, as the chat and admin APIs word it. */
function message(schema: TSchema, value: unknown): string | null {
  const problem = firstProblem(Value.Errors(schema, value));
  return problem === null
    ? null
    : `${fieldPath(value, problem.segments) || 'body'} ${problem.problem}`;
}

const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);

describe('a union reports the error of the branch the value was meant for', () => {
  const schema = Type.Object({
    temperature: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: 2 }))),
    n: Type.Optional(Nullable(Type.Integer({ exclusiveMinimum: 0, multipleOf: 2 }))),
    tags: Type.Optional(Nullable(Type.Array(Type.String({ maxLength: 3 }), { maxItems: 2 }))),
    name: Type.Optional(Nullable(Type.String({ minLength: 16 }))),
    level: Type.Optional(Type.Union([Type.Literal('low'), Type.Literal('high')])),
  });

  const cases: Array<[unknown, string]> = [
    [{ temperature: 5 }, 'temperature must be ≤ 2'],
    [{ temperature: -1 }, 'temperature must be ≥ 0'],
    [{ temperature: 'hot' }, 'temperature must be a number or null'],
    [{ n: 0 }, 'n must be > 0'],
    [{ n: 3 }, 'n must be a multiple of 2'],
    [{ n: 2.5 }, 'n must be an integer'],
    [{ tags: ['a', 'b', 'c'] }, 'tags must have at most 2 items'],
    [{ tags: ['long'] }, 'tags[0] must be at most 3 characters'],
    [{ name: 'short' }, 'name must be at least 16 characters'],
    [{ level: 'mid' }, 'level must be one of "low" or "high"'],
    [{ extra: 1, temperature: 3 }, 'temperature must be ≤ 2'],
  ];
  for (const [value, expected] of cases) {
    test(`${JSON.stringify(value)} → ${expected}`, () =>
      expect(message(schema, value)).toBe(expected));
  }
});

describe('objects told apart by a literal field', () => {
  const schema = Type.Record(
    Type.String(),
    Type.Union([
      Type.Object(
        { type: Type.Literal('a'), size: Type.Integer({ minimum: 1 }) },
        { additionalProperties: false },
      ),
      Type.Object({ type: Type.Literal('b'), url: Type.String() }, { additionalProperties: false }),
    ]),
  );

  test('the branch whose literal matches names its own field', () => {
    expect(message(schema, { one: { type: 'a', size: 0 } })).toBe('one.size must be ≥ 1');
    expect(message(schema, { one: { type: 'b' } })).toBe('one.url is required');
    expect(message(schema, { one: { type: 'b', url: 'x', size: 1 } })).toBe(
      'one.size is not a known field',
    );
  });

  test('no matching literal names the discriminating field and its choices', () => {
    expect(message(schema, { one: { type: 'c' } })).toBe('one.type must be one of "a" or "b"');
    expect(message(schema, { one: {} })).toBe('one.type must be one of "a" or "b"');
  });

  test('an object missing the literal of a mixed union is described by the object branch', () => {
    const choice = Type.Union([
      Type.Literal('auto'),
      Type.Object({ type: Type.Literal('function'), name: Type.String() }),
    ]);
    expect(message(Type.Object({ choice }), { choice: { name: 'x' } })).toBe(
      'choice.type is required',
    );
    expect(message(Type.Object({ choice }), { choice: 7 })).toBe(
      'choice must be "auto" or an object',
    );
  });
});

describe('paths', () => {
  test(
    'array indexes in brackets, object keys that look ' +
      'like numbers with dots, pointer escapes undone',
    () => {
      const schema = Type.Object({ list: Type.Array(Type.Record(Type.String(), Type.Integer())) });
      expect(message(schema, { list: [{ '0': 1 }, { 'a/b~c': 'x' }] })).toBe(
        'list[1].a/b~c must be an integer',
      );
      expect(message(Type.Record(Type.String(), Type.Integer()), { '12': 'x' })).toBe(
        '12 must be an integer',
      );
    },
  );

  test('a prefix is prepended, a required field is named, a root error says body', () => {
    const schema = Type.Object({ id: Type.String() });
    const problem = firstProblem(Value.Errors(schema, {}))!;
    expect(fieldPath({}, problem.segments, 'messages[3]')).toBe('messages[3].id');
    expect(problem.problem).toBe('is required');
    expect(message(schema, [])).toBe('body must be an object');
  });

  test('a valid value has no problem', () => {
    expect(firstProblem(Value.Errors(Type.Integer(), 3))).toBeNull();
  });
});

test('mustBe: one alternative, literals, kinds', () => {
  expect(mustBe(['"x"'])).toBe('must be "x"');
  expect(mustBe(['"x"', '"y"', 'null'])).toBe('must be one of "x", "y" or null');
  expect(mustBe(['a number', 'null'])).toBe('must be a number or null');
});
