// Request bodies: the size limit is enforced while reading (413 before parsing), chunked bodies too.
import { GatewayError } from './errors.ts';

const DECODER = new TextDecoder('utf-8');

function tooLarge(maxBytes: number): GatewayError {
  return new GatewayError('request_too_large', `The request body is larger than ${maxBytes} bytes.`);
}

/**
 * Reads the whole body as text, refusing it as soon as it passes `maxBytes`. Not an async function: the
 * usual body, sized by Content-Length, is the runtime's own read, returned as is.
 */
export function readBodyText(request: Request, maxBytes: number): Promise<string> {
  const declared = request.headers.get('content-length');
  if (declared !== null) {
    const length = Number(declared);
    if (Number.isFinite(length) && length > maxBytes) return Promise.reject(tooLarge(maxBytes));
    // A declared length within the limit bounds what HTTP/1.1 reads for this request, so the native
    // reader can take it whole: no JS stream, no chunk list (the common case, and the hot path).
    if (Number.isFinite(length)) return request.text();
  }
  return readChunked(request, maxBytes);
}

/** A body without a length (chunked): read piece by piece, stopped at the limit. */
async function readChunked(request: Request, maxBytes: number): Promise<string> {
  const body = request.body;
  if (!body) return '';
  const reader = body.getReader();
  const chunks: Uint8Array[] = [];
  let totalBytes = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    totalBytes += value.byteLength;
    if (totalBytes > maxBytes) {
      // Stop reading at once: the rest of an oversized body is never buffered.
      void reader.cancel().catch(() => {});
      throw tooLarge(maxBytes);
    }
    chunks.push(value);
  }
  if (chunks.length === 1) return DECODER.decode(chunks[0]);
  const all = new Uint8Array(totalBytes);
  let offset = 0;
  for (const chunk of chunks) {
    all.set(chunk, offset);
    offset += chunk.byteLength;
  }
  return DECODER.decode(all);
}

/** Objects and arrays may nest this deep in a request body; deeper is refused before anything recurses. */
export const JSON_DEPTH_MAX = 256;

/**
 * 400 invalid_request_error for malformed JSON, and for JSON nested deeper than JSON_DEPTH_MAX: every
 * later step (validation, token counts, fingerprints, a provider's own serialization) may recurse, and
 * a stack overflow there would be a 500 for what is the client's mistake.
 */
export function parseJsonBody(text: string): unknown {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new GatewayError('invalid_request_error', 'The body is not valid JSON.', { param: null });
  }
  // Valid JSON nested deeper than the limit has more than that many openers and as many closers, so a
  // shorter text cannot be; most bodies skip the walk.
  if (text.length > 2 * JSON_DEPTH_MAX && nestsDeeperThan(value, JSON_DEPTH_MAX)) {
    throw new GatewayError('invalid_request_error', `The JSON body nests deeper than ${JSON_DEPTH_MAX} levels.`, {
      param: null,
      detail: `JSON values may nest at most ${JSON_DEPTH_MAX} levels deep`,
    });
  }
  return value;
}

/** Whether objects and arrays in `value` nest more than `levels` deep; iterative, so it cannot overflow. */
export function nestsDeeperThan(value: unknown, levels: number): boolean {
  if (value === null || typeof value !== 'object') return false;
  const pending: object[] = [value];
  const depths: number[] = [1];
  while (pending.length > 0) {
    const node = pending.pop()!;
    const depth = depths.pop()!;
    if (depth > levels) return true;
    if (Array.isArray(node)) {
      for (const item of node) {
        if (item !== null && typeof item === 'object') {
          pending.push(item);
          depths.push(depth + 1);
        }
      }
    } else {
      for (const key in node) {
        const item = (node as Record<string, unknown>)[key];
        if (item !== null && typeof item === 'object') {
          pending.push(item);
          depths.push(depth + 1);
        }
      }
    }
  }
  return false;
}
