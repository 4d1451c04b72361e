// Questions ⇄ model messages: the prompt, the answer schema, and the check of what the model
// answered.
import { canonicalJson } from '../idempotency/fingerprint.ts';
import {
  JSON_SCHEMA_MARKER,
  type ProviderMessage,
  type ToolChoice,
  type ToolDefinition,
} from '../providers/provider.ts';
import type { Answer, Question } from './model.ts';

export const DECISION_TOOL_NAME = 'submit_decision';

const SYSTEM_PROMPT =
  'You are a careful decision engine. Read the state, then answer every question. ' +
  'For a choice question give exactly one of its labels; for a score question give the index ' +
  'of one level ' +
  '(0 is the lowest). Use nothing but the allowed labels and levels.';

/**
 * The JSON Schema of a complete answer: one property per question, labels and level indexes
 * enumerated.
 */
export function answerSchema(questions: Array<[string, Question]>): Record<string, unknown> {
  // Null-prototype maps: a question id like "__proto__" is a plain key here, not the object's
  // prototype.
  const properties: Record<string, unknown> = Object.create(null);
  for (const [id, question] of questions) {
    properties[id] =
      question.type === 'choice'
        ? { type: 'string', enum: Object.keys(question.criteria) }
        : { type: 'integer', minimum: 0, maximum: question.criteria.length - 1 };
  }
  return {
    type: 'object',
    properties,
    required: questions.map(([id]) => id),
    additionalProperties: false,
  };
}

/**
 * Output tokens one answer may take: the configured budget, or more when the longest valid answer
 * could need more (64 questions with long labels: a budget too small for it cut every answer off,
 * a 502 on every attempt). The longest answer is the tool's arguments with each question's
 * longest label (in JSON bytes) and highest level; a token is at least one byte of UTF-8, so its
 * bytes bound its tokens. Two bytes more per question for the spaces a model may put after `:` and
 * `,`. At most the model's own output limit.
 */
export function answerTokensFor(
  questions: Array<[string, Question]>,
  configuredTokens: number,
  modelOutputTokensMax: number,
): number {
  let bytes = 2; // {}
  for (const [id, question] of questions) {
    // "id": and a comma; ids are ASCII, two bytes of spaces.
    bytes += id.length + 4 + 2;
    if (question.type === 'score') {
      bytes += String(question.criteria.length - 1).length;
      continue;
    }
    let longest = 0;
    for (const label of Object.keys(question.criteria))
      longest = Math.max(longest, Buffer.byteLength(JSON.stringify(label)));
    bytes += longest;
  }
  // Never past what the model may write: a provider refuses a larger limit outright.
  return Math.max(configuredTokens, Math.min(bytes, modelOutputTokensMax));
}

export interface DecisionPrompt {
  messages: ProviderMessage[];
  tools: ToolDefinition[] | null;
  toolChoice: ToolChoice | null;
}

/**
 * Builds what the model sees. The state is re-serialized canonically, so the body's whitespace
 * never counts.
 */
export function buildPrompt(
  state: unknown,
  questions: Array<[string, Question]>,
  useTools: boolean,
): DecisionPrompt {
  let user = `State (JSON):\n${canonicalJson(state)}\n\nQuestions:\n`;
  for (const [id, question] of questions) {
    user += `\n- ${id} (${question.type}): ${question.prompt}\n`;
    if (question.type === 'choice') {
      for (const [label, description] of Object.entries(question.criteria))
        user += `  - ${label}: ${description}\n`;
    } else {
      for (const [index, level] of question.criteria.entries()) user += `  ${index}: ${level}\n`;
    }
  }
  const schema = answerSchema(questions);
  if (useTools) {
    return {
      messages: [
        {
          role: 'system',
          content: `${SYSTEM_PROMPT} Call ${DECISION_TOOL_NAME} once with all answers.`,
        },
        { role: 'user', content: user },
      ],
      tools: [
        {
          type: 'function',
          function: {
            name: DECISION_TOOL_NAME,
            description: 'Submit one answer per question.',
            parameters: schema,
          },
        },
      ],
      toolChoice: { type: 'function', function: { name: DECISION_TOOL_NAME } },
    };
  }
  return {
    messages: [
      {
        role: 'system',
        content: `${SYSTEM_PROMPT}\n${JSON_SCHEMA_MARKER}\n${JSON.stringify(schema)}`,
      },
      { role: 'user', content: user },
    ],
    tools: null,
    toolChoice: null,
  };
}

/**
 * The first balanced JSON object in a text answer (models like to wrap JSON in prose or fences).
 */
export function extractJsonObject(text: string): unknown {
  const start = text.indexOf('{');
  if (start < 0) return undefined;
  let depth = 0;
  let inString = false;
  for (let i = start; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '{') depth++;
    else if (c === '}' && --depth === 0) {
      try {
        return JSON.parse(text.slice(start, i + 1));
      } catch {
        return undefined;
      }
    }
  }
  return undefined;
}

/**
 * Checks a raw answer object against the questions; null when any answer is missing or not allowed.
 */
export function readAnswers(
  raw: unknown,
  questions: Array<[string, Question]>,
): Record<string, Answer> | null {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return null;
  const answers: Record<string, Answer> = Object.create(null);
  for (const [id, question] of questions) {
    // Own keys only: a missing answer to question "toString" must not read
    // Object.prototype.toString.
    const value = Object.hasOwn(raw, id) ? (raw as Record<string, unknown>)[id] : undefined;
    if (question.type === 'choice') {
      if (typeof value !== 'string' || !Object.hasOwn(question.criteria, value)) return null;
      answers[id] = { type: 'choice', label: value };
    } else {
      // A level index, or (leniently) the level's own text.
      const index =
        typeof value === 'number'
          ? value
          : typeof value === 'string'
            ? question.criteria.indexOf(value)
            : -1;
      if (!Number.isInteger(index) || index < 0 || index >= question.criteria.length) return null;
      answers[id] = { type: 'score', score: index, level: question.criteria[index]! };
    }
  }
  return answers;
}
