// A count of bytes held at once against a bound, taken and given back by its users (the request
// bodies being read: http/body.ts).
import { assert } from './assert.ts';

export class ByteBudget {
  private heldBytes = 0;

  constructor(readonly bytesMax: number) {}

  /** Bytes held right now. */
  get bytes(): number {
    return this.heldBytes;
  }

  /** Takes `bytes` when they fit under the bound; false (nothing taken) when not. */
  tryTake(bytes: number): boolean {
    assert(Number.isSafeInteger(bytes) && bytes >= 0, 'bytes taken must be a count');
    if (this.heldBytes + bytes > this.bytesMax) return false;
    this.heldBytes += bytes;
    return true;
  }

  give(bytes: number): void {
    this.heldBytes -= bytes;
    // Given back more than was taken: a leak the other way would refuse every body in time.
    assert(this.heldBytes >= 0, 'more bytes given back than taken');
  }
}
