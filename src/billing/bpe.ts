// Counts o200k_base tokens exactly (the tokenizer of OpenAI's GPT-4o family), with the vocabulary
// held in three typed arrays, built by the first count: no per-token object for the collector to
// mark, a few MB in all.
import { readFileSync } from 'node:fs';
import { assert } from '../util/assert.ts';
import vocabularyPath from './o200k_base.bin' with { type: 'file' };

/*
 * How a text is counted, as tiktoken (and gpt-tokenizer, its port) encode it: the split pattern
 * cuts the text into pieces; a piece whose UTF-8 bytes are a token counts 1; any other piece is
 * merged byte pair by byte pair, always the pair of lowest rank first (the leftmost among equals),
 * until no adjacent pair is a token, and counts its parts. Only counts are needed, so no token id
 * is ever kept: the merge works on a scratch copy of the piece's bytes, and rank lookups hash those
 * bytes in place, with no string or array made per piece.
 *
 * Special-token spellings (`<|endoftext|>`) are ordinary text here, as gpt-tokenizer counts them
 * with `disallowedSpecial: new Set()`: a prompt quoting one costs what its characters cost.
 */

/**
 * o200k_base's split pattern, as gpt-tokenizer's O200K_TOKEN_SPLIT_REGEX with one change: `\s`
 * is spelled out as Unicode's White_Space, which is what `\s` means to tiktoken (Rust's regex).
 * JavaScript's `\s` differs from it in two characters: it includes U+FEFF (the byte-order mark)
 * and leaves out U+0085 (next line), so gpt-tokenizer splits texts holding either where the
 * model's tokenizer does not (tests/billing/bpe.test.ts holds tiktoken's counts of such texts).
 */
const WHITE_SPACE = String.raw`\t-\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000`;
const CONTRACTION_SUFFIX = "'(?:[sS]|[dD]|[mM]|[tT]|[lL][lL]|[vV][eE]|[rR][eE])";
const OPTIONAL_CONTRACTION_SUFFIX = `(?:${CONTRACTION_SUFFIX})?`;
const O200K_SPLIT_PATTERN =
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+` +
  OPTIONAL_CONTRACTION_SUFFIX +
  String.raw`|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*` +
  OPTIONAL_CONTRACTION_SUFFIX +
  String.raw`|\p{N}{1,3}| ?[^${WHITE_SPACE}\p{L}\p{N}]+[\r\n/]*|[${WHITE_SPACE}]*[\r\n]+` +
  `|[${WHITE_SPACE}]+(?![^${WHITE_SPACE}])|[${WHITE_SPACE}]+`;
/**
 * Sticky, where gpt-tokenizer's is global: `test` then reports where the piece at `lastIndex` ends
 * without building a match array or a string. Every code point starts a match (a letter, a digit,
 * whitespace, or anything else through ` ?[^\s\p{L}\p{N}]+`; a lone surrogate is "anything else"),
 * so the pieces tile the text and the global search would find the same ones.
 */
const SPLIT = new RegExp(O200K_SPLIT_PATTERN, 'uy');

/** A rank no token has: larger than all, so the merge's search for the least skips it. */
const NO_RANK = 0x7fff_ffff;

// The vocabulary file (see bpe-vocabulary.ts for its format), read once per thread by its first
// count: its tables (~4.5 MB) are the largest part of a start's memory, and a process that never
// counts (the CLI, a gateway before its first request) need not hold them (issue 15).
const VOCABULARY_MAGIC = 'tgbpe01\n';
/** All tokens' bytes, by rank; a view on the file's buffer, not a copy. */
let TOKEN_BYTES = new Uint8Array(0);
/** Where each token starts in TOKEN_BYTES; the token of rank r is [TOKEN_START[r], [r + 1]). */
let TOKEN_START = new Uint32Array(1);
/** No token is longer (128 bytes in o200k_base): a longer byte run is not looked up. */
let TOKEN_BYTES_MAX = 0;
/**
 * The hash table from a token's bytes to its rank: open addressing, linear probing, each slot
 * rank + 1 (0: empty). 2^19 slots for 200,000 tokens, under 40 % full, so a lookup that finds
 * nothing (most pair lookups of a merge) ends after a probe or two. 2 MB.
 */
const SLOT_BITS = 19;
const SLOT_MASK = (1 << SLOT_BITS) - 1;
let SLOTS: Int32Array | null = null;

/** Reads the vocabulary and builds its tables: once per thread, before the first lookup. */
function loadVocabulary(): void {
  const file = readFileSync(vocabularyPath);
  assert(
    file.toString('latin1', 0, VOCABULARY_MAGIC.length) === VOCABULARY_MAGIC,
    'o200k_base.bin: not a vocabulary file of this format',
  );
  const tokenCount = file.readUInt32LE(VOCABULARY_MAGIC.length);
  const lengthsAt = VOCABULARY_MAGIC.length + 4;
  const tokenBytes = new Uint8Array(
    file.buffer,
    file.byteOffset + lengthsAt + tokenCount,
    file.byteLength - lengthsAt - tokenCount,
  );
  const tokenStart = new Uint32Array(tokenCount + 1);
  let tokenBytesMax = 0;
  for (let rank = 0; rank < tokenCount; rank++) {
    const length = file[lengthsAt + rank]!;
    tokenStart[rank + 1] = tokenStart[rank]! + length;
    if (length > tokenBytesMax) tokenBytesMax = length;
  }
  assert(tokenStart[tokenCount] === tokenBytes.length, 'o200k_base.bin: truncated or padded');
  assert(tokenCount < (1 << SLOT_BITS) / 2, 'o200k_base.bin: more tokens than the table holds');
  const slots = new Int32Array(1 << SLOT_BITS);
  for (let rank = 0; rank < tokenCount; rank++) {
    let slot = hashBytes(tokenBytes, tokenStart[rank]!, tokenStart[rank + 1]!) & SLOT_MASK;
    while (slots[slot] !== 0) slot = (slot + 1) & SLOT_MASK;
    slots[slot] = rank + 1;
  }
  TOKEN_BYTES = tokenBytes;
  TOKEN_START = tokenStart;
  TOKEN_BYTES_MAX = tokenBytesMax;
  SLOTS = slots;
  // The merge ends on parts that are tokens only because every single byte is one.
  for (let byte = 0; byte < 256; byte++) {
    assert(rankOf(new Uint8Array([byte]), 0, 1) !== NO_RANK, 'o200k_base.bin: a byte is no token');
  }
}

/** FNV-1a over bytes[from, to), its high bits folded down so that the low ones index the table. */
function hashBytes(bytes: Uint8Array, from: number, to: number): number {
  let hash = 0x811c_9dc5;
  for (let i = from; i < to; i++) hash = Math.imul(hash ^ bytes[i]!, 0x0100_0193);
  return hash ^ (hash >>> SLOT_BITS);
}

/** The rank of the token whose bytes are bytes[from, to), or NO_RANK. */
function rankOf(bytes: Uint8Array, from: number, to: number): number {
  const length = to - from;
  if (length > TOKEN_BYTES_MAX) return NO_RANK;
  // Every caller comes through countBpeTokens or tokenRank, which load the tables first.
  const slots = SLOTS!;
  for (let slot = hashBytes(bytes, from, to) & SLOT_MASK; ; slot = (slot + 1) & SLOT_MASK) {
    const entry = slots[slot]!;
    if (entry === 0) return NO_RANK;
    const start = TOKEN_START[entry - 1]!;
    if (TOKEN_START[entry]! - start !== length) continue;
    let i = 0;
    while (i < length && TOKEN_BYTES[start + i] === bytes[from + i]) i++;
    if (i === length) return entry - 1;
  }
}

/**
 * Scratch space, grown to the longest piece seen and kept (a piece is at most a segment of the
 * caller's text; tokens.ts keeps those to 16 K characters, 48 KiB here). One thread counts one
 * text at a time, and nothing here awaits.
 */
let pieceBytes = new Uint8Array(1024);

/** Tokens of `text`, counted as o200k_base encodes it with special-token spellings as text. */
export function countBpeTokens(text: string): number {
  if (SLOTS === null) loadVocabulary();
  SPLIT.lastIndex = 0;
  let count = 0;
  for (let start = 0; start < text.length; ) {
    const matched = SPLIT.test(text);
    assert(matched, 'the o200k_base split pattern missed a character');
    const end = SPLIT.lastIndex;
    // One ASCII character is always one token (every byte is one): the most common short piece.
    count += end - start === 1 && text.charCodeAt(start) < 0x80 ? 1 : countPiece(text, start, end);
    start = end;
  }
  return count;
}

/** Tokens of the piece text[start, end). */
function countPiece(text: string, start: number, end: number): number {
  const length = encodePiece(text, start, end);
  if (rankOf(pieceBytes, 0, length) !== NO_RANK) return 1;
  return countMerged(length);
}

/**
 * Writes the UTF-8 bytes of text[start, end) to pieceBytes and returns their number. A lone
 * surrogate becomes U+FFFD, as TextEncoder writes it (gpt-tokenizer) and as tiktoken replaces it.
 */
function encodePiece(text: string, start: number, end: number): number {
  // Three bytes a UTF-16 unit at most (a surrogate pair: two units, four bytes).
  if (pieceBytes.length < (end - start) * 3) pieceBytes = new Uint8Array((end - start) * 6);
  const out = pieceBytes;
  let n = 0;
  for (let i = start; i < end; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) {
      out[n++] = c;
    } else if (c < 0x800) {
      out[n++] = 0xc0 | (c >> 6);
      out[n++] = 0x80 | (c & 0x3f);
    } else if (c < 0xd800 || c > 0xdfff) {
      out[n++] = 0xe0 | (c >> 12);
      out[n++] = 0x80 | ((c >> 6) & 0x3f);
      out[n++] = 0x80 | (c & 0x3f);
    } else {
      const low = i + 1 < end ? text.charCodeAt(i + 1) : 0;
      if (c <= 0xdbff && low >= 0xdc00 && low <= 0xdfff) {
        const codePoint = 0x10000 + ((c - 0xd800) << 10) + (low - 0xdc00);
        out[n++] = 0xf0 | (codePoint >> 18);
        out[n++] = 0x80 | ((codePoint >> 12) & 0x3f);
        out[n++] = 0x80 | ((codePoint >> 6) & 0x3f);
        out[n++] = 0x80 | (codePoint & 0x3f);
        i++;
      } else {
        out[n++] = 0xef;
        out[n++] = 0xbf;
        out[n++] = 0xbd;
      }
    }
  }
  return n;
}

/**
 * Pieces up to this many bytes are merged by scanning for the least join each time (quadratic, but
 * the fastest on the short pieces that most merges are); longer ones through a heap (n log n: a run
 * of 16,384 spaces takes 11 ms, not 220). Measured where the two cross.
 */
const MERGE_SCAN_BYTES_MAX = 48;

/** Parts left when pieceBytes[0, length) is merged, as tiktoken's `_byte_pair_merge`. */
function countMerged(length: number): number {
  return length <= MERGE_SCAN_BYTES_MAX ? countMergedByScan(length) : countMergedByHeap(length);
}

// countMergedByScan's parts: part i starts at scanStart[i]; scanRank[i] is the rank of part i
// joined with part i + 1.
const scanStart = new Int32Array(MERGE_SCAN_BYTES_MAX + 1);
const scanRank = new Int32Array(MERGE_SCAN_BYTES_MAX + 1);

/**
 * tiktoken's loop itself: merging the least join removes one boundary and looks up the two joins it
 * changed.
 */
function countMergedByScan(length: number): number {
  const starts = scanStart;
  const ranks = scanRank;
  const bytes = pieceBytes;
  for (let i = 0; i < length - 1; i++) {
    starts[i] = i;
    ranks[i] = rankOf(bytes, i, i + 2);
  }
  starts[length - 1] = length - 1;
  ranks[length - 1] = NO_RANK;
  starts[length] = length;
  ranks[length] = NO_RANK;
  // Boundaries, the end's included: parts + 1.
  let boundaries = length + 1;
  for (;;) {
    let least = NO_RANK;
    let at = -1;
    for (let i = 0; i < boundaries - 1; i++) {
      if (ranks[i]! < least) {
        least = ranks[i]!;
        at = i;
      }
    }
    if (at < 0) break;
    // Part `at` absorbs part at + 1: its join with the part after that, and the join of the part
    // before with it, change; the boundary at + 1 goes.
    if (at > 0) ranks[at - 1] = rankOf(bytes, starts[at - 1]!, starts[at + 2]!);
    ranks[at] = at + 3 < boundaries ? rankOf(bytes, starts[at]!, starts[at + 3]!) : NO_RANK;
    for (let i = at + 1; i < boundaries - 1; i++) {
      starts[i] = starts[i + 1]!;
      ranks[i] = ranks[i + 1]!;
    }
    boundaries--;
  }
  return boundaries - 1;
}

// countMergedByHeap's parts, a list linked both ways and named by the byte each starts at (a part
// keeps its start when it absorbs the next): heapNext/heapPrevious, and heapJoinRank, the rank of
// the part joined with the next (REMOVED once it has been absorbed). Grown with pieceBytes.
let heapNext = new Int32Array(0);
let heapPrevious = new Int32Array(0);
let heapJoinRank = new Int32Array(0);
/**
 * The joins that may be merged, as rank * KEY_SCALE + start: the least key is the least rank, the
 * leftmost among equals, which is the join tiktoken's scan picks. Joins that changed since they
 * were pushed are skipped when they come out (a join's rank changes only as its bytes grow, so a
 * stale key never matches its part's current rank). At most one key a byte plus two a merge.
 */
let heapKeys = new Float64Array(0);
const KEY_SCALE = 2 ** 26;
const REMOVED = -1;

function countMergedByHeap(length: number): number {
  assert(length < KEY_SCALE, 'a piece too long for the merge keys');
  if (heapNext.length < length) {
    heapNext = new Int32Array(pieceBytes.length);
    heapPrevious = new Int32Array(pieceBytes.length);
    heapJoinRank = new Int32Array(pieceBytes.length);
    heapKeys = new Float64Array(pieceBytes.length * 3);
  }
  const bytes = pieceBytes;
  const next = heapNext;
  const previous = heapPrevious;
  const ranks = heapJoinRank;
  const keys = heapKeys;
  let size = 0;
  for (let i = 0; i < length; i++) {
    next[i] = i + 1;
    previous[i] = i - 1;
    const rank = i + 1 < length ? rankOf(bytes, i, i + 2) : NO_RANK;
    ranks[i] = rank;
    if (rank !== NO_RANK) size = heapPush(keys, size, rank * KEY_SCALE + i);
  }
  let parts = length;
  while (size > 0) {
    const key = keys[0]!;
    size = heapPop(keys, size);
    const rank = Math.floor(key / KEY_SCALE);
    const at = key - rank * KEY_SCALE;
    if (ranks[at] !== rank) continue;
    // Part `at` absorbs the next; its join with the part after that, and the join of the part
    // before with it, change.
    const absorbed = next[at]!;
    const after = next[absorbed]!;
    next[at] = after;
    if (after < length) previous[after] = at;
    ranks[absorbed] = REMOVED;
    parts--;
    const joined = after < length ? rankOf(bytes, at, next[after]!) : NO_RANK;
    ranks[at] = joined;
    if (joined !== NO_RANK) size = heapPush(keys, size, joined * KEY_SCALE + at);
    const before = previous[at]!;
    if (before >= 0) {
      const joinedBefore = rankOf(bytes, before, after);
      ranks[before] = joinedBefore;
      if (joinedBefore !== NO_RANK) size = heapPush(keys, size, joinedBefore * KEY_SCALE + before);
    }
  }
  return parts;
}

/** Adds `key` to the binary min-heap keys[0, size); returns the new size. */
function heapPush(keys: Float64Array, size: number, key: number): number {
  let i = size;
  while (i > 0) {
    const parent = (i - 1) >> 1;
    if (keys[parent]! <= key) break;
    keys[i] = keys[parent]!;
    i = parent;
  }
  keys[i] = key;
  return size + 1;
}

/** Removes the least key (keys[0]) from the heap keys[0, size); returns the new size. */
function heapPop(keys: Float64Array, size: number): number {
  const last = keys[--size]!;
  let i = 0;
  for (;;) {
    let child = 2 * i + 1;
    if (child >= size) break;
    if (child + 1 < size && keys[child + 1]! < keys[child]!) child++;
    if (keys[child]! >= last) break;
    keys[i] = keys[child]!;
    i = child;
  }
  keys[i] = last;
  return size;
}

/** The rank of the token spelled by `bytes`, or -1: for the tests that check the table. */
export function tokenRank(bytes: Uint8Array): number {
  if (SLOTS === null) loadVocabulary();
  const rank = rankOf(bytes, 0, bytes.length);
  return rank === NO_RANK ? -1 : rank;
}

/** The number of tokens in the vocabulary (special tokens not included). */
export function vocabularyTokens(): number {
  if (SLOTS === null) loadVocabulary();
  return TOKEN_START.length - 1;
}
