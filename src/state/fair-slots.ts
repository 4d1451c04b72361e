// Slots shared by many owners (API keys) under a total and a per-owner bound, evicted fairly.
//
// CONTRACT §8: a key past its own bound loses its own oldest entry; at the total bound the entry
// that goes is the oldest one of the key that holds the most (after an expired one, if the oldest
// of all has expired), so a key at or under its fair share (total ÷ keys holding entries) never
// loses one to another key's traffic. The heaviest holder always holds at least the average, so it
// is never a key under its share.
//
// Everything is integers in typed arrays, found in O(1): each slot is linked into the list of all
// slots (oldest first) and into its owner's list; owners are linked into buckets by how many slots
// they hold, and the highest non-empty bucket is tracked (the counts move by one at a time).
//
// Every decision is a function of the calls made and of the `nowMs` they pass (a log event's own
// time, never the wall clock), so replaying the same events rebuilds the same table. The one thing
// that history alone sets, the order of owners tied in a bucket, travels with a snapshot
// (ownerOrder).
import { assert } from '../util/assert.ts';

const NONE = -1;
const INITIAL_SLOTS = 1024;
const INITIAL_OWNERS = 64;

export class FairSlots {
  // Per slot: the list of all slots and the owner's list, both oldest first.
  private allPrev: Int32Array;
  private allNext: Int32Array;
  private ownPrev: Int32Array;
  private ownNext: Int32Array;
  private ownerOf: Int32Array;
  private allHead = NONE;
  private allTail = NONE;
  /** Slots released by their user, to be taken again before fresh ones. */
  private freeSlots: number[] = [];
  /** Slots below this have been handed out at least once. */
  private fresh = 0;
  private count = 0;

  // Per owner: its list of slots, how many, and its links in the bucket of that count.
  private ownHead: Int32Array;
  private ownTail: Int32Array;
  private ownCount: Int32Array;
  private bucketPrev: Int32Array;
  private bucketNext: Int32Array;
  /** Owners holding exactly n slots, by n (index 0 unused: an owner with none is in no bucket). */
  private bucketHead: Int32Array;
  private heaviestCount = 0;

  constructor(
    readonly capacity: number,
    readonly perOwnerMax: number,
    /** Called with a slot about to be taken from its entry: the user forgets what it kept there. */
    private readonly onEvict: (slot: number) => void,
  ) {
    assert(Number.isSafeInteger(capacity) && capacity > 0, 'capacity must be a positive integer');
    assert(
      Number.isSafeInteger(perOwnerMax) && perOwnerMax > 0,
      'the per-owner bound must be a positive integer',
    );
    const slots = Math.min(capacity, INITIAL_SLOTS);
    this.allPrev = new Int32Array(slots);
    this.allNext = new Int32Array(slots);
    this.ownPrev = new Int32Array(slots);
    this.ownNext = new Int32Array(slots);
    this.ownerOf = new Int32Array(slots);
    this.ownHead = new Int32Array(INITIAL_OWNERS).fill(NONE);
    this.ownTail = new Int32Array(INITIAL_OWNERS).fill(NONE);
    this.ownCount = new Int32Array(INITIAL_OWNERS);
    this.bucketPrev = new Int32Array(INITIAL_OWNERS);
    this.bucketNext = new Int32Array(INITIAL_OWNERS);
    this.bucketHead = new Int32Array(Math.min(this.maxCount(), INITIAL_SLOTS) + 1).fill(NONE);
  }

  get size(): number {
    return this.count;
  }

  /**
   * The highest slot number ever handed out, plus one: a user sizes its own per-slot columns by it.
   */
  get slotsUsed(): number {
    return this.fresh;
  }

  /**
   * Whether the next `take` hands out a slot never used before (the user may need to grow first).
   */
  get nextTakeIsFresh(): boolean {
    return this.count < this.capacity && this.freeSlots.length === 0;
  }

  /** How many slots `owner` holds. */
  held(owner: number): number {
    return owner < this.ownCount.length ? this.ownCount[owner]! : 0;
  }

  /**
   * A slot for a new entry of `owner` (a small non-negative integer), the newest of both lists.
   * Room is made by the rules above; `expired(slot, nowMs)` says whether the oldest entry of all
   * may go first.
   */
  take(owner: number, expired: (slot: number, nowMs: number) => boolean, nowMs: number): number {
    assert(Number.isSafeInteger(owner) && owner >= 0, 'an owner is a non-negative integer');
    this.ensureOwner(owner);
    let slot: number;
    if (this.ownCount[owner]! >= this.perOwnerMax) {
      slot = this.ownHead[owner]!;
    } else if (this.count >= this.capacity) {
      if (expired(this.allHead, nowMs)) slot = this.allHead;
      else {
        // A tie with the owner asking for room is settled against that owner: it is the one
        // growing.
        const heaviest =
          this.ownCount[owner] === this.heaviestCount
            ? owner
            : this.bucketHead[this.heaviestCount]!;
        slot = this.ownHead[heaviest]!;
      }
    } else {
      slot = this.freeSlots.pop() ?? this.freshSlot();
      this.link(slot, owner);
      return slot;
    }
    this.onEvict(slot);
    this.unlink(slot);
    this.link(slot, owner);
    return slot;
  }

  /** The entry in `slot` is gone (deleted by its user); the slot may be taken again. */
  release(slot: number): void {
    this.unlink(slot);
    this.freeSlots.push(slot);
  }

  /** The slot of the oldest entry, or -1. */
  get oldest(): number {
    return this.allHead;
  }

  /** The slot after `slot` in age order, or -1. */
  newerThan(slot: number): number {
    return this.allNext[slot]!;
  }

  /** Every slot in use, oldest first. */
  *inOrder(): Generator<number> {
    for (let slot = this.allHead; slot !== NONE; slot = this.allNext[slot]!) yield slot;
  }

  /**
   * Every owner holding slots, in bucket order (count, then place in the bucket): a snapshot keeps
   * it.
   */
  ownerOrder(): number[] {
    const owners: number[] = [];
    for (let count = 1; count <= this.heaviestCount; count++) {
      for (let owner = this.bucketHead[count]!; owner !== NONE; owner = this.bucketNext[owner]!)
        owners.push(owner);
    }
    return owners;
  }

  /**
   * Puts the owners of each bucket back in the order of `ownerOrder` (after a restore re-took every
   * entry, which orders them by the restore's own history). Ignored unless it names every owner
   * holding slots exactly once (a snapshot from before the order was kept).
   */
  restoreOwnerOrder(owners: readonly number[]): void {
    let holders = 0;
    for (let owner = 0; owner < this.ownCount.length; owner++)
      if (this.ownCount[owner]! > 0) holders++;
    const seen = new Set<number>();
    for (const owner of owners) {
      if (
        seen.has(owner) ||
        !(owner >= 0 && owner < this.ownCount.length && this.ownCount[owner]! > 0)
      )
        return;
      seen.add(owner);
    }
    if (seen.size !== holders) return;
    this.bucketHead.fill(NONE);
    for (let i = owners.length - 1; i >= 0; i--) {
      const owner = owners[i]!;
      const count = this.ownCount[owner]!;
      const head = this.bucketHead[count]!;
      this.bucketPrev[owner] = NONE;
      this.bucketNext[owner] = head;
      if (head !== NONE) this.bucketPrev[head] = owner;
      this.bucketHead[count] = owner;
    }
  }

  private maxCount(): number {
    return Math.min(this.capacity, this.perOwnerMax);
  }

  private freshSlot(): number {
    const slot = this.fresh++;
    if (slot === this.allPrev.length) {
      const length = Math.min(this.capacity, slot * 2);
      this.allPrev = grown(this.allPrev, length);
      this.allNext = grown(this.allNext, length);
      this.ownPrev = grown(this.ownPrev, length);
      this.ownNext = grown(this.ownNext, length);
      this.ownerOf = grown(this.ownerOf, length);
    }
    return slot;
  }

  private ensureOwner(owner: number): void {
    if (owner < this.ownCount.length) return;
    let length = this.ownCount.length * 2;
    while (length <= owner) length *= 2;
    this.ownHead = grown(this.ownHead, length, NONE);
    this.ownTail = grown(this.ownTail, length, NONE);
    this.ownCount = grown(this.ownCount, length);
    this.bucketPrev = grown(this.bucketPrev, length);
    this.bucketNext = grown(this.bucketNext, length);
  }

  /** Appends `slot` to both lists as the newest, and counts it for `owner`. */
  private link(slot: number, owner: number): void {
    this.ownerOf[slot] = owner;
    this.allPrev[slot] = this.allTail;
    this.allNext[slot] = NONE;
    if (this.allTail === NONE) this.allHead = slot;
    else this.allNext[this.allTail] = slot;
    this.allTail = slot;
    this.ownPrev[slot] = this.ownTail[owner]!;
    this.ownNext[slot] = NONE;
    if (this.ownTail[owner] === NONE) this.ownHead[owner] = slot;
    else this.ownNext[this.ownTail[owner]!] = slot;
    this.ownTail[owner] = slot;
    this.count++;
    this.recount(owner, this.ownCount[owner]! + 1);
  }

  private unlink(slot: number): void {
    const owner = this.ownerOf[slot]!;
    const prev = this.allPrev[slot]!;
    const next = this.allNext[slot]!;
    if (prev === NONE) this.allHead = next;
    else this.allNext[prev] = next;
    if (next === NONE) this.allTail = prev;
    else this.allPrev[next] = prev;
    const ownPrev = this.ownPrev[slot]!;
    const ownNext = this.ownNext[slot]!;
    if (ownPrev === NONE) this.ownHead[owner] = ownNext;
    else this.ownNext[ownPrev] = ownNext;
    if (ownNext === NONE) this.ownTail[owner] = ownPrev;
    else this.ownPrev[ownNext] = ownPrev;
    this.count--;
    this.recount(owner, this.ownCount[owner]! - 1);
  }

  /** Moves `owner` from the bucket of its count to the bucket of `next` (a step of one). */
  private recount(owner: number, next: number): void {
    const current = this.ownCount[owner]!;
    if (current > 0) {
      const prev = this.bucketPrev[owner]!;
      const after = this.bucketNext[owner]!;
      if (prev === NONE) this.bucketHead[current] = after;
      else this.bucketNext[prev] = after;
      if (after !== NONE) this.bucketPrev[after] = prev;
    }
    this.ownCount[owner] = next;
    if (next > 0) {
      if (next >= this.bucketHead.length) {
        this.bucketHead = grown(
          this.bucketHead,
          Math.min(this.maxCount(), this.bucketHead.length * 2) + 1,
          NONE,
        );
      }
      const head = this.bucketHead[next]!;
      this.bucketPrev[owner] = NONE;
      this.bucketNext[owner] = head;
      if (head !== NONE) this.bucketPrev[head] = owner;
      this.bucketHead[next] = owner;
    }
    if (next > this.heaviestCount) this.heaviestCount = next;
    // Counts move by one, so the bucket below the emptied top one holds the owner that just moved.
    else if (current === this.heaviestCount && this.bucketHead[current] === NONE)
      this.heaviestCount = next;
  }
}

function grown(array: Int32Array, length: number, fill = 0): Int32Array {
  const bigger = new Int32Array(length);
  bigger.set(array);
  if (fill !== 0) bigger.fill(fill, array.length);
  return bigger;
}
