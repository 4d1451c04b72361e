// Token counts: the o200k_base tokenizer's count of the text as ordinary text, in bounded work.
import { describe, expect, test } from 'bun:test';
import { randomBytes } from 'node:crypto';
import { encode } from 'gpt-tokenizer/encoding/o200k_base';
import { countPromptTokens, countTextTokens } from '../../src/billing/tokens.ts';

/** The reference: the tokenizer's tokens of the text, special-token spellings included as plain text. */
const reference = (text: string) => encode(text, { disallowedSpecial: new Set() }).length;

/** Varied text of about `chars` characters: words, code, numbers, unicode, line breaks. */
function mixedText(chars: number, seed: number): string {
  const parts = ['The', 'quick', "don't", 'Zoë', '日本語', '🙂', '123', '4567', '3.14', 'x=1;', 'if (a) {', '}', '\n', '\n\n', '  ', '\t', 'CamelCase', 'end.', '"quoted"', 'http://example.com/a?b=c', '<|endoftext|>'];
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
    const texts = ['hello', 'You are a helpful assistant. Answer briefly.', 'Zoë ✓ 日本語 🙂 — multi-byte text', 'quote <|endoftext|> and <|im_start|>system, as text'];
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

  test('a long run without whitespace is counted in slices, within a token per slice', () => {
    const run = randomBytes(3_000).toString('base64');
    const slices = Math.ceil(run.length / 256);
    expect(Math.abs(countTextTokens(run) - reference(run))).toBeLessThanOrEqual(slices);
    const text = `before ${run} after`;
    expect(Math.abs(countTextTokens(text) - reference(text))).toBeLessThanOrEqual(slices);
  });

  test('with a limit, counting stops once past it; the full count later is still exact', () => {
    const text = mixedText(200_000, 99);
    const full = reference(text);
    const stopped = countTextTokens(text, 1_000);
    expect(stopped).toBeGreaterThan(1_000);
    expect(stopped).toBeLessThan(full);
    expect(countTextTokens(text)).toBe(full);
    // As a prompt: a stopped count is not cached; a full one is, and a later count with a limit finds it.
    const messages = [{ role: 'user' as const, content: text }];
    expect(countPromptTokens(messages, null, 1_000)).toBeLessThan(full);
    expect(countPromptTokens(messages, null)).toBe(full + 6);
    expect(countPromptTokens(messages, null, 1_000)).toBe(full + 6);
  });
});

describe('countPromptTokens', () => {
  test('adds framing per message and the tool definitions', () => {
    const tools = [{ type: 'function' as const, function: { name: 'f', parameters: { type: 'object' } } }];
    expect(countPromptTokens([{ role: 'user', content: 'hello' }], null)).toBe(3 + 3 + reference('hello'));
    expect(countPromptTokens([{ role: 'user', content: 'hello' }], tools)).toBe(3 + 3 + reference('hello') + reference(JSON.stringify(tools)));
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
