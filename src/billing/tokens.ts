// Token counting with a real BPE tokenizer (o200k_base, bpe.ts), never characters / 4.
import { LRUCache } from 'lru-cache';
import type { ProviderMessage, ToolDefinition } from '../providers/provider.ts';
import { nextTurn } from '../util/promise.ts';
import { countBpeTokens } from './bpe.ts';

// OpenAI's accounting for chat: each message costs a few framing tokens, and the reply is primed.
const TOKENS_PER_MESSAGE = 3;
const TOKENS_REPLY_PRIMING = 3;

/**
 * Counts of prompt texts seen recently. Prompts repeat: the same system prompt opens most requests
 * of an application, a conversation resends its history every turn, a tool list is sent with every
 * call. Looking a text up costs a hash of it; counting it costs the tokenizer's regex and merges
 * over it (a sentence: ~2 µs counted, ~0.01 µs found). Bounded by entries and by the characters
 * held. Only prompts go in: answers and the simulator's texts do not repeat, and would push the
 * prompts out.
 */
const PROMPT_TEXT_CACHED_CHARS_MAX = 1024 * 1024;
/**
 * What an entry costs beyond its text, in the size bound: at most 16 MiB / 800 = ~21,000 entries.
 * An entry bound by `max` would be allocated up front (lru-cache's slots), resident from the start.
 */
const ENTRY_OVERHEAD_CHARS = 800;
const COUNTS = new LRUCache<string, number>({
  maxSize: 16 * 1024 * 1024,
  maxEntrySize: PROMPT_TEXT_CACHED_CHARS_MAX + ENTRY_OVERHEAD_CHARS,
  sizeCalculation: (_count, text) => text.length + ENTRY_OVERHEAD_CHARS,
  ttl: 3_600_000,
});

/**
 * Long texts are counted in segments this long (cut at a single space, where counting is exact),
 * so a count that has passed its limit stops there. A segment also bounds the longest piece the
 * tokenizer merges (a run without whitespace is one piece; bpe.ts merges it in n log n: 16 K
 * characters of random CJK, the worst measured, ~8 ms).
 */
const SEGMENT_CHARS = 16 * 1024;

/**
 * Tokens of `text`. With `limit`, counting may stop once the count passes it and return what it has
 * counted so far (more than `limit`): a prompt over the context window is refused whatever its
 * size, and the rest of a 4 MB body is never tokenized.
 */
export function countTextTokens(text: string, limit = Number.POSITIVE_INFINITY): number {
  if (text.length === 0) return 0;
  if (text.length <= SEGMENT_CHARS) return countBpeTokens(text);
  return runSteps(countTextSteps(text, limit));
}

/**
 * countTextTokens that lets the event loop run between segments (16 K characters, ~8 ms at worst):
 * for text counted on the loop that may be long (the simulator's 64 KiB of tool arguments).
 */
export async function countTextTokensYielding(
  text: string,
  limit = Number.POSITIVE_INFINITY,
): Promise<number> {
  const steps = countTextSteps(text, limit);
  for (let step = steps.next(); ; step = steps.next()) {
    if (step.done) return step.value;
    await nextTurn();
  }
}

/** Runs a counting walk to its end without pausing. */
export function runSteps<T>(steps: Generator<void, T>): T {
  for (;;) {
    const step = steps.next();
    if (step.done) return step.value;
  }
}

/**
 * countTextTokens that pauses (yields) after each segment, so that a worker can count a long text
 * in slices of time and serve other jobs between them. Gives exactly countTextTokens' result.
 */
function* countTextSteps(text: string, limit: number): Generator<void, number> {
  if (text.length <= SEGMENT_CHARS) return countTextTokens(text, limit);
  let count = 0;
  for (let start = 0; start < text.length; ) {
    const end = segmentEnd(text, start);
    count += countBpeTokens(text.slice(start, end));
    start = end;
    if (count > limit) return count;
    yield;
  }
  return count;
}

/**
 * Tokens of all `texts` together (no cache: answers do not repeat), in steps, stopping past
 * `limit`.
 */
export function* countTextsSteps(texts: readonly string[], limit: number): Generator<void, number> {
  let count = 0;
  for (const text of texts) {
    if (count > limit) break;
    count += yield* countTextSteps(text, limit - count);
  }
  return count;
}

/**
 * countTextTokens for a prompt text, through the cache (a text longer than an entry may be is not
 * looked up).
 */
function countPromptText(text: string, limit = Number.POSITIVE_INFINITY): number {
  if (text.length > PROMPT_TEXT_CACHED_CHARS_MAX) return countTextTokens(text, limit);
  const known = COUNTS.get(text);
  if (known !== undefined) return known;
  const count = countTextTokens(text, limit);
  // Past the limit the count may have stopped early, a lower bound only: not worth keeping.
  if (count <= limit) COUNTS.set(text, count);
  return count;
}

/** countPromptText in steps (countTextSteps), through the same cache with the same rules. */
function* countPromptTextSteps(text: string, limit: number): Generator<void, number> {
  if (text.length > PROMPT_TEXT_CACHED_CHARS_MAX) return yield* countTextSteps(text, limit);
  const known = COUNTS.get(text);
  if (known !== undefined) return known;
  const count = yield* countTextSteps(text, limit);
  if (count <= limit) COUNTS.set(text, count);
  return count;
}

/** What the prompt-count cache holds (entries, and its size in its own units), for its bound. */
export function promptCountCacheSize(): { entries: number; size: number; sizeMax: number } {
  return { entries: COUNTS.size, size: COUNTS.calculatedSize, sizeMax: COUNTS.maxSize };
}

/**
 * Keeps the count of a prompt text counted elsewhere (by the worker), so that its next request
 * counts it here from the cache.
 */
export function rememberPromptTextTokens(text: string, count: number): void {
  if (text.length <= PROMPT_TEXT_CACHED_CHARS_MAX) COUNTS.set(text, count);
}

/**
 * The length of the prefix of `text` whose count can be made apart from whatever follows it, with
 * no change to the total: its segments that text appended later cannot move (countTextTokens counts
 * the same segments, so the prefix's count plus the rest's equals the whole's). 0 when none is
 * settled.
 */
export function settledPrefixLength(text: string): number {
  let start = 0;
  // segmentEnd looks one character past its limit.
  while (text.length - start > SEGMENT_CHARS + 1) start = segmentEnd(text, start);
  return start;
}

/**
 * Where the segment from `start` ends: the end, or just before a single space between two words.
 */
function segmentEnd(text: string, start: number): number {
  if (text.length - start <= SEGMENT_CHARS) return text.length;
  const limit = start + SEGMENT_CHARS;
  // "a b" splits as "a" | " b" either way: the tokenizer joins a space to the word after it.
  for (let i = limit; i > start + SEGMENT_CHARS / 2; i--) {
    if (
      text.charCodeAt(i) === 32 &&
      !isWhitespace(text.charCodeAt(i - 1)) &&
      !isWhitespace(text.charCodeAt(i + 1))
    )
      return i;
  }
  // No such space in the second half (whitespace runs, or one long run): cut anywhere but a
  // surrogate pair.
  return isHighSurrogate(text.charCodeAt(limit - 1)) ? limit + 1 : limit;
}

function isWhitespace(c: number): boolean {
  return c === 32 || c === 10 || c === 9 || c === 13;
}

function isHighSurrogate(c: number): boolean {
  return c >= 0xd800 && c <= 0xdbff;
}

/**
 * Input tokens of a chat request: message texts, tool calls and tool definitions. With `limit`, may
 * stop once past it (see countTextTokens); the result is then more than `limit`, not the full
 * count.
 */
export function countPromptTokens(
  messages: readonly ProviderMessage[],
  tools: readonly ToolDefinition[] | null,
  limit = Number.POSITIVE_INFINITY,
): number {
  return countPromptTokensOf(
    messages,
    tools && tools.length > 0 ? JSON.stringify(tools) : null,
    limit,
  );
}

/** countPromptTokens with the tool definitions already serialized (null: none). */
export function countPromptTokensOf(
  messages: readonly ProviderMessage[],
  toolsJson: string | null,
  limit = Number.POSITIVE_INFINITY,
): number {
  let tokens = TOKENS_REPLY_PRIMING;
  for (const message of messages) {
    if (tokens > limit) return tokens;
    tokens += TOKENS_PER_MESSAGE;
    if (message.content) tokens += countPromptText(message.content, limit - tokens);
    if (message.role === 'assistant' && message.tool_calls) {
      for (const call of message.tool_calls) {
        tokens +=
          countPromptText(call.function.name) +
          countPromptText(call.function.arguments, limit - tokens) +
          TOKENS_PER_MESSAGE;
      }
    }
  }
  if (toolsJson !== null && tokens <= limit) tokens += countPromptText(toolsJson, limit - tokens);
  return tokens;
}

/**
 * countPromptTokensOf in steps, for the worker: the same walk, the same limit, the same count (a
 * test holds the two to it). `contentCounts`, when given, receives each message content's own
 * count, or -1 where counting stopped early or never reached it, for the event loop's cache.
 */
export function* countPromptTokensSteps(
  messages: readonly ProviderMessage[],
  toolsJson: string | null,
  limit: number,
  contentCounts: number[] | null = null,
): Generator<void, number> {
  let tokens = TOKENS_REPLY_PRIMING;
  for (const message of messages) {
    if (tokens > limit) return tokens;
    tokens += TOKENS_PER_MESSAGE;
    if (message.content) {
      const textLimit = limit - tokens;
      const count = yield* countPromptTextSteps(message.content, textLimit);
      contentCounts?.push(count <= textLimit ? count : -1);
      tokens += count;
    } else contentCounts?.push(-1);
    if (message.role === 'assistant' && message.tool_calls) {
      for (const call of message.tool_calls) {
        // As countPromptTokensOf: the arguments' limit is taken before the name's tokens are added.
        const argumentsLimit = limit - tokens;
        const nameTokens = countPromptText(call.function.name);
        tokens +=
          nameTokens +
          (yield* countPromptTextSteps(call.function.arguments, argumentsLimit)) +
          TOKENS_PER_MESSAGE;
      }
    }
  }
  if (toolsJson !== null && tokens <= limit)
    tokens += yield* countPromptTextSteps(toolsJson, limit - tokens);
  return tokens;
}

/**
 * Characters of text the tokenizer may read on the event loop for one request. The worst text
 * measured (random CJK or Thai, one piece merged byte by byte: ~0.5 µs a character; runs of spaces
 * ~0.35 µs; base64 ~0.05 µs) takes ~2 ms at this size, prose far less; a request with more text not
 * yet in the cache is counted off the loop.
 */
export const INLINE_TEXT_CHARS_MAX = 4_096;

/**
 * The prompt's tokens if counting them here is cheap, else null (count them off the event loop).
 * Cheap means at most INLINE_TEXT_CHARS_MAX characters that the cache does not already know. The
 * usual small request pays one pass over its message lengths and nothing else.
 */
export function countPromptTokensInline(
  messages: readonly ProviderMessage[],
  toolsJson: string | null,
  limit: number,
): number | null {
  if (
    promptChars(messages, toolsJson, false) > INLINE_TEXT_CHARS_MAX &&
    promptChars(messages, toolsJson, true) > INLINE_TEXT_CHARS_MAX
  )
    return null;
  return countPromptTokensOf(messages, toolsJson, limit);
}

/**
 * Characters of the prompt's texts (only those the cache does not know, with `uncachedOnly`),
 * counted until past INLINE_TEXT_CHARS_MAX.
 */
function promptChars(
  messages: readonly ProviderMessage[],
  toolsJson: string | null,
  uncachedOnly: boolean,
): number {
  let chars = toolsJson === null ? 0 : textChars(toolsJson, uncachedOnly);
  for (const message of messages) {
    if (chars > INLINE_TEXT_CHARS_MAX) return chars;
    if (message.content) chars += textChars(message.content, uncachedOnly);
    if (message.role === 'assistant' && message.tool_calls) {
      for (const call of message.tool_calls)
        chars += call.function.name.length + textChars(call.function.arguments, uncachedOnly);
    }
  }
  return chars;
}

function textChars(text: string, uncachedOnly: boolean): number {
  return uncachedOnly && text.length <= PROMPT_TEXT_CACHED_CHARS_MAX && COUNTS.has(text)
    ? 0
    : text.length;
}
