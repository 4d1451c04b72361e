// Incremental Server-Sent Events parser: bytes in, complete events' `data` payloads out.
//
// Follows the WHATWG event-stream rules that matter for a data-only consumer: lines end with LF,
// CRLF or CR; a blank line dispatches the event; `data` lines are joined with LF; comments (":")
// and other fields (event, id, retry) are ignored; an event cut off by the end of the stream is
// discarded. Reads may split the stream at any byte, including inside a UTF-8 character (the one
// streaming TextDecoder keeps the partial bytes) and between CR and LF (remembered in a flag).

/** Characters one pending event (its data plus the unfinished line) may hold before we give up. */
export const SSE_EVENT_CHARS_MAX_DEFAULT = 16 * 1024 * 1024;

const LF = 10;
const CR = 13;
const COLON = 58;
const SPACE = 32;

export class SseEventTooLargeError extends Error {
  override name = 'SseEventTooLargeError';
}

export class SseParser {
  private readonly decoder = new TextDecoder();
  private readonly eventCharsMax: number;
  /** Decoded text not yet consumed; always starts at the beginning of a line. */
  private buffer = '';
  /** The previous read ended with CR: a LF at the start of the next read belongs to it. */
  private skipLeadingLf = false;
  private data = '';
  private hasData = false;
  /** Reused across calls so a read costs no array allocation; see `feed`. */
  private readonly events: string[] = [];

  constructor(eventCharsMax: number = SSE_EVENT_CHARS_MAX_DEFAULT) {
    this.eventCharsMax = eventCharsMax;
  }

  /**
   * Consumes one read and returns the `data` of every event it completed, in order. The returned
   * array is reused by the next `feed`/`end`: read it before feeding again.
   */
  feed(bytes: Uint8Array): readonly string[] {
    this.events.length = 0;
    const text = this.decoder.decode(bytes, { stream: true });
    if (text.length === 0) return this.events;
    this.buffer = this.buffer.length === 0 ? text : this.buffer + text;
    this.scan();
    return this.events;
  }

  /** The stream ended: an unterminated event is discarded, as the SSE spec says. */
  end(): readonly string[] {
    this.events.length = 0;
    this.decoder.decode();
    this.buffer = '';
    this.data = '';
    this.hasData = false;
    this.skipLeadingLf = false;
    return this.events;
  }

  private scan(): void {
    const buffer = this.buffer;
    const length = buffer.length;
    let position = 0;
    if (this.skipLeadingLf) {
      this.skipLeadingLf = false;
      if (buffer.charCodeAt(0) === LF) position = 1;
    }
    // Each search result is kept until the scan passes it, so a read with many lines and no CR (the
    // usual case) scans for CR once, not once per line.
    let lfIndex = buffer.indexOf('\n', position);
    let crIndex = buffer.indexOf('\r', position);
    while (position < length) {
      if (lfIndex !== -1 && lfIndex < position) lfIndex = buffer.indexOf('\n', position);
      if (crIndex !== -1 && crIndex < position) crIndex = buffer.indexOf('\r', position);
      let lineEnd: number;
      if (lfIndex === -1) lineEnd = crIndex;
      else if (crIndex === -1) lineEnd = lfIndex;
      else lineEnd = lfIndex < crIndex ? lfIndex : crIndex;
      if (lineEnd === -1) break;
      this.processLine(buffer, position, lineEnd);
      position = lineEnd + 1;
      if (buffer.charCodeAt(lineEnd) === CR) {
        if (position === length) this.skipLeadingLf = true;
        else if (buffer.charCodeAt(position) === LF) position++;
      }
    }
    this.buffer = position === 0 ? buffer : position >= length ? '' : buffer.slice(position);
    if (this.buffer.length + this.data.length > this.eventCharsMax) {
      throw new SseEventTooLargeError(`an SSE event exceeded ${this.eventCharsMax} characters`);
    }
  }

  private processLine(buffer: string, start: number, end: number): void {
    if (start === end) {
      this.dispatch();
      return;
    }
    const first = buffer.charCodeAt(start);
    if (first === COLON) return;
    // Only the `data` field matters; check its name in place instead of slicing the line.
    if (end - start < 4 || first !== 100 /* d */ || !buffer.startsWith('data', start)) return;
    let valueStart = start + 4;
    if (valueStart < end) {
      if (buffer.charCodeAt(valueStart) !== COLON) return; // a longer field name, e.g. "database"
      valueStart++;
      if (valueStart < end && buffer.charCodeAt(valueStart) === SPACE) valueStart++;
    }
    const value = buffer.slice(valueStart, end);
    if (this.hasData) this.data = this.data + '\n' + value;
    else {
      this.data = value;
      this.hasData = true;
    }
  }

  private dispatch(): void {
    if (!this.hasData) return;
    this.events.push(this.data);
    this.data = '';
    this.hasData = false;
  }
}
