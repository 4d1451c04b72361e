// Turns the first TypeBox error into words that name the field and the bound ("temperature must be
// ≤ 2").
import { Kind, type TSchema } from '@sinclair/typebox';
import { type ValueError, type ValueErrorIterator, ValueErrorType } from '@sinclair/typebox/errors';

/** How much of a client's string an error message quotes back: enough to recognise it. */
const QUOTED_CHARS_MAX = 128;

/**
 * `text` in JSON quotes for an error message, cut after QUOTED_CHARS_MAX characters: an error must
 * not echo the megabytes a client sent as a model name or an id.
 */
export function quoted(text: string): string {
  if (text.length <= QUOTED_CHARS_MAX) return JSON.stringify(text);
  return `${JSON.stringify(text.slice(0, QUOTED_CHARS_MAX))}… (${text.length} characters)`;
}

/** One problem of a value: where it is and what is wrong there. */
export interface FieldProblem {
  /** Path segments from the root, JSON-pointer escapes undone; empty for the root itself. */
  segments: string[];
  /** What the field must be, without the field's name: "must be ≤ 2", "is required". */
  problem: string;
  /** The offending value (undefined for a missing field). */
  value: unknown;
}

/**
 * The first error of `errors`, in words. TypeBox reports a union as "Expected union value"; this
 * descends into the branch the value was meant for (the one whose kind and discriminating literals
 * it matches, e.g. the number branch of `Nullable(Number)` for 5), so the bound of that branch is
 * what gets named.
 */
export function firstProblem(errors: ValueErrorIterator): FieldProblem | null {
  const first = errors.First();
  return first === undefined ? null : describe(first);
}

/**
 * `segments` as a field path: `messages[2].tool_call_id`; array indexes in brackets (decided by
 * `root`'s shape).
 */
export function fieldPath(root: unknown, segments: readonly string[], prefix = ''): string {
  let out = prefix;
  let node: unknown = root;
  for (const segment of segments) {
    if (Array.isArray(node)) {
      out += `[${segment}]`;
      node = node[Number(segment)];
    } else {
      out += out === '' ? segment : `.${segment}`;
      node = isPlainObject(node) && Object.hasOwn(node, segment) ? node[segment] : undefined;
    }
  }
  return out;
}

/**
 * What a value that missed every alternative must be: `must be one of "a", "b" or null` when they
 * are all literal values, `must be a number or null` when some are kinds.
 */
export function mustBe(alternatives: readonly string[]): string {
  if (alternatives.length === 1) return `must be ${alternatives[0]}`;
  const listed = `${alternatives.slice(0, -1).join(', ')} or ${alternatives.at(-1)}`;
  return alternatives.every(isLiteralText) ? `must be one of ${listed}` : `must be ${listed}`;
}

function isLiteralText(text: string): boolean {
  return (
    text.startsWith('"') ||
    text === 'null' ||
    text === 'true' ||
    text === 'false' ||
    /^-?\d/.test(text)
  );
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function segmentsOf(pointer: string): string[] {
  if (pointer === '') return [];
  return pointer
    .slice(1)
    .split('/')
    .map((part) => part.replaceAll('~1', '/').replaceAll('~0', '~'));
}

function describe(error: ValueError): FieldProblem {
  if (error.type === ValueErrorType.Union) return describeUnion(error);
  return { segments: segmentsOf(error.path), problem: problemOf(error), value: error.value };
}

function describeUnion(error: ValueError): FieldProblem {
  const branches = (error.schema.anyOf ?? []) as TSchema[];
  const inBranch = (index: number): FieldProblem | null => {
    const inner = index < 0 ? undefined : error.errors[index]?.First();
    return inner === undefined ? null : describe(inner);
  };
  const meant = inBranch(branches.findIndex((branch) => fits(branch, error.value, true)));
  if (meant !== null) return meant;
  const segments = segmentsOf(error.path);
  // Objects told apart by a literal field (a provider's `type`): name that field and its choices.
  const discriminator = isPlainObject(error.value) ? sharedLiteralKey(branches) : null;
  if (discriminator !== null) {
    const literals = branches.map((branch) =>
      JSON.stringify(branch.properties[discriminator].const),
    );
    const value = Object.hasOwn(error.value as object, discriminator)
      ? (error.value as Record<string, unknown>)[discriminator]
      : undefined;
    return { segments: [...segments, discriminator], problem: mustBe(literals), value };
  }
  // The right kind with a wrong or missing literal field (tool_choice {"function": ...} without its
  // type).
  const sameKind = inBranch(branches.findIndex((branch) => fits(branch, error.value, false)));
  if (sameKind !== null) return sameKind;
  return { segments, problem: mustBe(branches.flatMap(alternativesOf)), value: error.value };
}

/**
 * Whether `value` is of the kind `schema` describes, so that schema's own error is the one to
 * report; `strict` also asks an object's literal fields (a discriminator such as `type`) to match.
 */
function fits(schema: TSchema, value: unknown, strict: boolean): boolean {
  switch (schema[Kind]) {
    case 'Literal':
      return value === schema.const;
    case 'Null':
      return value === null;
    case 'String':
      return typeof value === 'string';
    case 'Number':
    case 'Integer':
      return typeof value === 'number';
    case 'Boolean':
      return typeof value === 'boolean';
    case 'Array':
    case 'Tuple':
      return Array.isArray(value);
    case 'Record':
      return isPlainObject(value);
    case 'Object':
      return isPlainObject(value) && (!strict || literalsMatch(schema, value));
    case 'Union':
      return (schema.anyOf as TSchema[]).some((branch) => fits(branch, value, strict));
    default:
      return true;
  }
}

/**
 * An object's literal fields (a `type` discriminator) that the value carries must hold those
 * literals.
 */
function literalsMatch(schema: TSchema, value: Record<string, unknown>): boolean {
  for (const key of Object.keys(schema.properties)) {
    const property = schema.properties[key] as TSchema;
    if (property[Kind] !== 'Literal') continue;
    if (
      Object.hasOwn(value, key)
        ? value[key] !== property.const
        : (schema.required ?? []).includes(key)
    )
      return false;
  }
  return true;
}

/**
 * The literal-typed field every branch has, when all branches are objects (a discriminated union).
 */
function sharedLiteralKey(branches: TSchema[]): string | null {
  if (branches.length === 0 || !branches.every((branch) => branch[Kind] === 'Object')) return null;
  for (const key of Object.keys(branches[0]!.properties)) {
    if (
      branches.every(
        (branch) =>
          Object.hasOwn(branch.properties, key) && branch.properties[key][Kind] === 'Literal',
      )
    )
      return key;
  }
  return null;
}

function alternativesOf(schema: TSchema): string[] {
  switch (schema[Kind]) {
    case 'Literal':
      return [JSON.stringify(schema.const)];
    case 'Null':
      return ['null'];
    case 'String':
      return ['a string'];
    case 'Number':
      return ['a number'];
    case 'Integer':
      return ['an integer'];
    case 'Boolean':
      return ['a boolean'];
    case 'Array':
    case 'Tuple':
      return ['an array'];
    case 'Object':
    case 'Record':
      return ['an object'];
    case 'Union':
      return (schema.anyOf as TSchema[]).flatMap(alternativesOf);
    default:
      return ['a valid value'];
  }
}

function plural(count: number, noun: string): string {
  return `${count} ${noun}${count === 1 ? '' : 's'}`;
}

// One case per TypeBox error kind, long because the table is flat; each case is one sentence.
function problemOf(error: ValueError): string {
  const { schema } = error;
  switch (error.type) {
    case ValueErrorType.NumberMaximum:
    case ValueErrorType.IntegerMaximum:
      return `must be ≤ ${schema.maximum}`;
    case ValueErrorType.NumberMinimum:
    case ValueErrorType.IntegerMinimum:
      return `must be ≥ ${schema.minimum}`;
    case ValueErrorType.NumberExclusiveMaximum:
    case ValueErrorType.IntegerExclusiveMaximum:
      return `must be < ${schema.exclusiveMaximum}`;
    case ValueErrorType.NumberExclusiveMinimum:
    case ValueErrorType.IntegerExclusiveMinimum:
      return `must be > ${schema.exclusiveMinimum}`;
    case ValueErrorType.NumberMultipleOf:
    case ValueErrorType.IntegerMultipleOf:
      return `must be a multiple of ${schema.multipleOf}`;
    case ValueErrorType.Integer:
      return 'must be an integer';
    case ValueErrorType.Number:
      return 'must be a number';
    case ValueErrorType.String:
      return 'must be a string';
    case ValueErrorType.Boolean:
      return 'must be true or false';
    case ValueErrorType.Null:
      return 'must be null';
    case ValueErrorType.Literal:
      return `must be ${JSON.stringify(schema.const)}`;
    case ValueErrorType.StringMinLength:
      return schema.minLength === 1
        ? 'must not be empty'
        : `must be at least ${plural(schema.minLength, 'character')}`;
    case ValueErrorType.StringMaxLength:
      return `must be at most ${plural(schema.maxLength, 'character')}`;
    case ValueErrorType.StringPattern:
      return `must match ${schema.pattern}`;
    case ValueErrorType.StringFormat:
      return `must be a valid ${schema.format}`;
    case ValueErrorType.Array:
      return 'must be an array';
    case ValueErrorType.ArrayMinItems:
      return `must have at least ${plural(schema.minItems, 'item')}`;
    case ValueErrorType.ArrayMaxItems:
      return `must have at most ${plural(schema.maxItems, 'item')}`;
    case ValueErrorType.ArrayUniqueItems:
      return 'must not repeat an item';
    case ValueErrorType.Object:
      return 'must be an object';
    case ValueErrorType.ObjectRequiredProperty:
      return 'is required';
    case ValueErrorType.ObjectAdditionalProperties:
      return schema[Kind] === 'Record'
        ? `is not an allowed name (names must match ${Object.keys(schema.patternProperties)[0]})`
        : 'is not a known field';
    case ValueErrorType.ObjectMinProperties:
      return `must have at least ${plural(schema.minProperties, 'field')}`;
    case ValueErrorType.ObjectMaxProperties:
      return `must have at most ${plural(schema.maxProperties, 'field')}`;
    default:
      return error.message;
  }
}
