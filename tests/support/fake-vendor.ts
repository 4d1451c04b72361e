// What the fake Anthropic and Gemini upstreams share: modes, fixtures, counters, the request log.
// Each vendor file owns its wire format; this one owns the server, the counting and the pacing.

/**
 * How a fake vendor answers. `text` and `tools` are well-formed answers; `gated` is `text` held
 * until `gate` resolves; `error*` fail before the first byte with the vendor's own error JSON
 * (`error529` is Anthropic's "overloaded", Gemini's 503 UNAVAILABLE); `garbage` is a 200 whose body
 * (or first stream event) is not JSON; `hang` never answers; `endless` streams text until the
 * client goes away; `midstream_error` streams one piece of text, then the vendor's mid-stream
 * failure. `endless` and `midstream_error` answer with a stream even when none was asked for.
 */
export type VendorMode =
  | 'text'
  | 'tools'
  | 'gated'
  | 'error429'
  | 'error500'
  | 'error529'
  | 'error400'
  | 'garbage'
  | 'hang'
  | 'endless'
  | 'midstream_error';

export interface VendorRequest {
  /** Path and query as received, e.g. `/v1beta/models/m:streamGenerateContent?alt=sse`. */
  path: string;
  /** Lower-cased names. */
  headers: Record<string, string>;
  /** The parsed JSON body, or the raw text when it was not JSON. */
  body: any;
}

export interface FakeVendor {
  /** The base_url for a gateway provider config: origin plus the API's version prefix. */
  url: string;
  /** `http://127.0.0.1:<port>`, the base URL the vendors' SDKs take. */
  origin: string;
  /** Read at each request: a test may switch it between calls. */
  mode: VendorMode;
  calls: number;
  aborts: number;
  /** The last MAX_RECORDED_REQUESTS requests, oldest first. */
  requests: VendorRequest[];
  /** Resolves at the next request; replaced after each. */
  nextCall: PromiseWithResolvers<void>;
  /** Resolves at the next abort seen by the fake; replaced after each. */
  nextAbort: PromiseWithResolvers<void>;
  /** Holds every 'gated' answer until resolved. */
  gate: PromiseWithResolvers<void>;
  stop(): void;
}

export const MAX_RECORDED_REQUESTS = 100;
/** The fake prompt in every `error400` message: a test checks it never reaches a client. */
export const SECRET_PROMPT = 'SECRET-PROMPT';
export const ANSWER_TEXT = 'Hello there';
/** The arguments of every tool call the fakes make. */
export const TOOL_INPUT = { location: 'Paris', unit: 'celsius' } as const;

/**
 * The input a model gives the tool whose JSON Schema is `schema`: nothing (`{}`) to a tool declared
 * without properties (`schema` null when it has no schema), else TOOL_INPUT (`undefined`: no tool
 * declared, the fallback tool).
 */
export function toolInputFor(schema: unknown): Record<string, unknown> {
  if (schema === undefined) return TOOL_INPUT;
  const properties = (schema as { properties?: unknown } | null)?.properties;
  const declares = typeof properties === 'object' && properties !== null;
  return declares && Object.keys(properties).length > 0 ? TOOL_INPUT : {};
}
/** The tool name used when the request declares none. */
export const FALLBACK_TOOL = 'get_weather';
/** Cadence of `endless` text. */
export const STREAM_TICK_MS = 5;
/**
 * Pause between the text and the failure of `midstream_error`, so that the failure arrives in its
 * own read, after the client has seen the text (as a real mid-generation failure does).
 */
export const MIDSTREAM_PAUSE_MS = 20;

export const encoder = new TextEncoder();

type Handle = (request: Request, url: URL, body: any, fake: FakeVendor) => Promise<Response>;

/** A Bun server on a free port that counts, logs and gates requests, then lets `handle` answer. */
export function startFakeVendor(mode: VendorMode, prefix: string, handle: Handle): FakeVendor {
  const fake: FakeVendor = {
    url: '',
    origin: '',
    mode,
    calls: 0,
    aborts: 0,
    requests: [],
    nextCall: Promise.withResolvers<void>(),
    nextAbort: Promise.withResolvers<void>(),
    gate: Promise.withResolvers<void>(),
    stop: () => server.stop(true),
  };
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    async fetch(request) {
      fake.calls++;
      fake.nextCall.resolve();
      fake.nextCall = Promise.withResolvers<void>();
      request.signal.addEventListener('abort', () => {
        fake.aborts++;
        fake.nextAbort.resolve();
        fake.nextAbort = Promise.withResolvers<void>();
      });
      const url = new URL(request.url);
      const text = await request.text();
      const headers: Record<string, string> = {};
      request.headers.forEach((value, key) => {
        headers[key.toLowerCase()] = value;
      });
      const body = parseJson(text);
      fake.requests.push({ path: url.pathname + url.search, headers, body });
      if (fake.requests.length > MAX_RECORDED_REQUESTS) fake.requests.shift();
      if (fake.mode === 'gated') await fake.gate.promise;
      return handle(request, url, body, fake);
    },
  });
  fake.origin = `http://127.0.0.1:${server.port}`;
  fake.url = fake.origin + prefix;
  return fake;
}

function parseJson(text: string): any {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** A response that never comes: the fake holds the request until the client gives up. */
export function never(): Promise<Response> {
  return new Promise<Response>(() => {});
}

/**
 * A stream that sends `head` at once, then one `tick()` frame every `everyMs` until a tick says
 * `done` or the client goes away (the timer is cleared on abort and on cancel).
 */
export function pacedStream(
  signal: AbortSignal,
  head: string[],
  everyMs: number,
  tick: () => { frame: string; done: boolean },
): ReadableStream<Uint8Array> {
  let timer: ReturnType<typeof setInterval> | undefined;
  const stopTicking = () => clearInterval(timer);
  signal.addEventListener('abort', stopTicking);
  return new ReadableStream<Uint8Array>({
    start(controller) {
      for (const frame of head) controller.enqueue(encoder.encode(frame));
      timer = setInterval(() => {
        const next = tick();
        controller.enqueue(encoder.encode(next.frame));
        if (next.done) {
          stopTicking();
          controller.close();
        }
      }, everyMs);
    },
    cancel: stopTicking,
  });
}
