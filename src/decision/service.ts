// Decisions: admission (idempotency, rate, input size, daily budget, quota), the hold, asking the
// model.
import { countAnswerTokens } from '../billing/offload.ts';
import { costMicro, ratesFor } from '../billing/pricing.ts';
import { actorSettled, type Gateway, statusUrl } from '../gateway.ts';
import { checkIdempotency } from '../idempotency/store.ts';
import { collectAnswer, type ProviderRequest } from '../providers/provider.ts';
import {
  abortError,
  abortOnTimer,
  notRecordedError,
  type Outcome,
  RequestActor,
  statusForAbort,
} from '../requests/actor.ts';
import { DAY_MS, type KeyAccount } from '../state/apply.ts';
import type { Amount, Event, Usage } from '../state/events.ts';
import { assert } from '../util/assert.ts';
import { GatewayError, internalError } from '../util/errors.ts';
import { RESOLVED } from '../util/promise.ts';
import type { Answer, DecisionRequest } from './model.ts';
import {
  DECISION_TOOL_NAME,
  type DecisionPrompt,
  extractJsonObject,
  readAnswers,
} from './prompt.ts';

/** A model answer that is not a valid label or level is asked again this many times, then 502. */
const ANSWER_RETRIES = 1;
/**
 * The longest answer text (or tool arguments) read as an answer: 64 questions' labels fit many
 * times over.
 */
const ANSWER_CHARS_MAX = 256 * 1024;

export interface DecisionAdmission {
  actor: RequestActor;
  prompt: DecisionPrompt;
  promptTokens: number;
  durable: Promise<void>;
  createdS: number;
}

export interface DecisionSuccess {
  answers: Record<string, Answer>;
  usage: Usage;
  charged: Amount;
}

function nextUtcMidnight(nowMs: number): string {
  return new Date((Math.floor(nowMs / DAY_MS) + 1) * DAY_MS).toISOString().replace('.000Z', 'Z');
}

/**
 * Checks in the contract's order after shape and model: idempotency → rate → input tokens (422) →
 * daily budget (429) → quota (402); then holds the token wallet if it covers the estimate, else
 * credits. Synchronous from the first check to the commit, so identical requests cannot both pass.
 */
export function admitDecision(
  gateway: Gateway,
  account: KeyAccount,
  requestId: string,
  decision: DecisionRequest,
  idempotency: { key: string; fingerprint: string } | null,
  prepared: { prompt: DecisionPrompt; promptTokens: number },
): DecisionAdmission {
  const { config, store, registry } = gateway;
  const nowMs = Date.now();
  if (idempotency) {
    checkIdempotency(
      store.state,
      registry,
      account.id,
      idempotency.key,
      idempotency.fingerprint,
      nowMs,
      (id) => statusUrl(config, 'decision', id),
    );
  }
  gateway.rateLimiter.take(
    account.id,
    account.rateLimitRpm ?? config.limits.default_rate_limit_rpm,
    nowMs,
  );

  const { promptTokens } = prepared;
  if (promptTokens > config.decision.context_tokens) {
    throw new GatewayError(
      'input_too_large',
      `The decision input is over ${config.decision.context_tokens} tokens. Split the state; ` +
        `nothing is truncated.`,
      {
        param: 'state',
        detail:
          `input is over the ${config.decision.context_tokens}-token context; split the ` +
          `state or ask fewer questions`,
      },
    );
  }

  const answerTokens = config.decision.answer_tokens;
  const estimateTokens = promptTokens + answerTokens;
  const estimateMicro = costMicro(
    ratesFor(decision.model, promptTokens),
    promptTokens,
    answerTokens,
  );
  if (account.dailyDecisionBudgetMicro !== null) {
    const today = Math.floor(nowMs / DAY_MS);
    const spentMicro = account.budgetDay === today ? account.budgetSpentMicro : 0;
    if (spentMicro + account.budgetHeldMicro + estimateMicro > account.dailyDecisionBudgetMicro) {
      const resetAt = nextUtcMidnight(nowMs);
      throw new GatewayError(
        'api_key_spend_limit_exceeded',
        `The key's daily decision budget is used up; it resets at ${resetAt}.`,
        {
          fields: { reset_at: resetAt },
        },
      );
    }
  }

  let hold: Amount;
  if (account.tokenWallet >= estimateTokens) hold = { credits_micro: 0, tokens: estimateTokens };
  else if (account.balanceMicro >= estimateMicro)
    hold = { credits_micro: estimateMicro, tokens: 0 };
  else {
    throw new GatewayError(
      'insufficient_quota',
      `Neither the token wallet (${account.tokenWallet} tokens) nor the credits ` +
        `(${account.balanceMicro / 1e6}) cover this ` +
        `decision's estimate of ${estimateTokens} tokens.`,
    );
  }
  if (!registry.admits(account.id))
    throw new GatewayError(
      'service_unavailable',
      "The gateway is at its limit of requests in flight for this key's share; retry shortly.",
    );

  const started: Event[] = [
    {
      type: 'request.started',
      request_id: requestId,
      key_id: account.id,
      service: 'decision',
      model: decision.modelName,
      stream: false,
      hold,
      idempotency: idempotency
        ? {
            key: idempotency.key,
            fingerprint: idempotency.fingerprint,
            expires_at_ms: nowMs + config.idempotency_ttl_s * 1000,
          }
        : null,
      budget_hold_micro: account.dailyDecisionBudgetMicro === null ? 0 : estimateMicro,
      at_ms: nowMs,
    },
  ];
  // Without an Idempotency-Key nobody can name this request before its answer (which carries the
  // id), so its start is logged with its finish in one record; with one, the binding is durable
  // first.
  let durable: Promise<void> = RESOLVED;
  if (idempotency) durable = store.commit(started);
  else store.applyUnlogged(requestId, started);
  const actor = new RequestActor(
    {
      id: requestId,
      keyId: account.id,
      service: 'decision',
      model: decision.modelName,
      stream: false,
      hold,
    },
    store,
    actorSettled(gateway),
    gateway.logger,
  );
  actor.started(durable);
  registry.add(actor);
  return {
    actor,
    prompt: prepared.prompt,
    promptTokens,
    durable,
    createdS: Math.floor(nowMs / 1000),
  };
}

/**
 * One call to the model, collected; returns the raw answer object (or undefined) and the tokens it
 * took.
 */
async function askOnce(
  gateway: Gateway,
  decision: DecisionRequest,
  request: ProviderRequest,
  signal: AbortSignal,
  keyId: string,
): Promise<{ raw: unknown; promptTokens: number; completionTokens: number }> {
  const provider = gateway.providers.get(decision.model.provider);
  assert(provider, `no provider ${decision.model.provider}`);
  let text = '';
  let args = '';
  let name: string | null = null;
  let usage: { promptTokens: number; completionTokens: number } | null = null;
  for (const delta of await collectAnswer(provider, request, signal)) {
    if (delta.type === 'text') text += delta.text;
    else if (delta.type === 'tool_call') {
      if (delta.index === 0) {
        name ??= delta.name;
        args += delta.arguments;
      }
    } else usage = delta.usage;
  }
  let raw: unknown;
  // An answer is a few labels; one far longer than that is not parsed (a 16 MiB body would hold the
  // event loop in JSON.parse) and counts as an invalid answer.
  if (text.length > ANSWER_CHARS_MAX || args.length > ANSWER_CHARS_MAX) raw = undefined;
  else if (request.tools) {
    if (name === DECISION_TOOL_NAME) {
      try {
        raw = JSON.parse(args);
      } catch {
        raw = undefined;
      }
    } else raw = extractJsonObject(text);
  } else raw = extractJsonObject(text);
  return {
    raw,
    promptTokens: usage?.promptTokens ?? request.promptTokens,
    completionTokens:
      usage?.completionTokens ??
      (await countAnswerTokens(
        keyId,
        [text, args],
        request.maxOutputTokens ?? Number.POSITIVE_INFINITY,
        signal,
        gateway.logger,
      )),
  };
}

/**
 * The actor's run loop for one decision: ask, check, ask once more if the answer was not valid;
 * charge only a 200 (the wallet or credits that were held, at actual tokens); release the hold on
 * any failure.
 */
export async function runDecision(
  gateway: Gateway,
  admission: DecisionAdmission,
  decision: DecisionRequest,
): Promise<{ ok: true; value: DecisionSuccess } | { ok: false; error: GatewayError }> {
  const { actor, prompt, durable } = admission;
  const { config } = gateway;
  const timer = setTimeout(abortOnTimer, config.decision.timeout_ms, actor, 'upstream_timeout');
  const hold = actor.init.hold;
  const request: ProviderRequest = {
    model: decision.model.upstream_model ?? decision.modelId,
    messages: prompt.messages,
    maxOutputTokens: config.decision.answer_tokens,
    temperature: 0,
    topP: null,
    topK: null,
    seed: decision.model.seed ? 0 : null,
    stop: null,
    tools: prompt.tools,
    toolChoice: prompt.toolChoice,
    promptTokens: admission.promptTokens,
    stream: false,
  };
  let outcome: Outcome | null = null;
  const released: Amount = { credits_micro: 0, tokens: 0 };
  try {
    await durable;
    let promptTokens = 0;
    let completionTokens = 0;
    let answers: Record<string, Answer> | null = null;
    for (let attempt = 0; attempt <= ANSWER_RETRIES && answers === null; attempt++) {
      const reply = await askOnce(gateway, decision, request, actor.signal, actor.init.keyId);
      promptTokens += reply.promptTokens;
      completionTokens += reply.completionTokens;
      answers = readAnswers(reply.raw, decision.questions);
      if (answers === null)
        actor.logger.warn(
          { attempt },
          'decision: the model answered outside the allowed labels or levels',
        );
    }
    if (actor.signal.aborted) throw actor.signal.reason;
    if (answers === null)
      throw new GatewayError(
        'upstream_invalid_response',
        'The model did not give a valid answer for every question, twice.',
      );
    const usage: Usage = {
      prompt_tokens: promptTokens,
      completion_tokens: completionTokens,
      total_tokens: promptTokens + completionTokens,
    };
    const costCreditsMicro = costMicro(
      ratesFor(decision.model, promptTokens),
      promptTokens,
      completionTokens,
    );
    const charge: Amount =
      hold.tokens > 0
        ? { credits_micro: 0, tokens: Math.min(hold.tokens, usage.total_tokens) }
        : { credits_micro: Math.min(hold.credits_micro, costCreditsMicro), tokens: 0 };
    outcome = {
      status: 'completed',
      error: null,
      usage,
      charge,
      budgetSpendMicro: costCreditsMicro,
      answers,
      httpStatus: 200,
    };
    if (!(await actor.finish(outcome))) return { ok: false, error: notRecordedError() };
    return { ok: true, value: { answers, usage, charged: charge } };
  } catch (thrown) {
    const kind = actor.abortKind;
    let error: GatewayError;
    if (kind !== null) error = abortError(kind === 'stream_timeout' ? 'upstream_timeout' : kind);
    else if (thrown instanceof GatewayError) error = thrown;
    else {
      actor.logger.error(
        { err: (thrown as Error)?.stack ?? String(thrown) },
        'decision: run failed',
      );
      error = internalError();
    }
    // No error is ever charged: every failure releases the hold.
    outcome = {
      status: kind !== null ? statusForAbort(kind) : 'error',
      error,
      usage: null,
      charge: released,
      budgetSpendMicro: 0,
      answers: null,
      httpStatus: error.status,
    };
    return { ok: false, error: (await actor.finish(outcome)) ? error : notRecordedError() };
  } finally {
    clearTimeout(timer);
    if (!outcome) {
      await actor.finish({
        status: 'error',
        error: internalError(),
        usage: null,
        charge: released,
        budgetSpendMicro: 0,
        answers: null,
        httpStatus: 500,
      });
    }
  }
}
