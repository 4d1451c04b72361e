// Cancel of a running request (CONTRACT §4), one rule for the key's own cancel and the admin's:
// the provider call is aborted and the answer waits, a bounded while, for the hold's release.
import { type Static, Type } from '@sinclair/typebox';
import type { Config } from '../config/model.ts';
import { RequestStatusSchema } from '../state/events.ts';
import type { RequestRecord } from '../state/records.ts';
import type { StateStore } from '../state/store.ts';
import { GatewayError } from '../util/errors.ts';
import { statusUrl } from './admit.ts';
import type { ActorRegistry } from './registry.ts';

/**
 * How long a cancel waits for the provider to stop and the hold to be released before it answers.
 * The run loop wakes on the abort even when its stream's client stopped reading, so this is one
 * commit; the bound only keeps a provider that ignores its signal from holding the answer past the
 * contract's 1 s.
 */
const CANCEL_SETTLE_MS_MAX = 1_000;

/** The 202 of a cancel, the key's own or the admin's (the OpenAPI document shows it). */
export const CancelAnswerSchema = Type.Object({
  request_id: Type.String(),
  cancel_requested: Type.Literal(true),
  request_status: RequestStatusSchema,
  status_url: Type.String(),
});
export type CancelAnswer = Static<typeof CancelAnswerSchema>;

/**
 * Cancels `record`'s request. A finished (or finishing) one is 409 request_already_completed once
 * its end is durable; a running one answers after its hold is released, so a status read that
 * follows sees it.
 */
export async function cancelRequest(
  store: StateStore,
  registry: ActorRegistry,
  config: Config,
  record: RequestRecord,
): Promise<CancelAnswer> {
  const url = statusUrl(config, record.service, record.id);
  const actor = registry.get(record.id);
  if (record.status !== 'in_progress' || !actor || !actor.abort('cancelled')) {
    // Finished, or finishing: report the end once it is durable.
    if (actor) await actor.settled;
    store.checkAvailable();
    const current = store.state.request(record.id)?.status ?? record.status;
    if (current !== 'in_progress' || !actor) {
      throw new GatewayError(
        'request_already_completed',
        `The request ${record.id} has already finished (${current}).`,
        {
          param: null,
          topLevel: { request_id: record.id, request_status: current, status_url: url },
          headers: { 'x-service-request-status': url, 'x-request-id': record.id },
        },
      );
    }
  }
  let timer: ReturnType<typeof setTimeout> | undefined;
  await Promise.race([
    actor!.settled,
    new Promise<void>((resolve) => (timer = setTimeout(resolve, CANCEL_SETTLE_MS_MAX))),
  ]);
  clearTimeout(timer);
  store.checkAvailable();
  return {
    request_id: record.id,
    cancel_requested: true,
    request_status: store.state.request(record.id)?.status ?? 'cancelled',
    status_url: url,
  };
}
