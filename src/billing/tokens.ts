// Token counting with a real BPE tokenizer (o200k_base via gpt-tokenizer), never characters / 4.
import { countTokens as countBpe } from 'gpt-tokenizer/encoding/o200k_base';
import type { ProviderMessage, ToolDefinition } from '../providers/provider.ts';

// OpenAI's accounting for chat: each message costs a few framing tokens, and the reply is primed.
const TOKENS_PER_MESSAGE = 3;
const TOKENS_REPLY_PRIMING = 3;

/**
 * Text that spells a special token (`<|endoftext|>`, `<|im_start|>`) is counted as the ordinary text it
 * is: by default the tokenizer refuses it with an exception, which made such a prompt a 500.
 */
const AS_TEXT = { disallowedSpecial: new Set<string>() };

export function countTextTokens(text: string): number {
  return text.length === 0 ? 0 : countBpe(text, AS_TEXT);
}

/** Input tokens of a chat request: message texts, tool calls and tool definitions. */
export function countPromptTokens(messages: readonly ProviderMessage[], tools: readonly ToolDefinition[] | null): number {
  let tokens = TOKENS_REPLY_PRIMING;
  for (const message of messages) {
    tokens += TOKENS_PER_MESSAGE;
    if (message.content) tokens += countTextTokens(message.content);
    if (message.role === 'assistant' && message.tool_calls) {
      for (const call of message.tool_calls) {
        tokens += countTextTokens(call.function.name) + countTextTokens(call.function.arguments) + TOKENS_PER_MESSAGE;
      }
    }
  }
  if (tools && tools.length > 0) tokens += countTextTokens(JSON.stringify(tools));
  return tokens;
}
