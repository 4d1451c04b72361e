// A fake OpenAI-compatible upstream for tests: counts calls, sees aborts, fails on demand.
// 'gated' answers like 'ok' once `gate` is resolved: a test decides when upstream calls finish.
export type UpstreamMode = 'ok' | 'gated' | 'endless' | 'error500' | 'hang';

export interface FakeUpstream {
  url: string;
  mode: UpstreamMode;
  calls: number;
  aborts: number;
  /** Resolves at the next upstream request; replaced after each. */
  nextCall: PromiseWithResolvers<void>;
  /** Resolves at the next abort seen by the upstream; replaced after each. */
  nextAbort: PromiseWithResolvers<void>;
  /** Holds every 'gated' answer until resolved. */
  gate: PromiseWithResolvers<void>;
  stop(): void;
}

const encoder = new TextEncoder();

function chunk(content: string, finish: string | null = null): Uint8Array {
  const body = {
    id: 'up-1',
    object: 'chat.completion.chunk',
    created: 0,
    model: 'up',
    choices: [{ index: 0, delta: { content }, finish_reason: finish }],
  };
  return encoder.encode(`data: ${JSON.stringify(body)}\n\n`);
}

export function startFakeUpstream(mode: UpstreamMode = 'ok'): FakeUpstream {
  const state: FakeUpstream = {
    url: '',
    mode,
    calls: 0,
    aborts: 0,
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
      state.calls++;
      state.nextCall.resolve();
      state.nextCall = Promise.withResolvers<void>();
      request.signal.addEventListener('abort', () => {
        state.aborts++;
        state.nextAbort.resolve();
        state.nextAbort = Promise.withResolvers<void>();
      });
      await request.json();
      if (state.mode === 'gated') await state.gate.promise;
      switch (state.mode) {
        case 'error500':
          return Response.json(
            { error: { message: 'boom', type: 'server_error' } },
            { status: 500 },
          );
        case 'hang':
          return new Promise<Response>(() => {});
        case 'endless': {
          let timer: ReturnType<typeof setInterval>;
          const stream = new ReadableStream<Uint8Array>({
            start(controller) {
              controller.enqueue(chunk('first '));
              // A provider that keeps talking until it is told to stop.
              timer = setInterval(() => controller.enqueue(chunk('more ')), 5);
            },
            cancel() {
              clearInterval(timer);
            },
          });
          request.signal.addEventListener('abort', () => clearInterval(timer));
          return new Response(stream, { headers: { 'content-type': 'text/event-stream' } });
        }
        case 'gated':
        case 'ok': {
          const frames = [chunk('Hello'), chunk(' there'), chunk('', 'stop')];
          const usage = {
            id: 'up-1',
            object: 'chat.completion.chunk',
            created: 0,
            model: 'up',
            choices: [],
            usage: { prompt_tokens: 11, completion_tokens: 2, total_tokens: 13 },
          };
          frames.push(encoder.encode(`data: ${JSON.stringify(usage)}\n\ndata: [DONE]\n\n`));
          return new Response(new Blob(frames), {
            headers: { 'content-type': 'text/event-stream' },
          });
        }
      }
    },
  });
  state.url = `http://127.0.0.1:${server.port}/v1`;
  return state;
}

/** Gateway config overrides that put model_03 on the fake upstream. */
export function upstreamOverrides(
  upstream: FakeUpstream,
  extra: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    providers: { fake: { type: 'openai', base_url: upstream.url, timeout_ms: 5_000 } },
    models: { model_03: { provider: 'fake', upstream_model: 'up' } },
    ...extra,
  };
}
