// The simulator's schema check has one budget per request (CONTRACT §8: refusals are cheap): 128
// tools that each spend most of a budget of their own took half a second of the event loop.
import { expect, test } from 'bun:test';
import { bearer, closedAfterEach } from '../support/gateway.ts';

const t = closedAfterEach();

/** A small cycle of $defs that fits (null ends it) but costs thousands of search steps. */
function cyclic(n: number, fan: number) {
  const defs: Record<string, unknown> = {};
  for (let i = 0; i < n; i++) {
    const branch = {
      type: 'object',
      properties: { x: { $ref: `#/$defs/d${(i + 1) % n}` } },
      required: ['x'],
    };
    defs[`d${i}`] = { anyOf: [...Array.from({ length: fan }, () => branch), { type: 'null' }] };
  }
  return {
    $defs: defs,
    type: 'object',
    properties: { a: { $ref: '#/$defs/d0' } },
    required: ['a'],
  };
}

test(
  '128 costly tools share one search budget: refused ' +
    'as too complex, even from a key with no credit',
  async () => {
    const gateway = t.gateway();
    const { key } = await gateway.createKey({ credits: 0 });
    const tools = Array.from({ length: 128 }, (_, i) => ({
      type: 'function',
      function: { name: `f${i}`, parameters: cyclic(6, 4) },
    }));
    const response = await gateway.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify({
        model: 'model_03',
        messages: [{ role: 'user', content: 'hi' }],
        tools,
      }),
    });
    expect(response.status).toBe(400);
    const { error } = (await response.json()) as {
      error: { code: string; param: string; message: string };
    };
    expect(error.code).toBe('invalid_request_error');
    expect(error.param).toMatch(/^tools\[\d+\]\.function\.parameters$/);
    expect(error.message).toContain('simplify the schema');
    // One such tool alone is fine: the request reaches its quota check.
    const one = await gateway.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify({
        model: 'model_03',
        messages: [{ role: 'user', content: 'hi' }],
        tools: tools.slice(0, 1),
      }),
    });
    expect(one.status).toBe(402);
  },
);

test(
  'a required list of 90,000 names is charged ' + 'as it is read: refused as too complex',
  async () => {
    const gateway = t.gateway();
    const { key } = await gateway.createKey({ credits: 0 });
    const required = Array.from({ length: 90_000 }, (_, i) => `p${i}`);
    const tools = [
      {
        type: 'function',
        function: {
          name: 'wide',
          parameters: { type: 'object', required, additionalProperties: { type: 'null' } },
        },
      },
    ];
    const response = await gateway.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify({
        model: 'model_03',
        messages: [{ role: 'user', content: 'hi' }],
        tools,
      }),
    });
    expect(response.status).toBe(400);
    const { error } = (await response.json()) as { error: { param: string; message: string } };
    expect(error.param).toBe('tools[0].function.parameters');
    // Stopped by the step budget before the names were all read, not after sizing all 300,000 of
    // them.
    expect(error.message).toContain('simplify the schema');
  },
);

test(
  'a pattern costly to build in each of 10,000 array items: the tool call is built within the ' +
    "value's budget (its smallest instance), at once, and valid",
  async () => {
    const gateway = t.gateway();
    const { key } = await gateway.createKey({ credits: 100 });
    // 90,000 node visits per build; built once per item, it held the loop for many seconds.
    const pattern = '^((a?){300}){300}b$';
    const tool = {
      type: 'function',
      function: {
        name: 'costly',
        parameters: {
          type: 'object',
          properties: {
            v: { type: 'array', minItems: 10_000, items: { type: 'string', pattern } },
          },
          required: ['v'],
        },
      },
    };
    const startedMs = performance.now();
    const response = await gateway.request('/api/v1/chat/completions', {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify({
        model: 'model_03',
        messages: [{ role: 'user', content: 'hi' }],
        tools: [tool],
        tool_choice: 'required',
      }),
    });
    expect(response.status).toBe(200);
    const body = (await response.json()) as {
      choices: Array<{ message: { tool_calls: Array<{ function: { arguments: string } }> } }>;
    };
    expect(performance.now() - startedMs).toBeLessThan(1_000);
    const args = JSON.parse(body.choices[0]!.message.tool_calls[0]!.function.arguments) as {
      v: string[];
    };
    expect(args.v.length).toBeGreaterThanOrEqual(10_000);
    // What the pattern matches, a* then b, checked without running it: even on "b", which it
    // matches, its nested repeats backtrack for minutes (why the gateway never runs a client's
    // pattern).
    expect(args.v.every((item) => /^a*b$/.test(item))).toBe(true);
  },
);
