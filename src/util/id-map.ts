// A map from string ids to values, for entries that come and go by the thousand (requests in
// flight): open addressing over arrays, where removing an entry clears its slots. It iterates in
// insertion order, as a Map does.
//
// Why not a Map: JavaScriptCore's Map appends each new key to its table and, once appended and
// removed keys fill it, rehashes into a fresh table: with keys never reused, every few dozen
// insertions. The table left behind points at the fresh one and still holds every value it had.
// Once the live table is in the old generation, that pointer makes each young collection keep every
// table made since the previous one and every value they held, so each request in flight at a
// rehash (most of them, under load) outlives its end until the next full collection, with all it
// references: measured on the gateway, young collections found 4–11 MB alive instead of a few
// hundred KB (bench/README.md, "Where the tail comes from"). Here nothing outlives its removal.

const INITIAL_SLOTS = 64;

export class IdMap<V> {
  /** Linear probing; an empty slot's id and value are undefined. Length: a power of two. */
  private idAt: Array<string | undefined> = [];
  private valueAt: Array<V | undefined> = [];
  /** When each entry was added (a counter), for iterating in insertion order. */
  private addedAt: number[] = [];
  private added = 0;
  private mask = 0;
  private count = 0;

  constructor() {
    this.allocate(INITIAL_SLOTS);
  }

  get size(): number {
    return this.count;
  }

  get(id: string): V | undefined {
    const at = this.find(id);
    return at === -1 ? undefined : this.valueAt[at];
  }

  has(id: string): boolean {
    return this.find(id) !== -1;
  }

  /** Adds `id`, or replaces its value (it keeps its place in the order). */
  set(id: string, value: V): this {
    this.place(id, value, ++this.added);
    // At most half full, so probe runs stay short.
    if (this.count * 2 > this.idAt.length) this.resize(this.idAt.length * 2);
    return this;
  }

  /** Removes `id`, moving later entries of its probe run back (no tombstones are left). */
  delete(id: string): boolean {
    let hole = this.find(id);
    if (hole === -1) return false;
    const ids = this.idAt;
    const values = this.valueAt;
    const added = this.addedAt;
    const mask = this.mask;
    for (let at = (hole + 1) & mask; ids[at] !== undefined; at = (at + 1) & mask) {
      // The entry at `at` moves into the hole unless its home slot lies cyclically in (hole, at].
      const home = hashId(ids[at]!) & mask;
      if (((at - home) & mask) >= ((at - hole) & mask)) {
        ids[hole] = ids[at];
        values[hole] = values[at];
        added[hole] = added[at]!;
        hole = at;
      }
    }
    ids[hole] = undefined;
    values[hole] = undefined;
    this.count--;
    // A burst's arrays are given back once it is over (an eighth full: no resizing back and forth).
    if (this.count * 8 < ids.length && ids.length > INITIAL_SLOTS) this.resize(ids.length / 2);
    return true;
  }

  clear(): void {
    this.release();
    this.allocate(INITIAL_SLOTS);
  }

  /** The ids in insertion order, as a new array (the map may change while it is used). */
  keys(): string[] {
    return this.slotsInOrder().map((at) => this.idAt[at]!);
  }

  /** The values in insertion order, as a new array (the map may change while it is used). */
  values(): V[] {
    return this.slotsInOrder().map((at) => this.valueAt[at]!);
  }

  /** The slots in use, oldest entry first (for listings and shutdown, not a hot path). */
  private slotsInOrder(): number[] {
    const slots: number[] = [];
    const ids = this.idAt;
    for (let at = 0; at < ids.length; at++) if (ids[at] !== undefined) slots.push(at);
    const added = this.addedAt;
    return slots.sort((a, b) => added[a]! - added[b]!);
  }

  /** Adds `id` with the order `added`, or replaces its value (its order stays). */
  private place(id: string, value: V, added: number): void {
    const ids = this.idAt;
    const mask = this.mask;
    let at = hashId(id) & mask;
    for (let held = ids[at]; held !== undefined; held = ids[at]) {
      if (held === id) {
        this.valueAt[at] = value;
        return;
      }
      at = (at + 1) & mask;
    }
    ids[at] = id;
    this.valueAt[at] = value;
    this.addedAt[at] = added;
    this.count++;
  }

  /** The slot holding `id`, or -1. */
  private find(id: string): number {
    const ids = this.idAt;
    const mask = this.mask;
    for (let at = hashId(id) & mask; ; at = (at + 1) & mask) {
      const held = ids[at];
      if (held === undefined) return -1;
      if (held === id) return at;
    }
  }

  private allocate(slots: number): void {
    // Filled, not holes: the arrays stay contiguous storage.
    this.idAt = new Array<string | undefined>(slots).fill(undefined);
    this.valueAt = new Array<V | undefined>(slots).fill(undefined);
    this.addedAt = new Array<number>(slots).fill(0);
    this.mask = slots - 1;
    this.count = 0;
  }

  private resize(slots: number): void {
    const ids = this.idAt;
    const values = this.valueAt;
    const added = this.addedAt;
    this.allocate(slots);
    for (let at = 0; at < ids.length; at++) {
      const id = ids[at];
      if (id !== undefined) this.place(id, values[at]!, added[at]!);
    }
    this.release(ids, values);
  }

  /**
   * Empties arrays that are being let go: an old-generation array written since the last
   * collection is rescanned by the next young one, dead or not, and would keep what it still held.
   */
  private release(ids = this.idAt, values = this.valueAt): void {
    ids.fill(undefined);
    values.fill(undefined);
  }
}

export const FNV_OFFSET = 0x811c9dc5;
export const FNV_PRIME = 0x01000193;

/**
 * FNV-1a over the UTF-16 code units (ids are the gateway's own, random: no need for a keyed hash).
 * The record table hashes the same ids from their bytes with the same constants.
 */
export function hashId(id: string): number {
  let hash = FNV_OFFSET;
  for (let i = 0; i < id.length; i++) hash = Math.imul(hash ^ id.charCodeAt(i), FNV_PRIME);
  return hash >>> 0;
}
