// Question ids and labels named like Object.prototype's members (CONTRACT §8: keys are plain data)
// work end to end.
import { afterAll, beforeAll, describe, expect, test } from 'bun:test';
import { bearer, openTestGateway, type TestGateway } from '../support/gateway.ts';

// Written as JSON text: in a JS object literal `__proto__: {...}` would set the prototype, not a
// key.
const QUESTIONS_JSON = `{
  "__proto__": {"type": "choice", "prompt": "Which one?", "criteria":
    {"__proto__": "the first", "constructor": "the second", "toString": "the third"}},
  "constructor": {"type": "score", "prompt": "How good?", "criteria": ["poor", "fair", "good"]},
  "toString": {"type": "choice", "prompt": "Which way?", "criteria":
    {"hasOwnProperty": "left", "valueOf": "right"}}
}`;
const IDS = ['__proto__', 'constructor', 'toString'];

function decideBody(): string {
  return (
    `{"model": "decision-fast", "state": {"__proto__": {"polluted": true}, "ticket": "t-1"}, ` +
    `"questions": ${QUESTIONS_JSON}}`
  );
}

/** Every answer is an own key, in question order, with a label or level the question allows. */
function expectValidAnswers(answers: Record<string, any>): void {
  expect(Object.keys(answers)).toEqual(IDS);
  expect(Object.getPrototypeOf(answers)).toBe(Object.prototype);
  const answer = (id: string) => Object.getOwnPropertyDescriptor(answers, id)!.value;
  expect(answer('__proto__')).toEqual({ type: 'choice', label: expect.any(String) });
  expect(['__proto__', 'constructor', 'toString']).toContain(answer('__proto__').label);
  expect(answer('constructor')).toEqual({
    type: 'score',
    score: expect.any(Number),
    level: ['poor', 'fair', 'good'][answer('constructor').score],
  });
  expect(answer('toString')).toEqual({ type: 'choice', label: expect.any(String) });
  expect(['hasOwnProperty', 'valueOf']).toContain(answer('toString').label);
}

// decision-fast on a model with tools (the answer is a tool call) and on one without (JSON in
// text).
for (const [name, overrides] of [
  ['a model with tools', {}],
  ['a text-only model', { decision: { models: { 'decision-fast': 'model_09' } } }],
] as const) {
  describe(`question ids and labels __proto__, constructor, toString on ${name}`, () => {
    let t: TestGateway;
    beforeAll(() => {
      t = openTestGateway(overrides);
    });
    afterAll(() => t.close());

    test(
      'POST /decide → 200 with every answer, ' + 'and the lookup returns the same answers',
      async () => {
        const { key } = await t.createKey({ credits: 10 });
        const response = await t.request('/decision/v1/decide/', {
          method: 'POST',
          headers: bearer(key),
          body: decideBody(),
        });
        const text = await response.text();
        expect(response.status).toBe(200);
        const body = JSON.parse(text);
        // A real own key in the JSON text, not dropped as a prototype by the serializer.
        expect(text).toContain('"answers":{"__proto__":{"type":"choice","label":');
        expectValidAnswers(body.answers);

        const lookup = await t.request(`/decision/v1/requests/${body.id}/`, {
          headers: bearer(key),
        });
        expect(lookup.status).toBe(200);
        const record = (await lookup.json()) as Record<string, any>;
        expect(record.status).toBe('completed');
        expect(record.answers).toEqual(body.answers);
        expectValidAnswers(record.answers);
      },
    );
  });
}
