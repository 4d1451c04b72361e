// A decision request's admission inputs (Idempotency-Key fingerprint, prompt, its tokens):
// measured on the event loop when cheap, else by the count worker after the cheap refusals.
import type { CountJob } from '../billing/count-jobs.ts';
import {
  countOffLoop,
  countPool,
  drainingError,
  type Idempotency,
  type OffloadHost,
} from '../billing/offload.ts';
import { countPromptTokensInline } from '../billing/tokens.ts';
import { requestFingerprint } from '../idempotency/fingerprint.ts';
import { statusUrl } from '../requests/admit.ts';
import type { KeyAccount } from '../state/apply.ts';
import type { ClientConnection } from '../util/abort.ts';
import { GatewayError } from '../util/errors.ts';
import type { DecisionBodyJob, DecisionBodyResult } from './count-job.ts';
import type { DecisionRequest } from './model.ts';
import { buildPrompt, type DecisionPrompt } from './prompt.ts';

export interface DecisionMeasure {
  idempotency: Idempotency | null;
  prompt: DecisionPrompt;
  /** Past the limit possibly a partial count (the request is refused either way, 422). */
  promptTokens: number;
}

/**
 * A decision body over OFFLOAD_BODY_CHARS, handled whole by the count worker: parsed, validated,
 * its fingerprint (`withFingerprint`: an Idempotency-Key came) and its prompt made and counted. The
 * event loop never parses it (a 4 MB state of tiny values is 150-200 ms of JSON.parse); the checks
 * the contract puts after validation (idempotency, rate, input size) follow on the event loop, in
 * their order.
 */
export async function measureLargeDecision(
  gateway: OffloadHost,
  account: KeyAccount,
  text: string,
  path: string,
  withFingerprint: boolean,
  signal: AbortSignal | null,
): Promise<{
  decision: DecisionRequest;
  fingerprint: string | null;
  prompt: DecisionPrompt;
  promptTokens: number;
}> {
  const { config } = gateway;
  const models = config.decision.models;
  const tools = {
    'decision-fast': config.models[models['decision-fast']]!.tools,
    'decision-accurate': config.models[models['decision-accurate']]!.tools,
  };
  const job: DecisionBodyJob = {
    body: null,
    fingerprintPath: withFingerprint ? path : null,
    prompt: null,
    decisionBody: { text, config: { models, tools }, limit: config.decision.context_tokens },
  };
  const owner = { keyId: account.id, signal, logger: gateway.logger };
  // The worker entry (src/count-worker.ts) runs a decision body job as runDecisionBodyJob: its
  // result is that job's, in the pool shared by every kind of count.
  const result = (await countPool().run(job, owner)) as DecisionBodyResult;
  if (result.error) {
    const { code, message, param, detail } = result.error;
    throw new GatewayError(code, message, { param, ...(detail === undefined ? {} : { detail }) });
  }
  if (gateway.draining) throw drainingError();
  const { modelName, questions } = result.decision!;
  const modelId = models[modelName];
  // The state lives on in the prompt only: nothing after validation reads the body.
  const body = { model: modelName, state: null, questions: {} } as DecisionRequest['body'];
  return {
    decision: { body, modelName, modelId, model: config.models[modelId]!, questions },
    fingerprint: result.fingerprint,
    prompt: result.prompt!,
    promptTokens: result.tokens,
  };
}

/**
 * measureChat for a decision whose body is small (see measureLargeDecision): the fingerprint, the
 * prompt built from the state, and its tokens.
 */
export function measureDecision(
  gateway: OffloadHost,
  account: KeyAccount,
  decision: DecisionRequest,
  json: unknown,
  idempotencyKey: string | null,
  path: string,
  client: ClientConnection | null,
): DecisionMeasure | Promise<DecisionMeasure> {
  const limit = gateway.config.decision.context_tokens;
  const fingerprint = idempotencyKey ? requestFingerprint('POST', path, json) : null;
  const prompt = buildPrompt(decision.body.state, decision.questions, decision.model.tools);
  const toolsJson = prompt.tools && prompt.tools.length > 0 ? JSON.stringify(prompt.tools) : null;
  const promptTokens = countPromptTokensInline(prompt.messages, toolsJson, limit);
  const idempotency = idempotencyKey ? { key: idempotencyKey, fingerprint: fingerprint! } : null;
  if (promptTokens !== null) return { idempotency, prompt, promptTokens };
  const job: CountJob = {
    body: null,
    fingerprintPath: null,
    prompt: { messages: prompt.messages, toolsJson, toolsInBody: false, limit },
  };
  const signal = client?.signal ?? null;
  return decisionOffLoop(gateway, account, job, idempotencyKey, fingerprint, prompt, signal);
}

async function decisionOffLoop(
  gateway: OffloadHost,
  account: KeyAccount,
  job: CountJob,
  idempotencyKey: string | null,
  fingerprint: string | null,
  prompt: DecisionPrompt,
  signal: AbortSignal | null,
): Promise<DecisionMeasure> {
  const result = await countOffLoop(
    gateway,
    'decision',
    (id) => statusUrl(gateway.config, 'decision', id),
    account,
    job,
    idempotencyKey,
    fingerprint,
    signal,
  );
  return {
    idempotency: idempotencyKey ? { key: idempotencyKey, fingerprint: result.fingerprint! } : null,
    prompt,
    promptTokens: result.tokens,
  };
}
