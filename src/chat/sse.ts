// Chat streams: the SSE chunk framing and the sink that relays a run's output to the client,
// bounded.

import { errorBody } from '../http/errors.ts';
import type { Usage } from '../state/events.ts';
import type { RunSignal } from '../util/abort.ts';
import type { GatewayError } from '../util/errors.ts';
import type { IdMap } from '../util/id-map.ts';
import type { ChatResult, ChatSink } from './service.ts';
import type { PublicFinishReason } from './stream.ts';

export const DONE_FRAME = 'data: [DONE]\n\n';

/**
 * Builds the SSE frames of one stream, as text (the sink hands text to the response, which encodes
 * it natively). The constant head of every chunk (id, object, created, model) is serialized once,
 * so a delta costs one concatenation.
 */
export class ChunkEncoder {
  private readonly head: string;

  constructor(id: string, createdS: number, model: string) {
    this.head =
      `data: {"id":${JSON.stringify(id)},"object":"chat.completion.chunk",` +
      `"created":${createdS},"model":${JSON.stringify(model)},"choices":`;
  }

  private frame(choices: string, tail = ''): string {
    return `${this.head}${choices}${tail}}\n\n`;
  }

  role(): string {
    return this.frame(
      '[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]',
    );
  }

  text(text: string): string {
    return this.frame(
      `[{"index":0,"delta":{"content":${JSON.stringify(text)}},"finish_reason":null}]`,
    );
  }

  toolCall(index: number, id: string | null, name: string | null, args: string): string {
    const opening = id !== null ? `"id":${JSON.stringify(id)},"type":"function",` : '';
    const fn =
      name !== null
        ? `{"name":${JSON.stringify(name)},"arguments":${JSON.stringify(args)}}`
        : `{"arguments":${JSON.stringify(args)}}`;
    return this.frame(
      `[{"index":0,"delta":{"tool_calls":[{"index":${index},${opening}"function":${fn}}]},` +
        '"finish_reason":null}]',
    );
  }

  finish(reason: PublicFinishReason): string {
    return this.frame(`[{"index":0,"delta":{},"finish_reason":"${reason}"}]`);
  }

  usage(usage: Usage): string {
    return this.frame('[]', `,"usage":${JSON.stringify(usage)}`);
  }
}

/**
 * An error after the stream started: one `data: {"error": ...}` event, then the end (no [DONE]).
 */
export function errorFrame(error: GatewayError): string {
  return `data: ${JSON.stringify(errorBody(error))}\n\n`;
}

/**
 * What the sink uses of Bun's controller of a `type: "direct"` ReadableStream. `write` hands text
 * to the response's own buffer (sent to the socket once per event-loop turn, or by `flush`) and
 * returns a promise instead of a count when the socket is backpressured, resolved when it drains or
 * closes; while that promise is out, later writes are taken and counted as if all were well.
 * `close(reason)` with a reason aborts the response: Bun resets the connection at once, even one
 * whose client stopped reading (measured: a plain ReadableStream that errors is noticed only when
 * the client reads again, and server.stop(true) leaves such a connection open).
 */
export type DirectController = Pick<ReadableStreamDirectController, 'write' | 'flush' | 'close'>;

/**
 * A stopped run (cancel, a time limit, shutdown) ends with its error event; a client that is behind
 * gets this long to take it, then its connection is dropped: the stop must have freed everything
 * within the contract's 1 s.
 */
export const STOPPED_DRAIN_MS_MAX = 500;

/**
 * The reason a stream is dropped with. Bun prints it only in development mode, which server.ts
 * turns off; one constant, since nobody reads it.
 */
const DROPPED = new Error('stream dropped: the client stopped reading');

export interface SseSinkOptions {
  encoder: ChunkEncoder;
  /** Frames that may wait in the sink for a client that is behind; past it the run loop waits. */
  bufferBytesMax: number;
  /** The actor's signal: an abort wakes a run loop waiting on this sink. */
  signal: RunSignal;
  /** The client went away (the response was cancelled). */
  onCancel: () => void;
  /**
   * The run is over: its connection goes back to idling under the read deadline, or, after a
   * stopped run (`stopped`), under the shortest idle time Bun has (a client that stopped reading
   * before its socket filled up cannot be told from one that keeps up, so that timer is what closes
   * it).
   */
  onEnd?: (stopped: boolean) => void;
  /**
   * When the stream's time is up (Date.now() ms, stream_timeout_ms after its start): a client still
   * taking the last frames of a completed run by then is dropped, so the stream's time limit holds
   * for its delivery too, whatever the connection's idle timer does (measured: Bun's closes a
   * connection whose client stopped reading once its read deadline passes, but that is Bun's, not
   * ours to rely on).
   */
  deadlineMs: number;
  /**
   * Streams whose run has ended but whose client has not taken all of it yet, by request id:
   * shutdown drops them.
   */
  ending: IdMap<{ drop(): void }>;
  /** The request's id: the stream's key in `ending`. */
  id: string;
}

/**
 * Relays a stream as SSE. `opened` resolves when the first output is ready (then the caller answers
 * 200 with `body`), or with the error when the run failed before any output (then a plain error
 * reply).
 *
 * The body is a direct stream: the frames of a turn are gathered and handed to the response at the
 * next turn in one write (see `gather`: an upstream's events come one read, one frame, at a time,
 * and a send per frame was a third of a stream's CPU). While the socket
 * is backpressured the frames wait here instead, and once `bufferBytesMax` of them wait the run
 * loop waits too, which pauses the upstream: what a slow reader costs is bounded. A stopped run
 * (cancel, a time limit, shutdown) wakes that wait at once and ends with its error event; a client
 * still behind STOPPED_DRAIN_MS_MAX later is dropped rather than left holding its descriptor and
 * buffers for a reader that may never come back.
 */
export class SseSink implements ChatSink {
  readonly opened = Promise.withResolvers<GatewayError | null>();
  readonly body: ReadableStream<Uint8Array>;
  private readonly encoder: ChunkEncoder;
  private readonly bufferBytesMax: number;
  private readonly signal: RunSignal;
  private readonly onCancel: () => void;
  private readonly onEnd: ((stopped: boolean) => void) | undefined;
  private readonly deadlineMs: number;
  private readonly ending: IdMap<{ drop(): void }>;
  private readonly id: string;
  /** Set when Bun starts sending the body (its first pull). */
  private controller: DirectController | null = null;
  /**
   * Frames not handed to the response yet: before its first pull, and while the client is behind.
   */
  private readonly pending: string[] = [];
  /** Characters in `pending` (frames are mostly ASCII JSON, so this stands for their bytes). */
  private pendingChars = 0;
  /**
   * Bytes of the last write Bun took while its socket was backpressured (0 once it drains): they
   * may still wait in its buffer, so they count against `bufferBytesMax` with `pending`.
   */
  private unsentBytes = 0;
  /** The client is behind: a write is waiting for the socket to drain. */
  private draining = false;
  /** The run loop waiting for room. */
  private wake: (() => void) | null = null;
  private started = false;
  /** In `gathering`: its frames go out at the next turn (see `gather`). */
  private gathered = false;
  /** The run is over: the last frames are in `pending` or handed over. */
  private ended = false;
  /** The response is closed, dropped or cancelled: nothing more is written. */
  private closed = false;
  /**
   * A stopped run's error event is waiting for a client that is behind; past it the connection is
   * dropped.
   */
  private dropTimer: ReturnType<typeof setTimeout> | undefined;
  private readonly drained = (): void => {
    this.draining = false;
    this.unsentBytes = 0;
    if (this.closed || this.controller === null) return;
    this.handPending(this.controller);
  };

  constructor(options: SseSinkOptions) {
    this.encoder = options.encoder;
    this.bufferBytesMax = options.bufferBytesMax;
    this.signal = options.signal;
    this.onCancel = options.onCancel;
    this.onEnd = options.onEnd;
    this.deadlineMs = options.deadlineMs;
    this.ending = options.ending;
    this.id = options.id;
    this.signal.addEventListener('abort', this);
    this.body = new ReadableStream<Uint8Array>({
      type: 'direct',
      pull: (controller) => this.attach(controller),
      cancel: () => {
        this.closed = true;
        // A client that left after the run ended: nothing is left to drop (drop() returns early
        // once closed), so the sink leaves the ending set now or it would stay until shutdown.
        clearTimeout(this.dropTimer);
        this.ending.delete(this.id);
        this.pending.length = 0;
        this.pendingChars = 0;
        this.resume();
        this.onCancel();
      },
    });
  }

  /**
   * The actor aborted: a run loop waiting for room must see it now (an event listener object, no
   * closure).
   */
  handleEvent(): void {
    this.resume();
  }

  private resume(): void {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }

  /**
   * Bun's pull: the response starts sending the body. Bun.serve pulls once; a JS reader (app.handle
   * in tests) pulls again per read, with the same controller.
   */
  attach(controller: DirectController): void {
    if (this.controller !== null) return;
    this.controller = controller;
    if (this.closed) {
      controller.close(DROPPED);
      return;
    }
    this.handPending(controller);
  }

  /**
   * Hands what waits to the response, closes it after the last frames, and lets the run loop go on
   * if there is room.
   */
  private handPending(controller: DirectController): void {
    if (this.pendingChars > 0) {
      // One write of all that waits, joined once (appending frame by frame to one string makes a
      // rope of thousands of nodes: measured 4 MB of heap for 1 MiB waiting).
      const text = this.pending.length === 1 ? this.pending[0]! : this.pending.join('');
      this.pending.length = 0;
      this.pendingChars = 0;
      this.hand(controller, text);
    }
    if (this.draining) {
      if (this.unsentBytes < this.bufferBytesMax) this.resume();
      return;
    }
    if (this.ended) {
      // Closed only once Bun has sent all of it: after close() the connection can no longer be
      // dropped, and a client that stops reading would keep it open. (A JS reader's controller,
      // app.handle in tests, answers flush with nothing: nothing to wait for.)
      const flushed: unknown = controller.flush(true);
      if (flushed instanceof Promise)
        flushed.then(
          () => this.finish(controller),
          () => this.finish(controller),
        );
      else this.finish(controller);
      return;
    }
    this.resume();
  }

  /** Everything was sent: the response ends normally. */
  private finish(controller: DirectController): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.dropTimer);
    this.ending.delete(this.id);
    controller.close();
  }

  private hand(controller: DirectController, text: string): void {
    const written = controller.write(text);
    if (typeof written === 'number') return;
    this.draining = true;
    this.unsentBytes = text.length;
    written.then(this.drained, this.drained);
  }

  /** The next turn came (see `gather`): what was gathered goes out. */
  flushGathered(): void {
    this.gathered = false;
    this.handGathered();
  }

  /** The frames gathered so far, in one write (unless the client is behind: drained sends them). */
  private handGathered(): void {
    const controller = this.controller;
    if (controller === null || this.draining || this.closed || this.pendingChars === 0) return;
    const text = this.pending.length === 1 ? this.pending[0]! : this.pending.join('');
    this.pending.length = 0;
    this.pendingChars = 0;
    this.hand(controller, text);
  }

  private write(frame: string): void | Promise<void> {
    if (this.closed) return;
    this.pending.push(frame);
    this.pendingChars += frame.length;
    if (this.controller !== null && !this.draining) {
      if (this.pendingChars < this.bufferBytesMax) {
        if (!this.gathered) {
          this.gathered = true;
          gather(this);
        }
        return;
      }
      // Gathered up to the buffer's bound: out now; if the socket cannot take it all, the run loop
      // waits below as for any client that is behind.
      this.handGathered();
      if (!this.draining) return;
    }
    // Frames are mostly ASCII JSON, so their length stands for their bytes here. An aborted run
    // stops at its next check; it must not wait for a reader.
    if (this.pendingChars + this.unsentBytes < this.bufferBytesMax || this.signal.aborted) return;
    return new Promise<void>((resolve) => (this.wake = resolve));
  }

  begin(): void | Promise<void> {
    this.started = true;
    this.opened.resolve(null);
    return this.write(this.encoder.role());
  }

  text(text: string): void | Promise<void> {
    return this.write(this.encoder.text(text));
  }

  toolCall(
    index: number,
    id: string | null,
    name: string | null,
    args: string,
  ): void | Promise<void> {
    return this.write(this.encoder.toolCall(index, id, name, args));
  }

  end(result: ChatResult): void {
    this.signal.removeEventListener('abort', this);
    if (!this.started) {
      this.opened.resolve(result.ok ? null : result.error);
      if (!result.ok) return;
    }
    if (this.closed) return;
    this.ended = true;
    this.onEnd?.(!result.ok);
    // Completed: the last frames follow whatever waits, for a client that reads slowly, until the
    // stream's time is up. Stopped: its error event, for STOPPED_DRAIN_MS_MAX (the stop must free
    // everything within the contract's 1 s). Either way a client that has stopped reading is
    // dropped.
    const last = result.ok
      ? this.encoder.finish(result.value.finishReason) +
        this.encoder.usage(result.value.usage) +
        DONE_FRAME
      : errorFrame(result.error);
    this.pending.push(last);
    this.pendingChars += last.length;
    const controller = this.controller;
    if (controller !== null && !this.draining) this.handPending(controller);
    if (this.gathered && this.pendingChars === 0) {
      this.gathered = false;
      ungather(this);
    }
    if (this.closed) return;
    this.ending.set(this.id, this);
    const drainMs = result.ok
      ? Math.max(STOPPED_DRAIN_MS_MAX, this.deadlineMs - Date.now())
      : STOPPED_DRAIN_MS_MAX;
    this.dropTimer = setTimeout(dropBehind, drainMs, this);
  }

  /** Aborts the response: Bun resets the connection, whatever waits in its buffers. */
  drop(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.gathered) {
      this.gathered = false;
      ungather(this);
    }
    clearTimeout(this.dropTimer);
    this.ending.delete(this.id);
    this.pending.length = 0;
    this.pendingChars = 0;
    this.controller?.close(DROPPED);
  }
}

/**
 * Sinks with frames waiting for the next turn. An upstream sends a stream's events one read at a
 * time, and Bun writes what a response was handed once per turn; frames handed at the next turn
 * instead (after the event loop polled again) join those that came meanwhile: fewer sends to the
 * client, each frame later by at most one turn.
 */
let gathering: SseSink[] = [];
let spare: SseSink[] = [];

function gather(sink: SseSink): void {
  if (gathering.length === 0) setImmediate(flushAll);
  gathering.push(sink);
}

/** A sink that ended or was dropped leaves the list now, not a turn later (nothing holds it). */
function ungather(sink: SseSink): void {
  const at = gathering.indexOf(sink);
  if (at === -1) return;
  gathering[at] = gathering[gathering.length - 1]!;
  gathering.pop();
}

function flushAll(): void {
  const sinks = gathering;
  gathering = spare;
  for (const sink of sinks) sink.flushGathered();
  sinks.length = 0;
  spare = sinks;
}

/** A timer's callback (the sink is passed in): no closure per stream. */
function dropBehind(sink: SseSink): void {
  sink.drop();
}
