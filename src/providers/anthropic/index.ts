// The Anthropic Messages API as a dialect of the HTTP provider (CONTRACT §7): system messages
// become `system`, tools and tool results become `tool_use` / `tool_result` blocks, and the
// stream's message_start … content_block_* … message_delta … message_stop events become deltas.
import type { AnthropicProviderConfig } from '../../config/model.ts';
import type { GatewayError } from '../../util/errors.ts';
import {
  ContentMeter,
  invalid,
  isRecord,
  TOOL_CALLS_MAX,
  toolArgumentsObject,
  upstreamErrorInStream,
  usageFigure,
} from '../http/answer.ts';
import type { Dialect, StreamTranslator } from '../http/http-provider.ts';
import type { Delta, FinishReason, ProviderMessage, ProviderRequest } from '../provider.ts';
import { EMPTY_CONVERSATION_TEXT, isBlank, needsClosingUserTurn, toolCallIdAs } from '../wire.ts';

/**
 * The output limit sent when neither the caller nor the gateway gave one: the Messages API
 * requires `max_tokens` (the chat service always passes its reservation's cap; this is for others).
 */
const MAX_TOKENS_FALLBACK = 4_096;
/** The arguments of a tool call that took no input. */
const EMPTY_INPUT = '{}';

export function anthropicDialect(config: Pick<AnthropicProviderConfig, 'version'>): Dialect {
  return {
    path: () => 'messages',
    keyField: 'x-api-key',
    keyValue: (key) => key,
    fields: new Map([['anthropic-version', `anthropic-version: ${config.version}`]]),
    body: requestBody,
    // Refused in `stop_sequences` ("each stop sequence must contain non-whitespace"), yet the
    // commonest stop of all is "\n": the gateway cuts the answer at these itself.
    unsentStops: (request) => request.stop?.filter(isBlank) ?? null,
    streamTranslator: (providerName, contentBytesMax) =>
      new EventTranslator(providerName, contentBytesMax),
    completion: messageToDeltas,
    errorOf(body) {
      const error = isRecord(body) && isRecord(body.error) ? body.error : {};
      return {
        code: typeof error.type === 'string' ? error.type : null,
        message: typeof error.message === 'string' ? error.message : '',
      };
    },
    // "prompt is too long: 210000 tokens > 200000 maximum"
    contextExceeded: (_status, _code, message) =>
      /prompt is too long|context window/i.test(message),
  };
}

type Block = Record<string, unknown>;

/** The tool ids the Messages API takes back (it names the pattern in its 400). */
const TOOL_ID_RE = /^[A-Za-z0-9_-]+$/;
const TOOL_ID_CHARS_MAX = 64;

function anthropicId(id: string): string {
  return toolCallIdAs(id, TOOL_ID_RE, TOOL_ID_CHARS_MAX, 'toolu_');
}
interface AnthropicMessage {
  role: 'user' | 'assistant';
  content: Block[];
}

function requestBody(request: ProviderRequest): Record<string, unknown> {
  const system: string[] = [];
  const messages: AnthropicMessage[] = [];
  for (const message of request.messages) {
    if (message.role === 'system') {
      if (!isBlank(message.content)) system.push(message.content);
    } else appendMessage(messages, message);
  }
  if (needsClosingUserTurn(messages, 'assistant', request.messages))
    messages.push({ role: 'user', content: [{ type: 'text', text: EMPTY_CONVERSATION_TEXT }] });
  const body: Record<string, unknown> = {
    model: request.model,
    max_tokens: request.maxOutputTokens ?? request.outputCapTokens ?? MAX_TOKENS_FALLBACK,
    messages,
  };
  if (system.length > 0) body.system = system.join('\n\n');
  // The Messages API refuses what OpenAI's takes: a temperature over 1 (OpenAI's range is 0-2; 1 is
  // Anthropic's most random), temperature and top_p together (newer models: "cannot both be
  // specified"; temperature is the one kept), a stop sequence that is only whitespace (cut by the
  // gateway instead: unsentStops).
  if (request.temperature !== null) body.temperature = Math.min(request.temperature, 1);
  else if (request.topP !== null) body.top_p = request.topP;
  if (request.topK !== null) body.top_k = request.topK;
  const stops = request.stop?.filter((stop) => !isBlank(stop));
  if (stops !== undefined && stops.length > 0) body.stop_sequences = stops;
  if (request.tools !== null && request.tools.length > 0) {
    body.tools = request.tools.map((tool) => ({
      name: tool.function.name,
      ...(tool.function.description === undefined
        ? {}
        : { description: tool.function.description }),
      input_schema: tool.function.parameters ?? { type: 'object', properties: {} },
    }));
    const choice = request.toolChoice;
    if (choice === 'auto') body.tool_choice = { type: 'auto' };
    else if (choice === 'required') body.tool_choice = { type: 'any' };
    else if (choice === 'none') body.tool_choice = { type: 'none' };
    else if (choice !== null) body.tool_choice = { type: 'tool', name: choice.function.name };
  }
  if (request.stream) body.stream = true;
  return body;
}

/**
 * Adds one chat message as Anthropic content blocks. Tool results are user turns of
 * `tool_result` blocks; consecutive ones share a turn, as the API wants every result of one
 * assistant turn in the next user turn.
 */
function appendMessage(
  messages: AnthropicMessage[],
  message: Exclude<ProviderMessage, { role: 'system' }>,
): void {
  let role: 'user' | 'assistant';
  const blocks: Block[] = [];
  if (message.role === 'tool') {
    role = 'user';
    const result: Block = { type: 'tool_result', tool_use_id: anthropicId(message.tool_call_id) };
    // A result's content is optional, and blank text is refused.
    if (!isBlank(message.content)) result.content = message.content;
    blocks.push(result);
  } else if (message.role === 'assistant') {
    role = 'assistant';
    if (!isBlank(message.content)) blocks.push({ type: 'text', text: message.content });
    message.tool_calls?.forEach((call, index) => {
      blocks.push({
        type: 'tool_use',
        id: anthropicId(call.id),
        name: call.function.name,
        input: toolArgumentsObject(call.function.arguments, index),
      });
    });
  } else {
    role = 'user';
    if (!isBlank(message.content)) blocks.push({ type: 'text', text: message.content });
  }
  // A turn without content is refused: a message left without any (blank text, or only the
  // images the gateway drops) is left out.
  if (blocks.length === 0) return;
  const last = messages.at(-1);
  if (last !== undefined && last.role === role) last.content.push(...blocks);
  else messages.push({ role, content: blocks });
}

function finishReasonOf(reason: unknown): FinishReason {
  return reason === 'tool_use' ? 'tool_calls' : 'stop';
}

/**
 * Prompt tokens are all input, cached or not (CONTRACT §7): input_tokens counts only what was
 * neither written to nor read from the cache.
 */
function promptTokensOf(usage: Record<string, unknown>, providerName: string): number | null {
  const input = usageFigure(usage.input_tokens, providerName);
  if (input === null) return null;
  const created = usageFigure(usage.cache_creation_input_tokens, providerName) ?? 0;
  const read = usageFigure(usage.cache_read_input_tokens, providerName) ?? 0;
  // The sum is checked like a reported figure: three below 2^31 may add up past it.
  return usageFigure(input + created + read, providerName) as number;
}

/** The deltas of a whole Message object. */
function messageToDeltas(message: unknown, name: string): Delta[] {
  if (!isRecord(message)) throw invalid(name, 'answered with JSON that is not an object');
  if (message.type === 'error') throw upstreamErrorInAnswer(name, message);
  if (!Array.isArray(message.content)) throw invalid(name, 'answered without content');
  const deltas: Delta[] = [];
  let tools = 0;
  const content = new ContentMeter(name, Number.MAX_SAFE_INTEGER);
  for (const block of message.content) {
    if (!isRecord(block))
      throw invalid(name, 'answered with a content block that is not an object');
    if (block.type === 'text') {
      if (typeof block.text !== 'string')
        throw invalid(name, 'answered with text that is not text');
      // In the blocks' order (a stop the gateway cuts at must cut what came after it, tool calls
      // included).
      if (block.text.length > 0) deltas.push({ type: 'text', text: block.text });
    } else if (block.type === 'tool_use') {
      if (++tools > TOOL_CALLS_MAX)
        throw invalid(name, `made more than ${TOOL_CALLS_MAX} tool calls`);
      const call = toolUseOf(block, name);
      content.count(call.arguments);
      deltas.push({ type: 'tool_call', index: tools - 1, ...call });
    }
    // Other blocks (thinking, redacted_thinking, server tools' results) are not chat content.
  }
  const usage = isRecord(message.usage) ? message.usage : null;
  const prompt = usage === null ? null : promptTokensOf(usage, name);
  const completion = usage === null ? null : usageFigure(usage.output_tokens, name);
  deltas.push({
    type: 'finish',
    reason: tools > 0 ? 'tool_calls' : finishReasonOf(message.stop_reason),
    usage: prompt === null ? null : { promptTokens: prompt, completionTokens: completion },
  });
  return deltas;
}

function toolUseOf(
  block: Record<string, unknown>,
  name: string,
): { id: string; name: string; arguments: string } {
  if (typeof block.id !== 'string' || block.id.length === 0 || block.id.length > 256)
    throw invalid(name, 'answered with a tool call without an id');
  if (typeof block.name !== 'string' || block.name.length === 0)
    throw invalid(name, 'started a tool call without a name');
  const input = block.input === undefined ? {} : block.input;
  if (!isRecord(input)) throw invalid(name, 'answered with tool input that is not an object');
  return { id: block.id, name: block.name, arguments: JSON.stringify(input) };
}

/** Overloaded, failing or rate-limited (by its error type) fails over, as a 529/5xx/429 would. */
function upstreamErrorInAnswer(name: string, event: Record<string, unknown>): GatewayError {
  return upstreamErrorInStream(name, event.error);
}

/** Turns the Messages stream's events into deltas. */
class EventTranslator implements StreamTranslator {
  ended = false;
  /** A content block (thinking too) or the message's end came; message_start and ping do not. */
  answering = false;
  private reason: FinishReason | null = null;
  private promptTokens: number | null = null;
  private completionTokens: number | null = null;
  /** Content block index → tool-call index, for the blocks that are tool calls. */
  private readonly toolIndexes = new Map<number, number>();
  /** Tool blocks (content block indexes) that have had no input yet. */
  private readonly toolsWithoutInput = new Set<number>();
  private readonly content: ContentMeter;

  constructor(
    private readonly providerName: string,
    contentBytesMax: number,
  ) {
    this.content = new ContentMeter(providerName, contentBytesMax);
  }

  get finished(): boolean {
    return this.reason !== null;
  }

  translate(event: unknown, out: Delta[]): void {
    const name = this.providerName;
    if (!isRecord(event)) throw invalid(name, 'sent a stream event that is not an object');
    switch (event.type) {
      case 'message_start': {
        const message = isRecord(event.message) ? event.message : {};
        if (isRecord(message.usage)) this.readUsage(message.usage);
        return;
      }
      case 'content_block_start':
        this.answering = true;
        this.startBlock(event, out);
        return;
      case 'content_block_delta':
        // Thinking too: the model is answering, though the gateway drops what it thinks.
        this.answering = true;
        this.blockDelta(event, out);
        return;
      case 'message_delta': {
        this.answering = true;
        const delta = isRecord(event.delta) ? event.delta : {};
        if (delta.stop_reason !== undefined && delta.stop_reason !== null) {
          this.reason = finishReasonOf(delta.stop_reason);
          // The message is over (its blocks come before its stop reason): a tool's input is as
          // complete as it will be, though a stream cut here never says content_block_stop.
          this.endToolInputs(out);
        }
        if (isRecord(event.usage)) this.readUsage(event.usage);
        return;
      }
      case 'content_block_stop':
        // Only read for a tool block's end: a stop without a usable index is let pass, as before.
        if (typeof event.index === 'number') this.endToolInput(event.index, out);
        return;
      case 'message_stop':
        this.ended = true;
        this.endToolInputs(out);
        return;
      case 'error':
        throw upstreamErrorInAnswer(name, event);
      default:
        // ping, and event types added later: nothing to relay.
        return;
    }
  }

  finish(): Delta {
    const reason = this.toolIndexes.size > 0 ? 'tool_calls' : (this.reason ?? 'stop');
    // The input count stands without the output's (the gateway then counts the answer relayed).
    const usage =
      this.promptTokens === null
        ? null
        : { promptTokens: this.promptTokens, completionTokens: this.completionTokens };
    return { type: 'finish', reason, usage };
  }

  /**
   * message_start carries the input figures, message_delta the output (cumulative), and may repeat
   * the input ones.
   */
  private readUsage(usage: Record<string, unknown>): void {
    const prompt = promptTokensOf(usage, this.providerName);
    if (prompt !== null) this.promptTokens = prompt;
    const completion = usageFigure(usage.output_tokens, this.providerName);
    if (completion !== null) this.completionTokens = completion;
  }

  private startBlock(event: Record<string, unknown>, out: Delta[]): void {
    const block = isRecord(event.content_block) ? event.content_block : {};
    const index = blockIndex(event, this.providerName);
    if (block.type === 'text') {
      if (typeof block.text === 'string' && block.text.length > 0) this.text(block.text, out);
      return;
    }
    if (block.type !== 'tool_use') return;
    if (this.toolIndexes.has(index)) throw invalid(this.providerName, 'started a block twice');
    if (this.toolIndexes.size === TOOL_CALLS_MAX)
      throw invalid(this.providerName, `made more than ${TOOL_CALLS_MAX} tool calls`);
    // The input arrives as input_json_delta events; the start's own `input` is an empty object.
    const call = toolUseOf({ ...block, input: {} }, this.providerName);
    const toolIndex = this.toolIndexes.size;
    this.toolIndexes.set(index, toolIndex);
    this.content.count(call.id);
    this.content.count(call.name);
    out.push({ type: 'tool_call', index: toolIndex, id: call.id, name: call.name, arguments: '' });
    this.toolsWithoutInput.add(index);
  }

  /**
   * A tool block ends: one that took no input (a tool without parameters, for which Anthropic
   * sends no input_json_delta or only an empty one) gets `{}`, as in a non-stream answer, so
   * that its arguments are JSON; `""` would throw in every client that parses them.
   */
  /** Every tool block still without input ends (the message did). */
  private endToolInputs(out: Delta[]): void {
    for (const index of this.toolsWithoutInput) this.endToolInput(index, out);
  }

  private endToolInput(index: number, out: Delta[]): void {
    if (!this.toolsWithoutInput.delete(index)) return;
    const toolIndex = this.toolIndexes.get(index)!;
    this.content.count(EMPTY_INPUT);
    out.push({ type: 'tool_call', index: toolIndex, id: null, name: null, arguments: EMPTY_INPUT });
  }

  private blockDelta(event: Record<string, unknown>, out: Delta[]): void {
    const delta = isRecord(event.delta) ? event.delta : {};
    if (delta.type === 'text_delta') {
      if (typeof delta.text !== 'string')
        throw invalid(this.providerName, 'sent text that is not text');
      if (delta.text.length > 0) this.text(delta.text, out);
    } else if (delta.type === 'input_json_delta') {
      const toolIndex = this.toolIndexes.get(blockIndex(event, this.providerName));
      if (toolIndex === undefined)
        throw invalid(this.providerName, 'sent tool input for a block that is not a tool call');
      if (typeof delta.partial_json !== 'string')
        throw invalid(this.providerName, 'sent tool input that is not text');
      if (delta.partial_json.length === 0) return;
      this.toolsWithoutInput.delete(blockIndex(event, this.providerName));
      this.content.count(delta.partial_json);
      out.push({
        type: 'tool_call',
        index: toolIndex,
        id: null,
        name: null,
        arguments: delta.partial_json,
      });
    }
    // thinking_delta, signature_delta, citations_delta: not chat content.
  }

  private text(text: string, out: Delta[]): void {
    this.content.count(text);
    out.push({ type: 'text', text });
  }
}

function blockIndex(event: Record<string, unknown>, providerName: string): number {
  const index = event.index;
  if (typeof index !== 'number' || !Number.isSafeInteger(index) || index < 0)
    throw invalid(providerName, 'sent a content block with a bad index');
  return index;
}
