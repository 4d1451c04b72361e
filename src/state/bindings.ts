// Idempotency-Key bindings: (API key, Idempotency-Key) → the request it created, bounded per key
// (§8).
//
// A binding lives while its request runs and `idempotency_ttl_s` after it ends (its start event
// carries start + TTL, extended at its finish): a request that runs longer than the TTL can never
// run twice under its key (spec 000: at most one task per pair), nor the retry after its end.
//
// Room is made by FairSlots (a key past its own bound loses its own oldest binding; at the total
// bound an expired binding goes first, else the oldest of the key holding the most), so no key's
// traffic can evict the binding of a key within its share: its retry always finds the original and
// is never charged twice.
import { FairSlots } from './fair-slots.ts';

/** Never changed in place (a snapshot serializes the ones it captured after the capture). */
export interface IdempotencyBinding {
  readonly requestId: string;
  readonly fingerprint: string;
  readonly expiresAtMs: number;
}

/** The map key of a binding: API key id and Idempotency-Key, which neither contains NUL. */
export function idempotencyScope(keyId: string, idempotencyKey: string): string {
  return `${keyId}\u0000${idempotencyKey}`;
}

export class BindingTable {
  private readonly slotOf = new Map<string, number>();
  /** Per slot: its scope (to forget it on eviction) and its binding. */
  private scopes: string[] = [];
  private bindings: IdempotencyBinding[] = [];
  /**
   * API key ids as small integers, the owners of FairSlots; bounded by the keys the gateway holds.
   */
  private readonly owners = new Map<string, number>();
  private readonly ownerKeyIds: string[] = [];
  private readonly slots: FairSlots;
  private readonly expiredAt = (slot: number, nowMs: number): boolean =>
    this.expired(this.bindings[slot]!, nowMs);

  /** `running(requestId)`: the request is in flight, so its binding cannot expire yet. */
  constructor(
    capacity: number,
    perKeyMax: number,
    private readonly running: (requestId: string) => boolean,
  ) {
    this.slots = new FairSlots(capacity, perKeyMax, (slot) =>
      this.slotOf.delete(this.scopes[slot]!),
    );
  }

  get size(): number {
    return this.slots.size;
  }

  /** Bindings held for `keyId`, expired ones included until they make room. */
  heldBy(keyId: string): number {
    const owner = this.owners.get(keyId);
    return owner === undefined ? 0 : this.slots.held(owner);
  }

  /** The live binding of the pair, or undefined (unknown, or past its TTL). */
  get(keyId: string, idempotencyKey: string, nowMs: number): IdempotencyBinding | undefined {
    const slot = this.slotOf.get(idempotencyScope(keyId, idempotencyKey));
    if (slot === undefined) return undefined;
    const binding = this.bindings[slot]!;
    return this.expired(binding, nowMs) ? undefined : binding;
  }

  private expired(binding: IdempotencyBinding, nowMs: number): boolean {
    return binding.expiresAtMs <= nowMs && !this.running(binding.requestId);
  }

  /**
   * The request bound to the pair, started at `startedAtMs`, finished at `finishedAtMs`: its
   * binding now lives its TTL (as its start event set it: the log's, not today's config) from the
   * finish. Bound again, as the newest: FairSlots judges expiry by the oldest binding, so expiries
   * must grow in its order (and a new object: bindings never change in place).
   */
  extend(
    keyId: string,
    idempotencyKey: string,
    requestId: string,
    startedAtMs: number,
    finishedAtMs: number,
  ): void {
    const slot = this.slotOf.get(idempotencyScope(keyId, idempotencyKey));
    if (slot === undefined) return;
    const binding = this.bindings[slot]!;
    const expiresAtMs = finishedAtMs + (binding.expiresAtMs - startedAtMs);
    if (binding.requestId !== requestId || expiresAtMs <= binding.expiresAtMs) return;
    this.set(keyId, idempotencyKey, { ...binding, expiresAtMs }, finishedAtMs);
  }

  /**
   * Binds the pair (a binding it had, live or expired, is replaced and counts as new). `nowMs` is
   * the binding event's own time: whether the oldest binding has expired is judged by it, so a
   * replay of the log makes the same choices as the live gateway did.
   */
  set(keyId: string, idempotencyKey: string, binding: IdempotencyBinding, nowMs: number): void {
    const scope = idempotencyScope(keyId, idempotencyKey);
    const previous = this.slotOf.get(scope);
    if (previous !== undefined) {
      this.slotOf.delete(scope);
      this.slots.release(previous);
    }
    let owner = this.owners.get(keyId);
    if (owner === undefined) {
      owner = this.owners.size;
      this.owners.set(keyId, owner);
      this.ownerKeyIds.push(keyId);
    }
    const slot = this.slots.take(owner, this.expiredAt, nowMs);
    this.slotOf.set(scope, slot);
    this.scopes[slot] = scope;
    this.bindings[slot] = binding;
  }

  /**
   * Frees the pair if it is bound to `requestId` (a decision that ended without one frees its key).
   */
  deleteIfBoundTo(keyId: string, idempotencyKey: string, requestId: string): void {
    const scope = idempotencyScope(keyId, idempotencyKey);
    const slot = this.slotOf.get(scope);
    if (slot === undefined || this.bindings[slot]!.requestId !== requestId) return;
    this.slotOf.delete(scope);
    this.slots.release(slot);
  }

  /**
   * Every binding still within its TTL as [scope, binding], oldest first (a snapshot restores in
   * this order).
   */
  *entries(nowMs: number): Generator<[string, IdempotencyBinding]> {
    for (const slot of this.slots.inOrder()) {
      const binding = this.bindings[slot]!;
      if (!this.expired(binding, nowMs)) yield [this.scopes[slot]!, binding];
    }
  }

  /** Every binding, expired ones too, oldest first: a snapshot keeps the table as it is. */
  *allEntries(): Generator<[string, IdempotencyBinding]> {
    for (const slot of this.slots.inOrder()) yield [this.scopes[slot]!, this.bindings[slot]!];
  }

  /**
   * Every binding, expired ones too, oldest first, as two lists of references (scope i goes with
   * binding i): what a snapshot captures at its seq and serializes in steps afterwards, which is
   * safe because neither scopes nor bindings change in place.
   */
  capture(): { scopes: string[]; bindings: IdempotencyBinding[] } {
    const scopes: string[] = [];
    const bindings: IdempotencyBinding[] = [];
    for (const slot of this.slots.inOrder()) {
      scopes.push(this.scopes[slot]!);
      bindings.push(this.bindings[slot]!);
    }
    return { scopes, bindings };
  }

  /** Restores an entry of `allEntries` (scope as written there), in their order. */
  restore(scope: string, binding: IdempotencyBinding): void {
    const split = scope.indexOf('\u0000');
    // Nothing counts as expired while a snapshot is put back: it evicts only if the bounds shrank.
    this.set(scope.slice(0, split), scope.slice(split + 1), binding, Number.NEGATIVE_INFINITY);
  }

  /** The API keys holding bindings, in FairSlots' bucket order (see FairSlots.ownerOrder). */
  ownerOrder(): string[] {
    return this.slots.ownerOrder().map((owner) => this.ownerKeyIds[owner]!);
  }

  restoreOwnerOrder(keyIds: readonly string[]): void {
    this.slots.restoreOwnerOrder(keyIds.map((keyId) => this.owners.get(keyId) ?? -1));
  }
}
