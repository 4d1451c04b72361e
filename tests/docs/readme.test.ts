// The README's limits table is the defaults' own: every limit, with its default, so it cannot
// drift.
import { expect, test } from 'bun:test';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { defaultConfig } from '../../src/config/defaults.ts';

test('README "Operating" lists every limit of config/defaults.ts with its default value', () => {
  const readme = readFileSync(join(import.meta.dir, '../../README.md'), 'utf8');
  const rows = new Map<string, string>();
  for (const match of readme.matchAll(/^\| `limits\.([a-z_]+)` \| ([\d,]+) \|/gm))
    rows.set(match[1]!, match[2]!);
  const limits = defaultConfig().limits as Record<string, number>;
  expect([...rows.keys()].sort()).toEqual(Object.keys(limits).sort());
  for (const [name, value] of Object.entries(limits))
    expect(`${name} = ${rows.get(name)}`).toBe(`${name} = ${value.toLocaleString('en-US')}`);
});
