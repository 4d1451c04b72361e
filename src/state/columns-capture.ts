// The record table's columns as they were when a snapshot was taken, read in pieces while the
// snapshot is written instead of copied at once.
//
// Why: the copy was ~18 MB of fresh typed arrays at 100,000 records, made on the event loop at each
// snapshot (every ~6 s under load): a 3–13 ms stall while its pages were first touched, and ~18 MB
// more RSS until the collector freed it (issue 15's peak). Here the writer copies 1 MiB at a time
// from the live columns; the table hands each capture the rows it is about to overwrite (`keep`)
// before that capture has been written, which at these rates is a few thousand rows (~0.5 MB).
import { assert } from '../util/assert.ts';
import type { SnapshotSource } from '../wal/log.ts';

/** Rows kept aside by a capture start with room for this many and double as needed. */
const KEPT_ROWS_INITIAL = 256;
/**
 * At most this many runs per read: when eviction per key scatters the age order, nearly every
 * record is a run of its own, and a 1 MiB piece of a narrow column would be ~100,000 copies in one
 * turn (6–10 ms); capped, a read stays ~1 ms.
 */
const RUNS_PER_READ = 4096;

export class ColumnsCapture {
  /** Bytes of one row over all columns, in column order. */
  private readonly rowBytes: number;
  /** Each captured slot's row in the snapshot; -1 for other slots and for rows already kept. */
  private readonly positionOf: Int32Array;
  /** The kept rows' bytes (`rowBytes` each) and, by the same index, their rows in the snapshot. */
  private kept: Uint8Array;
  private readonly keptPositions: number[] = [];

  /**
   * `runs` holds the first and last slot of each run of consecutive slots, in the snapshot's row
   * order; `columns()` gives the table's live columns as bytes (they are replaced when it grows),
   * `widths` each column's bytes per row.
   */
  constructor(
    private readonly widths: readonly number[],
    private readonly columns: () => readonly Uint8Array[],
    private readonly runs: Int32Array,
    slots: number,
    readonly count: number,
  ) {
    this.rowBytes = widths.reduce((sum, width) => sum + width, 0);
    this.kept = new Uint8Array(KEPT_ROWS_INITIAL * this.rowBytes);
    this.positionOf = new Int32Array(slots).fill(-1);
    let position = 0;
    for (let run = 0; run < runs.length; run += 2) {
      for (let slot = runs[run]!; slot <= runs[run + 1]!; slot++)
        this.positionOf[slot] = position++;
    }
    assert(position === count, 'capture: the runs do not hold every record');
  }

  /**
   * The table is about to overwrite `slot`: its row is kept aside if this capture holds it and has
   * not kept it yet (a slot taken again during the capture holds a later record, not its own).
   */
  keep(slot: number): void {
    if (slot >= this.positionOf.length) return;
    const position = this.positionOf[slot]!;
    if (position === -1) return;
    this.positionOf[slot] = -1;
    const index = this.keptPositions.length;
    if ((index + 1) * this.rowBytes > this.kept.length) {
      // Never more than one row per captured record.
      const bigger = new Uint8Array(Math.min(this.kept.length * 2, this.count * this.rowBytes));
      bigger.set(this.kept);
      this.kept = bigger;
    }
    const columns = this.columns();
    let at = index * this.rowBytes;
    for (let c = 0; c < columns.length; c++) {
      const width = this.widths[c]!;
      this.kept.set(columns[c]!.subarray(slot * width, (slot + 1) * width), at);
      at += width;
    }
    this.keptPositions.push(position);
  }

  /** Rows kept aside so far (for tests and the bound: at most one per captured record). */
  get keptCount(): number {
    return this.keptPositions.length;
  }

  /** Column `c` of every captured row, in row order, read in whole rows. */
  source(c: number): SnapshotSource {
    const width = this.widths[c]!;
    let offsetInRow = 0;
    for (let before = 0; before < c; before++) offsetInRow += this.widths[before]!;
    let run = 0;
    let slot = this.runs.length > 0 ? this.runs[0]! : 0;
    let position = 0;
    return {
      byteLength: this.count * width,
      read: (into: Uint8Array): number => {
        const rowsMax = Math.floor(into.length / width);
        assert(rowsMax > 0 || position === this.count, 'capture: a piece smaller than a row');
        const live = this.columns()[c]!;
        const first = position;
        let rows = 0;
        const runsEnd = run + 2 * RUNS_PER_READ;
        while (rows < rowsMax && run < this.runs.length && run < runsEnd) {
          const last = this.runs[run + 1]!;
          const n = Math.min(last - slot + 1, rowsMax - rows);
          into.set(live.subarray(slot * width, (slot + n) * width), rows * width);
          rows += n;
          slot += n;
          if (slot > last) {
            run += 2;
            slot = this.runs[run] ?? 0;
          }
        }
        position += rows;
        // Rows overwritten since the capture: their kept bytes replace what the table holds now.
        const positions = this.keptPositions;
        for (let k = 0; k < positions.length; k++) {
          const row = positions[k]! - first;
          if (row < 0 || row >= rows) continue;
          const from = k * this.rowBytes + offsetInRow;
          into.set(this.kept.subarray(from, from + width), row * width);
        }
        return rows * width;
      },
    };
  }
}
