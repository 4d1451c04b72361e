// Reads an SSE response event by event in tests.
export class SseReader {
  private buffer = '';
  private readonly decoder = new TextDecoder();
  private readonly reader: ReadableStreamDefaultReader<Uint8Array>;

  constructor(response: Response) {
    this.reader = (
      response.body as ReadableStream<Uint8Array>
    ).getReader() as ReadableStreamDefaultReader<Uint8Array>;
  }

  /** The next event's data, or null at the end of the stream. */
  async next(): Promise<string | null> {
    for (;;) {
      const end = this.buffer.indexOf('\n\n');
      if (end >= 0) {
        const event = this.buffer.slice(0, end);
        this.buffer = this.buffer.slice(end + 2);
        const data = event
          .split('\n')
          .filter((line) => line.startsWith('data: '))
          .map((line) => line.slice(6))
          .join('\n');
        if (data) return data;
        continue;
      }
      const { done, value } = await this.reader.read();
      if (done) return null;
      this.buffer += this.decoder.decode(value, { stream: true });
    }
  }

  async rest(): Promise<string[]> {
    const events: string[] = [];
    for (let data = await this.next(); data !== null; data = await this.next()) events.push(data);
    return events;
  }

  cancel(): Promise<void> {
    return this.reader.cancel();
  }
}
