// Incremental HTTP/1.1 response parser (RFC 9112): bytes in, split anywhere; head, body and end
// out.
//
// It reads the answers to our own requests to an upstream, so it is strict where a mistake would
// misframe a message (status line, Content-Length, chunk sizes) and lenient where RFC 9112 allows
// it (a bare LF ends a line, obs-fold is joined with a space). Every buffer it keeps has a limit.

/** Status line plus header fields; a larger head is refused. */
const HEAD_BYTES_MAX_DEFAULT = 64 * 1024;
/** A chunk-size line (with extensions) or a trailer line longer than this is refused. */
const LINE_BYTES_MAX = 8 * 1024;
/** All trailer fields of a chunked body together. */
const TRAILER_BYTES_MAX = 64 * 1024;

const CR = 13;
const LF = 10;

export class HttpProtocolError extends Error {
  override name = 'HttpProtocolError';
}

export interface ResponseHead {
  status: number;
  /** Field names in lower case; repeated fields joined with ", ". */
  headers: Map<string, string>;
  /**
   * The body's size when the head declares it (Content-Length, or 0 for 204/304); null when it is
   * chunked or runs until the close, so its size is known only as it arrives.
   */
  bodyBytes: number | null;
}

export interface ResponseSink {
  head(head: ResponseHead): void;
  /**
   * A piece of the decoded body (chunked framing removed): the bytes given to `feed`, or a part of
   * them (see `part`).
   */
  body(bytes: Uint8Array): void;
  /** The message is complete. */
  end(): void;
}

enum State {
  Head,
  Length,
  ChunkSize,
  ChunkData,
  ChunkDataEnd,
  Trailer,
  UntilClose,
  Done,
}

export class ResponseParser {
  private state = State.Head;
  /** Head bytes of earlier reads (a head split across reads); null while none are pending. */
  private headParts: Uint8Array[] | null = null;
  private headBytes = 0;
  private remaining = 0;
  /** The current chunk-size or trailer line, across reads. */
  private line = '';
  private trailerBytes = 0;
  private reusable = false;
  private received = false;

  constructor(
    private readonly sink: ResponseSink,
    private readonly headBytesMax = HEAD_BYTES_MAX_DEFAULT,
  ) {}

  /** Ready for the answer to the connection's next request, as if new. */
  reset(): void {
    this.state = State.Head;
    this.headParts = null;
    this.headBytes = 0;
    this.remaining = 0;
    this.line = '';
    this.trailerBytes = 0;
    this.reusable = false;
    this.received = false;
  }

  /** Any byte of a response arrived. */
  get started(): boolean {
    return this.received;
  }

  get done(): boolean {
    return this.state === State.Done;
  }

  /** After `end`: whether the connection may carry another request (framing known, no `close`). */
  get keepAlive(): boolean {
    return this.state === State.Done && this.reusable;
  }

  /** Consumes one read. Throws HttpProtocolError on a malformed response. */
  feed(bytes: Uint8Array): void {
    if (bytes.length > 0) this.received = true;
    let at = 0;
    while (at < bytes.length) {
      switch (this.state) {
        case State.Head:
          at = this.feedHead(bytes, at);
          break;
        case State.Length:
          at = this.passBody(bytes, at);
          if (this.remaining === 0) this.finish();
          break;
        case State.ChunkSize:
          at = this.feedChunkSize(bytes, at);
          break;
        case State.ChunkData:
          at = this.passBody(bytes, at);
          if (this.remaining === 0) this.state = State.ChunkDataEnd;
          break;
        case State.ChunkDataEnd: {
          // CRLF after the chunk data; a bare LF is accepted.
          const byte = bytes[at]!;
          if (byte === CR && this.line.length === 0) {
            this.line = '\r';
            at++;
          } else if (byte === LF) {
            this.line = '';
            this.state = State.ChunkSize;
            at++;
          } else {
            throw new HttpProtocolError('chunk data not followed by CRLF');
          }
          break;
        }
        case State.Trailer:
          at = this.feedTrailer(bytes, at);
          break;
        case State.UntilClose:
          this.sink.body(at === 0 ? bytes : part(bytes, at, bytes.length));
          at = bytes.length;
          break;
        case State.Done:
          // Bytes after a complete answer to the one request sent: the connection is not
          // trustworthy.
          this.reusable = false;
          return;
      }
    }
  }

  /**
   * The connection closed. Completes a body framed by the close and returns true; returns false
   * when the answer was cut off (or never started).
   */
  close(): boolean {
    if (this.state === State.UntilClose) {
      this.finish();
      return true;
    }
    return this.state === State.Done;
  }

  /** Hands up to `remaining` body bytes from `at` to the sink; returns where it stopped. */
  private passBody(bytes: Uint8Array, at: number): number {
    const take = Math.min(this.remaining, bytes.length - at);
    this.remaining -= take;
    this.sink.body(at === 0 && take === bytes.length ? bytes : part(bytes, at, at + take));
    return at + take;
  }

  private feedHead(bytes: Uint8Array, at: number): number {
    const parts = this.headParts;
    if (parts === null) {
      // The usual case: the whole head is in this read.
      const end = findHeadEnd(bytes, at);
      if (end !== -1) {
        if (end - at > this.headBytesMax)
          throw new HttpProtocolError(`response head over ${this.headBytesMax} bytes`);
        this.parseHead(latin1(bytes, at, end));
        return end;
      }
      checkStatusPrefix(bytes, at, bytes.length);
      this.keepHeadPart(bytes.subarray(at));
      return bytes.length;
    }
    // The head was split across reads: join what is pending with this read and rescan it whole.
    const pendingBytes = this.headBytes;
    const joined = new Uint8Array(pendingBytes + bytes.length - at);
    let offset = 0;
    for (const part of parts) {
      joined.set(part, offset);
      offset += part.length;
    }
    joined.set(bytes.subarray(at), offset);
    const end = findHeadEnd(joined, 0);
    if (end === -1) {
      checkStatusPrefix(joined, 0, joined.length);
      this.headParts = null;
      this.headBytes = 0;
      this.keepHeadPart(joined);
      return bytes.length;
    }
    if (end > this.headBytesMax)
      throw new HttpProtocolError(`response head over ${this.headBytesMax} bytes`);
    this.headParts = null;
    this.headBytes = 0;
    this.parseHead(latin1(joined, 0, end));
    // The pending bytes held no complete head, so it ends inside this read.
    return at + (end - pendingBytes);
  }

  private keepHeadPart(part: Uint8Array): void {
    this.headBytes += part.length;
    if (this.headBytes > this.headBytesMax)
      throw new HttpProtocolError(`response head over ${this.headBytesMax} bytes`);
    (this.headParts ??= []).push(part);
  }

  // Long on purpose: one scan of the status line and headers, each check next to the byte it
  // refuses; split, the scan state would have to travel between functions on every response.
  private parseHead(text: string): void {
    // Lines end with LF, optionally preceded by CR; the text ends with the empty line. Scanned in
    // place: this runs for every upstream answer.
    let newline = text.indexOf('\n');
    const status = parseStatusLine(text, lineEnd(text, 0, newline));
    if (status === -1) throw new HttpProtocolError('malformed status line');
    const http10 = text.charCodeAt(7) === 48; // "HTTP/1.0"
    const headers = new Map<string, string>();
    let lastName: string | null = null;
    for (let start = newline + 1; start < text.length; start = newline + 1) {
      newline = text.indexOf('\n', start);
      const end = lineEnd(text, start, newline);
      if (end === start) continue;
      const first = text.charCodeAt(start);
      if (first === 32 || first === 9) {
        // obs-fold: a continuation of the previous field, joined with a space (RFC 9112 §5.2).
        if (lastName === null) throw new HttpProtocolError('header continuation without a field');
        headers.set(lastName, `${headers.get(lastName)} ${text.slice(start, end).trim()}`);
        continue;
      }
      const colon = text.indexOf(':', start);
      if (colon <= start || colon >= end) throw new HttpProtocolError('malformed header field');
      const name = fieldName(text, start, colon);
      if (name === null) throw new HttpProtocolError('malformed header field name');
      let valueStart = colon + 1;
      let valueEnd = end;
      while (valueStart < valueEnd && isWhitespace(text.charCodeAt(valueStart))) valueStart++;
      while (valueEnd > valueStart && isWhitespace(text.charCodeAt(valueEnd - 1))) valueEnd--;
      const value = text.slice(valueStart, valueEnd);
      const previous = headers.get(name);
      headers.set(name, previous === undefined ? value : `${previous}, ${value}`);
      lastName = name;
    }

    if (status < 200) {
      // Interim answers (100 Continue, 103 Early Hints) precede the real one; 101 would switch
      // protocols.
      if (status === 101) throw new HttpProtocolError('unexpected protocol switch');
      this.state = State.Head;
      return;
    }
    const connection = headers.get('connection')?.toLowerCase() ?? '';
    this.reusable = !http10 && !hasToken(connection, 'close');
    const transferEncoding = headers.get('transfer-encoding');
    const contentLength = headers.get('content-length');
    // The framing is settled before the head is reported, so the sink learns a declared size with
    // it (and can refuse an oversized body before a byte of it is read).
    let bodyBytes: number | null = null;
    if (status === 204 || status === 304) {
      bodyBytes = 0;
      this.state = State.Done;
      // Ends at its head, so whatever a broken upstream still sends after it would be read as the
      // next request's answer; no API answers a call this way, so the connection goes.
      this.reusable = false;
    } else if (transferEncoding !== undefined) {
      if (transferEncoding.trim().toLowerCase() !== 'chunked')
        // Not its text: nothing the provider wrote reaches the client (CONTRACT §7).
        throw new HttpProtocolError('unsupported transfer-encoding');
      // With both, Transfer-Encoding wins and the connection is not reused (RFC 9112 §6.3).
      if (contentLength !== undefined) this.reusable = false;
      this.line = '';
      this.state = State.ChunkSize;
    } else if (contentLength !== undefined) {
      bodyBytes = parseContentLength(contentLength);
      this.remaining = bodyBytes;
      this.state = bodyBytes === 0 ? State.Done : State.Length;
    } else {
      this.reusable = false;
      this.state = State.UntilClose;
    }
    this.sink.head({ status, headers, bodyBytes });
    if (this.state === State.Done) this.sink.end();
  }

  private feedChunkSize(bytes: Uint8Array, at: number): number {
    const newline = bytes.indexOf(LF, at);
    const end = newline === -1 ? bytes.length : newline;
    if (this.line.length + (end - at) > LINE_BYTES_MAX)
      throw new HttpProtocolError('chunk-size line too long');
    // The usual line, whole in this read and only hex digits (every event of a stream is a chunk):
    // read from the bytes, without the line's string, its trim and a regular expression.
    let size = this.line.length === 0 && newline !== -1 ? plainChunkSize(bytes, at, newline) : -1;
    if (size === -1) {
      this.line += latin1(bytes, at, end);
      if (newline === -1) return bytes.length;
      size = chunkSizeOfLine(stripCr(this.line));
      this.line = '';
    }
    if (size === 0) {
      this.trailerBytes = 0;
      this.state = State.Trailer;
    } else {
      this.remaining = size;
      this.state = State.ChunkData;
    }
    return newline + 1;
  }

  private feedTrailer(bytes: Uint8Array, at: number): number {
    const newline = bytes.indexOf(LF, at);
    const end = newline === -1 ? bytes.length : newline;
    this.trailerBytes += end - at;
    if (this.trailerBytes > TRAILER_BYTES_MAX)
      throw new HttpProtocolError('trailer fields too large');
    this.line += latin1(bytes, at, end);
    if (newline === -1) return bytes.length;
    const line = stripCr(this.line);
    this.line = '';
    // Trailer fields carry nothing we use; the empty line ends the message.
    if (line.length === 0) this.finish();
    return newline + 1;
  }

  private finish(): void {
    this.state = State.Done;
    this.sink.end();
  }
}

/**
 * A body part of up to this many bytes is copied rather than viewed (`part`). Past it, a socket's
 * buffer is no longer kept in the collector's heap, so a view costs no move.
 */
const PART_COPY_BYTES_MAX = 16 * 1024;
const copyBytes = Buffer.prototype.copy;

/**
 * Bytes `start` to `end` of `bytes` as their own array. A read's bytes are a small typed array in
 * the collector's heap; a view of it (subarray) makes JavaScriptCore first move them to an
 * ArrayBuffer of their own, which costs more than copying the part out: ~560 ns more per read, the
 * part's decoding included (bench/README, stop 32). An upstream stream is mostly reads of one
 * event each, a chunk's framing around it.
 */
function part(bytes: Uint8Array, start: number, end: number): Uint8Array {
  if (end - start > PART_COPY_BYTES_MAX) return bytes.subarray(start, end);
  const out = new Uint8Array(end - start);
  copyBytes.call(bytes, out, 0, start, end);
  return out;
}

/** Bytes `start` to `end` as latin1 text (one character per byte, whatever the byte), natively. */
function latin1(bytes: Uint8Array, start: number, end: number): string {
  const buffer = Buffer.isBuffer(bytes)
    ? bytes
    : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  return buffer.toString('latin1', start, end);
}

/** Where the line from `start` to the LF at `newline` ends, without its CR. */
function lineEnd(text: string, start: number, newline: number): number {
  return newline > start && text.charCodeAt(newline - 1) === CR ? newline - 1 : newline;
}

/**
 * The status of "HTTP/1.x NNN reason" (the line ends at `end`), or -1 when the line is malformed.
 */
function parseStatusLine(text: string, end: number): number {
  if (end < 12 || !text.startsWith('HTTP/1.') || text.charCodeAt(8) !== 32) return -1;
  const minor = text.charCodeAt(7);
  if (minor !== 48 && minor !== 49) return -1;
  if (end > 12 && text.charCodeAt(12) !== 32) return -1;
  let status = 0;
  for (let i = 9; i < 12; i++) {
    const digit = text.charCodeAt(i) - 48;
    if (digit < 0 || digit > 9) return -1;
    status = status * 10 + digit;
  }
  // 000-099 is no status (RFC 9110 §15): read as interim, it would have been waited past.
  return status < 100 ? -1 : status;
}

const HTTP_PREFIX = 'HTTP/';

/**
 * Refuses a head whose first bytes cannot begin a status line, before the rest of it arrives: an
 * upstream that speaks another protocol (an SSH banner, a TLS alert) is an unusable answer now,
 * not a timeout later.
 */
function checkStatusPrefix(bytes: Uint8Array, at: number, end: number): void {
  const checked = Math.min(end - at, HTTP_PREFIX.length);
  for (let i = 0; i < checked; i++)
    if (bytes[at + i] !== HTTP_PREFIX.charCodeAt(i))
      throw new HttpProtocolError('malformed status line');
}

/** The field name from `start` to `end` in lower case, or null when it is not a token. */
function fieldName(text: string, start: number, end: number): string | null {
  const common = commonFieldName(text, start, end);
  if (common !== null) return common;
  let upper = false;
  for (let i = start; i < end; i++) {
    const c = text.charCodeAt(i);
    if (c >= 65 && c <= 90) upper = true;
    else if (!IS_TOKEN[c]) return null;
  }
  const name = text.slice(start, end);
  return upper ? name.toLowerCase() : name;
}

/**
 * Field names most answers carry, in lower case. A name that is one of them (in any case) is
 * returned as this constant: no slice of the head and no lower-cased copy per field per answer.
 */
const COMMON_FIELD_NAMES = [
  'content-type',
  'content-length',
  'date',
  'connection',
  'keep-alive',
  'transfer-encoding',
  'content-encoding',
  'server',
  'vary',
  'cache-control',
];

/** The constant of COMMON_FIELD_NAMES the name from `start` to `end` is, in any case; or null. */
function commonFieldName(text: string, start: number, end: number): string | null {
  const length = end - start;
  for (const name of COMMON_FIELD_NAMES) {
    if (name.length !== length) continue;
    let i = 0;
    while (i < length) {
      const c = text.charCodeAt(start + i);
      // Only A-Z fold: nothing else may stand for a lower-case letter or a '-'.
      if ((c >= 65 && c <= 90 ? c + 32 : c) !== name.charCodeAt(i)) break;
      i++;
    }
    if (i === length) return name;
  }
  return null;
}

function isWhitespace(c: number): boolean {
  return c === 32 || c === 9;
}

/** tchar of RFC 9110 §5.6.2, by character code (upper-case letters are handled by the caller). */
const IS_TOKEN = new Uint8Array(128);
for (const c of "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")
  IS_TOKEN[c.charCodeAt(0)] = 1;

/** Index just past the empty line that ends a head, or -1. */
function findHeadEnd(bytes: Uint8Array, from: number): number {
  let newline = bytes.indexOf(LF, from);
  while (newline !== -1) {
    const next = bytes[newline + 1];
    if (next === LF) return newline + 2;
    if (next === CR && bytes[newline + 2] === LF) return newline + 3;
    newline = bytes.indexOf(LF, newline + 1);
  }
  return -1;
}

/**
 * The size of a chunk-size line from `start` to the LF at `newline` when it is 1 to 13 hex digits
 * and nothing else (a CR before the LF aside); else -1, and the line is read as text.
 */
function plainChunkSize(bytes: Uint8Array, start: number, newline: number): number {
  const end = newline > start && bytes[newline - 1] === CR ? newline - 1 : newline;
  if (end === start || end - start > 13) return -1;
  let size = 0;
  for (let i = start; i < end; i++) {
    const digit = HEX_VALUE[bytes[i]!]!;
    if (digit === 255) return -1;
    size = size * 16 + digit;
  }
  return size;
}

/** Each byte's value as a hex digit, 255 for any other byte. */
const HEX_VALUE = new Uint8Array(256).fill(255);
for (let i = 0; i < 16; i++) {
  HEX_VALUE['0123456789abcdef'.charCodeAt(i)] = i;
  HEX_VALUE['0123456789ABCDEF'.charCodeAt(i)] = i;
}

/** The size a chunk-size line (its CR removed) declares: extensions are ignored. */
function chunkSizeOfLine(line: string): number {
  const semicolon = line.indexOf(';');
  const hex = (semicolon === -1 ? line : line.slice(0, semicolon)).trim();
  if (!/^[0-9A-Fa-f]{1,13}$/.test(hex)) throw new HttpProtocolError('malformed chunk size');
  return parseInt(hex, 16);
}

function stripCr(line: string): string {
  return line.charCodeAt(line.length - 1) === CR ? line.slice(0, -1) : line;
}

function parseContentLength(value: string): number {
  if (value.length > 0 && value.length <= 15) {
    // The usual case, one plain number: read it without splitting.
    let length = 0;
    let i = 0;
    for (; i < value.length; i++) {
      const digit = value.charCodeAt(i) - 48;
      if (digit < 0 || digit > 9) break;
      length = length * 10 + digit;
    }
    if (i === value.length) return length;
  }
  // Repeated fields (or a list) must all name the same length.
  let length = -1;
  for (const part of value.split(',')) {
    const text = part.trim();
    if (!/^\d{1,15}$/.test(text)) throw new HttpProtocolError('malformed content-length');
    const parsed = Number(text);
    if (length !== -1 && parsed !== length)
      throw new HttpProtocolError('conflicting content-length');
    length = parsed;
  }
  return length;
}

function hasToken(list: string, token: string): boolean {
  // Most answers have no Connection field (an empty list) or one token: no split, no array.
  if (list.length === 0) return false;
  if (list.indexOf(',') === -1) return list.trim() === token;
  for (const part of list.split(',')) if (part.trim() === token) return true;
  return false;
}
