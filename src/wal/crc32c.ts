// CRC-32C (Castagnoli), the checksum of every WAL frame; slicing-by-4 tables for speed.
const POLY = 0x82f63b78;
const TABLES: Uint32Array[] = [];

{
  const t0 = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ POLY : c >>> 1;
    t0[n] = c >>> 0;
  }
  TABLES.push(t0);
  for (let t = 1; t < 4; t++) {
    const prev = TABLES[t - 1]!;
    const next = new Uint32Array(256);
    for (let n = 0; n < 256; n++) next[n] = (prev[n]! >>> 8) ^ t0[prev[n]! & 0xff]!;
    TABLES.push(next);
  }
}
const [T0, T1, T2, T3] = TABLES as [Uint32Array, Uint32Array, Uint32Array, Uint32Array];

export function crc32c(bytes: Uint8Array, start = 0, end = bytes.length, seed = 0): number {
  let crc = ~seed >>> 0;
  let i = start;
  for (; i + 4 <= end; i += 4) {
    crc ^= bytes[i]! | (bytes[i + 1]! << 8) | (bytes[i + 2]! << 16) | (bytes[i + 3]! << 24);
    crc = T3[crc & 0xff]! ^ T2[(crc >>> 8) & 0xff]! ^ T1[(crc >>> 16) & 0xff]! ^ T0[crc >>> 24]!;
  }
  for (; i < end; i++) crc = T0[(crc ^ bytes[i]!) & 0xff]! ^ (crc >>> 8);
  return ~crc >>> 0;
}
