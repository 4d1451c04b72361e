// Decisions: the decision checks of admission (input size, daily budget, quota) and the decision
// `work` of a run: ask the model, check its answer, ask once more, price it.
import { countAnswerTokens } from '../billing/offload.ts';
import { costMicro, ratesFor } from '../billing/pricing.ts';
import type { Config } from '../config/model.ts';
import type { Delta, ProviderRequest } from '../providers/provider.ts';
import type { Router } from '../providers/router.ts';
import type { Completion, RunPolicy, RunResult } from '../requests/actor.ts';
import { type Admission, type AdmitContext, admit, type Reservation } from '../requests/admit.ts';
import { DAY_MS, type KeyAccount } from '../state/apply.ts';
import type { Amount, Attempt, Usage } from '../state/events.ts';
import type { ClientConnection, RunSignal } from '../util/abort.ts';
import { GatewayError } from '../util/errors.ts';
import type { Answer, DecisionRequest } from './model.ts';
import {
  answerTokensFor,
  DECISION_TOOL_NAME,
  type DecisionPrompt,
  extractJsonObject,
  readAnswers,
} from './prompt.ts';

/** What the decision service uses of the gateway (the Gateway satisfies it). */
export interface DecisionContext extends AdmitContext {
  router: Router;
}

/** A model answer that is not a valid label or level is asked again this many times, then 502. */
const ANSWER_RETRIES = 1;
/**
 * The longest answer text (or tool arguments) read as an answer: 64 questions' labels fit many
 * times over.
 */
const ANSWER_CHARS_MAX = 256 * 1024;

export interface DecisionAdmission extends Admission {
  prompt: DecisionPrompt;
  promptTokens: number;
  /** The output budget of each ask (answerTokensFor), reserved with the input. */
  answerTokens: number;
  /** The reservation's cost in µcr at the model's rates, whether held in credits or tokens. */
  estimateMicro: number;
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
 * Admits a decision (requests/admit: idempotency, rate, then the checks below, then the hold) or
 * throws its refusal.
 */
export function admitDecision(
  gateway: DecisionContext,
  account: KeyAccount,
  requestId: string,
  decision: DecisionRequest,
  idempotency: { key: string; fingerprint: string } | null,
  prepared: { prompt: DecisionPrompt; promptTokens: number },
  client: ClientConnection | null,
): DecisionAdmission {
  let answerTokens = gateway.config.decision.answer_tokens;
  let estimateMicro = 0;
  const admission = admit(gateway, {
    service: 'decision',
    requestId,
    account,
    model: decision.modelName,
    stream: false,
    idempotency,
    client,
    reserve: (current, nowMs) => {
      // Worked out here, past the idempotency and rate checks: a refused request costs nothing.
      answerTokens = answerTokensFor(
        decision.questions,
        answerTokens,
        decision.model.max_output_tokens,
      );
      const reservation = reserveDecision(
        gateway,
        decision,
        prepared.promptTokens,
        answerTokens,
        current,
        nowMs,
      );
      estimateMicro = reservation.estimateMicro;
      return reservation;
    },
  });
  return {
    ...admission,
    prompt: prepared.prompt,
    promptTokens: prepared.promptTokens,
    answerTokens,
    estimateMicro,
  };
}

/**
 * Input tokens (422) → daily budget (429) → quota (402); holds the token wallet if it covers the
 * estimate, else credits.
 */
function reserveDecision(
  gateway: DecisionContext,
  decision: DecisionRequest,
  promptTokens: number,
  answerTokens: number,
  account: KeyAccount,
  nowMs: number,
): Reservation & { estimateMicro: number } {
  const { config } = gateway;
  if (promptTokens > config.decision.context_tokens) {
    throw new GatewayError(
      'input_too_large',
      `The decision input is over ${config.decision.context_tokens} tokens. ` +
        'Split the state; nothing is truncated.',
      {
        param: 'state',
        detail:
          `input is over the ${config.decision.context_tokens}-token context; ` +
          'split the state or ask fewer questions',
      },
    );
  }
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
        { fields: { reset_at: resetAt } },
      );
    }
  }
  const budgetHoldMicro = account.dailyDecisionBudgetMicro === null ? 0 : estimateMicro;
  if (account.tokenWallet >= estimateTokens) {
    return { hold: { credits_micro: 0, tokens: estimateTokens }, budgetHoldMicro, estimateMicro };
  }
  if (account.balanceMicro >= estimateMicro) {
    return { hold: { credits_micro: estimateMicro, tokens: 0 }, budgetHoldMicro, estimateMicro };
  }
  throw new GatewayError(
    'insufficient_quota',
    `Neither the token wallet (${account.tokenWallet} tokens) nor the credits ` +
      `(${account.balanceMicro / 1e6}) cover this decision's estimate of ${estimateTokens} tokens.`,
  );
}

/**
 * One call to the model, collected; returns the raw answer object (or undefined) and the tokens it
 * took.
 */
async function askOnce(
  gateway: DecisionContext,
  decision: DecisionRequest,
  request: ProviderRequest,
  signal: RunSignal,
  keyId: string,
  attempts: Attempt[],
): Promise<{ raw: unknown; promptTokens: number; completionTokens: number }> {
  let text = '';
  let args = '';
  let name: string | null = null;
  let usage: Extract<Delta, { type: 'finish' }>['usage'] = null;
  for (const delta of await gateway.router.complete(decision.modelId, request, signal, attempts)) {
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

/** The run policies of a config: made once, not per request. */
const policies = new WeakMap<Config, RunPolicy>();

/** No decision error is ever charged: every failure releases the hold. */
const NEVER = () => false;

function policyFor(config: Config): RunPolicy {
  let policy = policies.get(config);
  if (!policy) {
    policy = {
      deadlineMs: config.decision.timeout_ms,
      deadlineKind: 'upstream_timeout',
      keepsHold: NEVER,
    };
    policies.set(config, policy);
  }
  return policy;
}

/** Runs an admitted decision: the actor owns its life; this supplies the work. */
export function runDecision(
  gateway: DecisionContext,
  admission: DecisionAdmission,
  decision: DecisionRequest,
): Promise<RunResult<DecisionSuccess>> {
  return admission.actor.run(
    () => decisionWork(gateway, admission, decision),
    null,
    policyFor(gateway.config),
  );
}

/** The question to the model: deterministic (temperature 0, a seed where the model takes one). */
function providerRequestFor(
  decision: DecisionRequest,
  prompt: DecisionPrompt,
  promptTokens: number,
  answerTokens: number,
): ProviderRequest {
  return {
    model: decision.model.upstream_model ?? decision.modelId,
    messages: prompt.messages,
    maxOutputTokens: answerTokens,
    temperature: 0,
    topP: null,
    topK: null,
    seed: decision.model.seed ? 0 : null,
    stop: null,
    tools: prompt.tools,
    toolChoice: prompt.toolChoice,
    promptTokens: promptTokens,
    stream: false,
  };
}

/**
 * Ask, check, ask once more if the answer was not valid; charge a 200 only (the wallet or credits
 * that were held, at actual tokens).
 */
async function decisionWork(
  gateway: DecisionContext,
  admission: DecisionAdmission,
  decision: DecisionRequest,
): Promise<Completion<DecisionSuccess>> {
  const { actor, prompt } = admission;
  const hold = actor.init.hold;
  const request = providerRequestFor(
    decision,
    prompt,
    admission.promptTokens,
    admission.answerTokens,
  );
  let promptTokens = 0;
  let completionTokens = 0;
  let answers: Record<string, Answer> | null = null;
  for (let attempt = 0; attempt <= ANSWER_RETRIES && answers === null; attempt++) {
    const reply = await askOnce(
      gateway,
      decision,
      request,
      actor.signal,
      actor.init.keyId,
      actor.attempts,
    );
    promptTokens += reply.promptTokens;
    completionTokens += reply.completionTokens;
    answers = readAnswers(reply.raw, decision.questions);
    if (answers === null) {
      actor.logger.warn(
        { attempt },
        'decision: the model answered outside the allowed labels or levels',
      );
    }
  }
  if (actor.signal.aborted) throw actor.signal.reason;
  if (answers === null) {
    throw new GatewayError(
      'upstream_invalid_response',
      'The model did not give a valid answer for every question, twice.',
    );
  }
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
  return {
    value: { answers, usage, charged: charge },
    usage,
    charge,
    // The day's budget counts what was charged: past the hold (a second ask), the estimate.
    budgetSpendMicro: Math.min(costCreditsMicro, admission.estimateMicro),
    answers: recordedAnswers(answers),
  };
}

/**
 * The labels and levels a decision's record keeps for its lookup, all its answers together. A
 * label or level has no length of its own (only the input's 32,000 tokens bound it), and a record
 * lives in memory and in the log: 64 levels of 13,000 characters each made records of 0.84 MB,
 * 100,000 of them per key.
 */
const RECORD_ANSWER_CHARS_MAX = 4_096;
/** No answer of a record is cut shorter than this. */
const RECORD_ANSWER_CHARS_MIN = 32;

/**
 * The answers as the record keeps them: whole when their labels and levels fit
 * RECORD_ANSWER_CHARS_MAX together, else each cut to its share of it, marked with "…" (the 200
 * answered them whole).
 */
function recordedAnswers(answers: Record<string, Answer>): Record<string, Answer> {
  const entries = Object.entries(answers);
  let chars = 0;
  for (const [, answer] of entries)
    chars += answer.type === 'choice' ? answer.label.length : answer.level.length;
  if (chars <= RECORD_ANSWER_CHARS_MAX) return answers;
  const share = Math.max(
    RECORD_ANSWER_CHARS_MIN,
    Math.floor(RECORD_ANSWER_CHARS_MAX / entries.length),
  );
  const cut = (text: string) => {
    if (text.length <= share) return text;
    // Not between the halves of a surrogate pair: a lone half is JSON some decoders refuse.
    let end = share - 1;
    if ((text.charCodeAt(end - 1) & 0xfc00) === 0xd800) end--;
    return `${text.slice(0, end)}…`;
  };
  // fromEntries: a question id such as "__proto__" stays an own key (CONTRACT §8).
  return Object.fromEntries(
    entries.map(([id, answer]): [string, Answer] => [
      id,
      answer.type === 'choice'
        ? { type: 'choice', label: cut(answer.label) }
        : { type: 'score', score: answer.score, level: cut(answer.level) },
    ]),
  );
}
