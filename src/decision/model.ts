// Decision request and answer schemas, and validation; every shape error names the question and
// what was expected.
import { type Static, type TSchema, Type } from '@sinclair/typebox';
import type { Config, ModelConfig } from '../config/model.ts';
import { AttemptViewSchema, RequestStatusSchema, UsageSchema } from '../state/events.ts';
import { GatewayError } from '../util/errors.ts';
import { quoted } from '../util/validation.ts';

export const QUESTION_ID_RE = /^[A-Za-z0-9_-]{1,64}$/;
export const QUESTIONS_MAX = 64;
export const CHOICE_LABELS_MIN = 2;
export const CHOICE_LABELS_MAX = 32;
export const SCORE_LEVELS_MIN = 2;
export const SCORE_LEVELS_MAX = 11;
// Prompts, labels and descriptions have no length of their own: the contract bounds them only by
// the 4 MB body and the 32,000-token input (422), which the input's count enforces.

export const DECISION_MODELS = ['decision-fast', 'decision-accurate'] as const;
export type DecisionModelName = (typeof DECISION_MODELS)[number];

export const ChoiceQuestionSchema = Type.Object({
  type: Type.Literal('choice'),
  prompt: Type.String({ minLength: 1 }),
  criteria: Type.Record(Type.String({ minLength: 1 }), Type.String({ minLength: 1 }), {
    minProperties: CHOICE_LABELS_MIN,
    maxProperties: CHOICE_LABELS_MAX,
  }),
});

export const ScoreQuestionSchema = Type.Object({
  type: Type.Literal('score'),
  prompt: Type.String({ minLength: 1 }),
  criteria: Type.Array(Type.String({ minLength: 1 }), {
    minItems: SCORE_LEVELS_MIN,
    maxItems: SCORE_LEVELS_MAX,
  }),
});

export const DecisionRequestSchema = Type.Object({
  model: Type.Union(DECISION_MODELS.map((name) => Type.Literal(name))),
  state: Type.Unknown(),
  questions: Type.Record(
    Type.String({ pattern: QUESTION_ID_RE.source }),
    Type.Union([ChoiceQuestionSchema, ScoreQuestionSchema]),
    {
      minProperties: 1,
      maxProperties: QUESTIONS_MAX,
    },
  ),
});

export type ChoiceQuestion = Static<typeof ChoiceQuestionSchema>;
export type ScoreQuestion = Static<typeof ScoreQuestionSchema>;
export type Question = ChoiceQuestion | ScoreQuestion;
export type DecisionRequestBody = Static<typeof DecisionRequestSchema>;

/** One question's answer: a label for a choice, a level (and its index) for a score. */
export const DecisionAnswerSchema = Type.Union([
  Type.Object({ type: Type.Literal('choice'), label: Type.String() }),
  Type.Object({
    type: Type.Literal('score'),
    score: Type.Integer({ minimum: 0, description: 'the level index, 0 the lowest' }),
    level: Type.String(),
  }),
]);
export type Answer = Static<typeof DecisionAnswerSchema>;

export interface DecisionRequest {
  body: DecisionRequestBody;
  modelName: DecisionModelName;
  /** The catalogue model the decision model maps to. */
  modelId: string;
  model: ModelConfig;
  questions: Array<[string, Question]>;
}

function invalid(message: string, param: string | null, detail: string): GatewayError {
  return new GatewayError('invalid_request_error', message, { param, detail });
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function describe(value: unknown): string {
  if (value === undefined) return 'nothing (the field is missing)';
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'an array';
  return typeof value === 'object' ? 'an object' : `a ${typeof value}`;
}

function checkQuestion(id: string, raw: unknown): Question {
  const param = `questions.${id}`;
  if (!isObject(raw)) {
    throw invalid(
      `question ${id} is not an object`,
      param,
      `question "${id}": expected an object with type, prompt and criteria, got ${describe(raw)}`,
    );
  }
  const { type, prompt, criteria } = raw;
  if (type !== 'choice' && type !== 'score') {
    throw invalid(
      `question ${id} has an unknown type`,
      `${param}.type`,
      `question "${id}": type must be "choice" or "score"`,
    );
  }
  if (typeof prompt !== 'string' || prompt.length === 0) {
    throw invalid(
      `question ${id} needs a prompt`,
      `${param}.prompt`,
      `question "${id}": prompt must be a non-empty string`,
    );
  }
  if (type === 'choice') return { type, prompt, criteria: choiceCriteria(id, param, criteria) };
  return { type, prompt, criteria: scoreCriteria(id, param, criteria) };
}

/** What is wrong with a choice label (the detail names it), or null. */
function labelProblem(label: string): string | null {
  return label.length === 0 ? 'is empty' : null;
}

/** What is wrong with a label's description or a level (the detail names it), or null. */
function descriptionProblem(description: unknown): string | null {
  if (typeof description !== 'string') return `has a description that is ${describe(description)}`;
  return description.trim().length === 0 ? 'has an empty description' : null;
}

/** A choice question's labels, each with a non-empty description, within their bounds. */
function choiceCriteria(id: string, param: string, criteria: unknown): Record<string, string> {
  const shape =
    `a choice question's criteria must be an object mapping ` +
    `${CHOICE_LABELS_MIN}-${CHOICE_LABELS_MAX} labels to non-empty descriptions`;
  if (!isObject(criteria))
    throw invalid(
      `question ${id}: criteria has the wrong shape`,
      `${param}.criteria`,
      `question "${id}": ${shape}, got ${describe(criteria)}`,
    );
  const labels = Object.entries(criteria);
  if (labels.length < CHOICE_LABELS_MIN || labels.length > CHOICE_LABELS_MAX) {
    throw invalid(
      `question ${id}: criteria has ${labels.length} labels`,
      `${param}.criteria`,
      `question "${id}": ${shape}, got ${labels.length} labels`,
    );
  }
  for (const [label, description] of labels) {
    const problem = labelProblem(label) ?? descriptionProblem(description);
    if (problem) {
      const named = quoted(label);
      throw invalid(
        `question ${id}: criteria label ${named} is invalid`,
        `${param}.criteria`,
        `question "${id}": ${shape}; label ${named} ${problem}`,
      );
    }
  }
  return criteria as Record<string, string>;
}

/** A score question's levels, lowest first, each a non-empty description, within their bounds. */
function scoreCriteria(id: string, param: string, criteria: unknown): string[] {
  const shape =
    `a score question's criteria must be an array of ` +
    `${SCORE_LEVELS_MIN}-${SCORE_LEVELS_MAX} non-empty level descriptions, lowest first`;
  if (!Array.isArray(criteria))
    throw invalid(
      `question ${id}: criteria has the wrong shape`,
      `${param}.criteria`,
      `question "${id}": ${shape}, got ${describe(criteria)}`,
    );
  if (criteria.length < SCORE_LEVELS_MIN || criteria.length > SCORE_LEVELS_MAX) {
    throw invalid(
      `question ${id}: criteria has ${criteria.length} levels`,
      `${param}.criteria`,
      `question "${id}": ${shape}, got ${criteria.length} levels`,
    );
  }
  criteria.forEach((level, index) => {
    const problem = descriptionProblem(level);
    if (problem) {
      throw invalid(
        `question ${id}: level ${index} is invalid`,
        `${param}.criteria[${index}]`,
        `question "${id}": ${shape}; level ${index} ${problem}`,
      );
    }
  });
  return criteria as string[];
}

/** Shape (400 with detail), then the model (404): the contract's order. */
export function validateDecisionRequest(json: unknown, config: Config): DecisionRequest {
  if (!isObject(json))
    throw invalid(
      'The body must be a JSON object.',
      null,
      `expected a JSON object with model, state and questions, got ${describe(json)}`,
    );
  if (typeof json.model !== 'string')
    throw invalid(
      'model is required',
      'model',
      'model must be "decision-fast" or "decision-accurate"',
    );
  if (!Object.hasOwn(json, 'state'))
    throw invalid(
      'state is required',
      'state',
      'state is required: the JSON value the questions are about',
    );
  const questions = json.questions;
  if (!isObject(questions))
    throw invalid(
      'questions must be an object',
      'questions',
      `questions must be an object keyed by question id, got ${describe(questions)}`,
    );
  const entries = Object.entries(questions);
  if (entries.length < 1 || entries.length > QUESTIONS_MAX) {
    throw invalid(
      `questions holds ${entries.length} questions`,
      'questions',
      `questions must hold 1-${QUESTIONS_MAX} questions, got ${entries.length}`,
    );
  }
  const checked: Array<[string, Question]> = [];
  for (const [id, raw] of entries) {
    if (!QUESTION_ID_RE.test(id)) {
      throw invalid(
        `question id ${quoted(id)} is invalid`,
        'questions',
        `question ${quoted(id)}: a question id must be 1-64 characters of A-Z a-z 0-9 _ -`,
      );
    }
    checked.push([id, checkQuestion(id, raw)]);
  }
  const modelName = json.model as DecisionModelName;
  if (!(DECISION_MODELS as readonly string[]).includes(modelName)) {
    throw new GatewayError(
      'model_not_found',
      `The decision model ${quoted(json.model)} does ` +
        `not exist; use decision-fast or decision-accurate.`,
      {
        param: 'model',
        detail: 'model must be "decision-fast" or "decision-accurate"',
      },
    );
  }
  const modelId = config.decision.models[modelName];
  const model = config.models[modelId]!;
  return { body: json as DecisionRequestBody, modelName, modelId, model, questions: checked };
}

// ─── Answers (the OpenAPI document shows them; the views are typed by them) ───────────────────

const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);
const UnixSeconds = Type.Integer({ minimum: 0, description: 'Unix seconds' });

const ChargedSchema = Type.Object({
  tokens: Type.Integer({ minimum: 0, description: 'from the token wallet' }),
  credits: Type.Number({ minimum: 0 }),
});

/** POST /decision/v1/decide/ 200. */
export const DecisionSchema = Type.Object({
  id: Type.String({ description: 'dec_…, also in X-Request-ID' }),
  object: Type.Literal('decision'),
  created: UnixSeconds,
  model: Type.Union(DECISION_MODELS.map((name) => Type.Literal(name))),
  answers: Type.Record(Type.String(), DecisionAnswerSchema, { description: 'by question id' }),
  usage: UsageSchema,
  charged: ChargedSchema,
});
export type DecisionView = Static<typeof DecisionSchema>;

/** GET /decision/v1/requests/{id}/. */
export const DecisionLookupSchema = Type.Object({
  id: Type.String(),
  object: Type.Literal('decision.request'),
  status: RequestStatusSchema,
  http_status: Nullable(Type.Integer({ minimum: 100, maximum: 599 })),
  created: UnixSeconds,
  finished: Nullable(UnixSeconds),
  model: Type.String(),
  error_code: Nullable(Type.String()),
  answers: Nullable(Type.Record(Type.String(), DecisionAnswerSchema)),
  usage: Nullable(UsageSchema),
  charged: ChargedSchema,
  attempts: Type.Array(AttemptViewSchema),
});
export type DecisionLookup = Static<typeof DecisionLookupSchema>;
