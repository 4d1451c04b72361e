// Prometheus metrics (prom-client: the exposition format, histograms and process metrics done right).
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { Service } from '../state/events.ts';

export class Metrics {
  readonly registry = new Registry();
  private readonly finished: Counter<'service' | 'status' | 'code'>;
  private readonly refused: Counter<'service' | 'code'>;
  private readonly chargedMicro: Counter<'service'>;
  private readonly ttft: Histogram<'model'>;

  constructor(inFlight: () => number) {
    collectDefaultMetrics({ register: this.registry, prefix: 'tollgate_' });
    const registers = [this.registry];
    this.finished = new Counter({
      name: 'tollgate_requests_finished_total',
      help: 'Admitted requests by terminal state and error code',
      labelNames: ['service', 'status', 'code'],
      registers,
    });
    this.refused = new Counter({
      name: 'tollgate_requests_refused_total',
      help: 'Requests answered with an error before a task was created',
      labelNames: ['service', 'code'],
      registers,
    });
    this.chargedMicro = new Counter({
      name: 'tollgate_charged_microcredits_total',
      help: 'Micro-credits charged to keys',
      labelNames: ['service'],
      registers,
    });
    this.ttft = new Histogram({
      name: 'tollgate_time_to_first_token_seconds',
      help: 'From admission to the first output relayed to the client',
      labelNames: ['model'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers,
    });
    new Gauge({ name: 'tollgate_requests_in_flight', help: 'Requests running now', registers, collect() { this.set(inFlight()); } });
  }

  requestFinished(service: Service, status: string, code: string | null, chargedMicro: number): void {
    this.finished.inc({ service, status, code: code ?? '' });
    if (chargedMicro > 0) this.chargedMicro.inc({ service }, chargedMicro);
  }

  requestRefused(service: Service, code: string): void {
    this.refused.inc({ service, code });
  }

  firstToken(model: string, seconds: number): void {
    this.ttft.observe({ model }, seconds);
  }
}
