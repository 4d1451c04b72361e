// HTTP/1.1 client for upstream calls, on Bun's TCP sockets: a keep-alive pool per origin, one
// thread.
//
// Why not `fetch`: Bun runs fetch on its own HTTP thread, so every call and every body read crosses
// threads twice, and each streamed body holds a 256 KB read buffer. Measured side by side
// (bench/README): a server that parses the body, calls the upstream and answers JSON costs 1.2 ×
// the CPU of a trivial fetch-based proxy when it uses fetch and 0.75 × when it uses this client,
// and its open streams cost a fraction of the memory. What it does not do: proxies (HTTP(S)_PROXY
// are not read), HTTP/2, redirects, compressed bodies (it asks for identity and refuses anything
// else).
import { closeSync, openSync } from 'node:fs';
import type { Socket, SocketHandler } from 'bun';
import {
  type HttpProtocolError,
  type ResponseHead,
  ResponseParser,
  type ResponseSink,
} from './response-parser.ts';

export type HttpFailureKind = 'connect' | 'closed' | 'protocol';

/** The exchange failed: could not connect, the connection broke, or the answer was malformed. */
export class HttpClientError extends Error {
  override name = 'HttpClientError';
  constructor(
    readonly kind: HttpFailureKind,
    message: string,
    /** The system error code (ECONNREFUSED, ENOTFOUND…) when there is one. */
    readonly code: string | null = null,
  ) {
    super(message);
  }
}

/**
 * What an exchange reports, in order: one head, body pieces, then the end, or one error at any
 * point.
 */
export interface ExchangeHandler {
  onHead(head: ResponseHead): void;
  onBody(bytes: Uint8Array): void;
  onEnd(): void;
  onError(error: HttpClientError): void;
}

export interface HttpClientOptions {
  /** PEM certificates to trust instead of the built-in roots (https only). */
  ca?: string;
  /** Idle connections kept; more are closed when their exchange ends. */
  idleMax?: number;
  /**
   * A kept connection closed unanswered this soon after the request is resent once (see `lost`).
   */
  resendWindowMs?: number;
}

/**
 * The race a resend is for: the upstream closes an idle kept connection (its keep-alive timeout)
 * just as our request goes out on it, so the close crosses the request on the wire and comes back
 * within a round trip. A connection that dies later was reading our request and working on it:
 * resending would make the upstream do (and bill) the work twice.
 */
const RESEND_WINDOW_MS = 1_000;

/** Idle keep-alive connections close after this; below the usual 5 s of upstream servers. */
const IDLE_TIMEOUT_S = 4;
const IDLE_MAX_DEFAULT = 256;

/**
 * Connects in flight to one origin at most. A connect cannot be closed before it opens (Bun hands
 * no socket until then), and to a host that drops SYNs it stays in SYN-SENT for the kernel's
 * ~130 s: without a bound, requests timing out one after another would each leave a descriptor
 * behind until the process runs out. Past it a request waits for a connect to end or a connection
 * to come free (a burst to a healthy upstream opens its connections within a round trip); its own
 * deadline bounds the wait, and the requests waiting are bounded by the gateway's in-flight limit.
 */
const CONNECTS_OPENING_MAX = 256;

/** One request and its answer, on a connection of the pool. */
export class HttpExchange {
  connection: Connection | null = null;
  /** Ended: completed, failed or aborted; no callback follows. */
  finished = false;
  /**
   * Sent once more already, on a new connection, after a kept one closed with no answer (see
   * `lost`).
   */
  retried = false;
  paused = false;
  /** The client whose queue this waits in for a connect slot (HttpClient.openFor), if any. */
  waitingOn: HttpClient | null = null;

  constructor(
    /**
     * Request line, header fields and the empty line, then the body: one write when the socket
     * takes it.
     */
    readonly requestText: string,
    readonly requestBytes: number,
    readonly handler: ExchangeHandler,
  ) {}

  /**
   * Stops the exchange at once: the connection is closed (never reused) and no callback follows.
   */
  abort(): void {
    if (this.finished) return;
    this.finished = true;
    if (this.waitingOn !== null) {
      this.waitingOn.stopWaiting(this);
      return;
    }
    const connection = this.connection;
    this.connection = null;
    connection?.abandon();
  }

  /** Backpressure: stop reading the upstream socket until `resume`. */
  pause(): void {
    if (this.paused || this.finished) return;
    this.paused = true;
    this.connection?.socket?.pause();
  }

  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    if (!this.finished) this.connection?.socket?.resume();
  }
}

/** One TCP (or TLS) connection; carries one exchange at a time. */
class Connection implements ResponseSink {
  socket: Socket<Connection> | null = null;
  exchange: HttpExchange | null = null;
  /** The current exchange's parser; null while the connection carries none. */
  parser: ResponseParser | null = null;
  /** The one parser this connection uses, reset for each exchange (not one per request). */
  private ownParser: ResponseParser | null = null;
  /** Taken from the idle pool (a stale one may close under the request). */
  reused = false;
  closed = false;
  /** Bytes of the request the socket has not taken yet. */
  pendingWrite: Uint8Array | null = null;
  /** When this connection's current request was written (performance.now()). */
  startedAtMs = 0;
  /** Its connect is in flight (counted in the client's `openingCount` until it opens or fails). */
  opening = false;
  lastError: Error | null = null;

  constructor(readonly client: HttpClient) {}

  /** Sends the request of `exchange` on this (established) connection. */
  start(exchange: HttpExchange): void {
    this.exchange = exchange;
    exchange.connection = this;
    const parser = (this.ownParser ??= new ResponseParser(this));
    parser.reset();
    this.parser = parser;
    // A kept connection's earlier socket error is not this exchange's.
    this.lastError = null;
    this.startedAtMs = performance.now();
    const socket = this.socket!;
    const written = socket.write(exchange.requestText);
    if (written < 0) {
      // Closed before a byte of the request went out: a kept connection is retried there (see
      // `lost`).
      this.lost();
      return;
    }
    if (written < exchange.requestBytes)
      this.pendingWrite = Buffer.from(exchange.requestText).subarray(written);
    if (exchange.paused) socket.pause();
  }

  drain(): void {
    const pending = this.pendingWrite;
    if (pending === null || this.socket === null) return;
    const written = this.socket.write(pending);
    if (written < 0) return; // the close that follows reports it
    this.pendingWrite = written < pending.length ? pending.subarray(written) : null;
  }

  head(head: ResponseHead): void {
    const exchange = this.exchange;
    if (exchange !== null && !exchange.finished) exchange.handler.onHead(head);
  }

  body(bytes: Uint8Array): void {
    const exchange = this.exchange;
    if (exchange !== null && !exchange.finished) exchange.handler.onBody(bytes);
  }

  end(): void {
    // Reported after the read that completed it (`received`), once the connection knows its fate.
  }

  received(bytes: Uint8Array): void {
    const parser = this.parser;
    if (this.exchange === null || parser === null) {
      // Nothing was asked on this connection: whatever it says cannot be trusted with the next
      // request.
      this.drop();
      return;
    }
    try {
      parser.feed(bytes);
    } catch (error) {
      this.fail(
        new HttpClientError(
          'protocol',
          `malformed answer: ${(error as HttpProtocolError).message}`,
        ),
      );
      return;
    }
    // A handler may have aborted the exchange from inside the read (then it is gone already).
    if (parser.done && this.exchange !== null) this.complete();
  }

  /**
   * The answer is complete: hand the connection back (when it can carry another request) and
   * report.
   */
  private complete(): void {
    const exchange = this.exchange!;
    this.exchange = null;
    exchange.connection = null;
    const reusable = this.parser!.keepAlive && this.pendingWrite === null && !this.closed;
    this.parser = null;
    if (reusable) {
      if (exchange.paused) this.socket!.resume();
      this.client.release(this);
    } else {
      this.drop();
    }
    if (!exchange.finished) {
      exchange.finished = true;
      exchange.handler.onEnd();
    }
  }

  /** Ends the exchange with `error` and closes the connection. */
  fail(error: HttpClientError): void {
    const exchange = this.exchange;
    this.exchange = null;
    this.drop();
    if (exchange !== null && !exchange.finished) {
      exchange.finished = true;
      exchange.connection = null;
      exchange.handler.onError(error);
    }
  }

  /** The socket closed (by the upstream, or under us). */
  lost(): void {
    this.closed = true;
    this.client.forget(this);
    const exchange = this.exchange;
    if (exchange === null || exchange.finished) return;
    const parser = this.parser;
    if (parser?.close()) {
      this.complete();
      return;
    }
    if (
      this.reused &&
      !exchange.retried &&
      (parser === null || !parser.started) &&
      performance.now() - this.startedAtMs <= this.client.resendWindowMs
    ) {
      // A kept connection the upstream closed before a byte of the answer (its keep-alive timeout
      // met our request): CONTRACT §7 asks for one more try on a new connection before this is a
      // failure. The upstream may have read the request, so this is the only resend there is: never
      // on a new connection, never twice, never once any byte of an answer came (that answer was
      // begun), never for a close long after the request (RESEND_WINDOW_MS: the upstream was
      // working on it).
      this.retryElsewhere(exchange);
      return;
    }
    const code = errorCode(this.lastError);
    this.fail(
      new HttpClientError(
        'closed',
        `the connection closed before the answer was complete${code ? ` (${code})` : ''}`,
        code,
      ),
    );
  }

  private retryElsewhere(exchange: HttpExchange): void {
    this.closed = true;
    this.client.forget(this);
    this.exchange = null;
    this.parser = null;
    exchange.connection = null;
    exchange.retried = true;
    this.client.openFor(exchange);
  }

  /**
   * Its exchange was aborted. A connection still connecting cannot be closed yet: it waits, without
   * an exchange, for the next request to this origin (or, once open, in the idle pool), so that
   * connects to a host that does not answer them do not pile up. Otherwise closed. (`opening` ends
   * at `open`, before a TLS handshake and before any request is written: a parked connection has
   * sent nothing, so no answer meant for an aborted request can reach the one that takes it over.)
   */
  abandon(): void {
    if (this.opening && !this.closed) {
      this.exchange = null;
      this.client.park(this);
      return;
    }
    this.drop();
  }

  /** Closes the socket now; an idle or unfinished connection is never reused. */
  drop(): void {
    this.closed = true;
    this.exchange = null;
    this.client.forget(this);
    // Still connecting: `open` sees `closed` and ends it there.
    if (this.socket !== null) this.socket.terminate();
  }
}

/**
 * EMFILE or ENFILE when this process cannot open a descriptor right now, else null (one open and
 * close).
 */
function descriptorShortage(): string | null {
  try {
    closeSync(openSync('/dev/null', 'r'));
    return null;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    return code === 'EMFILE' || code === 'ENFILE' ? code : null;
  }
}

/**
 * Fails `exchange` with `error` once the caller's code has run (it has not seen the exchange yet),
 * unless it was aborted meanwhile: no callback follows an abort.
 */
function failSoon(exchange: HttpExchange, error: HttpClientError): void {
  queueMicrotask(() => {
    if (exchange.finished) return;
    exchange.finished = true;
    exchange.handler.onError(error);
  });
}

function errorCode(error: unknown): string | null {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' && /^[A-Z0-9_]{1,40}$/.test(code) ? code : null;
}

/**
 * The socket callbacks, one set per client (Bun shares them among all its sockets). Long because
 * Bun takes them as one object; each callback is short and named for the socket event it handles.
 */
function socketHandlers(tls: boolean): SocketHandler<Connection> {
  const opened = (socket: Socket<Connection>): void => {
    const connection = socket.data;
    connection.socket = socket;
    if (connection.closed) {
      socket.terminate();
      return;
    }
    const exchange = connection.exchange;
    if (exchange === null || exchange.finished) {
      connection.exchange = null;
      connection.client.release(connection);
      return;
    }
    connection.start(exchange);
  };
  return {
    // Buffers: the parser reads the head with Buffer's native latin1 slice, no view or decoder.
    binaryType: 'buffer',
    open(socket) {
      const connection = socket.data;
      connection.socket = socket;
      connection.client.connectEnded(connection);
      // Aborted while connecting: end it now, not after a TLS handshake that may never come. (A
      // parked connect no request took over is kept for the pool only when no handshake is due.)
      if (connection.closed || (tls && connection.exchange === null)) {
        connection.closed = true;
        socket.terminate();
        return;
      }
      socket.setNoDelay(true);
      if (!tls) opened(socket);
    },
    handshake(socket, success, authorizationError) {
      if (success) {
        opened(socket);
        return;
      }
      const reason = authorizationError?.message ?? 'handshake failed';
      socket.data.fail(
        new HttpClientError('connect', `TLS: ${reason}`, errorCode(authorizationError)),
      );
    },
    data(socket, bytes) {
      socket.data.received(bytes);
    },
    drain(socket) {
      socket.data.drain();
    },
    error(socket, error) {
      socket.data.lastError = error;
    },
    close(socket, error) {
      const connection = socket.data;
      if (error) connection.lastError = error;
      connection.lost();
    },
    connectError(socket, error) {
      const connection = socket.data;
      connection.client.connectEnded(connection);
      connection.closed = true;
      // Bun reports a socket it could not even create (out of descriptors) as ECONNREFUSED; tell
      // the two apart, since one is the upstream's doing and the other this process's.
      const code = descriptorShortage() ?? errorCode(error);
      connection.fail(new HttpClientError('connect', code ?? error.message, code));
    },
    timeout(socket) {
      // Only idle connections have a timeout armed; Bun reports it but leaves closing to us.
      if (socket.data.exchange === null) socket.data.drop();
    },
  };
}

/** Connections to one origin (`http://host:port` or `https://host:port`). */
export class HttpClient {
  private readonly hostname: string;
  private readonly port: number;
  private readonly tls: { serverName: string; ca?: string } | null;
  private readonly handlers: SocketHandler<Connection>;
  private readonly idle: Connection[] = [];
  /** Connects in flight whose exchange was aborted: the next request takes one over. */
  private readonly parked: Connection[] = [];
  /** Connects in flight, parked or not. */
  private openingCountValue = 0;
  /** Exchanges waiting for a connect slot (CONNECTS_OPENING_MAX), oldest first. */
  private readonly waiting: HttpExchange[] = [];
  private readonly idleMax: number;
  readonly resendWindowMs: number;
  private closed = false;

  constructor(origin: URL, options: HttpClientOptions = {}) {
    const https = origin.protocol === 'https:';
    if (!https && origin.protocol !== 'http:')
      throw new Error(`unsupported protocol ${origin.protocol}`);
    // URL keeps IPv6 literals in brackets; sockets want the bare address.
    this.hostname = origin.hostname.startsWith('[')
      ? origin.hostname.slice(1, -1)
      : origin.hostname;
    this.port = origin.port === '' ? (https ? 443 : 80) : Number(origin.port);
    this.tls = https
      ? { serverName: this.hostname, ...(options.ca !== undefined ? { ca: options.ca } : {}) }
      : null;
    this.handlers = socketHandlers(https);
    this.idleMax = options.idleMax ?? IDLE_MAX_DEFAULT;
    this.resendWindowMs = options.resendWindowMs ?? RESEND_WINDOW_MS;
  }

  /** Idle keep-alive connections right now. */
  get idleCount(): number {
    return this.idle.length;
  }

  /** Connects in flight right now (bounded by CONNECTS_OPENING_MAX). */
  get openingCount(): number {
    return this.openingCountValue;
  }

  /** Requests waiting for a connect slot right now. */
  get waitingCount(): number {
    return this.waiting.length;
  }

  /**
   * Sends a request. `requestText` holds the request line, the header fields, the empty line and
   * the body; `requestBytes` is its length in UTF-8. The handler hears the answer (or the failure).
   */
  request(requestText: string, requestBytes: number, handler: ExchangeHandler): HttpExchange {
    const exchange = new HttpExchange(requestText, requestBytes, handler);
    if (this.closed) {
      failSoon(exchange, new HttpClientError('connect', 'client closed'));
      return exchange;
    }
    const connection = this.takeIdle();
    if (connection !== null) {
      connection.reused = true;
      connection.start(exchange);
      return exchange;
    }
    this.openFor(exchange);
    return exchange;
  }

  /**
   * A new connection for `exchange`: a connect an aborted request left (the oldest, the likeliest
   * to open first), else a connect of its own, or, with CONNECTS_OPENING_MAX in flight, a place in
   * the queue. `open` (or `handshake`) sends the request.
   */
  openFor(exchange: HttpExchange): void {
    const parked = this.parked.shift();
    if (parked !== undefined) {
      parked.exchange = exchange;
      exchange.connection = parked;
      return;
    }
    if (this.openingCountValue >= CONNECTS_OPENING_MAX) {
      exchange.waitingOn = this;
      this.waiting.push(exchange);
      return;
    }
    this.connect(exchange);
  }

  /** An aborted exchange leaves the queue (HttpExchange.abort). */
  stopWaiting(exchange: HttpExchange): void {
    exchange.waitingOn = null;
    const at = this.waiting.indexOf(exchange);
    if (at !== -1) this.waiting.splice(at, 1);
  }

  /** The oldest exchange waiting for a connection, out of the queue; null when none waits. */
  private nextWaiting(): HttpExchange | null {
    const exchange = this.waiting.shift();
    if (exchange === undefined) return null;
    exchange.waitingOn = null;
    return exchange;
  }

  private connect(exchange: HttpExchange): void {
    const connection = new Connection(this);
    connection.exchange = exchange;
    exchange.connection = connection;
    connection.opening = true;
    this.openingCountValue++;
    try {
      Bun.connect<Connection>({
        hostname: this.hostname,
        port: this.port,
        data: connection,
        socket: this.handlers,
        ...(this.tls ? { tls: this.tls } : {}),
      }).catch(() => {
        // Reported through `connectError`.
      });
    } catch (error) {
      // Refused before any socket (a CA Bun cannot load): no callback will come.
      connection.opening = false;
      this.openingCountValue--;
      exchange.connection = null;
      connection.closed = true;
      failSoon(
        exchange,
        new HttpClientError('connect', (error as Error).message, errorCode(error)),
      );
      return;
    }
  }

  /** A connection whose exchange ended cleanly waits here for the next request. */
  release(connection: Connection): void {
    if (connection.closed || this.closed) {
      connection.drop();
      return;
    }
    // A request waiting for a connect slot takes it (a kept connection, as one from the pool).
    const waiter = this.nextWaiting();
    if (waiter !== null) {
      connection.reused = true;
      connection.start(waiter);
      return;
    }
    if (this.idle.length >= this.idleMax) {
      connection.drop();
      return;
    }
    connection.reused = false;
    const socket = connection.socket!;
    socket.timeout(IDLE_TIMEOUT_S);
    // An idle connection must not keep the process alive.
    socket.unref();
    this.idle.push(connection);
  }

  forget(connection: Connection): void {
    const at = this.idle.lastIndexOf(connection);
    if (at !== -1) this.idle.splice(at, 1);
  }

  /** A connect whose exchange was aborted waits here for the next request (Connection.abandon). */
  park(connection: Connection): void {
    if (this.closed) connection.drop();
    else this.parked.push(connection);
  }

  /**
   * The connect of `connection` ended, opened or failed: no longer in flight or parked, and its
   * slot goes to the oldest request waiting for one.
   */
  connectEnded(connection: Connection): void {
    if (!connection.opening) return;
    connection.opening = false;
    this.openingCountValue--;
    const at = this.parked.lastIndexOf(connection);
    if (at !== -1) this.parked.splice(at, 1);
    if (this.closed) return;
    const waiter = this.nextWaiting();
    if (waiter !== null) this.connect(waiter);
  }

  private takeIdle(): Connection | null {
    // The most recently used first: the least likely to have been closed by the upstream meanwhile.
    for (;;) {
      const connection = this.idle.pop();
      if (connection === undefined) return null;
      if (connection.closed || connection.socket === null || connection.socket.readyState !== 1)
        continue;
      connection.socket.timeout(0);
      connection.socket.ref();
      return connection;
    }
  }

  /** Closes the idle connections and refuses new requests; running exchanges finish. */
  close(): void {
    this.closed = true;
    for (const connection of this.idle.splice(0)) connection.drop();
    // Still connecting: `open` sees them closed and ends them there.
    for (const connection of this.parked.splice(0)) connection.drop();
    for (const exchange of this.waiting.splice(0)) {
      exchange.waitingOn = null;
      failSoon(exchange, new HttpClientError('connect', 'client closed'));
    }
  }
}

export type { ResponseHead };
