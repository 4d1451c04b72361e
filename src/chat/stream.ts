// Chat output: SSE chunk frames and the non-stream completion body, built from actor deltas.
import type { GatewayError } from '../http/errors.ts';
import { errorBody } from '../http/errors.ts';
import type { ToolCall } from '../providers/provider.ts';
import type { Usage } from '../state/events.ts';

const ENCODER = new TextEncoder();
export const DONE_FRAME = ENCODER.encode('data: [DONE]\n\n');

export type PublicFinishReason = 'stop' | 'tool_calls';

/**
 * Encodes the chunks of one stream. The constant head of every chunk (id, object, created, model) is
 * serialized once, so each delta costs one string concatenation and one encode.
 */
export class ChunkEncoder {
  private readonly head: string;

  constructor(id: string, createdS: number, model: string) {
    this.head = `data: {"id":${JSON.stringify(id)},"object":"chat.completion.chunk","created":${createdS},"model":${JSON.stringify(model)},"choices":`;
  }

  private frame(choices: string, tail = ''): Uint8Array {
    return ENCODER.encode(`${this.head}${choices}${tail}}\n\n`);
  }

  role(): Uint8Array {
    return this.frame('[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]');
  }

  text(text: string): Uint8Array {
    return this.frame(`[{"index":0,"delta":{"content":${JSON.stringify(text)}},"finish_reason":null}]`);
  }

  toolCall(index: number, id: string | null, name: string | null, args: string): Uint8Array {
    const opening = id !== null ? `"id":${JSON.stringify(id)},"type":"function",` : '';
    const fn = name !== null ? `{"name":${JSON.stringify(name)},"arguments":${JSON.stringify(args)}}` : `{"arguments":${JSON.stringify(args)}}`;
    return this.frame(`[{"index":0,"delta":{"tool_calls":[{"index":${index},${opening}"function":${fn}}]},"finish_reason":null}]`);
  }

  finish(reason: PublicFinishReason): Uint8Array {
    return this.frame(`[{"index":0,"delta":{},"finish_reason":"${reason}"}]`);
  }

  usage(usage: Usage): Uint8Array {
    return this.frame('[]', `,"usage":${JSON.stringify(usage)}`);
  }
}

/** An error after the stream started: one `data: {"error": ...}` event, then the end (no [DONE]). */
export function errorFrame(error: GatewayError): Uint8Array {
  return ENCODER.encode(`data: ${JSON.stringify(errorBody(error))}\n\n`);
}

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
