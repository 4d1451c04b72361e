// One HTTP exchange with an upstream, its silence timer and its link to the caller's signal; shared
// by every HTTP provider whatever protocol it speaks.
import type { RunSignal } from '../../util/abort.ts';
import { GatewayError } from '../../util/errors.ts';
import { type FifoTimerEntry, type FifoTimers, NOT_QUEUED } from '../../util/fifo-timers.ts';
import { nextTurn, RESOLVED } from '../../util/promise.ts';
import { invalid, oversizedBody } from './answer.ts';
import type {
  ExchangeHandler,
  HttpClient,
  HttpClientError,
  HttpExchange,
  ResponseHead,
} from './client.ts';

/**
 * Body bytes received but not yet consumed before the upstream socket is paused (a slow client).
 */
const QUEUED_BYTES_MAX = 256 * 1024;

type ReadResult = { done: false; value: Uint8Array } | { done: true; value: undefined };

/**
 * One HTTP exchange with its timer and its link to the caller's signal. Until the consumer has its
 * first piece of the answer (`answered`), the timer runs from the request's send: bytes that carry
 * nothing (an SSE comment, Anthropic's ping, whitespace before a JSON body) do not hold off the
 * timeout, and with it the failover (CONTRACT §7). After that it measures upstream silence only
 * while we wait for each read, so a slow consumer is not a timeout. Body bytes arrive as the socket
 * reads them and wait in a bounded queue for `read`.
 */
export class UpstreamCall implements ExchangeHandler, FifoTimerEntry {
  readonly signal: RunSignal;
  /** Set once the answer was fully translated, so closing does not abort a finished exchange. */
  finished = false;
  timedOut = false;
  private readonly providerName: string;
  private readonly timeoutMs: number;
  /**
   * The silence timer: the provider's list of calls (one delay, FifoTimers), not a runtime timer
   * per call; this call is its own entry.
   */
  private readonly silence: FifoTimers;
  timerPrev: FifoTimerEntry | null = null;
  timerNext: FifoTimerEntry | null = null;
  timerDueMs = NOT_QUEUED;
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
  /** The consumer has a piece of the answer: from now on the timer times each wait (see wait). */
  private answeredYet = false;
  /** The timer fired before the answer while nothing waited: the next wait is the timeout. */
  private expired = false;
  /** A JSON body: its first byte that is not whitespace is the answer (see onBody). */
  private answerOnNonBlank = false;
  /** After close: the answer was complete and the body's end is awaited (see close). */
  private draining = false;
  private drainTimer: ReturnType<typeof setTimeout> | null = null;

  /** `silence` times the upstream's silence (its delay is the provider's timeout). */
  constructor(providerName: string, silence: FifoTimers, signal: RunSignal) {
    this.providerName = providerName;
    this.silence = silence;
    this.timeoutMs = silence.delayMs;
    this.signal = signal;
    // The timer and the abort listener reach this call without a closure each (one call per
    // request).
    silence.arm(this);
    signal.addEventListener('abort', this);
  }

  /** The caller's signal aborted (this object is its listener). */
  handleEvent(): void {
    this.exchange?.abort();
    this.wake(this.signal.reason);
  }

  /** Sends `text` (`bytes` long in UTF-8: the request line, fields, empty line and body). */
  async send(client: HttpClient, text: string, bytes: number): Promise<ResponseHead> {
    this.exchange = client.request(text, bytes, this);
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
    if (this.answerOnNonBlank && hasNonBlank(bytes)) {
      this.answerOnNonBlank = false;
      this.answeredYet = true;
    }
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
    this.silence.cancel(this);
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

  /**
   * The consumer has its first delta: from here the timer is the silence between reads, no longer
   * the deadline of the answer.
   */
  answered(): void {
    this.answeredYet = true;
  }

  /**
   * A JSON body: whitespace before it is a keep-alive (some servers send it while they work), its
   * first other byte the answer. Bytes that came with the head count.
   */
  answerAtFirstNonBlank(): void {
    if (this.answeredYet) return;
    for (const bytes of this.queue) {
      if (hasNonBlank(bytes)) {
        this.answeredYet = true;
        return;
      }
    }
    this.answerOnNonBlank = true;
  }

  private wait(): Promise<void> {
    this.bytesThisTurn = 0;
    if (!this.answeredYet && this.expired) {
      // The answer's deadline passed while the consumer was busy: the caller's next check throws.
      this.timeOut();
      return RESOLVED;
    }
    this.waiter = Promise.withResolvers<void>();
    if (this.answeredYet) {
      // Timed from now: back to the list's tail, where every later due time is.
      this.silence.cancel(this);
      this.silence.arm(this);
    }
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
        { failover: true },
      );
    }
    throw invalid(this.providerName, `broke the connection mid-answer${code}`);
  }

  /** The timer fired: the answer's deadline, or the silence after it began. */
  onTimer(): void {
    if (this.waiter === null) {
      // Not waiting: after the answer began, the next wait re-arms the timer; before, the next
      // wait is the timeout.
      if (!this.answeredYet) this.expired = true;
      return;
    }
    this.timeOut();
    this.wake(this.timeoutError());
  }

  private timeOut(): void {
    this.timedOut = true;
    this.exchange?.abort();
  }

  private timeoutError(): GatewayError {
    let what: string;
    if (this.phase === 'headers') what = 'sent no response headers within';
    else if (!this.answeredYet) what = 'did not answer within';
    else what = 'sent nothing for';
    const message = `Upstream ${this.providerName} ${what} ${this.timeoutMs} ms.`;
    return new GatewayError('upstream_timeout', message, { failover: true });
  }
}

const DECODER = new TextDecoder();

/** Whether `bytes` hold a byte other than JSON's whitespace (space, tab, CR, LF). */
function hasNonBlank(bytes: Uint8Array): boolean {
  for (let i = 0; i < bytes.length; i++) {
    const b = bytes[i]!;
    if (b !== 0x20 && b !== 0x0a && b !== 0x0d && b !== 0x09) return true;
  }
  return false;
}
/** Socket errors that are this process's own shortage, not the upstream's doing. */
const LOCAL_RESOURCE_ERRORS = new Set(['EMFILE', 'ENFILE', 'ENOBUFS', 'ENOMEM']);

/** Body bytes a consumer may take from the queue before it lets the event loop run once. */
const READ_BYTES_PER_TURN_MAX = 64 * 1024;
/** Deltas relayed before the event loop runs once (a few ms of work at most). */
export const DELTAS_PER_TURN_MAX = 256;

function stopDraining(call: UpstreamCall): void {
  call.stopDraining();
}

/**
 * How long the end of a complete answer's body may take before the connection is dropped instead.
 */
const DRAIN_MS_MAX = 1_000;
