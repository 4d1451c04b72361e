// The gateway's running parts, built once by main (or a test) and handed to every controller.
import type { Config } from './config/model.ts';
import { RateLimiter } from './keys/rate-limit.ts';
import { Metrics } from './ops/metrics.ts';
import type { Provider } from './providers/provider.ts';
import { createProviders } from './providers/registry.ts';
import { Router } from './providers/router.ts';
import { ActorRegistry } from './requests/registry.ts';
import { StateStore } from './state/store.ts';
import { ByteBudget } from './util/byte-budget.ts';
import { IdMap } from './util/id-map.ts';
import type { Logger } from './util/log.ts';

export interface Gateway {
  config: Config;
  store: StateStore;
  registry: ActorRegistry;
  rateLimiter: RateLimiter;
  providers: Map<string, Provider>;
  /** Picks a model's deployment per call and fails over (CONTRACT §7). */
  router: Router;
  logger: Logger;
  adminToken: string;
  /** Set by SIGTERM: new work is refused with 503 while in-flight requests finish. */
  draining: boolean;
  /**
   * Streams whose run is over but whose client is still taking the last of it (chat/sse.ts), by
   * request id; shutdown drops them.
   */
  endingStreams: IdMap<{ drop(): void }>;
  /** The request body bytes being read at once (limits.max_body_bytes_in_flight; http/body.ts). */
  bodyBudget: ByteBudget;
  metrics: Metrics;
  /**
   * Called on a broken invariant: the process must not keep serving (main exits; tests may
   * observe).
   */
  onFatal?: (error: Error) => void;
  /**
   * Called once when the write-ahead log fails (disk full, EIO): nothing more can be made durable,
   * so the process must restart from the log (main drains and exits 75; CONTRACT §8, crash-only).
   */
  onLogFailure?: (error: Error) => void;
}

export function openGateway(config: Config, logger: Logger, adminToken: string): Gateway {
  const registry = new ActorRegistry(config.limits.max_in_flight);
  // The store fails before the gateway object exists to be told: the callback finds it once it
  // does.
  let gateway: Gateway | null = null;
  const store = StateStore.open({
    dataDir: config.data_dir,
    fsync: config.wal.fsync,
    fsyncIntervalMs: config.wal.fsync_interval_ms,
    segmentBytes: config.wal.segment_bytes,
    snapshotEveryRecords: config.wal.snapshot_every_records,
    limits: {
      requestRecordsMax: config.limits.request_records_max,
      requestRecordTtlMs: config.idempotency_ttl_s * 1000,
      idempotencyKeysMax: config.limits.idempotency_keys_max,
      requestRecordsPerKey: config.limits.request_records_per_key,
      idempotencyKeysPerKey: config.limits.idempotency_keys_per_key,
      usageRetentionDays: config.usage_retention_days,
    },
    logger,
    expectedCommits: () => registry.unstreamedSize,
    onFailure: (error) => gateway?.onLogFailure?.(error),
  });
  const providers = createProviders(config, logger);
  gateway = {
    config,
    store,
    registry,
    metrics: new Metrics(() => registry.size),
    rateLimiter: new RateLimiter(config.limits.max_keys),
    providers,
    router: new Router(config, providers),
    logger,
    adminToken,
    draining: false,
    endingStreams: new IdMap(),
    bodyBudget: new ByteBudget(config.limits.max_body_bytes_in_flight),
  };
  gateway.metrics.watchDeployments(() => gateway!.router.deployments());
  return gateway;
}
