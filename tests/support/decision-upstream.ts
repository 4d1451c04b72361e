// A fake OpenAI-compatible upstream for decision prompts: a script decides each reply; calls and
// aborts are seen.

/** One reply of the fake upstream to one Chat Completions call. */
export type UpstreamReply =
  /** A submit_decision tool call whose arguments the test controls (an object is JSON-encoded). */
  | {
      kind: 'tool';
      arguments: string | Record<string, unknown>;
      usage?: UpstreamUsage | null;
      format?: 'json' | 'sse';
      name?: string;
    }
  /** A plain text answer. */
  | { kind: 'text'; content: string; usage?: UpstreamUsage | null; format?: 'json' | 'sse' }
  /** An HTTP error status with an OpenAI-style error body. */
  | { kind: 'status'; status: number }
  /** Never answers, until the caller goes away. */
  | { kind: 'hang' }
  /** Waits for `until`, then replies with `then`. */
  | { kind: 'wait'; until: Promise<unknown>; then: UpstreamReply };

export interface UpstreamUsage {
  prompt_tokens: number;
  completion_tokens: number;
}

export interface UpstreamCall {
  index: number;
  body: any;
}

export interface DecisionUpstream {
  url: string;
  /** Calls received so far. */
  calls: number;
  /** The JSON bodies received, in order. */
  bodies: any[];
  aborts: number;
  /** Resolves at the next call; replaced after each. */
  nextCall: PromiseWithResolvers<void>;
  /** Resolves at the next abort the upstream sees; replaced after each. */
  nextAbort: PromiseWithResolvers<void>;
  /** Decides the reply to each call; tests may replace it at any time. */
  script: (call: UpstreamCall) => UpstreamReply;
  stop(): void;
}

export const DEFAULT_USAGE: UpstreamUsage = { prompt_tokens: 300, completion_tokens: 20 };

/**
 * Valid submit_decision arguments for the request the gateway sent: the first label of every choice
 * question and the highest level of every score question, read from the tool's JSON Schema.
 */
export function validArguments(body: any): Record<string, unknown> {
  const properties = body?.tools?.[0]?.function?.parameters?.properties ?? {};
  const args: Record<string, unknown> = {};
  for (const [id, schema] of Object.entries<any>(properties)) {
    args[id] = Array.isArray(schema.enum) ? schema.enum[0] : schema.maximum;
  }
  return args;
}

/** Answers every call with valid arguments (SSE, with usage). */
export const answerValidly = (call: UpstreamCall): UpstreamReply => ({
  kind: 'tool',
  arguments: validArguments(call.body),
  usage: DEFAULT_USAGE,
});

const encoder = new TextEncoder();

function completion(reply: Extract<UpstreamReply, { kind: 'tool' | 'text' }>): Response {
  const usage = reply.usage === undefined ? DEFAULT_USAGE : reply.usage;
  const usageBlock =
    usage === null
      ? undefined
      : { ...usage, total_tokens: usage.prompt_tokens + usage.completion_tokens };
  const args =
    reply.kind === 'tool'
      ? typeof reply.arguments === 'string'
        ? reply.arguments
        : JSON.stringify(reply.arguments)
      : '';
  const toolCall = {
    id: 'call_fake_1',
    type: 'function',
    function: {
      name: reply.kind === 'tool' ? (reply.name ?? 'submit_decision') : '',
      arguments: args,
    },
  };
  if ((reply.format ?? 'sse') === 'json') {
    const message =
      reply.kind === 'tool'
        ? { role: 'assistant', content: null, tool_calls: [toolCall] }
        : { role: 'assistant', content: reply.content };
    return Response.json({
      id: 'up-1',
      object: 'chat.completion',
      created: 0,
      model: 'up',
      choices: [
        { index: 0, message, finish_reason: reply.kind === 'tool' ? 'tool_calls' : 'stop' },
      ],
      ...(usageBlock ? { usage: usageBlock } : {}),
    });
  }
  const frame = (choices: unknown[], extra: Record<string, unknown> = {}) =>
    encoder.encode(
      `data: ${JSON.stringify({
        id: 'up-1',
        object: 'chat.completion.chunk',
        created: 0,
        model: 'up',
        choices,
        ...extra,
      })}\n\n`,
    );
  const frames: Uint8Array[] = [
    frame([{ index: 0, delta: { role: 'assistant' }, finish_reason: null }]),
  ];
  if (reply.kind === 'tool') {
    // The arguments arrive in two pieces, as real servers split them.
    const half = Math.floor(args.length / 2);
    frames.push(
      frame([
        {
          index: 0,
          delta: {
            tool_calls: [
              {
                index: 0,
                ...toolCall,
                function: { name: toolCall.function.name, arguments: args.slice(0, half) },
              },
            ],
          },
          finish_reason: null,
        },
      ]),
    );
    frames.push(
      frame([
        {
          index: 0,
          delta: { tool_calls: [{ index: 0, function: { arguments: args.slice(half) } }] },
          finish_reason: null,
        },
      ]),
    );
    frames.push(frame([{ index: 0, delta: {}, finish_reason: 'tool_calls' }]));
  } else {
    frames.push(frame([{ index: 0, delta: { content: reply.content }, finish_reason: null }]));
    frames.push(frame([{ index: 0, delta: {}, finish_reason: 'stop' }]));
  }
  if (usageBlock) frames.push(frame([], { usage: usageBlock }));
  frames.push(encoder.encode('data: [DONE]\n\n'));
  return new Response(new Blob(frames), { headers: { 'content-type': 'text/event-stream' } });
}

async function render(reply: UpstreamReply): Promise<Response> {
  switch (reply.kind) {
    case 'status':
      return Response.json(
        { error: { message: 'fake upstream failure', type: 'server_error', code: 'fake_failure' } },
        { status: reply.status },
      );
    case 'hang':
      return new Promise<Response>(() => {});
    case 'wait':
      await reply.until;
      return render(reply.then);
    default:
      return completion(reply);
  }
}

export function startDecisionUpstream(
  script: (call: UpstreamCall) => UpstreamReply = answerValidly,
): DecisionUpstream {
  const state: DecisionUpstream = {
    url: '',
    calls: 0,
    bodies: [],
    aborts: 0,
    nextCall: Promise.withResolvers<void>(),
    nextAbort: Promise.withResolvers<void>(),
    script,
    stop: () => server.stop(true),
  };
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    idleTimeout: 0,
    async fetch(request) {
      const index = state.calls++;
      request.signal.addEventListener('abort', () => {
        state.aborts++;
        state.nextAbort.resolve();
        state.nextAbort = Promise.withResolvers<void>();
      });
      const body = await request.json();
      state.bodies.push(body);
      const reply = state.script({ index, body });
      state.nextCall.resolve();
      state.nextCall = Promise.withResolvers<void>();
      return render(reply);
    },
  });
  state.url = `http://127.0.0.1:${server.port}/v1`;
  return state;
}

/** Gateway config overrides that put model_03 (decision-fast) on `base_url`. */
export function decisionUpstreamOverrides(
  baseUrl: string,
  extra: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    providers: { fake: { type: 'openai', base_url: baseUrl, timeout_ms: 5_000 } },
    models: { model_03: { provider: 'fake', upstream_model: 'up' } },
    ...extra,
  };
}

/** The base URL of a port that was just open and is now closed: nothing listens there. */
export function closedPortUrl(): string {
  const server = Bun.serve({ port: 0, hostname: '127.0.0.1', fetch: () => new Response('') });
  const port = server.port;
  server.stop(true);
  return `http://127.0.0.1:${port}/v1`;
}
