// Crash recovery: requests that were in flight when the gateway died end as `error`/`interrupted`.
import { finishInterrupted as finishAll } from '../state/commands.ts';
import type { StateStore } from '../state/store.ts';
import type { Logger } from '../util/log.ts';

/** A gateway crash is none of cancel, completion or provider error: every such hold is released. */
export async function finishInterrupted(store: StateStore, logger: Logger): Promise<number> {
  const ids = [...store.state.inFlight.keys()];
  if (ids.length === 0) return 0;
  await finishAll(store, ids, Date.now());
  logger.warn(
    { requests: ids.length },
    'recovery: requests in flight at the last stop ended as interrupted; holds released',
  );
  return ids.length;
}
