// The provider contract, run against every adapter, plus the OpenAI adapter's failure mapping.
import { afterEach, describe, expect, test } from 'bun:test';
import { join } from 'node:path';
import {
  countPromptTokens,
  countTextTokens,
  countTextTokensYielding,
} from '../../src/billing/tokens.ts';
import { defaultConfig } from '../../src/config/defaults.ts';
import type { OpenAIProviderConfig, SimulatorProviderConfig } from '../../src/config/model.ts';
import { OpenAIProvider, type OpenAIProviderOptions } from '../../src/providers/openai/index.ts';
import type {
  Delta,
  Provider,
  ProviderMessage,
  ProviderRequest,
  ToolDefinition,
} from '../../src/providers/provider.ts';
import { SimulatorProvider } from '../../src/providers/simulator/index.ts';
import { GatewayError } from '../../src/util/errors.ts';
import { createLogger } from '../../src/util/log.ts';
import {
  type FakeUpstream,
  sseResponse,
  startHeadersOnlyServer,
  startSimulatorUpstream,
  startUpstream,
} from './fake-upstream.ts';

const logger = createLogger('silent');
/** The options the gateway gives an openai provider, with the default limits. */
const PROVIDER_OPTIONS: OpenAIProviderOptions = {
  defaultTimeoutMs: 5_000,
  bodyBytesMax: defaultConfig().limits.max_upstream_body_bytes,
  eventBytesMax: defaultConfig().limits.max_upstream_event_bytes,
  logger,
};
const FAST: SimulatorProviderConfig = {
  type: 'simulator',
  ttft_ms: 0,
  tokens_per_second: 100_000,
  completion_tokens: 24,
};
/** Slow enough to abort in the middle: 100 ms between tokens, longer than the 50 ms abort bound. */
const SLOW: SimulatorProviderConfig = {
  type: 'simulator',
  ttft_ms: 0,
  tokens_per_second: 10,
  completion_tokens: 100,
};
const ABORT_MS_MAX = 50;

const weatherParameters = {
  type: 'object',
  properties: {
    city: { type: 'string', enum: ['paris', 'tokyo', 'lima'] },
    days: { type: 'integer', minimum: 1, maximum: 7 },
    metric: { type: 'boolean' },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const TOOLS: ToolDefinition[] = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather for a city',
      parameters: weatherParameters,
    },
  },
  {
    type: 'function',
    function: {
      name: 'book_table',
      parameters: {
        type: 'object',
        properties: {
          guests: { type: 'integer', minimum: 2, maximum: 4 },
          name: { type: 'string', minLength: 3, maxLength: 8 },
        },
        required: ['guests', 'name'],
      },
    },
  },
];

function makeRequest(overrides: Partial<ProviderRequest> = {}): ProviderRequest {
  const messages: ProviderMessage[] = overrides.messages ?? [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'Tell me something about rivers.' },
  ];
  const tools = overrides.tools ?? null;
  return {
    model: 'sim-model',
    maxOutputTokens: null,
    temperature: null,
    topP: null,
    topK: null,
    seed: 7,
    stop: null,
    toolChoice: null,
    stream: true,
    ...overrides,
    messages,
    tools,
    promptTokens: countPromptTokens(messages, tools),
  };
}

async function collect(
  provider: Provider,
  request: ProviderRequest,
  signal = new AbortController().signal,
): Promise<Delta[]> {
  const deltas: Delta[] = [];
  for await (const delta of provider.stream(request, signal)) deltas.push(delta);
  return deltas;
}

function textOf(deltas: Delta[]): string {
  let text = '';
  for (const delta of deltas) if (delta.type === 'text') text += delta.text;
  return text;
}

/**
 * The tool calls a delta list spells, checking the interface's rule on ids and names as it goes.
 */
function toolCallsOf(deltas: Delta[]): { id: string; name: string; arguments: string }[] {
  const calls: { id: string; name: string; arguments: string }[] = [];
  for (const delta of deltas) {
    if (delta.type !== 'tool_call') continue;
    if (delta.index === calls.length) {
      expect(delta.id).toEqual(expect.any(String));
      expect(delta.name).toEqual(expect.any(String));
      calls.push({ id: delta.id!, name: delta.name!, arguments: delta.arguments });
    } else {
      expect(delta.index).toBe(calls.length - 1);
      expect(delta.id).toBeNull();
      expect(delta.name).toBeNull();
      calls[delta.index]!.arguments += delta.arguments;
    }
  }
  return calls;
}

/** What the reference simulator answers: an adapter in front of it must relay exactly this. */
function referenceDeltas(
  config: SimulatorProviderConfig,
  request: ProviderRequest,
): Promise<Delta[]> {
  return collect(new SimulatorProvider('reference', config, countTextTokensYielding), request);
}

/** Resolves after pending I/O and timers callbacks had their turn; an ordering aid, not a sleep. */
function nextMacrotask(): Promise<void> {
  const { promise, resolve } = Promise.withResolvers<void>();
  setImmediate(resolve);
  return promise;
}

async function expectGatewayError(
  promise: Promise<unknown>,
  code: string,
  status: number,
): Promise<GatewayError> {
  const error = await promise.then(
    () => null,
    (caught: unknown) => caught,
  );
  expect(error).toBeInstanceOf(GatewayError);
  const gatewayError = error as GatewayError;
  expect({ code: gatewayError.code, status: gatewayError.status }).toEqual({
    code: code as GatewayError['code'],
    status: status as GatewayError['status'],
  });
  return gatewayError;
}

/**
 * Aborts `controller` with `reason` and expects `pending` to throw exactly it within ABORT_MS_MAX.
 */
async function expectPromptAbort(
  controller: AbortController,
  pending: Promise<unknown>,
  reason = new Error('cancelled by test'),
): Promise<void> {
  const abortedAtMs = performance.now();
  controller.abort(reason);
  const caught = await pending.then(
    () => null,
    (error: unknown) => error,
  );
  expect(performance.now() - abortedAtMs).toBeLessThan(ABORT_MS_MAX);
  expect(caught).toBe(reason);
}

interface ContractTarget {
  provider: Provider;
  /** The fake upstream behind the provider, when there is one. */
  upstream: FakeUpstream | null;
  close(): void;
}

type ContractFactory = (simulator: SimulatorProviderConfig) => ContractTarget;

/** The shared contract every provider must meet. */
function providerContract(name: string, factory: ContractFactory): void {
  describe(`provider contract: ${name}`, () => {
    const opened: ContractTarget[] = [];
    const open = (simulator: SimulatorProviderConfig = FAST): ContractTarget => {
      const target = factory(simulator);
      opened.push(target);
      return target;
    };
    afterEach(() => {
      for (const target of opened.splice(0)) target.close();
    });

    test('a text answer: text deltas, then finish stop with usage', async () => {
      const { provider } = open();
      const request = makeRequest();
      const deltas = await collect(provider, request);
      const text = textOf(deltas);
      expect(text).toBe(textOf(await referenceDeltas(FAST, request)));
      expect(countTextTokens(text)).toBe(24);
      expect(deltas.slice(0, -1).every((delta) => delta.type === 'text')).toBe(true);
      expect(deltas.at(-1)).toEqual({
        type: 'finish',
        reason: 'stop',
        usage: { promptTokens: request.promptTokens, completionTokens: 24 },
      });
    });

    test('the same request answers the same; another seed answers differently', async () => {
      const { provider } = open();
      const first = textOf(await collect(provider, makeRequest()));
      expect(textOf(await collect(provider, makeRequest()))).toBe(first);
      expect(textOf(await collect(provider, makeRequest({ seed: 8 })))).not.toBe(first);
    });

    test('a stream arrives as several deltas over time', async () => {
      // 40 tokens at 2000/s: the last is due 19.5 ms after the first, in ticks of at least 4 ms.
      const config: SimulatorProviderConfig = {
        type: 'simulator',
        ttft_ms: 0,
        tokens_per_second: 2_000,
        completion_tokens: 40,
      };
      const { provider } = open(config);
      const request = makeRequest();
      const arrivalsMs: number[] = [];
      const deltas: Delta[] = [];
      for await (const delta of provider.stream(request, new AbortController().signal)) {
        if (delta.type === 'text') arrivalsMs.push(performance.now());
        deltas.push(delta);
      }
      expect(arrivalsMs.length).toBeGreaterThanOrEqual(3);
      expect(arrivalsMs.at(-1)! - arrivalsMs[0]!).toBeGreaterThanOrEqual(15);
      expect(textOf(deltas)).toBe(textOf(await referenceDeltas(config, request)));
    });

    test(
      'tool_choice required calls the first tool ' + 'with arguments valid against its schema',
      async () => {
        const { provider } = open();
        const request = makeRequest({ tools: TOOLS, toolChoice: 'required' });
        const deltas = await collect(provider, request);
        const calls = toolCallsOf(deltas);
        expect(calls.length).toBe(1);
        const call = calls[0]!;
        expect(call.name).toBe('get_weather');
        expect(call.id.startsWith('call_')).toBe(true);
        const args = JSON.parse(call.arguments) as Record<string, unknown>;
        expect(Object.keys(args).every((key) => key in weatherParameters.properties)).toBe(true);
        expect(['paris', 'tokyo', 'lima']).toContain(args.city as string);
        expect(Number.isInteger(args.days)).toBe(true);
        expect(args.days as number).toBeGreaterThanOrEqual(1);
        expect(args.days as number).toBeLessThanOrEqual(7);
        expect(textOf(deltas)).toBe('');
        expect(deltas.at(-1)).toEqual({
          type: 'finish',
          reason: 'tool_calls',
          usage: {
            promptTokens: request.promptTokens,
            completionTokens: countTextTokens(call.name + call.arguments),
          },
        });
        expect(toolCallsOf(await referenceDeltas(FAST, request))).toEqual(calls);
      },
    );

    test('a named tool_choice calls that tool', async () => {
      const { provider } = open();
      const request = makeRequest({
        tools: TOOLS,
        toolChoice: { type: 'function', function: { name: 'book_table' } },
      });
      const deltas = await collect(provider, request);
      const calls = toolCallsOf(deltas);
      expect(calls.map((call) => call.name)).toEqual(['book_table']);
      const args = JSON.parse(calls[0]!.arguments) as { guests: number; name: string };
      expect(Number.isInteger(args.guests) && args.guests >= 2 && args.guests <= 4).toBe(true);
      expect(args.name.length >= 3 && args.name.length <= 8).toBe(true);
      expect(deltas.at(-1)).toMatchObject({ type: 'finish', reason: 'tool_calls' });
    });

    test(
      'tool_choice auto calls a tool on a user turn ' + 'and answers in text after the tool result',
      async () => {
        const { provider } = open();
        const first = await collect(provider, makeRequest({ tools: TOOLS, toolChoice: 'auto' }));
        const [call] = toolCallsOf(first);
        expect(call!.name).toBe('get_weather');
        const messages: ProviderMessage[] = [
          { role: 'user', content: 'Weather in Lima?' },
          {
            role: 'assistant',
            content: null,
            tool_calls: [
              {
                id: call!.id,
                type: 'function',
                function: { name: call!.name, arguments: call!.arguments },
              },
            ],
          },
          { role: 'tool', content: '{"temperature_c": 19}', tool_call_id: call!.id },
        ];
        const second = await collect(
          provider,
          makeRequest({ messages, tools: TOOLS, toolChoice: 'auto' }),
        );
        expect(toolCallsOf(second)).toEqual([]);
        expect(countTextTokens(textOf(second))).toBe(24);
        expect(second.at(-1)).toMatchObject({ type: 'finish', reason: 'stop' });
      },
    );

    test('tool_choice none answers in text', async () => {
      const { provider } = open();
      const deltas = await collect(provider, makeRequest({ tools: TOOLS, toolChoice: 'none' }));
      expect(toolCallsOf(deltas)).toEqual([]);
      expect(countTextTokens(textOf(deltas))).toBe(24);
    });

    test('a stop sequence ends the text before it, with finish stop', async () => {
      const { provider } = open();
      const full = textOf(await referenceDeltas(FAST, makeRequest()));
      const stopWord = ` ${full.split(' ')[5]}`;
      const expected = full.slice(0, full.indexOf(stopWord));
      const request = makeRequest({ stop: ['never-there', stopWord] });
      const deltas = await collect(provider, request);
      expect(textOf(deltas)).toBe(expected);
      expect(deltas.at(-1)).toEqual({
        type: 'finish',
        reason: 'stop',
        usage: { promptTokens: request.promptTokens, completionTokens: countTextTokens(expected) },
      });
    });

    test('an output limit caps the tokens and finishes with length', async () => {
      const { provider } = open();
      const request = makeRequest({ maxOutputTokens: 3 });
      const deltas = await collect(provider, request);
      const text = textOf(deltas);
      expect(countTextTokens(text)).toBe(3);
      expect(textOf(await referenceDeltas(FAST, makeRequest())).startsWith(text)).toBe(true);
      expect(deltas.at(-1)).toEqual({
        type: 'finish',
        reason: 'length',
        usage: { promptTokens: request.promptTokens, completionTokens: 3 },
      });
    });

    test('an abort mid-stream throws the reason promptly and stops the upstream', async () => {
      const target = open(SLOW);
      const controller = new AbortController();
      const reason = new Error('client went away');
      const iterator = target.provider
        .stream(makeRequest(), controller.signal)
        [Symbol.asyncIterator]();
      const first = await iterator.next();
      expect(first.value).toMatchObject({ type: 'text' });
      const pending = iterator.next();
      // Let the provider reach its wait (a timer, a socket read) so the abort lands there, not at a
      // check it would make anyway on resuming.
      await nextMacrotask();
      await expectPromptAbort(controller, pending, reason);
      if (target.upstream) await target.upstream.requests[0]!.aborted;
    });

    test('an abort before the first delta throws the reason promptly', async () => {
      const target = open({ ...SLOW, ttft_ms: 60_000 });
      const controller = new AbortController();
      const reason = new Error('cancelled by the client');
      const pending = target.provider
        .stream(makeRequest(), controller.signal)
        [Symbol.asyncIterator]()
        .next();
      if (target.upstream) await target.upstream.firstRequest;
      else await nextMacrotask();
      await expectPromptAbort(controller, pending, reason);
      if (target.upstream) await target.upstream.requests[0]!.aborted;
    });

    test('an already aborted signal throws its reason', async () => {
      const { provider } = open();
      const controller = new AbortController();
      const reason = new Error('too late');
      controller.abort(reason);
      const caught = await collect(provider, makeRequest(), controller.signal).then(
        () => null,
        (error: unknown) => error,
      );
      expect(caught).toBe(reason);
    });
  });
}

providerContract('simulator', (simulator) => ({
  provider: new SimulatorProvider('simulator', simulator, countTextTokensYielding),
  upstream: null,
  close() {},
}));

providerContract('openai adapter', (simulator) => {
  const upstream = startSimulatorUpstream(simulator);
  return {
    provider: new OpenAIProvider(
      'fake-openai',
      { type: 'openai', base_url: upstream.baseUrl },
      PROVIDER_OPTIONS,
    ),
    upstream,
    close: () => upstream.stop(),
  };
});

describe('openai adapter', () => {
  const stops: (() => void)[] = [];
  const track = <T extends { stop(): void }>(server: T): T => {
    stops.push(() => server.stop());
    return server;
  };
  afterEach(() => {
    for (const stop of stops.splice(0)) stop();
  });
  const adapter = (baseUrl: string, extra: Partial<OpenAIProviderConfig> = {}) =>
    new OpenAIProvider(
      'fake-openai',
      { type: 'openai', base_url: baseUrl, ...extra },
      PROVIDER_OPTIONS,
    );
  /** The adapter's deltas for an upstream that answers every call with these SSE frames. */
  const collectSse = (frames: string[]): Promise<Delta[]> => {
    const upstream = track(startUpstream(() => sseResponse(frames)));
    return collect(adapter(upstream.baseUrl), makeRequest());
  };

  test('sends the request as OpenAI Chat Completions, with the key and extra headers', async () => {
    const keyEnv = 'TOLLGATE_TEST_PROVIDER_KEY';
    process.env[keyEnv] = 'sk-test-secret-123';
    try {
      const upstream = track(startSimulatorUpstream(FAST));
      const provider = adapter(`${upstream.baseUrl}/`, {
        api_key_env: keyEnv,
        headers: { 'x-extra': 'yes' },
      });
      const request = makeRequest({ maxOutputTokens: 50, temperature: 0.5, stop: ['zzz'] });
      await collect(provider, request);
      const [received] = upstream.requests;
      expect({ method: received!.method, path: received!.path }).toEqual({
        method: 'POST',
        path: '/v1/chat/completions',
      });
      expect(received!.headers.authorization).toBe('Bearer sk-test-secret-123');
      expect(received!.headers['x-extra']).toBe('yes');
      expect(received!.headers['content-type']).toBe('application/json');
      expect(received!.body).toEqual({
        model: 'sim-model',
        messages: request.messages,
        max_completion_tokens: 50,
        temperature: 0.5,
        seed: 7,
        stop: ['zzz'],
        stream: true,
        stream_options: { include_usage: true },
      });
    } finally {
      delete process.env[keyEnv];
    }
  });

  test(
    'a configured header replaces the default of the same name; a key from api_key_env replaces ' +
      'a configured authorization',
    async () => {
      const keyEnv = 'TOLLGATE_TEST_PROVIDER_KEY_2';
      const headers = {
        Accept: 'application/json',
        'User-Agent': 'custom-agent/1',
        Authorization: 'Bearer configured',
      };
      const upstream = track(startSimulatorUpstream(FAST));
      const provider = adapter(upstream.baseUrl, { api_key_env: keyEnv, headers });
      await collect(provider, makeRequest());
      // No key in the environment: the configured field goes out, once.
      expect(upstream.requests[0]!.headers).toMatchObject({
        accept: 'application/json',
        'user-agent': 'custom-agent/1',
        authorization: 'Bearer configured',
      });
      process.env[keyEnv] = 'sk-from-env';
      try {
        await collect(provider, makeRequest());
      } finally {
        delete process.env[keyEnv];
      }
      expect(upstream.requests[1]!.headers).toMatchObject({
        accept: 'application/json',
        'user-agent': 'custom-agent/1',
        authorization: 'Bearer sk-from-env',
      });
    },
  );

  test(
    'sends tools, tool_choice, top_p and top_k ' + 'when set, and no authorization without a key',
    async () => {
      const upstream = track(startSimulatorUpstream(FAST));
      const request = makeRequest({
        tools: TOOLS,
        toolChoice: 'required',
        topP: 0.9,
        topK: 40,
        seed: null,
      });
      await collect(adapter(upstream.baseUrl, { api_key_env: 'TOLLGATE_TEST_UNSET_KEY' }), request);
      const [received] = upstream.requests;
      expect(received!.headers.authorization).toBeUndefined();
      expect(received!.body).toEqual({
        model: 'sim-model',
        messages: request.messages,
        top_p: 0.9,
        top_k: 40,
        tools: TOOLS,
        tool_choice: 'required',
        stream: true,
        stream_options: { include_usage: true },
      });
    },
  );

  test('usage absent upstream: finish carries null usage', async () => {
    const upstream = track(startSimulatorUpstream(FAST, { usage: false }));
    const deltas = await collect(adapter(upstream.baseUrl), makeRequest());
    expect(deltas.at(-1)).toEqual({ type: 'finish', reason: 'stop', usage: null });
  });

  test('an upstream that ignores stream and answers JSON gives the same deltas', async () => {
    const upstream = track(startSimulatorUpstream(FAST, { json: true }));
    const request = makeRequest();
    const deltas = await collect(adapter(upstream.baseUrl), request);
    expect(deltas).toEqual([
      { type: 'text', text: textOf(await referenceDeltas(FAST, request)) },
      {
        type: 'finish',
        reason: 'stop',
        usage: { promptTokens: request.promptTokens, completionTokens: 24 },
      },
    ]);
  });

  test('a JSON answer with a tool call and no usage', async () => {
    const upstream = track(startSimulatorUpstream(FAST, { json: true, usage: false }));
    const request = makeRequest({ tools: TOOLS, toolChoice: 'required' });
    const deltas = await collect(adapter(upstream.baseUrl), request);
    const [call] = toolCallsOf(await referenceDeltas(FAST, request));
    expect(deltas).toEqual([
      { type: 'tool_call', index: 0, id: call!.id, name: call!.name, arguments: call!.arguments },
      { type: 'finish', reason: 'tool_calls', usage: null },
    ]);
  });

  test(
    'a non-stream request asks for JSON and ' + 'gives the deltas a stream would, merged',
    async () => {
      const upstream = track(startSimulatorUpstream(FAST));
      const request = makeRequest({ stream: false });
      const deltas = await collect(adapter(upstream.baseUrl), request);
      expect(upstream.requests[0]!.body.stream).toBeUndefined();
      expect(upstream.requests[0]!.body.stream_options).toBeUndefined();
      expect(deltas).toEqual([
        { type: 'text', text: textOf(await referenceDeltas(FAST, request)) },
        {
          type: 'finish',
          reason: 'stop',
          usage: { promptTokens: request.promptTokens, completionTokens: 24 },
        },
      ]);
    },
  );

  test('a non-stream request with tools gets the tool call from the JSON answer', async () => {
    const upstream = track(startSimulatorUpstream(FAST));
    const request = makeRequest({ tools: TOOLS, toolChoice: 'required', stream: false });
    const deltas = await collect(adapter(upstream.baseUrl), request);
    const [call] = toolCallsOf(await referenceDeltas(FAST, request));
    expect(deltas).toEqual([
      { type: 'tool_call', index: 0, id: call!.id, name: call!.name, arguments: call!.arguments },
      {
        type: 'finish',
        reason: 'tool_calls',
        usage: { promptTokens: request.promptTokens, completionTokens: expect.any(Number) },
      },
    ]);
  });

  test(
    'complete() gives the deltas the stream gives, collected: JSON answers, tool calls, and a ' +
      'server that streams anyway',
    async () => {
      const upstream = track(startSimulatorUpstream(FAST));
      const provider = adapter(upstream.baseUrl);
      for (const request of [
        makeRequest({ stream: false }),
        makeRequest({ stream: false, tools: TOOLS, toolChoice: 'required' }),
      ]) {
        expect(await provider.complete(request, new AbortController().signal)).toEqual(
          await collect(provider, request),
        );
      }
      const streaming = track(
        startUpstream(() =>
          sseResponse([
            'data: {"choices": [{"index": 0, "delta": ' +
              '{"content": "Hi"}, "finish_reason": "stop"}]}\n\n',
            'data: [DONE]\n\n',
          ]),
        ),
      );
      expect(
        await adapter(streaming.baseUrl).complete(
          makeRequest({ stream: false }),
          new AbortController().signal,
        ),
      ).toEqual([
        { type: 'text', text: 'Hi' },
        { type: 'finish', reason: 'stop', usage: null },
      ]);
    },
  );

  test(
    'complete() maps upstream failures like the ' + 'stream does, and an abort stops it promptly',
    async () => {
      const failing = track(
        startUpstream(() => Response.json({ error: { code: 'server_error' } }, { status: 500 })),
      );
      await expectGatewayError(
        adapter(failing.baseUrl).complete(
          makeRequest({ stream: false }),
          new AbortController().signal,
        ),
        'upstream_error',
        502,
      );
      const slow = track(startSimulatorUpstream(SLOW));
      const controller = new AbortController();
      const pending = adapter(slow.baseUrl).complete(
        makeRequest({ stream: false }),
        controller.signal,
      );
      const received = await slow.firstRequest;
      await expectPromptAbort(controller, pending);
      await received.aborted;
    },
  );

  test('an abort while a non-stream request waits for its JSON stops the upstream', async () => {
    const upstream = track(startSimulatorUpstream(SLOW));
    const controller = new AbortController();
    const pending = collect(
      adapter(upstream.baseUrl),
      makeRequest({ stream: false }),
      controller.signal,
    );
    const received = await upstream.firstRequest;
    await expectPromptAbort(controller, pending);
    await received.aborted;
  });

  test('upstream 500 is upstream_error 502, without the prompt, the key or its code', async () => {
    const keyEnv = 'TOLLGATE_TEST_PROVIDER_KEY_500';
    process.env[keyEnv] = 'sk-never-shown';
    try {
      const upstream = track(
        startUpstream((_req, recorded) =>
          Response.json(
            {
              error: {
                message:
                  `failed on ${JSON.stringify(recorded.body.messages)} ` +
                  `with ${recorded.headers.authorization}`,
                code: 'org_internal_account_9f8e7d',
              },
            },
            { status: 500 },
          ),
        ),
      );
      const error = await expectGatewayError(
        collect(adapter(upstream.baseUrl, { api_key_env: keyEnv }), makeRequest()),
        'upstream_error',
        502,
      );
      expect(error.message).toBe('Upstream fake-openai answered HTTP 500.');
    } finally {
      delete process.env[keyEnv];
    }
  });

  test('upstream 400 context_length_exceeded keeps its code, with param messages', async () => {
    const upstream = track(
      startUpstream(() =>
        Response.json(
          {
            error: {
              message: 'too long',
              type: 'invalid_request_error',
              code: 'context_length_exceeded',
              param: 'messages',
            },
          },
          { status: 400 },
        ),
      ),
    );
    const error = await expectGatewayError(
      collect(adapter(upstream.baseUrl), makeRequest()),
      'context_length_exceeded',
      400,
    );
    expect(error.param).toBe('messages');
  });

  test('another upstream 400 is upstream_error', async () => {
    const upstream = track(startUpstream(() => new Response('bad request', { status: 400 })));
    const error = await expectGatewayError(
      collect(adapter(upstream.baseUrl), makeRequest()),
      'upstream_error',
      502,
    );
    expect(error.message).toBe('Upstream fake-openai answered HTTP 400.');
  });

  test('garbage SSE data is upstream_invalid_response', async () => {
    await expectGatewayError(
      collectSse([
        'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n',
        'data: {not json\n\n',
      ]),
      'upstream_invalid_response',
      502,
    );
  });

  test('SSE chunks of the wrong shape are upstream_invalid_response', async () => {
    for (const chunk of [
      '"text"',
      '{"choices": 5}',
      '{"choices": [{"delta": {"content": 7}}]}',
      '{"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]}',
    ]) {
      await expectGatewayError(
        collectSse([`data: ${chunk}\n\n`, 'data: [DONE]\n\n']),
        'upstream_invalid_response',
        502,
      );
    }
  });

  test('an error object inside the stream is upstream_error', async () => {
    await expectGatewayError(
      collectSse(['data: {"error": {"message": "overloaded"}}\n\n']),
      'upstream_error',
      502,
    );
  });

  test(
    'a stream that ends without finish_reason and ' + 'without [DONE] is upstream_invalid_response',
    async () => {
      await expectGatewayError(
        collectSse(['data: {"choices": [{"index": 0, "delta": {"content": "half"}}]}\n\n']),
        'upstream_invalid_response',
        502,
      );
    },
  );

  test('a stream of [DONE] alone (no chunk at all) is upstream_invalid_response', async () => {
    await expectGatewayError(
      collectSse([': keep-alive\n\n', 'data: [DONE]\n\n']),
      'upstream_invalid_response',
      502,
    );
  });

  test('a stream with a finish_reason but no [DONE] ends normally', async () => {
    const upstream = track(
      startUpstream(() =>
        sseResponse([
          ': keep-alive\n\n',
          'data: {"choices": [{"index": 0, "delta": ' +
            '{"role": "assistant", "content": "Hel"}}]}\r\n\r\n',
          'data: {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": ' +
            'null}]}\n\ndata: {"choices": [{"index": 0, ' +
            '"delta": {}, "finish_reason": "length"}]}\n\n',
        ]),
      ),
    );
    expect(await collect(adapter(upstream.baseUrl), makeRequest())).toEqual([
      { type: 'text', text: 'Hel' },
      { type: 'text', text: 'lo' },
      { type: 'finish', reason: 'length', usage: null },
    ]);
  });

  test('tool-call fragments and finish reasons are mapped', async () => {
    const chunk = (delta: unknown, finish: string | null = null) =>
      `data: ${JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
    const upstream = track(
      startUpstream(() =>
        sseResponse([
          chunk({
            tool_calls: [
              { index: 0, id: 'call_a', type: 'function', function: { name: 'f', arguments: '' } },
            ],
          }),
          chunk({ tool_calls: [{ index: 0, function: { arguments: '{"x":' } }] }),
          chunk({
            tool_calls: [
              { index: 0, function: { arguments: '1}' } },
              { index: 1, id: 'call_b', function: { name: 'g', arguments: '{}' } },
            ],
          }),
          chunk({}, 'function_call'),
          `data: ${JSON.stringify({
            choices: [],
            usage: { prompt_tokens: 11, completion_tokens: 9, total_tokens: 20 },
          })}\n\n`,
          'data: [DONE]\n\n',
        ]),
      ),
    );
    expect(await collect(adapter(upstream.baseUrl), makeRequest())).toEqual([
      { type: 'tool_call', index: 0, id: 'call_a', name: 'f', arguments: '' },
      { type: 'tool_call', index: 0, id: null, name: null, arguments: '{"x":' },
      { type: 'tool_call', index: 0, id: null, name: null, arguments: '1}' },
      { type: 'tool_call', index: 1, id: 'call_b', name: 'g', arguments: '{}' },
      { type: 'finish', reason: 'tool_calls', usage: { promptTokens: 11, completionTokens: 9 } },
    ]);
  });

  test('an unknown finish_reason maps to stop', async () => {
    const upstream = track(
      startUpstream(() =>
        sseResponse([
          'data: {"choices": [{"index": 0, "delta": {"content": ' +
            '"x"}, "finish_reason": "content_filter"}]}\n\n',
          'data: [DONE]\n\n',
        ]),
      ),
    );
    const deltas = await collect(adapter(upstream.baseUrl), makeRequest());
    expect(deltas.at(-1)).toEqual({ type: 'finish', reason: 'stop', usage: null });
  });

  test('garbage JSON is upstream_invalid_response', async () => {
    const upstream = track(
      startUpstream(
        () => new Response('not json at all', { headers: { 'content-type': 'application/json' } }),
      ),
    );
    await expectGatewayError(
      collect(adapter(upstream.baseUrl), makeRequest()),
      'upstream_invalid_response',
      502,
    );
  });

  test('JSON of the wrong shape is upstream_invalid_response', async () => {
    const upstream = track(startUpstream(() => Response.json({ choices: [] })));
    await expectGatewayError(
      collect(adapter(upstream.baseUrl), makeRequest()),
      'upstream_invalid_response',
      502,
    );
  });

  test('an unexpected content type is upstream_invalid_response', async () => {
    const upstream = track(
      startUpstream(
        () => new Response('<html>hello</html>', { headers: { 'content-type': 'text/html' } }),
      ),
    );
    await expectGatewayError(
      collect(adapter(upstream.baseUrl), makeRequest()),
      'upstream_invalid_response',
      502,
    );
  });

  test('headers and then silence is upstream_timeout, and the connection is dropped', async () => {
    const upstream = track(startHeadersOnlyServer());
    const error = await expectGatewayError(
      collect(adapter(upstream.baseUrl, { timeout_ms: 200 }), makeRequest()),
      'upstream_timeout',
      504,
    );
    expect(error.message).toBe('Upstream fake-openai did not answer within 200 ms.');
    await upstream.closed;
  });

  // A sized JSON body is read whole (not through a stream reader); the timer and aborts must still
  // reach it.
  const JSON_HEAD =
    'HTTP/1.1 200 OK\r\ncontent-type: ' +
    'application/json\r\ncontent-length: 400\r\n\r\n{"id": "chatcmpl-1",';

  test(
    'a JSON answer that stops mid-body is ' + 'upstream_timeout, and the connection is dropped',
    async () => {
      const upstream = track(startHeadersOnlyServer(JSON_HEAD));
      const request = makeRequest({ stream: false });
      const error = await expectGatewayError(
        collect(adapter(upstream.baseUrl, { timeout_ms: 200 }), request),
        'upstream_timeout',
        504,
      );
      expect(error.message).toBe('Upstream fake-openai sent nothing for 200 ms.');
      await upstream.closed;
    },
  );

  test(
    'an abort while a JSON answer stops mid-body ' +
      'throws the reason promptly and drops the connection',
    async () => {
      const upstream = track(startHeadersOnlyServer(JSON_HEAD));
      const controller = new AbortController();
      const pending = collect(
        adapter(upstream.baseUrl),
        makeRequest({ stream: false }),
        controller.signal,
      );
      // Once the server has answered the head, give the client a turn to start reading the body.
      await upstream.received;
      await nextMacrotask();
      await expectPromptAbort(controller, pending);
      await upstream.closed;
    },
  );

  test('silence after the first bytes is upstream_timeout (idle between reads)', async () => {
    const upstream = track(
      startUpstream((req) => {
        const body = new ReadableStream<Uint8Array>({
          start(controller) {
            controller.enqueue(
              new TextEncoder().encode(
                'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n',
              ),
            );
            req.signal.addEventListener('abort', () => controller.close());
          },
        });
        return new Response(body, { headers: { 'content-type': 'text/event-stream' } });
      }),
    );
    const deltas: Delta[] = [];
    const error = await expectGatewayError(
      (async () => {
        for await (const delta of adapter(upstream.baseUrl, { timeout_ms: 200 }).stream(
          makeRequest(),
          new AbortController().signal,
        ))
          deltas.push(delta);
      })(),
      'upstream_timeout',
      504,
    );
    expect(deltas).toEqual([{ type: 'text', text: 'Hi' }]);
    expect(error.message).toBe('Upstream fake-openai sent nothing for 200 ms.');
    await upstream.requests[0]!.aborted;
  });

  test('once the answer began, keep-alives hold the silence timer off (a long pause)', async () => {
    const upstream = track(
      startUpstream(() => {
        const encoder = new TextEncoder();
        const body = new ReadableStream<Uint8Array>({
          async start(controller) {
            controller.enqueue(
              encoder.encode('data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'),
            );
            // 600 ms of pings, three times the timeout, then the end.
            for (let i = 0; i < 12; i++) {
              await Bun.sleep(50);
              controller.enqueue(encoder.encode(': ping\n\n'));
            }
            controller.enqueue(
              encoder.encode(
                'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n' +
                  'data: [DONE]\n\n',
              ),
            );
            controller.close();
          },
        });
        return new Response(body, { headers: { 'content-type': 'text/event-stream' } });
      }),
    );
    expect(await collect(adapter(upstream.baseUrl, { timeout_ms: 200 }), makeRequest())).toEqual([
      { type: 'text', text: 'Hi' },
      { type: 'finish', reason: 'stop', usage: null },
    ]);
  });

  /** A body sent in `pieces`, one every 50 ms: 600 ms for 12, three times a 200 ms timeout. */
  function trickled(pieces: string[], status = 200, type = 'text/event-stream'): Response {
    const encoder = new TextEncoder();
    const body = new ReadableStream<Uint8Array>({
      async start(controller) {
        for (const piece of pieces) {
          controller.enqueue(encoder.encode(piece));
          await Bun.sleep(50);
        }
        controller.close();
      },
    });
    return new Response(body, { status, headers: { 'content-type': type } });
  }

  test('reasoning the gateway drops is part of the answer: it holds the timeout off', async () => {
    const thinking = Array.from(
      { length: 12 },
      (_, i) =>
        `data: {"choices": [{"index": 0, "delta": {"reasoning_content": "step ${i}"}}]}\n\n`,
    );
    const upstream = track(
      startUpstream(() =>
        trickled([
          ...thinking,
          'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}, ' +
            '"finish_reason": "stop"}]}\n\n',
          'data: [DONE]\n\n',
        ]),
      ),
    );
    expect(await collect(adapter(upstream.baseUrl, { timeout_ms: 200 }), makeRequest())).toEqual([
      { type: 'text', text: 'Hi' },
      { type: 'finish', reason: 'stop', usage: null },
    ]);
  });

  test('a JSON body that began is read against the silence between reads', async () => {
    const json = JSON.stringify({
      id: 'chatcmpl-1',
      choices: [{ index: 0, message: { role: 'assistant', content: 'Hi' }, finish_reason: 'stop' }],
    });
    const pieces = Array.from({ length: 12 }, (_, i) => json.slice(i * 10, (i + 1) * 10));
    pieces.push(json.slice(120));
    const upstream = track(startUpstream(() => trickled(pieces, 200, 'application/json')));
    const deltas = await collect(
      adapter(upstream.baseUrl, { timeout_ms: 200 }),
      makeRequest({ stream: false }),
    );
    expect(deltas).toEqual([
      { type: 'text', text: 'Hi' },
      { type: 'finish', reason: 'stop', usage: null },
    ]);
  });

  test('a slow error body stays the error (400: no failover), not a timeout', async () => {
    const body = JSON.stringify({
      error: { code: 'bad_thing', message: 'no', padding: 'x'.repeat(100) },
    });
    const pieces = Array.from({ length: 12 }, (_, i) => body.slice(i * 10, (i + 1) * 10));
    pieces.push(body.slice(120));
    const upstream = track(startUpstream(() => trickled(pieces, 400, 'application/json')));
    const error = await expectGatewayError(
      collect(adapter(upstream.baseUrl, { timeout_ms: 200 }), makeRequest()),
      'upstream_error',
      502,
    );
    expect(error.failover).toBe(false);
  });

  test('a role-only chunk and [DONE] is no answer: upstream_invalid_response', async () => {
    await expectGatewayError(
      collectSse([
        'data: {"choices": [{"index": 0, "delta": {"role": "assistant"}}]}\n\n',
        'data: [DONE]\n\n',
      ]),
      'upstream_invalid_response',
      502,
    );
  });

  test('before the answer, keep-alives do not: upstream_timeout at timeout_ms', async () => {
    const upstream = track(
      startUpstream((req) => {
        let timer: ReturnType<typeof setInterval> | undefined;
        const body = new ReadableStream<Uint8Array>({
          start(controller) {
            const ping = new TextEncoder().encode(': ping\n\n');
            timer = setInterval(() => controller.enqueue(ping), 50);
            req.signal.addEventListener('abort', () => {
              clearInterval(timer);
              controller.close();
            });
          },
          cancel: () => clearInterval(timer),
        });
        return new Response(body, { headers: { 'content-type': 'text/event-stream' } });
      }),
    );
    const error = await expectGatewayError(
      collect(adapter(upstream.baseUrl, { timeout_ms: 200 }), makeRequest()),
      'upstream_timeout',
      504,
    );
    expect(error.message).toBe('Upstream fake-openai did not answer within 200 ms.');
    await upstream.requests[0]!.aborted;
  });

  test('no response headers within timeout_ms is upstream_timeout', async () => {
    const upstream = track(
      startUpstream((req) => {
        const never = Promise.withResolvers<Response>();
        req.signal.addEventListener('abort', () => never.resolve(new Response('late')));
        return never.promise;
      }),
    );
    const error = await expectGatewayError(
      collect(adapter(upstream.baseUrl, { timeout_ms: 200 }), makeRequest()),
      'upstream_timeout',
      504,
    );
    expect(error.message).toBe('Upstream fake-openai sent no response headers within 200 ms.');
    await upstream.requests[0]!.aborted;
  });

  test(
    'https with the CA of ca_file: the answer arrives, and the connection is kept for the ' +
      'next call',
    async () => {
      const tlsDir = join(import.meta.dir, '../support/tls');
      const ports = new Set<number>();
      const server = Bun.serve({
        hostname: '127.0.0.1',
        port: 0,
        tls: {
          key: Bun.file(join(tlsDir, 'server.key')),
          cert: Bun.file(join(tlsDir, 'server.crt')),
        },
        fetch(request, srv) {
          ports.add(srv.requestIP(request)!.port);
          return Response.json({
            choices: [
              {
                index: 0,
                message: { role: 'assistant', content: 'secure' },
                finish_reason: 'stop',
              },
            ],
          });
        },
      });
      track({ stop: () => server.stop(true) });
      const provider = adapter(`https://127.0.0.1:${server.port}/v1`, {
        ca_file: join(tlsDir, 'ca.crt'),
      });
      for (let i = 0; i < 2; i++) {
        expect(await collect(provider, makeRequest({ stream: false }))).toEqual([
          { type: 'text', text: 'secure' },
          { type: 'finish', reason: 'stop', usage: null },
        ]);
      }
      expect(ports.size).toBe(1);
    },
  );

  test('an https upstream whose certificate is not trusted is upstream_unreachable', async () => {
    const tlsDir = join(import.meta.dir, '../support/tls');
    const server = Bun.serve({
      hostname: '127.0.0.1',
      port: 0,
      tls: {
        key: Bun.file(join(tlsDir, 'server.key')),
        cert: Bun.file(join(tlsDir, 'server.crt')),
      },
      fetch: () => new Response('never'),
    });
    track({ stop: () => server.stop(true) });
    const provider = adapter(`https://127.0.0.1:${server.port}/v1`, {
      ca_file: join(tlsDir, 'other-ca.crt'),
    });
    await expectGatewayError(collect(provider, makeRequest()), 'upstream_unreachable', 502);
  });

  test('a compressed body (asked for identity) is upstream_invalid_response', async () => {
    const upstream = track(
      startUpstream((_req, recorded) => {
        expect(recorded.headers['accept-encoding']).toBe('identity');
        return new Response(Bun.gzipSync(JSON.stringify({ choices: [] })), {
          headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' },
        });
      }),
    );
    await expectGatewayError(
      collect(adapter(upstream.baseUrl), makeRequest({ stream: false })),
      'upstream_invalid_response',
      502,
    );
  });

  test(
    'streams in a row keep one connection: the ' + 'body end after [DONE] is awaited, not cut',
    async () => {
      const ports = new Set<number>();
      let ended = Promise.withResolvers<void>();
      const server = Bun.serve({
        hostname: '127.0.0.1',
        port: 0,
        fetch(request, srv) {
          ports.add(srv.requestIP(request)!.port);
          // [DONE] in one write, the chunked body's end in a later one, as servers commonly send
          // them.
          const encoder = new TextEncoder();
          const body = new ReadableStream<Uint8Array>({
            start(controller) {
              controller.enqueue(
                encoder.encode(
                  'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": ' +
                    '"stop"}]}\n\ndata: [DONE]\n\n',
                ),
              );
              setTimeout(() => {
                controller.close();
                ended.resolve();
              }, 20);
            },
          });
          return new Response(body, { headers: { 'content-type': 'text/event-stream' } });
        },
      });
      track({ stop: () => server.stop(true) });
      const provider = adapter(`http://127.0.0.1:${server.port}/v1`);
      for (let i = 0; i < 3; i++) {
        expect(textOf(await collect(provider, makeRequest()))).toBe('Hi');
        // The next call comes once the body's end has reached the client (a few turns after the
        // server sent it).
        await ended.promise;
        ended = Promise.withResolvers<void>();
        for (let turn = 0; turn < 5; turn++) await nextMacrotask();
      }
      expect(ports.size).toBe(1);
    },
  );

  test('a refused connection is upstream_unreachable', async () => {
    const closed = Bun.serve({
      port: 0,
      hostname: '127.0.0.1',
      fetch: () => new Response('unused'),
    });
    const baseUrl = `http://127.0.0.1:${closed.port}/v1`;
    closed.stop(true);
    const error = await expectGatewayError(
      collect(adapter(baseUrl), makeRequest()),
      'upstream_unreachable',
      502,
    );
    expect(error.message).toBe('Could not reach upstream fake-openai (ECONNREFUSED).');
  });

  test('a consumer that stops early drops the upstream request', async () => {
    const upstream = track(startSimulatorUpstream(SLOW));
    for await (const delta of adapter(upstream.baseUrl).stream(
      makeRequest(),
      new AbortController().signal,
    )) {
      expect(delta.type).toBe('text');
      break;
    }
    await upstream.requests[0]!.aborted;
  });
});
