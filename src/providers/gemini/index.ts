// The Gemini API as a dialect of the HTTP provider (CONTRACT §7): generateContent and
// streamGenerateContent (SSE), `systemInstruction`, and `functionCall` / `functionResponse` parts
// mapped to tool calls by the `call_` ids the gateway gives them.
import { GatewayError } from '../../util/errors.ts';
import { newToolCallId } from '../../util/ids.ts';
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
import {
  EMPTY_CONVERSATION_TEXT,
  isBlank,
  needsClosingUserTurn,
  TOOL_CALL_ID_CHARS_MAX,
} from '../wire.ts';

export const GEMINI_DIALECT: Dialect = {
  path(request) {
    const model = encodeURIComponent(request.model.replace(/^models\//, ''));
    return request.stream
      ? `models/${model}:streamGenerateContent?alt=sse`
      : `models/${model}:generateContent`;
  },
  keyField: 'x-goog-api-key',
  keyValue: (key) => key,
  fields: new Map(),
  body: requestBody,
  streamTranslator: (providerName, contentBytesMax) =>
    new ChunkTranslator(providerName, contentBytesMax),
  completion(answer, name) {
    const translator = new ChunkTranslator(name, Number.MAX_SAFE_INTEGER);
    const deltas: Delta[] = [];
    translator.translate(answer, deltas);
    // A whole answer has a finish reason (or the block of its prompt); one without (`{}`, an empty
    // list of candidates) is no answer, as the other providers' would be.
    if (!translator.finished) throw invalid(name, 'answered without a finished candidate');
    deltas.push(translator.finish());
    return deltas;
  },
  errorOf(body) {
    // Errors come as {error: {code, message, status}}, and in a stream as a list of those.
    const first = Array.isArray(body) ? body[0] : body;
    const error = isRecord(first) && isRecord(first.error) ? first.error : {};
    return {
      code: typeof error.status === 'string' ? error.status : null,
      message: typeof error.message === 'string' ? error.message : '',
    };
  },
  // "The input token count (1048577) exceeds the maximum number of tokens allowed (1048576)."
  contextExceeded: (_status, _code, message) =>
    /exceeds the maximum number of tokens/i.test(message),
};

type Part = Record<string, unknown>;
interface Content {
  role: 'user' | 'model';
  parts: Part[];
}

function requestBody(request: ProviderRequest): Record<string, unknown> {
  const system: string[] = [];
  const contents: Content[] = [];
  // A tool reply names its call by id; Gemini wants the function's name: found in the assistant
  // turn that made the call.
  const names = new Map<string, string>();
  for (const message of request.messages) {
    if (message.role === 'system') {
      if (!isBlank(message.content)) system.push(message.content);
    } else appendContent(contents, message, names);
  }
  if (needsClosingUserTurn(contents, 'model', request.messages))
    contents.push({ role: 'user', parts: [{ text: EMPTY_CONVERSATION_TEXT }] });
  const body: Record<string, unknown> = { contents };
  if (system.length > 0) body.systemInstruction = { parts: [{ text: system.join('\n\n') }] };
  const generation: Record<string, unknown> = {};
  if (request.maxOutputTokens !== null) generation.maxOutputTokens = request.maxOutputTokens;
  if (request.temperature !== null) generation.temperature = request.temperature;
  if (request.topP !== null) generation.topP = request.topP;
  if (request.topK !== null) generation.topK = request.topK;
  // Gemini's seed is an int32: a larger one is wrapped (the same seed still gives the same seed).
  if (request.seed !== null) generation.seed = request.seed | 0;
  if (request.stop !== null && request.stop.length > 0) generation.stopSequences = request.stop;
  if (Object.keys(generation).length > 0) body.generationConfig = generation;
  if (request.tools !== null && request.tools.length > 0) {
    body.tools = [
      {
        functionDeclarations: request.tools.map((tool) => ({
          name: tool.function.name,
          ...(tool.function.description === undefined
            ? {}
            : { description: tool.function.description }),
          // Full JSON Schema (the older `parameters` takes only an OpenAPI subset).
          ...(tool.function.parameters === undefined
            ? {}
            : { parametersJsonSchema: tool.function.parameters }),
        })),
      },
    ];
    const choice = request.toolChoice;
    if (choice === 'auto') body.toolConfig = { functionCallingConfig: { mode: 'AUTO' } };
    else if (choice === 'required') body.toolConfig = { functionCallingConfig: { mode: 'ANY' } };
    else if (choice === 'none') body.toolConfig = { functionCallingConfig: { mode: 'NONE' } };
    else if (choice !== null) {
      body.toolConfig = {
        functionCallingConfig: { mode: 'ANY', allowedFunctionNames: [choice.function.name] },
      };
    }
  }
  return body;
}

/**
 * Between a tool call's own id and its thought signature, in the ids of calls that had one. A
 * thinking model (Gemini 3) signs each function call and refuses, 400, a history whose call comes
 * back without its signature; chat clients send back only a call's id, so the signature travels
 * inside it (LiteLLM does the same), in base64url: the id stays `[A-Za-z0-9_-]`, which every
 * protocol's tool ids allow, and no longer than the signature.
 */
const SIGNATURE_MARK = '__sig_';
const CALL_ID_CHARS = newToolCallId().length;
/** The longest signature carried: what keeps the id within the chat API's bound. */
const SIGNATURE_CHARS_MAX = TOOL_CALL_ID_CHARS_MAX - CALL_ID_CHARS - SIGNATURE_MARK.length;

/**
 * A call id carrying `signature` (the API's bytes in base64), or a plain one when it is not
 * canonical base64 (its bytes would not come back as the same text) or too long to carry.
 */
function callIdFor(signature: string): string {
  const id = newToolCallId();
  if (signature.length === 0 || signature.length > SIGNATURE_CHARS_MAX) return id;
  const bytes = Buffer.from(signature, 'base64');
  if (bytes.toString('base64') !== signature) return id;
  return `${id}${SIGNATURE_MARK}${bytes.toString('base64url')}`;
}

/** The thought signature inside a call id this adapter made, else null. */
function thoughtSignatureOf(callId: string): string | null {
  if (!callId.startsWith('call_') || !callId.startsWith(SIGNATURE_MARK, CALL_ID_CHARS)) return null;
  const encoded = callId.slice(CALL_ID_CHARS + SIGNATURE_MARK.length);
  if (encoded.length === 0 || !/^[A-Za-z0-9_-]+$/.test(encoded)) return null;
  return Buffer.from(encoded, 'base64url').toString('base64');
}

function appendContent(
  contents: Content[],
  message: Exclude<ProviderMessage, { role: 'system' }>,
  names: Map<string, string>,
): void {
  let role: 'user' | 'model';
  const parts: Part[] = [];
  if (message.role === 'tool') {
    role = 'user';
    const name = names.get(message.tool_call_id);
    if (name === undefined) {
      // chat validation checks that every tool reply follows its call; this is its twin.
      throw new GatewayError(
        'invalid_request_error',
        'A tool message answers no earlier tool call.',
        { param: 'messages' },
      );
    }
    parts.push({ functionResponse: { name, response: toolResponse(message.content) } });
  } else if (message.role === 'assistant') {
    role = 'model';
    if (!isBlank(message.content)) parts.push({ text: message.content });
    message.tool_calls?.forEach((call, index) => {
      names.set(call.id, call.function.name);
      const part: Part = {
        functionCall: {
          name: call.function.name,
          args: toolArgumentsObject(call.function.arguments, index),
        },
      };
      const signature = thoughtSignatureOf(call.id);
      if (signature !== null) part.thoughtSignature = signature;
      parts.push(part);
    });
  } else {
    role = 'user';
    if (!isBlank(message.content)) parts.push({ text: message.content });
  }
  // A content without parts is refused: a message left without any (blank text, or only the
  // images the gateway drops) is left out.
  if (parts.length === 0) return;
  // Gemini wants turns to alternate, and all replies to one turn's calls in the next turn.
  const last = contents.at(-1);
  if (last !== undefined && last.role === role) last.parts.push(...parts);
  else contents.push({ role, parts });
}

/** A tool's reply as the object `functionResponse.response` must be. */
function toolResponse(content: string): Record<string, unknown> {
  try {
    const value: unknown = JSON.parse(content);
    if (isRecord(value)) return value;
  } catch {
    // not JSON: passed on as text
  }
  return { output: content };
}

/**
 * Turns GenerateContentResponse objects into deltas: each chunk of a stream, or the whole answer.
 * Text comes in parts of any chunk; a function call comes whole in one part.
 */
class ChunkTranslator implements StreamTranslator {
  /** The stream ends with the connection; there is no end marker. */
  readonly ended = false;
  /** A candidate (a thought too) or a blocked prompt came. */
  answering = false;
  private reason: FinishReason | null = null;
  private promptTokens: number | null = null;
  private completionTokens: number | null = null;
  private toolCalls = 0;
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

  translate(chunk: unknown, out: Delta[]): void {
    const name = this.providerName;
    if (!isRecord(chunk)) throw invalid(name, 'sent a chunk that is not an object');
    if (chunk.error !== undefined && chunk.error !== null)
      throw upstreamErrorInStream(name, chunk.error);
    if (isRecord(chunk.usageMetadata)) this.readUsage(chunk.usageMetadata);
    // A prompt the provider blocked answers with no candidate (or an empty list): an empty answer.
    if (isRecord(chunk.promptFeedback) && chunk.promptFeedback.blockReason !== undefined) {
      this.reason = 'stop';
      this.answering = true;
    }
    const candidates = chunk.candidates;
    if (candidates === undefined || candidates === null) return;
    if (!Array.isArray(candidates)) throw invalid(name, 'sent candidates that are not a list');
    const candidate: unknown = candidates[0];
    if (candidate === undefined) return;
    if (!isRecord(candidate)) throw invalid(name, 'sent a candidate that is not an object');
    // Thought parts too: the model is answering, though the gateway drops what it thinks.
    this.answering = true;
    const content = candidate.content;
    if (isRecord(content) && content.parts !== undefined) {
      if (!Array.isArray(content.parts)) throw invalid(name, 'sent parts that are not a list');
      for (const part of content.parts) this.part(part, out);
    }
    if (typeof candidate.finishReason === 'string' && candidate.finishReason !== '') {
      this.reason = candidate.finishReason === 'MAX_TOKENS' ? 'length' : 'stop';
    }
  }

  finish(): Delta {
    const reason = this.toolCalls > 0 ? 'tool_calls' : (this.reason ?? 'stop');
    return {
      type: 'finish',
      reason,
      usage:
        this.promptTokens === null
          ? null
          : { promptTokens: this.promptTokens, completionTokens: this.completionTokens ?? 0 },
    };
  }

  /** Completion tokens are what was written and what was thought (CONTRACT §7). */
  private readUsage(usage: Record<string, unknown>): void {
    const name = this.providerName;
    const prompt = usageFigure(usage.promptTokenCount, name);
    if (prompt !== null) this.promptTokens = prompt;
    const candidates = usageFigure(usage.candidatesTokenCount, name);
    const thoughts = usageFigure(usage.thoughtsTokenCount, name);
    if (candidates !== null || thoughts !== null) {
      this.completionTokens = usageFigure((candidates ?? 0) + (thoughts ?? 0), name);
    }
  }

  private part(part: unknown, out: Delta[]): void {
    const name = this.providerName;
    if (!isRecord(part)) throw invalid(name, 'sent a part that is not an object');
    // A thought summary is not the answer.
    if (part.thought === true) return;
    if (typeof part.text === 'string') {
      if (part.text.length > 0) {
        this.content.count(part.text);
        out.push({ type: 'text', text: part.text });
      }
      return;
    }
    const call = part.functionCall;
    if (call === undefined) return;
    if (!isRecord(call) || typeof call.name !== 'string' || call.name.length === 0)
      throw invalid(name, 'started a tool call without a name');
    const args = call.args === undefined || call.args === null ? {} : call.args;
    if (!isRecord(args)) throw invalid(name, 'sent tool arguments that are not an object');
    if (this.toolCalls === TOOL_CALLS_MAX)
      throw invalid(name, `made more than ${TOOL_CALLS_MAX} tool calls`);
    const text = JSON.stringify(args);
    this.content.count(call.name);
    this.content.count(text);
    const signature = part.thoughtSignature;
    if (signature !== undefined && typeof signature !== 'string')
      throw invalid(name, 'sent a thought signature that is not text');
    const id = signature === undefined ? newToolCallId() : callIdFor(signature);
    this.content.count(id);
    // Gemini's calls have no id a client could send back; the gateway's own maps the reply back
    // through the assistant message that carries it (requestBody), with the call's thought
    // signature, when it had one, inside it.
    out.push({ type: 'tool_call', index: this.toolCalls++, id, name: call.name, arguments: text });
  }
}
