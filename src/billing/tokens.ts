// Token counting with a real BPE tokenizer (o200k_base via gpt-tokenizer), never characters / 4.
import { countTokens as countBpe } from 'gpt-tokenizer/encoding/o200k_base';
import { LRUCache } from 'lru-cache';
import type { ProviderMessage, ToolDefinition } from '../providers/provider.ts';

// OpenAI's accounting for chat: each message costs a few framing tokens, and the reply is primed.
const TOKENS_PER_MESSAGE = 3;
const TOKENS_REPLY_PRIMING = 3;

/**
 * Text that spells a special token (`<|endoftext|>`, `<|im_start|>`) is counted as the ordinary text it
 * is: by default the tokenizer refuses it with an exception, which made such a prompt a 500.
 */
const AS_TEXT = { disallowedSpecial: new Set<string>() };

/**
 * Counts of prompt texts seen recently. Prompts repeat: the same system prompt opens most requests of an
 * application, a conversation resends its history every turn, a tool list is sent with every call.
 * Looking a text up costs a hash of it; counting it costs the tokenizer's regex and merges over it
 * (a sentence: ~2 µs counted, ~0.01 µs found). Bounded by entries and by the characters held. Only
 * prompts go in: answers and the simulator's texts do not repeat, and would push the prompts out.
 */
const PROMPT_TEXT_CACHED_CHARS_MAX = 1024 * 1024;
const COUNTS = new LRUCache<string, number>({
  max: 20_000,
  maxSize: 16 * 1024 * 1024,
  maxEntrySize: PROMPT_TEXT_CACHED_CHARS_MAX + 1,
  sizeCalculation: (_count, text) => text.length + 1,
  ttl: 3_600_000,
});

/**
 * The tokenizer's merge step costs the square of a piece's length: 50,000 letters without a space took
 * 2–15 s, so one request body could stop the gateway for minutes. A run of more than this many
 * characters without whitespace is counted in slices of this size, which keeps the cost linear; a
 * slice boundary may split a token, so such a run can count a token more per slice than the model
 * would (measured on random base64: 0.04 %).
 */
const RUN_CHARS_MAX = 256;
/** Long texts are counted in segments this long (cut at a single space, where counting is exact), so a
 * count that has passed its limit stops there. */
const SEGMENT_CHARS = 16 * 1024;

/**
 * Tokens of `text`. With `limit`, counting may stop once the count passes it and return what it has
 * counted so far (more than `limit`): a prompt over the context window is refused whatever its size,
 * and the rest of a 4 MB body is never tokenized.
 */
export function countTextTokens(text: string, limit = Number.POSITIVE_INFINITY): number {
  if (text.length === 0) return 0;
  if (text.length <= RUN_CHARS_MAX) return countBpe(text, AS_TEXT);
  let count = 0;
  for (let start = 0; start < text.length; ) {
    const end = segmentEnd(text, start);
    count += countSegment(text, start, end);
    start = end;
    if (count > limit) return count;
  }
  return count;
}

/** countTextTokens for a prompt text, through the cache (a text longer than an entry may be is not looked up). */
function countPromptText(text: string, limit = Number.POSITIVE_INFINITY): number {
  if (text.length > PROMPT_TEXT_CACHED_CHARS_MAX) return countTextTokens(text, limit);
  const known = COUNTS.get(text);
  if (known !== undefined) return known;
  const count = countTextTokens(text, limit);
  // Past the limit the count may have stopped early, a lower bound only: not worth keeping.
  if (count <= limit) COUNTS.set(text, count);
  return count;
}

/** Where the segment from `start` ends: the end, or just before a single space between two words. */
function segmentEnd(text: string, start: number): number {
  if (text.length - start <= SEGMENT_CHARS) return text.length;
  const limit = start + SEGMENT_CHARS;
  // "a b" splits as "a" | " b" either way: the tokenizer joins a space to the word after it.
  for (let i = limit; i > start + SEGMENT_CHARS / 2; i--) {
    if (text.charCodeAt(i) === 32 && !isWhitespace(text.charCodeAt(i - 1)) && !isWhitespace(text.charCodeAt(i + 1))) return i;
  }
  // No such space in the second half (whitespace runs, or one long run): cut anywhere but a surrogate pair.
  return isHighSurrogate(text.charCodeAt(limit - 1)) ? limit + 1 : limit;
}

/** Tokens of text[start, end), with runs of non-whitespace longer than RUN_CHARS_MAX in slices. */
function countSegment(text: string, start: number, end: number): number {
  let count = 0;
  let wholeFrom = start;
  let runStart = start;
  for (let i = start; i <= end; i++) {
    if (i < end && !isWhitespace(text.charCodeAt(i))) continue;
    if (i - runStart > RUN_CHARS_MAX) {
      // The text before the run, whole; then the run, slice by slice (never between a surrogate pair).
      if (runStart > wholeFrom) count += countBpe(text.slice(wholeFrom, runStart), AS_TEXT);
      let sliceStart = runStart;
      while (sliceStart < i) {
        let sliceEnd = Math.min(sliceStart + RUN_CHARS_MAX, i);
        if (sliceEnd < i && isHighSurrogate(text.charCodeAt(sliceEnd - 1))) sliceEnd++;
        count += countBpe(text.slice(sliceStart, sliceEnd), AS_TEXT);
        sliceStart = sliceEnd;
      }
      wholeFrom = i;
    }
    runStart = i + 1;
  }
  if (wholeFrom < end) count += countBpe(wholeFrom === 0 && end === text.length ? text : text.slice(wholeFrom, end), AS_TEXT);
  return count;
}

function isWhitespace(c: number): boolean {
  return c === 32 || c === 10 || c === 9 || c === 13;
}

function isHighSurrogate(c: number): boolean {
  return c >= 0xd800 && c <= 0xdbff;
}

/**
 * Input tokens of a chat request: message texts, tool calls and tool definitions. With `limit`, may
 * stop once past it (see countTextTokens); the result is then more than `limit`, not the full count.
 */
export function countPromptTokens(
  messages: readonly ProviderMessage[],
  tools: readonly ToolDefinition[] | null,
  limit = Number.POSITIVE_INFINITY,
): number {
  let tokens = TOKENS_REPLY_PRIMING;
  for (const message of messages) {
    if (tokens > limit) return tokens;
    tokens += TOKENS_PER_MESSAGE;
    if (message.content) tokens += countPromptText(message.content, limit - tokens);
    if (message.role === 'assistant' && message.tool_calls) {
      for (const call of message.tool_calls) {
        tokens += countPromptText(call.function.name) + countPromptText(call.function.arguments, limit - tokens) + TOKENS_PER_MESSAGE;
      }
    }
  }
  if (tools && tools.length > 0 && tokens <= limit) tokens += countPromptText(JSON.stringify(tools), limit - tokens);
  return tokens;
}
