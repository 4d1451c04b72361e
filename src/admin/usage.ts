// GET /admin/v1/usage (CONTRACT §6): the usage history filtered by UTC days, key and model, grouped
// by the dimensions asked for. Bounded: at most USAGE_DAYS_MAX days and USAGE_ROWS_MAX rows per
// query, read in steps so that no request waits behind a large one.
import type { Config } from '../config/model.ts';
import { microToCredits } from '../keys/store.ts';
import type { GatewayState } from '../state/apply.ts';
import { DAY_MS, type UsageRow } from '../state/usage.ts';
import { GatewayError } from '../util/errors.ts';
import { nextTurn } from '../util/promise.ts';
import type { UsageRowView } from './model.ts';

/** Days one query may span (CONTRACT §6). */
export const USAGE_DAYS_MAX = 400;
/** Rows one answer may hold; past it the query must be narrowed or grouped (a 400 saying so). */
export const USAGE_ROWS_MAX = 10_000;
/** Work between two turns of the event loop while rows are read. */
const STEP_MS = 4;

const DIMENSIONS = ['day', 'key', 'model'] as const;
type Dimension = (typeof DIMENSIONS)[number];

export interface UsageQuery {
  fromDay: number;
  toDay: number;
  keyId?: string;
  model?: string;
  groupBy: ReadonlySet<Dimension>;
}

const DATE = /^(\d{4})-(\d{2})-(\d{2})$/;

function badParam(param: string, message: string): GatewayError {
  return new GatewayError('invalid_request_error', message, { param });
}

/** `YYYY-MM-DD` of a UTC day (days since the epoch). */
export function dayText(day: number): string {
  return new Date(day * DAY_MS).toISOString().slice(0, 10);
}

/** A UTC day (days since the epoch) from `YYYY-MM-DD`, refusing dates that do not exist. */
function dayOf(param: string, text: string | null): number {
  if (text === null) throw badParam(param, `${param} is required (YYYY-MM-DD, a UTC day)`);
  const match = DATE.exec(text);
  // setUTCFullYear, not Date.UTC, which reads years 0-99 as 1900-1999.
  const date = new Date(0);
  if (match) date.setUTCFullYear(Number(match[1]), Number(match[2]) - 1, Number(match[3]));
  // A rolled-over date (2026-02-30 is March 2) does not read back: it is not a date.
  if (!match || date.toISOString().slice(0, 10) !== text)
    throw badParam(param, `${param} must be a date as YYYY-MM-DD (a UTC day)`);
  return date.getTime() / DAY_MS;
}

/**
 * Checks the query string against the contract and the state (known key and model). `models` maps
 * every model name a client may use (catalogue ids, aliases, the decision's names) to the name the
 * history keeps.
 */
export function parseUsageQuery(
  url: URLSearchParams,
  state: GatewayState,
  models: ReadonlyMap<string, string>,
): UsageQuery {
  const fromDay = dayOf('from', url.get('from'));
  const toDay = dayOf('to', url.get('to'));
  if (toDay < fromDay) throw badParam('to', 'to must not be before from');
  if (toDay - fromDay + 1 > USAGE_DAYS_MAX)
    throw badParam('to', `from..to spans more than ${USAGE_DAYS_MAX} days`);
  const keyId = url.get('key_id') ?? undefined;
  if (keyId !== undefined && !state.keys.has(keyId))
    throw badParam('key_id', 'key_id names no key');
  const asked = url.get('model') ?? undefined;
  // A model the history has rows of stays readable after the config dropped it.
  const model = asked === undefined || state.usage.hasModel(asked) ? asked : models.get(asked);
  if (asked !== undefined && model === undefined)
    throw badParam('model', 'model names no model of the catalogue or the history');
  const groupText = url.get('group_by');
  const groupBy = new Set<Dimension>();
  // Empty names no dimension: one row, the total of the range.
  const names =
    groupText === null ? DIMENSIONS : groupText.trim() === '' ? [] : groupText.split(',');
  for (const raw of names) {
    const name = raw.trim() === 'key_id' ? 'key' : raw.trim();
    if (!(DIMENSIONS as readonly string[]).includes(name) || groupBy.has(name as Dimension))
      throw badParam('group_by', 'group_by lists day, key and model, each at most once');
    groupBy.add(name as Dimension);
  }
  return { fromDay, toDay, keyId, model, groupBy };
}

/**
 * Every model name a usage query may use, mapped to the name records keep: catalogue ids as they
 * are, aliases to their model, the decision service's model names as they are (its records keep
 * them).
 */
export function usageModelNames(config: Config): Map<string, string> {
  const names = new Map<string, string>();
  for (const id of Object.keys(config.models)) names.set(id, id);
  for (const [alias, id] of Object.entries(config.aliases)) names.set(alias, id);
  for (const name of Object.keys(config.decision.models)) names.set(name, name);
  return names;
}

/** One answer row while it is summed: charged in µcr, shown as credits at the end. */
type Sums = Omit<UsageRowView, 'charged_credits'> & { charged_micro: number };

/** The rows of `query`, summed per group, in day, key and model order. */
export async function readUsage(state: GatewayState, query: UsageQuery): Promise<UsageRowView[]> {
  const groups = new Map<string, Sums>();
  const { groupBy } = query;
  let stepStartMs = performance.now();
  let seen = 0;
  // Rows come day by day: the day's text is made once per day, not per row.
  let lastDay = Number.NaN;
  let lastDayText = '';
  for (const row of state.usage.rows(query.fromDay, query.toDay, query.keyId, query.model)) {
    if (groupBy.has('day') && row.day !== lastDay) {
      lastDay = row.day;
      lastDayText = dayText(row.day);
    }
    const day = groupBy.has('day') ? lastDayText : '';
    const keyId = groupBy.has('key') ? row.keyId : '';
    const model = groupBy.has('model') ? row.model : '';
    const group = `${day}\u0000${keyId}\u0000${model}`;
    let sums = groups.get(group);
    if (sums === undefined) {
      if (groups.size === USAGE_ROWS_MAX)
        throw badParam(
          'group_by',
          `the query has more than ${USAGE_ROWS_MAX} rows: narrow from..to, name a key_id or ` +
            'model, or group by fewer dimensions',
        );
      sums = emptySums(groupBy, day, keyId, model);
      groups.set(group, sums);
    }
    add(sums, row);
    // The state may change between steps: rows already read are summed, later ones read as they
    // are then (a request finishing meanwhile may count or not, like one finishing just after).
    if ((++seen & 1023) === 0 && performance.now() - stepStartMs >= STEP_MS) {
      await nextTurn();
      stepStartMs = performance.now();
    }
  }
  return [...groups.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([, sums]) => {
      const { charged_micro, ...rest } = sums;
      return { ...rest, charged_credits: microToCredits(charged_micro) };
    });
}

function emptySums(
  groupBy: ReadonlySet<Dimension>,
  day: string,
  keyId: string,
  model: string,
): Sums {
  return {
    ...(groupBy.has('day') ? { day } : {}),
    ...(groupBy.has('key') ? { key_id: keyId } : {}),
    ...(groupBy.has('model') ? { model } : {}),
    requests: 0,
    completed: 0,
    cancelled: 0,
    errors: 0,
    prompt_tokens: 0,
    completion_tokens: 0,
    charged_micro: 0,
  };
}

function add(sums: Sums, row: UsageRow): void {
  sums.requests += row.requests;
  sums.completed += row.completed;
  sums.cancelled += row.cancelled;
  sums.errors += row.errors;
  sums.prompt_tokens += row.promptTokens;
  sums.completion_tokens += row.completionTokens;
  sums.charged_micro += row.chargedMicro;
}
