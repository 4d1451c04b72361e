// The chat wire types the chat API and the providers share: messages as the gateway hands them on,
// tool calls, tools and tool choice. TypeBox schemas, the one source of their types (Static<>);
// chat/model.ts validates requests with them, and imports nothing of chat.
import { createHash } from 'node:crypto';
import { type Static, type TSchema, Type } from '@sinclair/typebox';

export const Nullable = <T extends TSchema>(schema: T) => Type.Union([schema, Type.Null()]);

/**
 * The longest tool call id: room for the ids of a Gemini call that carries its thought signature
 * (providers/gemini), which runs to a few KB; still a bound on what a client sends back.
 */
export const TOOL_CALL_ID_CHARS_MAX = 32 * 1024;

/** A tool call, as a client sends it back in an assistant message and as a provider reports it. */
export const ToolCallSchema = Type.Object({
  id: Type.String({ minLength: 1, maxLength: TOOL_CALL_ID_CHARS_MAX }),
  type: Type.Literal('function'),
  function: Type.Object({
    name: Type.String({ minLength: 1, maxLength: 64 }),
    arguments: Type.String(),
  }),
});
export type ToolCall = Static<typeof ToolCallSchema>;

export const ToolSchema = Type.Object({
  type: Type.Literal('function'),
  function: Type.Object({
    name: Type.String({ pattern: '^[A-Za-z0-9_-]{1,64}$' }),
    description: Type.Optional(Type.String()),
    parameters: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
    strict: Type.Optional(Nullable(Type.Boolean())),
  }),
});
export type ToolDefinition = Static<typeof ToolSchema>;

export const ToolChoiceSchema = Type.Union([
  Type.Literal('auto'),
  Type.Literal('none'),
  Type.Literal('required'),
  Type.Object({
    type: Type.Literal('function'),
    function: Type.Object({ name: Type.String({ minLength: 1 }) }),
  }),
]);
export type ToolChoice = Static<typeof ToolChoiceSchema>;

/**
 * A message as the gateway hands it to a provider: text parts already joined, non-text dropped,
 * `developer` folded into `system`. Built by validation, never checked against this schema: it is
 * here to be the type's one source.
 */
export const ProviderMessageSchema = Type.Union([
  Type.Object({
    role: Type.Union([Type.Literal('system'), Type.Literal('user')]),
    content: Type.String(),
  }),
  Type.Object({
    role: Type.Literal('assistant'),
    content: Nullable(Type.String()),
    tool_calls: Type.Optional(Type.Array(ToolCallSchema)),
  }),
  Type.Object({
    role: Type.Literal('tool'),
    content: Type.String(),
    tool_call_id: Type.String(),
  }),
]);
export type ProviderMessage = Static<typeof ProviderMessageSchema>;

/**
 * A tool call id as a provider takes it back: `id` itself when it is of `pattern` and at most
 * `charsMax` long, else `prefix` and 32 base64url characters of its SHA-256, the same for a call
 * and its reply, distinct for distinct ids. Clients send back ids another deployment of the model
 * made (a Gemini call's carries a few KB of signature; vLLM servers write
 * `functions.get_weather:0`), and each API refuses some (Anthropic: `^[a-zA-Z0-9_-]+$`; OpenAI: at
 * most 40 characters): the conversation must survive a failover.
 */
export function toolCallIdAs(
  id: string,
  pattern: RegExp | null,
  charsMax: number,
  prefix: string,
): string {
  if (id.length <= charsMax && (pattern === null || pattern.test(id))) return id;
  return prefix + createHash('sha256').update(id).digest('base64url').slice(0, 32);
}

/**
 * Text a provider takes as a message: Anthropic refuses an empty (or blank) text block, Gemini an
 * empty part, and both a turn without any; OpenAI-style APIs take "". Blank text carries nothing
 * for the model, so those adapters leave it out.
 */
export function isBlank(text: string | null): boolean {
  return text === null || text.trim().length === 0;
}

/**
 * The user turn an adapter sends where leaving out blank messages would change the request: when
 * nothing of the conversation has text left (every message was blank or dropped parts, such as
 * images), which the APIs refuse, and when a conversation that ended with the user's turn would
 * end with the assistant's, which they read as a prefill to continue. OpenAI's would answer such
 * requests all the same.
 */
export const EMPTY_CONVERSATION_TEXT = '.';

/**
 * Whether the turns an adapter built (`modelRole` is its API's name for the model's) need the
 * EMPTY_CONVERSATION_TEXT user turn: there are none, or they end with the model's turn where the
 * conversation did not (a prefill the model would continue). A system message after the
 * assistant's turn counts as not ending with it: OpenAI's model answers anew, and the adapters
 * move system text out of the turns.
 */
export function needsClosingUserTurn(
  built: readonly { role: string }[],
  modelRole: string,
  messages: readonly ProviderMessage[],
): boolean {
  if (built.length === 0) return true;
  return built[built.length - 1]!.role === modelRole && messages.at(-1)?.role !== 'assistant';
}
