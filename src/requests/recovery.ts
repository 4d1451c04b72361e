// Crash recovery: requests that were in flight when the gateway died end as `error`/`interrupted`.
import type { StateStore } from '../state/store.ts';
import type { Logger } from '../util/log.ts';

/** A gateway crash is none of cancel, completion or provider error: every such hold is released. */
export async function finishInterrupted(store: StateStore, logger: Logger): Promise<number> {
  const ids = [...store.state.inFlight.keys()];
  if (ids.length === 0) return 0;
  const atMs = Date.now();
  await store.commit(
    ids.map((id) => ({
      type: 'request.finished' as const,
      request_id: id,
      status: 'error' as const,
      error_code: 'interrupted',
      http_status: null,
      usage: null,
      charge: { credits_micro: 0, tokens: 0 },
      budget_spend_micro: 0,
      answers: null,
      at_ms: atMs,
    })),
  );
  logger.warn(
    { requests: ids.length },
    'recovery: requests in flight at the last stop ended as interrupted; holds released',
  );
  return ids.length;
}
