// The count worker's job for a large decision body: parsed, validated, fingerprinted, its prompt
// built and counted, in steps the worker can pause between (its entry is src/count-worker.ts).
import {
  type CountError,
  type CountJob,
  type CountResult,
  countError,
} from '../billing/count-jobs.ts';
import { countPromptTokensSteps } from '../billing/tokens.ts';
import type { Config } from '../config/model.ts';
import { requestFingerprint } from '../idempotency/fingerprint.ts';
import { parseJsonBody } from '../util/json.ts';
import {
  type DecisionModelName,
  type DecisionRequest,
  type Question,
  validateDecisionRequest,
} from './model.ts';
import { buildPrompt, type DecisionPrompt } from './prompt.ts';

/** What validating a decision needs of the config: its two models and whether each has tools. */
export interface DecisionConfig {
  models: Record<DecisionModelName, string>;
  tools: Record<DecisionModelName, boolean>;
}

export interface DecisionBodyJob extends CountJob {
  /**
   * A large decision body, handled whole here: parsed, validated (the config's two decision
   * models), fingerprinted when `fingerprintPath` is set, its prompt built and counted up to
   * `limit`. The event loop never parses it: a 4 MB state of tiny values takes 150-200 ms of
   * JSON.parse alone.
   */
  decisionBody: { text: string; config: DecisionConfig; limit: number };
}

export interface DecisionBodyResult extends CountResult {
  /** The decision's prompt (the caller asks the model with it). */
  prompt: DecisionPrompt | null;
  /** The request as validated (its state is in `prompt`), or the error that refused it. */
  decision?: { modelName: DecisionModelName; questions: Array<[string, Question]> } | null;
  error?: CountError | null;
}

/** Whether a job the worker received is a decision body (else it is billing's). */
export function isDecisionBodyJob(job: CountJob): job is DecisionBodyJob {
  return 'decisionBody' in job && job.decisionBody != null;
}

/**
 * Runs a decision body job; each `yield` is a point where the worker may hand the thread to
 * another key's job. The steps are what the event loop would have done, with the same code.
 */
export function* runDecisionBodyJob({
  decisionBody: job,
  fingerprintPath,
}: DecisionBodyJob): Generator<void, DecisionBodyResult> {
  const refused = (error: CountError): DecisionBodyResult => ({
    fingerprint: null,
    tokens: -1,
    contentCounts: null,
    prompt: null,
    error,
  });
  let body: unknown;
  try {
    body = parseJsonBody(job.text, Number.POSITIVE_INFINITY);
  } catch (error) {
    return refused(countError(error));
  }
  yield;
  // The same validation as on the event loop, against the part of the config it reads.
  const { models, tools } = job.config;
  const config = {
    decision: { models },
    models: Object.fromEntries(Object.values(models).map((modelId) => [modelId, {}])),
  } as unknown as Config;
  let decision: DecisionRequest;
  try {
    decision = validateDecisionRequest(body, config);
  } catch (error) {
    return refused(countError(error));
  }
  yield;
  const fingerprint =
    fingerprintPath === null ? null : requestFingerprint('POST', fingerprintPath, body);
  yield;
  const built = buildPrompt(
    (body as { state: unknown }).state,
    decision.questions,
    tools[decision.modelName],
  );
  body = null;
  yield;
  const toolsJson = built.tools && built.tools.length > 0 ? JSON.stringify(built.tools) : null;
  const tokens = yield* countPromptTokensSteps(built.messages, toolsJson, job.limit);
  return {
    fingerprint,
    tokens,
    contentCounts: null,
    prompt: built,
    decision: { modelName: decision.modelName, questions: decision.questions },
  };
}
