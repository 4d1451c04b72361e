// IdMap: a Map of string ids whose removed values a young collection can free.

import { edenGC, fullGC, heapStats } from 'bun:jsc';
import { describe, expect, test } from 'bun:test';
import { IdMap } from '../../src/util/id-map.ts';

/** A small deterministic generator (xorshift32): the same operations on every run. */
function random(seed: number): () => number {
  let state = seed;
  return () => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) / 2 ** 32;
  };
}

describe('IdMap does what a Map does', () => {
  test('random sets, gets and deletes agree with a Map (order too), growing and shrinking', () => {
    const next = random(0x9e3779b9);
    const map = new IdMap<number>();
    const reference = new Map<string, number>();
    // Few distinct ids at first (collisions, overwrites, deletes of absent ids), then many (the
    // table grows), then mostly deletes (it shrinks).
    const phases = [
      { steps: 2_000, ids: 40, deleteShare: 0.4 },
      { steps: 20_000, ids: 5_000, deleteShare: 0.3 },
      { steps: 20_000, ids: 5_000, deleteShare: 0.9 },
    ];
    for (const { steps, ids, deleteShare } of phases) {
      for (let i = 0; i < steps; i++) {
        const id = `req-${Math.floor(next() * ids)}`;
        if (next() < deleteShare) expect(map.delete(id)).toBe(reference.delete(id));
        else {
          map.set(id, i);
          reference.set(id, i);
        }
        const probe = `req-${Math.floor(next() * ids)}`;
        expect(map.get(probe)).toBe(reference.get(probe));
        expect(map.has(probe)).toBe(reference.has(probe));
        expect(map.size).toBe(reference.size);
      }
      // In insertion order, as a Map's (a value replaced keeps its place, one re-added goes last).
      expect(map.keys()).toEqual([...reference.keys()]);
      expect(map.values()).toEqual([...reference.values()]);
      for (const id of reference.keys()) expect(map.get(id)).toBe(reference.get(id));
    }
    for (const id of [...reference.keys()]) {
      expect(map.delete(id)).toBe(true);
      reference.delete(id);
      expect(map.size).toBe(reference.size);
      for (const left of reference.keys()) expect(map.get(left)).toBe(reference.get(left));
    }
    expect(map.keys()).toEqual([]);
  });

  test('clear empties it; keys and values are copies the map may change under', () => {
    const map = new IdMap<string>();
    for (let i = 0; i < 100; i++) map.set(`id-${i}`, `value-${i}`);
    const values = map.values();
    for (const id of map.keys()) map.delete(id);
    expect(values).toHaveLength(100);
    expect(map.size).toBe(0);
    map.set('a', 'x').set('b', 'y');
    map.clear();
    expect(map.size).toBe(0);
    expect(map.get('a')).toBeUndefined();
    expect(map.keys()).toEqual([]);
  });
});

describe('IdMap and the collector', () => {
  test('values removed from a map in the old generation are freed by a young collection', () => {
    // What the gateway does with its requests in flight: each added under a fresh id and removed
    // when it ends, a few dozen at a time, in a map that has lived through a full collection. (A
    // Map keeps most of them until the next full collection: see src/util/id-map.ts.)
    class Request {
      readonly controller = new AbortController();
    }
    const map = new IdMap<Request>();
    map.set('warm', new Request());
    map.delete('warm');
    fullGC();
    const count = () => heapStats().objectTypeCounts.AbortController ?? 0;
    const before = count();
    const inFlight: string[] = [];
    for (let i = 0; i < 3_000; i++) {
      const id = `chatcmpl-${i}`;
      map.set(id, new Request());
      inFlight.push(id);
      if (inFlight.length > 32) map.delete(inFlight.shift()!);
    }
    for (const id of inFlight) map.delete(id);
    edenGC();
    // Not one per request: at most the odd one the collector finds on the stack (it scans it
    // conservatively).
    expect(count() - before).toBeLessThan(8);
  });
});
