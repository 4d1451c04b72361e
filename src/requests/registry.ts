// Live actors by request id: the place cancel, status and graceful shutdown find a running request.
import type { RequestActor } from './actor.ts';

export class ActorRegistry {
  private readonly actors = new Map<string, RequestActor>();

  constructor(readonly inFlightMax: number) {}

  get size(): number {
    return this.actors.size;
  }

  get full(): boolean {
    return this.actors.size >= this.inFlightMax;
  }

  add(actor: RequestActor): void {
    this.actors.set(actor.id, actor);
  }

  remove(actor: RequestActor): void {
    if (this.actors.get(actor.id) === actor) this.actors.delete(actor.id);
  }

  get(id: string): RequestActor | undefined {
    return this.actors.get(id);
  }

  all(): RequestActor[] {
    return [...this.actors.values()];
  }
}
