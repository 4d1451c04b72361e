// The OpenAI-compatible provider: one streamed Chat Completions call, relayed as provider deltas.
import { readFileSync } from 'node:fs';
import type { OpenAIProviderConfig } from '../../config/model.ts';
import { assert } from '../../util/assert.ts';
import { GatewayError } from '../../util/errors.ts';
import { newToolCallId } from '../../util/ids.ts';
import type { Logger } from '../../util/log.ts';
import { SseEventTooLargeError, SseParser } from '../../util/sse-parse.ts';
import { TextBuilder } from '../../util/text-builder.ts';
import {
  type ExchangeHandler,
  HttpClient,
  type HttpClientError,
  type HttpExchange,
  type ResponseHead,
} from '../http/client.ts';
import type { Delta, FinishReason, Provider, ProviderRequest } from '../provider.ts';

export interface OpenAIProviderOptions {
  /**
   * Used when the provider config sets no `timeout_ms` (the gateway passes
   * limits.upstream_timeout_ms).
   */
  defaultTimeoutMs: number;
  /**
   * limits.max_upstream_body_bytes: the largest JSON body, and the most content (text, tool-call
   * ids, names and arguments) one streamed answer may carry.
   */
  bodyBytesMax: number;
  /** limits.max_upstream_event_bytes: the largest single SSE event. */
  eventBytesMax: number;
  logger: Logger;
}

/**
 * Tool calls one answer may make: the gateway takes at most this many in an assistant message of a
 * request (chat/model.ts), so a client could not even send a longer list back. It also keeps the
 * per-call state of an endless stream of new calls bounded.
 */
export const TOOL_CALLS_MAX = 128;
/**
 * Usage figures must be below this (a safe integer in [0, 2^31)): sums and prices of them stay
 * exact.
 */
const USAGE_TOKENS_LIMIT = 2 ** 31;
/** Only the error code of a failed call is read, so its body is cut off early. */
const ERROR_BODY_BYTES_MAX = 64 * 1024;
/** Upstream error codes are echoed only when they look like identifiers, never free text. */
const SAFE_CODE_CHARS_MAX = 64;
/**
 * Body bytes received but not yet consumed before the upstream socket is paused (a slow client).
 */
const QUEUED_BYTES_MAX = 256 * 1024;

type Usage = { promptTokens: number; completionTokens: number };
type ReadResult = { done: false; value: Uint8Array } | { done: true; value: undefined };

export class OpenAIProvider implements Provider {
  readonly name: string;
  private readonly client: HttpClient;
  /** Request line and the fixed header fields, up to where the per-call ones go. */
  private readonly requestHead: string;
  private readonly timeoutMs: number;
  private readonly bodyBytesMax: number;
  private readonly eventBytesMax: number;
  private readonly apiKeyEnv: string | undefined;
  /**
   * A configured `authorization` field: sent when no key comes from `api_key_env`, which replaces
   * it.
   */
  private readonly configuredAuthorization: string = '';
  private readonly logger: Logger;

  constructor(name: string, config: OpenAIProviderConfig, options: OpenAIProviderOptions) {
    this.name = name;
    const base = new URL(config.base_url.endsWith('/') ? config.base_url : `${config.base_url}/`);
    const url = new URL('chat/completions', base);
    this.client = new HttpClient(
      url,
      config.ca_file !== undefined ? { ca: readFileSync(config.ca_file, 'utf8') } : {},
    );
    // A configured field replaces the default of the same name (as it did when the headers were an
    // object given to fetch): one field each, never two. Names and values were checked when the
    // config was loaded (no CR, LF or framing fields).
    const fields = new Map<string, string>([
      ['accept', 'accept: text/event-stream, application/json'],
      ['user-agent', 'user-agent: tollgate'],
    ]);
    for (const [field, value] of Object.entries(config.headers ?? {})) {
      const name = field.toLowerCase();
      if (name === 'authorization') this.configuredAuthorization = `${field}: ${value}\r\n`;
      else fields.set(name, `${field}: ${value}`);
    }
    let head =
      `POST ${url.pathname}${url.search} HTTP/1.1\r\nhost: ${url.host}\r\ncontent-type: ` +
      `application/json\r\naccept-encoding: identity\r\n`;
    for (const line of fields.values()) head += `${line}\r\n`;
    this.requestHead = head;
    this.timeoutMs = config.timeout_ms ?? options.defaultTimeoutMs;
    this.bodyBytesMax = options.bodyBytesMax;
    this.eventBytesMax = options.eventBytesMax;
    this.apiKeyEnv = config.api_key_env;
    this.logger = options.logger;
  }

  async *stream(request: ProviderRequest, signal: AbortSignal): AsyncIterable<Delta> {
    signal.throwIfAborted();
    const call = new UpstreamCall(this.name, this.timeoutMs, signal);
    try {
      if ((await this.open(call, request)) === 'sse') {
        yield* this.relaySse(call);
      } else {
        for (const delta of await this.readCompletion(call)) {
          yield delta;
          call.throwIfAborted();
        }
      }
      call.finished = true;
    } finally {
      call.close();
    }
  }

  /**
   * The answer in one piece: a JSON completion needs no stream machinery between socket and caller.
   */
  async complete(request: ProviderRequest, signal: AbortSignal): Promise<Delta[]> {
    signal.throwIfAborted();
    const call = new UpstreamCall(this.name, this.timeoutMs, signal);
    try {
      let deltas: Delta[];
      if ((await this.open(call, request)) === 'sse') {
        // A server that streams although asked not to: its events, folded into the deltas a JSON
        // answer gives, so what is kept grows with the content, not with the number of events.
        const collector = new DeltaCollector();
        for await (const delta of this.relaySse(call)) collector.add(delta);
        deltas = collector.deltas();
      } else {
        // The usual JSON answer arrives with its head in one read: then its text is there already.
        const text = call.completeBody();
        deltas =
          text !== null
            ? completionToDeltas(parseJson(text, this.name), this.name)
            : await this.readCompletion(call);
      }
      call.throwIfAborted();
      call.finished = true;
      return deltas;
    } finally {
      call.close();
    }
  }

  /**
   * Sends the request and judges the answer's head: an event stream, a JSON completion, or an
   * error.
   */
  private async open(call: UpstreamCall, request: ProviderRequest): Promise<'sse' | 'json'> {
    const head = await call.send(
      this.client,
      this.requestText(JSON.stringify(requestBody(request))),
    );
    if (head.status < 200 || head.status > 299)
      throw await this.errorFromResponse(head.status, call);
    const encoding = head.headers.get('content-encoding');
    if (encoding !== undefined && encoding.toLowerCase() !== 'identity')
      throw invalid(this.name, 'answered with a compressed body');
    const contentType = head.headers.get('content-type') ?? '';
    if (contentType.includes('text/event-stream')) return 'sse';
    if (!contentType.includes('json'))
      throw invalid(this.name, 'answered with an unexpected content type');
    // A JSON body is read whole before it is parsed: one over the bound is refused by its declared
    // size before a byte of it is read, else (chunked, or until the close) the moment its count
    // passes it.
    if (head.bodyBytes !== null && head.bodyBytes > this.bodyBytesMax)
      throw oversizedBody(this.name, this.bodyBytesMax);
    call.limitBody(this.bodyBytesMax);
    return 'json';
  }

  private async readCompletion(call: UpstreamCall): Promise<Delta[]> {
    const text = call.completeBody() ?? (await call.readAll(this.bodyBytesMax));
    return completionToDeltas(parseJson(text, this.name), this.name);
  }

  close(): void {
    this.client.close();
  }

  /** The whole request: head, the per-call fields, and the body. */
  private requestText(body: string): { text: string; bytes: number } {
    let head = this.requestHead;
    // Read per call, so a rotated key in the environment takes effect without a restart.
    const key = this.apiKeyEnv === undefined ? undefined : process.env[this.apiKeyEnv];
    if (key) {
      if (!isHeaderValue(key))
        throw new GatewayError(
          'upstream_error',
          `The key in ${this.apiKeyEnv} for upstream ${this.name} is not a valid header value.`,
        );
      head += `authorization: Bearer ${key}\r\n`;
    } else {
      head += this.configuredAuthorization;
    }
    const bodyBytes = Buffer.byteLength(body);
    head += `content-length: ${bodyBytes}\r\n\r\n`;
    // The head is ASCII (checked above and at config load), so its length is its size in bytes.
    return { text: head + body, bytes: head.length + bodyBytes };
  }

  private async *relaySse(call: UpstreamCall): AsyncGenerator<Delta> {
    const parser = new SseParser(this.eventBytesMax);
    // The stream's content is bounded, not its raw bytes: SSE framing is about ten times the
    // content it carries, so 16 MiB of raw events would cut off legitimate long answers. What the
    // provider keeps per event is nothing (the parser holds one event, the translator counters), so
    // events that carry no content (keep-alives, empty deltas) cost time, which the gateway's
    // deadlines bound, not memory.
    const translator = new ChunkTranslator(this.name, this.bodyBytesMax);
    const out: Delta[] = [];
    let done = false;
    let deltasThisTurn = 0;
    while (!done) {
      const { value, done: ended } = await call.read();
      if (ended) break;
      let events: readonly string[];
      try {
        events = parser.feed(value);
      } catch (error) {
        if (!(error instanceof SseEventTooLargeError)) throw error;
        throw invalid(this.name, `sent a stream event over ${this.eventBytesMax} bytes`);
      }
      // Translate the whole read before yielding: the parser reuses its event array on the next
      // feed.
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
        // One socket read may hold thousands of tiny events; relaying them all in one go would keep
        // the event loop from every other request (see UpstreamCall.read).
        if (++deltasThisTurn === DELTAS_PER_TURN_MAX) {
          deltasThisTurn = 0;
          await nextTurn();
          call.throwIfAborted();
        }
      }
      out.length = 0;
    }
    if (!done && translator.finishReason === null) {
      throw invalid(this.name, 'ended the stream without a finish reason');
    }
    yield translator.finish();
  }

  private async errorFromResponse(status: number, call: UpstreamCall): Promise<GatewayError> {
    let code: string | null = null;
    let message = '';
    try {
      const body = JSON.parse(await call.readAll(ERROR_BODY_BYTES_MAX, true)) as unknown;
      const error =
        isRecord(body) && isRecord(body.error) ? body.error : isRecord(body) ? body : null;
      if (error) {
        if (typeof error.code === 'string') code = error.code;
        if (typeof error.message === 'string') message = error.message;
      }
    } catch (error) {
      // Abort and timeout still win; an unreadable error body just means no code.
      if (call.signal.aborted || call.timedOut) throw error;
    }
    const safeCode = code !== null && isIdentifier(code) ? code : null;
    this.logger.warn({ status, upstreamCode: safeCode }, 'upstream answered an error');
    // vLLM and others say it only in the message; the message itself is never passed on (it may
    // quote the prompt).
    const contextExceeded =
      code === 'context_length_exceeded' || message.includes('maximum context length');
    if (status === 400 && contextExceeded) {
      return new GatewayError(
        'context_length_exceeded',
        `The input is longer than the upstream model's context window.`,
        {
          param: 'messages',
        },
      );
    }
    const suffix = safeCode === null ? '' : ` (${safeCode})`;
    return new GatewayError(
      'upstream_error',
      `Upstream ${this.name} answered HTTP ${status}${suffix}.`,
    );
  }
}

/**
 * One HTTP exchange with its timer and its link to the caller's signal. The timer measures upstream
 * silence only while we wait (for headers, then for each read), so a slow consumer is not a
 * timeout. Body bytes arrive as the socket reads them and wait in a bounded queue for `read`.
 */
class UpstreamCall implements ExchangeHandler {
  readonly signal: AbortSignal;
  /** Set once the answer was fully translated, so closing does not abort a finished exchange. */
  finished = false;
  timedOut = false;
  private readonly providerName: string;
  private readonly timeoutMs: number;
  private readonly timer: ReturnType<typeof setTimeout>;
  private exchange: HttpExchange | null = null;
  private head: ResponseHead | null = null;
  private readonly queue: Uint8Array[] = [];
  private queuedBytes = 0;
  /** Body bytes handed out since the consumer last waited for the socket (see read). */
  private bytesThisTurn = 0;
  /** Body bytes received so far, and the bound past which the body is refused (see limitBody). */
  private bodyBytes = 0;
  private bodyBytesMax = Number.POSITIVE_INFINITY;
  private ended = false;
  private failure: unknown = null;
  /** The pending `send` or `read`, woken by the socket's next event. */
  private waiter: PromiseWithResolvers<void> | null = null;
  private phase: 'headers' | 'body' = 'headers';
  /** After close: the answer was complete and the body's end is awaited (see close). */
  private draining = false;
  private drainTimer: ReturnType<typeof setTimeout> | null = null;

  constructor(providerName: string, timeoutMs: number, signal: AbortSignal) {
    this.providerName = providerName;
    this.timeoutMs = timeoutMs;
    this.signal = signal;
    // The timer and the abort listener reach this call without a closure each (one call per
    // request).
    this.timer = setTimeout(timeOut, timeoutMs, this);
    signal.addEventListener('abort', this);
  }

  /** The caller's signal aborted (this object is its listener). */
  handleEvent(): void {
    this.exchange?.abort();
    this.wake(this.signal.reason);
  }

  async send(client: HttpClient, request: { text: string; bytes: number }): Promise<ResponseHead> {
    this.exchange = client.request(request.text, request.bytes, this);
    while (this.head === null) {
      this.throwIfFailed();
      await this.wait();
    }
    this.phase = 'body';
    return this.head;
  }

  async read(): Promise<ReadResult> {
    for (;;) {
      this.throwIfAborted();
      const value = this.queue.shift();
      if (value !== undefined) {
        this.queuedBytes -= value.length;
        if (this.queuedBytes < QUEUED_BYTES_MAX / 2) this.exchange?.resume();
        // Queued bytes are handed out through resolved promises, which never let the event loop
        // run: an upstream faster than its consumer (a flood of tiny events) would keep every other
        // request waiting for as long as the queue refills (§8: no request blocks the loop for 50
        // ms).
        this.bytesThisTurn += value.length;
        if (this.bytesThisTurn > READ_BYTES_PER_TURN_MAX) {
          this.bytesThisTurn = 0;
          await nextTurn();
          this.throwIfAborted();
        }
        return { done: false, value };
      }
      this.throwIfFailed();
      if (this.ended) return { done: true, value: undefined };
      await this.wait();
    }
  }

  /**
   * From now on the body is refused once more than `bytesMax` of it arrived: the exchange is
   * dropped at that read, and nothing past the bound is kept. Bytes that came with the head count.
   */
  limitBody(bytesMax: number): void {
    this.bodyBytesMax = bytesMax;
    if (this.bodyBytes > bytesMax) {
      this.refuseBody();
      this.throwIfFailed();
    }
  }

  /** The whole body as text when it has all arrived (no wait needed), else null. */
  completeBody(): string | null {
    if (!this.ended || this.signal.aborted || this.timedOut) return null;
    const queue = this.queue;
    const text =
      queue.length === 0
        ? ''
        : DECODER.decode(queue.length === 1 ? queue[0] : Buffer.concat(queue));
    queue.length = 0;
    this.queuedBytes = 0;
    return text;
  }

  /** The rest of the body as text, refused past `bytesMax` (or cut there when `truncate`). */
  async readAll(bytesMax: number, truncate = false): Promise<string> {
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
    return DECODER.decode(chunks.length === 1 ? chunks[0] : Buffer.concat(chunks));
  }

  onHead(head: ResponseHead): void {
    this.head = head;
    this.wake(null);
  }

  onBody(bytes: Uint8Array): void {
    if (this.draining) return;
    this.bodyBytes += bytes.length;
    if (this.bodyBytes > this.bodyBytesMax) {
      this.refuseBody();
      this.wake(null);
      return;
    }
    this.queue.push(bytes);
    this.queuedBytes += bytes.length;
    // A consumer slower than the upstream: stop reading the socket until it catches up.
    if (this.queuedBytes > QUEUED_BYTES_MAX) this.exchange?.pause();
    this.wake(null);
  }

  onEnd(): void {
    this.ended = true;
    this.exchange = null;
    if (this.drainTimer !== null) clearTimeout(this.drainTimer);
    this.wake(null);
  }

  onError(error: HttpClientError): void {
    this.failure = error;
    this.exchange = null;
    if (this.drainTimer !== null) clearTimeout(this.drainTimer);
    this.wake(null);
  }

  throwIfAborted(): void {
    if (this.signal.aborted) throw this.signal.reason;
    if (this.timedOut) throw this.timeoutError();
  }

  close(): void {
    clearTimeout(this.timer);
    // The abort listener stays: after this, it finds no exchange to stop, and it dies with the
    // signal.
    if (this.ended || this.exchange === null) return;
    if (this.finished) {
      // The answer is complete ([DONE]) but the body's own end (the last chunk) is still on its
      // way: let it arrive, so the connection is kept for the next call; bytes after it are not
      // read.
      this.draining = true;
      this.queue.length = 0;
      this.queuedBytes = 0;
      this.exchange.resume();
      this.drainTimer = setTimeout(stopDraining, DRAIN_MS_MAX, this);
      return;
    }
    // The consumer stopped early or something failed: drop the connection rather than drain it.
    this.exchange.abort();
  }

  /** The body passed its bound: drop the connection and what was queued; the next wait throws. */
  private refuseBody(): void {
    this.failure = oversizedBody(this.providerName, this.bodyBytesMax);
    this.queue.length = 0;
    this.queuedBytes = 0;
    const exchange = this.exchange;
    this.exchange = null;
    exchange?.abort();
  }

  /** The body's end did not come in time after the answer was complete: drop the connection. */
  stopDraining(): void {
    this.exchange?.abort();
    this.exchange = null;
  }

  private wait(): Promise<void> {
    this.bytesThisTurn = 0;
    this.waiter = Promise.withResolvers<void>();
    this.timer.refresh();
    return this.waiter.promise;
  }

  /** Wakes the pending wait: with an error to throw, or null to look again. */
  private wake(error: unknown): void {
    const waiter = this.waiter;
    if (waiter === null) return;
    this.waiter = null;
    if (error === null) waiter.resolve();
    else waiter.reject(error);
  }

  private throwIfFailed(): void {
    this.throwIfAborted();
    const failure = this.failure as HttpClientError | GatewayError | null;
    if (failure === null) return;
    if (failure instanceof GatewayError) throw failure;
    const code = failure.code === null ? '' : ` (${failure.code})`;
    // Out of descriptors or buffers here, not at the provider: the gateway's own failure (503,
    // nothing charged), never a provider error billed to whoever's call met it (CONTRACT §8).
    if (failure.code !== null && LOCAL_RESOURCE_ERRORS.has(failure.code)) {
      throw new GatewayError(
        'service_unavailable',
        `The gateway is out of resources to reach upstream ` +
          `${this.providerName}${code}; retry shortly.`,
      );
    }
    if (failure.kind === 'protocol') throw invalid(this.providerName, `sent ${failure.message}`);
    if (failure.kind === 'connect' || this.phase === 'headers') {
      throw new GatewayError(
        'upstream_unreachable',
        `Could not reach upstream ${this.providerName}${code}.`,
      );
    }
    throw invalid(this.providerName, `broke the connection mid-answer${code}`);
  }

  onTimeout(): void {
    if (this.waiter === null) return; // the next wait re-arms the timer
    this.timedOut = true;
    this.exchange?.abort();
    this.wake(this.timeoutError());
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

const DECODER = new TextDecoder();
/** Socket errors that are this process's own shortage, not the upstream's doing. */
const LOCAL_RESOURCE_ERRORS = new Set(['EMFILE', 'ENFILE', 'ENOBUFS', 'ENOMEM']);

/** Body bytes a consumer may take from the queue before it lets the event loop run once. */
const READ_BYTES_PER_TURN_MAX = 64 * 1024;
/** Deltas relayed before the event loop runs once (a few ms of work at most). */
const DELTAS_PER_TURN_MAX = 256;

function nextTurn(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

function timeOut(call: UpstreamCall): void {
  call.onTimeout();
}

function stopDraining(call: UpstreamCall): void {
  call.stopDraining();
}

/**
 * How long the end of a complete answer's body may take before the connection is dropped instead.
 */
const DRAIN_MS_MAX = 1_000;

/**
 * Turns chat.completion.chunk objects into deltas, remembering what the end of the stream needs.
 */
class ChunkTranslator {
  finishReason: FinishReason | null = null;
  private usage: Usage | null = null;
  private readonly providerName: string;
  /** Tool-call indexes already announced: the first delta of each carries id and name. */
  private readonly toolIndexes = new Set<number>();
  /** UTF-8 bytes of content (text, and tool calls' ids, names and arguments) relayed so far. */
  private contentBytes = 0;
  private readonly contentBytesMax: number;

  constructor(providerName: string, contentBytesMax: number) {
    this.providerName = providerName;
    this.contentBytesMax = contentBytesMax;
  }

  translate(chunk: unknown, out: Delta[]): void {
    if (!isRecord(chunk))
      throw invalid(this.providerName, 'sent a stream chunk that is not an object');
    if (chunk.error !== undefined && chunk.error !== null)
      throw upstreamErrorInStream(this.providerName);
    const usage = readUsage(chunk.usage, this.providerName);
    if (usage) this.usage = usage;
    const choices = chunk.choices;
    // some servers omit it on the usage chunk
    if (choices === undefined || choices === null) return;
    if (!Array.isArray(choices))
      throw invalid(this.providerName, 'sent a stream chunk whose choices is not an array');
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
        this.countContent(content);
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
        if (upstreamId !== null) this.countContent(upstreamId);
        this.countContent(fn.name);
        this.countContent(args);
        out.push({
          type: 'tool_call',
          index,
          id: upstreamId ?? newToolCallId(),
          name: fn.name,
          arguments: args,
        });
      } else if (args.length > 0) {
        this.countContent(args);
        out.push({ type: 'tool_call', index, id: null, name: null, arguments: args });
      }
    }
  }

  private countContent(text: string): void {
    this.contentBytes += Buffer.byteLength(text);
    if (this.contentBytes > this.contentBytesMax) {
      throw invalid(
        this.providerName,
        `sent an answer with over ${this.contentBytesMax} bytes of content`,
      );
    }
  }
}

/**
 * The deltas of a stream, folded into those a JSON answer gives: all text in one delta, each tool
 * call in one (with its own index), then the finish. `complete()` keeps this instead of every
 * delta, so an answer of a million one-character events costs its content, not a million objects.
 */
class DeltaCollector {
  private readonly text = new TextBuilder();
  private readonly toolCalls: {
    index: number;
    id: string;
    name: string;
    arguments: TextBuilder;
  }[] = [];
  private finish: Extract<Delta, { type: 'finish' }> | null = null;

  add(delta: Delta): void {
    switch (delta.type) {
      case 'text':
        this.text.append(delta.text);
        return;
      case 'tool_call': {
        if (delta.id !== null && delta.name !== null) {
          const args = new TextBuilder();
          args.append(delta.arguments);
          this.toolCalls.push({
            index: delta.index,
            id: delta.id,
            name: delta.name,
            arguments: args,
          });
          return;
        }
        // The translator announces each index once (bounded by TOOL_CALLS_MAX), so this search is
        // short.
        const call = this.toolCalls.find((known) => known.index === delta.index);
        assert(call !== undefined, 'tool-call arguments before the call was announced');
        call.arguments.append(delta.arguments);
        return;
      }
      case 'finish':
        this.finish = delta;
        return;
    }
  }

  deltas(): Delta[] {
    assert(this.finish !== null, 'a collected stream without its finish');
    const deltas: Delta[] = [];
    const text = this.text.build();
    if (text.length > 0) deltas.push({ type: 'text', text });
    for (const call of this.toolCalls) {
      deltas.push({
        type: 'tool_call',
        index: call.index,
        id: call.id,
        name: call.name,
        arguments: call.arguments.build(),
      });
    }
    deltas.push(this.finish);
    return deltas;
  }
}

/** The same deltas from a whole chat.completion object (a server that ignored `stream: true`). */
function completionToDeltas(completion: unknown, name: string): Delta[] {
  if (!isRecord(completion)) throw invalid(name, 'answered with JSON that is not an object');
  if (completion.error !== undefined && completion.error !== null)
    throw upstreamErrorInStream(name);
  const choices = completion.choices;
  if (!Array.isArray(choices) || choices.length === 0)
    throw invalid(name, 'answered without choices');
  const choice: unknown =
    choices.find((c: unknown) => isRecord(c) && (c.index === undefined || c.index === 0)) ??
    choices[0];
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
    typeof choice.finish_reason === 'string'
      ? mapFinishReason(choice.finish_reason)
      : hasToolCalls
        ? 'tool_calls'
        : 'stop';
  deltas.push({ type: 'finish', reason, usage: readUsage(completion.usage, name) });
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

function usageFigure(value: unknown, providerName: string): number | null {
  if (value === undefined || value === null) return null;
  if (
    typeof value !== 'number' ||
    !Number.isSafeInteger(value) ||
    value < 0 ||
    value >= USAGE_TOKENS_LIMIT
  ) {
    throw invalid(providerName, 'sent a usage figure that is not a whole number in [0, 2^31)');
  }
  return value;
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

function oversizedBody(providerName: string, bytesMax: number): GatewayError {
  return invalid(providerName, `sent a body over ${bytesMax} bytes`);
}

function upstreamErrorInStream(providerName: string): GatewayError {
  return new GatewayError(
    'upstream_error',
    `Upstream ${providerName} reported an error inside its answer.`,
  );
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isIdentifier(text: string): boolean {
  if (text.length === 0 || text.length > SAFE_CODE_CHARS_MAX) return false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    const ok =
      (c >= 48 && c <= 57) ||
      (c >= 65 && c <= 90) ||
      (c >= 97 && c <= 122) ||
      c === 95 ||
      c === 45 ||
      c === 46;
    if (!ok) return false;
  }
  return true;
}

/** A header value we may write as is: visible ASCII and spaces, nothing that could end the line. */
function isHeaderValue(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 32 || c > 126) return false;
  }
  return true;
}
