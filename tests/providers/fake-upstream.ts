// Fake OpenAI-compatible upstreams for provider tests: a simulator behind Chat Completions, and raw
// servers.
import { countPromptTokens, countTextTokensYielding } from '../../src/billing/tokens.ts';
import type { SimulatorProviderConfig } from '../../src/config/model.ts';
import type { ProviderRequest } from '../../src/providers/provider.ts';
import { SimulatorProvider } from '../../src/providers/simulator/index.ts';

export interface RecordedRequest {
  method: string;
  path: string;
  headers: Record<string, string>;
  body: Record<string, unknown>;
  /** Resolves when the client goes away before the answer ends (Bun aborts `req.signal`). */
  aborted: Promise<void>;
}

export interface FakeUpstream {
  /** A base_url as an operator writes it: `http://127.0.0.1:<port>/v1`. */
  baseUrl: string;
  requests: RecordedRequest[];
  /** Resolves with the first request the server receives. */
  firstRequest: Promise<RecordedRequest>;
  stop(): void;
}

export interface SimulatorUpstreamOptions {
  /** Send the trailing usage chunk when asked for it (true), or never (false). */
  usage?: boolean;
  /**
   * Answer with one chat.completion JSON object even when asked to stream, as a server that ignores
   * `stream` does.
   */
  json?: boolean;
}

type Handler = (req: Request, recorded: RecordedRequest) => Response | Promise<Response>;

/** A server on port 0 that records every request and answers with `handler`. */
export function startUpstream(handler: Handler): FakeUpstream {
  const requests: RecordedRequest[] = [];
  const first = Promise.withResolvers<RecordedRequest>();
  const server = Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    async fetch(req) {
      const aborted = Promise.withResolvers<void>();
      req.signal.addEventListener('abort', () => aborted.resolve(), { once: true });
      const text = await req.text();
      const headers: Record<string, string> = {};
      req.headers.forEach((value, key) => {
        headers[key] = value;
      });
      const recorded: RecordedRequest = {
        method: req.method,
        path: new URL(req.url).pathname,
        headers,
        body: text.length > 0 ? (JSON.parse(text) as Record<string, unknown>) : {},
        aborted: aborted.promise,
      };
      requests.push(recorded);
      first.resolve(recorded);
      return handler(req, recorded);
    },
  });
  return {
    baseUrl: `http://127.0.0.1:${server.port}/v1`,
    requests,
    firstRequest: first.promise,
    stop: () => server.stop(true),
  };
}

/** The request an OpenAI body describes, as the gateway would hand it to a provider. */
export function providerRequestFromBody(body: Record<string, unknown>): ProviderRequest {
  const messages = body.messages as ProviderRequest['messages'];
  const tools = (body.tools as ProviderRequest['tools']) ?? null;
  return {
    model: body.model as string,
    messages,
    maxOutputTokens: (body.max_completion_tokens as number | undefined) ?? null,
    temperature: (body.temperature as number | undefined) ?? null,
    topP: (body.top_p as number | undefined) ?? null,
    topK: (body.top_k as number | undefined) ?? null,
    seed: (body.seed as number | undefined) ?? null,
    stop: (body.stop as string[] | undefined) ?? null,
    tools,
    toolChoice: (body.tool_choice as ProviderRequest['toolChoice'] | undefined) ?? null,
    promptTokens: countPromptTokens(messages, tools),
    stream: body.stream === true,
  };
}

/** An OpenAI-compatible server whose answers come from a SimulatorProvider, so both agree. */
export function startSimulatorUpstream(
  config: SimulatorProviderConfig,
  options: SimulatorUpstreamOptions = {},
): FakeUpstream {
  const simulator = new SimulatorProvider('upstream-simulator', config, countTextTokensYielding);
  return startUpstream((req, recorded) => {
    const request = providerRequestFromBody(recorded.body);
    const wantsUsage =
      options.usage !== false &&
      (recorded.body.stream_options as { include_usage?: boolean })?.include_usage === true;
    // Like OpenAI: an event stream only when asked for one.
    if (options.json || request.stream !== true)
      return jsonAnswer(simulator, request, req.signal, options.usage !== false);
    return sseAnswer(simulator, request, req.signal, wantsUsage);
  });
}

const encoder = new TextEncoder();
const CHUNK_BASE = {
  id: 'chatcmpl-fake',
  object: 'chat.completion.chunk',
  created: 1,
  model: 'fake',
};

function sseAnswer(
  simulator: SimulatorProvider,
  request: ProviderRequest,
  signal: AbortSignal,
  wantsUsage: boolean,
): Response {
  const deltas = simulator.stream(request, signal)[Symbol.asyncIterator]();
  let sentRole = false;
  const event = (payload: unknown) => encoder.encode(`data: ${JSON.stringify(payload)}\n\n`);
  const choice = (delta: Record<string, unknown>, finishReason: string | null = null) => ({
    ...CHUNK_BASE,
    choices: [{ index: 0, delta, finish_reason: finishReason }],
  });
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      const { value, done } = await deltas.next();
      if (done) {
        controller.enqueue(encoder.encode('data: [DONE]\n\n'));
        controller.close();
        return;
      }
      const role = sentRole ? {} : { role: 'assistant' };
      sentRole = true;
      if (value.type === 'text')
        controller.enqueue(event(choice({ ...role, content: value.text })));
      else if (value.type === 'tool_call') {
        const call: Record<string, unknown> = {
          index: value.index,
          function: { arguments: value.arguments },
        };
        if (value.id !== null)
          Object.assign(call, {
            id: value.id,
            type: 'function',
            function: { name: value.name, arguments: value.arguments },
          });
        controller.enqueue(event(choice({ ...role, tool_calls: [call] })));
      } else {
        controller.enqueue(event(choice(role, value.reason)));
        if (wantsUsage && value.usage) {
          // The simulator reports both counts.
          const completion = value.usage.completionTokens!;
          const usage = {
            prompt_tokens: value.usage.promptTokens,
            completion_tokens: completion,
            total_tokens: value.usage.promptTokens + completion,
          };
          controller.enqueue(event({ ...CHUNK_BASE, choices: [], usage }));
        }
      }
    },
    async cancel() {
      await deltas.return?.();
    },
  });
  return new Response(body, { headers: { 'content-type': 'text/event-stream' } });
}

async function jsonAnswer(
  simulator: SimulatorProvider,
  request: ProviderRequest,
  signal: AbortSignal,
  withUsage: boolean,
): Promise<Response> {
  let content = '';
  const toolCalls: {
    id: string;
    type: 'function';
    function: { name: string; arguments: string };
  }[] = [];
  let finishReason = 'stop';
  let usage: Record<string, number> | undefined;
  for await (const delta of simulator.stream(request, signal)) {
    if (delta.type === 'text') content += delta.text;
    else if (delta.type === 'tool_call') {
      if (delta.id !== null)
        toolCalls.push({
          id: delta.id,
          type: 'function',
          function: { name: delta.name!, arguments: '' },
        });
      toolCalls[delta.index]!.function.arguments += delta.arguments;
    } else {
      finishReason = delta.reason;
      if (delta.usage)
        usage = {
          prompt_tokens: delta.usage.promptTokens,
          completion_tokens: delta.usage.completionTokens!,
        };
    }
  }
  const message =
    toolCalls.length > 0
      ? { role: 'assistant', content: null, tool_calls: toolCalls }
      : { role: 'assistant', content };
  const completion = {
    id: 'chatcmpl-fake',
    object: 'chat.completion',
    created: 1,
    model: 'fake',
    choices: [{ index: 0, message, finish_reason: finishReason }],
    ...(withUsage && usage ? { usage } : {}),
  };
  return Response.json(completion);
}

/** SSE bytes as a streamed body, written as given (each string one write). */
export function sseResponse(parts: string[], status = 200): Response {
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (const part of parts) controller.enqueue(encoder.encode(part));
      controller.close();
    },
  });
  return new Response(body, { status, headers: { 'content-type': 'text/event-stream' } });
}

/**
 * A raw TCP server that answers every request with `head` (status line, headers, maybe the start of
 * a body), then stays silent. Bun.serve cannot do this: it holds back the headers of a streamed
 * body until the first chunk.
 */
export function startHeadersOnlyServer(
  head = 'HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n',
): { baseUrl: string; received: Promise<void>; closed: Promise<void>; stop(): void } {
  const received = Promise.withResolvers<void>();
  const closed = Promise.withResolvers<void>();
  const server = Bun.listen({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      data(socket) {
        socket.write(head);
        received.resolve();
      },
      close() {
        closed.resolve();
      },
    },
  });
  return {
    baseUrl: `http://127.0.0.1:${server.port}/v1`,
    received: received.promise,
    closed: closed.promise,
    stop: () => server.stop(true),
  };
}
