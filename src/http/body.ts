// Request bodies: the size limit and the read deadline are enforced while reading (413 or 400
// before parsing), chunked bodies too; a client that goes away mid-body is a 499, never an internal
// error.

import type { ByteBudget } from '../util/byte-budget.ts';
import { GatewayError } from '../util/errors.ts';
import {
  type FifoTimerEntry,
  type FifoTimers,
  fifoTimersFor,
  NOT_QUEUED,
} from '../util/fifo-timers.ts';
import { nextTurn } from '../util/promise.ts';

const DECODER = new TextDecoder('utf-8');

/**
 * A body text this long reaches its handler on the event loop's next turn, not in the turn that
 * decoded it: decoding 4 MB and then parsing it in one turn held the loop for 30-50 ms, the
 * contract's bound (CONTRACT §8); each alone is under 20. Small bodies (the hot path) go straight
 * on.
 */
export const BODY_YIELD_CHARS = 128 * 1024;

/** Bodies declaring more than this are read against the ByteBudget, as they arrive. */
const BUDGETED_FROM_BYTES = 64 * 1024;

/**
 * The 503 for a body that does not fit `limits.max_body_bytes_in_flight` (the ByteBudget of every
 * body being read): bodies are read before the key is checked, and each may take the read deadline
 * to arrive, so 200 connections sending 4 MB bodies one byte short held 860 MB for 10 s. Past the
 * bound a read is refused at once and the others go on.
 */
function overBudget(): GatewayError {
  return new GatewayError(
    'service_unavailable',
    'The gateway is reading as many request bodies as it holds at once; retry shortly.',
    // The rest of this body is not read: the connection goes with the answer.
    { headers: { connection: 'close' } },
  );
}

function tooLarge(maxBytes: number): GatewayError {
  return new GatewayError(
    'request_too_large',
    `The request body is larger than ${maxBytes} bytes.`,
    { detail: `the HTTP body must be at most ${maxBytes} bytes; split the request` },
  );
}

/**
 * Past the read deadline the answer closes the connection (`connection: close`, which Bun honours
 * once the answer is written): a client that trickles its body must not keep the socket, whatever
 * it sends.
 */
function tooSlow(timeoutMs: number): GatewayError {
  return new GatewayError(
    'invalid_request_error',
    `The request body did not arrive within ${timeoutMs} ms.`,
    {
      param: null,
      headers: { connection: 'close' },
    },
  );
}

/**
 * The body stream failed: the connection closed (or broke) before the body was in. The client is
 * gone.
 */
function readFailed(thrown: unknown): GatewayError {
  if (thrown instanceof GatewayError) return thrown;
  return new GatewayError(
    'request_cancelled',
    'The client went away before its request body arrived.',
    { cause: thrown },
  );
}

/**
 * Reads the whole body as text within `timeoutMs`, refusing it as soon as it passes `maxBytes`. The
 * deadline counts from here, once the headers are in: Bun calls a handler only then, and its own
 * idle timer (server.ts) bounds the headers. Not an async function: the usual body, sized by
 * Content-Length, is the runtime's own read with one timer beside it.
 */
export function readBodyText(
  request: Request,
  maxBytes: number,
  timeoutMs: number,
  budget: ByteBudget,
): Promise<string> {
  const declared = request.headers.get('content-length');
  if (declared !== null) {
    const length = Number(declared);
    if (Number.isFinite(length) && length > maxBytes) return Promise.reject(tooLarge(maxBytes));
    // A declared length within the limit bounds what HTTP/1.1 reads for this request, so the native
    // reader can take it whole: no JS stream, no chunk list (the common case, and the hot path).
    // Small ones, the hot path, outside the budget: they are bounded by the connections' count.
    // A larger one is read piece by piece, its bytes taken as they arrive: a declared length is
    // only a promise (64 connections declaring 4 MiB and sending nothing would hold the budget).
    if (Number.isFinite(length) && length <= BUDGETED_FROM_BYTES)
      return withDeadline(request.text(), timeoutMs);
  }
  return readChunked(request, maxBytes, timeoutMs, budget);
}

/**
 * `reading`, or the 400 that closes the connection once `timeoutMs` has passed; a failed read is a
 * 499. The deadline is a FifoTimers entry (every read of a gateway has the same limit), not a
 * runtime timer per request: almost every body is in before its deadline, which is then only
 * unlinked.
 */
function withDeadline(reading: Promise<string>, timeoutMs: number): Promise<string> {
  const read = new DeadlineRead(fifoTimersFor(timeoutMs));
  reading.then(read.done, read.failed);
  return read.promise;
}

/**
 * One body read against its deadline. A read that settles after the deadline (the connection then
 * closes under it) settles nothing: the promise is rejected already.
 */
class DeadlineRead implements FifoTimerEntry {
  timerPrev: FifoTimerEntry | null = null;
  timerNext: FifoTimerEntry | null = null;
  timerDueMs = NOT_QUEUED;
  readonly promise: Promise<string>;
  private readonly resolve: (text: string) => void;
  private readonly reject: (error: unknown) => void;

  constructor(private readonly timers: FifoTimers) {
    // withResolvers, not an executor: one closure and its scope fewer per request.
    const { promise, resolve, reject } = Promise.withResolvers<string>();
    this.promise = promise;
    this.resolve = resolve;
    this.reject = reject;
    timers.arm(this);
  }

  onTimer(): void {
    this.reject(tooSlow(this.timers.delayMs));
  }

  readonly done = (text: string): void => {
    this.timers.cancel(this);
    if (text.length > BODY_YIELD_CHARS) setImmediate(this.resolve, text);
    else this.resolve(text);
  };

  readonly failed = (thrown: unknown): void => {
    this.timers.cancel(this);
    this.reject(readFailed(thrown));
  };
}

/**
 * A body without a length (chunked): read piece by piece, stopped at the limit or at the deadline.
 */
async function readChunked(
  request: Request,
  maxBytes: number,
  timeoutMs: number,
  budget: ByteBudget,
): Promise<string> {
  const body = request.body;
  if (!body) return '';
  const reader = body.getReader();
  // Cancelling the reader ends a pending read (done), so the loop sees the deadline at once.
  let expired = false;
  const timer = setTimeout(() => {
    expired = true;
    reader.cancel().catch(() => {});
  }, timeoutMs);
  const chunks: Uint8Array[] = [];
  let totalBytes = 0;
  let taken = 0;
  try {
    for (;;) {
      let read: Bun.ReadableStreamDefaultReadResult<Uint8Array>;
      try {
        read = await reader.read();
      } catch (thrown) {
        throw expired ? tooSlow(timeoutMs) : readFailed(thrown);
      }
      if (expired) throw tooSlow(timeoutMs);
      if (read.done) break;
      const value = read.value;
      totalBytes += value.byteLength;
      if (totalBytes > maxBytes) {
        // Stop reading at once: the rest of an oversized body is never buffered.
        void reader.cancel().catch(() => {});
        throw tooLarge(maxBytes);
      }
      if (!budget.tryTake(value.byteLength)) {
        void reader.cancel().catch(() => {});
        throw overBudget();
      }
      taken += value.byteLength;
      chunks.push(value);
    }
  } finally {
    clearTimeout(timer);
    budget.give(taken);
  }
  let text: string;
  if (chunks.length === 1) text = DECODER.decode(chunks[0]);
  else {
    const all = new Uint8Array(totalBytes);
    let offset = 0;
    for (const chunk of chunks) {
      all.set(chunk, offset);
      offset += chunk.byteLength;
    }
    text = DECODER.decode(all);
  }
  if (text.length > BODY_YIELD_CHARS) await nextTurn();
  return text;
}
