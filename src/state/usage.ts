// Usage history (CONTRACT §6): per UTC day × API key × model, the requests that finished and what
// they were charged. Built by `apply` from the same finish events the ledger applies, so its sums
// are the keys' `charged` exactly (never a second bookkeeping); kept in snapshots; days older than
// the retention are dropped whole.
import { assert } from '../util/assert.ts';
import type { RequestFinished } from './events.ts';

/** A UTC day. */
export const DAY_MS = 86_400_000;

// Counters of a row, one Float64Array slot each (safe integers).
const REQUESTS = 0;
const COMPLETED = 1;
const CANCELLED = 2;
const ERRORS = 3;
const PROMPT_TOKENS = 4;
const COMPLETION_TOKENS = 5;
const CHARGED_MICRO = 6;
const COUNTERS = 7;

/**
 * Rows of a day are found by key and model positions packed in one number: key · 2^16 + model,
 * exact for 2^37 keys. Models are the catalogue's (config ids and the decision's names, bounded by
 * the config); should a data dir ever see more, the rest are summed under one name, never refused.
 */
const MODEL_POSITIONS = 2 ** 16;
const OTHER_MODELS = '(other models)';
const INITIAL_ROWS = 16;

/** One row of the history, as the admin API reads it. */
export interface UsageRow {
  day: number;
  keyId: string;
  model: string;
  requests: number;
  completed: number;
  cancelled: number;
  errors: number;
  promptTokens: number;
  completionTokens: number;
  chargedMicro: number;
}

/** The rows of one UTC day: counters and (key, model) positions in typed arrays. */
class DayRows {
  count = 0;
  counters = new Float64Array(INITIAL_ROWS * COUNTERS);
  /** Per row: the key's and the model's positions in the table's names. */
  names = new Int32Array(INITIAL_ROWS * 2);
  readonly rowOf = new Map<number, number>();

  constructor(readonly day: number) {}

  /** The row of (key, model), added when new. */
  row(key: number, model: number): number {
    const packed = key * MODEL_POSITIONS + model;
    const known = this.rowOf.get(packed);
    if (known !== undefined) return known;
    const row = this.count++;
    if (row * COUNTERS === this.counters.length) {
      const counters = new Float64Array(this.counters.length * 2);
      counters.set(this.counters);
      this.counters = counters;
      const names = new Int32Array(this.names.length * 2);
      names.set(this.names);
      this.names = names;
    }
    this.names[row * 2] = key;
    this.names[row * 2 + 1] = model;
    this.rowOf.set(packed, row);
    return row;
  }
}

/** Strings stored once each, referred to by position. */
class Names {
  readonly list: string[] = [];
  private readonly at = new Map<string, number>();

  position(text: string): number {
    const known = this.at.get(text);
    if (known !== undefined) return known;
    this.list.push(text);
    this.at.set(text, this.list.length - 1);
    return this.list.length - 1;
  }

  /** The position of `text`, or -1 when it was never stored. */
  find(text: string): number {
    return this.at.get(text) ?? -1;
  }
}

/** What a snapshot keeps of the history (the counters travel as bytes beside it). */
export interface UsageMeta {
  keys: string[];
  models: string[];
  /** Per day, oldest first: the day and its row count; the rows are in the blobs in this order. */
  days: Array<[number, number]>;
  /** The day the history had moved to (see UsageTable.latestDay); null before any finish. */
  latestDay: number | null;
}

export class UsageTable {
  /** Days, in the order they were first seen (oldest first but for clock steps: see add). */
  private readonly days = new Map<number, DayRows>();
  /**
   * The newest day the history has moved to: days older than the retention before it are gone.
   * It moves one day per finish at most, so a clock stepped far ahead for a moment (a bad clock at
   * boot) cannot empty the history; after real downtime it catches up within a few finishes.
   */
  private latestDay = Number.NEGATIVE_INFINITY;
  private readonly keys = new Names();
  private readonly models = new Names();

  constructor(private readonly retentionDays: number) {
    assert(Number.isSafeInteger(retentionDays) && retentionDays > 0, 'retention must be positive');
  }

  /**
   * Adds a finished request of `keyId` on `model` to its day's row. A finish dated before the
   * kept days (a clock stepped back further than the retention) counts in the oldest kept day:
   * the history's sums stay the ledger's.
   */
  add(keyId: string, model: string, event: RequestFinished): void {
    const dated = Math.floor(event.at_ms / DAY_MS);
    if (dated > this.latestDay)
      this.advanceTo(this.latestDay === Number.NEGATIVE_INFINITY ? dated : this.latestDay + 1);
    const day = Math.max(dated, this.latestDay - this.retentionDays + 1);
    let rows = this.days.get(day);
    if (rows === undefined) {
      rows = new DayRows(day);
      this.days.set(day, rows);
    }
    const c = rows.row(this.keys.position(keyId), this.modelPosition(model)) * COUNTERS;
    const counters = rows.counters;
    counters[c + REQUESTS]! += 1;
    if (event.status === 'completed') counters[c + COMPLETED]! += 1;
    else if (event.status === 'cancelled') counters[c + CANCELLED]! += 1;
    else counters[c + ERRORS]! += 1;
    if (event.usage !== null) {
      counters[c + PROMPT_TOKENS]! += event.usage.prompt_tokens;
      counters[c + COMPLETION_TOKENS]! += event.usage.completion_tokens;
    }
    counters[c + CHARGED_MICRO]! += event.charge.credits_micro;
  }

  /** Whether the history has rows of `model`. */
  hasModel(model: string): boolean {
    return this.models.find(model) !== -1;
  }

  /** Rows held, all days together. */
  get size(): number {
    let rows = 0;
    for (const day of this.days.values()) rows += day.count;
    return rows;
  }

  /**
   * The rows of days `fromDay`..`toDay` (inclusive), oldest day first, passing `keyId` and `model`
   * when given. A generator, so that a caller can pause between rows.
   */
  *rows(fromDay: number, toDay: number, keyId?: string, model?: string): Generator<UsageRow> {
    const key = keyId === undefined ? -1 : this.keys.find(keyId);
    const modelAt = model === undefined ? -1 : this.models.find(model);
    if ((keyId !== undefined && key === -1) || (model !== undefined && modelAt === -1)) return;
    // Days are added out of order when a clock steps: sorted here, at most the retention's days.
    const inRange = [...this.days.values()].filter(
      (rows) => rows.day >= fromDay && rows.day <= toDay,
    );
    for (const rows of inRange.sort((a, b) => a.day - b.day)) {
      for (let row = 0; row < rows.count; row++) {
        const rowKey = rows.names[row * 2]!;
        const rowModel = rows.names[row * 2 + 1]!;
        if ((key !== -1 && rowKey !== key) || (modelAt !== -1 && rowModel !== modelAt)) continue;
        const c = row * COUNTERS;
        const counters = rows.counters;
        yield {
          day: rows.day,
          keyId: this.keys.list[rowKey]!,
          model: this.models.list[rowModel]!,
          requests: counters[c + REQUESTS]!,
          completed: counters[c + COMPLETED]!,
          cancelled: counters[c + CANCELLED]!,
          errors: counters[c + ERRORS]!,
          promptTokens: counters[c + PROMPT_TOKENS]!,
          completionTokens: counters[c + COMPLETION_TOKENS]!,
          chargedMicro: counters[c + CHARGED_MICRO]!,
        };
      }
    }
  }

  /** The history as a snapshot keeps it: names and day sizes as JSON, the columns as bytes. */
  serialize(): { meta: UsageMeta; blobs: Uint8Array[] } {
    const days = [...this.days.values()].sort((a, b) => a.day - b.day);
    const rows = days.reduce((sum, day) => sum + day.count, 0);
    const counters = new Float64Array(rows * COUNTERS);
    const names = new Int32Array(rows * 2);
    let at = 0;
    for (const day of days) {
      counters.set(day.counters.subarray(0, day.count * COUNTERS), at * COUNTERS);
      names.set(day.names.subarray(0, day.count * 2), at * 2);
      at += day.count;
    }
    return {
      meta: {
        keys: [...this.keys.list],
        models: [...this.models.list],
        days: days.map((day) => [day.day, day.count]),
        latestDay: Number.isFinite(this.latestDay) ? this.latestDay : null,
      },
      blobs: [
        new Uint8Array(counters.buffer, 0, counters.byteLength),
        new Uint8Array(names.buffer, 0, names.byteLength),
      ],
    };
  }

  /** Puts back what `serialize` wrote (into an empty table). */
  restore(raw: unknown, blobs: readonly Uint8Array[]): void {
    assert(this.days.size === 0 && this.keys.list.length === 0, 'usage restored into a used table');
    const meta = raw as UsageMeta;
    assert(
      [meta?.keys, meta?.models].every(
        (names) => Array.isArray(names) && names.every((text) => typeof text === 'string'),
      ),
      'snapshot usage: bad names',
    );
    assert(Array.isArray(meta.days), 'snapshot usage: bad days');
    const rows = meta.days.reduce((sum, entry) => {
      assert(
        Array.isArray(entry) && Number.isSafeInteger(entry[0]) && Number.isSafeInteger(entry[1]),
        'snapshot usage: bad day',
      );
      return sum + entry[1];
    }, 0);
    const [counterBytes, nameBytes] = blobs;
    assert(
      counterBytes?.byteLength === rows * COUNTERS * 8 && nameBytes?.byteLength === rows * 2 * 4,
      'snapshot usage: columns of the wrong size',
    );
    const counters = new Float64Array(
      counterBytes.buffer.slice(
        counterBytes.byteOffset,
        counterBytes.byteOffset + counterBytes.byteLength,
      ) as ArrayBuffer,
    );
    const names = new Int32Array(
      nameBytes.buffer.slice(
        nameBytes.byteOffset,
        nameBytes.byteOffset + nameBytes.byteLength,
      ) as ArrayBuffer,
    );
    for (const keyId of meta.keys) this.keys.position(keyId);
    for (const model of meta.models) this.models.position(model);
    let at = 0;
    for (const [day, count] of meta.days) {
      const target = new DayRows(day);
      for (let row = 0; row < count; row++, at++) {
        const key = names[at * 2]!;
        const model = names[at * 2 + 1]!;
        assert(
          key >= 0 && key < this.keys.list.length && model >= 0 && model < this.models.list.length,
          'snapshot usage: bad name position',
        );
        const r = target.row(key, model) * COUNTERS;
        target.counters.set(counters.subarray(at * COUNTERS, (at + 1) * COUNTERS), r);
      }
      this.days.set(day, target);
    }
    assert(
      meta.latestDay === null || Number.isSafeInteger(meta.latestDay),
      'snapshot usage: bad latest day',
    );
    this.latestDay = meta.latestDay ?? Number.NEGATIVE_INFINITY;
  }

  /** A new latest day: the days it leaves past the retention go, whole. */
  private advanceTo(day: number): void {
    this.latestDay = day;
    for (const old of this.days.keys()) if (old <= day - this.retentionDays) this.days.delete(old);
  }

  /** The model's position; past MODEL_POSITIONS models, the position of OTHER_MODELS. */
  private modelPosition(model: string): number {
    const known = this.models.find(model);
    if (known !== -1) return known;
    return this.models.position(
      this.models.list.length < MODEL_POSITIONS - 1 ? model : OTHER_MODELS,
    );
  }
}
