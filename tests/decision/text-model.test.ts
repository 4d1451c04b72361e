// Decisions on a model without tools: the answer comes back as JSON text and is checked the same
// way.
import { afterAll, beforeAll, expect, test } from 'bun:test';
import type { Question } from '../../src/decision/model.ts';
import { buildPrompt, extractJsonObject, readAnswers } from '../../src/decision/prompt.ts';
import { bearer, openTestGateway, type TestGateway } from '../support/gateway.ts';

let t: TestGateway;

beforeAll(() => {
  // model_09 has no tool support, so the decision service must ask for JSON in text.
  t = openTestGateway({ decision: { models: { 'decision-fast': 'model_09' } } });
});
afterAll(() => t.close());

const questions: Record<string, Question> = {
  urgency: {
    type: 'choice',
    prompt: 'How urgent is this ticket?',
    criteria: { urgent: 'needs action today', routine: 'can wait' },
  },
  quality: {
    type: 'score',
    prompt: 'How complete is the answer?',
    criteria: ['missing', 'partial', 'complete'],
  },
};

test('a text-only model gets a JSON Schema prompt and its JSON answer is used', async () => {
  const { key } = await t.createKey({ credits: 10 });
  const response = await t.request('/decision/v1/decide/', {
    method: 'POST',
    headers: bearer(key),
    body: JSON.stringify({
      model: 'decision-fast',
      state: { ticket: 'The login page is down' },
      questions,
    }),
  });
  expect(response.status).toBe(200);
  const body = (await response.json()) as any;
  expect(['urgent', 'routine']).toContain(body.answers.urgency.label);
  expect(body.answers.quality.level).toBe(
    (questions.quality!.criteria as string[])[body.answers.quality.score],
  );
});

test('the prompt for a text-only model carries the answer schema and no tools', () => {
  const prompt = buildPrompt({ a: 1 }, Object.entries(questions), false);
  expect(prompt.tools).toBeNull();
  expect(prompt.messages[0]!.content).toContain('"enum":["urgent","routine"]');
});

test('JSON is found inside prose, and answers outside the labels are refused', () => {
  const entries = Object.entries(questions);
  expect(extractJsonObject('Sure! ```json\n{"urgency":"urgent","quality":2}\n``` done')).toEqual({
    urgency: 'urgent',
    quality: 2,
  });
  expect(readAnswers({ urgency: 'urgent', quality: 2 }, entries)).toEqual({
    urgency: { type: 'choice', label: 'urgent' },
    quality: { type: 'score', score: 2, level: 'complete' },
  });
  expect(readAnswers({ urgency: 'panic', quality: 2 }, entries)).toBeNull();
  expect(readAnswers({ urgency: 'urgent', quality: 3 }, entries)).toBeNull();
  expect(readAnswers({ urgency: 'urgent' }, entries)).toBeNull();
  expect(readAnswers('urgent', entries)).toBeNull();
});
