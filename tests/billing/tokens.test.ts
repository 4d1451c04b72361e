// Token counts: the o200k_base tokenizer's count of the text as ordinary text, in bounded work.
import { describe, expect, test } from 'bun:test';
import { randomBytes } from 'node:crypto';
import { encode } from 'gpt-tokenizer/encoding/o200k_base';
import {
  countPromptTokens,
  countPromptTokensInline,
  countTextTokens,
  INLINE_TEXT_CHARS_MAX,
  promptCountCacheSize,
  rememberPromptTextTokens,
} from '../../src/billing/tokens.ts';

/**
 * The reference: the tokenizer's tokens of the text, special-token spellings included as plain
 * text.
 */
const reference = (text: string) => encode(text, { disallowedSpecial: new Set() }).length;

/** Varied text of about `chars` characters: words, code, numbers, unicode, line breaks. */
function mixedText(chars: number, seed: number): string {
  const parts = [
    'The',
    'quick',
    "don't",
    'Zoë',
    '日本語',
    '🙂',
    '123',
    '4567',
    '3.14',
    'x=1;',
    'if (a) {',
    '}',
    '\n',
    '\n\n',
    '  ',
    '\t',
    'CamelCase',
    'end.',
    '"quoted"',
    'http://example.com/a?b=c',
    '<|endoftext|>',
  ];
  let state = seed;
  let text = '';
  while (text.length < chars) {
    state = (Math.imul(state, 1_103_515_245) + 12_345) >>> 0;
    text += parts[state % parts.length]! + (state % 5 === 0 ? '' : ' ');
  }
  return text;
}

describe('countTextTokens', () => {
  test('counts as the tokenizer does, the first time and from the cache', () => {
    const texts = [
      'hello',
      'You are a helpful assistant. Answer briefly.',
      'Zoë ✓ 日本語 🙂 — multi-byte text',
      'quote <|endoftext|> and <|im_start|>system, as text',
    ];
    for (const text of texts) {
      const expected = reference(text);
      expect(countTextTokens(text)).toBe(expected);
      // A copy (another string object, as from another request body) is found again.
      expect(countTextTokens(JSON.parse(JSON.stringify(text)) as string)).toBe(expected);
    }
    expect(countTextTokens('hello!')).toBe(reference('hello!'));
    expect(countTextTokens('')).toBe(0);
  });

  test('long texts are counted in segments, exactly', () => {
    for (let seed = 1; seed <= 6; seed++) {
      const text = mixedText(20_000 + seed * 9_000, seed);
      expect(countTextTokens(text)).toBe(reference(text));
    }
  });

  test('a long run without whitespace is counted exactly, as one piece', () => {
    const run = randomBytes(3_000).toString('base64');
    expect(countTextTokens(run)).toBe(reference(run));
    const text = `before ${run} after`;
    expect(countTextTokens(text)).toBe(reference(text));
    // Lowercase letters and ideographs: one piece each, merged whole.
    const letters = Array.from(randomBytes(3_000), (byte) => String.fromCharCode(97 + (byte % 26)));
    expect(countTextTokens(letters.join(''))).toBe(reference(letters.join('')));
    const ideographs = Array.from(randomBytes(2_000), (byte) => String.fromCharCode(0x4e00 + byte));
    expect(countTextTokens(ideographs.join(''))).toBe(reference(ideographs.join('')));
  });

  test('4 MB of one-piece runs (letters, ideographs, spaces) is counted in bounded work', () => {
    // Each segment (16 K characters) is one piece of up to 48 KiB to merge: merged by scanning
    // (quadratic), these 4 MB took 209 s; through bpe.ts's heap, 2 s.
    const segment = 16 * 1024;
    const runs = [
      Array.from(randomBytes(segment), (byte) => String.fromCharCode(97 + (byte % 26))).join(''),
      Array.from(randomBytes(segment), (byte) => String.fromCharCode(0x4e00 + byte)).join(''),
      ' '.repeat(segment),
    ];
    const alone = runs.map((run) => countTextTokens(run));
    let text = '';
    let expected = 0;
    for (let i = 0; i < 256; i++) {
      text += runs[i % runs.length];
      expected += alone[i % runs.length]!;
    }
    // Each run counts as it does alone: no run has a single space to cut at, so the segments are
    // cut every 16 K characters, between runs.
    expect(countTextTokens(text)).toBe(expected);
  }, 20_000);

  test('with a limit, counting stops once past it; the full count later is still exact', () => {
    const text = mixedText(200_000, 99);
    const full = reference(text);
    const stopped = countTextTokens(text, 1_000);
    expect(stopped).toBeGreaterThan(1_000);
    expect(stopped).toBeLessThan(full);
    expect(countTextTokens(text)).toBe(full);
    // As a prompt: a stopped count is not cached; a full one is, and a later count with a limit
    // finds it.
    const messages = [{ role: 'user' as const, content: text }];
    expect(countPromptTokens(messages, null, 1_000)).toBeLessThan(full);
    expect(countPromptTokens(messages, null)).toBe(full + 6);
    expect(countPromptTokens(messages, null, 1_000)).toBe(full + 6);
  });
});

describe('countPromptTokens', () => {
  test('adds framing per message and the tool definitions', () => {
    const tools = [
      { type: 'function' as const, function: { name: 'f', parameters: { type: 'object' } } },
    ];
    expect(countPromptTokens([{ role: 'user', content: 'hello' }], null)).toBe(
      3 + 3 + reference('hello'),
    );
    expect(countPromptTokens([{ role: 'user', content: 'hello' }], tools)).toBe(
      3 + 3 + reference('hello') + reference(JSON.stringify(tools)),
    );
  });

  test('with a limit, stops past it across messages', () => {
    const long = mixedText(100_000, 5);
    const messages = [
      { role: 'user' as const, content: long },
      { role: 'user' as const, content: `${long} again` },
    ];
    // Stopped first: a text counted whole before would be found in the cache, whole.
    const stopped = countPromptTokens(messages, null, 2_000);
    const full = countPromptTokens(messages, null);
    expect(stopped).toBeGreaterThan(2_000);
    expect(stopped).toBeLessThan(full / 2);
  });
});

describe('countPromptTokensInline', () => {
  test(
    'counts a small prompt here, and leaves a ' + 'large one not in the cache to the worker (null)',
    () => {
      const small = [
        { role: 'user' as const, content: mixedText(INLINE_TEXT_CHARS_MAX - 100, 31) },
      ];
      expect(countPromptTokensInline(small, null, Number.POSITIVE_INFINITY)).toBe(
        countPromptTokens(small, null),
      );
      const large = [
        { role: 'user' as const, content: mixedText(INLINE_TEXT_CHARS_MAX + 100, 32) },
      ];
      expect(countPromptTokensInline(large, null, Number.POSITIVE_INFINITY)).toBeNull();
      // Tool definitions and tool-call arguments are text too.
      const tools = JSON.stringify([
        {
          type: 'function',
          function: { name: 'f', description: mixedText(INLINE_TEXT_CHARS_MAX, 33) },
        },
      ]);
      expect(countPromptTokensInline(small, tools, Number.POSITIVE_INFINITY)).toBeNull();
      const call = {
        id: 'c1',
        type: 'function' as const,
        function: { name: 'f', arguments: mixedText(INLINE_TEXT_CHARS_MAX + 10, 34) },
      };
      expect(
        countPromptTokensInline(
          [{ role: 'assistant', content: null, tool_calls: [call] }],
          null,
          Number.POSITIVE_INFINITY,
        ),
      ).toBeNull();
    },
  );

  test(
    'a large text the cache knows (counted here ' + 'before, or by the worker) is counted here',
    () => {
      const system = mixedText(50_000, 35);
      const question = { role: 'user' as const, content: 'And then?' };
      const messages = [{ role: 'system' as const, content: system }, question];
      expect(countPromptTokensInline(messages, null, Number.POSITIVE_INFINITY)).toBeNull();
      rememberPromptTextTokens(system, reference(system));
      // Another string with the same text, as the next request's body gives.
      const again = [
        { role: 'system' as const, content: JSON.parse(JSON.stringify(system)) as string },
        question,
      ];
      expect(countPromptTokensInline(again, null, Number.POSITIVE_INFINITY)).toBe(
        3 + 3 + reference(system) + 3 + reference('And then?'),
      );
    },
  );
});

test('the prompt-count cache is bounded: many short prompts by entries, long ones by size', () => {
  for (let i = 0; i < 30_000; i++) rememberPromptTextTokens(`flood prompt ${i}`, 3);
  const short = promptCountCacheSize();
  expect(short.size).toBeLessThanOrEqual(short.sizeMax);
  // 16 MiB at 800 per entry: ~21,000 short prompts at most, whatever one key sends.
  expect(short.entries).toBeLessThanOrEqual(Math.floor(short.sizeMax / 800));
  expect(short.entries).toBeGreaterThan(20_000);
  const long = 'x'.repeat(1024 * 1024 - 8);
  for (let i = 0; i < 40; i++) rememberPromptTextTokens(`${i} ${long}`, 1);
  const after = promptCountCacheSize();
  expect(after.size).toBeLessThanOrEqual(after.sizeMax);
  expect(after.entries).toBeLessThan(20);
});
