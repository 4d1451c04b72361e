// GET /admin/v1/overview: what the dashboard shows beside keys and usage: each deployment's health
// (the router's own state, as /metrics shows it) and the gateway's own figures, read when asked.
import { version } from '../../package.json';
import type { LoopDelayMonitor } from '../ops/metrics.ts';
import type { DeploymentState } from '../providers/router.ts';

/** The parts of the gateway read here (named, so that this module stays below gateway.ts). */
export interface OverviewSource {
  readonly config: { readonly limits: { readonly max_in_flight: number } };
  readonly registry: { readonly size: number };
  readonly router: { deployments(): Iterable<DeploymentState> };
  readonly metrics: { readonly loopDelay: Pick<LoopDelayMonitor, 'get'> };
  readonly draining: boolean;
}

export interface DeploymentOverview {
  model: string;
  provider: string;
  upstream_model: string;
  weight: number;
  state: 'healthy' | 'ejected' | 'probing';
  consecutive_failures: number;
  /** Unix seconds when an ejected deployment may be probed again; null otherwise. */
  retry_at: number | null;
  attempts: { ok: number; error: number; cancelled: number };
}

/**
 * The event-loop delays the monitor counted since start (main starts it; a gateway a test opens
 * has none, `samples` 0). Its histogram is read, not reset: the worst-since-last-scrape gauge
 * belongs to Prometheus, and taking it here would steal it from the next scrape.
 */
export interface EventLoopOverview {
  samples: number;
  mean_delay_ms: number | null;
  /** The upper bound of the histogram bucket that holds the 99th percentile; null if past 5 s. */
  p99_delay_ms_at_most: number | null;
  /** Delays past §8's 50 ms. */
  over_50ms: number;
}

export async function readOverview(gateway: OverviewSource, nowMs: number) {
  const memory = process.memoryUsage();
  return {
    object: 'overview',
    version,
    started: Math.floor((nowMs - process.uptime() * 1000) / 1000),
    uptime_s: Math.floor(process.uptime()),
    in_flight: gateway.registry.size,
    in_flight_max: gateway.config.limits.max_in_flight,
    draining: gateway.draining,
    memory: { rss_bytes: memory.rss, heap_used_bytes: memory.heapUsed },
    event_loop: await eventLoop(gateway.metrics.loopDelay),
    deployments: deployments(gateway.router.deployments(), nowMs),
  };
}

function deployments(all: Iterable<DeploymentState>, nowMs: number): DeploymentOverview[] {
  const views: DeploymentOverview[] = [];
  for (const d of all) {
    const state = d.health();
    views.push({
      model: d.model,
      provider: d.providerName,
      upstream_model: d.upstreamModel,
      weight: d.weight,
      state,
      consecutive_failures: d.failures,
      // Past its cooldown an ejected deployment is retried by the next call: now, not a past time.
      retry_at: state === 'ejected' ? Math.ceil(Math.max(d.ejectedUntilMs, nowMs) / 1000) : null,
      attempts: { ...d.attemptsByOutcome },
    });
  }
  return views;
}

async function eventLoop(monitor: Pick<LoopDelayMonitor, 'get'>): Promise<EventLoopOverview> {
  const { values } = await monitor.get();
  let samples = 0;
  let sumSeconds = 0;
  const buckets: { le: number; cumulative: number }[] = [];
  for (const value of values) {
    if (value.metricName.endsWith('_count')) samples = value.value;
    else if (value.metricName.endsWith('_sum')) sumSeconds = value.value;
    else if (value.labels.le !== '+Inf')
      buckets.push({ le: Number(value.labels.le), cumulative: value.value });
  }
  const under50ms = buckets.find((bucket) => bucket.le === 0.05)?.cumulative ?? 0;
  const p99 = buckets.find((bucket) => bucket.cumulative >= samples * 0.99);
  return {
    samples,
    mean_delay_ms: samples === 0 ? null : Math.round((sumSeconds / samples) * 1e6) / 1e3,
    p99_delay_ms_at_most: samples === 0 || p99 === undefined ? null : p99.le * 1000,
    over_50ms: samples - under50ms,
  };
}
