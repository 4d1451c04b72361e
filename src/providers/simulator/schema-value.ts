// Builds a value that satisfies a tool's JSON Schema, so simulated tool calls parse and validate.
//
// Covered: type (also arrays such as ["string", "null"]), const, enum, anyOf/oneOf (first branch),
// allOf (merged), local $ref (#/$defs, #/definitions), object properties/required/
// additionalProperties/minProperties, string minLength/maxLength, integer/number minimum/maximum
// (inclusive and exclusive)/multipleOf, boolean, null, array items/prefixItems/minItems/maxItems/
// uniqueItems. Ignored, because a plausible value rarely needs them: format, pattern, not, if/then.
import type { SeededRandom } from './random.ts';

type Schema = Record<string, unknown>;

/** Nesting bound: a recursive $ref must not recurse forever. */
const SCHEMA_DEPTH_MAX = 16;
const ARRAY_ITEMS_DEFAULT_MAX = 3;
const UNIQUE_ATTEMPTS_MAX = 8;
/** Width of the range a number gets when the schema bounds only one side (or neither). */
const NUMBER_SPAN_DEFAULT = 100;

const WORDS = ['alpha', 'bravo', 'delta', 'echo', 'river', 'stone', 'maple', 'cedar', 'amber', 'coral'];

export function valueForSchema(schema: unknown, random: SeededRandom): unknown {
  return generate(schema, isSchema(schema) ? schema : {}, random, 0);
}

function isSchema(value: unknown): value is Schema {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function generate(schema: unknown, root: Schema, random: SeededRandom, depth: number): unknown {
  if (schema === false) return null; // nothing validates; any answer is as good as another
  if (!isSchema(schema)) return random.pick(WORDS);
  if (depth > SCHEMA_DEPTH_MAX) return null;

  if (typeof schema.$ref === 'string') {
    const target = resolveRef(root, schema.$ref);
    if (target !== undefined) return generate(target, root, random, depth + 1);
  }
  if ('const' in schema) return schema.const;
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return random.pick(schema.enum);
  const branches = Array.isArray(schema.anyOf) ? schema.anyOf : Array.isArray(schema.oneOf) ? schema.oneOf : null;
  if (branches && branches.length > 0) return generate(branches[0], root, random, depth + 1);
  if (Array.isArray(schema.allOf) && schema.allOf.length > 0) {
    return generate(mergeAllOf(schema, root), root, random, depth + 1);
  }

  switch (typeOf(schema)) {
    case 'object':
      return generateObject(schema, root, random, depth);
    case 'array':
      return generateArray(schema, root, random, depth);
    case 'string':
      return generateString(schema, random);
    case 'integer':
      return generateNumber(schema, random, true);
    case 'number':
      return generateNumber(schema, random, false);
    case 'boolean':
      return random.next() < 0.5;
    case 'null':
      return null;
    default:
      return random.pick(WORDS);
  }
}

/** The type to generate: the first non-null entry of a type list, else inferred from the keywords. */
function typeOf(schema: Schema): string {
  const type = schema.type;
  if (typeof type === 'string') return type;
  if (Array.isArray(type)) {
    for (const entry of type) if (entry !== 'null' && typeof entry === 'string') return entry;
    return type.length > 0 ? 'null' : 'string';
  }
  if ('properties' in schema || 'required' in schema || 'additionalProperties' in schema) return 'object';
  if ('items' in schema || 'prefixItems' in schema || 'minItems' in schema) return 'array';
  if ('minLength' in schema || 'maxLength' in schema) return 'string';
  if ('minimum' in schema || 'maximum' in schema) return 'number';
  return 'string';
}

function resolveRef(root: Schema, ref: string): unknown {
  if (!ref.startsWith('#')) return undefined;
  let node: unknown = root;
  const pointer = ref.slice(1);
  if (pointer.length === 0) return root;
  for (const rawPart of pointer.slice(1).split('/')) {
    const part = decodeURIComponent(rawPart).replaceAll('~1', '/').replaceAll('~0', '~');
    if (!isSchema(node)) return undefined;
    node = node[part];
  }
  return node;
}

/** allOf as one schema: properties and required lists are unioned, other keywords the last wins. */
function mergeAllOf(schema: Schema, root: Schema): Schema {
  const merged: Schema = { ...schema };
  delete merged.allOf;
  const properties: Schema = isSchema(schema.properties) ? { ...schema.properties } : {};
  const required: unknown[] = Array.isArray(schema.required) ? [...schema.required] : [];
  for (const part of schema.allOf as unknown[]) {
    const resolved = isSchema(part) && typeof part.$ref === 'string' ? resolveRef(root, part.$ref) : part;
    if (!isSchema(resolved)) continue;
    Object.assign(merged, resolved);
    if (isSchema(resolved.properties)) Object.assign(properties, resolved.properties);
    if (Array.isArray(resolved.required)) required.push(...resolved.required);
  }
  delete merged.$ref;
  if (Object.keys(properties).length > 0) merged.properties = properties;
  if (required.length > 0) merged.required = required;
  return merged;
}

function generateObject(schema: Schema, root: Schema, random: SeededRandom, depth: number): Record<string, unknown> {
  const result: Record<string, unknown> = {};
  const properties = isSchema(schema.properties) ? schema.properties : {};
  // Every declared property is filled in, optional ones too: that is always valid and shows the shape.
  for (const key of Object.keys(properties)) result[key] = generate(properties[key], root, random, depth + 1);
  const extra = schema.additionalProperties;
  const extraSchema = isSchema(extra) ? extra : true;
  if (Array.isArray(schema.required)) {
    for (const key of schema.required) {
      if (typeof key === 'string' && !(key in result)) result[key] = generate(extraSchema, root, random, depth + 1);
    }
  }
  const propertiesMin = typeof schema.minProperties === 'number' ? schema.minProperties : 0;
  if (extra !== false) {
    for (let n = Object.keys(result).length; n < propertiesMin; n++) {
      result[`field_${n}`] = generate(extraSchema, root, random, depth + 1);
    }
  }
  return result;
}

function generateArray(schema: Schema, root: Schema, random: SeededRandom, depth: number): unknown[] {
  // Draft 2020-12 tuples use prefixItems; older drafts put the tuple in items.
  const prefix = Array.isArray(schema.prefixItems) ? schema.prefixItems : Array.isArray(schema.items) ? schema.items : null;
  const itemSchema: unknown = prefix === null ? (schema.items ?? true) : isSchema(schema.items) ? schema.items : true;
  const itemsMin = typeof schema.minItems === 'number' ? Math.max(0, Math.ceil(schema.minItems)) : 0;
  const itemsMax = typeof schema.maxItems === 'number' ? Math.floor(schema.maxItems) : Number.POSITIVE_INFINITY;
  let count = prefix === null ? random.integer(1, ARRAY_ITEMS_DEFAULT_MAX) : prefix.length;
  count = Math.min(Math.max(count, itemsMin), itemsMax);
  const unique = schema.uniqueItems === true;
  const result: unknown[] = [];
  const seen = unique ? new Set<string>() : null;
  for (let i = 0; i < count; i++) {
    const itemSchemaAt = prefix !== null && i < prefix.length ? prefix[i] : itemSchema;
    let value = generate(itemSchemaAt, root, random, depth + 1);
    if (seen) {
      let attempts = 0;
      while (seen.has(JSON.stringify(value)) && attempts++ < UNIQUE_ATTEMPTS_MAX) {
        value = generate(itemSchemaAt, root, random, depth + 1);
      }
      const key = JSON.stringify(value);
      // Too few distinct values exist (a two-value enum, say): stop short rather than repeat one.
      if (seen.has(key)) break;
      seen.add(key);
    }
    result.push(value);
  }
  return result;
}

function generateString(schema: Schema, random: SeededRandom): string {
  const lengthMin = typeof schema.minLength === 'number' ? Math.max(0, Math.ceil(schema.minLength)) : 0;
  const lengthMax = typeof schema.maxLength === 'number' ? Math.floor(schema.maxLength) : Number.POSITIVE_INFINITY;
  let text = random.pick(WORDS);
  while (text.length < lengthMin) text += ' ' + random.pick(WORDS);
  return text.length > lengthMax ? text.slice(0, Math.max(0, lengthMax)) : text;
}

function generateNumber(schema: Schema, random: SeededRandom, integer: boolean): number {
  let low = Number.NEGATIVE_INFINITY;
  let high = Number.POSITIVE_INFINITY;
  let lowExclusive = false;
  let highExclusive = false;
  if (typeof schema.minimum === 'number') {
    low = schema.minimum;
    lowExclusive = schema.exclusiveMinimum === true; // draft 4 spelling
  }
  if (typeof schema.exclusiveMinimum === 'number' && schema.exclusiveMinimum >= low) {
    low = schema.exclusiveMinimum;
    lowExclusive = true;
  }
  if (typeof schema.maximum === 'number') {
    high = schema.maximum;
    highExclusive = schema.exclusiveMaximum === true;
  }
  if (typeof schema.exclusiveMaximum === 'number' && schema.exclusiveMaximum <= high) {
    high = schema.exclusiveMaximum;
    highExclusive = true;
  }
  if (!Number.isFinite(low) && !Number.isFinite(high)) {
    low = 0;
    high = NUMBER_SPAN_DEFAULT;
  } else if (!Number.isFinite(low)) low = high - NUMBER_SPAN_DEFAULT;
  else if (!Number.isFinite(high)) high = low + NUMBER_SPAN_DEFAULT;

  // Integers are valid numbers too, and they avoid float rounding at the edges of the range.
  let lowInteger = lowExclusive ? Math.floor(low) + 1 : Math.ceil(low);
  let highInteger = highExclusive ? Math.ceil(high) - 1 : Math.floor(high);
  const step = typeof schema.multipleOf === 'number' && schema.multipleOf > 0 ? schema.multipleOf : null;
  if (step !== null && Number.isInteger(step)) {
    lowInteger = Math.ceil(lowInteger / step);
    highInteger = Math.floor(highInteger / step);
    if (lowInteger <= highInteger) return random.integer(lowInteger, highInteger) * step;
    return lowInteger * step;
  }
  if (lowInteger <= highInteger) return random.integer(lowInteger, highInteger);
  // No integer fits (integer schemas cannot reach here unless the schema is contradictory).
  return integer ? lowInteger : (low + high) / 2;
}
