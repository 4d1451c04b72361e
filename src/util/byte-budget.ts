// A count of bytes held at once against a bound, taken and given back by its users (the request
// bodies being read: http/body.ts).

export class ByteBudget {
  private heldBytes = 0;

  constructor(readonly bytesMax: number) {}

  /** Bytes held right now. */
  get bytes(): number {
    return this.heldBytes;
  }

  /** Takes `bytes` when they fit under the bound; false (nothing taken) when not. */
  tryTake(bytes: number): boolean {
    if (this.heldBytes + bytes > this.bytesMax) return false;
    this.heldBytes += bytes;
    return true;
  }

  give(bytes: number): void {
    this.heldBytes -= bytes;
  }
}
