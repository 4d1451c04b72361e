// Request bodies: the size limit is enforced while reading (413 before parsing), chunked bodies too.
import { GatewayError } from './errors.ts';

const DECODER = new TextDecoder('utf-8');

function tooLarge(maxBytes: number): GatewayError {
  return new GatewayError('request_too_large', `The request body is larger than ${maxBytes} bytes.`);
}

/** Reads the whole body as text, refusing it as soon as it passes `maxBytes`. */
export async function readBodyText(request: Request, maxBytes: number): Promise<string> {
  const declared = request.headers.get('content-length');
  if (declared !== null) {
    const length = Number(declared);
    if (Number.isFinite(length) && length > maxBytes) throw tooLarge(maxBytes);
    // A declared length within the limit bounds what HTTP/1.1 reads for this request, so the native
    // reader can take it whole: no JS stream, no chunk list (the common case, and the hot path).
    if (Number.isFinite(length)) return request.text();
  }
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

/** 400 invalid_request_error for malformed JSON. */
export function parseJsonBody(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    throw new GatewayError('invalid_request_error', 'The body is not valid JSON.', { param: null });
  }
}
