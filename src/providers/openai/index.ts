// The OpenAI-compatible provider: one streamed Chat Completions call, relayed as provider deltas.
import type { OpenAIProviderConfig } from '../../config/model.ts';
import { GatewayError } from '../../http/errors.ts';
import { newToolCallId } from '../../util/ids.ts';
import type { Logger } from '../../util/log.ts';
import type { Delta, FinishReason, Provider, ProviderRequest } from '../provider.ts';
import { SseParser } from './sse-parse.ts';

export interface OpenAIProviderOptions {
  /** Used when the provider config sets no `timeout_ms` (the gateway passes limits.upstream_timeout_ms). */
  defaultTimeoutMs: number;
  logger: Logger;
}

/** A non-streamed (JSON) answer larger than this is refused rather than buffered without bound. */
export const UPSTREAM_JSON_BYTES_MAX = 32 * 1024 * 1024;
/** Only the error code of a failed call is read, so its body is cut off early. */
const ERROR_BODY_BYTES_MAX = 64 * 1024;
/** Upstream error codes are echoed only when they look like identifiers, never free text. */
const SAFE_CODE_CHARS_MAX = 64;

type Usage = { promptTokens: number; completionTokens: number };
type ReadResult = { done: false; value: Uint8Array } | { done: true; value: undefined };

export class OpenAIProvider implements Provider {
  readonly name: string;
  private readonly url: string;
  private readonly timeoutMs: number;
  private readonly apiKeyEnv: string | undefined;
  private readonly extraHeaders: Record<string, string>;
  private readonly logger: Logger;

  constructor(name: string, config: OpenAIProviderConfig, options: OpenAIProviderOptions) {
    this.name = name;
    const base = config.base_url.endsWith('/') ? config.base_url.slice(0, -1) : config.base_url;
    this.url = `${base}/chat/completions`;
    this.timeoutMs = config.timeout_ms ?? options.defaultTimeoutMs;
    this.apiKeyEnv = config.api_key_env;
    this.extraHeaders = config.headers ?? {};
    this.logger = options.logger;
  }

  async *stream(request: ProviderRequest, signal: AbortSignal): AsyncIterable<Delta> {
    signal.throwIfAborted();
    const call = new UpstreamCall(this.name, this.timeoutMs, signal);
    try {
      const response = await call.send(this.url, this.requestHeaders(), JSON.stringify(requestBody(request)));
      if (!response.ok) throw await this.errorFromResponse(response, call);
      const contentType = response.headers.get('content-type') ?? '';
      if (contentType.includes('text/event-stream')) {
        yield* this.relaySse(call);
      } else if (contentType.includes('json')) {
        const text = await call.readAll(UPSTREAM_JSON_BYTES_MAX);
        for (const delta of completionToDeltas(parseJson(text, this.name), this.name)) {
          yield delta;
          call.throwIfAborted();
        }
      } else {
        throw invalid(this.name, 'answered with an unexpected content type');
      }
      call.finished = true;
    } finally {
      call.close();
    }
  }

  private requestHeaders(): Record<string, string> {
    const headers: Record<string, string> = {
      'content-type': 'application/json',
      accept: 'text/event-stream, application/json',
      ...this.extraHeaders,
    };
    // Read per call, so a rotated key in the environment takes effect without a restart.
    const key = this.apiKeyEnv === undefined ? undefined : process.env[this.apiKeyEnv];
    if (key) headers.authorization = `Bearer ${key}`;
    return headers;
  }

  private async *relaySse(call: UpstreamCall): AsyncGenerator<Delta> {
    const parser = new SseParser();
    const translator = new ChunkTranslator(this.name);
    const out: Delta[] = [];
    let done = false;
    while (!done) {
      const { value, done: ended } = await call.read();
      if (ended) break;
      let events: readonly string[];
      try {
        events = parser.feed(value);
      } catch {
        throw invalid(this.name, 'sent an oversized stream event');
      }
      // Translate the whole read before yielding: the parser reuses its event array on the next feed.
      for (const data of events) {
        if (data === '[DONE]') {
          done = true;
          break;
        }
        translator.translate(parseJson(data, this.name), out);
      }
      for (const delta of out) {
        yield delta;
        call.throwIfAborted();
      }
      out.length = 0;
    }
    if (!done && translator.finishReason === null) {
      throw invalid(this.name, 'ended the stream without a finish reason');
    }
    yield translator.finish();
  }

  private async errorFromResponse(response: Response, call: UpstreamCall): Promise<GatewayError> {
    let code: string | null = null;
    let message = '';
    try {
      const body = JSON.parse(await call.readAll(ERROR_BODY_BYTES_MAX, true)) as unknown;
      const error = isRecord(body) && isRecord(body.error) ? body.error : isRecord(body) ? body : null;
      if (error) {
        if (typeof error.code === 'string') code = error.code;
        if (typeof error.message === 'string') message = error.message;
      }
    } catch (error) {
      // Abort and timeout still win; an unreadable error body just means no code.
      if (error instanceof GatewayError || call.signal.aborted) throw error;
    }
    const safeCode = code !== null && isIdentifier(code) ? code : null;
    this.logger.warn({ status: response.status, upstreamCode: safeCode }, 'upstream answered an error');
    // vLLM and others say it only in the message; the message itself is never passed on (it may quote the prompt).
    const contextExceeded = code === 'context_length_exceeded' || message.includes('maximum context length');
    if (response.status === 400 && contextExceeded) {
      return new GatewayError('context_length_exceeded', `The input is longer than the upstream model's context window.`, {
        param: 'messages',
      });
    }
    const suffix = safeCode === null ? '' : ` (${safeCode})`;
    return new GatewayError('upstream_error', `Upstream ${this.name} answered HTTP ${response.status}${suffix}.`);
  }
}

/**
 * One HTTP exchange with its timers and its link to the caller's signal. The timer measures upstream
 * silence only while we wait (for headers, then for each read), so a slow consumer is not a timeout.
 */
class UpstreamCall {
  readonly signal: AbortSignal;
  /** Set once the answer was fully translated, so closing does not abort a finished exchange. */
  finished = false;
  private readonly providerName: string;
  private readonly timeoutMs: number;
  private readonly controller = new AbortController();
  private readonly timer: ReturnType<typeof setTimeout>;
  private response: Response | null = null;
  /** Made on the first streamed read; a whole-body read of a sized answer never needs one. */
  private reader: ReadableStreamDefaultReader<Uint8Array> | null = null;
  private waiting = true;
  private bodyDone = false;
  private timedOut = false;
  private phase: 'headers' | 'body' = 'headers';
  private readonly onAbort = (): void => {
    this.controller.abort(this.signal.reason);
    // Cancelling settles a pending read at once even if the transport is slow to notice the abort.
    this.reader?.cancel(this.signal.reason).catch(ignore);
  };

  constructor(providerName: string, timeoutMs: number, signal: AbortSignal) {
    this.providerName = providerName;
    this.timeoutMs = timeoutMs;
    this.signal = signal;
    this.timer = setTimeout(() => this.onTimeout(), timeoutMs);
    signal.addEventListener('abort', this.onAbort, { once: true });
  }

  async send(url: string, headers: Record<string, string>, body: string): Promise<Response> {
    let response: Response;
    try {
      response = await fetch(url, { method: 'POST', headers, body, signal: this.controller.signal });
    } catch (error) {
      throw this.failure(error, 'unreachable');
    }
    this.phase = 'body';
    this.waiting = false;
    this.response = response;
    // A body-less answer reads as empty, which the callers then judge (an error status or invalid).
    if (response.body === null) this.bodyDone = true;
    return response;
  }

  async read(): Promise<ReadResult> {
    this.throwIfAborted();
    if (this.bodyDone) return { done: true, value: undefined };
    this.reader ??= this.response!.body!.getReader() as ReadableStreamDefaultReader<Uint8Array>;
    this.waiting = true;
    this.timer.refresh();
    let result: ReadResult;
    try {
      result = await this.reader.read();
    } catch (error) {
      throw this.failure(error, 'broken');
    } finally {
      this.waiting = false;
    }
    // A cancel from onAbort ends the read as `done`; that is an abort, not the end of the answer.
    this.throwIfAborted();
    if (result.done) this.bodyDone = true;
    return result;
  }

  /** The rest of the body as text, refused past `bytesMax` (or cut there when `truncate`). */
  async readAll(bytesMax: number, truncate = false): Promise<string> {
    const declared = Number(this.response?.headers.get('content-length') ?? NaN);
    if (this.reader === null && !this.bodyDone && declared <= bytesMax) {
      // A sized answer within the limit: the native whole-body read, without a JS stream (the hot path
      // of a non-stream call). The timer still covers the wait, and an abort still ends it.
      this.throwIfAborted();
      this.waiting = true;
      this.timer.refresh();
      try {
        const text = await this.response!.text();
        this.throwIfAborted();
        this.bodyDone = true;
        return text;
      } catch (error) {
        throw this.failure(error, 'broken');
      } finally {
        this.waiting = false;
      }
    }
    const chunks: Uint8Array[] = [];
    let bytes = 0;
    for (;;) {
      const { value, done } = await this.read();
      if (done) break;
      if (bytes + value.byteLength > bytesMax) {
        if (!truncate) throw invalid(this.providerName, `sent a body over ${bytesMax} bytes`);
        chunks.push(value.subarray(0, bytesMax - bytes));
        break;
      }
      chunks.push(value);
      bytes += value.byteLength;
    }
    return new TextDecoder().decode(Buffer.concat(chunks));
  }

  throwIfAborted(): void {
    if (this.signal.aborted) throw this.signal.reason;
    if (this.timedOut) throw this.timeoutError();
  }

  close(): void {
    clearTimeout(this.timer);
    this.signal.removeEventListener('abort', this.onAbort);
    if (this.bodyDone) return;
    // The consumer stopped early, something failed, or bytes follow [DONE]: drop the connection
    // rather than drain it. Aborting also closes the socket, which a cancel alone may not.
    if (!this.finished) this.controller.abort();
    this.reader?.cancel().catch(ignore);
  }

  private onTimeout(): void {
    if (!this.waiting) return; // the next wait re-arms the timer
    this.timedOut = true;
    this.controller.abort();
    this.reader?.cancel().catch(ignore);
  }

  private failure(error: unknown, kind: 'unreachable' | 'broken'): unknown {
    if (this.signal.aborted) return this.signal.reason;
    if (this.timedOut) return this.timeoutError();
    if (error instanceof GatewayError) return error;
    const code = isRecord(error) && typeof error.code === 'string' && isIdentifier(error.code) ? ` (${error.code})` : '';
    return kind === 'unreachable'
      ? new GatewayError('upstream_unreachable', `Could not reach upstream ${this.providerName}${code}.`)
      : invalid(this.providerName, `broke the connection mid-answer${code}`);
  }

  private timeoutError(): GatewayError {
    return new GatewayError(
      'upstream_timeout',
      this.phase === 'headers'
        ? `Upstream ${this.providerName} sent no response headers within ${this.timeoutMs} ms.`
        : `Upstream ${this.providerName} sent nothing for ${this.timeoutMs} ms.`,
    );
  }
}

/** Turns chat.completion.chunk objects into deltas, remembering what the end of the stream needs. */
class ChunkTranslator {
  finishReason: FinishReason | null = null;
  private usage: Usage | null = null;
  private readonly providerName: string;
  /** Tool-call indexes already announced: the first delta of each carries id and name. */
  private readonly toolIndexes = new Set<number>();

  constructor(providerName: string) {
    this.providerName = providerName;
  }

  translate(chunk: unknown, out: Delta[]): void {
    if (!isRecord(chunk)) throw invalid(this.providerName, 'sent a stream chunk that is not an object');
    if (chunk.error !== undefined && chunk.error !== null) throw upstreamErrorInStream(this.providerName);
    const usage = readUsage(chunk.usage);
    if (usage) this.usage = usage;
    const choices = chunk.choices;
    if (choices === undefined || choices === null) return; // some servers omit it on the usage chunk
    if (!Array.isArray(choices)) throw invalid(this.providerName, 'sent a stream chunk whose choices is not an array');
    for (const choice of choices) {
      if (!isRecord(choice)) throw invalid(this.providerName, 'sent a stream choice that is not an object');
      // One answer was asked for; a server that still sends others is only relayed for index 0.
      if (choice.index !== undefined && choice.index !== 0) continue;
      const delta = choice.delta;
      if (isRecord(delta)) this.translateDelta(delta, out);
      else if (delta !== undefined && delta !== null) throw invalid(this.providerName, 'sent a delta that is not an object');
      if (typeof choice.finish_reason === 'string') this.finishReason = mapFinishReason(choice.finish_reason);
    }
  }

  finish(): Delta {
    const reason = this.finishReason ?? (this.toolIndexes.size > 0 ? 'tool_calls' : 'stop');
    return { type: 'finish', reason, usage: this.usage };
  }

  private translateDelta(delta: Record<string, unknown>, out: Delta[]): void {
    const content = delta.content;
    if (typeof content === 'string') {
      if (content.length > 0) out.push({ type: 'text', text: content });
    } else if (content !== undefined && content !== null) {
      throw invalid(this.providerName, 'sent content that is not a string');
    }
    const toolCalls = delta.tool_calls;
    if (toolCalls === undefined || toolCalls === null) return;
    if (!Array.isArray(toolCalls)) throw invalid(this.providerName, 'sent tool_calls that is not an array');
    for (let position = 0; position < toolCalls.length; position++) {
      const call: unknown = toolCalls[position];
      if (!isRecord(call)) throw invalid(this.providerName, 'sent a tool call that is not an object');
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
        this.toolIndexes.add(index);
        const id = typeof call.id === 'string' && call.id.length > 0 ? call.id : newToolCallId();
        out.push({ type: 'tool_call', index, id, name: fn.name, arguments: args });
      } else if (args.length > 0) {
        out.push({ type: 'tool_call', index, id: null, name: null, arguments: args });
      }
    }
  }
}

/** The same deltas from a whole chat.completion object (a server that ignored `stream: true`). */
function completionToDeltas(completion: unknown, name: string): Delta[] {
  if (!isRecord(completion)) throw invalid(name, 'answered with JSON that is not an object');
  if (completion.error !== undefined && completion.error !== null) throw upstreamErrorInStream(name);
  const choices = completion.choices;
  if (!Array.isArray(choices) || choices.length === 0) throw invalid(name, 'answered without choices');
  const choice: unknown = choices.find((c: unknown) => isRecord(c) && (c.index === undefined || c.index === 0)) ?? choices[0];
  if (!isRecord(choice) || !isRecord(choice.message)) throw invalid(name, 'answered without a message');
  const message = choice.message;
  const deltas: Delta[] = [];
  if (typeof message.content === 'string') {
    if (message.content.length > 0) deltas.push({ type: 'text', text: message.content });
  } else if (message.content !== undefined && message.content !== null) {
    throw invalid(name, 'answered with content that is not a string');
  }
  const toolCalls = message.tool_calls;
  if (toolCalls !== undefined && toolCalls !== null) {
    if (!Array.isArray(toolCalls)) throw invalid(name, 'answered with tool_calls that is not an array');
    toolCalls.forEach((call: unknown, index: number) => {
      if (!isRecord(call) || !isRecord(call.function) || typeof call.function.name !== 'string') {
        throw invalid(name, 'answered with a malformed tool call');
      }
      const id = typeof call.id === 'string' && call.id.length > 0 ? call.id : newToolCallId();
      const args = argumentsText(call.function.arguments, name);
      deltas.push({ type: 'tool_call', index, id, name: call.function.name, arguments: args });
    });
  }
  const hasToolCalls = Array.isArray(toolCalls) && toolCalls.length > 0;
  const reason =
    typeof choice.finish_reason === 'string' ? mapFinishReason(choice.finish_reason) : hasToolCalls ? 'tool_calls' : 'stop';
  deltas.push({ type: 'finish', reason, usage: readUsage(completion.usage) });
  return deltas;
}

function requestBody(request: ProviderRequest): Record<string, unknown> {
  const body: Record<string, unknown> = { model: request.model, messages: request.messages };
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
  // A non-stream caller gets a non-stream upstream call: one JSON body instead of an event stream to parse.
  if (request.stream) {
    body.stream = true;
    body.stream_options = { include_usage: true };
  }
  return body;
}

export function mapFinishReason(reason: string): FinishReason {
  if (reason === 'tool_calls' || reason === 'function_call') return 'tool_calls';
  if (reason === 'length') return 'length';
  return 'stop';
}

function readUsage(value: unknown): Usage | null {
  // Malformed usage is dropped rather than fatal: the gateway can count the tokens itself.
  if (!isRecord(value)) return null;
  const prompt = value.prompt_tokens;
  const completion = value.completion_tokens;
  if (!isCount(prompt) || !isCount(completion)) return null;
  return { promptTokens: prompt, completionTokens: completion };
}

function argumentsText(value: unknown, providerName: string): string {
  if (value === undefined || value === null) return '';
  if (typeof value === 'string') return value;
  // Some servers send the arguments as an object; the interface wants the JSON text.
  if (isRecord(value)) return JSON.stringify(value);
  throw invalid(providerName, 'sent tool-call arguments that are not a string');
}

function parseJson(text: string, providerName: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw invalid(providerName, 'sent data that is not valid JSON');
  }
}

function invalid(providerName: string, what: string): GatewayError {
  return new GatewayError('upstream_invalid_response', `Upstream ${providerName} ${what}.`);
}

function upstreamErrorInStream(providerName: string): GatewayError {
  return new GatewayError('upstream_error', `Upstream ${providerName} reported an error inside its answer.`);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0;
}

function isIdentifier(text: string): boolean {
  if (text.length === 0 || text.length > SAFE_CODE_CHARS_MAX) return false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    const ok = (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 95 || c === 45 || c === 46;
    if (!ok) return false;
  }
  return true;
}

function ignore(): void {}
