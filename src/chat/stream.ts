// Chat output without a stream: the completion body, built from actor deltas (streams: sse.ts).
import type { ToolCall } from '../providers/provider.ts';
import type { Usage } from '../state/events.ts';
import type { ChatCompletion } from './model.ts';

export type PublicFinishReason = 'stop' | 'tool_calls';

/**
 * The non-stream completion, to be serialized whole: JSON.stringify of this object is faster than
 * writing the text by template (measured: 0.66 vs 0.85 µs with the Response), unlike the SSE
 * chunks, whose constant head is reused across many frames.
 */
export function completionBody(
  id: string,
  createdS: number,
  model: string,
  content: string | null,
  toolCalls: readonly ToolCall[],
  finishReason: PublicFinishReason,
  usage: Usage,
): ChatCompletion {
  const message: ChatCompletion['choices'][number]['message'] = { role: 'assistant', content };
  if (toolCalls.length > 0) message.tool_calls = [...toolCalls];
  return {
    id,
    object: 'chat.completion',
    created: createdS,
    model,
    choices: [{ index: 0, message, finish_reason: finishReason }],
    usage,
  };
}
