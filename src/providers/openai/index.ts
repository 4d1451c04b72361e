// The OpenAI-compatible provider: Chat Completions, streamed or whole, read as provider deltas.
import type { OpenAIProviderConfig } from '../../config/model.ts';
import { newToolCallId } from '../../util/ids.ts';
import {
  argumentsText,
  ContentMeter,
  invalid,
  isRecord,
  TOOL_CALLS_MAX,
  type Usage,
  upstreamErrorInStream,
  usageFigure,
} from '../http/answer.ts';
import {
  type Dialect,
  HttpProvider,
  type HttpProviderOptions,
  type StreamTranslator,
} from '../http/http-provider.ts';
import type { Delta, FinishReason, ProviderMessage, ProviderRequest } from '../provider.ts';
import { toolCallIdAs } from '../wire.ts';

/** The options the gateway gives every HTTP provider (kept under this name for its callers). */
export type OpenAIProviderOptions = HttpProviderOptions;

export const OPENAI_DIALECT: Dialect = {
  path: () => 'chat/completions',
  keyField: 'authorization',
  keyValue: (key) => `Bearer ${key}`,
  fields: new Map(),
  body: requestBody,
  streamTranslator: (providerName, contentBytesMax) =>
    new ChunkTranslator(providerName, contentBytesMax),
  completion: completionToDeltas,
  errorOf(body) {
    const error = isRecord(body) && isRecord(body.error) ? body.error : isRecord(body) ? body : {};
    return {
      code: typeof error.code === 'string' ? error.code : null,
      message: typeof error.message === 'string' ? error.message : '',
    };
  },
  // vLLM and others say it only in the message.
  contextExceeded: (_status, code, message) =>
    code === 'context_length_exceeded' || message.includes('maximum context length'),
};

export class OpenAIProvider extends HttpProvider {
  constructor(name: string, config: OpenAIProviderConfig, options: OpenAIProviderOptions) {
    super(name, config, OPENAI_DIALECT, options);
  }
}

/**
 * Turns chat.completion.chunk objects into deltas, remembering what the end of the stream needs.
 */
class ChunkTranslator implements StreamTranslator {
  finishReason: FinishReason | null = null;
  /** Its end is `[DONE]`, which the relay sees before any translator. */
  readonly ended = false;
  /** A chunk with a choice came (content, tool calls, reasoning the gateway drops, a finish). */
  answering = false;
  private usage: Usage | null = null;
  private readonly providerName: string;
  /** Tool-call indexes already announced: the first delta of each carries id and name. */
  private readonly toolIndexes = new Set<number>();
  private readonly content: ContentMeter;

  constructor(providerName: string, contentBytesMax: number) {
    this.providerName = providerName;
    this.content = new ContentMeter(providerName, contentBytesMax);
  }

  get finished(): boolean {
    return this.finishReason !== null;
  }

  translate(chunk: unknown, out: Delta[]): void {
    if (!isRecord(chunk))
      throw invalid(this.providerName, 'sent a stream chunk that is not an object');
    if (chunk.error !== undefined && chunk.error !== null)
      throw upstreamErrorInStream(this.providerName, chunk.error);
    const usage = readUsage(chunk.usage, this.providerName);
    if (usage) this.usage = usage;
    const choices = chunk.choices;
    // some servers omit it on the usage chunk
    if (choices === undefined || choices === null) return;
    if (!Array.isArray(choices))
      throw invalid(this.providerName, 'sent a stream chunk whose choices is not an array');
    if (choices.length > 0) this.answering = true;
    for (const choice of choices) {
      if (!isRecord(choice))
        throw invalid(this.providerName, 'sent a stream choice that is not an object');
      // One answer was asked for; a server that still sends others is only relayed for index 0.
      if (choice.index !== undefined && choice.index !== 0) continue;
      const delta = choice.delta;
      if (isRecord(delta)) this.translateDelta(delta, out);
      else if (delta !== undefined && delta !== null)
        throw invalid(this.providerName, 'sent a delta that is not an object');
      if (typeof choice.finish_reason === 'string')
        this.finishReason = mapFinishReason(choice.finish_reason);
    }
  }

  finish(): Delta {
    const reason = this.finishReason ?? (this.toolIndexes.size > 0 ? 'tool_calls' : 'stop');
    return { type: 'finish', reason, usage: this.usage };
  }

  private translateDelta(delta: Record<string, unknown>, out: Delta[]): void {
    const content = delta.content;
    if (typeof content === 'string') {
      if (content.length > 0) {
        this.content.count(content);
        out.push({ type: 'text', text: content });
      }
    } else if (content !== undefined && content !== null) {
      throw invalid(this.providerName, 'sent content that is not a string');
    }
    const toolCalls = delta.tool_calls;
    if (toolCalls === undefined || toolCalls === null) return;
    if (!Array.isArray(toolCalls))
      throw invalid(this.providerName, 'sent tool_calls that is not an array');
    for (let position = 0; position < toolCalls.length; position++) {
      const call: unknown = toolCalls[position];
      if (!isRecord(call))
        throw invalid(this.providerName, 'sent a tool call that is not an object');
      // Servers that omit the index send whole calls in order; their position is the index.
      const index = call.index === undefined ? position : call.index;
      if (typeof index !== 'number' || !Number.isSafeInteger(index) || index < 0) {
        throw invalid(this.providerName, 'sent a tool call with a bad index');
      }
      const fn = isRecord(call.function) ? call.function : {};
      const args = argumentsText(fn.arguments, this.providerName);
      if (!this.toolIndexes.has(index)) {
        if (typeof fn.name !== 'string' || fn.name.length === 0) {
          throw invalid(this.providerName, 'started a tool call without a name');
        }
        if (this.toolIndexes.size === TOOL_CALLS_MAX)
          throw invalid(this.providerName, `made more than ${TOOL_CALLS_MAX} tool calls`);
        this.toolIndexes.add(index);
        const upstreamId = typeof call.id === 'string' && call.id.length > 0 ? call.id : null;
        if (upstreamId !== null) this.content.count(upstreamId);
        this.content.count(fn.name);
        this.content.count(args);
        out.push({
          type: 'tool_call',
          index,
          id: upstreamId ?? newToolCallId(),
          name: fn.name,
          arguments: args,
        });
      } else if (args.length > 0) {
        this.content.count(args);
        out.push({ type: 'tool_call', index, id: null, name: null, arguments: args });
      }
    }
  }
}

/** The same deltas from a whole chat.completion object (a server that ignored `stream: true`). */
function completionToDeltas(completion: unknown, name: string): Delta[] {
  if (!isRecord(completion)) throw invalid(name, 'answered with JSON that is not an object');
  if (completion.error !== undefined && completion.error !== null)
    throw upstreamErrorInStream(name, completion.error);
  const choices = completion.choices;
  if (!Array.isArray(choices) || choices.length === 0)
    throw invalid(name, 'answered without choices');
  const choice = firstChoice(choices);
  if (!isRecord(choice) || !isRecord(choice.message))
    throw invalid(name, 'answered without a message');
  const message = choice.message;
  const deltas: Delta[] = [];
  if (typeof message.content === 'string') {
    if (message.content.length > 0) deltas.push({ type: 'text', text: message.content });
  } else if (message.content !== undefined && message.content !== null) {
    throw invalid(name, 'answered with content that is not a string');
  }
  const toolCalls = message.tool_calls;
  if (toolCalls !== undefined && toolCalls !== null) {
    if (!Array.isArray(toolCalls))
      throw invalid(name, 'answered with tool_calls that is not an array');
    if (toolCalls.length > TOOL_CALLS_MAX)
      throw invalid(name, `made more than ${TOOL_CALLS_MAX} tool calls`);
    // Loops, not find and forEach: a callback would make a closure and a scope per answer.
    for (let index = 0; index < toolCalls.length; index++) {
      const call: unknown = toolCalls[index];
      if (!isRecord(call) || !isRecord(call.function) || typeof call.function.name !== 'string') {
        throw invalid(name, 'answered with a malformed tool call');
      }
      const id = typeof call.id === 'string' && call.id.length > 0 ? call.id : newToolCallId();
      const args = argumentsText(call.function.arguments, name);
      deltas.push({ type: 'tool_call', index, id, name: call.function.name, arguments: args });
    }
  }
  const hasToolCalls = Array.isArray(toolCalls) && toolCalls.length > 0;
  const reason =
    typeof choice.finish_reason === 'string'
      ? mapFinishReason(choice.finish_reason)
      : hasToolCalls
        ? 'tool_calls'
        : 'stop';
  deltas.push({ type: 'finish', reason, usage: readUsage(completion.usage, name) });
  return deltas;
}

/** The choice of index 0 (or without an index), else the first: the one answer asked for. */
function firstChoice(choices: unknown[]): unknown {
  for (const choice of choices)
    if (isRecord(choice) && (choice.index === undefined || choice.index === 0)) return choice;
  return choices[0];
}

/** OpenAI refuses a tool call id past 40 characters ("expected a maximum length of 40"). */
const TOOL_ID_CHARS_MAX = 40;

function openaiId(id: string): string {
  return toolCallIdAs(id, null, TOOL_ID_CHARS_MAX, 'call_');
}

/**
 * The messages with every tool call id as OpenAI takes it; the same array when all are (the usual
 * case: ids this API made come back as they were).
 */
function withOpenaiIds(messages: ProviderMessage[]): ProviderMessage[] {
  if (messages.every(idsFit)) return messages;
  return messages.map((message) => {
    if (message.role === 'tool')
      return { ...message, tool_call_id: openaiId(message.tool_call_id) };
    if (message.role !== 'assistant' || !message.tool_calls) return message;
    return {
      ...message,
      tool_calls: message.tool_calls.map((call) => ({ ...call, id: openaiId(call.id) })),
    };
  });
}

function idsFit(message: ProviderMessage): boolean {
  if (message.role === 'tool') return message.tool_call_id.length <= TOOL_ID_CHARS_MAX;
  if (message.role !== 'assistant' || !message.tool_calls) return true;
  for (const call of message.tool_calls) if (call.id.length > TOOL_ID_CHARS_MAX) return false;
  return true;
}

function requestBody(request: ProviderRequest): Record<string, unknown> {
  const body: Record<string, unknown> = {
    model: request.model,
    messages: withOpenaiIds(request.messages),
  };
  if (request.maxOutputTokens !== null) body.max_completion_tokens = request.maxOutputTokens;
  if (request.temperature !== null) body.temperature = request.temperature;
  if (request.topP !== null) body.top_p = request.topP;
  if (request.topK !== null) body.top_k = request.topK;
  if (request.seed !== null) body.seed = request.seed;
  if (request.stop !== null) body.stop = request.stop;
  // OpenAI refuses an empty tools list, and a tool_choice without tools.
  if (request.tools !== null && request.tools.length > 0) {
    body.tools = request.tools;
    if (request.toolChoice !== null) body.tool_choice = request.toolChoice;
  }
  // A non-stream caller gets a non-stream upstream call: one JSON body instead of an event stream
  // to parse.
  if (request.stream) {
    body.stream = true;
    body.stream_options = { include_usage: true };
  }
  return body;
}

function mapFinishReason(reason: string): FinishReason {
  if (reason === 'tool_calls' || reason === 'function_call') return 'tool_calls';
  if (reason === 'length') return 'length';
  return 'stop';
}

/**
 * The usage an answer reports. Absent usage (no object, or an object without both figures) is null:
 * the gateway counts the tokens itself. A figure that is there but is not a whole number in [0,
 * 2^31) is an unusable answer (CONTRACT §7): it would be billed, and a huge one broke the sums
 * downstream.
 */
function readUsage(value: unknown, providerName: string): Usage | null {
  if (value === undefined || value === null) return null;
  if (!isRecord(value)) throw invalid(providerName, 'sent a usage that is not an object');
  const prompt = usageFigure(value.prompt_tokens, providerName);
  const completion = usageFigure(value.completion_tokens, providerName);
  usageFigure(value.total_tokens, providerName);
  if (prompt === null || completion === null) return null;
  return { promptTokens: prompt, completionTokens: completion };
}
