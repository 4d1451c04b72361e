// Counting off the event loop: the process's count pool, admission's large measurements after the
// cheap refusals (chat/measure.ts, decision/measure.ts use it), and an answer's tokens.
import type { Config } from '../config/model.ts';
import { checkIdempotency } from '../idempotency/store.ts';
import type { RateLimiter } from '../keys/rate-limit.ts';
import type { ActorRegistry } from '../requests/registry.ts';
import type { GatewayState, KeyAccount } from '../state/apply.ts';
import type { Service } from '../state/events.ts';
import { RunAbort, type RunSignal } from '../util/abort.ts';
import { GatewayError } from '../util/errors.ts';
import type { Logger } from '../util/log.ts';
import { ignore } from '../util/promise.ts';
import type { CountJob, CountResult } from './count-jobs.ts';
import { CountPool } from './count-pool.ts';
import { countTextsSteps, INLINE_TEXT_CHARS_MAX, runSteps, settledPrefixLength } from './tokens.ts';

/**
 * Bodies longer than this are fingerprinted (and their tools serialized, a decision's state made
 * canonical) by the worker. Canonical JSON and SHA-256 of a 4 MB body took 80–250 ms on the event
 * loop depending on its shape; of 128 KiB they take at most ~8 ms.
 */
export const OFFLOAD_BODY_CHARS = 128 * 1024;
/** One worker: this host has 2 cores, one for the event loop and one for counting. */
const COUNT_JOBS_MAX = 128;
/**
 * A key's large requests waiting or being counted; the next is refused (429) until one is done.
 * This bounds the bodies one key keeps in memory while they wait (32 × 4 MB), not other keys'
 * latency: the pool gives keys their slices in turn however long a key's queue is. At 8, a burst
 * of a dozen large requests from one key had some answered 429 where the contract's check order
 * gives every one its own answer (402 for a key with no credit, 409 for a repeated
 * Idempotency-Key): a client's ordinary burst is under this bound.
 */
export const COUNT_KEY_JOBS_MAX = 32;
/** No slice runs this long (a step is ≤ ~250 ms): a worker that has not answered is stuck. */
const COUNT_SLICE_DEADLINE_MS = 10_000;

/**
 * The worker's entry (src/count-worker.ts: it runs every domain's jobs, so it sits at the top). The
 * compiled binary carries it as a second entrypoint of `bun run build`, under its path relative to
 * src/ (the entrypoints' common root), where the module URL of this file does not point.
 */
export const COUNT_WORKER_URL: string | URL = Bun.isStandaloneExecutable
  ? './count-worker.ts'
  : new URL('../count-worker.ts', import.meta.url);

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

/**
 * What counting off the event loop needs of the gateway. The Gateway has these fields; billing
 * names them instead of importing gateway.ts, which sits above it.
 */
export interface OffloadHost {
  readonly config: Config;
  readonly logger: Logger;
  readonly draining: boolean;
  readonly store: { readonly state: GatewayState };
  readonly registry: ActorRegistry;
  readonly rateLimiter: Pick<RateLimiter, 'peek'>;
}

/** The 503 for work a count finished after shutdown began. */
export function drainingError(): GatewayError {
  return new GatewayError('service_unavailable', 'The gateway is shutting down; retry shortly.');
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
  signal: RunSignal | null,
  logger: Logger,
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

/** Why a StreamedText's counts are abandoned; nothing reads it (the pool has its own error). */
const DISCARDED = new Error('the count was not needed');

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
   * ended). A RunAbort, not an AbortController: every stream makes one and discards it, and an
   * AbortController's make and abort were ~5 µs of a 20-chunk stream's ~150 (util/abort.ts).
   */
  private readonly abandon = new RunAbort();

  constructor(
    private readonly keyId: string,
    /** The output cap: a charge never passes the hold, so counting past it buys nothing. */
    private readonly limit: number,
    private readonly logger: Logger,
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
        this.abandon,
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
        this.abandon,
        this.logger,
      ))
    );
  }

  /** The count is not needed: parts still queued are dropped. */
  discard(): void {
    this.abandon.abort(DISCARDED);
  }
}

/**
 * Runs `job` on the count worker, after the checks the contract puts before context (a bound
 * Idempotency-Key: 409 naming `statusUrl` of the original; the key's rate limit: 429) have had
 * their chance to answer without counting. Those are looked at only (no rate token taken, nothing
 * bound): admission checks them again, for real, in one synchronous step with the count in hand.
 */
export async function countOffLoop(
  gateway: OffloadHost,
  service: Service,
  statusUrl: (requestId: string) => string,
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
      service,
      account.id,
      idempotencyKey,
      fingerprint,
      Date.now(),
      statusUrl,
    );
  }
  gateway.rateLimiter.peek(
    account.id,
    account.rateLimitRpm ?? config.limits.default_rate_limit_rpm,
    Date.now(),
  );
  const result = await countPool().run(job, owner);
  if (gateway.draining) throw drainingError();
  result.fingerprint ??= fingerprint;
  return result;
}
