// What every HTTP provider does with an answer whatever its protocol: bounds, usage figures, tool
// calls' arguments, the folding of a stream into whole deltas, and the errors of a bad answer.
import { assert } from '../../util/assert.ts';
import { GatewayError } from '../../util/errors.ts';
import { TextBuilder } from '../../util/text-builder.ts';
import type { Delta } from '../provider.ts';

/**
 * Tool calls one answer may make: the gateway takes at most this many in an assistant message of a
 * request (chat/model.ts), so a client could not even send a longer list back. It also keeps the
 * per-call state of an endless stream of new calls bounded.
 */
export const TOOL_CALLS_MAX = 128;
/**
 * Usage figures must be below this (a safe integer in [0, 2^31)): sums and prices of them stay
 * exact.
 */
export const USAGE_TOKENS_LIMIT = 2 ** 31;
/** Upstream error codes are echoed only when they look like identifiers, never free text. */
const SAFE_CODE_CHARS_MAX = 64;

export type Usage = { promptTokens: number; completionTokens: number };

/**
 * UTF-8 bytes of content (text, and tool calls' ids, names and arguments) one answer carried so
 * far, refused past the bound (limits.max_upstream_body_bytes).
 */
export class ContentMeter {
  private bytes = 0;

  constructor(
    private readonly providerName: string,
    private readonly bytesMax: number,
  ) {}

  count(text: string): void {
    this.bytes += Buffer.byteLength(text);
    if (this.bytes > this.bytesMax) {
      throw invalid(
        this.providerName,
        `sent an answer with over ${this.bytesMax} bytes of content`,
      );
    }
  }
}

/**
 * The deltas of a stream, folded into those a JSON answer gives: all text in one delta, each tool
 * call in one (with its own index), then the finish. `complete()` keeps this instead of every
 * delta, so an answer of a million one-character events costs its content, not a million objects.
 */
export class DeltaCollector {
  private readonly text = new TextBuilder();
  private readonly toolCalls: {
    index: number;
    id: string;
    name: string;
    arguments: TextBuilder;
  }[] = [];
  private finish: Extract<Delta, { type: 'finish' }> | null = null;

  add(delta: Delta): void {
    switch (delta.type) {
      case 'text':
        this.text.append(delta.text);
        return;
      case 'tool_call': {
        if (delta.id !== null && delta.name !== null) {
          const args = new TextBuilder();
          args.append(delta.arguments);
          this.toolCalls.push({
            index: delta.index,
            id: delta.id,
            name: delta.name,
            arguments: args,
          });
          return;
        }
        // The translator announces each index once (bounded by TOOL_CALLS_MAX), so this search is
        // short.
        const call = this.toolCalls.find((known) => known.index === delta.index);
        assert(call !== undefined, 'tool-call arguments before the call was announced');
        call.arguments.append(delta.arguments);
        return;
      }
      case 'finish':
        this.finish = delta;
        return;
    }
  }

  deltas(): Delta[] {
    assert(this.finish !== null, 'a collected stream without its finish');
    const deltas: Delta[] = [];
    const text = this.text.build();
    if (text.length > 0) deltas.push({ type: 'text', text });
    for (const call of this.toolCalls) {
      deltas.push({
        type: 'tool_call',
        index: call.index,
        id: call.id,
        name: call.name,
        arguments: call.arguments.build(),
      });
    }
    deltas.push(this.finish);
    return deltas;
  }
}

export function usageFigure(value: unknown, providerName: string): number | null {
  if (value === undefined || value === null) return null;
  if (
    typeof value !== 'number' ||
    !Number.isSafeInteger(value) ||
    value < 0 ||
    value >= USAGE_TOKENS_LIMIT
  ) {
    throw invalid(providerName, 'sent a usage figure that is not a whole number in [0, 2^31)');
  }
  return value;
}

export function argumentsText(value: unknown, providerName: string): string {
  if (value === undefined || value === null) return '';
  if (typeof value === 'string') return value;
  // Some servers send the arguments as an object; the interface wants the JSON text.
  if (isRecord(value)) return JSON.stringify(value);
  throw invalid(providerName, 'sent tool-call arguments that are not a string');
}

export function parseJson(text: string, providerName: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw invalid(providerName, 'sent data that is not valid JSON');
  }
}

export function invalid(providerName: string, what: string): GatewayError {
  return new GatewayError('upstream_invalid_response', `Upstream ${providerName} ${what}.`);
}

export function oversizedBody(providerName: string, bytesMax: number): GatewayError {
  return invalid(providerName, `sent a body over ${bytesMax} bytes`);
}

/**
 * Names a provider gives an error inside a 200 answer when it, not the request, failed: OpenAI's
 * `type`s and codes, Anthropic's error types, Gemini's statuses.
 */
const TRANSIENT_ERROR_NAMES = new Set([
  'server_error',
  'internal_error',
  'api_error',
  'overloaded_error',
  'rate_limit_error',
  'rate_limit_exceeded',
  'service_unavailable',
  'UNAVAILABLE',
  'RESOURCE_EXHAUSTED',
  'INTERNAL',
  'DEADLINE_EXCEEDED',
]);

/**
 * Whether an error object a provider sent inside its answer says it was overloaded or failing (a
 * 429 or a 5xx, as a number or by name): then another deployment may answer, as for the same
 * status on the HTTP answer (CONTRACT §7; the router fails over only before the client's first
 * byte).
 */
function isTransient(error: unknown): boolean {
  if (!isRecord(error)) return false;
  for (const field of [error.code, error.status, error.type]) {
    if (typeof field === 'number' && (field === 429 || (field >= 500 && field <= 599))) return true;
    if (typeof field === 'string' && TRANSIENT_ERROR_NAMES.has(field)) return true;
  }
  return false;
}

/** A provider's error inside its answer (`error` is the error object it sent, if any). */
export function upstreamErrorInStream(providerName: string, error?: unknown): GatewayError {
  return new GatewayError(
    'upstream_error',
    `Upstream ${providerName} reported an error inside its answer.`,
    { failover: isTransient(error) },
  );
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function isIdentifier(text: string): boolean {
  if (text.length === 0 || text.length > SAFE_CODE_CHARS_MAX) return false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    const ok =
      (c >= 48 && c <= 57) ||
      (c >= 65 && c <= 90) ||
      (c >= 97 && c <= 122) ||
      c === 95 ||
      c === 45 ||
      c === 46;
    if (!ok) return false;
  }
  return true;
}

/** A header value we may write as is: visible ASCII and spaces, nothing that could end the line. */
export function isHeaderValue(text: string): boolean {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 32 || c > 126) return false;
  }
  return true;
}

/**
 * A tool call's arguments, sent back by a client, as the JSON object Anthropic's `tool_use.input`
 * and Gemini's `functionCall.args` must be (OpenAI takes the text as it is).
 */
export function toolArgumentsObject(text: string, index: number): Record<string, unknown> {
  if (text.trim() === '') return {};
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    value = null;
  }
  if (!isRecord(value)) {
    throw new GatewayError(
      'invalid_request_error',
      'Tool-call arguments sent back to this model must be a JSON object.',
      { param: `tool_calls[${index}].function.arguments` },
    );
  }
  return value;
}
