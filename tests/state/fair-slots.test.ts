// Fair eviction (CONTRACT §8): per-key bounds, the heaviest holder pays at the total bound, expired
// first.
import { describe, expect, test } from 'bun:test';
import { SeededRandom } from '../../src/providers/simulator/random.ts';
import { BindingTable } from '../../src/state/bindings.ts';
import { FairSlots } from '../../src/state/fair-slots.ts';

/** The same rules written the slow, obvious way: a list of entries, scanned. */
class NaiveSlots {
  entries: Array<{ owner: number; id: number }> = [];
  constructor(
    readonly capacity: number,
    readonly perOwnerMax: number,
  ) {}
  count(owner: number): number {
    return this.entries.filter((entry) => entry.owner === owner).length;
  }
  /** Which ids the rules allow to make room for a new entry of `owner` (empty: none must go). */
  allowedVictims(owner: number, expired: (id: number) => boolean): number[] {
    const oldestOf = (o: number) => this.entries.find((entry) => entry.owner === o)!.id;
    if (this.count(owner) >= this.perOwnerMax) return [oldestOf(owner)];
    if (this.entries.length < this.capacity) return [];
    if (expired(this.entries[0]!.id)) return [this.entries[0]!.id];
    const counts = new Map<number, number>();
    for (const entry of this.entries) counts.set(entry.owner, (counts.get(entry.owner) ?? 0) + 1);
    const heaviest = Math.max(...counts.values());
    if (counts.get(owner) === heaviest) return [oldestOf(owner)];
    return [...counts].filter(([, n]) => n === heaviest).map(([o]) => oldestOf(o));
  }
}

describe('FairSlots', () => {
  test('a key past its own bound loses its own oldest entry, and only that', () => {
    const evicted: number[] = [];
    const slots = new FairSlots(100, 3, (slot) => evicted.push(slot));
    const victim = slots.take(0, () => false, 0);
    const mine = [1, 2, 3, 4, 5].map(() => slots.take(1, () => false, 0));
    expect(slots.held(0)).toBe(1);
    expect(slots.held(1)).toBe(3);
    // Key 1's first two slots went, to key 1 itself (slots are reused in place).
    expect(evicted).toEqual([mine[0]!, mine[1]!]);
    expect([...slots.inOrder()]).toEqual([victim, mine[2]!, mine[3]!, mine[4]!]);
  });

  test('at the total bound the heaviest holder pays, never a key under its share', () => {
    const slots = new FairSlots(10, 1_000, () => {});
    const take = (owner: number) => slots.take(owner, () => false, 0);
    for (let i = 0; i < 3; i++) take(0); // the victim: 3 of 10
    for (let i = 0; i < 10_000; i++) take(1); // the attacker fills everything else, over and over
    expect(slots.held(0)).toBe(3);
    expect(slots.held(1)).toBe(7);
    expect(slots.size).toBe(10);
  });

  test('a tie with the key asking for room is settled against that key', () => {
    const slots = new FairSlots(4, 1_000, () => {});
    for (const owner of [0, 1, 0, 1]) slots.take(owner, () => false, 0);
    slots.take(0, () => false, 0);
    expect([slots.held(0), slots.held(1)]).toEqual([2, 2]);
    slots.take(1, () => false, 0);
    expect([slots.held(0), slots.held(1)]).toEqual([2, 2]);
  });

  test('an expired oldest entry makes room before anyone pays', () => {
    const slots = new FairSlots(3, 1_000, () => {});
    const old = slots.take(0, () => false, 0);
    slots.take(1, () => false, 0);
    slots.take(1, () => false, 0);
    slots.take(2, (slot) => slot === old, 0);
    expect([slots.held(0), slots.held(1), slots.held(2)]).toEqual([0, 2, 1]);
  });

  test(
    'released slots are taken again; evictions ' +
      'follow the rules over random work (a naive model)',
    () => {
      for (const seed of [1, 2, 3, 4, 5, 6, 7, 8]) {
        const random = new SeededRandom(seed);
        const capacity = random.integer(1, 40);
        const perOwnerMax = random.integer(1, 30);
        const expiredIds = new Set<number>();
        const idOfSlot = new Map<number, number>();
        const slotOfId = new Map<number, number>();
        const evicted: number[] = [];
        const slots = new FairSlots(capacity, perOwnerMax, (slot) =>
          evicted.push(idOfSlot.get(slot)!),
        );
        const naive = new NaiveSlots(capacity, perOwnerMax);
        for (let id = 0; id < 3_000; id++) {
          const roll = random.next();
          if (roll < 0.1 && naive.entries.length > 0) {
            const entry = naive.entries.splice(random.integer(0, naive.entries.length - 1), 1)[0]!;
            slots.release(slotOfId.get(entry.id)!);
            slotOfId.delete(entry.id);
            continue;
          }
          if (roll < 0.15 && naive.entries.length > 0) expiredIds.add(naive.entries[0]!.id);
          // Skewed owners: owner 0 sends most of the traffic.
          const owner = random.next() < 0.6 ? 0 : random.integer(1, 6);
          const allowed = naive.allowedVictims(owner, (i) => expiredIds.has(i));
          evicted.length = 0;
          const slot = slots.take(owner, (s) => expiredIds.has(idOfSlot.get(s)!), 0);
          if (allowed.length === 0) expect(evicted).toEqual([]);
          else {
            expect(evicted.length).toBe(1);
            expect(allowed).toContain(evicted[0]!);
            naive.entries = naive.entries.filter((entry) => entry.id !== evicted[0]);
            slotOfId.delete(evicted[0]!);
          }
          naive.entries.push({ owner, id });
          idOfSlot.set(slot, id);
          slotOfId.set(id, slot);
          expect([...slots.inOrder()].map((s) => idOfSlot.get(s)!)).toEqual(
            naive.entries.map((entry) => entry.id),
          );
          expect(slots.size).toBe(naive.entries.length);
          for (let o = 0; o <= 6; o++) expect(slots.held(o)).toBe(naive.count(o));
        }
      }
    },
  );
});

describe('BindingTable', () => {
  test('one key flooding the table never evicts another key within its share', () => {
    const table = new BindingTable(100, 100_000, () => false);
    const far = Date.now() + 86_400_000;
    table.set(
      'key_victim',
      'retry-me-0001',
      { requestId: 'chatcmpl-victim', fingerprint: 'f', expiresAtMs: far },
      Date.now(),
    );
    for (let i = 0; i < 100_001; i++)
      table.set(
        'key_attacker',
        `flood-${i}`,
        { requestId: `r${i}`, fingerprint: 'f', expiresAtMs: far },
        Date.now(),
      );
    expect(table.get('key_victim', 'retry-me-0001', Date.now())?.requestId).toBe('chatcmpl-victim');
    expect(table.size).toBe(100);
    expect(table.heldBy('key_attacker')).toBe(99);
    // The attacker kept its newest bindings.
    expect(table.get('key_attacker', 'flood-100000', Date.now())?.requestId).toBe('r100000');
    expect(table.get('key_attacker', 'flood-0', Date.now())).toBeUndefined();
  });

  test('the per-key bound evicts the key’s own oldest binding', () => {
    const table = new BindingTable(1_000, 3, () => false);
    const far = Date.now() + 60_000;
    for (let i = 0; i < 5; i++)
      table.set(
        'k',
        `idem-000${i}`,
        { requestId: `r${i}`, fingerprint: 'f', expiresAtMs: far },
        Date.now(),
      );
    expect([...table.entries(Date.now())].map(([, b]) => b.requestId)).toEqual(['r2', 'r3', 'r4']);
  });

  test(
    'rebinding a pair replaces its binding; a freed ' +
      'pair is gone; expired bindings read as absent',
    () => {
      const table = new BindingTable(10, 10, () => false);
      const now = Date.now();
      table.set(
        'k',
        'idem-0001',
        { requestId: 'a', fingerprint: 'f', expiresAtMs: now + 1000 },
        Date.now(),
      );
      table.set(
        'k',
        'idem-0001',
        { requestId: 'b', fingerprint: 'g', expiresAtMs: now + 1000 },
        Date.now(),
      );
      expect(table.size).toBe(1);
      expect(table.get('k', 'idem-0001', now)?.requestId).toBe('b');
      table.deleteIfBoundTo('k', 'idem-0001', 'a');
      expect(table.get('k', 'idem-0001', now)?.requestId).toBe('b');
      table.deleteIfBoundTo('k', 'idem-0001', 'b');
      expect(table.get('k', 'idem-0001', now)).toBeUndefined();
      table.set(
        'k',
        'idem-0002',
        { requestId: 'c', fingerprint: 'f', expiresAtMs: now + 10 },
        Date.now(),
      );
      expect(table.get('k', 'idem-0002', now + 10)).toBeUndefined();
      expect([...table.entries(now + 10)]).toEqual([]);
    },
  );
});

describe('BindingTable: expiry extended at a finish', () => {
  test('an extended binding becomes the newest: an expired one still goes first', () => {
    const TTL = 100;
    const running = new Set<string>();
    const table = new BindingTable(4, 100, (id) => running.has(id));
    const bind = (key: string, idem: string, id: string, at: number) =>
      table.set(key, idem, { requestId: id, fingerprint: 'f', expiresAtMs: at + TTL }, at);
    bind('A', 'a1', 'rA', 0);
    bind('B', 'b1', 'rB', 1); // expires at 101
    table.extend('A', 'a1', 'rA', 0, 50); // rA ends at 50: lives to 150
    bind('D', 'd1', 'rD1', 60);
    bind('D', 'd2', 'rD2', 61);
    bind('E', 'e1', 'rE1', 120); // the table is full: B's expired binding is the one to go
    expect(table.heldBy('B')).toBe(0);
    expect(table.get('D', 'd1', 120)?.requestId).toBe('rD1');
    expect(table.get('A', 'a1', 120)?.expiresAtMs).toBe(150);
  });

  test('a running request’s binding is neither expired nor the first to make room', () => {
    const running = new Set(['rA']);
    const table = new BindingTable(2, 100, (id) => running.has(id));
    table.set('A', 'a1', { requestId: 'rA', fingerprint: 'f', expiresAtMs: 10 }, 0);
    table.set('B', 'b1', { requestId: 'rB', fingerprint: 'f', expiresAtMs: 1_000 }, 1);
    expect(table.get('A', 'a1', 500)?.requestId).toBe('rA');
    // Full: A's binding is the oldest and past its expiry, but its request runs.
    table.set('C', 'c1', { requestId: 'rC', fingerprint: 'f', expiresAtMs: 1_000 }, 500);
    expect(table.get('A', 'a1', 500)?.requestId).toBe('rA');
    running.delete('rA');
    expect(table.get('A', 'a1', 500)).toBeUndefined();
  });
});
