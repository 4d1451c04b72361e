// Chat output: SSE chunk frames and the non-stream completion body, built from actor deltas.
import type { GatewayError } from '../http/errors.ts';
import { errorBody } from '../http/errors.ts';
import type { ToolCall } from '../providers/provider.ts';
import type { Usage } from '../state/events.ts';

export const DONE_FRAME = 'data: [DONE]\n\n';

export type PublicFinishReason = 'stop' | 'tool_calls';

/**
 * Builds the SSE frames of one stream, as text (the sink encodes what it sends in one go). The constant
 * head of every chunk (id, object, created, model) is serialized once, so a delta costs one concatenation.
 */
export class ChunkEncoder {
  private readonly head: string;

  constructor(id: string, createdS: number, model: string) {
    this.head = `data: {"id":${JSON.stringify(id)},"object":"chat.completion.chunk","created":${createdS},"model":${JSON.stringify(model)},"choices":`;
  }

  private frame(choices: string, tail = ''): string {
    return `${this.head}${choices}${tail}}\n\n`;
  }

  role(): string {
    return this.frame('[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]');
  }

  text(text: string): string {
    return this.frame(`[{"index":0,"delta":{"content":${JSON.stringify(text)}},"finish_reason":null}]`);
  }

  toolCall(index: number, id: string | null, name: string | null, args: string): string {
    const opening = id !== null ? `"id":${JSON.stringify(id)},"type":"function",` : '';
    const fn = name !== null ? `{"name":${JSON.stringify(name)},"arguments":${JSON.stringify(args)}}` : `{"arguments":${JSON.stringify(args)}}`;
    return this.frame(`[{"index":0,"delta":{"tool_calls":[{"index":${index},${opening}"function":${fn}}]},"finish_reason":null}]`);
  }

  finish(reason: PublicFinishReason): string {
    return this.frame(`[{"index":0,"delta":{},"finish_reason":"${reason}"}]`);
  }

  usage(usage: Usage): string {
    return this.frame('[]', `,"usage":${JSON.stringify(usage)}`);
  }
}

/** An error after the stream started: one `data: {"error": ...}` event, then the end (no [DONE]). */
export function errorFrame(error: GatewayError): string {
  return `data: ${JSON.stringify(errorBody(error))}\n\n`;
}

/**
 * The non-stream completion, to be serialized whole: JSON.stringify of this object is faster than
 * writing the text by template (measured: 0.66 vs 0.85 µs with the Response), unlike the SSE chunks,
 * whose constant head is reused across many frames.
 */
export function completionBody(
  id: string,
  createdS: number,
  model: string,
  content: string | null,
  toolCalls: ToolCall[],
  finishReason: PublicFinishReason,
  usage: Usage,
): Record<string, unknown> {
  const message: Record<string, unknown> = { role: 'assistant', content };
  if (toolCalls.length > 0) message.tool_calls = toolCalls;
  return {
    id,
    object: 'chat.completion',
    created: createdS,
    model,
    choices: [{ index: 0, message, finish_reason: finishReason }],
    usage,
  };
}
