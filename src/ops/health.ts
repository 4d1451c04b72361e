// Probes: /healthz (the process answers) and /readyz (it can take work: log writable, not draining).
import { Elysia } from 'elysia';
import type { Gateway } from '../gateway.ts';

export function healthController(gateway: Gateway) {
  return new Elysia({ name: 'health' })
    .get('/healthz', () => Response.json({ status: 'ok' }))
    .get('/readyz', () => {
      const reason = gateway.draining ? 'draining' : gateway.store.unavailableReason;
      return reason
        ? Response.json({ status: 'unavailable', reason }, { status: 503 })
        : Response.json({ status: 'ready', in_flight: gateway.registry.size });
    });
}
