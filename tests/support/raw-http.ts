// Test support: a raw TCP client that writes HTTP by hand (slow, partial, stuck) and sees when the
// server closes.
import net from 'node:net';

export interface RawConnection {
  socket: net.Socket;
  /** Resolves when the connection is closed (by either side), with the ms since it was opened. */
  closed: Promise<number>;
  isClosed(): boolean;
  /** Everything received so far, as text. */
  received(): string;
  /** Resolves once `text` has been received (or rejects if the connection closes first). */
  receivedText(text: string): Promise<void>;
  write(text: string): void;
  /**
   * Sends `text` one byte at a time, `everyMs` apart, until it is all sent or the connection
   * closes.
   */
  trickle(text: string, everyMs: number): void;
  /** Stops reading: the server's writes fill the socket buffers and then wait. */
  stopReading(): void;
  destroy(): void;
}

export function rawConnect(port: number): Promise<RawConnection> {
  const opened = Promise.withResolvers<RawConnection>();
  const closed = Promise.withResolvers<number>();
  const socket = net.connect(port, '127.0.0.1');
  const startMs = Date.now();
  let text = '';
  let isClosed = false;
  let waiting: { text: string; resolve: () => void; reject: (error: Error) => void }[] = [];
  const timers: ReturnType<typeof setInterval>[] = [];
  socket.setEncoding('latin1');
  socket.on('data', (data: string) => {
    text += data;
    waiting = waiting.filter((wait) => {
      if (!text.includes(wait.text)) return true;
      wait.resolve();
      return false;
    });
  });
  // A reset (the server dropping a stream) is an error event before the close.
  socket.on('error', () => {});
  socket.on('close', () => {
    isClosed = true;
    for (const timer of timers) clearInterval(timer);
    for (const wait of waiting)
      wait.reject(
        new Error(
          `closed before ${JSON.stringify(wait.text)} ` +
            `arrived; got ${JSON.stringify(text.slice(0, 300))}`,
        ),
      );
    waiting = [];
    closed.resolve(Date.now() - startMs);
  });
  socket.on('connect', () =>
    opened.resolve({
      socket,
      closed: closed.promise,
      isClosed: () => isClosed,
      received: () => text,
      receivedText(expected) {
        if (text.includes(expected)) return Promise.resolve();
        const wait = Promise.withResolvers<void>();
        if (isClosed)
          return Promise.reject(new Error(`closed before ${JSON.stringify(expected)} arrived`));
        waiting.push({ text: expected, resolve: wait.resolve, reject: wait.reject });
        return wait.promise;
      },
      write(data) {
        if (!isClosed) socket.write(data);
      },
      trickle(data, everyMs) {
        let index = 0;
        const timer = setInterval(() => {
          if (isClosed || index >= data.length) return clearInterval(timer);
          socket.write(data[index++]!);
        }, everyMs);
        timers.push(timer);
      },
      stopReading() {
        socket.pause();
      },
      destroy() {
        socket.destroy();
      },
    }),
  );
  return opened.promise;
}

/** The head of a POST with a JSON body (or none), as a client would write it. */
export function postHead(
  path: string,
  headers: Record<string, string>,
  contentLength: number | 'chunked',
): string {
  const lines = [`POST ${path} HTTP/1.1`, 'Host: 127.0.0.1', 'Content-Type: application/json'];
  for (const [name, value] of Object.entries(headers)) lines.push(`${name}: ${value}`);
  lines.push(
    contentLength === 'chunked' ? 'Transfer-Encoding: chunked' : `Content-Length: ${contentLength}`,
  );
  return `${lines.join('\r\n')}\r\n\r\n`;
}
