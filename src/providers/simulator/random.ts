// A small seeded PRNG (mulberry32): the simulator's answers must repeat exactly for the same
// request.

export class SeededRandom {
  private state: number;

  constructor(seed: number) {
    this.state = seed >>> 0;
  }

  /** Derives the seed from any text (the canonical request) with Bun's wyhash. */
  static fromText(text: string): SeededRandom {
    // The low 32 bits of a 64-bit hash are as well mixed as the high ones.
    return new SeededRandom(Number(BigInt.asUintN(32, BigInt(Bun.hash(text)))));
  }

  /** A uniform float in [0, 1). */
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  }

  /** A uniform integer in [min, max], both inclusive. */
  integer(min: number, max: number): number {
    return min + Math.floor(this.next() * (max - min + 1));
  }

  pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.next() * items.length)]!;
  }
}
