// The provider interface: every upstream (simulator, OpenAI-compatible HTTP) streams the same
// deltas.

import type { RunSignal } from '../util/abort.ts';
import type { ProviderMessage, ToolChoice, ToolDefinition } from './wire.ts';

/** The wire types a provider speaks, for modules written against this interface. */
export type { ProviderMessage, ToolCall, ToolChoice, ToolDefinition } from './wire.ts';

export interface ProviderRequest {
  /** The provider's own model id (config `upstream_model`, else the public id). */
  model: string;
  messages: ProviderMessage[];
  /** The caller's output limit, passed through unmodified; null = the model's own default. */
  maxOutputTokens: number | null;
  /**
   * The limit the gateway reserved for (the caller's, else the model's max_output_tokens), for
   * protocols that require one (Anthropic's max_tokens).
   */
  outputCapTokens?: number;
  temperature: number | null;
  topP: number | null;
  /** Only set when the model supports it. */
  topK: number | null;
  /** Only set when the model supports it. */
  seed: number | null;
  stop: string[] | null;
  tools: ToolDefinition[] | null;
  toolChoice: ToolChoice | null;
  /** The gateway's own count of the input, for providers that do not report usage. */
  promptTokens: number;
  /**
   * Whether the caller streams. When false, a provider may fetch the answer in one piece (cheaper
   * than an event stream); it still yields the same deltas.
   */
  stream: boolean;
}

export type FinishReason = 'stop' | 'length' | 'tool_calls';

/**
 * What a provider yields, in order: any number of text and tool-call deltas, then exactly one
 * `finish`. A tool call's first delta carries its `id` and `name`; later deltas of the same `index`
 * add arguments.
 */
export type Delta =
  | { type: 'text'; text: string }
  | { type: 'tool_call'; index: number; id: string | null; name: string | null; arguments: string }
  | {
      type: 'finish';
      reason: FinishReason;
      /**
       * What the provider reported; null, or a null completion, where it reported none or where its
       * count covers more than was relayed (an answer the gateway cut at a stop): the gateway then
       * counts the answer relayed.
       */
      usage: { promptTokens: number; completionTokens: number | null } | null;
    };

export interface Provider {
  readonly name: string;
  /**
   * Streams the answer. Aborting `signal` must stop the upstream work within 50 ms and end the
   * iterable by throwing the signal's reason. Failures throw `GatewayError` with an upstream_*
   * code.
   */
  stream(request: ProviderRequest, signal: RunSignal): AsyncIterable<Delta>;
  /**
   * Optional: the same deltas at once, for a caller that does not stream (a non-stream chat call, a
   * decision). Cheaper than iterating the stream where the provider gets the answer in one piece.
   */
  complete?(request: ProviderRequest, signal: RunSignal): Promise<Delta[]>;
  /**
   * Releases what the provider keeps between calls (idle upstream connections); called at shutdown.
   */
  close?(): void;
}

/**
 * The whole answer of `provider` as deltas: its `complete` when it has one, else its stream
 * collected.
 */
export function collectAnswer(
  provider: Provider,
  request: ProviderRequest,
  signal: RunSignal,
): Promise<Delta[]> {
  return provider.complete
    ? provider.complete(request, signal)
    : collectStream(provider, request, signal);
}

async function collectStream(
  provider: Provider,
  request: ProviderRequest,
  signal: RunSignal,
): Promise<Delta[]> {
  const deltas: Delta[] = [];
  for await (const delta of provider.stream(request, signal)) deltas.push(delta);
  return deltas;
}

/**
 * A system message line that asks a text-only model for a JSON object satisfying the schema on the
 * next line (the decision service uses it for models without tools; the simulator honours it).
 */
export const JSON_SCHEMA_MARKER = 'Answer with only a JSON object that satisfies this JSON Schema:';
