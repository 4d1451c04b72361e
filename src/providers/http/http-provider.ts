// An upstream reached over HTTP, whatever protocol it speaks: the exchange, its bounds, its timer
// and the relay of its event stream live here once; a `Dialect` says how one protocol writes a
// request and reads an answer (openai/, anthropic/, gemini/).
import { readFileSync } from 'node:fs';
import type { RunSignal } from '../../util/abort.ts';
import { GatewayError } from '../../util/errors.ts';
import { type FifoTimers, fifoTimersFor } from '../../util/fifo-timers.ts';
import type { Logger } from '../../util/log.ts';
import { nextTurn } from '../../util/promise.ts';
import { SseEventTooLargeError, SseParser } from '../../util/sse-parse.ts';
import type { Delta, Provider, ProviderRequest } from '../provider.ts';
import {
  DeltaCollector,
  invalid,
  isHeaderValue,
  isIdentifier,
  isRecord,
  oversizedBody,
  parseJson,
} from './answer.ts';
import { HttpClient, type ResponseHead } from './client.ts';
import { StopCutter } from './stop-cutter.ts';
import { DELTAS_PER_TURN_MAX, UpstreamCall } from './upstream-call.ts';

export interface HttpProviderOptions {
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

/** What every HTTP provider's config has (config/model.ts). */
export interface HttpProviderConfig {
  base_url: string;
  api_key_env?: string | undefined;
  timeout_ms?: number | undefined;
  headers?: Record<string, string> | undefined;
  ca_file?: string | undefined;
}

/** Turns one streamed answer's events into deltas, remembering what the end needs. */
export interface StreamTranslator {
  /** One event's data, parsed; its deltas go to `out`. */
  translate(data: unknown, out: Delta[]): void;
  /** The protocol's own end of the stream came (nothing after it is read). */
  readonly ended: boolean;
  /** A finish reason came: the answer is whole even if the stream ends without its end marker. */
  readonly finished: boolean;
  /**
   * Some event carried part of the answer, relayed or not (reasoning the gateway drops counts):
   * from then on the call's timer is the silence between reads. Keep-alives, pings and a message's
   * opening carry none.
   */
  readonly answering: boolean;
  /** The last delta: the finish, with the usage the stream reported. */
  finish(): Delta;
}

/** How one protocol writes a request and reads its answer. */
export interface Dialect {
  /** The path after the base URL's path, with its query, of the call for this request. */
  path(request: ProviderRequest): string;
  /** The header field that carries the key from `api_key_env`, and its value for a key. */
  readonly keyField: string;
  keyValue(key: string): string;
  /** Header lines (`name: value`) this protocol always sends, by lower-case name. */
  readonly fields: ReadonlyMap<string, string>;
  body(request: ProviderRequest): unknown;
  /**
   * The stop sequences `body` leaves out because the protocol refuses them: the gateway cuts the
   * answer at them itself (StopCutter). Null or absent: none.
   */
  unsentStops?(request: ProviderRequest): readonly string[] | null;
  streamTranslator(providerName: string, contentBytesMax: number): StreamTranslator;
  /** The deltas of a whole JSON answer. */
  completion(answer: unknown, providerName: string): Delta[];
  /** The code and message of an error body (the message is read, never passed on). */
  errorOf(body: unknown): { code: string | null; message: string };
  /** Whether an error answer says the input is longer than the model's window. */
  contextExceeded(status: number, code: string | null, message: string): boolean;
}

/** Only the error code of a failed call is read, so its body is cut off early. */
const ERROR_BODY_BYTES_MAX = 64 * 1024;
/**
 * And read for this long at most: the status is the answer, and a body that trickles in must not
 * hold it (a 503 failing over, a 400 answered) until the request's deadline.
 */
const ERROR_BODY_WAIT_MS = 1_000;

/** The error body's text, or null when it is not all in within ERROR_BODY_WAIT_MS. */
async function errorBodyText(call: UpstreamCall): Promise<string | null> {
  const reading = call.readAll(ERROR_BODY_BYTES_MAX, true);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<null>((resolve) => {
    timer = setTimeout(resolve, ERROR_BODY_WAIT_MS, null);
  });
  try {
    return await Promise.race([reading, late]);
  } finally {
    clearTimeout(timer);
    // Given up on: the call's close drops the connection, and this read ends with it or never.
    reading.catch(() => {});
  }
}

/** A 2xx answer: anything else is an error, read by errorFromResponse. */
function isSuccess(head: ResponseHead): boolean {
  return head.status >= 200 && head.status <= 299;
}

export class HttpProvider implements Provider {
  readonly name: string;
  private readonly client: HttpClient;
  /** `POST` and the base URL's path, up to where the dialect's path goes. */
  private readonly requestLineStart: string;
  /** The fixed header fields, after the request line. */
  private readonly requestFields: string;
  /** Every call's silence timer: one delay, so one list (FifoTimers). */
  private readonly silence: FifoTimers;
  private readonly bodyBytesMax: number;
  private readonly eventBytesMax: number;
  private readonly apiKeyEnv: string | undefined;
  /**
   * A configured field of the key's name: sent when no key comes from `api_key_env`, which
   * replaces it.
   */
  private readonly configuredKeyField: string = '';
  private readonly logger: Logger;
  /** The last call's target and its request line with the fixed fields (see headStart). */
  private lastTarget: string | null = null;
  private lastHeadStart = '';

  constructor(
    name: string,
    config: HttpProviderConfig,
    readonly dialect: Dialect,
    options: HttpProviderOptions,
  ) {
    this.name = name;
    const base = new URL(config.base_url.endsWith('/') ? config.base_url : `${config.base_url}/`);
    this.client = new HttpClient(
      base,
      config.ca_file !== undefined ? { ca: readFileSync(config.ca_file, 'utf8') } : {},
    );
    // A configured field replaces the default of the same name: one field each, never two. Names
    // and values were checked when the config was loaded (no CR, LF or framing fields).
    const fields = new Map<string, string>([
      ['accept', 'accept: text/event-stream, application/json'],
      ['user-agent', 'user-agent: tollgate'],
      ...dialect.fields,
    ]);
    for (const [field, value] of Object.entries(config.headers ?? {})) {
      const lower = field.toLowerCase();
      if (lower === dialect.keyField) this.configuredKeyField = `${field}: ${value}\r\n`;
      else fields.set(lower, `${field}: ${value}`);
    }
    this.requestLineStart = `POST ${base.pathname}`;
    let head = `host: ${base.host}\r\ncontent-type: application/json\r\n`;
    head += 'accept-encoding: identity\r\n';
    for (const line of fields.values()) head += `${line}\r\n`;
    this.requestFields = head;
    this.silence = fifoTimersFor(config.timeout_ms ?? options.defaultTimeoutMs);
    this.bodyBytesMax = options.bodyBytesMax;
    this.eventBytesMax = options.eventBytesMax;
    this.apiKeyEnv = config.api_key_env;
    this.logger = options.logger;
  }

  async *stream(request: ProviderRequest, signal: RunSignal): AsyncIterable<Delta> {
    signal.throwIfAborted();
    const call = new UpstreamCall(this.name, this.silence, signal);
    try {
      const head = await this.send(call, request);
      if (!isSuccess(head)) throw await this.errorFromResponse(head.status, call);
      if (this.bodyKind(call, head) === 'sse') {
        const cutter = this.stopCutter(request);
        yield* this.relaySse(call, cutter);
        // Cut at a stop, the provider is still generating: its connection is dropped (close), not
        // drained for the rest of an answer nobody takes.
        if (cutter?.cut) return;
      } else {
        for (const delta of this.cutAtStops(request, await this.readCompletion(call))) {
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
  async complete(request: ProviderRequest, signal: RunSignal): Promise<Delta[]> {
    signal.throwIfAborted();
    const call = new UpstreamCall(this.name, this.silence, signal);
    try {
      let deltas: Delta[];
      let cut = false;
      const head = await this.send(call, request);
      if (!isSuccess(head)) throw await this.errorFromResponse(head.status, call);
      if (this.bodyKind(call, head) === 'sse') {
        // A server that streams although asked not to: its events, folded into the deltas a JSON
        // answer gives, so what is kept grows with the content, not with the number of events.
        const collector = new DeltaCollector();
        const cutter = this.stopCutter(request);
        for await (const delta of this.relaySse(call, cutter)) collector.add(delta);
        deltas = collector.deltas();
        // Cut at a stop, the provider is still generating: its connection is dropped (close), not
        // drained for the rest of an answer nobody takes.
        cut = cutter?.cut === true;
      } else {
        // The usual JSON answer arrives with its head in one read: then its text is there already.
        const text = call.completeBody();
        deltas = this.cutAtStops(
          request,
          text !== null
            ? this.dialect.completion(parseJson(text, this.name), this.name)
            : await this.readCompletion(call),
        );
      }
      call.throwIfAborted();
      call.finished = !cut;
      return deltas;
    } finally {
      call.close();
    }
  }

  close(): void {
    this.client.close();
  }

  /**
   * Judges the head of a successful answer: an event stream or a JSON completion, else it throws.
   * Not async (an error status is read by the caller, with errorFromResponse, before this): an
   * async step of its own would cost a generator, a promise, a scope and a function per call.
   */
  private bodyKind(call: UpstreamCall, head: ResponseHead): 'sse' | 'json' {
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
    call.answerAtFirstNonBlank();
    return 'json';
  }

  private async readCompletion(call: UpstreamCall): Promise<Delta[]> {
    const text = call.completeBody() ?? (await call.readAll(this.bodyBytesMax));
    return this.dialect.completion(parseJson(text, this.name), this.name);
  }

  /**
   * Sends the whole request on `call`: head, the per-call fields, and the body (its text and size
   * handed on as they are, not in an object made to carry them).
   */
  private send(call: UpstreamCall, request: ProviderRequest): Promise<ResponseHead> {
    const body = JSON.stringify(this.dialect.body(request));
    let head = this.headStart(this.dialect.path(request));
    // Read per call, so a rotated key in the environment takes effect without a restart.
    const key = this.apiKeyEnv === undefined ? undefined : process.env[this.apiKeyEnv];
    if (key) {
      if (!isHeaderValue(key))
        throw new GatewayError(
          'upstream_error',
          `The key in ${this.apiKeyEnv} for upstream ${this.name} is not a valid header value.`,
        );
      head += `${this.dialect.keyField}: ${this.dialect.keyValue(key)}\r\n`;
    } else {
      head += this.configuredKeyField;
    }
    const bodyBytes = Buffer.byteLength(body);
    const text = `${head}content-length: ${bodyBytes}\r\n\r\n${body}`;
    // The head is ASCII (checked above, at config load, and by the dialects' paths), so its length
    // is its size in bytes.
    return call.send(this.client, text, text.length - body.length + bodyBytes);
  }

  /**
   * The request line for `target` and the fixed fields: kept for the last target, which for most
   * dialects is the same on every call (a new string for it each time would be garbage per call).
   */
  private headStart(target: string): string {
    if (target !== this.lastTarget) {
      this.lastTarget = target;
      this.lastHeadStart = `${this.requestLineStart}${target} HTTP/1.1\r\n${this.requestFields}`;
    }
    return this.lastHeadStart;
  }

  /** A cutter for the stops this request's body left out, or null (nearly always). */
  private stopCutter(request: ProviderRequest): StopCutter | null {
    const stops = this.dialect.unsentStops?.(request) ?? null;
    return stops === null || stops.length === 0 ? null : new StopCutter(stops);
  }

  /** A whole answer's deltas, cut at the stops its body left out. */
  private cutAtStops(request: ProviderRequest, deltas: Delta[]): Delta[] {
    const cutter = this.stopCutter(request);
    if (cutter === null) return deltas;
    const kept = cutter.cutDeltas(deltas);
    if (cutter.cut) kept.push(cutter.finish(deltas.findLast((delta) => delta.type === 'finish')));
    return kept;
  }

  private async *relaySse(call: UpstreamCall, cutter: StopCutter | null): AsyncGenerator<Delta> {
    const parser = new SseParser(this.eventBytesMax);
    // The stream's content is bounded, not its raw bytes: SSE framing is about ten times the
    // content it carries, so 16 MiB of raw events would cut off legitimate long answers. What the
    // provider keeps per event is nothing (the parser holds one event, the translator counters), so
    // events that carry no content (keep-alives, empty deltas) cost time, which the gateway's
    // deadlines bound, not memory.
    const translator = this.dialect.streamTranslator(this.name, this.bodyBytesMax);
    const out: Delta[] = [];
    let done = false;
    let answered = false;
    let relayed = false;
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
        // OpenAI's end marker; no other protocol sends it as data.
        if (data === '[DONE]') {
          // The end marker with nothing before it (no delta, no finish reason) is no answer.
          if (!relayed && out.length === 0 && !translator.finished)
            throw invalid(this.name, 'ended the stream without an answer');
          done = true;
          break;
        }
        translator.translate(parseJson(data, this.name), out);
        if (translator.ended) {
          done = true;
          break;
        }
      }
      // The first piece of the answer: the call's timer becomes the silence between reads.
      if (!answered && (out.length > 0 || translator.answering)) {
        answered = true;
        call.answered();
      }
      if (out.length > 0) relayed = true;
      // Held back or cut at a stop the provider was not given: its end is a finish of its own.
      const relay = cutter === null ? out : cutter.cutDeltas(out);
      if (cutter?.cut) done = true;
      for (const delta of relay) {
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
    if (!done && !translator.finished) {
      throw invalid(this.name, 'ended the stream without a finish reason');
    }
    if (cutter !== null) {
      if (cutter.cut) {
        yield cutter.finish(translator.finish());
        return;
      }
      const held = cutter.release();
      if (held.length > 0) yield { type: 'text', text: held };
    }
    yield translator.finish();
  }

  private async errorFromResponse(status: number, call: UpstreamCall): Promise<GatewayError> {
    // The status is the answer: its body is read against the silence between reads and for
    // ERROR_BODY_WAIT_MS at most, so a slow error body stays the error it is (a 400 never fails
    // over, a 503 does), not a timeout.
    call.answered();
    let code: string | null = null;
    let message = '';
    try {
      const text = await errorBodyText(call);
      const body = text === null ? null : (JSON.parse(text) as unknown);
      if (isRecord(body) || Array.isArray(body)) ({ code, message } = this.dialect.errorOf(body));
    } catch (error) {
      // Abort and timeout still win; an unreadable error body just means no code.
      if (call.signal.aborted || call.timedOut) throw error;
    }
    const safeCode = code !== null && isIdentifier(code) ? code : null;
    this.logger.warn({ status, upstreamCode: safeCode }, 'upstream answered an error');
    // Nothing of the body is passed on (CONTRACT §7): its message may quote the prompt, and even
    // its code is the provider's text (an account or project name fits an identifier); the log
    // above keeps the code for the operator.
    if (status === 400 && this.dialect.contextExceeded(status, code, message)) {
      return new GatewayError(
        'context_length_exceeded',
        `The input is longer than the upstream model's context window.`,
        { param: 'messages' },
      );
    }
    // Overloaded, rate limited or failing here may not be so at another deployment (CONTRACT §7).
    return new GatewayError('upstream_error', `Upstream ${this.name} answered HTTP ${status}.`, {
      failover: status === 429 || status >= 500,
    });
  }
}
