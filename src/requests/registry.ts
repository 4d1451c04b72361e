// Live actors by request id: the place cancel, status and graceful shutdown find a running request.

import type { Attempt } from '../state/events.ts';
import type { RequestRecord } from '../state/records.ts';
import { IdMap } from '../util/id-map.ts';
import type { RequestActor } from './actor.ts';

export class ActorRegistry {
  /** An IdMap, not a Map: an actor must not outlive its request (util/id-map.ts). */
  private readonly actors = new IdMap<RequestActor>();
  /** Requests running per API key: the shares `admits` weighs. */
  private readonly byKey = new Map<string, number>();
  private answersAwaited = 0;

  constructor(readonly inFlightMax: number) {}

  get size(): number {
    return this.actors.size;
  }

  /**
   * Requests running whose answer is one body (not a stream): each commits its finish as soon as
   * its provider answers, so these are the commits a group commit can expect soon. A stream
   * commits at its start and at its end only; counting the ones mid-stream made every fsync under
   * stream load wait turns for commits that were not coming (bench/README, issue 15: +6 µs of CPU
   * per stream).
   */
  get unstreamedSize(): number {
    return this.answersAwaited;
  }

  /**
   * Whether `keyId` may start one more request (CONTRACT §8: one key cannot take every slot). Below
   * `inFlightMax` anyone may; at it, only a key running fewer than its fair share (the bound
   * divided among the keys running requests, this one included). Keys within their share can only
   * add up to the bound again, so at most twice the bound ever run at once.
   */
  admits(keyId: string): boolean {
    if (this.actors.size < this.inFlightMax) return true;
    const own = this.byKey.get(keyId) ?? 0;
    const keys = this.byKey.size + (own === 0 ? 1 : 0);
    return own < Math.floor(this.inFlightMax / keys);
  }

  add(actor: RequestActor): void {
    this.actors.set(actor.id, actor);
    if (!actor.init.stream) this.answersAwaited++;
    const keyId = actor.init.keyId;
    this.byKey.set(keyId, (this.byKey.get(keyId) ?? 0) + 1);
  }

  remove(actor: RequestActor): void {
    if (this.actors.get(actor.id) !== actor) return;
    this.actors.delete(actor.id);
    if (!actor.init.stream) this.answersAwaited--;
    const keyId = actor.init.keyId;
    const left = (this.byKey.get(keyId) ?? 1) - 1;
    if (left === 0) this.byKey.delete(keyId);
    else this.byKey.set(keyId, left);
  }

  get(id: string): RequestActor | undefined {
    return this.actors.get(id);
  }

  /**
   * Resolves once what memory holds of request `id` is durable, for a reader that must report
   * nothing a crash could take back: its start, or, when it began its finish meanwhile (a request
   * cancelled while its start was being synced does so as soon as that sync ends), its finish.
   * Resolves at once for a request not running; never rejects (the caller checks the log).
   */
  async durable(id: string): Promise<void> {
    let waited: Promise<void> | undefined;
    for (;;) {
      const next = this.actors.get(id)?.durable;
      if (next === undefined || next === waited) return;
      waited = next;
      await next;
    }
  }

  /**
   * The deployments a request tried (CONTRACT §7): its record's once finished, its actor's while it
   * runs.
   */
  attemptsOf(record: RequestRecord): readonly Attempt[] {
    return record.attempts ?? this.get(record.id)?.attempts ?? NO_ATTEMPTS;
  }

  all(): RequestActor[] {
    return this.actors.values();
  }
}

const NO_ATTEMPTS: readonly Attempt[] = Object.freeze([]);
