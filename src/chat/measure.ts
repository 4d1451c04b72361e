// A chat request's admission inputs (Idempotency-Key fingerprint, prompt tokens): measured on the
// event loop when cheap, else by the count worker after the cheap refusals.
import type { CountJob } from '../billing/count-jobs.ts';
import {
  countOffLoop,
  type Idempotency,
  OFFLOAD_BODY_CHARS,
  type OffloadHost,
} from '../billing/offload.ts';
import { countPromptTokensInline, rememberPromptTextTokens } from '../billing/tokens.ts';
import { requestFingerprint } from '../idempotency/fingerprint.ts';
import { statusUrl } from '../requests/admit.ts';
import type { KeyAccount } from '../state/apply.ts';
import type { ClientConnection } from '../util/abort.ts';
import { nextTurn } from '../util/promise.ts';
import type { ChatRequest } from './model.ts';

export interface ChatMeasure {
  idempotency: Idempotency | null;
  /** Past the model's window possibly a partial count (the request is refused either way). */
  promptTokens: number;
}

/**
 * A chat request's Idempotency-Key fingerprint and prompt tokens. The usual request (a small body,
 * a prompt the cache mostly knows) is measured here and now, without a promise; a large one off the
 * event loop (CONTRACT §8), so that no key's 4 MB prompt stalls any other key's request.
 */
export function measureChat(
  gateway: OffloadHost,
  account: KeyAccount,
  chat: ChatRequest,
  body: string,
  json: unknown,
  idempotencyKey: string | null,
  path: string,
  client: ClientConnection | null,
): ChatMeasure | Promise<ChatMeasure> {
  const limit = chat.model.context_window;
  const small = body.length <= OFFLOAD_BODY_CHARS;
  const fingerprint = small && idempotencyKey ? requestFingerprint('POST', path, json) : null;
  const toolsJson = small && chat.tools ? JSON.stringify(chat.tools) : null;
  const promptTokens = small ? countPromptTokensInline(chat.messages, toolsJson, limit) : null;
  if (promptTokens !== null)
    return {
      idempotency: idempotencyKey ? { key: idempotencyKey, fingerprint: fingerprint! } : null,
      promptTokens,
    };
  return measureChatOffLoop(
    gateway,
    account,
    chat,
    body,
    idempotencyKey,
    fingerprint,
    toolsJson,
    path,
    client?.signal ?? null,
  );
}

async function measureChatOffLoop(
  gateway: OffloadHost,
  account: KeyAccount,
  chat: ChatRequest,
  body: string,
  idempotencyKey: string | null,
  fingerprint: string | null,
  toolsJson: string | null,
  path: string,
  signal: AbortSignal | null,
): Promise<ChatMeasure> {
  // The body was parsed and validated in this turn (up to ~20 ms at 4 MB); handing it to the
  // worker (a structured clone of every message) is the next turn's, so that no turn holds the
  // loop for both (CONTRACT §8: 50 ms).
  await nextTurn();
  const toolsInBody = chat.tools !== null && toolsJson === null;
  const job: CountJob = {
    body: (idempotencyKey && fingerprint === null) || toolsInBody ? body : null,
    fingerprintPath: idempotencyKey && fingerprint === null ? path : null,
    prompt: { messages: chat.messages, toolsJson, toolsInBody, limit: chat.model.context_window },
  };
  const result = await countOffLoop(
    gateway,
    'chat',
    (id) => statusUrl(gateway.config, 'chat', id),
    account,
    job,
    idempotencyKey,
    fingerprint,
    signal,
  );
  // The worker's counts of whole texts go to this thread's cache: the next turn of the
  // conversation, or the next request with the same system prompt, is counted here.
  const counts = result.contentCounts!;
  for (let i = 0; i < counts.length; i++) {
    const content = chat.messages[i]!.content;
    if (counts[i]! >= 0 && content) rememberPromptTextTokens(content, counts[i]!);
  }
  return {
    idempotency: idempotencyKey ? { key: idempotencyKey, fingerprint: result.fingerprint! } : null,
    promptTokens: result.tokens,
  };
}
