// GET /admin/v1/requests?state=in_progress (CONTRACT §6): the requests holding credits right now,
// oldest first. Bounded by admission (limits.max_in_flight), so read in one go.
import { microToCredits } from '../keys/store.ts';
import type { ActorRegistry } from '../requests/registry.ts';
import type { GatewayState } from '../state/apply.ts';
import type { LiveRequest } from './model.ts';

export function liveRequests(
  state: GatewayState,
  registry: ActorRegistry,
  nowMs: number,
): LiveRequest[] {
  const live: LiveRequest[] = [];
  for (const record of state.inFlight.values()) {
    live.push({
      id: record.id,
      key_id: record.keyId,
      service: record.service,
      model: record.model,
      stream: record.stream,
      created: Math.floor(record.createdAtMs / 1000),
      age_ms: Math.max(0, nowMs - record.createdAtMs),
      held_credits: microToCredits(record.hold.credits_micro),
      attempt: registry.get(record.id)?.attempts.length ?? 0,
    });
  }
  return live.sort((a, b) => b.age_ms - a.age_ms);
}
