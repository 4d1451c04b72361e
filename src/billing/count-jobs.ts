// The count worker's jobs: a large request's fingerprint and prompt tokens, an answer's tokens,
// computed in steps it can pause between. A large decision body is decision/count-job.ts's.
import { requestFingerprint } from '../idempotency/fingerprint.ts';
import type { ProviderMessage } from '../providers/provider.ts';
import { type ErrorCode, GatewayError } from '../util/errors.ts';
import { countPromptTokensSteps, countTextsSteps } from './tokens.ts';

/**
 * One request's work. Everything in it crosses to the worker by structured clone (strings copy at
 * ~0.1 ms a MB).
 */
export interface CountJob {
  /**
   * The request body as sent, when the job needs it parsed: for the fingerprint, the tools, a
   * decision's state.
   */
  body: string | null;
  /**
   * Fingerprint the body as an Idempotency-Key binding does (`POST`, this path, canonical JSON);
   * null: no fingerprint.
   */
  fingerprintPath: string | null;
  /** A prompt to count: its messages, and its tools serialized already or to take from the body. */
  prompt: {
    messages: ProviderMessage[];
    toolsJson: string | null;
    toolsInBody: boolean;
    limit: number;
  } | null;
  /**
   * Texts an upstream answered without usage, counted together up to `limit` (then possibly
   * partial).
   */
  answer?: { texts: string[]; limit: number } | null;
}

/** An operating error found in the worker, to be thrown again on the event loop. */
export interface CountError {
  code: ErrorCode;
  message: string;
  param: string | null;
  detail?: string;
}

export interface CountResult {
  fingerprint: string | null;
  /**
   * The prompt's tokens; past `limit` possibly a partial count (more than `limit`); -1 when nothing
   * was counted.
   */
  tokens: number;
  /**
   * Each message content's count, or -1 (see countPromptTokensSteps): the event loop caches them.
   */
  contentCounts: number[] | null;
}

/**
 * Runs a job; each `yield` is a point where the worker may hand the thread to another key's job.
 * The steps are what the event loop would have done (parse, fingerprint, build, count), with the
 * same code.
 */
export function runCountJob(job: CountJob): Generator<void, CountResult> {
  if (job.answer) return answerSteps(job.answer.texts, job.answer.limit);
  // The job's fields as the steps' own variables, so that a paused job lets go of its body once
  // parsed.
  return countSteps(job.body, job.fingerprintPath, job.prompt);
}

function* answerSteps(texts: string[], limit: number): Generator<void, CountResult> {
  const tokens = yield* countTextsSteps(texts, limit);
  return { fingerprint: null, tokens, contentCounts: null };
}

/** A job's operating error (a GatewayError) as the worker sends it back; anything else is a bug. */
export function countError(error: unknown): CountError {
  if (!(error instanceof GatewayError)) throw error;
  return {
    code: error.code,
    message: error.message,
    param: error.param,
    ...(error.detail === undefined ? {} : { detail: error.detail }),
  };
}

function* countSteps(
  bodyText: string | null,
  fingerprintPath: string | null,
  prompt: CountJob['prompt'],
): Generator<void, CountResult> {
  // The body parsed here is the body parsed on the event loop (same text, same parser), so its
  // canonical JSON, its tools and its state are the same too.
  // biome-ignore lint/suspicious/noExplicitAny: the body was validated on the event loop already.
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
    const tokens = yield* countPromptTokensSteps(
      prompt.messages,
      toolsJson,
      prompt.limit,
      contentCounts,
    );
    return { fingerprint, tokens, contentCounts };
  }
  return { fingerprint, tokens: -1, contentCounts: null };
}
