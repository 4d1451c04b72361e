// 4 MB bodies built to be slow to parse (CONTRACT §8: a refusal costs at most the parsing of its
// body, and no request holds the event loop for 50 ms): too many values is refused before
// JSON.parse runs.
import { describe, expect, test } from 'bun:test';
import { countPool } from '../../src/billing/offload.ts';
import { scanJson } from '../../src/util/json.ts';
import { bearer, closedAfterEach } from '../support/gateway.ts';

const t = closedAfterEach();
const MIB = 1024 * 1024;

/**
 * Bodies near 4 MB whose JSON.parse takes 100-600 ms: many keys, many empty arrays, many short
 * strings.
 */
function slowBodies(): Record<string, string> {
  const keys: string[] = [];
  let length = 0;
  for (let i = 0; length < 4 * MIB - 200; i++) {
    const entry = `"k${i}":${i}`;
    keys.push(entry);
    length += entry.length + 1;
  }
  const base = '{"model":"model_03","messages":[{"role":"user","content":"x"}],"junk":';
  return {
    keys: `${base}{${keys.join(',')}}}`,
    arrays: `${base}[${'[],'.repeat((4 * MIB - 200) / 3)}[]]}`,
    strings: `${base}[${'"s",'.repeat((4 * MIB - 200) / 4)}"s"]}`,
  };
}

describe('a body built to be slow to parse', () => {
  test(
    'chat: refused as a 400 naming the bound, ' + 'from a key with no credit, before it is parsed',
    async () => {
      const gateway = t.gateway();
      const { key } = await gateway.createKey({ credits: 0 });
      for (const [shape, body] of Object.entries(slowBodies())) {
        expect(body.length).toBeLessThanOrEqual(4 * MIB);
        const response = await gateway.request('/api/v1/chat/completions', {
          method: 'POST',
          headers: bearer(key),
          body,
        });
        expect({ shape, status: response.status }).toEqual({ shape, status: 400 });
        const { error } = (await response.json()) as { error: { code: string; message: string } };
        expect(error.code).toBe('invalid_request_error');
        // A shape of one huge object passes the members' bound first.
        expect(error.message).toMatch(
          /^The JSON body holds more than (100000 values|32768 object members)\.$/,
        );
      }
    },
  );

  test(
    'decision: the same junk as a state is parsed and counted off the event loop, and refused ' +
      '422 as the contract says',
    async () => {
      const gateway = t.gateway();
      const { key } = await gateway.createKey({ credits: 0 });
      const questions = {
        q: { type: 'choice', prompt: 'Which?', criteria: { a: 'first', b: 'second' } },
      };
      for (const [shape, body] of Object.entries(slowBodies())) {
        const junk = body.slice(body.indexOf('"junk":') + 7, -1);
        const decision =
          `{"model":"decision-fast","questions":${JSON.stringify(questions)},` + `"state":${junk}}`;
        const jobs = countPool().jobsAccepted;
        const response = await gateway.request('/decision/v1/decide/', {
          method: 'POST',
          headers: bearer(key),
          body: decision,
        });
        expect({ shape, status: response.status }).toEqual({ shape, status: 422 });
        expect(((await response.json()) as { error: { code: string } }).error.code).toBe(
          'input_too_large',
        );
        // Parsed, validated and counted by the count worker: one job, nothing of it on the event
        // loop.
        expect(countPool().jobsAccepted).toBe(jobs + 1);
      }
    },
  );

  test(
    'a body at the bound is parsed as usual; strings with quotes and escapes count as one ' +
      'value each',
    async () => {
      // The array and its 99,999 elements.
      expect(scanJson(`[${'0,'.repeat(99_998)}0]`, 100_000, 256)).toBeNull();
      expect(scanJson(`[${'0,'.repeat(99_999)}0]`, 100_000, 256)).toBe('values');
      expect(scanJson(JSON.stringify(['a,b,[c]{', '\\",\\\\', '"'.repeat(50)]), 4, 256)).toBeNull();
      expect(scanJson(JSON.stringify(['a,b,[c]{', '\\",\\\\', '"'.repeat(50)]), 3, 256)).toBe(
        'values',
      );
      expect(scanJson(JSON.stringify({ a: [[[[1]]]] }), 100, 4)).toBe('depth');
      expect(scanJson(JSON.stringify({ a: [[[1]]] }), 100, 4)).toBeNull();
      const gateway = t.gateway();
      const { key } = await gateway.createKey({ credits: 100 });
      const tools = Array.from({ length: 100 }, (_, i) => ({
        type: 'function',
        function: {
          name: `t${i}`,
          parameters: {
            type: 'object',
            properties: Object.fromEntries(
              Array.from({ length: 40 }, (_, p) => [`p${p}`, { type: 'string' }]),
            ),
          },
        },
      }));
      const response = await gateway.request('/api/v1/chat/completions', {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify({
          model: 'model_03',
          messages: [{ role: 'user', content: 'hi' }],
          tools,
          tool_choice: 'none',
        }),
      });
      expect(response.status).toBe(200);
    },
  );
});
