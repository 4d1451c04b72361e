// Chat requests: admission (idempotency, rate, context, quota), the hold, and the actor's run loop.
import { countAnswerTokens, StreamedText } from '../billing/offload.ts';
import { chargeMicro, reservationMicro } from '../billing/pricing.ts';
import { actorSettled, type Gateway, statusUrl } from '../gateway.ts';
import { checkIdempotency } from '../idempotency/store.ts';
import {
  collectAnswer,
  type Delta,
  type ProviderRequest,
  type ToolCall,
} from '../providers/provider.ts';
import {
  abortError,
  abortOnTimer,
  notRecordedError,
  type Outcome,
  RequestActor,
  statusForAbort,
} from '../requests/actor.ts';
import type { KeyAccount } from '../state/apply.ts';
import type { Event, Usage } from '../state/events.ts';
import { assert } from '../util/assert.ts';
import { GatewayError, internalError } from '../util/errors.ts';
import { RESOLVED } from '../util/promise.ts';
import { TextBuilder } from '../util/text-builder.ts';
import type { ChatRequest } from './model.ts';
import type { PublicFinishReason } from './stream.ts';

export interface Admission {
  actor: RequestActor;
  providerRequest: ProviderRequest;
  /** Resolves when the hold (and the Idempotency-Key binding) is durable. */
  durable: Promise<void>;
  createdS: number;
  createdMs: number;
}

export interface Idempotency {
  key: string;
  fingerprint: string;
}

/**
 * Runs the checks after shape and model, in the contract's order (idempotency → rate → context →
 * quota), then places the hold and binds the Idempotency-Key in one event. Everything from the
 * first check to the commit is synchronous, so two identical requests can never both pass.
 */
export function admitChat(
  gateway: Gateway,
  account: KeyAccount,
  requestId: string,
  chat: ChatRequest,
  idempotency: Idempotency | null,
  promptTokens: number,
): Admission {
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
      (id) => statusUrl(config, 'chat', id),
    );
  }
  gateway.rateLimiter.take(
    account.id,
    account.rateLimitRpm ?? config.limits.default_rate_limit_rpm,
    nowMs,
  );

  const { model } = chat;
  if (promptTokens > model.context_window) {
    throw new GatewayError(
      'context_length_exceeded',
      `This model's context window is ${model.context_window} tokens; the messages have more.`,
      { param: 'messages' },
    );
  }
  if (
    chat.maxOutputTokens !== null &&
    (chat.maxOutputTokens > model.max_output_tokens ||
      promptTokens + chat.maxOutputTokens > model.context_window)
  ) {
    throw new GatewayError(
      'context_length_exceeded',
      `The output limit ${chat.maxOutputTokens} is too large: this model allows ` +
        `${model.max_output_tokens} output tokens and ${model.context_window} in all (the ` +
        `messages have ${promptTokens}).`,
      { param: 'max_completion_tokens' },
    );
  }
  const outputCapTokens = chat.maxOutputTokens ?? model.max_output_tokens;
  const holdMicro = reservationMicro(model, promptTokens, outputCapTokens);
  if (holdMicro > account.balanceMicro) {
    throw new GatewayError(
      'insufficient_quota',
      `The balance of ${account.balanceMicro / 1e6} credits cannot cover this request's ` +
        `reservation of ${holdMicro / 1e6} credits.`,
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
      service: 'chat',
      model: chat.modelId,
      stream: chat.stream,
      hold: { credits_micro: holdMicro, tokens: 0 },
      idempotency: idempotency
        ? {
            key: idempotency.key,
            fingerprint: idempotency.fingerprint,
            expires_at_ms: nowMs + config.idempotency_ttl_s * 1000,
          }
        : null,
      budget_hold_micro: 0,
      at_ms: nowMs,
    },
  ];
  // A stream names its id in its first chunk and an Idempotency-Key makes it findable: those starts
  // are logged now (overlapping the provider call). A plain non-stream call's id is first seen with
  // its answer, so its start goes to the log with its finish, sparing a separate fsync.
  let durable: Promise<void> = RESOLVED;
  if (chat.stream || idempotency) durable = store.commit(started);
  else store.applyUnlogged(requestId, started);
  const actor = new RequestActor(
    {
      id: requestId,
      keyId: account.id,
      service: 'chat',
      model: chat.modelId,
      stream: chat.stream,
      hold: { credits_micro: holdMicro, tokens: 0 },
    },
    store,
    actorSettled(gateway),
    gateway.logger,
  );
  actor.started(durable);
  registry.add(actor);
  const body = chat.body;
  const providerRequest: ProviderRequest = {
    model: model.upstream_model ?? chat.modelId,
    messages: chat.messages,
    maxOutputTokens: chat.maxOutputTokens,
    temperature: body.temperature ?? null,
    topP: body.top_p ?? null,
    topK: model.top_k ? (body.top_k ?? null) : null,
    seed: model.seed ? (body.seed ?? null) : null,
    stop: chat.stop,
    tools: chat.tools,
    toolChoice: chat.toolChoice,
    promptTokens,
    stream: chat.stream,
  };
  return { actor, providerRequest, durable, createdS: Math.floor(nowMs / 1000), createdMs: nowMs };
}

/**
 * Whether a failed chat call is the provider's failure (its hold may be kept), not the gateway's
 * own.
 */
function chargedOnError(error: GatewayError): boolean {
  return error.status === 502 || error.status === 504 || error.code === 'context_length_exceeded';
}

/** Where the run loop sends what it produces: an SSE stream or a collected completion. */
export interface ChatSink {
  /** The first output is ready (the hold is durable): the sink may commit to a 200. */
  begin(): void | Promise<void>;
  text(text: string): void | Promise<void>;
  toolCall(
    index: number,
    id: string | null,
    name: string | null,
    args: string,
  ): void | Promise<void>;
  /** The terminal state is durable; `result` is what the caller gets. */
  end(result: ChatResult): void;
}

export type ChatResult =
  | {
      ok: true;
      content: string | null;
      toolCalls: ToolCall[];
      finishReason: PublicFinishReason;
      usage: Usage;
    }
  | { ok: false; error: GatewayError };

/**
 * What the provider said so far: text, tool calls (checked as they build up) and the finish. Text
 * is gathered in a TextBuilder, not with `+=`: an upstream may send a million one-character deltas
 * (up to limits.max_upstream_body_bytes), and a rope of that many nodes is hundreds of MB.
 */
class Answer {
  private readonly textParts = new TextBuilder();
  sawText = false;
  private readonly calls: ToolCall[] = [];
  private readonly callArguments: TextBuilder[] = [];
  finish: Extract<Delta, { type: 'finish' }> | null = null;
  /**
   * A stream keeps its text (and each tool call's name and arguments) only to count it, should the
   * provider report no usage; relayed already, it is counted in parts as it goes (StreamedText), so
   * a client that stops reading, or an answer of 16 MiB, does not hold all of it here.
   */
  private readonly streamedText: StreamedText | null;
  private readonly streamedCalls: StreamedText[] = [];

  constructor(
    private readonly streamed: { keyId: string; limit: number; logger: Gateway['logger'] } | null,
  ) {
    this.streamedText =
      streamed && new StreamedText(streamed.keyId, streamed.limit, streamed.logger);
  }

  /** The answer's text (a stream's was relayed and is not kept: empty). */
  get text(): string {
    return this.textParts.build();
  }

  /**
   * The tool calls with their arguments joined (call once, at the end; a stream's arguments were
   * relayed, not kept).
   */
  toolCalls(): ToolCall[] {
    if (this.streamed === null)
      for (let i = 0; i < this.calls.length; i++)
        this.calls[i]!.function.arguments = this.callArguments[i]!.build();
    return this.calls;
  }

  /**
   * Completion tokens counted from what the provider sent, up to `limit` (see countAnswerTokens).
   */
  countTokens(
    keyId: string,
    limit: number,
    signal: AbortSignal,
    logger: Gateway['logger'],
  ): number | Promise<number> {
    if (this.streamedText !== null) return this.countStreamed();
    return countAnswerTokens(
      keyId,
      [this.text, ...this.toolCalls().map((call) => call.function.name + call.function.arguments)],
      limit,
      signal,
      logger,
    );
  }

  private async countStreamed(): Promise<number> {
    let total = await this.streamedText!.tokens();
    for (const call of this.streamedCalls) total += await call.tokens();
    return total;
  }

  /**
   * The counts are not needed any more (usage came, or the run ended): queued parts are dropped.
   */
  discard(): void {
    this.streamedText?.discard();
    for (const call of this.streamedCalls) call.discard();
  }

  /**
   * Takes one delta and relays it to `sink` (when streaming); returns the sink's backpressure, if
   * any.
   */
  add(delta: Delta, sink: ChatSink | null): void | Promise<void> {
    switch (delta.type) {
      case 'text':
        if (delta.text.length === 0) return;
        if (this.streamedText !== null) this.streamedText.append(delta.text);
        else this.textParts.append(delta.text);
        this.sawText = true;
        return sink?.text(delta.text);
      case 'tool_call': {
        let args = this.callArguments[delta.index];
        if (!args) {
          if (delta.index !== this.calls.length || delta.id === null || delta.name === null) {
            throw new GatewayError(
              'upstream_invalid_response',
              'The provider sent a malformed tool call.',
            );
          }
          this.calls.push({
            id: delta.id,
            type: 'function',
            function: { name: delta.name, arguments: '' },
          });
          args = new TextBuilder();
          this.callArguments.push(args);
          if (this.streamed !== null) {
            const counted = new StreamedText(
              this.streamed.keyId,
              this.streamed.limit,
              this.streamed.logger,
            );
            counted.append(delta.name);
            this.streamedCalls.push(counted);
          }
        }
        if (this.streamed !== null) this.streamedCalls[delta.index]!.append(delta.arguments);
        else args.append(delta.arguments);
        return sink?.toolCall(delta.index, delta.id, delta.name, delta.arguments);
      }
      case 'finish':
        this.finish = delta;
        return;
    }
  }
}

/**
 * The actor's run loop: calls the provider, relays deltas to the sink (a stream; null for a
 * collected answer), enforces the time limit, and in `finally` settles the hold (completed),
 * releases it (cancelled) or keeps it per billing.on_error. Resolves with what the caller gets,
 * once it is durable.
 */
export async function runChat(
  gateway: Gateway,
  admission: Admission,
  chat: ChatRequest,
  sink: ChatSink | null,
): Promise<ChatResult> {
  const { actor, providerRequest, durable } = admission;
  const { config } = gateway;
  const provider = gateway.providers.get(chat.model.provider);
  assert(provider, `no provider ${chat.model.provider}`);
  const timer = setTimeout(
    abortOnTimer,
    chat.stream ? config.limits.stream_timeout_ms : config.limits.upstream_timeout_ms,
    actor,
    chat.stream ? 'stream_timeout' : 'upstream_timeout',
  );

  const outputCapTokens = chat.maxOutputTokens ?? chat.model.max_output_tokens;
  const answer = new Answer(
    sink !== null
      ? { keyId: actor.init.keyId, limit: outputCapTokens, logger: gateway.logger }
      : null,
  );
  let outcome: Outcome | null = null;
  let result: ChatResult;
  const hold = actor.init.hold;

  try {
    if (sink !== null) {
      let began = false;
      for await (const delta of provider.stream(providerRequest, actor.signal)) {
        if (!began) {
          // The hold must be durable before anything reaches the client; the provider call
          // overlapped it.
          await durable;
          began = true;
          gateway.metrics.firstToken(chat.modelId, (Date.now() - admission.createdMs) / 1000);
          await sink.begin();
        }
        if (actor.signal.aborted) break;
        const written = answer.add(delta, sink);
        if (written) {
          // The sink is full (a client that is behind): the upstream waits here. An abort wakes
          // this wait (the sink listens to the signal), and the run ends now, without asking the
          // provider again.
          await written;
          if (actor.signal.aborted) break;
        }
      }
      if (actor.signal.aborted) throw actor.signal.reason;
      if (!began) {
        await durable;
        await sink.begin();
      }
    } else {
      // Nothing to relay before the end: the provider's whole answer, then one reply.
      const deltas = await collectAnswer(provider, providerRequest, actor.signal);
      if (actor.signal.aborted) throw actor.signal.reason;
      await durable;
      gateway.metrics.firstToken(chat.modelId, (Date.now() - admission.createdMs) / 1000);
      for (const delta of deltas) answer.add(delta, null);
    }
    const { text, finish } = answer;
    const toolCalls = answer.toolCalls();
    if (!finish)
      throw new GatewayError(
        'upstream_invalid_response',
        'The provider ended without finishing its answer.',
      );
    const promptTokens = finish.usage?.promptTokens ?? providerRequest.promptTokens;
    const completionTokens =
      finish.usage?.completionTokens ??
      (await answer.countTokens(actor.init.keyId, outputCapTokens, actor.signal, gateway.logger));
    const usage: Usage = {
      prompt_tokens: promptTokens,
      completion_tokens: completionTokens,
      total_tokens: promptTokens + completionTokens,
    };
    outcome = {
      status: 'completed',
      error: null,
      usage,
      charge: {
        credits_micro: chargeMicro(chat.model, promptTokens, completionTokens, hold.credits_micro),
        tokens: 0,
      },
      budgetSpendMicro: 0,
      answers: null,
      httpStatus: 200,
    };
    const finishReason: PublicFinishReason = toolCalls.length > 0 ? 'tool_calls' : 'stop';
    result = (await actor.finish(outcome))
      ? {
          ok: true,
          content: answer.sawText || toolCalls.length === 0 ? text : null,
          toolCalls,
          finishReason,
          usage,
        }
      : { ok: false, error: notRecordedError() };
  } catch (thrown) {
    const kind = actor.abortKind;
    let error: GatewayError;
    if (kind !== null) error = abortError(kind);
    else if (thrown instanceof GatewayError) error = thrown;
    else {
      actor.logger.error({ err: (thrown as Error)?.stack ?? String(thrown) }, 'chat: run failed');
      error = internalError();
    }
    const status = kind !== null ? statusForAbort(kind) : 'error';
    // The hold is kept (billing.on_error "keep") for the provider's failures as the spec lists
    // them: its errors, its validation, its timeouts, the stream's time limit. The gateway's own
    // failures (503: draining, out of resources, its log; 500: a bug; an interrupt) charge nothing.
    const keep =
      status === 'error' &&
      config.billing.on_error === 'keep' &&
      kind !== 'interrupted' &&
      chargedOnError(error);
    outcome = {
      status,
      error,
      usage: null,
      charge: { credits_micro: keep ? hold.credits_micro : 0, tokens: 0 },
      budgetSpendMicro: 0,
      answers: null,
      httpStatus: error.status,
    };
    result = { ok: false, error: (await actor.finish(outcome)) ? error : notRecordedError() };
  } finally {
    clearTimeout(timer);
    answer.discard();
    // Whatever happened above, the hold never outlives the run: an unexpected exit is an error.
    if (!outcome) {
      outcome = {
        status: 'error',
        error: internalError(),
        usage: null,
        charge: { credits_micro: 0, tokens: 0 },
        budgetSpendMicro: 0,
        answers: null,
        httpStatus: 500,
      };
      await actor.finish(outcome);
      result = { ok: false, error: outcome.error! };
    }
  }
  sink?.end(result);
  return result;
}
