// Incremental Server-Sent Events parser: bytes in, complete events' `data` payloads out.
//
// Follows the WHATWG event-stream rules that matter for a data-only consumer: lines end with LF,
// CRLF or CR; a blank line dispatches the event; `data` lines are joined with LF; comments (":")
// and other fields (event, id, retry) are ignored; an event cut off by the end of the stream is
// discarded. Reads may split the stream at any byte, including inside a UTF-8 character (the one
// streaming TextDecoder keeps the partial bytes) and between CR and LF (remembered in a flag).
//
// One event is bounded: the bytes of its lines (field names, values and comments as sent, without
// the line ends), the unfinished last line included. Nothing else is kept between reads, so a
// stream of endless comments or empty events holds no more memory than one line of it.
import { isAscii } from 'node:buffer';

/** Bytes one event may hold when the caller names no bound. */
export const SSE_EVENT_BYTES_MAX_DEFAULT = 16 * 1024 * 1024;

const LF = 10;
const CR = 13;
const COLON = 58;
const SPACE = 32;
const DATA = 'data';
/** The decoder's options for every read: one object, not one per read. */
const STREAMING = { stream: true } as const;

export class SseEventTooLargeError extends Error {
  override name = 'SseEventTooLargeError';
}

export class SseParser {
  private readonly decoder = new TextDecoder();
  private readonly eventBytesMax: number;
  /** The last line of earlier reads, not ended yet (it holds no CR or LF). */
  private line = '';
  /** UTF-8 bytes of `line`, counted as its pieces arrive. */
  private lineBytes = 0;
  /** UTF-8 bytes of the complete lines of the event being read. */
  private eventBytes = 0;
  /** The previous read ended with CR: a LF at the start of the next read belongs to it. */
  private skipLeadingLf = false;
  /**
   * This read's characters are its bytes, one each: it is ASCII, and so was the one before (which
   * then left no partial character to the decoder). The usual case; then no line needs its bytes
   * counted.
   */
  private charsAreBytes = true;
  private previousAscii = true;
  private data = '';
  private hasData = false;
  /** Reused across calls so a read costs no array allocation; see `feed`. */
  private readonly events: string[] = [];

  constructor(eventBytesMax: number = SSE_EVENT_BYTES_MAX_DEFAULT) {
    this.eventBytesMax = eventBytesMax;
  }

  /**
   * Consumes one read and returns the `data` of every event it completed, in order. The returned
   * array is reused by the next `feed`/`end`: read it before feeding again. Throws
   * SseEventTooLargeError when an event passes the bound.
   */
  feed(bytes: Uint8Array): readonly string[] {
    this.events.length = 0;
    const ascii = isAscii(bytes);
    this.charsAreBytes = ascii && this.previousAscii;
    this.previousAscii = ascii;
    const text = this.decoder.decode(bytes, STREAMING);
    if (text.length > 0) this.scan(text);
    return this.events;
  }

  /** The stream ended: an unterminated event is discarded, as the SSE spec says. */
  end(): readonly string[] {
    this.events.length = 0;
    this.decoder.decode();
    this.line = '';
    this.lineBytes = 0;
    this.eventBytes = 0;
    this.data = '';
    this.hasData = false;
    this.skipLeadingLf = false;
    this.previousAscii = true;
    return this.events;
  }

  private scan(text: string): void {
    const length = text.length;
    let position = 0;
    if (this.skipLeadingLf) {
      this.skipLeadingLf = false;
      if (text.charCodeAt(0) === LF) position = 1;
    }
    // Each search result is kept until the scan passes it, so a read with many lines and no CR (the
    // usual case) scans for CR once, not once per line. Only the new text is searched: the
    // unfinished line of earlier reads holds no line end, so a long line arriving in many reads is
    // scanned once.
    let lfIndex = text.indexOf('\n', position);
    let crIndex = text.indexOf('\r', position);
    while (position < length) {
      if (lfIndex !== -1 && lfIndex < position) lfIndex = text.indexOf('\n', position);
      if (crIndex !== -1 && crIndex < position) crIndex = text.indexOf('\r', position);
      let lineEnd: number;
      if (lfIndex === -1) lineEnd = crIndex;
      else if (crIndex === -1) lineEnd = lfIndex;
      else lineEnd = Math.min(lfIndex, crIndex);
      if (lineEnd === -1) break;
      if (this.line.length === 0) {
        if (position !== lineEnd) this.countLine(this.bytesOf(text, position, lineEnd));
        this.processLine(text, position, lineEnd);
      } else {
        // The end of a line that began in an earlier read.
        const line = this.line + text.slice(position, lineEnd);
        this.countLine(this.lineBytes + this.bytesOf(text, position, lineEnd));
        this.line = '';
        this.lineBytes = 0;
        this.processLine(line, 0, line.length);
      }
      position = lineEnd + 1;
      if (text.charCodeAt(lineEnd) === CR) {
        if (position === length) this.skipLeadingLf = true;
        else if (text.charCodeAt(position) === LF) position++;
      }
    }
    if (position < length) {
      this.lineBytes += this.bytesOf(text, position, length);
      this.line =
        this.line.length === 0 && position === 0 ? text : this.line + text.slice(position);
      if (this.eventBytes + this.lineBytes > this.eventBytesMax) this.tooLarge();
    }
  }

  /** UTF-8 bytes of `text` from `start` to `end`, counted only when the read is not plain ASCII. */
  private bytesOf(text: string, start: number, end: number): number {
    return this.charsAreBytes ? end - start : Buffer.byteLength(text.slice(start, end));
  }

  /** A complete line of `bytes` joins the current event. */
  private countLine(bytes: number): void {
    this.eventBytes += bytes;
    if (this.eventBytes > this.eventBytesMax) this.tooLarge();
  }

  private tooLarge(): never {
    throw new SseEventTooLargeError(`an SSE event exceeded ${this.eventBytesMax} bytes`);
  }

  private processLine(buffer: string, start: number, end: number): void {
    if (start === end) {
      this.dispatch();
      return;
    }
    // Comments and fields other than `data` keep nothing (their bytes were counted by the caller);
    // the field's name is checked in place instead of slicing the line.
    if (
      end - start < 4 ||
      buffer.charCodeAt(start) !== 100 /* d */ ||
      !buffer.startsWith(DATA, start)
    )
      return;
    let valueStart = start + 4;
    if (valueStart < end) {
      if (buffer.charCodeAt(valueStart) !== COLON) return; // a longer field name, e.g. "database"
      valueStart++;
      if (valueStart < end && buffer.charCodeAt(valueStart) === SPACE) valueStart++;
    }
    const value = buffer.slice(valueStart, end);
    if (this.hasData) this.data = `${this.data}\n${value}`;
    else {
      this.data = value;
      this.hasData = true;
    }
  }

  private dispatch(): void {
    this.eventBytes = 0;
    if (!this.hasData) return;
    this.events.push(this.data);
    this.data = '';
    this.hasData = false;
  }
}
