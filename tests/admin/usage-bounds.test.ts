// The usage query's row bound (CONTRACT §6, issue 16): an answer of more than USAGE_ROWS_MAX rows
// is a 400 that says how to narrow it, never a huge answer; grouping by fewer dimensions fits.
import { expect, test } from 'bun:test';
import { parseUsageQuery, readUsage, USAGE_ROWS_MAX } from '../../src/admin/usage.ts';
import { GatewayState } from '../../src/state/apply.ts';
import { DAY_MS } from '../../src/state/usage.ts';
import { GatewayError } from '../../src/util/errors.ts';
import { keyCreated, LIMITS, requestFinished } from '../state/support.ts';

const DAY = 20_400;

function query(state: GatewayState, text: string) {
  return parseUsageQuery(new URLSearchParams(text), state, new Map([['m', 'm']]));
}

test('more rows than the bound is a 400 naming group_by; grouped by day it fits', async () => {
  const state = new GatewayState(LIMITS);
  const keys = Math.ceil((USAGE_ROWS_MAX + 1) / 100);
  for (let k = 0; k < keys; k++) state.apply(keyCreated(`k${k}`, 1));
  for (let k = 0; k < keys; k++)
    for (let day = 0; day < 100; day++)
      state.usage.add(`k${k}`, 'm', requestFinished('r', 1, { at_ms: (DAY + day) * DAY_MS }));
  const from = new Date(DAY * DAY_MS).toISOString().slice(0, 10);
  const to = new Date((DAY + 99) * DAY_MS).toISOString().slice(0, 10);
  const all = query(state, `from=${from}&to=${to}`);
  const refused = await readUsage(state, all).catch((error: unknown) => error);
  expect(refused).toBeInstanceOf(GatewayError);
  expect((refused as GatewayError).param).toBe('group_by');
  expect((refused as GatewayError).status).toBe(400);
  const byDay = await readUsage(state, query(state, `from=${from}&to=${to}&group_by=day`));
  expect(byDay.length).toBe(100);
  expect(byDay[0]).toEqual({
    day: from,
    requests: keys,
    completed: keys,
    cancelled: 0,
    errors: 0,
    prompt_tokens: 10 * keys,
    completion_tokens: 5 * keys,
    charged_credits: keys / 1_000_000,
  });
});
