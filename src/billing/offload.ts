// Admission's inputs (fingerprint, prompt tokens): measured on the event loop when cheap, else by
// the count worker after the cheap refusals.
import type { ChatRequest } from '../chat/model.ts';
import type { DecisionRequest } from '../decision/model.ts';
import { buildPrompt, type DecisionPrompt } from '../decision/prompt.ts';
import { type Gateway, statusUrl } from '../gateway.ts';
import { requestFingerprint } from '../idempotency/fingerprint.ts';
import { checkIdempotency } from '../idempotency/store.ts';
import type { KeyAccount } from '../state/apply.ts';
import { GatewayError } from '../util/errors.ts';
import { ignore } from '../util/promise.ts';
import type { CountJob, CountResult } from './count-jobs.ts';
import { CountPool } from './count-pool.ts';
import {
  countPromptTokensInline,
  countTextsSteps,
  INLINE_TEXT_CHARS_MAX,
  rememberPromptTextTokens,
  runSteps,
  settledPrefixLength,
} from './tokens.ts';

/**
 * Bodies longer than this are fingerprinted (and their tools serialized, a decision's state made
 * canonical) by the worker. Canonical JSON and SHA-256 of a 4 MB body took 80–250 ms on the event
 * loop depending on its shape; of 128 KiB they take at most ~8 ms.
 */
export const OFFLOAD_BODY_CHARS = 128 * 1024;
/** One worker: this host has 2 cores, one for the event loop and one for counting. */
const COUNT_JOBS_MAX = 128;
/** A key's large requests waiting or being counted; the next is refused (429) until one is done. */
const COUNT_KEY_JOBS_MAX = 8;
/** No slice runs this long (a step is ≤ ~250 ms): a worker that has not answered is stuck. */
const COUNT_SLICE_DEADLINE_MS = 10_000;

/**
 * The worker's entry. The compiled binary carries it as a second entrypoint of `bun run build`,
 * under its path relative to src/ (the entrypoints' common root), where the module URL of this file
 * does not point.
 */
export const COUNT_WORKER_URL: string | URL = Bun.isStandaloneExecutable
  ? './billing/count-worker.ts'
  : new URL('./count-worker.ts', import.meta.url);

let pool: CountPool<CountJob, CountResult> | null = null;

/** The process's one count pool, started on first use. */
export function countPool(): CountPool<CountJob, CountResult> {
  pool ??= new CountPool({
    workerUrl: COUNT_WORKER_URL,
    jobsMax: COUNT_JOBS_MAX,
    keyJobsMax: COUNT_KEY_JOBS_MAX,
    sliceDeadlineMs: COUNT_SLICE_DEADLINE_MS,
  });
  return pool;
}

export interface Idempotency {
  key: string;
  fingerprint: string;
}

export interface ChatMeasure {
  idempotency: Idempotency | null;
  /** Past the model's window possibly a partial count (the request is refused either way). */
  promptTokens: number;
}

/**
 * A chat request's Idempotency-Key fingerprint and prompt tokens. The usual request (a small body,
 * a prompt the cache mostly knows) is measured here and now, without a promise; a large one off the
 * event loop (CONTRACT §8), so that no key's 4 MB prompt stalls any other key's request.
 */
export function measureChat(
  gateway: Gateway,
  account: KeyAccount,
  chat: ChatRequest,
  body: string,
  json: unknown,
  idempotencyKey: string | null,
  path: string,
  signal: AbortSignal | null,
): ChatMeasure | Promise<ChatMeasure> {
  const limit = chat.model.context_window;
  const small = body.length <= OFFLOAD_BODY_CHARS;
  const fingerprint = small && idempotencyKey ? requestFingerprint('POST', path, json) : null;
  const toolsJson = small && chat.tools ? JSON.stringify(chat.tools) : null;
  const promptTokens = small ? countPromptTokensInline(chat.messages, toolsJson, limit) : null;
  if (promptTokens !== null)
    return {
      idempotency: idempotencyKey ? { key: idempotencyKey, fingerprint: fingerprint! } : null,
      promptTokens,
    };
  return measureChatOffLoop(
    gateway,
    account,
    chat,
    body,
    idempotencyKey,
    fingerprint,
    toolsJson,
    path,
    signal,
  );
}

async function measureChatOffLoop(
  gateway: Gateway,
  account: KeyAccount,
  chat: ChatRequest,
  body: string,
  idempotencyKey: string | null,
  fingerprint: string | null,
  toolsJson: string | null,
  path: string,
  signal: AbortSignal | null,
): Promise<ChatMeasure> {
  const toolsInBody = chat.tools !== null && toolsJson === null;
  const job: CountJob = {
    body: (idempotencyKey && fingerprint === null) || toolsInBody ? body : null,
    fingerprintPath: idempotencyKey && fingerprint === null ? path : null,
    prompt: { messages: chat.messages, toolsJson, toolsInBody, limit: chat.model.context_window },
  };
  const result = await countOffLoop(
    gateway,
    'chat',
    account,
    job,
    idempotencyKey,
    fingerprint,
    signal,
  );
  // The worker's counts of whole texts go to this thread's cache: the next turn of the
  // conversation, or the next request with the same system prompt, is counted here.
  const counts = result.contentCounts!;
  for (let i = 0; i < counts.length; i++) {
    const content = chat.messages[i]!.content;
    if (counts[i]! >= 0 && content) rememberPromptTextTokens(content, counts[i]!);
  }
  return {
    idempotency: idempotencyKey ? { key: idempotencyKey, fingerprint: result.fingerprint! } : null,
    promptTokens: result.tokens,
  };
}

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
  gateway: Gateway,
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
  const job: CountJob = {
    body: null,
    fingerprintPath: withFingerprint ? path : null,
    prompt: null,
    decisionBody: { text, config: { models, tools }, limit: config.decision.context_tokens },
  };
  const result = await countPool().run(job, { keyId: account.id, signal, logger: gateway.logger });
  if (result.error) {
    const { code, message, param, detail } = result.error;
    throw new GatewayError(code, message, { param, ...(detail === undefined ? {} : { detail }) });
  }
  if (gateway.draining)
    throw new GatewayError('service_unavailable', 'The gateway is shutting down; retry shortly.');
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
  gateway: Gateway,
  account: KeyAccount,
  decision: DecisionRequest,
  json: unknown,
  idempotencyKey: string | null,
  path: string,
  signal: AbortSignal | null,
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
  return decisionOffLoop(gateway, account, job, idempotencyKey, fingerprint, prompt, signal);
}

async function decisionOffLoop(
  gateway: Gateway,
  account: KeyAccount,
  job: CountJob,
  idempotencyKey: string | null,
  fingerprint: string | null,
  prompt: DecisionPrompt | null,
  signal: AbortSignal | null,
): Promise<DecisionMeasure> {
  const result = await countOffLoop(
    gateway,
    'decision',
    account,
    job,
    idempotencyKey,
    fingerprint,
    signal,
  );
  return {
    idempotency: idempotencyKey ? { key: idempotencyKey, fingerprint: result.fingerprint! } : null,
    prompt: prompt ?? result.prompt!,
    promptTokens: result.tokens,
  };
}

/**
 * Tokens of the texts an upstream answered without reporting usage (the answer's text, each tool
 * call's name and arguments), counted up to `limit` (the output cap: a charge never exceeds the
 * hold, so more precision buys nothing). A short answer is counted here; a long one (an upstream
 * may send up to limits.max_upstream_body_bytes) by the count worker in the key's turn, as admitted
 * work the pool never refuses (a full queue of the key's own large prompts does not put it back on
 * the event loop).
 */
export function countAnswerTokens(
  keyId: string,
  texts: string[],
  limit: number,
  signal: AbortSignal | null,
  logger: Gateway['logger'],
): number | Promise<number> {
  let chars = 0;
  for (const text of texts) chars += text.length;
  if (chars <= INLINE_TEXT_CHARS_MAX) return countTextsNow(texts, limit);
  const job: CountJob = {
    body: null,
    fingerprintPath: null,
    prompt: null,
    answer: { texts, limit },
  };
  const owner = { keyId, signal, logger };
  // Admitted work: never refused for room. A worker lost while counting it (503) gets one more try
  // in the next worker, then the count is made here: the answer was served and must be billed.
  const counted = (retry: boolean): Promise<number> =>
    countPool()
      .run(job, owner, true)
      .then(
        (result) => result.tokens,
        (error: unknown) => {
          if (!(error instanceof GatewayError && error.code === 'service_unavailable')) throw error;
          return retry ? counted(false) : countTextsNow(texts, limit);
        },
      );
  return counted(true);
}

function countTextsNow(texts: string[], limit: number): number {
  return runSteps(countTextsSteps(texts, limit));
}

/** A streamed answer's text is counted in parts past this many characters instead of kept whole. */
const STREAMED_TEXT_KEPT_CHARS = 256 * 1024;

/**
 * A streamed answer's text (or one tool call's name and arguments), kept only to be counted should
 * the provider not report usage. Past STREAMED_TEXT_KEPT_CHARS its settled prefix is counted by the
 * count worker and let go, so a stream whose client stopped reading, or an answer of 16 MiB, holds
 * a few hundred KB here rather than all it relayed; the parts add up to exactly the whole text's
 * count.
 */
export class StreamedText {
  private pieces: string[] = [];
  private chars = 0;
  private readonly counted: Array<Promise<number>> = [];
  /**
   * Tokens of the parts counted so far; past `limit` the rest is not kept (the count is then
   * partial, as countAnswerTokens').
   */
  private countedTokens = 0;
  /**
   * Cancels the counts of parts when they are not needed (the provider reported usage, or the run
   * ended).
   */
  private readonly abandon = new AbortController();

  constructor(
    private readonly keyId: string,
    /** The output cap: a charge never passes the hold, so counting past it buys nothing. */
    private readonly limit: number,
    private readonly logger: Gateway['logger'],
  ) {}

  append(text: string): void {
    if (text.length === 0 || this.countedTokens > this.limit) return;
    this.pieces.push(text);
    this.chars += text.length;
    if (this.chars > STREAMED_TEXT_KEPT_CHARS) this.spill();
  }

  private spill(): void {
    const text = this.pieces.join('');
    const cut = settledPrefixLength(text);
    this.pieces = [cut === 0 ? text : text.slice(cut)];
    this.chars = this.pieces[0]!.length;
    if (cut === 0) return;
    const count = Promise.resolve(
      countAnswerTokens(
        this.keyId,
        [text.slice(0, cut)],
        Number.POSITIVE_INFINITY,
        this.abandon.signal,
        this.logger,
      ),
    );
    // Awaited only if needed; a part cancelled meanwhile must not be an unhandled rejection.
    count.then((tokens) => (this.countedTokens += tokens), ignore);
    this.counted.push(count);
  }

  /** Tokens of everything appended (past the limit: a count past it, possibly partial). */
  async tokens(): Promise<number> {
    let total = 0;
    for (const part of this.counted) total += await part;
    if (total > this.limit) return total;
    return (
      total +
      (await countAnswerTokens(
        this.keyId,
        [this.pieces.join('')],
        this.limit - total,
        this.abandon.signal,
        this.logger,
      ))
    );
  }

  /** The count is not needed: parts still queued are dropped. */
  discard(): void {
    this.abandon.abort();
  }
}

/**
 * Runs `job` on the count worker, after the checks the contract puts before context (a bound
 * Idempotency-Key: 409; the key's rate limit: 429) have had their chance to answer without
 * counting. Those are looked at only (no rate token taken, nothing bound): admission checks them
 * again, for real, in one synchronous step with the count in hand.
 */
async function countOffLoop(
  gateway: Gateway,
  service: 'chat' | 'decision',
  account: KeyAccount,
  job: CountJob,
  idempotencyKey: string | null,
  fingerprint: string | null,
  signal: AbortSignal | null,
): Promise<CountResult> {
  const owner = { keyId: account.id, signal, logger: gateway.logger };
  const { config, store, registry } = gateway;
  if (idempotencyKey && store.state.binding(account.id, idempotencyKey, Date.now())) {
    // The answer is a 409 of some kind; which one depends on the fingerprint alone.
    fingerprint ??= (
      await countPool().run(
        { body: job.body, fingerprintPath: job.fingerprintPath, prompt: null },
        owner,
      )
    ).fingerprint!;
    job = { ...job, body: job.prompt?.toolsInBody ? job.body : null, fingerprintPath: null };
    checkIdempotency(
      store.state,
      registry,
      account.id,
      idempotencyKey,
      fingerprint,
      Date.now(),
      (id) => statusUrl(config, service, id),
    );
  }
  gateway.rateLimiter.peek(
    account.id,
    account.rateLimitRpm ?? config.limits.default_rate_limit_rpm,
    Date.now(),
  );
  const result = await countPool().run(job, owner);
  if (gateway.draining)
    throw new GatewayError('service_unavailable', 'The gateway is shutting down; retry shortly.');
  result.fingerprint ??= fingerprint;
  return result;
}
