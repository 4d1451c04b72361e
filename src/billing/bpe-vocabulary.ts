// Writes o200k_base.bin, the tokenizer's vocabulary in the compact form bpe.ts loads, from the
// tiktoken file gpt-tokenizer ships. Run when that file changes:
// `bun src/billing/bpe-vocabulary.ts`. Never imported by the server: only this script and the test
// that holds the two files together use it.
//
// The vocabulary is OpenAI's o200k_base from tiktoken (github.com/openai/tiktoken), which
// gpt-tokenizer redistributes unchanged; both are MIT licensed: o200k_base.NOTICE, beside the
// data, carries their notices.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/**
 * The format, little-endian, nothing else in the file:
 *   8 bytes  the magic `tgbpe01\n` (a format change gets a new one)
 *   4 bytes  n, the number of tokens (ranks are 0 … n-1, none missing)
 *   n bytes  each token's length in bytes (1 … 255), by rank
 *   the tokens' bytes, one after another, by rank
 */
export const VOCABULARY_MAGIC = 'tgbpe01\n';

/** The compact file for the lines of a `.tiktoken` file (`base64 rank`, ranks in order). */
export function encodeVocabulary(tiktoken: string): Uint8Array {
  const tokens: Uint8Array[] = [];
  for (const line of tiktoken.split('\n')) {
    if (line === '') continue;
    const [base64, rankText] = line.split(' ');
    const rank = Number(rankText);
    // Ranks must run 0, 1, 2 …: the loader takes a token's rank from its position.
    if (!base64 || rank !== tokens.length) throw new Error(`rank out of order: ${line}`);
    const bytes = Buffer.from(base64, 'base64');
    if (bytes.length === 0 || bytes.length > 255) throw new Error(`token length: ${line}`);
    tokens.push(bytes);
  }
  const tokenBytes = tokens.reduce((sum, token) => sum + token.length, 0);
  const out = new Uint8Array(VOCABULARY_MAGIC.length + 4 + tokens.length + tokenBytes);
  out.set(new TextEncoder().encode(VOCABULARY_MAGIC), 0);
  new DataView(out.buffer).setUint32(VOCABULARY_MAGIC.length, tokens.length, true);
  let lengthAt = VOCABULARY_MAGIC.length + 4;
  let bytesAt = lengthAt + tokens.length;
  for (const token of tokens) {
    out[lengthAt++] = token.length;
    out.set(token, bytesAt);
    bytesAt += token.length;
  }
  return out;
}

export const TIKTOKEN_SOURCE = join(
  import.meta.dir,
  '../../node_modules/gpt-tokenizer/data/o200k_base.tiktoken',
);
export const VOCABULARY_FILE = join(import.meta.dir, 'o200k_base.bin');

if (import.meta.main) {
  const out = encodeVocabulary(readFileSync(TIKTOKEN_SOURCE, 'utf8'));
  writeFileSync(VOCABULARY_FILE, out);
  console.log(`${VOCABULARY_FILE}: ${out.length} bytes`);
}
