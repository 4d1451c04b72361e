// A fake Anthropic Messages API (`POST /v1/messages`) for tests, answering as the real one does.
// Format from the SDK's own sources (node_modules/@anthropic-ai/sdk/src): Message, Usage and the
// Raw*Event types in resources/messages/messages.ts; core/streaming.ts for the SSE framing (events
// with no `event:` line are skipped, `event: error` is thrown as an APIError); lib/MessageStream.ts
// for how a stream adds up (message_delta's usage.output_tokens replaces message_start's, so the
// start carries a provisional 1, as the API does); core/error.ts and resources/shared.ts for the
// error body `{type: 'error', error: {type, message}}`. Event order, `ping` and the mid-stream
// `event: error` with overloaded_error follow docs.anthropic.com/en/api/messages-streaming; the
// status ⇄ error type table follows docs.anthropic.com/en/api/errors (529 is overloaded_error).
// Checked by the official SDK in tests/providers/fakes.test.ts.
import {
  ANSWER_TEXT,
  FALLBACK_TOOL,
  type FakeVendor,
  MIDSTREAM_PAUSE_MS,
  never,
  pacedStream,
  SECRET_PROMPT,
  STREAM_TICK_MS,
  startFakeVendor,
  toolInputFor,
  type VendorMode,
} from './fake-vendor.ts';

/** Usage of every `text` and `tools` answer. */
export const ANTHROPIC_USAGE = {
  input_tokens: 11,
  cache_creation_input_tokens: 3,
  cache_read_input_tokens: 2,
  output_tokens: 4,
} as const;
/** The text block that precedes the tool_use block in `tools` answers. */
export const ANTHROPIC_TOOL_PREAMBLE = "I'll look that up.";

const SSE_HEADERS = {
  'content-type': 'text/event-stream; charset=utf-8',
  'cache-control': 'no-cache',
};

let sequence = 0;

function nextId(prefix: string): string {
  sequence++;
  return `${prefix}_01Fake${sequence.toString().padStart(18, '0')}`;
}

function sse(type: string, data: object): string {
  return `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
}

function errorBody(type: string, message: string, requestId: string) {
  return { type: 'error', error: { type, message }, request_id: requestId };
}

function errorResponse(
  status: number,
  type: string,
  message: string,
  headers: Record<string, string> = {},
): Response {
  const requestId = nextId('req');
  return Response.json(errorBody(type, message, requestId), {
    status,
    headers: { 'request-id': requestId, ...headers },
  });
}

/** The checks the real API makes before answering that a gateway adapter could get wrong. */
function invalidRequest(request: Request, body: any): Response | undefined {
  // The API takes the key as `x-api-key` (what the gateway sends, CONTRACT §7) or, since the SDK's
  // 1.0 (API version 2026-10-21), as `Authorization: Bearer <key>` (what the SDK sends).
  const bearer = request.headers.get('authorization')?.startsWith('Bearer ') === true;
  if (!request.headers.get('x-api-key') && !bearer) {
    return errorResponse(401, 'authentication_error', 'x-api-key header is required');
  }
  if (!request.headers.get('anthropic-version')) {
    return errorResponse(400, 'invalid_request_error', 'anthropic-version: header is required');
  }
  if (typeof body !== 'object' || body === null) {
    return errorResponse(400, 'invalid_request_error', 'Request body is not valid JSON');
  }
  if (typeof body.model !== 'string') {
    return errorResponse(400, 'invalid_request_error', 'model: Field required');
  }
  if (typeof body.max_tokens !== 'number') {
    return errorResponse(400, 'invalid_request_error', 'max_tokens: Field required');
  }
  if (!Array.isArray(body.messages)) {
    return errorResponse(400, 'invalid_request_error', 'messages: Field required');
  }
  // The sampling rules the API enforces that OpenAI's does not (its own messages).
  if (typeof body.temperature === 'number' && (body.temperature < 0 || body.temperature > 1))
    return errorResponse(400, 'invalid_request_error', 'temperature: range: 0..1');
  if (body.temperature !== undefined && body.top_p !== undefined)
    return errorResponse(
      400,
      'invalid_request_error',
      '`temperature` and `top_p` cannot both be specified for this model. Please use only one.',
    );
  if (
    Array.isArray(body.stop_sequences) &&
    body.stop_sequences.some((stop: unknown) => typeof stop !== 'string' || stop.trim() === '')
  )
    return errorResponse(
      400,
      'invalid_request_error',
      'stop_sequences: each stop sequence must contain non-whitespace',
    );
  for (const [at, message] of body.messages.entries()) {
    if (message?.role !== 'user' && message?.role !== 'assistant') {
      return errorResponse(
        400,
        'invalid_request_error',
        `messages: Unexpected role "${message?.role}". The Messages API accepts a top-level ` +
          '`system` parameter, not "system" as an input message role.',
      );
    }
    const problem = contentProblem(message.content, at);
    if (problem !== null) return errorResponse(400, 'invalid_request_error', problem);
  }
  return undefined;
}

/** The API's own checks of a message's content (its words), or null. */
function contentProblem(content: unknown, at: number): string | null {
  if (content === '' || (Array.isArray(content) && content.length === 0))
    return (
      `messages.${at}: all messages must have non-empty content except for the optional final ` +
      'assistant message'
    );
  if (!Array.isArray(content)) return null;
  for (const [index, block] of content.entries()) {
    if (block?.type === 'text' && (typeof block.text !== 'string' || block.text.trim() === ''))
      return 'messages: text content blocks must contain non-whitespace text';
    const field = block?.type === 'tool_use' ? 'id' : 'tool_use_id';
    if (
      (block?.type === 'tool_use' || block?.type === 'tool_result') &&
      !TOOL_ID_RE.test(block[field])
    )
      return (
        `messages.${at}.content.${index}.${block.type}.${field}: ` +
        "String should match pattern '^[a-zA-Z0-9_-]+$'"
      );
  }
  return null;
}

const TOOL_ID_RE = /^[a-zA-Z0-9_-]+$/;

function toolInput(body: any): Record<string, unknown> {
  const tool = body?.tools?.[0];
  return toolInputFor(tool === undefined ? undefined : (tool.input_schema ?? null));
}

function toolName(body: any): string {
  const name = body?.tools?.[0]?.name;
  return typeof name === 'string' ? name : FALLBACK_TOOL;
}

/** A complete Message, as the non-stream API returns it. */
function message(model: string, content: object[], stopReason: string) {
  return {
    id: nextId('msg'),
    type: 'message',
    role: 'assistant',
    model,
    content,
    stop_reason: stopReason,
    stop_sequence: null,
    usage: { ...ANTHROPIC_USAGE, service_tier: 'standard' },
  };
}

function messageStart(model: string): string {
  const whole = message(model, [], '');
  const start = { ...whole, stop_reason: null, usage: { ...whole.usage, output_tokens: 1 } };
  return sse('message_start', { message: start });
}

function textDelta(index: number, text: string): string {
  return sse('content_block_delta', { index, delta: { type: 'text_delta', text } });
}

function textStart(index: number): string {
  return sse('content_block_start', { index, content_block: { type: 'text', text: '' } });
}

/** The stream's events for one text block at `index`, its text split in two deltas. */
function textBlock(index: number, text: string): string[] {
  const cut = Math.ceil(text.length / 2);
  return [
    textStart(index),
    textDelta(index, text.slice(0, cut)),
    textDelta(index, text.slice(cut)),
    sse('content_block_stop', { index }),
  ];
}

/**
 * The tool_use block's events: the input arrives as JSON text cut across several deltas; an empty
 * input (a tool without parameters) as one empty delta, as the API sends it.
 */
function toolBlock(index: number, name: string, input: Record<string, unknown>): string[] {
  const json = Object.keys(input).length === 0 ? '' : JSON.stringify(input);
  const pieces = [''];
  for (let at = 0; at < json.length; at += 9) pieces.push(json.slice(at, at + 9));
  return [
    sse('content_block_start', {
      index,
      content_block: { type: 'tool_use', id: nextId('toolu'), name, input: {} },
    }),
    ...pieces.map((partial_json) =>
      sse('content_block_delta', { index, delta: { type: 'input_json_delta', partial_json } }),
    ),
    sse('content_block_stop', { index }),
  ];
}

function messageEnd(stopReason: string): string[] {
  return [
    sse('message_delta', {
      delta: { stop_reason: stopReason, stop_sequence: null },
      usage: { output_tokens: ANTHROPIC_USAGE.output_tokens },
    }),
    sse('message_stop', {}),
  ];
}

function streamFrames(mode: VendorMode, model: string, body: any): string[] {
  const ping = sse('ping', {});
  if (mode === 'tools') {
    const [startText, ...restText] = textBlock(0, ANTHROPIC_TOOL_PREAMBLE);
    return [
      messageStart(model),
      startText!,
      ping,
      ...restText,
      ...toolBlock(1, toolName(body), toolInput(body)),
      ...messageEnd('tool_use'),
    ];
  }
  const [startText, ...restText] = textBlock(0, ANSWER_TEXT);
  return [messageStart(model), startText!, ping, ...restText, ...messageEnd('end_turn')];
}

function answer(request: Request, mode: VendorMode, body: any): Response | Promise<Response> {
  const model: string = body.model;
  const stream = body.stream === true;
  switch (mode) {
    case 'error429':
      return errorResponse(
        429,
        'rate_limit_error',
        'Number of request tokens has exceeded your per-minute rate limit',
        { 'retry-after': '1' },
      );
    case 'error500':
      return errorResponse(500, 'api_error', 'Internal server error');
    case 'error529':
      return errorResponse(529, 'overloaded_error', 'Overloaded');
    case 'error400':
      return errorResponse(
        400,
        'invalid_request_error',
        `prompt is too long: "${SECRET_PROMPT} what is the weather" exceeds the context window`,
      );
    case 'hang':
      return never();
    case 'garbage':
      if (stream) {
        const frame = 'event: message_start\ndata: {"type": "message_start", "message": {oops\n\n';
        return new Response(frame, { headers: SSE_HEADERS });
      }
      return new Response('<html><body>502 Bad Gateway</body></html>', {
        headers: { 'content-type': 'application/json' },
      });
    case 'endless': {
      const head = [messageStart(model), textStart(0), textDelta(0, 'first ')];
      const more = () => ({ frame: textDelta(0, 'more '), done: false });
      return new Response(pacedStream(request.signal, head, STREAM_TICK_MS, more), {
        headers: SSE_HEADERS,
      });
    }
    case 'midstream_error': {
      const head = [messageStart(model), textStart(0), textDelta(0, 'Hello')];
      const overloaded = errorBody('overloaded_error', 'Overloaded', nextId('req'));
      const fail = () => ({ frame: sse('error', overloaded), done: true });
      return new Response(pacedStream(request.signal, head, MIDSTREAM_PAUSE_MS, fail), {
        headers: SSE_HEADERS,
      });
    }
    case 'text':
    case 'gated':
    case 'tools': {
      const headers = { 'request-id': nextId('req') };
      if (stream) {
        const frames = streamFrames(mode, model, body).join('');
        return new Response(frames, { headers: { ...SSE_HEADERS, ...headers } });
      }
      const content: object[] = [];
      if (mode === 'tools') {
        content.push({ type: 'text', text: ANTHROPIC_TOOL_PREAMBLE });
        content.push({
          type: 'tool_use',
          id: nextId('toolu'),
          name: toolName(body),
          input: toolInput(body),
        });
        return Response.json(message(model, content, 'tool_use'), { headers });
      }
      content.push({ type: 'text', text: ANSWER_TEXT });
      return Response.json(message(model, content, 'end_turn'), { headers });
    }
  }
}

/** A fake Anthropic upstream on a free port; `url` is its base_url (`…/v1`). */
export function startFakeAnthropic(mode: VendorMode = 'text'): FakeVendor {
  return startFakeVendor(mode, '/v1', async (request, url, body, fake) => {
    if (request.method !== 'POST' || url.pathname !== '/v1/messages') {
      return errorResponse(404, 'not_found_error', 'Not found');
    }
    return invalidRequest(request, body) ?? answer(request, fake.mode, body);
  });
}
