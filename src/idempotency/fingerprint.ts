// Request fingerprints: SHA-256 of method, path and canonical JSON (keys sorted at every depth).

import { assert } from '../util/assert.ts';
import { JSON_DEPTH_MAX } from '../util/json.ts';

/**
 * JSON with object keys sorted at every depth and no whitespace; equal content gives equal text.
 */
export function canonicalJson(value: unknown, depth = 0): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  // Bodies nested deeper are refused when parsed (parseJsonBody); reaching this is a bug, not a
  // client error.
  assert(
    depth < JSON_DEPTH_MAX,
    'canonicalJson of a value nested deeper than parseJsonBody allows',
  );
  if (Array.isArray(value)) {
    let out = '[';
    for (let i = 0; i < value.length; i++)
      out += (i > 0 ? ',' : '') + canonicalJson(value[i], depth + 1);
    return `${out}]`;
  }
  const keys = Object.keys(value).sort();
  let out = '{';
  let first = true;
  for (const key of keys) {
    const item = (value as Record<string, unknown>)[key];
    if (item === undefined) continue;
    out += `${(first ? '' : ',') + JSON.stringify(key)}:${canonicalJson(item, depth + 1)}`;
    first = false;
  }
  return `${out}}`;
}

export function requestFingerprint(method: string, path: string, body: unknown): string {
  return new Bun.CryptoHasher('sha256')
    .update(`${method}\n${path}\n`)
    .update(canonicalJson(body))
    .digest('hex');
}
