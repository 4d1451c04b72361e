// Finished request records for the status endpoints: typed columns, bounded per key and in all
// (§8).
//
// Why columns and not a map of objects: the garbage collector walks whatever the heap references. A
// table of 100,000 records as objects is half a million old-generation cells, and as strings in
// arrays and a Map it is still 100,000 strings plus arrays and a hash table that every new record
// writes into, so every young collection rescans them. Measured on the gateway at capacity: ~20 µs
// per request as objects, ~6 µs as strings (bench/README). Here nothing per record is visible to
// the collector: ids are bytes in a column and are found through an open-addressing hash table of
// slot numbers; strings shared by many records (key id, model, error code) are numbers into a small
// table.
//
// Which record makes room is FairSlots' decision (a key past its own bound loses its own oldest; at
// the total bound, an expired record first, else the oldest of the key holding the most), so one
// key's traffic cannot push another key's records out.
import { AssertionError, assert } from '../util/assert.ts';
import { FNV_OFFSET, FNV_PRIME, hashId } from '../util/id-map.ts';
import { readWhole, type SnapshotSource } from '../wal/log.ts';
import { ColumnsCapture } from './columns-capture.ts';
import type { Amount, Attempt, RequestStatus, Service, Usage } from './events.ts';
import { FairSlots } from './fair-slots.ts';

/** A request as the status endpoints show it: in flight (GatewayState.inFlight) or finished. */
export interface RequestRecord {
  id: string;
  keyId: string;
  service: Service;
  model: string;
  stream: boolean;
  status: RequestStatus;
  createdAtMs: number;
  finishedAtMs: number | null;
  hold: Amount;
  charge: Amount;
  budgetHoldMicro: number;
  usage: Usage | null;
  errorCode: string | null;
  httpStatus: number | null;
  answers: Record<string, unknown> | null;
  /** The deployments tried (CONTRACT §7); null when none was, or before failover existed. */
  attempts: Attempt[] | null;
  idempotencyKey: string | null;
}

const SERVICES: readonly Service[] = ['chat', 'decision'];
const STATUSES: readonly RequestStatus[] = ['in_progress', 'completed', 'cancelled', 'error'];

// Numeric columns, one Float64Array slot each (µcr and counts are safe integers; -1 stands for
// null).
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

// Small columns, one Int32Array slot each: service, stream, status, and indexes into `strings`.
const SERVICE = 0;
const STREAM = 1;
const STATUS = 2;
const KEY_ID = 3;
const MODEL = 4;
const ERROR_CODE = 5; // -1: none
const SMALL = 6;

// The first deployment tried (for most requests the only one), one Int32Array slot each: provider,
// upstream model and error code as positions in `strings` (-1: none), the outcome's index (-1: no
// attempt). Its latency is the `attemptLatency` column. A request that tried several deployments
// keeps its whole list in `attemptLists`: only a failover makes an object that outlives the
// request.
const ATTEMPT_PROVIDER = 0;
const ATTEMPT_MODEL = 1;
const ATTEMPT_OUTCOME = 2;
const ATTEMPT_ERROR = 3;
const ATTEMPT = 4;
const OUTCOMES: readonly Attempt['outcome'][] = ['ok', 'error', 'cancelled'];

/**
 * Ids are ASCII of at most this many bytes (ours are 28–33); any other id is kept aside as a
 * string.
 */
const ID_BYTES = 40;
/** `idLengths` value of an id kept in `otherIds`. */
const ID_ELSEWHERE = 255;

const INITIAL_SLOTS = 1024;

/** The columns of a snapshot, in the order of its blobs. */
const COLUMNS = ['numbers', 'small', 'idBytes', 'idLengths', 'attempt', 'attemptLatency'] as const;
/** Bytes per record of each column, in COLUMNS order. */
const COLUMN_BYTES = [NUMBERS * 8, SMALL * 4, ID_BYTES, 1, ATTEMPT * 4, 8] as const;
/** Snapshots made before the attempt columns have only the first four (their attempts are JSON). */
const COLUMNS_BEFORE_ATTEMPTS = 4;

/** The JSON part of a snapshot of the table (the columns travel as bytes beside it). */
export interface ColumnsMeta {
  count: number;
  strings: string[];
  otherIds: Record<number, string>;
  answers: Record<number, Record<string, unknown>>;
  /**
   * Attempts by position: the lists of requests that tried several deployments (every request's
   * in snapshots made before the attempt columns; absent in those made before failover).
   */
  attempts?: Record<number, Attempt[]>;
  /**
   * The key ids holding records, in FairSlots' bucket order (absent in snapshots made before it).
   */
  owners?: string[];
}

export class RecordTable {
  // Grown by doubling up to `capacity`, so a small gateway does not pay for the largest table up
  // front.
  private allocated: number;
  private numbers: Float64Array;
  private small: Int32Array;
  private idBytes: Uint8Array;
  private idLengths: Uint8Array;
  private attempt: Int32Array;
  private attemptLatency: Float64Array;
  /** Ids that are not short ASCII (never ours, but the event schema allows them), by slot. */
  private readonly otherIds = new Map<number, string>();
  /** Answers of completed decisions, by slot (chat records have none). */
  private readonly answers = new Map<number, Record<string, unknown>>();
  /** The deployments tried by requests that tried more than one, by slot (the event's array). */
  private readonly attemptLists = new Map<number, Attempt[]>();
  /**
   * Open addressing with linear probing: slot + 1 of the record whose id hashes here, 0 when empty.
   */
  private index: Int32Array;
  private indexMask: number;
  /**
   * Key ids, models, error codes, providers and upstream models, each stored once; records refer to
   * them by position.
   */
  private readonly strings: string[] = [];
  private readonly stringAt = new Map<string, number>();
  /** Which slots hold records, in age order, per key (by the key id's position in `strings`). */
  private readonly slots: FairSlots;
  private readonly expiredAt = (slot: number, nowMs: number): boolean => this.expired(slot, nowMs);
  /** The columns as bytes, in COLUMNS order (remade when they grow). */
  private columnBytes: Uint8Array[] = [];
  private readonly liveColumns = (): readonly Uint8Array[] => this.columnBytes;
  /** Snapshots being written: each keeps the rows it holds before they are overwritten. */
  private readonly captures: ColumnsCapture[] = [];

  constructor(
    readonly capacity: number,
    private readonly ttlMs: number,
    perKeyMax = capacity,
  ) {
    assert(
      Number.isSafeInteger(capacity) && capacity > 0,
      'record capacity must be a positive integer',
    );
    this.slots = new FairSlots(capacity, perKeyMax, (slot) => this.forget(slot));
    this.allocated = Math.min(capacity, INITIAL_SLOTS);
    this.numbers = new Float64Array(this.allocated * NUMBERS);
    this.small = new Int32Array(this.allocated * SMALL);
    this.idBytes = new Uint8Array(this.allocated * ID_BYTES);
    this.idLengths = new Uint8Array(this.allocated);
    this.attempt = new Int32Array(this.allocated * ATTEMPT);
    this.attemptLatency = new Float64Array(this.allocated);
    this.columnBytes = this.viewColumns();
    this.index = new Int32Array(indexSizeFor(this.allocated));
    this.indexMask = this.index.length - 1;
  }

  get size(): number {
    return this.slots.size;
  }

  /** Records kept for `keyId` (expired ones included until they make room). */
  heldBy(keyId: string): number {
    const owner = this.stringAt.get(keyId);
    return owner === undefined ? 0 : this.slots.held(owner);
  }

  /** Whether `id` has a record (expired ones count: an id is never reused). */
  has(id: string): boolean {
    return this.find(id) !== -1;
  }

  /** The record of `id` as a fresh object, or undefined when unknown or older than the TTL. */
  get(id: string, nowMs = Date.now()): RequestRecord | undefined {
    const slot = this.find(id);
    if (slot === -1 || this.expired(slot, nowMs)) return undefined;
    return this.read(slot, id);
  }

  /**
   * Adds a finished record; when a bound is reached, FairSlots picks the record that makes room.
   */
  add(record: RequestRecord): void {
    // Messages built only on failure: this runs for every finished request.
    if (record.status === 'in_progress')
      throw new AssertionError(`record ${record.id} is not finished`);
    if (this.find(record.id) !== -1) throw new AssertionError(`record ${record.id} exists`);
    if (this.slots.nextTakeIsFresh && this.slots.slotsUsed === this.allocated) this.grow();
    // The record's own finish is "now" for the eviction (never the wall clock): replaying the log
    // makes the same choices the live gateway made.
    const slot = this.slots.take(
      this.intern(record.keyId),
      this.expiredAt,
      record.finishedAtMs ?? record.createdAtMs,
    );
    this.writeId(slot, record.id);
    this.indexSlot(slot, hashId(record.id));
    if (record.answers !== null) this.answers.set(slot, record.answers);
    this.writeAttempts(slot, record.attempts);
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
    const f = slot * SMALL;
    const small = this.small;
    small[f + SERVICE] = SERVICES.indexOf(record.service);
    small[f + STREAM] = record.stream ? 1 : 0;
    small[f + STATUS] = STATUSES.indexOf(record.status);
    small[f + KEY_ID] = this.intern(record.keyId);
    small[f + MODEL] = this.intern(record.model);
    small[f + ERROR_CODE] = record.errorCode === null ? -1 : this.intern(record.errorCode);
  }

  /** Every record still within its TTL, oldest first (the order `add` must see them in again). */
  *values(nowMs = Date.now()): Generator<RequestRecord> {
    for (const slot of this.slots.inOrder()) {
      if (!this.expired(slot, nowMs)) yield this.read(slot, this.readId(slot));
    }
  }

  /** The slot is about to hold another record: its id, answers and index entry go. */
  private forget(slot: number): void {
    for (let c = 0; c < this.captures.length; c++) this.captures[c]!.keep(slot);
    this.unindex(slot);
    this.otherIds.delete(slot);
    this.answers.delete(slot);
    this.attemptLists.delete(slot);
  }

  /** One attempt goes to the columns, several to `attemptLists`; none (null or []) is null. */
  private writeAttempts(slot: number, tried: Attempt[] | null): void {
    const a = slot * ATTEMPT;
    const columns = this.attempt;
    if (tried === null || tried.length !== 1) {
      columns[a + ATTEMPT_OUTCOME] = -1;
      if (tried !== null && tried.length > 1) this.attemptLists.set(slot, tried);
      return;
    }
    const only = tried[0]!;
    columns[a + ATTEMPT_PROVIDER] = this.intern(only.provider);
    columns[a + ATTEMPT_MODEL] = this.intern(only.upstream_model);
    columns[a + ATTEMPT_OUTCOME] = OUTCOMES.indexOf(only.outcome);
    columns[a + ATTEMPT_ERROR] = only.error_code === null ? -1 : this.intern(only.error_code);
    this.attemptLatency[slot] = only.latency_ms;
  }

  /** The attempts of `slot` (see writeAttempts) as fresh objects, or the kept list. */
  private readAttempts(slot: number): Attempt[] | null {
    const list = this.attemptLists.get(slot);
    if (list !== undefined) return list;
    return attemptOf(this.attempt, slot * ATTEMPT, this.attemptLatency[slot]!, this.textAt);
  }

  /**
   * Every record, oldest first, for a snapshot: the columns as bytes (in age order, in this
   * machine's byte order, little-endian everywhere tollgate runs), read from the live table while
   * the snapshot is written (see ColumnsCapture); beside them, as JSON, the shared strings, the ids
   * kept aside and the answers by position. No record objects and no text per record. Expired
   * records are dropped on restore. `release` must follow once the snapshot is written or failed:
   * until then each record overwritten is kept aside for it.
   */
  captureColumns(): { meta: ColumnsMeta; sources: SnapshotSource[]; release(): void } {
    const count = this.slots.size;
    const otherIds: Record<number, string> = {};
    const answers: Record<number, Record<string, unknown>> = {};
    const attempts: Record<number, Attempt[]> = {};
    const runs: number[] = [];
    let at = 0;
    // In age order, which follows the slots in runs (records go to the next slot until one is freed
    // or taken back).
    for (let first = this.slots.oldest; first !== -1; ) {
      let last = first;
      let next = this.slots.newerThan(last);
      while (next === last + 1) next = this.slots.newerThan(++last);
      runs.push(first, last);
      if (this.otherIds.size > 0 || this.answers.size > 0 || this.attemptLists.size > 0) {
        for (let slot = first; slot <= last; slot++) {
          const other = this.otherIds.get(slot);
          if (other !== undefined) otherIds[at + slot - first] = other;
          const answer = this.answers.get(slot);
          if (answer !== undefined) answers[at + slot - first] = answer;
          const tried = this.attemptLists.get(slot);
          if (tried !== undefined) attempts[at + slot - first] = tried;
        }
      }
      at += last - first + 1;
      first = next;
    }
    const capture = new ColumnsCapture(
      COLUMN_BYTES,
      this.liveColumns,
      Int32Array.from(runs),
      this.allocated,
      count,
    );
    this.captures.push(capture);
    const owners = this.slots.ownerOrder().map((owner) => this.strings[owner]!);
    return {
      meta: { count, strings: [...this.strings], otherIds, answers, attempts, owners },
      sources: COLUMNS.map((_, c) => capture.source(c)),
      release: () => {
        const index = this.captures.indexOf(capture);
        if (index !== -1) this.captures.splice(index, 1);
      },
    };
  }

  /** `captureColumns` read whole at once (for tests and tools: a snapshot reads it in pieces). */
  serializeColumns(): { meta: ColumnsMeta; blobs: Uint8Array[] } {
    const { meta, sources, release } = this.captureColumns();
    const blobs = sources.map(readWhole);
    release();
    return { meta, blobs };
  }

  /**
   * Adds the records of `serializeColumns` (its meta parsed back, its blobs in order), oldest
   * first, expired ones too (reads skip them; keeping them keeps the table the log's own, see
   * FairSlots), and puts the keys' order back. One pass over the columns in their serialized
   * order, kept whole (long) so that reading and its checks sit next to the layout they mirror.
   */
  restoreColumns(raw: unknown, blobs: readonly Uint8Array[]): void {
    const snapshot = raw as Record<string, unknown>;
    const count = snapshot.count;
    assert(
      typeof count === 'number' && Number.isSafeInteger(count) && count >= 0,
      'snapshot records: bad count',
    );
    const strings = snapshot.strings;
    assert(
      Array.isArray(strings) && strings.every((text) => typeof text === 'string'),
      'snapshot records: bad strings',
    );
    const column = <T extends Float64Array | Int32Array | Uint8Array>(
      name: (typeof COLUMNS)[number],
      Type: { new (b: ArrayBuffer): T; BYTES_PER_ELEMENT: number },
      width: number,
    ): T | null => {
      if (
        COLUMNS.indexOf(name) >= COLUMNS_BEFORE_ATTEMPTS &&
        blobs.length === COLUMNS_BEFORE_ATTEMPTS
      )
        return null;
      const bytes = blobs[COLUMNS.indexOf(name)];
      assert(bytes !== undefined, `snapshot records: ${name} missing`);
      assert(
        bytes.length === count * width * Type.BYTES_PER_ELEMENT,
        `snapshot records: ${name} has the wrong size`,
      );
      // Copied into a fresh, aligned buffer of its own.
      return new Type(
        bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length) as ArrayBuffer,
      );
    };
    const numbers = column('numbers', Float64Array, NUMBERS)!;
    const small = column('small', Int32Array, SMALL)!;
    const idBytes = column('idBytes', Uint8Array, ID_BYTES)!;
    const idLengths = column('idLengths', Uint8Array, 1)!;
    const attempt = column('attempt', Int32Array, ATTEMPT);
    const attemptLatency = column('attemptLatency', Float64Array, 1);
    const otherIds = (snapshot.otherIds ?? {}) as Record<string, unknown>;
    const answers = (snapshot.answers ?? {}) as Record<string, unknown>;
    const attempts = (snapshot.attempts ?? {}) as Record<string, unknown>;
    const text = (position: number): string => {
      assert(position >= 0 && position < strings.length, 'snapshot records: bad string position');
      return strings[position] as string;
    };
    for (let row = 0; row < count; row++) {
      const n = row * NUMBERS;
      const f = row * SMALL;
      const length = idLengths[row]!;
      let id: string;
      if (length === ID_ELSEWHERE) {
        id = otherIds[row] as string;
        assert(typeof id === 'string', 'snapshot records: an id kept aside is missing');
      } else {
        assert(length <= ID_BYTES, 'snapshot records: bad id length');
        id = String.fromCharCode.apply(
          null,
          idBytes.subarray(row * ID_BYTES, row * ID_BYTES + length) as unknown as number[],
        );
      }
      assert(
        SERVICES[small[f + SERVICE]!] !== undefined && STATUSES[small[f + STATUS]!] !== undefined,
        'snapshot records: bad service or status',
      );
      const answer = answers[row] ?? null;
      assert(
        answer === null || (typeof answer === 'object' && !Array.isArray(answer)),
        'snapshot records: bad answers',
      );
      const tried =
        attempts[row] ??
        (attempt === null ? null : attemptOf(attempt, row * ATTEMPT, attemptLatency![row]!, text));
      assert(tried === null || Array.isArray(tried), 'snapshot records: bad attempts');
      this.add(
        recordOf(
          numbers,
          n,
          small,
          f,
          id,
          text,
          answer as Record<string, unknown> | null,
          tried as Attempt[] | null,
        ),
      );
    }
    const owners = snapshot.owners;
    if (Array.isArray(owners))
      this.slots.restoreOwnerOrder(
        owners.map((keyId) => (typeof keyId === 'string' ? (this.stringAt.get(keyId) ?? -1) : -1)),
      );
  }

  private grow(): void {
    const allocated = Math.min(this.capacity, this.allocated * 2);
    this.numbers = grown(this.numbers, allocated * NUMBERS);
    this.small = grown(this.small, allocated * SMALL);
    this.idBytes = grown(this.idBytes, allocated * ID_BYTES);
    this.idLengths = grown(this.idLengths, allocated);
    this.attempt = grown(this.attempt, allocated * ATTEMPT);
    this.attemptLatency = grown(this.attemptLatency, allocated);
    this.columnBytes = this.viewColumns();
    this.allocated = allocated;
    // A larger hash table: every record is placed again.
    this.index = new Int32Array(indexSizeFor(allocated));
    this.indexMask = this.index.length - 1;
    // Hashed from the id bytes in place: reading each id back as a string made a grow of 50,000
    // records a 50,000-string stall (the tail profile's JS-busy stalls, issue 15).
    for (const slot of this.slots.inOrder()) this.indexSlot(slot, this.hashSlot(slot));
  }

  private viewColumns(): Uint8Array[] {
    return [
      this.numbers,
      this.small,
      this.idBytes,
      this.idLengths,
      this.attempt,
      this.attemptLatency,
    ].map((array) => new Uint8Array(array.buffer, array.byteOffset, array.byteLength));
  }

  private expired(slot: number, nowMs: number): boolean {
    return this.numbers[slot * NUMBERS + FINISHED_MS]! + this.ttlMs <= nowMs;
  }

  private read(slot: number, id: string): RequestRecord {
    return recordOf(
      this.numbers,
      slot * NUMBERS,
      this.small,
      slot * SMALL,
      id,
      this.textAt,
      this.answers.get(slot) ?? null,
      this.readAttempts(slot),
    );
  }

  private readonly textAt = (position: number): string => this.strings[position]!;

  /**
   * The position of `text` in `strings`, adding it once. Bounded by keys, models, error codes and
   * the configured deployments.
   */
  private intern(text: string): number {
    const known = this.stringAt.get(text);
    if (known !== undefined) return known;
    const position = this.strings.length;
    this.strings.push(text);
    this.stringAt.set(text, position);
    return position;
  }

  // --- ids: bytes in a column, found through `index` ---

  private writeId(slot: number, id: string): void {
    if (id.length > ID_BYTES || !isAscii(id)) {
      this.idLengths[slot] = ID_ELSEWHERE;
      this.otherIds.set(slot, id);
      return;
    }
    const bytes = this.idBytes;
    const base = slot * ID_BYTES;
    for (let i = 0; i < id.length; i++) bytes[base + i] = id.charCodeAt(i);
    this.idLengths[slot] = id.length;
  }

  private readId(slot: number): string {
    const length = this.idLengths[slot]!;
    if (length === ID_ELSEWHERE) return this.otherIds.get(slot)!;
    const base = slot * ID_BYTES;
    return String.fromCharCode.apply(
      null,
      this.idBytes.subarray(base, base + length) as unknown as number[],
    );
  }

  private idEquals(slot: number, id: string): boolean {
    const length = this.idLengths[slot]!;
    if (length === ID_ELSEWHERE) return this.otherIds.get(slot) === id;
    if (length !== id.length) return false;
    const bytes = this.idBytes;
    const base = slot * ID_BYTES;
    for (let i = 0; i < length; i++) if (bytes[base + i] !== id.charCodeAt(i)) return false;
    return true;
  }

  /** The slot holding `id`, or -1. */
  private find(id: string): number {
    const index = this.index;
    const mask = this.indexMask;
    for (let at = hashId(id) & mask; ; at = (at + 1) & mask) {
      const entry = index[at]!;
      if (entry === 0) return -1;
      if (this.idEquals(entry - 1, id)) return entry - 1;
    }
  }

  private indexSlot(slot: number, hash: number): void {
    const index = this.index;
    const mask = this.indexMask;
    let at = hash & mask;
    while (index[at] !== 0) at = (at + 1) & mask;
    index[at] = slot + 1;
  }

  /** hashId of the id in `slot`, from its bytes. */
  private hashSlot(slot: number): number {
    const length = this.idLengths[slot]!;
    if (length === ID_ELSEWHERE) return hashId(this.otherIds.get(slot)!);
    const bytes = this.idBytes;
    const base = slot * ID_BYTES;
    let hash = FNV_OFFSET;
    for (let i = 0; i < length; i++) hash = Math.imul(hash ^ bytes[base + i]!, FNV_PRIME);
    return hash >>> 0;
  }

  /** Removes `slot` from the index, moving later entries of its probe run back (no tombstones). */
  private unindex(slot: number): void {
    const index = this.index;
    const mask = this.indexMask;
    let hole = this.hashSlot(slot) & mask;
    while (index[hole] !== slot + 1) hole = (hole + 1) & mask;
    index[hole] = 0;
    for (let at = (hole + 1) & mask; index[at] !== 0; at = (at + 1) & mask) {
      const entry = index[at]!;
      const home = this.hashSlot(entry - 1) & mask;
      // The entry may fill the hole if its home is not inside the stretch (hole, at].
      if (hole <= at ? home <= hole || home > at : home <= hole && home > at) {
        index[hole] = entry;
        index[at] = 0;
        hole = at;
      }
    }
  }
}

/** The record at row offsets `n` (numbers) and `f` (small columns), as a fresh object. */
function recordOf(
  numbers: Float64Array,
  n: number,
  small: Int32Array,
  f: number,
  id: string,
  text: (position: number) => string,
  answers: Record<string, unknown> | null,
  attempts: Attempt[] | null,
): RequestRecord {
  const promptTokens = numbers[n + PROMPT_TOKENS]!;
  const httpStatus = numbers[n + HTTP_STATUS]!;
  const errorCode = small[f + ERROR_CODE]!;
  return {
    id,
    keyId: text(small[f + KEY_ID]!),
    service: SERVICES[small[f + SERVICE]!]!,
    model: text(small[f + MODEL]!),
    stream: small[f + STREAM] === 1,
    status: STATUSES[small[f + STATUS]!]!,
    createdAtMs: numbers[n + CREATED_MS]!,
    finishedAtMs: numbers[n + FINISHED_MS]!,
    hold: { credits_micro: numbers[n + HOLD_CREDITS]!, tokens: numbers[n + HOLD_TOKENS]! },
    charge: { credits_micro: numbers[n + CHARGE_CREDITS]!, tokens: numbers[n + CHARGE_TOKENS]! },
    budgetHoldMicro: numbers[n + BUDGET_HOLD]!,
    usage:
      promptTokens < 0
        ? null
        : {
            prompt_tokens: promptTokens,
            completion_tokens: numbers[n + COMPLETION_TOKENS]!,
            total_tokens: numbers[n + TOTAL_TOKENS]!,
          },
    errorCode: errorCode < 0 ? null : text(errorCode),
    httpStatus: httpStatus < 0 ? null : httpStatus,
    answers,
    attempts,
    // Only an in-flight request needs its key (an unfinished decision frees it); a finished one
    // never does.
    idempotencyKey: null,
  };
}

/** The one attempt at offset `a` of the attempt column, or null when the row has none there. */
function attemptOf(
  columns: Int32Array,
  a: number,
  latencyMs: number,
  text: (position: number) => string,
): Attempt[] | null {
  const index = columns[a + ATTEMPT_OUTCOME]!;
  if (index === -1) return null;
  const outcome = OUTCOMES[index];
  assert(outcome !== undefined, 'records: bad attempt outcome');
  const errorCode = columns[a + ATTEMPT_ERROR]!;
  return [
    {
      provider: text(columns[a + ATTEMPT_PROVIDER]!),
      upstream_model: text(columns[a + ATTEMPT_MODEL]!),
      outcome,
      error_code: errorCode < 0 ? null : text(errorCode),
      latency_ms: latencyMs,
    },
  ];
}

/** A power of two at least twice the slots, so probe runs stay short. */
function indexSizeFor(slots: number): number {
  let size = 16;
  while (size < slots * 2) size *= 2;
  return size;
}

function isAscii(text: string): boolean {
  for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) > 127) return false;
  return true;
}

function grown<T extends Float64Array | Int32Array | Uint8Array>(array: T, length: number): T {
  const bigger = new (array.constructor as new (length: number) => T)(length);
  bigger.set(array);
  return bigger;
}
