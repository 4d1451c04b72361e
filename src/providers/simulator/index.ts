// The embedded simulator provider: deterministic answers, paced like a real model, honouring
// limits.
import { defaultConfig } from '../../config/defaults.ts';
import type { SimulatorProviderConfig } from '../../config/model.ts';
import type { RunSignal } from '../../util/abort.ts';
import { JSON_DEPTH_MAX, JSON_MEMBERS_PARSED_MAX, scanJson } from '../../util/json.ts';
import {
  type Delta,
  type FinishReason,
  JSON_SCHEMA_MARKER,
  type Provider,
  type ProviderRequest,
  type ToolDefinition,
} from '../provider.ts';
import { SeededRandom } from './random.ts';
import { valueForSchema } from './schema-value.ts';

/**
 * Words that are exactly one o200k token both alone and after a space (a test checks every one), so
 * a text of N words is N tokens and the simulator's usage equals what a tokenizer would count.
 */
export const SIMULATOR_WORDS: readonly string[] = [
  'river',
  'stone',
  'light',
  'quiet',
  'garden',
  'signal',
  'answer',
  'token',
  'stream',
  'cloud',
  'green',
  'blue',
  'red',
  'orange',
  'apple',
  'bridge',
  'north',
  'south',
  'water',
  'paper',
  'window',
  'road',
  'music',
  'simple',
  'clear',
  'small',
  'large',
  'early',
  'late',
  'bright',
  'silver',
  'gold',
  'market',
  'winter',
  'summer',
  'forest',
  'city',
  'letter',
  'number',
  'system',
  'value',
  'time',
  'day',
  'night',
  'data',
  'table',
  'chair',
  'house',
  'field',
  'glass',
  'metal',
  'sound',
  'voice',
  'story',
  'world',
  'plant',
  'rain',
  'snow',
  'wind',
  'fire',
  'earth',
  'star',
  'moon',
  'sun',
];

/**
 * Timers fire at most this often; faster rates emit several tokens per tick instead of more timers.
 */
const SIMULATOR_TICK_MS_MIN = 4;
/**
 * Characters of tool-call arguments per streamed fragment (one fragment stands for one token of
 * pace).
 */
const ARGUMENT_FRAGMENT_CHARS = 12;
const TOOL_CALL_ID_CHARS = 24;
const ID_ALPHABET = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

const DEFAULT_ARGUMENTS_BYTES_MAX = defaultConfig().limits.simulator_tool_arguments_bytes;
/** The values a JSON answer's schema may hold: as many as a request body by default. */
const SCHEMA_VALUES_MAX = defaultConfig().limits.max_body_json_values;

/**
 * Tokens of a text, counted so that the event loop runs between segments; with `limit`, counting
 * may stop once past it. The gateway hands in its billing tokenizer (providers/registry.ts), so
 * the simulator's usage is what billing counts, without providers importing billing.
 */
export type TextTokenCounter = (text: string, limit?: number) => Promise<number>;

/** What one request will produce, decided before the first delta so pacing is all that remains. */
interface Answer {
  /** Text pieces (one per token) or argument fragments, streamed at the configured rate. */
  pieces: string[];
  toolCall: { id: string; name: string } | null;
  reason: FinishReason;
  completionTokens: number;
}

export class SimulatorProvider implements Provider {
  readonly name: string;
  private readonly config: SimulatorProviderConfig;
  /**
   * limits.simulator_tool_arguments_bytes: the largest JSON a tool call's arguments (or a JSON
   * answer) may be.
   */
  private readonly argumentsBytesMax: number;
  private readonly countTokens: TextTokenCounter;

  /**
   * `argumentsBytesMax`: the gateway passes its config's limit; the default is the built-in one.
   */
  constructor(
    name: string,
    config: SimulatorProviderConfig,
    countTokens: TextTokenCounter,
    argumentsBytesMax = DEFAULT_ARGUMENTS_BYTES_MAX,
  ) {
    this.name = name;
    this.config = config;
    this.countTokens = countTokens;
    this.argumentsBytesMax = argumentsBytesMax;
  }

  async *stream(request: ProviderRequest, signal: RunSignal): AsyncIterable<Delta> {
    signal.throwIfAborted();
    const answer = await this.answer(request);
    signal.throwIfAborted();
    const startMs = performance.now() + this.config.ttft_ms;
    if (this.config.ttft_ms > 0) await delay(this.config.ttft_ms, signal);

    if (answer.toolCall) {
      yield {
        type: 'tool_call',
        index: 0,
        id: answer.toolCall.id,
        name: answer.toolCall.name,
        arguments: '',
      };
      if (signal.aborted) throw signal.reason;
    }
    const { pieces } = answer;
    const tokensPerMs = this.config.tokens_per_second / 1000;
    let emitted = 0;
    while (emitted < pieces.length) {
      // Piece k is due k / rate after the first; everything due by now goes out in one delta, so
      // the pace holds however late a timer fires.
      const due = Math.min(
        pieces.length,
        Math.floor((performance.now() - startMs) * tokensPerMs) + 1,
      );
      if (due > emitted) {
        const chunk = due - emitted === 1 ? pieces[emitted]! : pieces.slice(emitted, due).join('');
        emitted = due;
        yield answer.toolCall
          ? { type: 'tool_call', index: 0, id: null, name: null, arguments: chunk }
          : { type: 'text', text: chunk };
        if (signal.aborted) throw signal.reason;
      }
      if (emitted < pieces.length) {
        const nextDueMs = startMs + emitted / tokensPerMs - performance.now();
        await delay(Math.max(SIMULATOR_TICK_MS_MIN, nextDueMs), signal);
      }
    }
    yield {
      type: 'finish',
      reason: answer.reason,
      usage: { promptTokens: request.promptTokens, completionTokens: answer.completionTokens },
    };
  }

  /**
   * Decides the whole answer from the request alone, so the same request always streams the same.
   */
  private answer(request: ProviderRequest): Answer | Promise<Answer> {
    // Stop and the output limit are left out of the hash on purpose: they cut the same answer
    // short, which is what lets a caller (and a test) predict where a stop sequence lands.
    const random = SeededRandom.fromText(
      JSON.stringify([request.model, request.messages, request.tools, request.seed]),
    );
    const tool = chooseTool(request);
    if (tool) {
      const bytesMax = this.argumentsBytesMax;
      return toolAnswer(tool, request.maxOutputTokens, random, bytesMax, this.countTokens);
    }
    const schema = requestedJsonSchema(request);
    if (schema !== undefined)
      return jsonAnswer(schema, random, this.argumentsBytesMax, this.countTokens);
    return textAnswer(this.config.completion_tokens, request, random);
  }
}

/** The tool to call, or null for a text answer. */
function chooseTool(request: ProviderRequest): ToolDefinition | null {
  const tools = request.tools;
  if (!tools || tools.length === 0) return null;
  const choice = request.toolChoice;
  if (choice === 'none') return null;
  if (choice === 'required') return tools[0]!;
  if (choice !== null && typeof choice === 'object') {
    // The gateway refuses a name that is not in tools; should one slip through, answer with text.
    return tools.find((tool) => tool.function.name === choice.function.name) ?? null;
  }
  // 'auto': call a tool on a fresh user turn, answer in text after tool results, so a loop ends.
  const last = request.messages[request.messages.length - 1];
  return last?.role === 'user' ? tools[0]! : null;
}

/**
 * The schema a system message asks a JSON answer to satisfy (JSON_SCHEMA_MARKER, then the schema's
 * line).
 */
function requestedJsonSchema(request: ProviderRequest): unknown {
  for (const message of request.messages) {
    if (message.role !== 'system') continue;
    const at = message.content.indexOf(JSON_SCHEMA_MARKER);
    if (at < 0) continue;
    const start = at + JSON_SCHEMA_MARKER.length + 1;
    const end = message.content.indexOf('\n', start);
    const text = message.content.slice(start, end < 0 ? undefined : end);
    // Any caller can write the marker into a system message: its schema is as untrusted as a
    // tool's, and is parsed within a request body's bounds: nested no deeper (nothing that walks
    // it can overflow the stack), and of no more values and members (180,000 keys held the event
    // loop 40-190 ms in JSON.parse). One past them is no schema, as one that does not parse.
    if (scanJson(text, SCHEMA_VALUES_MAX, JSON_DEPTH_MAX, JSON_MEMBERS_PARSED_MAX) !== null)
      return undefined;
    try {
      return JSON.parse(text);
    } catch {
      return undefined;
    }
  }
  return undefined;
}

/**
 * A text answer that is one JSON object valid against `schema`, as a model asked for JSON gives.
 */
async function jsonAnswer(
  schema: unknown,
  random: SeededRandom,
  bytesMax: number,
  countTokens: TextTokenCounter,
): Promise<Answer> {
  const text = JSON.stringify(valueForSchema(schema, random, bytesMax));
  const pieces: string[] = [];
  for (let at = 0; at < text.length; at += ARGUMENT_FRAGMENT_CHARS)
    pieces.push(text.slice(at, at + ARGUMENT_FRAGMENT_CHARS));
  // Up to 64 KiB: counted in steps that let the event loop run (random text costs ~1 µs a
  // character).
  return {
    pieces,
    toolCall: null,
    reason: 'stop',
    completionTokens: await countTokens(text),
  };
}

function textAnswer(
  completionTokens: number,
  request: ProviderRequest,
  random: SeededRandom,
): Answer {
  const limit =
    request.maxOutputTokens === null
      ? completionTokens
      : Math.max(0, Math.min(completionTokens, request.maxOutputTokens));
  let reason: FinishReason = limit < completionTokens ? 'length' : 'stop';
  const pieces: string[] = new Array(limit);
  for (let i = 0; i < limit; i++) {
    const word = random.pick(SIMULATOR_WORDS);
    pieces[i] = i === 0 ? word : ` ${word}`;
  }
  const stops = request.stop;
  if (stops && stops.length > 0 && limit > 0) {
    const text = pieces.join('');
    let cut = -1;
    for (const stop of stops) {
      if (stop.length === 0) continue;
      const at = text.indexOf(stop);
      if (at !== -1 && (cut === -1 || at < cut)) cut = at;
    }
    if (cut !== -1) {
      reason = 'stop';
      // Keep whole pieces before the cut and the part of the piece it falls in; that piece was
      // still generated, so it is counted.
      let length = 0;
      let kept = 0;
      while (kept < pieces.length && length + pieces[kept]!.length <= cut)
        length += pieces[kept++]!.length;
      const counted = kept < pieces.length && cut > length ? kept + 1 : kept;
      if (counted > kept) pieces[kept] = pieces[kept]!.slice(0, cut - length);
      pieces.length = counted;
    }
  }
  return { pieces, toolCall: null, reason, completionTokens: pieces.length };
}

async function toolAnswer(
  tool: ToolDefinition,
  maxOutputTokens: number | null,
  random: SeededRandom,
  bytesMax: number,
  countTokens: TextTokenCounter,
): Promise<Answer> {
  const name = tool.function.name;
  const parameters = tool.function.parameters;
  let args = JSON.stringify(
    parameters === undefined ? {} : valueForSchema(parameters, random, bytesMax),
  );
  let id = 'call_';
  for (let i = 0; i < TOOL_CALL_ID_CHARS; i++)
    id += ID_ALPHABET[Math.floor(random.next() * ID_ALPHABET.length)];

  // Up to 64 KiB of arguments: counted in steps that let the event loop run.
  let completionTokens = await countTokens(name + args);
  let reason: FinishReason = 'tool_calls';
  if (maxOutputTokens !== null && completionTokens > maxOutputTokens) {
    // A real model runs out of budget mid-arguments; do the same: the longest prefix that fits.
    const fitting = await fittingPrefixLength(
      name,
      args,
      maxOutputTokens,
      completionTokens,
      countTokens,
    );
    args = args.slice(0, fitting);
    completionTokens = Math.min(maxOutputTokens, await countTokens(name + args));
    reason = 'length';
  }
  const pieces: string[] = [];
  for (let at = 0; at < args.length; at += ARGUMENT_FRAGMENT_CHARS)
    pieces.push(args.slice(at, at + ARGUMENT_FRAGMENT_CHARS));
  return { pieces, toolCall: { id, name }, reason, completionTokens };
}

/**
 * The longest prefix of `args` whose tokens, with the name's, are at most `maxTokens`
 * (`totalTokens` is the whole call's). Arguments reach 64 KiB and bisection would count ~17
 * prefixes of them (50 ms), so every other probe interpolates on the token density, which lands
 * next to the answer, and each count stops once it passes the limit.
 */
async function fittingPrefixLength(
  name: string,
  args: string,
  maxTokens: number,
  totalTokens: number,
  countTokens: TextTokenCounter,
): Promise<number> {
  let low = 0; // fits (or nothing does)
  let lowTokens = 0;
  let high = args.length; // does not fit
  let highTokens = totalTokens;
  for (let probe = 0; high - low > 1; probe++) {
    const guess =
      probe % 2 === 0
        ? low + Math.floor(((high - low) * (maxTokens - lowTokens)) / (highTokens - lowTokens))
        : (low + high) >> 1;
    const middle = Math.min(high - 1, Math.max(low + 1, guess));
    const tokens = await countTokens(name + args.slice(0, middle), maxTokens);
    if (tokens <= maxTokens) {
      low = middle;
      lowTokens = tokens;
    } else {
      high = middle;
      highTokens = tokens;
    }
  }
  return low;
}

/** Waits `ms`, or rejects with the signal's reason the moment it aborts (the timer is cleared). */
function delay(ms: number, signal: RunSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal.addEventListener('abort', onAbort, { once: true });
  });
}
