// Built-in defaults: the spec's 11-model catalogue on the embedded simulator, aliases, limits.
import { type Config, type ConfigSettings, type ModelSettings, withDeployments } from './model.ts';

// One fixed creation time for the catalogue, so GET /models is stable across restarts.
const CATALOGUE_CREATED_S = 1_767_225_600; // 2026-01-01T00:00:00Z

function model(
  input: number,
  output: number,
  tools: boolean,
  contextWindow: number,
  maxOutputTokens: number,
  extra: Partial<ModelSettings> = {},
): ModelSettings {
  return {
    provider: 'simulator',
    tools,
    top_k: false,
    seed: true,
    rates: { input, output },
    context_window: contextWindow,
    max_output_tokens: maxOutputTokens,
    long_context: null,
    created: CATALOGUE_CREATED_S,
    ...extra,
  };
}

/** The defaults with every model's deployments listed, as the loader returns a config. */
export function defaultConfig(): Config {
  return withDeployments(defaultSettings());
}

// One literal, long because it is the whole default configuration in the order of config/model.ts.
// Models use the one-provider form, so a file that sets a model's `provider` is not overruled by a
// default `deployments` list.
export function defaultSettings(): ConfigSettings {
  return {
    server: { host: '127.0.0.1', port: 8080 },
    data_dir: './data',
    public_base_url: null,
    admin_token: null,
    log_level: 'info',
    providers: {
      simulator: { type: 'simulator', ttft_ms: 40, tokens_per_second: 400, completion_tokens: 24 },
    },
    // Rates are the spec's catalogue, in credits per 1M tokens. Context and output windows are not
    // published by the spec; these are the native limits we front.
    models: {
      model_01: model(2_778, 13_889, true, 1_050_000, 128_000, {
        long_context: { threshold_tokens: 272_000, rates: { input: 5_556, output: 20_834 } },
      }),
      model_02: model(2_778, 13_889, true, 400_000, 128_000),
      model_03: model(5, 14, true, 400_000, 128_000),
      model_04: model(78, 245, true, 200_000, 64_000, { top_k: true, seed: false }),
      model_05: model(78, 245, true, 200_000, 64_000, { top_k: true, seed: false }),
      model_06: model(84, 278, true, 1_048_576, 65_536, { top_k: true }),
      model_07: model(834, 4_167, true, 200_000, 32_000, { top_k: true, seed: false }),
      model_08: model(84, 334, true, 131_072, 32_768),
      model_09: model(98, 362, false, 131_072, 16_384, { top_k: true }),
      model_10: model(126, 251, true, 262_144, 32_768, { top_k: true }),
      model_11: model(39, 78, true, 131_072, 16_384, { top_k: true }),
    },
    aliases: { legacy_fast_1: 'model_03', legacy_fast_2: 'model_03' },
    decision: {
      models: { 'decision-fast': 'model_03', 'decision-accurate': 'model_07' },
      context_tokens: 32_000,
      answer_tokens: 1_024,
      timeout_ms: 30_000,
    },
    limits: {
      stream_timeout_ms: 90_000,
      upstream_timeout_ms: 60_000,
      max_body_bytes: 4_194_304,
      max_body_bytes_in_flight: 268_435_456,
      max_body_json_values: 100_000,
      default_rate_limit_rpm: 600,
      max_messages: 2_048,
      max_tools: 128,
      max_stop_sequences: 4,
      max_in_flight: 4_096,
      max_keys: 100_000,
      request_records_max: 100_000,
      idempotency_keys_max: 100_000,
      shutdown_grace_ms: 10_000,
      idempotency_keys_per_key: 100_000,
      request_records_per_key: 100_000,
      request_read_timeout_ms: 10_000,
      stream_buffer_bytes: 1024 * 1024,
      max_upstream_body_bytes: 16 * 1024 * 1024,
      max_upstream_event_bytes: 1024 * 1024,
      simulator_tool_arguments_bytes: 64 * 1024,
    },
    routing: { max_attempts: 3, failures_to_eject: 3, cooldown_ms: 30_000 },
    billing: { on_error: 'keep' },
    idempotency_ttl_s: 86_400,
    usage_retention_days: 400,
    wal: {
      fsync: 'always',
      fsync_interval_ms: 10,
      segment_bytes: 64 * 1024 * 1024,
      snapshot_every_records: 200_000,
    },
  };
}
