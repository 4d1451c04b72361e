// Chat requests: the chat checks of admission (context, quota) and the chat `work` of a run:
// relay the provider's deltas to a stream, or collect them into one answer, and price it.
import { countAnswerTokens, StreamedText } from '../billing/offload.ts';
import { chargeMicro, reservationMicro } from '../billing/pricing.ts';
import type { Config } from '../config/model.ts';
import type { Delta, ProviderRequest, ToolCall } from '../providers/provider.ts';
import type { Router } from '../providers/router.ts';
import type { Completion, RunPolicy, RunResult } from '../requests/actor.ts';
import {
  type Admission,
  type AdmitCommand,
  type AdmitContext,
  admit,
  type Reservation,
} from '../requests/admit.ts';
import type { KeyAccount } from '../state/apply.ts';
import type { Usage } from '../state/events.ts';
import type { ClientConnection, RunSignal } from '../util/abort.ts';
import { GatewayError } from '../util/errors.ts';
import { TextBuilder } from '../util/text-builder.ts';
import type { ChatRequest } from './model.ts';
import type { PublicFinishReason } from './stream.ts';

/** What the chat service uses of the gateway (the Gateway satisfies it). */
export interface ChatContext extends AdmitContext {
  router: Router;
  metrics: AdmitContext['metrics'] & { firstToken(model: string, seconds: number): void };
}

export interface ChatAdmission extends Admission {
  providerRequest: ProviderRequest;
}

export interface Idempotency {
  key: string;
  fingerprint: string;
}

/**
 * Admits a chat request (requests/admit: idempotency, rate, then the checks below, then the hold)
 * or throws its refusal.
 */
export function admitChat(
  gateway: ChatContext,
  account: KeyAccount,
  requestId: string,
  chat: ChatRequest,
  idempotency: Idempotency | null,
  promptTokens: number,
  client: ClientConnection | null,
): ChatAdmission {
  const admission = admit(
    gateway,
    new ChatAdmitCommand(requestId, account, chat, idempotency, promptTokens, client),
  ) as ChatAdmission;
  // The admission is the chat's own from here: its provider request goes on it, not on a copy of
  // it with one field more (an object per request).
  admission.providerRequest = providerRequestFor(chat, promptTokens);
  return admission;
}

/** A chat request's admission: `reserve` is a method, so no closure per request. */
class ChatAdmitCommand implements AdmitCommand {
  readonly service = 'chat';
  readonly model: string;
  readonly stream: boolean;

  constructor(
    readonly requestId: string,
    readonly account: KeyAccount,
    private readonly chat: ChatRequest,
    readonly idempotency: Idempotency | null,
    private readonly promptTokens: number,
    readonly client: ClientConnection | null,
  ) {
    this.model = chat.modelId;
    this.stream = chat.stream;
  }

  reserve(current: KeyAccount): Reservation {
    return reserveChat(this.chat, this.promptTokens, current);
  }
}

/**
 * Context (400), then quota (402): the hold is the prompt and the output cap at the model's rates.
 */
function reserveChat(chat: ChatRequest, promptTokens: number, account: KeyAccount): Reservation {
  const { model } = chat;
  if (promptTokens > model.context_window) {
    throw new GatewayError(
      'context_length_exceeded',
      `This model's context window is ${model.context_window} tokens; the messages have more.`,
      { param: 'messages' },
    );
  }
  const outputMax = chat.maxOutputTokens;
  if (
    outputMax !== null &&
    (outputMax > model.max_output_tokens || promptTokens + outputMax > model.context_window)
  ) {
    throw new GatewayError(
      'context_length_exceeded',
      `The output limit ${outputMax} is too large: this model allows ` +
        `${model.max_output_tokens} output tokens and ${model.context_window} in all ` +
        `(the messages have ${promptTokens}).`,
      { param: 'max_completion_tokens' },
    );
  }
  const outputCapTokens = outputMax ?? model.max_output_tokens;
  const holdMicro = reservationMicro(model, promptTokens, outputCapTokens);
  if (holdMicro > account.balanceMicro) {
    throw new GatewayError(
      'insufficient_quota',
      `The balance of ${account.balanceMicro / 1e6} credits cannot cover this request's ` +
        `reservation of ${holdMicro / 1e6} credits.`,
    );
  }
  return { hold: { credits_micro: holdMicro, tokens: 0 }, budgetHoldMicro: 0 };
}

function providerRequestFor(chat: ChatRequest, promptTokens: number): ProviderRequest {
  const { body, model } = chat;
  return {
    model: model.upstream_model ?? chat.modelId,
    messages: chat.messages,
    maxOutputTokens: chat.maxOutputTokens,
    outputCapTokens: chat.maxOutputTokens ?? model.max_output_tokens,
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

export interface ChatAnswer {
  content: string | null;
  toolCalls: readonly ToolCall[];
  finishReason: PublicFinishReason;
  usage: Usage;
}

export type ChatResult = RunResult<ChatAnswer>;

/**
 * What the provider said so far: text, tool calls (checked as they build up) and the finish. Text
 * is gathered in a TextBuilder, not with `+=`: an upstream may send a million one-character deltas
 * (up to limits.max_upstream_body_bytes), and a rope of that many nodes is hundreds of MB.
 */
class Answer {
  private readonly textParts = new TextBuilder();
  sawText = false;
  /**
   * The tool calls and their arguments as they build up: made with the first call (most answers
   * have none, and then cost no arrays).
   */
  private calls: ToolCall[] | null = null;
  private callArguments: TextBuilder[] | null = null;
  finish: Extract<Delta, { type: 'finish' }> | null = null;
  /**
   * A stream keeps its text (and each tool call's name and arguments) only to count it, should the
   * provider report no usage; relayed already, it is counted in parts as it goes (StreamedText), so
   * a client that stops reading, or an answer of 16 MiB, does not hold all of it here.
   */
  private readonly streamedText: StreamedText | null;
  private streamedCalls: StreamedText[] | null = null;

  constructor(
    private readonly streamed: {
      keyId: string;
      limit: number;
      logger: AdmitContext['logger'];
    } | null,
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
  toolCalls(): readonly ToolCall[] {
    const calls = this.calls;
    if (calls === null) return NO_TOOL_CALLS;
    if (this.streamed === null)
      for (let i = 0; i < calls.length; i++)
        calls[i]!.function.arguments = this.callArguments![i]!.build();
    return calls;
  }

  /**
   * Completion tokens counted from what the provider sent, up to `limit` (see countAnswerTokens).
   */
  countTokens(
    keyId: string,
    limit: number,
    signal: RunSignal,
    logger: AdmitContext['logger'],
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
    if (this.streamedCalls !== null)
      for (const call of this.streamedCalls) total += await call.tokens();
    return total;
  }

  /**
   * The counts are not needed any more (usage came, or the run ended): queued parts are dropped.
   */
  discard(): void {
    this.streamedText?.discard();
    if (this.streamedCalls !== null) for (const call of this.streamedCalls) call.discard();
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
        let args = this.callArguments?.[delta.index];
        if (!args) {
          const calls = (this.calls ??= []);
          if (delta.index !== calls.length || delta.id === null || delta.name === null) {
            throw new GatewayError(
              'upstream_invalid_response',
              'The provider sent a malformed tool call.',
            );
          }
          calls.push({
            id: delta.id,
            type: 'function',
            function: { name: delta.name, arguments: '' },
          });
          args = new TextBuilder();
          (this.callArguments ??= []).push(args);
          if (this.streamed !== null) {
            const counted = new StreamedText(
              this.streamed.keyId,
              this.streamed.limit,
              this.streamed.logger,
            );
            counted.append(delta.name);
            (this.streamedCalls ??= []).push(counted);
          }
        }
        if (this.streamed !== null) this.streamedCalls![delta.index]!.append(delta.arguments);
        else args.append(delta.arguments);
        return sink?.toolCall(delta.index, delta.id, delta.name, delta.arguments);
      }
      case 'finish':
        this.finish = delta;
        return;
    }
  }
}

/** The tool calls of an answer that made none: one shared, frozen list. */
const NO_TOOL_CALLS: readonly ToolCall[] = Object.freeze([]);

/** The run policies of a config: made once, not per request. */
const policies = new WeakMap<Config, { stream: RunPolicy; whole: RunPolicy }>();

function policyFor(config: Config, stream: boolean): RunPolicy {
  let made = policies.get(config);
  if (!made) {
    // The hold is kept (billing.on_error "keep") for the provider's failures as the spec lists
    // them: its errors, its validation, its timeouts, the stream's time limit.
    const keepsHold = (error: GatewayError) =>
      config.billing.on_error === 'keep' && chargedOnError(error);
    made = {
      stream: {
        deadlineMs: config.limits.stream_timeout_ms,
        deadlineKind: 'stream_timeout',
        keepsHold,
      },
      whole: {
        deadlineMs: config.limits.upstream_timeout_ms,
        deadlineKind: 'upstream_timeout',
        keepsHold,
      },
    };
    policies.set(config, made);
  }
  return stream ? made.stream : made.whole;
}

/** What a chat run's work needs: handed to the actor with the work, so no closure per request. */
interface ChatRun {
  gateway: ChatContext;
  admission: ChatAdmission;
  chat: ChatRequest;
  sink: ChatSink | null;
  answer: Answer;
}

/**
 * Runs an admitted chat request (the actor owns its life; this supplies the work), then ends the
 * sink (a stream; null for a collected answer) with what the caller gets.
 */
export function runChat(
  gateway: ChatContext,
  admission: ChatAdmission,
  chat: ChatRequest,
  sink: ChatSink | null,
): Promise<ChatResult> {
  const { actor } = admission;
  const outputCapTokens = chat.maxOutputTokens ?? chat.model.max_output_tokens;
  const answer = new Answer(
    sink !== null
      ? { keyId: actor.init.keyId, limit: outputCapTokens, logger: gateway.logger }
      : null,
  );
  const running = actor.run(
    chatWork,
    { gateway, admission, chat, sink, answer },
    policyFor(gateway.config, chat.stream),
  );
  // A collected answer has no counts queued to discard (only a stream's are) and no sink to end:
  // its run's result is the caller's as it is, without an async step of its own.
  return sink === null ? running : endStream(running, answer, sink);
}

/** A stream's run is over: its queued counts go, and its sink ends with what the caller gets. */
async function endStream(
  running: Promise<ChatResult>,
  answer: Answer,
  sink: ChatSink,
): Promise<ChatResult> {
  const result = await running;
  answer.discard();
  sink.end(result);
  return result;
}

/** The chat work: the provider's answer relayed or collected, then counted and priced. */
async function chatWork(run: ChatRun): Promise<Completion<ChatAnswer>> {
  const { gateway, admission, chat, sink, answer } = run;
  const { actor, providerRequest } = admission;
  if (sink !== null) await relay(gateway, admission, chat, sink, answer);
  else {
    // Nothing to relay before the end: the provider's whole answer, then one reply.
    const deltas = await gateway.router.complete(
      chat.modelId,
      providerRequest,
      actor.signal,
      actor.attempts,
    );
    if (actor.signal.aborted) throw actor.signal.reason;
    // Not waiting for the start to be durable: nothing reaches the client before the finish is,
    // which the log writes after the start (a plain call's start waits for that write, placeHold).
    gateway.metrics.firstToken(chat.modelId, (Date.now() - admission.createdMs) / 1000);
    for (const delta of deltas) answer.add(delta, null);
  }
  const { text, finish } = answer;
  if (!finish) {
    throw new GatewayError(
      'upstream_invalid_response',
      'The provider ended without finishing its answer.',
    );
  }
  // A call the output limit cut off is no call to run: its arguments are a fragment. A plain answer
  // leaves it out (a stream has sent it already), and either ends with `stop`, as the provider's
  // `length` does on the wire (spec 000: stop or tool_calls).
  const toolCalls = finish.reason === 'length' ? [] : answer.toolCalls();
  const outputCapTokens = chat.maxOutputTokens ?? chat.model.max_output_tokens;
  const promptTokens = finish.usage?.promptTokens ?? providerRequest.promptTokens;
  const completionTokens =
    finish.usage?.completionTokens ??
    (await answer.countTokens(actor.init.keyId, outputCapTokens, actor.signal, gateway.logger));
  const usage: Usage = {
    prompt_tokens: promptTokens,
    completion_tokens: completionTokens,
    total_tokens: promptTokens + completionTokens,
  };
  const holdMicro = actor.init.hold.credits_micro;
  return {
    value: {
      content: answer.sawText || toolCalls.length === 0 ? text : null,
      toolCalls,
      finishReason: toolCalls.length > 0 ? 'tool_calls' : 'stop',
      usage,
    },
    usage,
    charge: {
      credits_micro: chargeMicro(chat.model, promptTokens, completionTokens, holdMicro),
      tokens: 0,
    },
    budgetSpendMicro: 0,
    answers: null,
  };
}

/** Relays the provider's stream to the sink as it comes, waiting whenever the client is behind. */
async function relay(
  gateway: ChatContext,
  admission: ChatAdmission,
  chat: ChatRequest,
  sink: ChatSink,
  answer: Answer,
): Promise<void> {
  const { actor, providerRequest } = admission;
  let began = false;
  const deltas = gateway.router.stream(chat.modelId, providerRequest, actor.signal, actor.attempts);
  for await (const delta of deltas) {
    if (!began) {
      // The hold must be durable before anything reaches the client; the provider call overlapped
      // it.
      await actor.startDurable;
      began = true;
      gateway.metrics.firstToken(chat.modelId, (Date.now() - admission.createdMs) / 1000);
      await sink.begin();
    }
    if (actor.signal.aborted) break;
    const written = answer.add(delta, sink);
    if (written) {
      // The sink is full (a client that is behind): the upstream waits here. An abort wakes this
      // wait (the sink listens to the signal), and the run ends now, without asking the provider
      // again.
      await written;
      if (actor.signal.aborted) break;
    }
  }
  if (actor.signal.aborted) throw actor.signal.reason;
  if (!began) {
    await actor.startDurable;
    await sink.begin();
  }
}
