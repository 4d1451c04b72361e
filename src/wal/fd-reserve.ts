// Spare file descriptors held for the log, so that running out of them elsewhere never fails it
// (§8).
//
// The process shares one descriptor table with every client connection: a flood of idle sockets can
// use it up, and then opening the next segment or a snapshot fails with EMFILE, which used to fail
// the log for good. A few descriptors opened at start (on /dev/null) are given up one at a time
// when an open of the log's hits EMFILE/ENFILE, and taken back once the log has closed one of its
// own.
import { closeSync, openSync } from 'node:fs';

/**
 * Enough for the log's worst moment: a new segment opened while a snapshot's file is open, plus
 * one.
 */
const RESERVED_FDS = 3;

function outOfDescriptors(error: unknown): boolean {
  const code = (error as NodeJS.ErrnoException)?.code;
  return code === 'EMFILE' || code === 'ENFILE';
}

export class FdReserve {
  private readonly spare: number[] = [];

  constructor() {
    this.refill();
  }

  /**
   * openSync that, when the process is out of descriptors, frees a spare and tries again. Our own
   * code runs on one thread and opens nothing between the close and the open, and the sockets are
   * accepted on this same thread, so the freed number is the one this open gets.
   */
  openSync(path: string, flags: string | number, mode?: number): number {
    for (;;) {
      try {
        return openSync(path, flags, mode);
      } catch (error) {
        // Any other failure keeps the spares (popping one first lost it, open, for good).
        if (!outOfDescriptors(error)) throw error;
        const spare = this.spare.pop();
        if (spare === undefined) throw error;
        closeSync(spare);
      }
    }
  }

  /** Takes spares back up to the count; call after the log closed a descriptor. Never throws. */
  refill(): void {
    while (this.spare.length < RESERVED_FDS) {
      try {
        this.spare.push(openSync('/dev/null', 'r'));
      } catch {
        return; // still out of descriptors: the next close of ours tries again
      }
    }
  }

  close(): void {
    for (const fd of this.spare.splice(0)) closeSync(fd);
  }
}
