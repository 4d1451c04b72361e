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

// The columns, one typed array each, a row per slot. Every byte of a row counts twice: the table's
// typed arrays count as heap for JavaScriptCore's growth, so a row costs about its size again in
// garbage allowed to pile up at peak (bench/README, issue 15: ~370 B of peak RSS per record with
// the 177-byte rows of snapshots before layout 3; these rows are 134 bytes).

// Numbers that can pass 2^31, Float64 (µcr and times are safe integers).
const CREATED_MS = 0;
const FINISHED_MS = 1;
const HOLD_CREDITS = 2;
const CHARGE_CREDITS = 3;
const BUDGET_HOLD = 4;
const NUMBERS = 5;

// Counts, Int32: tokens and the HTTP status, -1 standing for null. A record with a count that is
// not an Int32 from 0 (an upstream may report anything) keeps its six in `bigCounts` instead, and
// COUNTS_ELSEWHERE in its first.
const HOLD_TOKENS = 0;
const CHARGE_TOKENS = 1;
const PROMPT_TOKENS = 2;
const COMPLETION_TOKENS = 3;
const TOTAL_TOKENS = 4;
const HTTP_STATUS = 5;
const COUNTS = 6;
const COUNTS_ELSEWHERE = -2;

// Small columns, Int32: the flags (service in bit 0, stream in bit 1, status in bits 2–3), then
// indexes into `strings`.
const FLAGS = 0;
const KEY_ID = 1;
const MODEL = 2;
const ERROR_CODE = 3; // -1: none
const SMALL = 4;

// The first deployment tried (for most requests the only one), Int32: provider, upstream model
// and error code as positions in `strings` (-1: none), the outcome's index (-1: no attempt), the
// latency in ms. A request that tried several deployments (or whose latency is no Int32) keeps
// its whole list in `attemptLists`: only a failover makes an object that outlives the request.
const ATTEMPT_PROVIDER = 0;
const ATTEMPT_MODEL = 1;
const ATTEMPT_OUTCOME = 2;
const ATTEMPT_ERROR = 3;
const ATTEMPT_LATENCY = 4;
const ATTEMPT = 5;
const OUTCOMES: readonly Attempt['outcome'][] = ['ok', 'error', 'cancelled'];

/**
 * Ids are ASCII of at most this many bytes (ours are 28 and 33); any other id is kept aside as a
 * string.
 */
const ID_BYTES = 33;
/** `idLengths` value of an id kept in `otherIds`. */
const ID_ELSEWHERE = 255;

const INITIAL_SLOTS = 1024;

/** The columns of a snapshot, in the order of its blobs. */
const COLUMNS = ['numbers', 'counts', 'small', 'idBytes', 'idLengths', 'attempt'] as const;
/** Bytes per record of each column, in COLUMNS order. */
const COLUMN_BYTES = [NUMBERS * 8, COUNTS * 4, SMALL * 4, ID_BYTES, 1, ATTEMPT * 4] as const;
/** The meta's `layout` of these columns; snapshots without one hold the layout of `V2` below. */
const LAYOUT = 3;

/** The JSON part of a snapshot of the table (the columns travel as bytes beside it). */
export interface ColumnsMeta {
  /** LAYOUT; absent in snapshots made before it (see V2). */
  layout?: number;
  count: number;
  strings: string[];
  otherIds: Record<number, string>;
  answers: Record<number, Record<string, unknown>>;
  /**
   * Attempts by position: the lists of requests that tried several deployments, or one whose
   * latency is no Int32 (every request's in snapshots made before the attempt columns; absent in
   * those made before failover).
   */
  attempts?: Record<number, Attempt[]>;
  /** The six counts of records that keep them aside, by position (layout 3). */
  bigCounts?: Record<number, Array<number | null>>;
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
  private counts: Int32Array;
  private small: Int32Array;
  private idBytes: Uint8Array;
  private idLengths: Uint8Array;
  private attempt: Int32Array;
  /** Ids that are not short ASCII (never ours, but the event schema allows them), by slot. */
  private readonly otherIds = new Map<number, string>();
  /** Answers of completed decisions, by slot (chat records have none). */
  private readonly answers = new Map<number, Record<string, unknown>>();
  /**
   * The deployments tried by requests that tried more than one (or whose one latency is no Int32),
   * by slot (the event's array).
   */
  private readonly attemptLists = new Map<number, Attempt[]>();
  /** The counts of records whose counts are not all Int32s from 0 (COUNTS_ELSEWHERE), by slot. */
  private readonly bigCounts = new Map<number, BigCounts>();
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
    this.counts = new Int32Array(this.allocated * COUNTS);
    this.small = new Int32Array(this.allocated * SMALL);
    this.idBytes = new Uint8Array(this.allocated * ID_BYTES);
    this.idLengths = new Uint8Array(this.allocated);
    this.attempt = new Int32Array(this.allocated * ATTEMPT);
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
    numbers[n + CHARGE_CREDITS] = record.charge.credits_micro;
    numbers[n + BUDGET_HOLD] = record.budgetHoldMicro;
    this.writeCounts(slot, record);
    const f = slot * SMALL;
    const small = this.small;
    small[f + FLAGS] =
      SERVICES.indexOf(record.service) |
      (record.stream ? 2 : 0) |
      (STATUSES.indexOf(record.status) << 2);
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
    this.bigCounts.delete(slot);
  }

  /** The record's tokens and HTTP status: in the counts column when they fit, else aside. */
  private writeCounts(slot: number, record: RequestRecord): void {
    const { usage, httpStatus } = record;
    const holdTokens = record.hold.tokens;
    const chargeTokens = record.charge.tokens;
    const c = slot * COUNTS;
    const counts = this.counts;
    if (
      isCount(holdTokens) &&
      isCount(chargeTokens) &&
      (httpStatus === null || isCount(httpStatus)) &&
      (usage === null ||
        (isCount(usage.prompt_tokens) &&
          isCount(usage.completion_tokens) &&
          isCount(usage.total_tokens)))
    ) {
      counts[c + HOLD_TOKENS] = holdTokens;
      counts[c + CHARGE_TOKENS] = chargeTokens;
      counts[c + PROMPT_TOKENS] = usage === null ? -1 : usage.prompt_tokens;
      counts[c + COMPLETION_TOKENS] = usage === null ? -1 : usage.completion_tokens;
      counts[c + TOTAL_TOKENS] = usage === null ? -1 : usage.total_tokens;
      counts[c + HTTP_STATUS] = httpStatus ?? -1;
      return;
    }
    counts[c + HOLD_TOKENS] = COUNTS_ELSEWHERE;
    this.bigCounts.set(slot, bigCountsOf(record));
  }

  /** One attempt goes to the columns, several to `attemptLists`; none (null or []) is null. */
  private writeAttempts(slot: number, tried: Attempt[] | null): void {
    const a = slot * ATTEMPT;
    const columns = this.attempt;
    if (tried === null || tried.length !== 1 || !isCount(tried[0]!.latency_ms)) {
      columns[a + ATTEMPT_OUTCOME] = -1;
      if (tried !== null && tried.length > 0) this.attemptLists.set(slot, tried);
      return;
    }
    const only = tried[0]!;
    columns[a + ATTEMPT_PROVIDER] = this.intern(only.provider);
    columns[a + ATTEMPT_MODEL] = this.intern(only.upstream_model);
    columns[a + ATTEMPT_OUTCOME] = OUTCOMES.indexOf(only.outcome);
    columns[a + ATTEMPT_ERROR] = only.error_code === null ? -1 : this.intern(only.error_code);
    columns[a + ATTEMPT_LATENCY] = only.latency_ms;
  }

  /** The attempts of `slot` (see writeAttempts) as fresh objects, or the kept list. */
  private readAttempts(slot: number): Attempt[] | null {
    const list = this.attemptLists.get(slot);
    if (list !== undefined) return list;
    const a = slot * ATTEMPT;
    return attemptOf(this.attempt, a, this.attempt[a + ATTEMPT_LATENCY]!, this.textAt);
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
    const bigCounts: Record<number, BigCounts> = {};
    const runs: number[] = [];
    let at = 0;
    // In age order, which follows the slots in runs (records go to the next slot until one is freed
    // or taken back).
    for (let first = this.slots.oldest; first !== -1; ) {
      let last = first;
      let next = this.slots.newerThan(last);
      while (next === last + 1) next = this.slots.newerThan(++last);
      runs.push(first, last);
      if (
        this.otherIds.size > 0 ||
        this.answers.size > 0 ||
        this.attemptLists.size > 0 ||
        this.bigCounts.size > 0
      ) {
        for (let slot = first; slot <= last; slot++) {
          const other = this.otherIds.get(slot);
          if (other !== undefined) otherIds[at + slot - first] = other;
          const answer = this.answers.get(slot);
          if (answer !== undefined) answers[at + slot - first] = answer;
          const tried = this.attemptLists.get(slot);
          if (tried !== undefined) attempts[at + slot - first] = tried;
          const big = this.bigCounts.get(slot);
          if (big !== undefined) bigCounts[at + slot - first] = big;
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
      meta: {
        layout: LAYOUT,
        count,
        strings: [...this.strings],
        otherIds,
        answers,
        attempts,
        bigCounts,
        owners,
      },
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
   * FairSlots), and puts the keys' order back. Snapshots made before layout 3 hold V2's columns:
   * each row is read in its own layout and added in this one.
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
    const layout = snapshot.layout ?? 2;
    assert(layout === 2 || layout === LAYOUT, `snapshot records: unknown layout ${layout}`);
    const column = <T extends Float64Array | Int32Array | Uint8Array>(
      at: number,
      Type: { new (b: ArrayBuffer): T; BYTES_PER_ELEMENT: number },
      width: number,
    ): T => {
      const bytes = blobs[at];
      assert(bytes !== undefined, `snapshot records: column ${at} missing`);
      assert(
        bytes.length === count * width * Type.BYTES_PER_ELEMENT,
        `snapshot records: column ${at} has the wrong size`,
      );
      // Copied into a fresh, aligned buffer of its own.
      return new Type(
        bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length) as ArrayBuffer,
      );
    };
    const otherIds = (snapshot.otherIds ?? {}) as Record<string, unknown>;
    const answers = (snapshot.answers ?? {}) as Record<string, unknown>;
    const attempts = (snapshot.attempts ?? {}) as Record<string, unknown>;
    const bigCounts = (snapshot.bigCounts ?? {}) as Record<string, unknown>;
    const text = (position: number): string => {
      assert(position >= 0 && position < strings.length, 'snapshot records: bad string position');
      return strings[position] as string;
    };
    const idOf = (idBytes: Uint8Array, idLengths: Uint8Array, width: number, row: number) => {
      const length = idLengths[row]!;
      if (length === ID_ELSEWHERE) {
        const id = otherIds[row];
        assert(typeof id === 'string', 'snapshot records: an id kept aside is missing');
        return id;
      }
      assert(length <= width, 'snapshot records: bad id length');
      return asciiAt(idBytes, row * width, length);
    };
    const answerOf = (row: number): Record<string, unknown> | null => {
      const answer = answers[row] ?? null;
      assert(
        answer === null || (typeof answer === 'object' && !Array.isArray(answer)),
        'snapshot records: bad answers',
      );
      return answer as Record<string, unknown> | null;
    };
    const listOf = (row: number): Attempt[] | undefined => {
      const tried = attempts[row];
      assert(tried === undefined || Array.isArray(tried), 'snapshot records: bad attempts');
      return tried as Attempt[] | undefined;
    };
    let recordAt: (row: number) => RequestRecord;
    if (layout === LAYOUT) {
      const numbers = column(0, Float64Array, NUMBERS);
      const counts = column(1, Int32Array, COUNTS);
      const small = column(2, Int32Array, SMALL);
      const idBytes = column(3, Uint8Array, ID_BYTES);
      const idLengths = column(4, Uint8Array, 1);
      const attempt = column(5, Int32Array, ATTEMPT);
      recordAt = (row) => {
        const big = bigCounts[row];
        assert(big === undefined || isBigCounts(big), 'snapshot records: bad counts kept aside');
        const flags = small[row * SMALL + FLAGS]!;
        assert(flags >= 0 && flags < 16, 'snapshot records: bad service or status');
        return recordOf(
          numbers,
          counts,
          small,
          row,
          idOf(idBytes, idLengths, ID_BYTES, row),
          text,
          answerOf(row),
          listOf(row) ??
            attemptOf(attempt, row * ATTEMPT, attempt[row * ATTEMPT + ATTEMPT_LATENCY]!, text),
          big,
        );
      };
    } else {
      const numbers = column(0, Float64Array, V2.NUMBERS);
      const small = column(1, Int32Array, V2.SMALL);
      const idBytes = column(2, Uint8Array, V2.ID_BYTES);
      const idLengths = column(3, Uint8Array, 1);
      // Snapshots made before the attempt columns have only the first four (attempts are JSON).
      const withAttempts = blobs.length > 4;
      const attempt = withAttempts ? column(4, Int32Array, V2.ATTEMPT) : null;
      const latency = withAttempts ? column(5, Float64Array, 1) : null;
      recordAt = (row) =>
        recordOfV2(
          numbers,
          small,
          row,
          idOf(idBytes, idLengths, V2.ID_BYTES, row),
          text,
          answerOf(row),
          listOf(row) ??
            (attempt === null ? null : attemptOf(attempt, row * V2.ATTEMPT, latency![row]!, text)),
        );
    }
    for (let row = 0; row < count; row++) this.add(recordAt(row));
    const owners = snapshot.owners;
    if (Array.isArray(owners))
      this.slots.restoreOwnerOrder(
        owners.map((keyId) => (typeof keyId === 'string' ? (this.stringAt.get(keyId) ?? -1) : -1)),
      );
  }

  private grow(): void {
    const allocated = Math.min(this.capacity, this.allocated * 2);
    this.numbers = grown(this.numbers, allocated * NUMBERS);
    this.counts = grown(this.counts, allocated * COUNTS);
    this.small = grown(this.small, allocated * SMALL);
    this.idBytes = grown(this.idBytes, allocated * ID_BYTES);
    this.idLengths = grown(this.idLengths, allocated);
    this.attempt = grown(this.attempt, allocated * ATTEMPT);
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
    return [this.numbers, this.counts, this.small, this.idBytes, this.idLengths, this.attempt].map(
      (array) => new Uint8Array(array.buffer, array.byteOffset, array.byteLength),
    );
  }

  private expired(slot: number, nowMs: number): boolean {
    return this.numbers[slot * NUMBERS + FINISHED_MS]! + this.ttlMs <= nowMs;
  }

  private read(slot: number, id: string): RequestRecord {
    return recordOf(
      this.numbers,
      this.counts,
      this.small,
      slot,
      id,
      this.textAt,
      this.answers.get(slot) ?? null,
      this.readAttempts(slot),
      this.bigCounts.get(slot),
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
    return asciiAt(this.idBytes, slot * ID_BYTES, length);
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

/** A record's six counts kept aside: tokens held, charged, prompt, completion, total; status. */
type BigCounts = Array<number | null>;

function bigCountsOf(record: RequestRecord): BigCounts {
  const { usage } = record;
  return [
    record.hold.tokens,
    record.charge.tokens,
    usage === null ? null : usage.prompt_tokens,
    usage === null ? null : usage.completion_tokens,
    usage === null ? null : usage.total_tokens,
    record.httpStatus,
  ];
}

function isBigCounts(value: unknown): value is BigCounts {
  return (
    Array.isArray(value) &&
    value.length === COUNTS &&
    value.every((count, i) => typeof count === 'number' || (count === null && i >= PROMPT_TOKENS))
  );
}

/** A count the counts column holds: an Int32 from 0. */
function isCount(value: number): boolean {
  return (value | 0) === value && value >= 0;
}

/** The record in `row` of the columns, as a fresh object; `big`: its counts kept aside, if so. */
function recordOf(
  numbers: Float64Array,
  counts: Int32Array,
  small: Int32Array,
  row: number,
  id: string,
  text: (position: number) => string,
  answers: Record<string, unknown> | null,
  attempts: Attempt[] | null,
  big: BigCounts | undefined,
): RequestRecord {
  const n = row * NUMBERS;
  const c = row * COUNTS;
  const f = row * SMALL;
  const flags = small[f + FLAGS]!;
  const service = SERVICES[flags & 1]!;
  const status = STATUSES[(flags >>> 2) & 3]!;
  const errorCode = small[f + ERROR_CODE]!;
  let holdTokens: number;
  let chargeTokens: number;
  let usage: Usage | null;
  let httpStatus: number | null;
  if (counts[c + HOLD_TOKENS] === COUNTS_ELSEWHERE) {
    assert(big !== undefined, 'records: counts kept aside are missing');
    holdTokens = big[HOLD_TOKENS]!;
    chargeTokens = big[CHARGE_TOKENS]!;
    const promptTokens = big[PROMPT_TOKENS]!;
    usage =
      promptTokens === null
        ? null
        : {
            prompt_tokens: promptTokens,
            completion_tokens: big[COMPLETION_TOKENS]!,
            total_tokens: big[TOTAL_TOKENS]!,
          };
    httpStatus = big[HTTP_STATUS]!;
  } else {
    holdTokens = counts[c + HOLD_TOKENS]!;
    chargeTokens = counts[c + CHARGE_TOKENS]!;
    const promptTokens = counts[c + PROMPT_TOKENS]!;
    usage =
      promptTokens < 0
        ? null
        : {
            prompt_tokens: promptTokens,
            completion_tokens: counts[c + COMPLETION_TOKENS]!,
            total_tokens: counts[c + TOTAL_TOKENS]!,
          };
    const status = counts[c + HTTP_STATUS]!;
    httpStatus = status < 0 ? null : status;
  }
  return {
    id,
    keyId: text(small[f + KEY_ID]!),
    service,
    model: text(small[f + MODEL]!),
    stream: (flags & 2) !== 0,
    status,
    createdAtMs: numbers[n + CREATED_MS]!,
    finishedAtMs: numbers[n + FINISHED_MS]!,
    hold: { credits_micro: numbers[n + HOLD_CREDITS]!, tokens: holdTokens },
    charge: { credits_micro: numbers[n + CHARGE_CREDITS]!, tokens: chargeTokens },
    budgetHoldMicro: numbers[n + BUDGET_HOLD]!,
    usage,
    errorCode: errorCode < 0 ? null : text(errorCode),
    httpStatus,
    answers,
    attempts,
    // Only an in-flight request needs its key (an unfinished decision frees it); a finished one
    // never does.
    idempotencyKey: null,
  };
}

/**
 * The one attempt at offset `a` of an attempt column, or null when the row has none there. Both
 * layouts put provider, model, outcome and error first; the latency is layout 3's fifth field, or
 * layout 2's column of its own.
 */
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

/**
 * The columns of snapshots made before layout 3, read on restore only: numbers (Float64: created,
 * finished, hold credits, hold tokens, charge credits, charge tokens, budget hold, prompt,
 * completion and total tokens, HTTP status), small (Int32: service, stream, status, key id, model,
 * error code), 40-byte ids, their lengths, then (when present) the attempt (Int32: provider, model,
 * outcome, error) and its latency (Float64).
 */
const V2 = { NUMBERS: 11, SMALL: 6, ID_BYTES: 40, ATTEMPT: 4 } as const;

function recordOfV2(
  numbers: Float64Array,
  small: Int32Array,
  row: number,
  id: string,
  text: (position: number) => string,
  answers: Record<string, unknown> | null,
  attempts: Attempt[] | null,
): RequestRecord {
  const n = row * V2.NUMBERS;
  const f = row * V2.SMALL;
  const service = SERVICES[small[f]!];
  const status = STATUSES[small[f + 2]!];
  assert(service !== undefined && status !== undefined, 'snapshot records: bad service or status');
  const promptTokens = numbers[n + 7]!;
  const httpStatus = numbers[n + 10]!;
  const errorCode = small[f + 5]!;
  return {
    id,
    keyId: text(small[f + 3]!),
    service,
    model: text(small[f + 4]!),
    stream: small[f + 1] === 1,
    status,
    createdAtMs: numbers[n]!,
    finishedAtMs: numbers[n + 1]!,
    hold: { credits_micro: numbers[n + 2]!, tokens: numbers[n + 3]! },
    charge: { credits_micro: numbers[n + 4]!, tokens: numbers[n + 5]! },
    budgetHoldMicro: numbers[n + 6]!,
    usage:
      promptTokens < 0
        ? null
        : {
            prompt_tokens: promptTokens,
            completion_tokens: numbers[n + 8]!,
            total_tokens: numbers[n + 9]!,
          },
    errorCode: errorCode < 0 ? null : text(errorCode),
    httpStatus: httpStatus < 0 ? null : httpStatus,
    answers,
    attempts,
    idempotencyKey: null,
  };
}

/** A power of two at least twice the slots, so probe runs stay short. */
function indexSizeFor(slots: number): number {
  let size = 16;
  while (size < slots * 2) size *= 2;
  return size;
}

/** The `length` ASCII bytes of `bytes` from `start`, as a string. */
function asciiAt(bytes: Uint8Array, start: number, length: number): string {
  return String.fromCharCode.apply(
    null,
    bytes.subarray(start, start + length) as unknown as number[],
  );
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
