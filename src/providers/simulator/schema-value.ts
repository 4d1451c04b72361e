// Builds a value that satisfies a tool's JSON Schema, so simulated tool calls parse and validate,
// in bounded bytes and work.
//
// Covered: type (also arrays such as ["string", "null"]), const, enum, anyOf/oneOf (first branch),
// allOf (merged: bounds the tighter, a property's schemas together), local $ref (#/$defs,
// #/definitions), object properties/required/additionalProperties/minProperties/maxProperties,
// string minLength/maxLength/pattern/format (string-value.ts), integer/number minimum/maximum
// (inclusive and exclusive)/multipleOf, boolean, null, array items/prefixItems/minItems/maxItems/
// uniqueItems. Ignored, because a plausible value rarely needs them: not, if/then, contains,
// propertyNames, patternProperties, dependent*.
//
// The schema is the caller's (CONTRACT §8: generated work is bounded), so `minItems: 1e8`, a
// required recursive `$ref` or a huge enum must cost neither memory nor time. A value is built
// under a budget of bytes (the JSON it prints to) and of steps; a schema that spends it gets its
// smallest instance instead, found by `smallestInstance` under its own bounds, and the chat
// validation refuses a tool whose smallest instance does not fit before the simulator is asked
// (chat/model.ts). What a node costs to read (its type list, required list, allOf merge, $ref walk)
// is worked out once per node.
import type { SeededRandom } from './random.ts';
import { PATTERN_TOO_LONG, stringForFormat, stringForPattern, WORDS } from './string-value.ts';

type Schema = Record<string, unknown>;

/**
 * Nesting bound of one generated value: deeper, the budget counts as spent (and the smallest
 * instance is used).
 */
const SCHEMA_DEPTH_MAX = 16;
/** allOf inside allOf parts (or reached through their $ref), merged this deep at most. */
const ALL_OF_DEPTH_MAX = 16;
/**
 * Below this depth optional properties and extra array items are filled in; deeper only what is
 * required, so optional recursion ends.
 */
const OPTIONAL_DEPTH_MAX = 8;
/**
 * Schema nodes one varied value may visit (about 0.3 µs each: a few ms at most); past it the
 * smallest instance is used.
 */
const GENERATE_STEPS_MAX = 10_000;
/**
 * Schema nodes (and listed items) the smallest-instance search may visit (under 10 ms); a schema
 * that needs more is refused as too complex. Each node of a schema is searched once unless it lies
 * on a recursive cycle, so an ordinary schema of thousands of nodes stays far below it.
 */
const SMALLEST_STEPS_MAX = 20_000;
/**
 * Schema nodes open at once in that search (a chain of $refs); deeper is too complex, not a stack
 * overflow.
 */
const SMALLEST_DEPTH_MAX = 512;
const ARRAY_ITEMS_DEFAULT_MAX = 3;
const UNIQUE_ATTEMPTS_MAX = 8;
/** Width of the range a number gets when the schema bounds only one side (or neither). */
const NUMBER_SPAN_DEFAULT = 100;

/**
 * Thrown inside a generation or search whose bytes or steps are spent; caught at the entry points.
 */
const SPENT = Symbol('schema budget spent');

/**
 * A value valid against `schema` whose JSON is at most `bytesMax` UTF-8 bytes: a varied one when
 * the budget allows, else the schema's smallest instance, else (none fits) `{}`.
 */
export function valueForSchema(schema: unknown, random: SeededRandom, bytesMax: number): unknown {
  const generator = new Generator(isSchema(schema) ? schema : {}, random, bytesMax);
  try {
    const value = generator.generate(schema, 0);
    if (jsonBytesAtMost(value, bytesMax) <= bytesMax) return value;
  } catch (thrown) {
    if (thrown !== SPENT) throw thrown;
  }
  const smallest = smallestInstance(schema, bytesMax);
  return smallest.fits ? smallest.value : {};
}

export type SmallestInstance =
  | { fits: true; value: unknown; bytes: number }
  | { fits: false; reason: 'too_large' | 'too_complex' };

/**
 * Steps the searches of one request may take together (a request may carry 128 tools: each with a
 * budget of its own, they took half a second of the event loop). Made by the caller, passed to
 * each. Steps, not time: the simulator is deterministic for a given request (CONTRACT §7), and a
 * clock would refuse on a busy core a schema it takes on an idle one.
 */
export class SearchBudget {
  constructor(public stepsLeft = SMALLEST_STEPS_MAX) {}

  /** Takes `count` steps; throws SPENT once they are spent. */
  spend(count: number): void {
    this.stepsLeft -= count;
    if (this.stepsLeft < 0) throw SPENT;
  }
}

/** Per schema object: the search runs at validation and again if the generator falls back to it. */
const smallestCache = new WeakMap<object, { bytesMax: number; result: SmallestInstance }>();

/**
 * The smallest instance of `schema` (as the generator reads it) when its JSON fits in `bytesMax`
 * bytes. Bounded work: sizes add up arithmetically (1e8 items are never built), a size past
 * `bytesMax` stops the search, and it visits at most SMALLEST_STEPS_MAX nodes (else `too_complex`).
 */
export function smallestInstance(
  schema: unknown,
  bytesMax: number,
  budget = new SearchBudget(),
): SmallestInstance {
  const key = typeof schema === 'object' && schema !== null ? schema : null;
  const cached = key === null ? undefined : smallestCache.get(key);
  if (cached !== undefined && cached.bytesMax === bytesMax) return cached.result;
  let result: SmallestInstance;
  try {
    const found = new SmallestSearch(isSchema(schema) ? schema : {}, bytesMax, budget).visit(
      schema,
    ).found;
    result =
      found.bytes <= bytesMax
        ? { fits: true, value: found.value, bytes: found.bytes }
        : { fits: false, reason: 'too_large' };
  } catch (thrown) {
    if (thrown !== SPENT) throw thrown;
    result = { fits: false, reason: 'too_complex' };
  }
  if (key !== null) smallestCache.set(key, { bytesMax, result });
  return result;
}

function isSchema(value: unknown): value is Schema {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** An own property only: keywords and property names are request data, never Object.prototype's. */
function own(object: Schema, key: string): unknown {
  return Object.hasOwn(object, key) ? object[key] : undefined;
}

/** Sets `key` as an own field, "__proto__" included (an assignment would replace the prototype). */
function setOwn(object: Record<string, unknown>, key: string, value: unknown): void {
  Object.defineProperty(object, key, {
    value,
    enumerable: true,
    writable: true,
    configurable: true,
  });
}

// ------------------------------------------------------------------------------------------
// What a schema node says, read once per node: a node may be visited thousands of times (the items
// of an array, a $ref target), and its lists may be long (a `type` or `required` of 100,000
// entries).

interface ObjectPlan {
  declared: Schema;
  declaredKeys: string[];
  /** Declared and not required, in order. */
  optionalKeys: string[];
  /** Deduplicated, in order. */
  requiredKeys: string[];
  extraSchema: unknown;
  /** additionalProperties: false. */
  closed: boolean;
  /** propertyBytes of the names used so far. */
  keyBytes: Map<string, number>;
  propertiesMin: number;
  /** maxProperties: optional properties are filled in only up to it. */
  propertiesMax: number;
}

const typeCache = new WeakMap<Schema, string>();
const objectPlanCache = new WeakMap<Schema, ObjectPlan>();
const mergedCache = new WeakMap<Schema, Schema>();
const refCache = new WeakMap<Schema, Map<string, unknown>>();
const distinctChoicesCache = new WeakMap<unknown[], unknown[]>();

function anyOfBranches(schema: Schema): unknown[] | null {
  const anyOf = own(schema, 'anyOf');
  if (Array.isArray(anyOf) && anyOf.length > 0) return anyOf;
  const oneOf = own(schema, 'oneOf');
  if (Array.isArray(oneOf) && oneOf.length > 0) return oneOf;
  return null;
}

/**
 * The type to generate: the first non-null entry of a type list, else inferred from the keywords.
 */
function typeOf(schema: Schema): string {
  let type = typeCache.get(schema);
  if (type === undefined) {
    type = readType(schema);
    typeCache.set(schema, type);
  }
  return type;
}

function readType(schema: Schema): string {
  const type = own(schema, 'type');
  if (typeof type === 'string') return type;
  if (Array.isArray(type)) {
    for (const entry of type) if (entry !== 'null' && typeof entry === 'string') return entry;
    return type.length > 0 ? 'null' : 'string';
  }
  const has = (key: string) => Object.hasOwn(schema, key);
  if (has('properties') || has('required') || has('additionalProperties')) return 'object';
  if (has('items') || has('prefixItems') || has('minItems')) return 'array';
  if (has('minLength') || has('maxLength')) return 'string';
  if (has('minimum') || has('maximum')) return 'number';
  return 'string';
}

/**
 * What a node's object keywords say; `charge` is told the size of its lists before they are read.
 */
function objectPlan(schema: Schema, charge: (count: number) => void): ObjectPlan {
  let plan = objectPlanCache.get(schema);
  if (plan === undefined) {
    const properties = own(schema, 'properties');
    const declared = isSchema(properties) ? properties : {};
    const required = own(schema, 'required');
    // A `required` of 300,000 names is read in full below: it is charged like as many nodes.
    charge(
      (Array.isArray(required) ? required.length : 0) +
        (isSchema(properties) ? Object.keys(properties).length : 0),
    );
    const requiredSet = new Set(
      Array.isArray(required)
        ? required.filter((key): key is string => typeof key === 'string')
        : [],
    );
    const extra = own(schema, 'additionalProperties');
    const propertiesMin = own(schema, 'minProperties');
    const propertiesMax = own(schema, 'maxProperties');
    const declaredKeys = Object.keys(declared);
    plan = {
      declared,
      declaredKeys,
      optionalKeys: declaredKeys.filter((key) => !requiredSet.has(key)),
      requiredKeys: [...requiredSet],
      extraSchema: isSchema(extra) ? extra : true,
      closed: extra === false,
      keyBytes: new Map(),
      propertiesMin: typeof propertiesMin === 'number' ? propertiesMin : 0,
      propertiesMax: typeof propertiesMax === 'number' ? propertiesMax : Number.POSITIVE_INFINITY,
    };
    objectPlanCache.set(schema, plan);
  }
  return plan;
}

function resolveRef(root: Schema, ref: string): unknown {
  let cache = refCache.get(root);
  if (cache === undefined) {
    cache = new Map();
    refCache.set(root, cache);
  }
  if (cache.has(ref)) return cache.get(ref);
  const target = walkPointer(root, ref);
  cache.set(ref, target);
  return target;
}

function walkPointer(root: Schema, ref: string): unknown {
  if (!ref.startsWith('#')) return undefined;
  let node: unknown = root;
  const pointer = ref.slice(1);
  if (pointer.length === 0) return root;
  for (const rawPart of pointer.slice(1).split('/')) {
    let part: string;
    try {
      part = decodeURIComponent(rawPart).replaceAll('~1', '/').replaceAll('~0', '~');
    } catch {
      return undefined; // a malformed percent-escape names nothing
    }
    if (!isSchema(node)) return undefined;
    node = own(node, part);
  }
  return node;
}

/**
 * allOf as one schema, with the allOf and $ref of its parts: required lists are unioned, a
 * property named by several parts gets their schemas as an allOf of its own, lower bounds take the
 * highest, upper bounds the lowest and integer multipleOf their multiple, other keywords the last
 * wins. Each key copied is charged to `step` (the caller's budget): many allOf
 * nodes may name one large part.
 */
function mergeAllOf(schema: Schema, root: Schema, step: (count: number) => void): Schema {
  let merged = mergedCache.get(schema);
  if (merged === undefined) {
    merged = mergeParts(schema, root, step);
    mergedCache.set(schema, merged);
  }
  return merged;
}

function mergeParts(schema: Schema, root: Schema, step: (count: number) => void): Schema {
  const merged: Schema = {};
  const properties: Schema = {};
  const required: unknown[] = [];
  const copy = (
    from: Schema,
    to: Schema,
    combine: (key: string, a: unknown, b: unknown) => unknown,
  ) => {
    for (const key in from) {
      if (!Object.hasOwn(from, key)) continue;
      step(1);
      setOwn(to, key, Object.hasOwn(to, key) ? combine(key, to[key], from[key]) : from[key]);
    }
  };
  // A schema met twice adds nothing new (allOf is idempotent): each is merged once, so parts that
  // refer back to the schema they are part of cost one visit, not one per path.
  const added = new Set<Schema>();
  const addFrom = (part: Schema, depth: number) => {
    if (added.has(part)) return;
    added.add(part);
    copy(part, merged, tighter);
    const partProperties = own(part, 'properties');
    if (isSchema(partProperties)) copy(partProperties, properties, bothSchemas);
    const partRequired = own(part, 'required');
    if (Array.isArray(partRequired)) {
      step(partRequired.length);
      for (const key of partRequired) required.push(key);
    }
    // A part's own $ref and allOf apply as much as its other keywords, and so do theirs (a $ref
    // to a $ref); the depth bound keeps the stack short. The schema's own $ref is not followed
    // here: a schema with one is read through it before its allOf.
    if (depth >= ALL_OF_DEPTH_MAX) return;
    const ref = depth === 0 ? undefined : own(part, '$ref');
    const target = typeof ref === 'string' ? resolveRef(root, ref) : undefined;
    if (isSchema(target)) addFrom(target, depth + 1);
    const parts = own(part, 'allOf');
    if (!Array.isArray(parts)) return;
    for (const nested of parts) {
      step(1);
      if (isSchema(nested)) addFrom(nested, depth + 1);
    }
  };
  addFrom(schema, 0);
  delete merged.allOf;
  delete merged.$ref;
  if (Object.keys(properties).length > 0) merged.properties = properties;
  if (required.length > 0) merged.required = required;
  return merged;
}

const LOWER_BOUNDS = new Set([
  'minimum',
  'exclusiveMinimum',
  'minLength',
  'minItems',
  'minProperties',
]);
const UPPER_BOUNDS = new Set([
  'maximum',
  'exclusiveMaximum',
  'maxLength',
  'maxItems',
  'maxProperties',
]);

/**
 * One keyword named by two allOf parts: what both allow (for a bound, and for two integer
 * multipleOf their least common multiple), else the later one.
 */
function tighter(key: string, earlier: unknown, later: unknown): unknown {
  if (typeof earlier === 'number' && typeof later === 'number') {
    if (LOWER_BOUNDS.has(key)) return Math.max(earlier, later);
    if (UPPER_BOUNDS.has(key)) return Math.min(earlier, later);
    if (key === 'multipleOf' && Number.isInteger(earlier) && Number.isInteger(later)) {
      const multiple = leastCommonMultiple(earlier, later);
      if (Number.isSafeInteger(multiple)) return multiple;
    }
  }
  return later;
}

function leastCommonMultiple(a: number, b: number): number {
  let x = Math.abs(a);
  let y = Math.abs(b);
  while (y !== 0) [x, y] = [y, x % y];
  return x === 0 ? 0 : Math.abs(a / x) * Math.abs(b);
}

/** The allOf schemas bothSchemas made: a third part naming the property joins the list. */
const joinedSchemas = new WeakSet<object>();

/**
 * One property named by two allOf parts: its value must satisfy both schemas. A third one joins
 * the same list (made here, so ours to extend) rather than nesting it, since a merge reads a
 * part's own keys, not the allOf inside it; and joins in place, so n parts cost n, not n².
 */
function bothSchemas(_key: string, earlier: unknown, later: unknown): unknown {
  if (isSchema(earlier) && joinedSchemas.has(earlier)) {
    (earlier.allOf as unknown[]).push(later);
    return earlier;
  }
  const joined = { allOf: [earlier, later] };
  joinedSchemas.add(joined);
  return joined;
}

/**
 * Bytes a property of `plan`'s object adds besides its value: its quoted name, the colon and a
 * comma. Kept per object, so a long name met again (an object on a recursive cycle) is not read
 * again.
 */
function propertyBytes(plan: ObjectPlan, key: string): number {
  let bytes = plan.keyBytes.get(key);
  if (bytes === undefined) {
    bytes = stringJsonBytes(key, Number.POSITIVE_INFINITY) + 2;
    plan.keyBytes.set(key, bytes);
  }
  return bytes;
}

interface ArrayShape {
  prefix: unknown[] | null;
  itemSchema: unknown;
  itemsMin: number;
  itemsMax: number;
}

function arrayShape(schema: Schema): ArrayShape {
  // Draft 2020-12 tuples use prefixItems; older drafts put the tuple in items.
  const prefixItems = own(schema, 'prefixItems');
  const items = own(schema, 'items');
  const prefix = Array.isArray(prefixItems) ? prefixItems : Array.isArray(items) ? items : null;
  const itemSchema: unknown = prefix === null ? (items ?? true) : isSchema(items) ? items : true;
  const minItems = own(schema, 'minItems');
  const maxItems = own(schema, 'maxItems');
  const itemsMin =
    typeof minItems === 'number' && Number.isFinite(minItems)
      ? Math.max(0, Math.ceil(minItems))
      : 0;
  const itemsMax =
    typeof maxItems === 'number' ? Math.max(0, Math.floor(maxItems)) : Number.POSITIVE_INFINITY;
  return { prefix, itemSchema, itemsMin, itemsMax };
}

function stringBounds(schema: Schema): { lengthMin: number; lengthMax: number } {
  const minLength = own(schema, 'minLength');
  const maxLength = own(schema, 'maxLength');
  return {
    lengthMin:
      typeof minLength === 'number' && Number.isFinite(minLength)
        ? Math.max(0, Math.ceil(minLength))
        : 0,
    lengthMax:
      typeof maxLength === 'number' ? Math.max(0, Math.floor(maxLength)) : Number.POSITIVE_INFINITY,
  };
}

/**
 * A string of `schema`'s format or pattern within its lengths, varied with `random`, else the
 * shortest; PATTERN_TOO_LONG when the pattern's shortest string does not fit `charsMax`; null when
 * it has neither, or none covered (the caller then builds words to the lengths). A known format
 * wins: a pattern beside one mostly restates it (`^\\d{4}-\\d{2}-\\d{2}$` with `date`), and
 * digits built for the pattern would rarely make a valid date.
 */
function shapedString(
  schema: Schema,
  random: SeededRandom | null,
  charsMax: number,
  stepsLeft: number,
  charge: (count: number) => void,
): string | typeof PATTERN_TOO_LONG | null {
  const format = own(schema, 'format');
  const pattern = own(schema, 'pattern');
  if (typeof format !== 'string' && typeof pattern !== 'string') return null;
  const { lengthMin, lengthMax } = stringBounds(schema);
  // Grown at most to what can be printed: a minLength of 1e9 must not build a 1 GB string.
  const grownTo = Math.min(lengthMin, charsMax);
  const formatted = typeof format === 'string' ? stringForFormat(format, random, grownTo) : null;
  // Samples of formats are ASCII: a character is a code point.
  if (formatted !== null && formatted.length >= lengthMin && formatted.length <= lengthMax)
    return formatted;
  if (typeof pattern !== 'string') return null;
  return stringForPattern(
    schema,
    pattern,
    random,
    lengthMin,
    lengthMax,
    charsMax,
    stepsLeft,
    charge,
  );
}

interface NumberRange {
  lowInteger: number;
  highInteger: number;
  /** An integer multipleOf, else null. */
  step: number | null;
  low: number;
  high: number;
}

function numberRange(schema: Schema): NumberRange {
  let low = Number.NEGATIVE_INFINITY;
  let high = Number.POSITIVE_INFINITY;
  let lowExclusive = false;
  let highExclusive = false;
  const minimum = own(schema, 'minimum');
  const maximum = own(schema, 'maximum');
  const exclusiveMinimum = own(schema, 'exclusiveMinimum');
  const exclusiveMaximum = own(schema, 'exclusiveMaximum');
  if (typeof minimum === 'number') {
    low = minimum;
    lowExclusive = exclusiveMinimum === true; // draft 4 spelling
  }
  if (typeof exclusiveMinimum === 'number' && exclusiveMinimum >= low) {
    low = exclusiveMinimum;
    lowExclusive = true;
  }
  if (typeof maximum === 'number') {
    high = maximum;
    highExclusive = exclusiveMaximum === true;
  }
  if (typeof exclusiveMaximum === 'number' && exclusiveMaximum <= high) {
    high = exclusiveMaximum;
    highExclusive = true;
  }
  if (!Number.isFinite(low) && !Number.isFinite(high)) {
    low = 0;
    high = NUMBER_SPAN_DEFAULT;
  } else if (!Number.isFinite(low)) low = high - NUMBER_SPAN_DEFAULT;
  else if (!Number.isFinite(high)) high = low + NUMBER_SPAN_DEFAULT;
  // Integers are valid numbers too, and they avoid float rounding at the edges of the range.
  const lowInteger = lowExclusive ? Math.floor(low) + 1 : Math.ceil(low);
  const highInteger = highExclusive ? Math.ceil(high) - 1 : Math.floor(high);
  const multipleOf = own(schema, 'multipleOf');
  const step =
    typeof multipleOf === 'number' && multipleOf > 0 && Number.isInteger(multipleOf)
      ? multipleOf
      : null;
  return { lowInteger, highInteger, step, low, high };
}

/** The number of `schema`'s range with the shortest text: the one nearest zero. */
function smallestNumber(schema: Schema, integer: boolean): number {
  const { lowInteger, highInteger, step, low, high } = numberRange(schema);
  const unit = step ?? 1;
  const lowStep = Math.ceil(lowInteger / unit);
  const highStep = Math.floor(highInteger / unit);
  if (lowStep > highStep)
    return step !== null ? lowStep * step : integer ? lowInteger : (low + high) / 2;
  if (lowStep > 0) return lowStep * unit;
  if (highStep < 0) return highStep * unit;
  return 0;
}

/**
 * UTF-8 bytes of `JSON.stringify(value)` for a JSON value (what JSON.parse gives), without building
 * it; once the count passes `cap` it stops and returns a number above `cap`.
 */
function jsonBytesAtMost(value: unknown, cap: number): number {
  if (value === null || value === undefined) return 4;
  switch (typeof value) {
    case 'boolean':
      return value ? 4 : 5;
    case 'number':
      return Number.isFinite(value) ? String(value).length : 4;
    case 'string':
      return stringJsonBytes(value, cap);
    case 'object':
      break;
    default:
      return 4;
  }
  let bytes = 2;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length && bytes <= cap; i++)
      bytes += (i > 0 ? 1 : 0) + jsonBytesAtMost(value[i], cap - bytes);
    return bytes;
  }
  let first = true;
  for (const key in value) {
    if (!Object.hasOwn(value, key)) continue;
    if (bytes > cap) break;
    bytes += (first ? 0 : 1) + stringJsonBytes(key, cap - bytes) + 1;
    bytes += jsonBytesAtMost((value as Record<string, unknown>)[key], cap - bytes);
    first = false;
  }
  return bytes;
}

function stringJsonBytes(text: string, cap: number): number {
  let bytes = 2;
  for (let i = 0; i < text.length && bytes <= cap; i++) {
    const code = text.charCodeAt(i);
    if (code === 0x22 || code === 0x5c) bytes += 2;
    else if (code < 0x20)
      bytes +=
        code === 0x08 || code === 0x09 || code === 0x0a || code === 0x0c || code === 0x0d ? 2 : 6;
    else if (code < 0x80) bytes += 1;
    else if (code < 0x800) bytes += 2;
    else if (
      code >= 0xd800 &&
      code <= 0xdbff &&
      i + 1 < text.length &&
      (text.charCodeAt(i + 1) & 0xfc00) === 0xdc00
    ) {
      bytes += 4;
      i++;
    } else if (code >= 0xd800 && code <= 0xdfff)
      bytes += 6; // a lone surrogate prints as \uXXXX
    else bytes += 3;
  }
  return bytes;
}

// ------------------------------------------------------------------------------------------
// The varied value: the first branch of a union, every declared property, 1-3 items, random words
// and numbers; every byte it will print is charged before it is built.

class Generator {
  private bytesLeft: number;
  private stepsLeft = GENERATE_STEPS_MAX;
  private readonly root: Schema;
  private readonly random: SeededRandom;

  constructor(root: Schema, random: SeededRandom, bytesMax: number) {
    this.root = root;
    this.random = random;
    this.bytesLeft = bytesMax;
  }

  private spend(bytes: number): void {
    this.bytesLeft -= bytes;
    if (this.bytesLeft < 0) throw SPENT;
  }

  private readonly charge = (count: number): void => {
    this.stepsLeft -= count;
    if (this.stepsLeft < 0) throw SPENT;
  };

  /** Charges `value`'s JSON (a const or enum member may be large) and returns it. */
  private spendValue(value: unknown): unknown {
    this.spend(jsonBytesAtMost(value, this.bytesLeft));
    return value;
  }

  generate(schema: unknown, depth: number): unknown {
    if (--this.stepsLeft < 0 || depth > SCHEMA_DEPTH_MAX) throw SPENT;
    // nothing validates; any answer is as good as another
    if (schema === false) return this.spendValue(null);
    if (!isSchema(schema)) return this.spendValue(this.random.pick(WORDS));

    const ref = own(schema, '$ref');
    if (typeof ref === 'string') {
      const target = resolveRef(this.root, ref);
      if (target !== undefined) return this.generate(target, depth + 1);
    }
    if (Object.hasOwn(schema, 'const')) return this.spendValue(schema.const);
    const choices = own(schema, 'enum');
    if (Array.isArray(choices) && choices.length > 0)
      return this.spendValue(this.random.pick(choices));
    const branches = anyOfBranches(schema);
    if (branches) return this.generate(branches[0], depth + 1);
    const allOf = own(schema, 'allOf');
    if (Array.isArray(allOf) && allOf.length > 0)
      return this.generate(mergeAllOf(schema, this.root, this.charge), depth + 1);

    switch (typeOf(schema)) {
      case 'object':
        return this.object(schema, depth);
      case 'array':
        return this.array(schema, depth);
      case 'string':
        return this.string(schema);
      case 'integer':
        return this.spendValue(this.number(schema, true));
      case 'number':
        return this.spendValue(this.number(schema, false));
      case 'boolean':
        return this.spendValue(this.random.next() < 0.5);
      case 'null':
        return this.spendValue(null);
      default:
        return this.spendValue(this.random.pick(WORDS));
    }
  }

  private object(schema: Schema, depth: number): Record<string, unknown> {
    const plan = objectPlan(schema, this.charge);
    this.spend(2);
    const result: Record<string, unknown> = {};
    const add = (key: string, propertySchema: unknown) => {
      this.spend(propertyBytes(plan, key));
      setOwn(result, key, this.generate(propertySchema, depth + 1));
    };
    // Every declared property is filled in, optional ones too (that shows the shape), as far as
    // maxProperties allows and down to OPTIONAL_DEPTH_MAX; deeper only the required ones, so an
    // optional recursion ends.
    for (const key of plan.requiredKeys)
      add(key, Object.hasOwn(plan.declared, key) ? plan.declared[key] : plan.extraSchema);
    if (depth < OPTIONAL_DEPTH_MAX) {
      let count = plan.requiredKeys.length;
      for (const key of plan.optionalKeys) {
        if (count >= plan.propertiesMax) break;
        add(key, plan.declared[key]);
        count++;
      }
    }
    if (!plan.closed) {
      let count = Object.keys(result).length;
      for (let n = count; count < plan.propertiesMin; n++) {
        const key = `field_${n}`;
        if (Object.hasOwn(result, key)) continue; // a declared field_<n> already counts
        add(key, plan.extraSchema);
        count++;
      }
    }
    return result;
  }

  private array(schema: Schema, depth: number): unknown[] {
    const { prefix, itemSchema, itemsMin, itemsMax } = arrayShape(schema);
    let count =
      prefix !== null
        ? prefix.length
        : depth < OPTIONAL_DEPTH_MAX
          ? this.random.integer(1, ARRAY_ITEMS_DEFAULT_MAX)
          : 0;
    count = Math.min(Math.max(count, itemsMin), itemsMax);
    // Each item prints at least one byte and a comma: a count the bytes cannot hold is spent before
    // any is built.
    if (2 * count > this.bytesLeft + 1) throw SPENT;
    this.spend(2);
    const seen = own(schema, 'uniqueItems') === true ? new Set<string>() : null;
    const result: unknown[] = [];
    for (let i = 0; i < count; i++) {
      const itemSchemaAt = prefix !== null && i < prefix.length ? prefix[i] : itemSchema;
      const bytesBefore = this.bytesLeft;
      if (i > 0) this.spend(1);
      const bytesAfterComma = this.bytesLeft;
      let value = this.generate(itemSchemaAt, depth + 1);
      if (seen) {
        let attempts = 0;
        while (seen.has(JSON.stringify(value)) && attempts++ < UNIQUE_ATTEMPTS_MAX) {
          this.bytesLeft = bytesAfterComma; // a discarded value prints nothing
          value = this.generate(itemSchemaAt, depth + 1);
        }
        const key = JSON.stringify(value);
        // Too few distinct values exist (a two-value enum, say): stop short rather than repeat one.
        if (seen.has(key)) {
          this.bytesLeft = bytesBefore;
          break;
        }
        seen.add(key);
      }
      result.push(value);
    }
    return result;
  }

  private string(schema: Schema): string {
    const shaped = shapedString(schema, this.random, this.bytesLeft, this.stepsLeft, this.charge);
    // Too long for what is left: the value falls back to the smallest instance, which fits.
    if (shaped === PATTERN_TOO_LONG) throw SPENT;
    if (shaped !== null) {
      this.spend(stringJsonBytes(shaped, this.bytesLeft));
      return shaped;
    }
    const { lengthMin, lengthMax } = stringBounds(schema);
    const length = Math.min(lengthMin, lengthMax);
    // Words are ASCII, so the JSON is the length and two quotes: the minimum is charged before it
    // is built.
    this.spend(length + 2);
    let text = this.random.pick(WORDS);
    while (text.length < lengthMin) text += ` ${this.random.pick(WORDS)}`;
    if (text.length > lengthMax) text = text.slice(0, lengthMax);
    this.spend(text.length - length);
    return text;
  }

  private number(schema: Schema, integer: boolean): number {
    const { lowInteger, highInteger, step, low, high } = numberRange(schema);
    if (step !== null) {
      const lowStep = Math.ceil(lowInteger / step);
      const highStep = Math.floor(highInteger / step);
      if (lowStep <= highStep) return this.random.integer(lowStep, highStep) * step;
      return lowStep * step;
    }
    if (lowInteger <= highInteger) return this.random.integer(lowInteger, highInteger);
    // No integer fits (integer schemas cannot reach here unless the schema is contradictory).
    return integer ? lowInteger : (low + high) / 2;
  }
}

// ------------------------------------------------------------------------------------------
// The smallest instance: required properties only, minItems items, the shortest string and number,
// the smallest union branch and enum member.

/**
 * An instance and its JSON bytes; bytes above the limit mean "none that fits" (the value is then
 * meaningless).
 */
interface Found {
  value: unknown;
  bytes: number;
}

const NONE: Found = { value: null, bytes: Number.POSITIVE_INFINITY };

interface Visit {
  found: Found;
  /** The lowest stack index of an unfinished node this result depended on; Infinity when none. */
  lowest: number;
}

const NO_CYCLE = Number.POSITIVE_INFINITY;

/**
 * A node's result is cached unless it depended on a node still open above it (a recursive $ref).
 * Meeting an open node counts as "no instance": exact for the node that opened the cycle (its
 * smallest instance never contains another instance of itself, which would be smaller still), not
 * for the nodes between, which are therefore searched again when met from elsewhere.
 */
class SmallestSearch {
  private readonly cache = new Map<object, Found>();
  private readonly open = new Map<object, number>();
  private readonly root: Schema;
  private readonly bytesMax: number;
  private readonly budget: SearchBudget;

  constructor(root: Schema, bytesMax: number, budget: SearchBudget) {
    this.root = root;
    this.bytesMax = bytesMax;
    this.budget = budget;
  }

  private step(count = 1): void {
    this.budget.spend(count);
  }

  private readonly charge = (count: number): void => this.step(count);

  visit(schema: unknown): Visit {
    this.step();
    if (!isSchema(schema))
      return {
        found: schema === false ? { value: null, bytes: 4 } : { value: '', bytes: 2 },
        lowest: NO_CYCLE,
      };
    const cached = this.cache.get(schema);
    if (cached !== undefined) return { found: cached, lowest: NO_CYCLE };
    const openAt = this.open.get(schema);
    if (openAt !== undefined) return { found: NONE, lowest: openAt };
    const depth = this.open.size;
    if (depth >= SMALLEST_DEPTH_MAX) throw SPENT;
    this.open.set(schema, depth);
    const result = this.smallest(schema);
    this.open.delete(schema);
    if (result.lowest < depth) return result;
    this.cache.set(schema, result.found);
    return { found: result.found, lowest: NO_CYCLE };
  }

  private leaf(value: unknown): Visit {
    return { found: { value, bytes: jsonBytesAtMost(value, this.bytesMax) }, lowest: NO_CYCLE };
  }

  private smallest(schema: Schema): Visit {
    const ref = own(schema, '$ref');
    if (typeof ref === 'string') {
      const target = resolveRef(this.root, ref);
      if (target !== undefined) return this.visit(target);
    }
    if (Object.hasOwn(schema, 'const')) return this.leaf(schema.const);
    const choices = own(schema, 'enum');
    if (Array.isArray(choices) && choices.length > 0)
      return { found: this.smallestChoice(choices), lowest: NO_CYCLE };
    const branches = anyOfBranches(schema);
    if (branches) {
      let best = NONE;
      let lowest = NO_CYCLE;
      for (const branch of branches) {
        const next = this.visit(branch);
        lowest = Math.min(lowest, next.lowest);
        if (next.found.bytes < best.bytes) best = next.found;
      }
      return { found: best, lowest };
    }
    const allOf = own(schema, 'allOf');
    if (Array.isArray(allOf) && allOf.length > 0)
      return this.visit(mergeAllOf(schema, this.root, this.charge));
    switch (typeOf(schema)) {
      case 'object':
        return this.object(schema);
      case 'array':
        return this.array(schema);
      case 'string': {
        const shaped = shapedString(
          schema,
          null,
          this.bytesMax,
          this.budget.stepsLeft,
          this.charge,
        );
        if (shaped === PATTERN_TOO_LONG) return { found: NONE, lowest: NO_CYCLE };
        if (shaped !== null) return this.leaf(shaped);
        const { lengthMin, lengthMax } = stringBounds(schema);
        const length = Math.min(lengthMin, lengthMax);
        if (length + 2 > this.bytesMax) return { found: NONE, lowest: NO_CYCLE };
        return this.leaf('x'.repeat(length));
      }
      case 'integer':
        return this.leaf(smallestNumber(schema, true));
      case 'number':
        return this.leaf(smallestNumber(schema, false));
      case 'boolean':
        return this.leaf(true);
      case 'null':
        return this.leaf(null);
      default:
        return this.leaf('');
    }
  }

  /**
   * The shortest enum member. Enum nodes are leaves, so each is read once however often it is met.
   */
  private smallestChoice(choices: unknown[]): Found {
    // Every member is measured: an enum of 600,000 members is charged like as many nodes.
    this.step(choices.length);
    let best = NONE;
    for (const choice of choices) {
      const bytes = jsonBytesAtMost(choice, Math.min(best.bytes, this.bytesMax));
      if (bytes < best.bytes) best = { value: choice, bytes };
    }
    return best;
  }

  private object(schema: Schema): Visit {
    const plan = objectPlan(schema, this.charge);
    const value: Record<string, unknown> = {};
    let bytes = 2;
    let count = 0;
    let lowest = NO_CYCLE;
    const add = (key: string, propertySchema: unknown): boolean => {
      const next = this.visit(propertySchema);
      lowest = Math.min(lowest, next.lowest);
      // propertyBytes counts a comma after each property; the first has none before it.
      bytes += (count++ === 0 ? -1 : 0) + propertyBytes(plan, key) + next.found.bytes;
      setOwn(value, key, next.found.value);
      return bytes <= this.bytesMax;
    };
    for (const key of plan.requiredKeys) {
      if (!add(key, Object.hasOwn(plan.declared, key) ? plan.declared[key] : plan.extraSchema))
        return { found: NONE, lowest };
    }
    // minProperties: `field_<n>` names when extra properties are allowed, else the declared
    // optional ones.
    const optional = plan.optionalKeys;
    for (let n = 0; count < plan.propertiesMin; n++) {
      this.step();
      let key: string;
      if (plan.closed) {
        if (n >= optional.length) break; // no instance has that many; the generator stops short too
        key = optional[n]!;
      } else {
        key = `field_${n}`;
        if (Object.hasOwn(value, key)) continue;
      }
      if (!add(key, plan.closed ? plan.declared[key] : plan.extraSchema))
        return { found: NONE, lowest };
    }
    return { found: { value, bytes }, lowest };
  }

  private array(schema: Schema): Visit {
    const { prefix, itemSchema, itemsMin, itemsMax } = arrayShape(schema);
    const count = Math.min(itemsMin, itemsMax);
    const value: unknown[] = [];
    let bytes = 2;
    let lowest = NO_CYCLE;
    const prefixCount = prefix === null ? 0 : Math.min(prefix.length, count);
    for (let i = 0; i < prefixCount; i++) {
      const next = this.visit(prefix![i]);
      lowest = Math.min(lowest, next.lowest);
      bytes += (i > 0 ? 1 : 0) + next.found.bytes;
      if (bytes > this.bytesMax) return { found: NONE, lowest };
      value.push(next.found.value);
    }
    const rest = count - prefixCount;
    if (rest === 0) return { found: { value, bytes }, lowest };
    // Each further item is at least one byte and a comma: a count the limit cannot hold is refused
    // at once.
    if (bytes + 2 * rest - 1 > this.bytesMax) return { found: NONE, lowest };
    const commaBefore = prefixCount > 0 ? 1 : 0;
    if (own(schema, 'uniqueItems') === true && rest > 1) {
      const distinct = this.distinctItems(itemSchema, rest, this.bytesMax - bytes - commaBefore);
      if (distinct === null) return { found: NONE, lowest };
      for (const item of distinct.values) value.push(item);
      return {
        found: {
          value,
          bytes: bytes + (distinct.values.length > 0 ? commaBefore + distinct.bytes : 0),
        },
        lowest,
      };
    }
    const next = this.visit(itemSchema);
    lowest = Math.min(lowest, next.lowest);
    bytes += commaBefore + rest * (next.found.bytes + 1) - 1;
    if (bytes > this.bytesMax) return { found: NONE, lowest };
    for (let i = 0; i < rest; i++) value.push(next.found.value);
    return { found: { value, bytes }, lowest };
  }

  /**
   * Up to `count` distinct small items for uniqueItems and their bytes with the commas between
   * them; null when they cannot fit in `bytesLeft`. Enumerable kinds (enum, boolean, integers,
   * strings, null) are listed smallest first, and fewer distinct values than asked stops short, as
   * the generator does; any other kind repeats its smallest instance, a size distinct ones rarely
   * undercut.
   */
  private distinctItems(
    itemSchema: unknown,
    count: number,
    bytesLeft: number,
  ): { values: unknown[]; bytes: number } | null {
    const candidates = this.distinctCandidates(itemSchema, count);
    if (candidates === null) {
      const next = this.visit(itemSchema).found;
      const bytes = count * (next.bytes + 1) - 1;
      return bytes <= bytesLeft ? { values: new Array(count).fill(next.value), bytes } : null;
    }
    let bytes = -1;
    for (const item of candidates) {
      this.step();
      bytes += 1 + jsonBytesAtMost(item, bytesLeft);
      if (bytes > bytesLeft) return null;
    }
    return { values: candidates, bytes: Math.max(bytes, 0) };
  }

  /**
   * At most `count` distinct instances, smallest first, for the kinds that can be listed; null for
   * the others.
   */
  private distinctCandidates(itemSchema: unknown, count: number): unknown[] | null {
    let target = itemSchema;
    const ref = isSchema(target) ? own(target, '$ref') : undefined;
    if (typeof ref === 'string') target = resolveRef(this.root, ref);
    if (!isSchema(target) || Object.hasOwn(target, 'const')) return null;
    const choices = own(target, 'enum');
    if (Array.isArray(choices) && choices.length > 0) {
      // Serialized, deduplicated and sorted once (cached), charged each time like as many nodes.
      this.step(choices.length);
      return distinctChoices(choices).slice(0, count);
    }
    if (anyOfBranches(target) !== null || own(target, 'allOf') !== undefined) return null;
    const type = typeOf(target);
    if (type === 'boolean') return [true, false].slice(0, count);
    if (type === 'null') return [null];
    if (type === 'integer' || type === 'number') {
      const { lowInteger, highInteger, step } = numberRange(target);
      const unit = step ?? 1;
      const start = smallestNumber(target, type === 'integer');
      const values: number[] = [];
      // Nearest zero first, then outwards within the range.
      for (let k = 0; values.length < count && k <= 2 * count + 2; k++) {
        const item = start + (k % 2 === 1 ? ((k + 1) / 2) * unit : -(k / 2) * unit);
        if (item >= lowInteger && item <= highInteger) values.push(item);
      }
      return values;
    }
    if (type === 'string') {
      // A pattern's or format's strings are not listed: the smallest one repeats.
      if (own(target, 'pattern') !== undefined || own(target, 'format') !== undefined) return null;
      const { lengthMin, lengthMax } = stringBounds(target);
      const values: string[] = [];
      for (let n = 0; values.length < count; n++) {
        const id = n.toString(36);
        const length = Math.max(lengthMin, id.length);
        if (length > lengthMax) break; // no more distinct strings fit the length: stop short
        values.push(id.padStart(length, '0'));
      }
      return values;
    }
    return null;
  }
}

/** An enum's distinct members, shortest JSON first; worked out once per enum. */
function distinctChoices(choices: unknown[]): unknown[] {
  let sorted = distinctChoicesCache.get(choices);
  if (sorted === undefined) {
    const byText = new Map<string, { choice: unknown; bytes: number }>();
    for (const choice of choices) {
      const text = JSON.stringify(choice);
      if (!byText.has(text)) byText.set(text, { choice, bytes: Buffer.byteLength(text) });
    }
    sorted = [...byText.values()].sort((a, b) => a.bytes - b.bytes).map((entry) => entry.choice);
    distinctChoicesCache.set(choices, sorted);
  }
  return sorted;
}
