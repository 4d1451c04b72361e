// Prometheus metrics (prom-client: the registry, exposition format and process metrics done right).
//
// The per-request counts are kept here as plain numbers and handed to prom-client when /metrics is
// scraped: prom-client hashes and validates the label object on every inc() and observe(), which
// cost ~1 µs per request on the hot path (bench/README); a scrape every few seconds does it once
// per series. prom-client itself is loaded by the first scrape: importing it (with its process
// metrics, push gateway and cluster modules) adds ~10 MiB to the RSS of a gateway that may never be
// scraped (issue 15: RSS after start).
import type { Counter, Registry } from 'prom-client';
import type { Service } from '../state/events.ts';
import { assert } from '../util/assert.ts';

const TTFT_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10] as const;

/** A count per label set, keyed by the label values joined with NUL. */
class Tally<Labels extends Record<string, string>> {
  private readonly series = new Map<string, { labels: Labels; value: number }>();

  /** Adds to the series of `key`; false when there is none yet (then `start` it). */
  add(key: string, amount: number): boolean {
    const cell = this.series.get(key);
    if (cell === undefined) return false;
    cell.value += amount;
    return true;
  }

  start(key: string, labels: Labels, amount: number): void {
    this.series.set(key, { labels, value: amount });
  }

  /**
   * Sets `counter` to these totals (a scrape; counters only ever grow here, so resetting is safe).
   */
  exportTo(counter: Counter<Extract<keyof Labels, string>>): void {
    counter.reset();
    for (const { labels, value } of this.series.values()) counter.inc(labels as never, value);
  }
}

/** A histogram of time to first token per model, in the shape prom-client's registry formats. */
class TtftHistogram {
  readonly name = 'tollgate_time_to_first_token_seconds';
  readonly help = 'From admission to the first output relayed to the client';
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  private readonly byModel = new Map<
    string,
    { buckets: Float64Array; sum: number; count: number }
  >();

  observe(model: string, seconds: number): void {
    let cell = this.byModel.get(model);
    if (cell === undefined) {
      cell = { buckets: new Float64Array(TTFT_BUCKETS_S.length), sum: 0, count: 0 };
      this.byModel.set(model, cell);
    }
    // Buckets hold their own counts; they are made cumulative when scraped.
    for (let i = 0; i < TTFT_BUCKETS_S.length; i++) {
      if (seconds <= TTFT_BUCKETS_S[i]!) {
        cell.buckets[i]!++;
        break;
      }
    }
    cell.sum += seconds;
    cell.count++;
  }

  async get() {
    const values: { value: number; labels: Record<string, string | number>; metricName: string }[] =
      [];
    for (const [model, cell] of this.byModel) {
      let cumulative = 0;
      for (let i = 0; i < TTFT_BUCKETS_S.length; i++) {
        cumulative += cell.buckets[i]!;
        values.push({
          value: cumulative,
          labels: { le: TTFT_BUCKETS_S[i]!, model },
          metricName: `${this.name}_bucket`,
        });
      }
      values.push({
        value: cell.count,
        labels: { le: '+Inf', model },
        metricName: `${this.name}_bucket`,
      });
      values.push({ value: cell.sum, labels: { model }, metricName: `${this.name}_sum` });
      values.push({ value: cell.count, labels: { model }, metricName: `${this.name}_count` });
    }
    return {
      name: this.name,
      help: this.help,
      type: this.type,
      values,
      aggregator: this.aggregator,
    };
  }

  reset(): void {
    this.byModel.clear();
  }
}

/** Event-loop delay buckets, in seconds: the §8 rule is that nothing blocks the loop for 50 ms. */
const LOOP_DELAY_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];
const LOOP_TICK_MS = 20;

/**
 * How late a 20 ms timer fires, i.e. how long the event loop was busy with something else: measured
 * by hand, because Bun's monitorEventLoopDelay (behind prom-client's nodejs_eventloop_lag_*) does
 * not see a loop blocked by JavaScript. One timer, no allocation per tick.
 */
export class LoopDelayMonitor {
  readonly name = 'tollgate_event_loop_delay_seconds';
  readonly help = 'Event-loop delays: how late a 20 ms timer fired';
  readonly type = 'histogram';
  readonly aggregator = 'sum';
  private timer: ReturnType<typeof setInterval> | null = null;
  private lastMs = 0;
  /** The worst delay since the last read of `takeMaxSeconds`. */
  private maxMs = 0;
  private readonly counts = new Float64Array(LOOP_DELAY_BUCKETS_S.length + 1);
  private sumSeconds = 0;

  start(): void {
    if (this.timer) return;
    this.lastMs = performance.now();
    this.timer = setInterval(() => this.tick(), LOOP_TICK_MS);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }

  private tick(): void {
    const nowMs = performance.now();
    const delayMs = Math.max(0, nowMs - this.lastMs - LOOP_TICK_MS);
    this.lastMs = nowMs;
    if (delayMs > this.maxMs) this.maxMs = delayMs;
    const seconds = delayMs / 1000;
    this.sumSeconds += seconds;
    let bucket = 0;
    while (bucket < LOOP_DELAY_BUCKETS_S.length && seconds > LOOP_DELAY_BUCKETS_S[bucket]!)
      bucket++;
    this.counts[bucket]!++;
  }

  takeMaxSeconds(): number {
    const max = this.maxMs / 1000;
    this.maxMs = 0;
    return max;
  }

  async get() {
    const values: { value: number; labels: Record<string, string | number>; metricName: string }[] =
      [];
    let cumulative = 0;
    for (let i = 0; i < LOOP_DELAY_BUCKETS_S.length; i++) {
      cumulative += this.counts[i]!;
      values.push({
        value: cumulative,
        labels: { le: LOOP_DELAY_BUCKETS_S[i]! },
        metricName: `${this.name}_bucket`,
      });
    }
    cumulative += this.counts[LOOP_DELAY_BUCKETS_S.length]!;
    values.push({ value: cumulative, labels: { le: '+Inf' }, metricName: `${this.name}_bucket` });
    values.push({ value: this.sumSeconds, labels: {}, metricName: `${this.name}_sum` });
    values.push({ value: cumulative, labels: {}, metricName: `${this.name}_count` });
    return {
      name: this.name,
      help: this.help,
      type: this.type,
      values,
      aggregator: this.aggregator,
    };
  }

  reset(): void {
    this.counts.fill(0);
    this.sumSeconds = 0;
  }
}

type FinishedLabels = { service: string; status: string; code: string };
type RefusedLabels = { service: string; code: string };

/** What /metrics shows of one deployment (the router's DeploymentState has this shape). */
export interface DeploymentView {
  readonly model: string;
  readonly providerName: string;
  readonly upstreamModel: string;
  readonly failures: number;
  readonly attemptsByOutcome: Readonly<Record<'ok' | 'error' | 'cancelled', number>>;
  health(): 'healthy' | 'ejected' | 'probing';
}

const HEALTH_STATES = ['healthy', 'ejected', 'probing'] as const;

/** What /metrics answers: the exposition text and its content type. */
export interface Exposition {
  contentType: string;
  text: string;
}

export class Metrics {
  private readonly finished = new Tally<FinishedLabels>();
  /** The finished tally's keys by service, status and code (see finishedKey). */
  private readonly finishedKeys = new Map<Service, Map<string, Map<string, string>>>();
  private readonly refused = new Tally<RefusedLabels>();
  private readonly chargedMicro = new Tally<{ service: string }>();
  private readonly ttft = new TtftHistogram();
  /** Started by a serving process (main), not by every gateway a test opens. */
  readonly loopDelay = new LoopDelayMonitor();
  private deployments: (() => Iterable<DeploymentView>) | null = null;
  /** prom-client's registry over the tallies, made by the first scrape. */
  private registry: Promise<Registry> | null = null;

  constructor(private readonly inFlight: () => number) {}

  /** Per-deployment health and attempts (CONTRACT §7), read from the router at each scrape. */
  watchDeployments(deployments: () => Iterable<DeploymentView>): void {
    // Read when the registry is made: a later call would be silently left out of every scrape.
    assert(this.registry === null, 'deployments watched after the first scrape');
    this.deployments = deployments;
  }

  /** The exposition of every metric (a scrape); the first one loads prom-client. */
  async expose(): Promise<Exposition> {
    this.registry ??= this.makeRegistry();
    const registry = await this.registry;
    return { contentType: registry.contentType, text: await registry.metrics() };
  }

  private async makeRegistry(): Promise<Registry> {
    const client = await import('prom-client');
    const registry = new client.Registry();
    // The process metrics start with the first scrape: CPU, memory and descriptors are read at
    // each scrape anyway; only the GC and event-loop-lag histograms count from then on.
    client.collectDefaultMetrics({ register: registry, prefix: 'tollgate_' });
    const registers = [registry];
    const { finished, refused, chargedMicro, inFlight } = this;
    new client.Counter({
      name: 'tollgate_requests_finished_total',
      help: 'Admitted requests by terminal state and error code',
      labelNames: ['service', 'status', 'code'],
      registers,
      collect() {
        finished.exportTo(this);
      },
    });
    new client.Counter({
      name: 'tollgate_requests_refused_total',
      help: 'Requests answered with an error before a task was created',
      labelNames: ['service', 'code'],
      registers,
      collect() {
        refused.exportTo(this);
      },
    });
    new client.Counter({
      name: 'tollgate_charged_microcredits_total',
      help: 'Micro-credits charged to keys',
      labelNames: ['service'],
      registers,
      collect() {
        chargedMicro.exportTo(this);
      },
    });
    registry.registerMetric(this.ttft as never);
    new client.Gauge({
      name: 'tollgate_requests_in_flight',
      help: 'Requests running now',
      registers,
      collect() {
        this.set(inFlight());
      },
    });
    const loopDelay = this.loopDelay;
    new client.Gauge({
      name: 'tollgate_event_loop_delay_max_seconds',
      help: 'Worst event-loop delay since the previous scrape (a 20 ms timer firing late)',
      registers,
      collect() {
        this.set(loopDelay.takeMaxSeconds());
      },
    });
    registry.registerMetric(loopDelay as never);
    if (this.deployments !== null) registerDeployments(client, registers, this.deployments);
    return registry;
  }

  requestFinished(
    service: Service,
    status: string,
    code: string | null,
    chargedMicro: number,
  ): void {
    const codeLabel = code ?? '';
    const key = this.finishedKey(service, status, codeLabel);
    if (!this.finished.add(key, 1))
      this.finished.start(key, { service, status, code: codeLabel }, 1);
    if (chargedMicro > 0 && !this.chargedMicro.add(service, chargedMicro))
      this.chargedMicro.start(service, { service }, chargedMicro);
  }

  /**
   * The finished tally's key of these labels, made once per label set (a few dozen: services,
   * statuses and error codes are fixed lists): joining them per request made two strings each time.
   */
  private finishedKey(service: Service, status: string, code: string): string {
    let byStatus = this.finishedKeys.get(service);
    if (byStatus === undefined) this.finishedKeys.set(service, (byStatus = new Map()));
    let byCode = byStatus.get(status);
    if (byCode === undefined) byStatus.set(status, (byCode = new Map()));
    let key = byCode.get(code);
    if (key === undefined) byCode.set(code, (key = `${service}\u0000${status}\u0000${code}`));
    return key;
  }

  requestRefused(service: Service, code: string): void {
    const key = `${service}\u0000${code}`;
    if (!this.refused.add(key, 1)) this.refused.start(key, { service, code }, 1);
  }

  firstToken(model: string, seconds: number): void {
    this.ttft.observe(model, seconds);
  }
}

/** The deployments' gauges and counter (CONTRACT §7), each read from the router at a scrape. */
function registerDeployments(
  client: typeof import('prom-client'),
  registers: Registry[],
  deployments: () => Iterable<DeploymentView>,
): void {
  const labelNames = ['model', 'provider', 'upstream_model'] as const;
  const labelsOf = (d: DeploymentView) => ({
    model: d.model,
    provider: d.providerName,
    upstream_model: d.upstreamModel,
  });
  new client.Gauge({
    name: 'tollgate_deployment_state',
    help: "A deployment's health: 1 on its current state (healthy, ejected, probing)",
    labelNames: [...labelNames, 'state'],
    registers,
    collect() {
      this.reset();
      for (const d of deployments()) {
        const current = d.health();
        for (const state of HEALTH_STATES)
          this.set({ ...labelsOf(d), state }, state === current ? 1 : 0);
      }
    },
  });
  new client.Gauge({
    name: 'tollgate_deployment_consecutive_failures',
    help: 'Failures in a row of a deployment (ejected at routing.failures_to_eject)',
    labelNames,
    registers,
    collect() {
      this.reset();
      for (const d of deployments()) this.set(labelsOf(d), d.failures);
    },
  });
  new client.Counter({
    name: 'tollgate_deployment_attempts_total',
    help: 'Attempts sent to a deployment, by outcome',
    labelNames: [...labelNames, 'outcome'],
    registers,
    collect() {
      this.reset();
      for (const d of deployments()) {
        for (const [outcome, count] of Object.entries(d.attemptsByOutcome))
          this.inc({ ...labelsOf(d), outcome }, count);
      }
    },
  });
}
