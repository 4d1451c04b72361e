// The client's connection of a served request, watched without its AbortSignal where it can be
// (util/abort.ts, ClientConnection).
import type { Server } from 'bun';
import type { ClientConnection } from '../util/abort.ts';

export class ServedClient implements ClientConnection {
  constructor(
    private readonly request: Request,
    private readonly server: Server<unknown> | undefined,
  ) {}

  get signal(): AbortSignal {
    return this.request.signal;
  }

  /**
   * Bun's server answers requestIP with null once the request's connection has closed (or for a
   * Unix socket, which the gateway never listens on: server.ts takes a port). In process
   * (app.handle: tests, no server) the request's signal is the caller's own, and reading it costs
   * nothing.
   */
  gone(): boolean {
    if (this.server === undefined) return this.request.signal.aborted;
    return this.server.requestIP(this.request) === null;
  }
}
