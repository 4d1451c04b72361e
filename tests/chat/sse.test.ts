// The SSE sink against a socket that stops draining: at most stream_buffer_bytes wait, an abort
// wakes the run loop, and a stopped run whose client is behind drops the connection instead of
// waiting for it.
import { describe, expect, test } from 'bun:test';
import type { ChatResult } from '../../src/chat/service.ts';
import {
  ChunkEncoder,
  type DirectController,
  SseSink,
  STOPPED_DRAIN_MS_MAX,
} from '../../src/chat/sse.ts';
import { GatewayError } from '../../src/util/errors.ts';
import { IdMap } from '../../src/util/id-map.ts';

const encoder = new ChunkEncoder('chatcmpl-test', 1, 'model_03');
const TEXT = 'word '.repeat(20);
const FRAME_CHARS = encoder.text(TEXT).length;
const OK: ChatResult = {
  ok: true,
  value: {
    content: TEXT,
    toolCalls: [],
    finishReason: 'stop',
    usage: { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 },
  },
};
const CANCELLED: ChatResult = {
  ok: false,
  error: new GatewayError('request_cancelled', 'The request was cancelled.'),
};

/**
 * Bun's direct-stream controller over a socket: while `stuck`, every write is taken but answered
 * with a promise that resolves when the test drains it, as Bun does while the socket is
 * backpressured.
 */
class FakeResponse implements DirectController {
  written = '';
  stuck = true;
  readonly drains: PromiseWithResolvers<number>[] = [];
  /** undefined while open; null when closed gracefully; the reason when aborted. */
  closedWith: unknown = undefined;
  readonly closed = Promise.withResolvers<void>();

  write(data: string | Bun.BufferSource | ArrayBuffer): number | Promise<number> {
    const text = data as string;
    this.written += text;
    if (!this.stuck) return text.length;
    const drain = Promise.withResolvers<number>();
    this.drains.push(drain);
    return drain.promise;
  }

  close(reason?: Error): void {
    this.closedWith = reason ?? null;
    this.closed.resolve();
  }

  /**
   * Bun sends what it holds. With `wait`, while the socket is stuck (or still `holding` bytes it
   * took without complaint), the answer is a promise that resolves when the test drains it.
   */
  holding = false;
  flush(wait?: boolean): number | Promise<number> {
    if (!wait || !(this.stuck || this.holding)) return 0;
    const drain = Promise.withResolvers<number>();
    this.drains.push(drain);
    return drain.promise;
  }

  /**
   * The socket drains what it holds (and stays stuck for what comes next unless `stuck` is
   * cleared).
   */
  async drainAll(): Promise<void> {
    this.holding = false;
    for (const drain of this.drains.splice(0)) drain.resolve(0);
    // The sink's drain callbacks run on the promise jobs that follow.
    await Promise.resolve();
    await Promise.resolve();
  }
}

function openSink(
  bufferBytesMax: number,
  controller = new AbortController(),
  deadlineMs = Date.now() + 60_000,
) {
  const response = new FakeResponse();
  const cancelled = { count: 0 };
  const ending = new IdMap<{ drop(): void }>();
  const sink = new SseSink({
    encoder,
    bufferBytesMax,
    signal: controller.signal,
    onCancel: () => cancelled.count++,
    deadlineMs,
    ending,
    id: 'chatcmpl-test',
  });
  sink.attach(response);
  return { sink, response, controller, cancelled, ending };
}

/** Options a sink needs besides the ones a test is about. */
const rest = () => ({
  deadlineMs: Date.now() + 60_000,
  ending: new IdMap<{ drop(): void }>(),
  id: 'chatcmpl-test',
});

/**
 * Writes text deltas until the sink makes the run loop wait; returns the characters written before
 * that and the wait.
 */
function writeUntilWait(sink: SseSink, limit = 10_000): { chars: number; wait: Promise<void> } {
  let chars = 0;
  for (let i = 0; i < limit; i++) {
    const wait = sink.text(TEXT);
    chars += FRAME_CHARS;
    if (wait) return { chars, wait };
  }
  throw new Error('the sink never made the run loop wait');
}

describe('SseSink with a client that stops reading', () => {
  test(
    'at most stream_buffer_bytes wait: past it ' + 'the run loop waits (the upstream is paused)',
    async () => {
      const bufferBytesMax = 4096;
      const roleChars = encoder.role().length;
      const { sink, response } = openSink(bufferBytesMax);
      // Frames written within a turn are gathered; once they reach the bound they go to the socket
      // in one write, which it takes but cannot send: they count from now on.
      expect(sink.begin()).toBeUndefined();
      const first = writeUntilWait(sink);
      // What waits when the loop is made to wait: the bound, plus at most the frame that crossed
      // it.
      expect(roleChars + first.chars).toBeGreaterThanOrEqual(bufferBytesMax);
      expect(roleChars + first.chars).toBeLessThan(bufferBytesMax + FRAME_CHARS);
      expect(response.written.length).toBe(roleChars + first.chars);
      let woke = false;
      void first.wait.then(() => (woke = true));
      await Promise.resolve();
      expect(woke).toBe(false);
      // The socket sends them: the loop goes on, and the next frames are bounded the same way.
      await response.drainAll();
      expect(woke).toBe(true);
      const second = writeUntilWait(sink);
      expect(second.chars).toBeGreaterThanOrEqual(bufferBytesMax);
      expect(second.chars).toBeLessThan(bufferBytesMax + FRAME_CHARS);
      expect(response.written.length).toBe(roleChars + first.chars + second.chars);
      // Frames written while the socket is behind wait in the sink, and make the loop wait at once.
      expect(sink.text(TEXT)).toBeInstanceOf(Promise);
    },
  );

  test('frames written within one turn go out together at the next, in one write', async () => {
    const { sink, response } = openSink(1 << 20);
    response.stuck = false;
    const writes: number[] = [];
    const write = response.write.bind(response);
    response.write = (data) => {
      writes.push((data as string).length);
      return write(data);
    };
    expect(sink.begin()).toBeUndefined();
    for (let i = 0; i < 5; i++) expect(sink.text(TEXT)).toBeUndefined();
    expect(response.written).toBe('');
    const turn = Promise.withResolvers<void>();
    setImmediate(turn.resolve);
    await turn.promise;
    expect(writes).toEqual([encoder.role().length + 5 * FRAME_CHARS]);
  });

  test(
    'an abort wakes the waiting run loop at once; the stopped run drops a client still behind ' +
      'after STOPPED_DRAIN_MS_MAX',
    async () => {
      const { sink, response, controller } = openSink(2048);
      sink.begin();
      const { wait } = writeUntilWait(sink);
      controller.abort();
      await wait;
      const endMs = Date.now();
      sink.end(CANCELLED);
      expect(response.closedWith).toBeUndefined();
      await response.closed.promise;
      expect(Date.now() - endMs).toBeGreaterThanOrEqual(STOPPED_DRAIN_MS_MAX - 5);
      expect(response.closedWith).toBeInstanceOf(Error);
      const written = response.written.length;
      // Nothing more is written to a dropped response, whatever drains later.
      await response.drainAll();
      expect(response.written.length).toBe(written);
    },
  );

  test(
    'a stopped run whose client catches up in ' + 'time gets its error event and a graceful end',
    async () => {
      const { sink, response, controller } = openSink(2048);
      sink.begin();
      const { wait } = writeUntilWait(sink);
      controller.abort();
      await wait;
      sink.end(CANCELLED);
      response.stuck = false;
      await response.drainAll();
      expect(response.closedWith).toBeNull();
      const last = response.written.slice(response.written.lastIndexOf('data: '));
      expect(JSON.parse(last.slice(6)).error.code).toBe('request_cancelled');
    },
  );

  test(
    'a completed run whose client is behind is not dropped: its last frames follow once the ' +
      'socket drains',
    async () => {
      const { sink, response, ending } = openSink(2048);
      sink.begin();
      sink.text(TEXT);
      sink.end(OK);
      expect(response.closedWith).toBeUndefined();
      expect(ending.size).toBe(1);
      response.stuck = false;
      await response.drainAll();
      await response.drainAll();
      expect(response.closedWith).toBeNull();
      expect(ending.size).toBe(0);
      expect(response.written.endsWith('data: [DONE]\n\n')).toBe(true);
    },
  );

  test(
    'a completed run whose client never takes the ' +
      'rest is dropped when the stream’s time is up',
    async () => {
      const { sink, response, ending } = openSink(
        2048,
        new AbortController(),
        Date.now() + STOPPED_DRAIN_MS_MAX + 200,
      );
      sink.begin();
      sink.text(TEXT);
      sink.end(OK);
      expect(ending.size).toBe(1);
      await response.closed.promise;
      expect(response.closedWith).toBeInstanceOf(Error);
      expect(ending.size).toBe(0);
    },
  );

  test(
    'bytes Bun took without complaint but has not sent keep the response open until they are ' +
      '(then a graceful end)',
    async () => {
      const { sink, response, ending } = openSink(2048);
      response.stuck = false;
      response.holding = true;
      sink.begin();
      sink.text(TEXT);
      sink.end(OK);
      // Not closed yet: close() now would leave nothing that could drop this connection later.
      expect(response.closedWith).toBeUndefined();
      expect(ending.size).toBe(1);
      await response.drainAll();
      expect(response.closedWith).toBeNull();
      expect(ending.size).toBe(0);
    },
  );

  test('shutdown drops every stream still ending (server.stop would leave them open)', async () => {
    const { sink, response, ending } = openSink(2048);
    sink.begin();
    sink.text(TEXT);
    sink.end(OK);
    for (const stream of ending.values()) stream.drop();
    expect(response.closedWith).toBeInstanceOf(Error);
    expect(ending.size).toBe(0);
  });

  test('a stopped run whose client keeps up ends with the error event, gracefully', async () => {
    const { sink, response } = openSink(2048);
    response.stuck = false;
    sink.begin();
    sink.text(TEXT);
    sink.end(CANCELLED);
    expect(response.closedWith).toBeNull();
    const last = response.written.slice(response.written.lastIndexOf('data: '));
    expect(JSON.parse(last.slice(6)).error.code).toBe('request_cancelled');
  });

  test(
    'frames made before the response pulls wait ' + 'in the sink, bounded, and go out in one write',
    async () => {
      const sink = new SseSink({
        encoder,
        bufferBytesMax: 2048,
        signal: new AbortController().signal,
        onCancel: () => {},
        ...rest(),
      });
      sink.begin();
      const { chars, wait } = writeUntilWait(sink);
      expect(chars).toBeLessThan(2048 + FRAME_CHARS);
      const response = new FakeResponse();
      response.stuck = false;
      sink.attach(response);
      await wait;
      expect(response.written.length).toBe(encoder.role().length + chars);
    },
  );
});

describe('SseSink read from JS (app.handle)', () => {
  test('a reader gets every frame, then the end', async () => {
    const sink = new SseSink({
      encoder,
      bufferBytesMax: 1024 * 1024,
      signal: new AbortController().signal,
      onCancel: () => {},
      ...rest(),
    });
    const text = new Response(sink.body).text();
    sink.begin();
    sink.text('Hello');
    sink.text(' there');
    sink.end(OK);
    const events = (await text).split('\n\n').filter(Boolean);
    expect(events.length).toBe(6);
    expect(JSON.parse(events[1]!.slice(6)).choices[0].delta.content).toBe('Hello');
    expect(events.at(-1)).toBe('data: [DONE]');
  });

  test('a reader that cancels is the client going away', async () => {
    const controller = new AbortController();
    let cancelled = 0;
    const sink = new SseSink({
      encoder,
      bufferBytesMax: 1024,
      signal: controller.signal,
      onCancel: () => cancelled++,
      ...rest(),
    });
    const reader = sink.body.getReader();
    sink.begin();
    await reader.read();
    await reader.cancel();
    expect(cancelled).toBe(1);
  });
});
