// The count worker's jobs: a large request's fingerprint and prompt tokens, computed in steps it can pause between.
import type { Question } from '../decision/model.ts';
import { buildPrompt, type DecisionPrompt } from '../decision/prompt.ts';
import { requestFingerprint } from '../idempotency/fingerprint.ts';
import type { ProviderMessage } from '../providers/provider.ts';
import { countPromptTokensSteps, countTextsSteps } from './tokens.ts';

/** One request's work. Everything in it crosses to the worker by structured clone (strings copy at ~0.1 ms a MB). */
export interface CountJob {
  /** The request body as sent, when the job needs it parsed: for the fingerprint, the tools, a decision's state. */
  body: string | null;
  /** Fingerprint the body as an Idempotency-Key binding does (`POST`, this path, canonical JSON); null: no fingerprint. */
  fingerprintPath: string | null;
  /** A prompt to count: its messages, and its tools serialized already or to take from the body. */
  prompt: { messages: ProviderMessage[]; toolsJson: string | null; toolsInBody: boolean; limit: number } | null;
  /** A decision prompt to build from the body's state and questions, then count. */
  decision: { questions: Array<[string, Question]>; useTools: boolean; limit: number } | null;
  /** Texts an upstream answered without usage, counted together up to `limit` (then possibly partial). */
  answer?: { texts: string[]; limit: number } | null;
}

export interface CountResult {
  fingerprint: string | null;
  /** The prompt's tokens; past `limit` possibly a partial count (more than `limit`); -1 when nothing was counted. */
  tokens: number;
  /** Each message content's count, or -1 (see countPromptTokensSteps): the event loop caches them. */
  contentCounts: number[] | null;
  /** A decision's prompt (the caller asks the model with it). */
  prompt: DecisionPrompt | null;
}

/**
 * Runs a job; each `yield` is a point where the worker may hand the thread to another key's job. The
 * steps are what the event loop would have done (parse, fingerprint, build, count), with the same code.
 */
export function runCountJob(job: CountJob): Generator<void, CountResult> {
  if (job.answer) return answerSteps(job.answer.texts, job.answer.limit);
  // The job's fields as the steps' own variables, so that a paused job lets go of its body once parsed.
  return countSteps(job.body, job.fingerprintPath, job.prompt, job.decision);
}

function* answerSteps(texts: string[], limit: number): Generator<void, CountResult> {
  const tokens = yield* countTextsSteps(texts, limit);
  return { fingerprint: null, tokens, contentCounts: null, prompt: null };
}

function* countSteps(
  bodyText: string | null,
  fingerprintPath: string | null,
  prompt: CountJob['prompt'],
  decision: CountJob['decision'],
): Generator<void, CountResult> {
  // The body parsed here is the body parsed on the event loop (same text, same parser), so its canonical
  // JSON, its tools and its state are the same too.
  let body: any = null;
  if (bodyText !== null) {
    body = JSON.parse(bodyText);
    bodyText = null;
    yield;
  }
  let fingerprint: string | null = null;
  if (fingerprintPath !== null) {
    fingerprint = requestFingerprint('POST', fingerprintPath, body);
    yield;
  }
  if (prompt !== null) {
    // As validateChatRequest: a non-empty tools array of the body is the request's tools.
    const toolsJson = prompt.toolsInBody ? JSON.stringify(body.tools) : prompt.toolsJson;
    body = null;
    const contentCounts: number[] = [];
    const tokens = yield* countPromptTokensSteps(prompt.messages, toolsJson, prompt.limit, contentCounts);
    return { fingerprint, tokens, contentCounts, prompt: null };
  }
  if (decision !== null) {
    const built = buildPrompt(body.state, decision.questions, decision.useTools);
    body = null;
    yield;
    const toolsJson = built.tools && built.tools.length > 0 ? JSON.stringify(built.tools) : null;
    const tokens = yield* countPromptTokensSteps(built.messages, toolsJson, decision.limit);
    return { fingerprint, tokens, contentCounts: null, prompt: built };
  }
  return { fingerprint, tokens: -1, contentCounts: null, prompt: null };
}
