// A fake Gemini API (`models/{model}:generateContent`, `:streamGenerateContent?alt=sse`) for
// tests, answering as the real one does. Format from the SDK's own sources
// (node_modules/@google/genai/dist/node/index.mjs and genai.d.ts): GenerateContentResponse,
// Candidate, Part.functionCall and GenerateContentResponseUsageMetadata, which the SDK copies field
// by field (an unknown field is dropped); `processStreamResponse` for the framing (`data: <json>`
// events ended by a blank line; Gemini ends them with `\r\n\r\n`, no `[DONE]`: the stream's end is
// its end); `throwErrorIfNotOK` and `throwIfStreamErrorChunk` for errors, which are Google's
// `{error: {code, message, status}}`. Each stream chunk's usageMetadata is the running total so far
// (the SDK's StreamContinuation says so: "the latest one is the hop's usage (chunks are not
// summed)"), so earlier chunks here carry partial usage and only the last has candidatesTokenCount.
//
// Mid-stream failure (`midstream_error`): after a 200 and some `data:` events, Gemini writes the
// error as a bare, pretty-printed JSON object, not as a `data:` event, and closes the stream. That
// is what the field reports show (googleapis/python-genai#1162: the error arrives line by line,
// `{`, `  "error": {`, …, which Python's per-line `json.loads` chokes on; googleapis/js-genai#461:
// "Incomplete JSON segment at the end" when it shares a read with a data event), and why the JS SDK
// parses each raw read as JSON before splitting events (`throwIfStreamErrorChunk`). A client that
// only reads `data:` lines sees the stream end with no finishReason: it must take that as a
// failure.
// Errors on a stream request are sent with `content-type: text/event-stream` as the real API did
// (googleapis/js-genai#346), so a client must not rely on the content type to find the error.
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

/** Final usageMetadata of every `text` and `tools` answer. */
export const GEMINI_USAGE = {
  promptTokenCount: 11,
  candidatesTokenCount: 4,
  thoughtsTokenCount: 3,
  totalTokenCount: 18,
} as const;

/** How `text` streams split ANSWER_TEXT, one piece per chunk. */
export const GEMINI_TEXT_PIECES = ['Hel', 'lo', ' there'] as const;

const PATH = /^\/v1beta\/models\/([^/:]+):(generateContent|streamGenerateContent)$/;
const SSE_HEADERS = { 'content-type': 'text/event-stream' };

let sequence = 0;

function googleError(code: number, status: string, message: string) {
  return { error: { code, message, status } };
}

function errorResponse(stream: boolean, code: number, status: string, message: string): Response {
  return new Response(JSON.stringify(googleError(code, status, message), null, 2), {
    status: code,
    headers: { 'content-type': stream ? 'text/event-stream' : 'application/json; charset=UTF-8' },
  });
}

/** The checks the real API makes before answering that a gateway adapter could get wrong. */
function invalidRequest(request: Request, url: URL, stream: boolean, body: any) {
  if (!request.headers.get('x-goog-api-key') && !url.searchParams.get('key')) {
    return errorResponse(
      stream,
      403,
      'PERMISSION_DENIED',
      "Method doesn't allow unregistered callers (callers without established identity). " +
        'Please use API Key or other form of API consumer identity to call this API.',
    );
  }
  if (typeof body !== 'object' || body === null) {
    return errorResponse(stream, 400, 'INVALID_ARGUMENT', 'Invalid JSON payload received.');
  }
  if (!Array.isArray(body.contents) || body.contents.length === 0) {
    return errorResponse(
      stream,
      400,
      'INVALID_ARGUMENT',
      '* GenerateContentRequest.contents: contents is not specified\n',
    );
  }
  for (const content of body.contents) {
    if (content?.role !== undefined && content.role !== 'user' && content.role !== 'model') {
      return errorResponse(
        stream,
        400,
        'INVALID_ARGUMENT',
        'Please use a valid role: user, model.',
      );
    }
    if (!Array.isArray(content?.parts) || content.parts.length === 0)
      return errorResponse(
        stream,
        400,
        'INVALID_ARGUMENT',
        '* GenerateContentRequest.contents.parts: contents.parts must not be empty.\n',
      );
    if (content.parts.some((part: any) => 'text' in part && part.text === ''))
      return errorResponse(
        stream,
        400,
        'INVALID_ARGUMENT',
        'Unable to submit request because it has an empty text parameter. Add a value to the ' +
          'parameter and try again.',
      );
  }
  return undefined;
}

/** The first declared function's name: `tools[].functionDeclarations[].name`. */
function functionName(body: any): string {
  for (const tool of Array.isArray(body?.tools) ? body.tools : []) {
    const declarations = tool?.functionDeclarations ?? tool?.function_declarations;
    const name = Array.isArray(declarations) ? declarations[0]?.name : undefined;
    if (typeof name === 'string') return name;
  }
  return FALLBACK_TOOL;
}

/** One GenerateContentResponse (a whole answer, or one stream chunk). */
function response(
  model: string,
  responseId: string,
  parts: object[],
  finished: boolean,
  usage: object,
) {
  const candidate: Record<string, unknown> = { content: { parts, role: 'model' } };
  if (finished) candidate.finishReason = 'STOP';
  candidate.index = 0;
  return { candidates: [candidate], usageMetadata: usage, modelVersion: model, responseId };
}

const promptDetails = [{ modality: 'TEXT', tokenCount: GEMINI_USAGE.promptTokenCount }];
const finalUsage = { ...GEMINI_USAGE, promptTokensDetails: promptDetails };
/** The running total before the last chunk: the prompt and the thinking, no candidates yet. */
const partialUsage = {
  promptTokenCount: GEMINI_USAGE.promptTokenCount,
  thoughtsTokenCount: GEMINI_USAGE.thoughtsTokenCount,
  totalTokenCount: GEMINI_USAGE.promptTokenCount + GEMINI_USAGE.thoughtsTokenCount,
  promptTokensDetails: promptDetails,
};

function data(chunk: object): string {
  return `data: ${JSON.stringify(chunk)}\r\n\r\n`;
}

/**
 * The signature a thinking model (Gemini 3) puts on each function call part, which it wants back
 * with the call in the next turn's history (ai.google.dev/gemini-api/docs/thought-signatures):
 * opaque bytes in base64, `+` and `/` included, a few KB long as real ones are.
 */
export const GEMINI_THOUGHT_SIGNATURE = Buffer.from(
  Array.from({ length: 1_537 }, (_, i) => (i * 37 + 11) & 255),
).toString('base64');

function functionCallPart(body: any) {
  return {
    functionCall: { name: functionName(body), args: toolInputFor(firstSchema(body)) },
    thoughtSignature: GEMINI_THOUGHT_SIGNATURE,
  };
}

/** The first declared function's parameters (`parametersJsonSchema`, or `parameters`). */
function firstSchema(body: any): unknown {
  for (const tool of Array.isArray(body?.tools) ? body.tools : []) {
    const declarations = tool?.functionDeclarations ?? tool?.function_declarations;
    const first = Array.isArray(declarations) ? declarations[0] : undefined;
    if (first) return first.parametersJsonSchema ?? first.parameters ?? null;
  }
  return undefined;
}

function streamChunks(mode: VendorMode, model: string, responseId: string, body: any): string[] {
  if (mode === 'tools') {
    return [data(response(model, responseId, [functionCallPart(body)], true, finalUsage))];
  }
  return GEMINI_TEXT_PIECES.map((text, index) => {
    const last = index === GEMINI_TEXT_PIECES.length - 1;
    return data(response(model, responseId, [{ text }], last, last ? finalUsage : partialUsage));
  });
}

function answer(request: Request, mode: VendorMode, model: string, stream: boolean, body: any) {
  const responseId = `fakeResponse${++sequence}`;
  switch (mode) {
    case 'error429':
      return errorResponse(
        stream,
        429,
        'RESOURCE_EXHAUSTED',
        'You exceeded your current quota, please check your plan and billing details.',
      );
    case 'error500':
      return errorResponse(
        stream,
        500,
        'INTERNAL',
        'An internal error has occurred. Please retry or report in ' +
          'https://developers.generativeai.google/guide/troubleshooting',
      );
    case 'error529':
      return errorResponse(
        stream,
        503,
        'UNAVAILABLE',
        'The model is overloaded. Please try again later.',
      );
    case 'error400':
      return errorResponse(
        stream,
        400,
        'INVALID_ARGUMENT',
        `The input token count exceeds the maximum allowed: "${SECRET_PROMPT} what is the weather"`,
      );
    case 'hang':
      return never();
    case 'garbage':
      if (stream)
        return new Response('data: {"candidates": [oops\r\n\r\n', { headers: SSE_HEADERS });
      return new Response('<html><body>502 Bad Gateway</body></html>', {
        headers: { 'content-type': 'application/json; charset=UTF-8' },
      });
    case 'endless': {
      const chunk = (text: string) =>
        data(response(model, responseId, [{ text }], false, partialUsage));
      const more = () => ({ frame: chunk('more '), done: false });
      return new Response(pacedStream(request.signal, [chunk('first ')], STREAM_TICK_MS, more), {
        headers: SSE_HEADERS,
      });
    }
    case 'midstream_error': {
      const head = [data(response(model, responseId, [{ text: 'Hello' }], false, partialUsage))];
      const failure = googleError(503, 'UNAVAILABLE', 'The model is overloaded.');
      const fail = () => ({ frame: `${JSON.stringify(failure, null, 2)}\n`, done: true });
      return new Response(pacedStream(request.signal, head, MIDSTREAM_PAUSE_MS, fail), {
        headers: SSE_HEADERS,
      });
    }
    case 'text':
    case 'gated':
    case 'tools': {
      if (stream) {
        const chunks = streamChunks(mode, model, responseId, body).join('');
        return new Response(chunks, { headers: SSE_HEADERS });
      }
      const parts = mode === 'tools' ? [functionCallPart(body)] : [{ text: ANSWER_TEXT }];
      return Response.json(response(model, responseId, parts, true, finalUsage));
    }
  }
}

/** A fake Gemini upstream on a free port; `url` is its base_url (`…/v1beta`). */
export function startFakeGemini(mode: VendorMode = 'text'): FakeVendor {
  return startFakeVendor(mode, '/v1beta', async (request, url, body, fake) => {
    const route = PATH.exec(url.pathname);
    if (request.method !== 'POST' || route === null) {
      return errorResponse(
        false,
        404,
        'NOT_FOUND',
        `The requested URL ${url.pathname} was not found.`,
      );
    }
    const model = decodeURIComponent(route[1]!);
    const stream = route[2] === 'streamGenerateContent';
    return (
      invalidRequest(request, url, stream, body) ?? answer(request, fake.mode, model, stream, body)
    );
  });
}
