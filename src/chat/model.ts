// Chat request and answer schemas (TypeBox, the single source of their types) and the request
// rules of spec 000.
import { type Static, type TSchema, Type } from '@sinclair/typebox';
import { type TypeCheck, TypeCompiler } from '@sinclair/typebox/compiler';
import type { Config, ModelConfig } from '../config/model.ts';
import { SearchBudget, smallestInstance } from '../providers/simulator/schema-value.ts';
import {
  Nullable,
  type ProviderMessage,
  TOOL_CALL_ID_CHARS_MAX,
  type ToolCall,
  ToolCallSchema,
  type ToolChoice,
  ToolChoiceSchema,
  type ToolDefinition,
  ToolSchema,
} from '../providers/wire.ts';
import { AttemptViewSchema, RequestStatusSchema, UsageSchema } from '../state/events.ts';
import { assert } from '../util/assert.ts';
import { GatewayError } from '../util/errors.ts';
import { countJsonValues, DEPTH_PASSED, JSON_DEPTH_MAX } from '../util/json.ts';
import { fieldPath, firstProblem, mustBe, quoted } from '../util/validation.ts';

export const TextPartSchema = Type.Object({ type: Type.Literal('text'), text: Type.String() });
/** Any content part: only text parts are used; image, audio, file and other parts are dropped. */
export const ContentPartSchema = Type.Object({ type: Type.String() });
export const ContentSchema = Type.Union([
  Type.String(),
  Type.Array(ContentPartSchema, { maxItems: 4096 }),
]);

export const SystemMessageSchema = Type.Object({
  role: Type.Union([Type.Literal('system'), Type.Literal('developer')]),
  content: ContentSchema,
});
export const UserMessageSchema = Type.Object({
  role: Type.Literal('user'),
  content: ContentSchema,
});
export const AssistantMessageSchema = Type.Object({
  role: Type.Literal('assistant'),
  content: Type.Optional(Nullable(ContentSchema)),
  tool_calls: Type.Optional(Nullable(Type.Array(ToolCallSchema, { maxItems: 128 }))),
});
export const ToolMessageSchema = Type.Object({
  role: Type.Literal('tool'),
  content: ContentSchema,
  tool_call_id: Type.String({ minLength: 1, maxLength: TOOL_CALL_ID_CHARS_MAX }),
});

/** The documented fields; any other field is accepted and ignored (spec 000, "ignored fields"). */
export const ChatRequestSchema = Type.Object({
  // Any string: one that names no model (empty, or megabytes long) is 404 model_not_found, as
  // spec 000 says of any name GET /models does not list.
  model: Type.String(),
  messages: Type.Array(Type.Object({ role: Type.String() }), { minItems: 1 }),
  max_completion_tokens: Type.Optional(Nullable(Type.Integer({ minimum: 1 }))),
  max_tokens: Type.Optional(Nullable(Type.Integer({ minimum: 1 }))),
  temperature: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: 2 }))),
  top_p: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: 1 }))),
  // Bounded so that what is passed on is what every provider can take (an int32 top_k; a seed JSON
  // carries exactly): past them a provider's 400 would be a 502 with the hold kept.
  top_k: Type.Optional(Nullable(Type.Integer({ minimum: 0, maximum: 2_147_483_647 }))),
  seed: Type.Optional(
    Nullable(Type.Integer({ minimum: Number.MIN_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER })),
  ),
  stop: Type.Optional(Nullable(Type.Union([Type.String(), Type.Array(Type.String())]))),
  stream: Type.Optional(Nullable(Type.Boolean())),
  // Each tool is checked against ToolSchema on its own, so an error names the tool's field, not the
  // union.
  tools: Type.Optional(Nullable(Type.Array(Type.Unknown()))),
  tool_choice: Type.Optional(Nullable(ToolChoiceSchema)),
});

export type ChatRequestBody = Static<typeof ChatRequestSchema>;

/**
 * All that validateChatRequest checks by schema, as one schema for the OpenAPI document: the
 * request's own, and the ones each message (by its role) and each tool is checked against apart,
 * so that an error names the message's or the tool's field. Never used to validate.
 */
export const ChatRequestDocumentSchema = Type.Intersect([
  ChatRequestSchema,
  Type.Object({
    messages: Type.Array(
      Type.Union([
        SystemMessageSchema,
        UserMessageSchema,
        AssistantMessageSchema,
        ToolMessageSchema,
      ]),
    ),
    tools: Type.Optional(Nullable(Type.Array(ToolSchema))),
  }),
]);

const RequestCheck = TypeCompiler.Compile(ChatRequestSchema);
// A Map, not an object: a role is request data, and "__proto__" or "toString" must not find
// Object.prototype.
const SystemMessageCheck = TypeCompiler.Compile(SystemMessageSchema);
const MessageChecks = new Map<string, TypeCheck<TSchema>>([
  ['system', SystemMessageCheck],
  ['developer', SystemMessageCheck],
  ['user', TypeCompiler.Compile(UserMessageSchema)],
  ['assistant', TypeCompiler.Compile(AssistantMessageSchema)],
  ['tool', TypeCompiler.Compile(ToolMessageSchema)],
]);
const ROLES_MUST_BE = mustBe([...MessageChecks.keys()].map((role) => JSON.stringify(role)));
const ToolCheck = TypeCompiler.Compile(ToolSchema);
const TextPartCheck = TypeCompiler.Compile(TextPartSchema);

/** A validated chat request, resolved against the catalogue. */
export interface ChatRequest {
  body: ChatRequestBody;
  /** The public id (an alias resolves to its target). */
  modelId: string;
  model: ModelConfig;
  messages: ProviderMessage[];
  stream: boolean;
  /** max_completion_tokens ?? max_tokens: passed through unmodified; null = the model's default. */
  maxOutputTokens: number | null;
  stop: string[] | null;
  tools: ToolDefinition[] | null;
  toolChoice: ToolChoice | null;
}

function invalid(message: string, param: string | null): GatewayError {
  return new GatewayError('invalid_request_error', message, { param });
}

/**
 * The first schema error as a 400 whose message names the field and the bound ("temperature must be
 * ≤ 2").
 */
function firstError(check: TypeCheck<TSchema>, value: unknown, prefix: string): GatewayError {
  const problem = firstProblem(check.Errors(value));
  assert(problem, 'a value that failed its check has an error');
  const param = fieldPath(value, problem.segments, prefix) || null;
  return invalid(`${param ?? 'body'} ${problem.problem}`, param);
}

/**
 * Joins the text parts of the content of message `at`; every other part type is dropped.
 */
function contentText(content: string | Array<{ type: string }>, at: number): string {
  if (typeof content === 'string') return content;
  let text = '';
  for (let i = 0; i < content.length; i++) {
    const part = content[i]!;
    if (part.type !== 'text') continue;
    if (!TextPartCheck.Check(part)) {
      const param = `${messageParam(at)}.content[${i}].text`;
      throw invalid(`${param} must be a string`, param);
    }
    text += part.text;
  }
  return text;
}

/**
 * The name of message `at` in an error (`messages[2]`): made only for an error, never per message.
 */
function messageParam(at: number): string {
  return `messages[${at}]`;
}

function servedBySimulator(config: Config, model: ModelConfig): boolean {
  return (
    Object.hasOwn(config.providers, model.provider) &&
    config.providers[model.provider]!.type === 'simulator'
  );
}

/**
 * CONTRACT §8, generated work is bounded: the simulator writes a tool's arguments in at most
 * `bytesMax` bytes, so a schema whose smallest instance is larger (minItems 1e8, a required
 * recursive $ref) is refused here, before any hold, in bounded work, whichever tool tool_choice
 * would pick.
 */
function checkSimulatorTools(tools: ToolDefinition[], bytesMax: number): void {
  // One budget for all the tools of the request: the check costs at most a few ms, whatever they
  // hold.
  const budget = new SearchBudget();
  for (let i = 0; i < tools.length; i++) {
    const parameters = tools[i]!.function.parameters;
    if (parameters === undefined) continue;
    const smallest = smallestInstance(parameters, bytesMax, budget);
    if (smallest.fits) continue;
    const param = `tools[${i}].function.parameters`;
    throw invalid(
      smallest.reason === 'too_large'
        ? `${param}: the smallest value this schema allows is larger than the ${bytesMax} bytes ` +
            `the simulator writes for tool arguments`
        : `${param}: the simulator cannot find a value of this schema within ${bytesMax} bytes ` +
            `in bounded work; simplify the schema`,
      param,
    );
  }
}

/**
 * Whether some deployment of `model` is an API that takes a tool call's arguments as an object
 * (Anthropic's `tool_use.input`, Gemini's `functionCall.args`), not as OpenAI's string.
 */
function needsObjectArguments(config: Config, model: ModelConfig): boolean {
  for (const deployment of model.deployments) {
    const type = config.providers[deployment.provider]?.type;
    if (type === 'anthropic' || type === 'gemini') return true;
  }
  return false;
}

/**
 * Assistant tool calls sent back to such a model must carry a JSON object (or nothing) as
 * arguments. Checked here, before any hold or binding, and for every deployment alike: found by
 * the adapter, the same body would be refused or served by which deployment the pick chose.
 *
 * Each is a JSON text inside a string, which the body's own bound does not see (a 4 MB string of
 * 250,000 keys is one value of the body, and 200 ms of JSON.parse): the values of all of them
 * together are bounded, at a quarter of the body's bound, counted before any is parsed. So this
 * parse, in the body's turn, stays a fraction of the body's own (CONTRACT §8).
 */
function checkObjectArguments(messages: ProviderMessage[], bodyValuesMax: number): void {
  const valuesMax = Math.floor(bodyValuesMax / 4);
  let valuesLeft = valuesMax;
  for (let i = 0; i < messages.length; i++) {
    const message = messages[i]!;
    if (message.role !== 'assistant' || !message.tool_calls) continue;
    for (let j = 0; j < message.tool_calls.length; j++) {
      const text = message.tool_calls[j]!.function.arguments;
      if (text.trim() === '') continue;
      const param = `${messageParam(i)}.tool_calls[${j}].function.arguments`;
      const values = countJsonValues(text, valuesLeft, JSON_DEPTH_MAX);
      if (values === DEPTH_PASSED)
        throw invalid(`${param} nests deeper than ${JSON_DEPTH_MAX} levels`, param);
      if (values > valuesLeft)
        throw invalid(
          `${param}: the tool-call arguments of a request hold at most ${valuesMax} JSON values`,
          param,
        );
      valuesLeft -= values;
      let value: unknown;
      try {
        value = JSON.parse(text);
      } catch {
        value = null;
      }
      if (typeof value === 'object' && value !== null && !Array.isArray(value)) continue;
      throw invalid(`${param} must be a JSON object for this model`, param);
    }
  }
}

/**
 * Applies the request rules in the contract's order: shape (400), then model (404), then model
 * capability (400). Context and quota come later, after idempotency and the rate limit.
 */
export function validateChatRequest(json: unknown, config: Config): ChatRequest {
  if (typeof json !== 'object' || json === null || Array.isArray(json))
    throw invalid('The body must be a JSON object.', null);
  if (!RequestCheck.Check(json)) throw firstError(RequestCheck, json, '');
  const body = json;
  const { limits } = config;
  const messages = readMessages(body.messages, limits.max_messages);
  const stop = readStop(body.stop, limits.max_stop_sequences);
  const tools = readTools(body.tools, limits.max_tools);
  const toolChoice = body.tool_choice ?? null;
  checkToolChoice(toolChoice, tools);
  // Shape is settled; now the model (404), then what the model can do (400).
  const modelId = resolveModelId(config, body.model);
  const model = config.models[modelId]!;
  // Sent at all, even empty: spec 000 accepts the field only for models with Tools = yes.
  if (body.tools !== undefined && body.tools !== null && !model.tools) {
    throw new GatewayError(
      'unsupported_parameter',
      `The model ${modelId} does not support tools.`,
      { param: 'tools' },
    );
  }
  if (tools && servedBySimulator(config, model))
    checkSimulatorTools(tools, config.limits.simulator_tool_arguments_bytes);
  if (needsObjectArguments(config, model))
    checkObjectArguments(messages, config.limits.max_body_json_values);
  return {
    body,
    modelId,
    model,
    messages,
    stream: body.stream === true,
    maxOutputTokens: body.max_completion_tokens ?? body.max_tokens ?? null,
    stop,
    tools,
    toolChoice: tools ? toolChoice : null,
  };
}

/**
 * Each message checked against its role's schema, in order, and turned into what a provider is
 * handed; a tool message must answer a tool call of an earlier assistant message.
 */
function readMessages(raws: ChatRequestBody['messages'], messagesMax: number): ProviderMessage[] {
  if (raws.length > messagesMax) {
    throw invalid(`messages: at most ${messagesMax} messages`, 'messages');
  }
  const messages: ProviderMessage[] = [];
  // The ids of the tool calls made so far; made with the first (most requests have none).
  let toolCallIds: Set<string> | null = null;
  for (let i = 0; i < raws.length; i++) {
    const raw = raws[i]!;
    const check = MessageChecks.get(raw.role);
    if (!check) {
      const param = messageParam(i);
      throw invalid(`${param}.role ${ROLES_MUST_BE}`, `${param}.role`);
    }
    if (!check.Check(raw)) throw firstError(check, raw, messageParam(i));
    switch (raw.role) {
      case 'system':
      case 'developer':
      case 'user': {
        const message = raw as Static<typeof UserMessageSchema>;
        messages.push({
          role: raw.role === 'user' ? 'user' : 'system',
          content: contentText(message.content, i),
        });
        break;
      }
      case 'assistant': {
        const message = assistantMessage(raw as Static<typeof AssistantMessageSchema>, i);
        if (message.role === 'assistant' && message.tool_calls) {
          toolCallIds ??= new Set<string>();
          for (const call of message.tool_calls) toolCallIds.add(call.id);
        }
        messages.push(message);
        break;
      }
      case 'tool':
        messages.push(toolMessage(raw as Static<typeof ToolMessageSchema>, i, toolCallIds));
        break;
    }
  }
  return messages;
}

/** An assistant turn: its text, its tool calls, or both. */
function assistantMessage(
  message: Static<typeof AssistantMessageSchema>,
  at: number,
): ProviderMessage {
  const calls = message.tool_calls && message.tool_calls.length > 0 ? message.tool_calls : null;
  const hasContent = message.content !== undefined && message.content !== null;
  if (!hasContent && !calls) {
    const param = messageParam(at);
    throw invalid(
      `${param}: an assistant message needs content, tool_calls, or both`,
      `${param}.content`,
    );
  }
  // Copied field by field: whatever else the client put in a call is not passed on.
  const toolCalls: ToolCall[] | undefined = calls?.map((call) => ({
    id: call.id,
    type: 'function',
    function: { name: call.function.name, arguments: call.function.arguments },
  }));
  return {
    role: 'assistant',
    content: hasContent ? contentText(message.content!, at) : null,
    ...(toolCalls ? { tool_calls: toolCalls } : {}),
  };
}

/** A tool result; it must answer a call of an earlier assistant message. */
function toolMessage(
  message: Static<typeof ToolMessageSchema>,
  at: number,
  toolCallIds: Set<string> | null,
): ProviderMessage {
  if (!toolCallIds?.has(message.tool_call_id)) {
    const param = messageParam(at);
    throw invalid(
      `${param}.tool_call_id: no earlier assistant tool ` +
        `call has id ${quoted(message.tool_call_id)}`,
      `${param}.tool_call_id`,
    );
  }
  return {
    role: 'tool',
    content: contentText(message.content, at),
    tool_call_id: message.tool_call_id,
  };
}

/** `stop` as a list (one string is a list of one), bounded; an empty list is no stop. */
function readStop(raw: ChatRequestBody['stop'], sequencesMax: number): string[] | null {
  let stop: string[] | null = null;
  if (typeof raw === 'string') stop = [raw];
  else if (Array.isArray(raw)) stop = raw;
  if (stop) {
    if (stop.length > sequencesMax)
      throw invalid(`stop: at most ${sequencesMax} sequences`, 'stop');
    if (stop.some((sequence) => sequence.length === 0))
      throw invalid('stop: a stop sequence cannot be empty', 'stop');
    if (stop.length === 0) stop = null;
  }
  return stop;
}

/** A non-empty `tools` array, each tool checked on its own (so an error names the tool's field). */
function readTools(raw: ChatRequestBody['tools'], toolsMax: number): ToolDefinition[] | null {
  const tools = raw && raw.length > 0 ? (raw as ToolDefinition[]) : null;
  if (tools) {
    if (tools.length > toolsMax) throw invalid(`tools: at most ${toolsMax} tools`, 'tools');
    for (let i = 0; i < tools.length; i++)
      if (!ToolCheck.Check(tools[i])) throw firstError(ToolCheck, tools[i], `tools[${i}]`);
  }
  return tools;
}

/** A named tool_choice must name one of `tools`; "required" needs tools. */
function checkToolChoice(toolChoice: ToolChoice | null, tools: ToolDefinition[] | null): void {
  if (toolChoice !== null && typeof toolChoice === 'object') {
    const name = toolChoice.function.name;
    if (!tools?.some((tool) => tool.function.name === name)) {
      throw invalid(
        `tool_choice: no tool named ${quoted(name)} in tools`,
        'tool_choice.function.name',
      );
    }
  } else if (toolChoice === 'required' && !tools) {
    throw invalid('tool_choice: "required" needs tools', 'tool_choice');
  }
}

/**
 * The catalogue's id for model `name`, an alias resolved; 404 when there is no such model. The id
 * alone, not an object with the model: `config.models[id]` is then there for the caller.
 */
function resolveModelId(config: Config, name: string): string {
  // Own keys only: a model named "__proto__" or "constructor" is just an unknown model.
  const modelId = Object.hasOwn(config.aliases, name) ? config.aliases[name]! : name;
  if (!Object.hasOwn(config.models, modelId) || !config.models[modelId])
    throw new GatewayError('model_not_found', `The model ${quoted(name)} does not exist.`, {
      param: null,
    });
  return modelId;
}

// ─── Answers (the OpenAPI document shows them; the views are typed by them) ───────────────────

const UnixSeconds = Type.Integer({ minimum: 0, description: 'Unix seconds' });

/**
 * A tool call as the answer relays it: what the provider named, unbounded (the request's
 * ToolCallSchema bounds what a client may send back, not what an upstream may say).
 */
const AnswerToolCallSchema = Type.Object({
  id: Type.String(),
  type: Type.Literal('function'),
  function: Type.Object({ name: Type.String(), arguments: Type.String() }),
});

/** A non-stream completion (`completionBody`, chat/stream.ts). */
export const ChatCompletionSchema = Type.Object({
  id: Type.String({ description: 'chatcmpl-…, also in X-Request-ID' }),
  object: Type.Literal('chat.completion'),
  created: UnixSeconds,
  model: Type.String(),
  choices: Type.Array(
    Type.Object({
      index: Type.Literal(0),
      message: Type.Object({
        role: Type.Literal('assistant'),
        content: Nullable(Type.String()),
        tool_calls: Type.Optional(Type.Array(AnswerToolCallSchema)),
      }),
      finish_reason: Type.Union([Type.Literal('stop'), Type.Literal('tool_calls')]),
    }),
    { minItems: 1, maxItems: 1 },
  ),
  usage: UsageSchema,
});
export type ChatCompletion = Static<typeof ChatCompletionSchema>;

/** GET /api/v1/models. */
/** GET /api/v1/models/{id}, and each item of the list. */
export const ModelSchema = Type.Object({
  id: Type.String(),
  object: Type.Literal('model'),
  created: UnixSeconds,
  owned_by: Type.String({ description: 'the provider' }),
});

export type Model = Static<typeof ModelSchema>;

export const ModelListSchema = Type.Object({
  object: Type.Literal('list'),
  data: Type.Array(ModelSchema),
});

export type ModelList = Static<typeof ModelListSchema>;

/** GET /api/v1/requests/{id}: never the completion text. */
export const ChatRequestStatusSchema = Type.Object({
  object: Type.Literal('request.status'),
  request_id: Type.String(),
  request_status: RequestStatusSchema,
  status_url: Type.String(),
  model: Type.String(),
  stream: Type.Boolean(),
  created: UnixSeconds,
  finished: Nullable(UnixSeconds),
  usage: Nullable(UsageSchema),
  reserved_credits: Type.Number({ minimum: 0 }),
  charged_credits: Type.Number({ minimum: 0 }),
  error_code: Nullable(Type.String()),
  attempts: Type.Array(AttemptViewSchema),
});
export type ChatRequestStatus = Static<typeof ChatRequestStatusSchema>;
