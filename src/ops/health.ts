// Probes and metrics: /healthz (the process answers), /readyz (it can take work), /metrics
// (Prometheus).
import { type Static, type TProperties, Type } from '@sinclair/typebox';
import { Elysia } from 'elysia';
import { describeRoute } from '../http/openapi.ts';
import type { Metrics } from './metrics.ts';

/**
 * What the probes read. The Gateway has these fields; naming only them keeps ops/ below
 * gateway.ts, which imports ops/metrics.ts.
 */
export interface ProbeSource {
  readonly store: { readonly unavailableReason: string | null };
  readonly registry: { readonly size: number };
  readonly metrics: Pick<Metrics, 'expose'>;
  readonly draining: boolean;
}

/** A probe's answer: its status word, and what goes with it. */
function probeAnswer<S extends string, T extends TProperties>(status: S, extra: T) {
  return Type.Object({ status: Type.Literal(status), ...extra });
}

export const HealthzSchema = probeAnswer('ok', {});
const FailingSchema = probeAnswer('failing', { reason: Type.String() });
export const ReadyzSchema = probeAnswer('ready', {
  in_flight: Type.Integer({ minimum: 0, description: 'requests running' }),
});
const UnavailableSchema = probeAnswer('unavailable', { reason: Type.String() });
type Healthz = Static<typeof HealthzSchema>;
type Failing = Static<typeof FailingSchema>;
type Readyz = Static<typeof ReadyzSchema>;
type Unavailable = Static<typeof UnavailableSchema>;

const HEALTHZ_DOC = describeRoute({
  summary: 'Liveness: the process answers and its log can be written',
  tag: 'operations',
  auth: 'none',
  answers: {
    200: { description: 'The process answers.', content: { 'application/json': HealthzSchema } },
    503: {
      description: 'The log failed; the process will exit.',
      content: { 'application/json': FailingSchema },
    },
  },
  errors: [],
});

const READYZ_DOC = describeRoute({
  summary: 'Readiness: the gateway takes new work',
  tag: 'operations',
  auth: 'none',
  answers: {
    200: {
      description: 'Takes new work.',
      content: {
        'application/json': ReadyzSchema,
      },
    },
    503: {
      description: 'Draining, or the log failed.',
      content: { 'application/json': UnavailableSchema },
    },
  },
  errors: [],
});

const METRICS_DOC = describeRoute({
  summary: 'Prometheus metrics (requests, refusals, deployments, event-loop delay)',
  tag: 'operations',
  auth: 'none',
  answers: { 200: { description: 'The text exposition format.', content: { 'text/plain': {} } } },
  errors: [],
});

export function healthController(gateway: ProbeSource) {
  return (
    new Elysia({ name: 'health' })
      // A failed log is not a state this process can leave (§8, crash-only): both probes fail at
      // once, so a supervisor or an orchestrator restarts it even before it exits by itself.
      .get(
        '/healthz',
        () => {
          const reason = gateway.store.unavailableReason;
          return reason
            ? Response.json({ status: 'failing', reason } satisfies Failing, { status: 503 })
            : Response.json({ status: 'ok' } satisfies Healthz);
        },
        { detail: HEALTHZ_DOC },
      )
      .get(
        '/metrics',
        async () => {
          const { text, contentType } = await gateway.metrics.expose();
          return new Response(text, { headers: { 'content-type': contentType } });
        },
        { detail: METRICS_DOC },
      )
      .get(
        '/readyz',
        () => {
          const reason = gateway.store.unavailableReason ?? (gateway.draining ? 'draining' : null);
          return reason
            ? Response.json({ status: 'unavailable', reason } satisfies Unavailable, {
                status: 503,
              })
            : Response.json({
                status: 'ready',
                in_flight: gateway.registry.size,
              } satisfies Readyz);
        },
        { detail: READYZ_DOC },
      )
  );
}
