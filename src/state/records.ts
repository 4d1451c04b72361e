// Finished request records for the status endpoints: a bounded ring of columns, oldest evicted first.
//
// Why not a map of objects: 100,000 records kept as objects (record, hold, charge, usage) are half a
// million old-generation cells that every full collection walks, and a busy gateway replaces them
// continuously. On the simulator benchmark that garbage-collector work cost ~20 µs of CPU per request
// (bench/README.md), about what the trivial proxy spends on a whole request. Here a record is one slot
// across typed columns plus its id string; strings it shares with others (key id, model, error code)
// are interned.
import { assert } from '../util/assert.ts';
import type { RequestRecord } from './apply.ts';
import type { RequestStatus, Service } from './events.ts';

const SERVICES: readonly Service[] = ['chat', 'decision'];
const STATUSES: readonly RequestStatus[] = ['in_progress', 'completed', 'cancelled', 'error'];

// Numeric columns, one Float64Array slot each (µcr and counts are safe integers; -1 stands for null).
const CREATED_MS = 0;
const FINISHED_MS = 1;
const HOLD_CREDITS = 2;
const HOLD_TOKENS = 3;
const CHARGE_CREDITS = 4;
const CHARGE_TOKENS = 5;
const BUDGET_HOLD = 6;
const PROMPT_TOKENS = 7;
const COMPLETION_TOKENS = 8;
const TOTAL_TOKENS = 9;
const HTTP_STATUS = 10;
const NUMBERS = 11;

// Flags: service, stream, status in one byte each.
const SERVICE = 0;
const STREAM = 1;
const STATUS = 2;
const FLAGS = 3;

const INITIAL_SLOTS = 1024;

export class RecordTable {
  private readonly slotOf = new Map<string, number>();
  private readonly ids: string[] = [];
  private readonly keyIds: string[] = [];
  private readonly models: string[] = [];
  private readonly errorCodes: (string | null)[] = [];
  /** Answers of completed decisions, by slot (chat records have none). */
  private readonly answers = new Map<number, Record<string, unknown>>();
  // Grown by doubling up to `capacity`, so a small gateway does not pay for the largest table up front.
  private numbers: Float64Array;
  private flags: Uint8Array;
  private allocated: number;
  private readonly interned = new Map<string, string>();
  /** The slot the next record goes to; once full, it holds the oldest record. */
  private next = 0;
  private count = 0;

  constructor(
    readonly capacity: number,
    private readonly ttlMs: number,
  ) {
    assert(Number.isSafeInteger(capacity) && capacity > 0, 'record capacity must be a positive integer');
    this.allocated = Math.min(capacity, INITIAL_SLOTS);
    this.numbers = new Float64Array(this.allocated * NUMBERS);
    this.flags = new Uint8Array(this.allocated * FLAGS);
  }

  get size(): number {
    return this.count;
  }

  /** Whether `id` has a record (expired ones count: an id is never reused). */
  has(id: string): boolean {
    return this.slotOf.has(id);
  }

  /** The record of `id` as a fresh object, or undefined when unknown or older than the TTL. */
  get(id: string, nowMs = Date.now()): RequestRecord | undefined {
    const slot = this.slotOf.get(id);
    if (slot === undefined || this.expired(slot, nowMs)) return undefined;
    return this.read(slot);
  }

  /** Adds a finished record; the oldest one makes room when the table is full. */
  add(record: RequestRecord): void {
    assert(record.status !== 'in_progress', `record ${record.id} is not finished`);
    assert(!this.slotOf.has(record.id), `record ${record.id} exists`);
    const slot = this.next;
    if (this.count < this.capacity) {
      // Not full yet: slots fill in order, so `slot === count`, and nothing is evicted.
      if (slot === this.allocated) this.grow();
      this.count++;
    } else {
      const evicted = this.ids[slot]!;
      this.slotOf.delete(evicted);
      this.answers.delete(slot);
    }
    this.next = slot + 1 === this.capacity ? 0 : slot + 1;
    this.ids[slot] = record.id;
    this.slotOf.set(record.id, slot);
    this.keyIds[slot] = this.intern(record.keyId);
    this.models[slot] = this.intern(record.model);
    this.errorCodes[slot] = record.errorCode === null ? null : this.intern(record.errorCode);
    if (record.answers !== null) this.answers.set(slot, record.answers);
    const n = slot * NUMBERS;
    const numbers = this.numbers;
    numbers[n + CREATED_MS] = record.createdAtMs;
    numbers[n + FINISHED_MS] = record.finishedAtMs ?? record.createdAtMs;
    numbers[n + HOLD_CREDITS] = record.hold.credits_micro;
    numbers[n + HOLD_TOKENS] = record.hold.tokens;
    numbers[n + CHARGE_CREDITS] = record.charge.credits_micro;
    numbers[n + CHARGE_TOKENS] = record.charge.tokens;
    numbers[n + BUDGET_HOLD] = record.budgetHoldMicro;
    numbers[n + PROMPT_TOKENS] = record.usage === null ? -1 : record.usage.prompt_tokens;
    numbers[n + COMPLETION_TOKENS] = record.usage === null ? -1 : record.usage.completion_tokens;
    numbers[n + TOTAL_TOKENS] = record.usage === null ? -1 : record.usage.total_tokens;
    numbers[n + HTTP_STATUS] = record.httpStatus ?? -1;
    const f = slot * FLAGS;
    this.flags[f + SERVICE] = SERVICES.indexOf(record.service);
    this.flags[f + STREAM] = record.stream ? 1 : 0;
    this.flags[f + STATUS] = STATUSES.indexOf(record.status);
  }

  /** Every record still within its TTL, oldest first (the order `add` must see them in again). */
  *values(nowMs = Date.now()): Generator<RequestRecord> {
    const start = this.count < this.capacity ? 0 : this.next;
    for (let i = 0; i < this.count; i++) {
      const slot = (start + i) % this.capacity;
      if (!this.expired(slot, nowMs)) yield this.read(slot);
    }
  }

  private grow(): void {
    const allocated = Math.min(this.capacity, this.allocated * 2);
    const numbers = new Float64Array(allocated * NUMBERS);
    numbers.set(this.numbers);
    const flags = new Uint8Array(allocated * FLAGS);
    flags.set(this.flags);
    this.numbers = numbers;
    this.flags = flags;
    this.allocated = allocated;
  }

  private expired(slot: number, nowMs: number): boolean {
    return this.numbers[slot * NUMBERS + FINISHED_MS]! + this.ttlMs <= nowMs;
  }

  private read(slot: number): RequestRecord {
    const n = slot * NUMBERS;
    const numbers = this.numbers;
    const f = slot * FLAGS;
    const promptTokens = numbers[n + PROMPT_TOKENS]!;
    const httpStatus = numbers[n + HTTP_STATUS]!;
    return {
      id: this.ids[slot]!,
      keyId: this.keyIds[slot]!,
      service: SERVICES[this.flags[f + SERVICE]!]!,
      model: this.models[slot]!,
      stream: this.flags[f + STREAM] === 1,
      status: STATUSES[this.flags[f + STATUS]!]!,
      createdAtMs: numbers[n + CREATED_MS]!,
      finishedAtMs: numbers[n + FINISHED_MS]!,
      hold: { credits_micro: numbers[n + HOLD_CREDITS]!, tokens: numbers[n + HOLD_TOKENS]! },
      charge: { credits_micro: numbers[n + CHARGE_CREDITS]!, tokens: numbers[n + CHARGE_TOKENS]! },
      budgetHoldMicro: numbers[n + BUDGET_HOLD]!,
      usage:
        promptTokens < 0
          ? null
          : { prompt_tokens: promptTokens, completion_tokens: numbers[n + COMPLETION_TOKENS]!, total_tokens: numbers[n + TOTAL_TOKENS]! },
      errorCode: this.errorCodes[slot]!,
      httpStatus: httpStatus < 0 ? null : httpStatus,
      answers: this.answers.get(slot) ?? null,
      // Only an in-flight request needs its key (an unfinished decision frees it); a finished one never does.
      idempotencyKey: null,
    };
  }

  /** One string object per distinct key id, model and error code, however many records name it. */
  private intern(text: string): string {
    const known = this.interned.get(text);
    if (known !== undefined) return known;
    // Key ids and models are few, but a replay of a long log must not grow this without bound.
    if (this.interned.size >= 100_000) this.interned.clear();
    this.interned.set(text, text);
    return text;
  }
}
