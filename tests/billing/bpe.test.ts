// The o200k_base counter: its vocabulary file is the tiktoken data, its table finds every token,
// and its counts equal gpt-tokenizer's (the reference it replaced) over thousands of varied texts,
// and tiktoken's own where gpt-tokenizer departs from it (a byte-order mark).
import { describe, expect, test } from 'bun:test';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { countTokens, setMergeCacheSize } from 'gpt-tokenizer/encoding/o200k_base';
import { countBpeTokens, tokenRank, vocabularyTokens } from '../../src/billing/bpe.ts';
import {
  encodeVocabulary,
  TIKTOKEN_SOURCE,
  VOCABULARY_FILE,
} from '../../src/billing/bpe-vocabulary.ts';

const ROOT = join(import.meta.dir, '../..');

/** The reference: gpt-tokenizer's count, special-token spellings counted as text. */
const AS_TEXT = { disallowedSpecial: new Set<string>() };
const reference = (text: string) => countTokens(text, AS_TEXT);
// Its merge cache, at its default size, makes it slower on this many novel texts (see tokens.ts).
setMergeCacheSize(2_000);

/** A text in a failure message: escaped, and cut short. */
const shown = (text: string) =>
  `${JSON.stringify(text.slice(0, 120))}${text.length > 120 ? ` … (${text.length} chars)` : ''}`;

/** Deterministic pseudo-random numbers (mulberry32), so that a failure can be replayed. */
function random(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b_79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

/** Code point ranges to draw characters from: scripts, symbols, marks, spaces, digits, astral. */
const RANGES: ReadonlyArray<readonly [number, number]> = [
  [0x20, 0x7e], // ASCII
  [0xa0, 0xff], // Latin-1, no-break space, ½ ² ³
  [0x100, 0x24f], // Latin extended
  [0x300, 0x36f], // combining marks
  [0x370, 0x3ff], // Greek
  [0x400, 0x4ff], // Cyrillic
  [0x590, 0x5ff], // Hebrew
  [0x600, 0x6ff], // Arabic, Arabic-Indic digits
  [0x900, 0x97f], // Devanagari (marks inside words)
  [0xe00, 0xe7f], // Thai
  [0x1100, 0x11ff], // Hangul jamo
  [0x1e00, 0x1eff], // Latin extended additional
  [0x2000, 0x206f], // general punctuation, odd spaces, zero-width joiner, line separator
  [0x2150, 0x218f], // number forms (Roman numerals: letters that are numbers)
  [0x2190, 0x2bff], // arrows, maths, boxes, symbols
  [0x3000, 0x30ff], // CJK punctuation, ideographic space, kana
  [0x4e00, 0x9fff], // CJK ideographs
  [0xac00, 0xd7a3], // Hangul syllables
  [0xd800, 0xdfff], // lone surrogates
  [0xf900, 0xfefe], // compatibility, presentation forms (U+FEFF left out: see the BOM test)
  [0xff00, 0xffef], // full-width forms
  [0x1f300, 0x1faff], // emoji
  [0x1d400, 0x1d7ff], // mathematical letters and digits
  [0x10000, 0x10ffff], // anything astral, mostly unassigned
];

const WORDS = [
  'the',
  'The',
  'THE',
  'quick',
  'Brown',
  "don't",
  "I'M",
  "we're",
  "they'LL",
  "it's",
  "you'd",
  "'ve",
  'naïve',
  'Zoë',
  'straße',
  'ÉCOLE',
  'Привет',
  'мир',
  '日本語',
  'こんにちは',
  '안녕하세요',
  'مرحبا',
  'שלום',
  'नमस्ते',
  'ภาษาไทย',
  'CamelCaseIdentifier',
  'snake_case_name',
  'HTTPServer',
  'x86_64',
  'v1.2.3',
  '3.14159',
  '1,000,000',
  '2026-01-01T00:00:00Z',
  '0x7fffffff',
];

const SNIPPETS = [
  '<|endoftext|>',
  '<|im_start|>system\n',
  '<|im_end|>',
  '<|fim_prefix|>',
  '<|endofprompt|>',
  '<|im_sep|>',
  'const x = { a: 1, b: [2, 3] };\n',
  'if (a !== b) {\n\treturn a => a * 2;\n}\n',
  '// comment\n/* block */\n',
  'def f(x):\n    return x ** 2\n\n',
  '<div class="a">&amp;</div>',
  'https://example.com/a/b?c=d&e=f#g',
  'C:\\Users\\name\\file.txt',
  'path/to/dir/',
  '$ npm run build && ./dist/tollgate serve',
  '{"role":"user","content":"hi"}',
  '👍🏽',
  '👨‍👩‍👧‍👦',
  '🇫🇷🇯🇵',
  '❤️',
  'e\u0301\u0302\u0303',
  '\u0301',
  'a\u200db',
  '\ud83d',
  '\ude00\ud83d',
  '\r\n',
  '\n\n\n',
  ' \n ',
  '\t\t',
  '\u00a0',
  '\u3000',
  '\u2028',
  '٣٤٥',
  '½²³',
  'Ⅻ',
];

/** A random text of up to `atoms` pieces drawn from all of the above, and long runs. */
function randomText(next: () => number, atoms: number): string {
  const pick = <T>(list: readonly T[]) => list[Math.floor(next() * list.length)]!;
  const parts: string[] = [];
  const count = 1 + Math.floor(next() * atoms);
  for (let i = 0; i < count; i++) {
    const kind = next();
    if (kind < 0.35) {
      const [from, to] = pick(RANGES);
      let codePoint = from + Math.floor(next() * (to - from + 1));
      if (codePoint === 0xfeff) codePoint = 0x20;
      parts.push(String.fromCodePoint(codePoint));
    } else if (kind < 0.6) parts.push(pick(WORDS));
    else if (kind < 0.75) parts.push(' ');
    else if (kind < 0.85) parts.push(pick(SNIPPETS));
    else if (kind < 0.9) parts.push(String(Math.floor(next() * 10 ** (1 + next() * 12))));
    else if (kind < 0.95) {
      // Runs: of one character (letters, digits, spaces, newlines, an emoji) or of spaces and
      // newlines mixed, short and long.
      const length = 1 + Math.floor(next() ** 2 * 300);
      const unit = pick(['a', 'Z', '9', '=', ' ', '\n', '\t', '😀', 'é', '中', ' \n']);
      parts.push(unit.repeat(length));
    } else {
      const bytes = new Uint8Array(1 + Math.floor(next() * 200));
      for (let b = 0; b < bytes.length; b++) bytes[b] = Math.floor(next() * 256);
      parts.push(
        next() < 0.5 ? Buffer.from(bytes).toString('base64') : Buffer.from(bytes).toString('hex'),
      );
    }
  }
  return parts.join('');
}

/** Texts from the repository itself: code, prose, JSON, the contract; and their lines. */
function repositoryTexts(): string[] {
  const texts: string[] = [];
  const files = new Bun.Glob('{src,tests,docs,bench}/**/*.{ts,md,json}');
  for (const file of files.scanSync({ cwd: ROOT })) {
    const text = readFileSync(join(ROOT, file), 'utf8');
    texts.push(text);
    for (const line of text.split('\n')) if (line.length > 0) texts.push(line);
  }
  texts.push(readFileSync(join(ROOT, 'README.md'), 'utf8'));
  return texts;
}

/** The texts and token ids that tiktoken itself produced, which gpt-tokenizer ships for o200k. */
function tiktokenSamples(): Array<{ text: string; tokens: number }> {
  const plans = readFileSync(join(TIKTOKEN_SOURCE, '../TestPlans.txt'), 'utf8');
  const samples: Array<{ text: string; tokens: number }> = [];
  for (const plan of plans.split('\n\n')) {
    const match = /^EncodingName: o200k_base\nSample: (.*)\nEncoded: \[(.*)\]/.exec(plan);
    if (match)
      samples.push({ text: match[1]!, tokens: match[2]!.split(',').filter(Boolean).length });
  }
  return samples;
}

describe('the vocabulary', () => {
  test('o200k_base.bin is what bpe-vocabulary.ts makes of the tiktoken file', () => {
    const made = encodeVocabulary(readFileSync(TIKTOKEN_SOURCE, 'utf8'));
    expect(Buffer.from(made).equals(readFileSync(VOCABULARY_FILE))).toBe(true);
  });

  test('the table finds every token at its own rank, and no token that is not one', () => {
    const lines = readFileSync(TIKTOKEN_SOURCE, 'utf8').split('\n').filter(Boolean);
    expect(vocabularyTokens()).toBe(lines.length);
    let wrong = 0;
    for (const line of lines) {
      const [base64, rank] = line.split(' ');
      if (tokenRank(Buffer.from(base64!, 'base64')) !== Number(rank)) wrong++;
    }
    expect(wrong).toBe(0);
    // Not tokens: a prefix of the longest token made longer, bytes never in UTF-8, nothing.
    expect(tokenRank(new Uint8Array(129).fill(0x61))).toBe(-1);
    expect(tokenRank(new Uint8Array([0xff, 0xfe, 0xfd]))).toBe(-1);
    expect(tokenRank(new Uint8Array(0))).toBe(-1);
  });
});

describe('countBpeTokens', () => {
  test("equals tiktoken's own counts of the o200k_base samples gpt-tokenizer ships", () => {
    const samples = tiktokenSamples();
    expect(samples.length).toBeGreaterThan(50);
    const wrong = samples.filter(({ text, tokens }) => countBpeTokens(text) !== tokens);
    expect(wrong).toEqual([]);
  });

  test("equals gpt-tokenizer's count of every text and line of this repository", () => {
    const texts = repositoryTexts();
    expect(texts.length).toBeGreaterThan(5_000);
    const wrong = texts.filter((text) => countBpeTokens(text) !== reference(text));
    expect(wrong.slice(0, 3).map(shown)).toEqual([]);
  });

  test("equals gpt-tokenizer's count of 12,000 random texts of every kind of character", () => {
    const next = random(15);
    const wrong: string[] = [];
    for (let i = 0; i < 12_000; i++) {
      const text = randomText(next, i % 20 === 0 ? 100 : 12);
      if (countBpeTokens(text) !== reference(text)) wrong.push(text);
    }
    expect(wrong.slice(0, 3).map(shown)).toEqual([]);
  });

  test("equals gpt-tokenizer's count of long pieces (merged through the heap, not by scan)", () => {
    // Lengths around the scan's limit (48 bytes) and far past it; one piece each, or nearly, as
    // the run alone and after a character that joins its piece (equal pairs then lie otherwise
    // against the piece's ends, which tells a merge that takes the leftmost from one that does
    // not).
    const units: ReadonlyArray<readonly [unit: string, lead: string]> = [
      ['a', 'Q'],
      ['Z', 'Q'],
      ['ab', 'Q'],
      ['aab', 'Q'],
      ['é', 'Q'],
      ['ー', 'Q'],
      ['中', 'x'],
      [' ', '\t'],
      ['\n', '\t'],
      [' \n', '\t'],
      ['\n\n ', '\t'],
      ['\t', ' '],
      ['=', '-'],
      ['==-', '-'],
      ['😀', '!'],
    ];
    const next = random(16);
    const wrong: string[] = [];
    for (const [unit, lead] of units) {
      for (const length of [15, 16, 17, 24, 25, 48, 49, 50, 97, 300, 1_000, 4_000]) {
        for (const text of [unit.repeat(length), lead + unit.repeat(length)]) {
          if (countBpeTokens(text) !== reference(text)) wrong.push(shown(text));
        }
      }
    }
    // A long random word of lowercase letters, and of kana (one piece each).
    for (const [from, to] of [
      [0x61, 0x7a],
      [0x3041, 0x3096],
    ] as const) {
      for (const length of [60, 500, 3_000]) {
        let text = '';
        for (let i = 0; i < length; i++)
          text += String.fromCharCode(from + Math.floor(next() * (to - from + 1)));
        if (countBpeTokens(text) !== reference(text)) wrong.push(shown(text));
      }
    }
    expect(wrong).toEqual([]);
  });

  test('counts the empty text as 0 and special-token spellings as their text', () => {
    expect(countBpeTokens('')).toBe(0);
    // `<|endoftext|>` is one token to a caller that allows it; as text it is seven.
    expect(countBpeTokens('<|endoftext|>')).toBe(7);
    expect(countBpeTokens('<|endoftext|>')).toBe(reference('<|endoftext|>'));
  });

  test('counts a byte-order mark and a next-line character as tiktoken does', () => {
    // tiktoken 0.14.0's encode() of each text, with o200k_base's ranks and pattern. gpt-tokenizer
    // counts U+FEFF otherwise: its pattern's `\s` (JavaScript's) takes U+FEFF for whitespace, and
    // it decodes a byte pair to a string before looking it up, where TextDecoder drops a leading
    // U+FEFF; it counts "\uFEFF" as 2 tokens and "\uFEFFusing System;" as 5. U+0085, whitespace
    // to tiktoken and not to JavaScript, happens to be counted alike.
    const tiktoken: ReadonlyArray<readonly [string, number[]]> = [
      ['\ufeff', [5574]],
      ['\ufeffusing System;', [9251, 1219, 26]],
      ['\ufeff// comment\n', [76234, 5375, 198]],
      ['\ufeffnamespace App', [44173, 2583]],
      ['\ufeff\n\n', [42295]],
      ['a\ufeff.x', [64, 5574, 13, 87]],
      [' \ufeff', [71280]],
      ['\ufeff\ufeff\ufeff', [135153, 5574]],
      ['x\ufeffy', [87, 5574, 88]],
      ['\ufeff<?xml version="1.0"?>', [5574, 2663, 12046, 3926, 580, 16, 13, 15, 1, 10730]],
      ['\ufeff# Title\n\ntext', [110862, 19612, 279, 919]],
      ['\ufeff출장안마', [67837]],
      ['x\u0085 y', [87, 126, 227, 342]],
      ['line one\u0085line two', [1137, 1001, 126, 227, 1137, 1920]],
      ['a \u0085\n b', [64, 1322, 227, 198, 287]],
      ['a\u0085\u0085b', [64, 126, 227, 126, 227, 65]],
    ];
    const counted = tiktoken.map(([text]) => [text, countBpeTokens(text)]);
    expect(counted).toEqual(tiktoken.map(([text, tokens]) => [text, tokens.length]));
  });
});
