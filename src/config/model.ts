// The gateway's configuration schema: one TypeBox schema that is both the validator and the type.
import { type Static, Type } from '@sinclair/typebox';

const PositiveInt = (description: string) => Type.Integer({ minimum: 1, description });
const NonNegativeInt = (description: string) => Type.Integer({ minimum: 0, description });
/**
 * A timer's delay: setTimeout takes at most 2^31 − 1 ms (about 24.8 days); a longer one would fire
 * at once.
 */
const TIMER_MS_MAX = 2_147_483_647;
const DurationMs = (description: string, minimum = 1) =>
  Type.Integer({ minimum, maximum: TIMER_MS_MAX, description });

/**
 * Every option has a `default`, filled in by the loader before validation: `{"type": "simulator"}`
 * alone is a complete provider, and the rest of the code sees every field set.
 */
export const SimulatorProviderSchema = Type.Object(
  {
    type: Type.Literal('simulator'),
    ttft_ms: Type.Integer({
      minimum: 0,
      maximum: TIMER_MS_MAX,
      default: 40,
      description: 'delay before the first token',
    }),
    tokens_per_second: Type.Integer({
      minimum: 1,
      default: 400,
      description: 'output speed after the first token',
    }),
    completion_tokens: Type.Integer({
      minimum: 1,
      default: 24,
      description: 'tokens of a text answer when no output limit is lower',
    }),
  },
  { additionalProperties: false },
);

/** What every provider reached over HTTP takes besides its base URL. */
const httpProviderFields = {
  api_key_env: Type.Optional(
    Type.String({ minLength: 1, description: 'name of the env var holding the upstream key' }),
  ),
  timeout_ms: Type.Optional(DurationMs('upstream timeout; defaults to limits.upstream_timeout_ms')),
  headers: Type.Optional(
    Type.Record(Type.String(), Type.String(), { description: 'extra request header fields' }),
  ),
  ca_file: Type.Optional(
    Type.String({
      minLength: 1,
      description:
        'PEM file of the certificates to trust for https (instead of the built-in roots)',
    }),
  ),
};

export const OpenAIProviderSchema = Type.Object(
  {
    type: Type.Literal('openai'),
    base_url: Type.String({
      pattern: '^https?://',
      default: 'https://api.openai.com/v1',
      description: 'OpenAI-compatible base URL, e.g. http://host/v1',
    }),
    ...httpProviderFields,
  },
  { additionalProperties: false },
);

export const AnthropicProviderSchema = Type.Object(
  {
    type: Type.Literal('anthropic'),
    base_url: Type.String({
      pattern: '^https?://',
      default: 'https://api.anthropic.com/v1',
      description: 'Anthropic Messages API base URL (POST {base_url}/messages)',
    }),
    version: Type.String({
      pattern: '^[\\x21-\\x7e]{1,64}$',
      default: '2023-06-01',
      description: 'the anthropic-version header',
    }),
    ...httpProviderFields,
  },
  { additionalProperties: false },
);

export const GeminiProviderSchema = Type.Object(
  {
    type: Type.Literal('gemini'),
    base_url: Type.String({
      pattern: '^https?://',
      default: 'https://generativelanguage.googleapis.com/v1beta',
      description: 'Gemini API base URL (POST {base_url}/models/{model}:generateContent)',
    }),
    ...httpProviderFields,
  },
  { additionalProperties: false },
);

export const ProviderConfigSchema = Type.Union([
  SimulatorProviderSchema,
  OpenAIProviderSchema,
  AnthropicProviderSchema,
  GeminiProviderSchema,
]);

/** Credits per one million tokens; an integer rate R costs exactly R µcr per token. */
export const RatesSchema = Type.Object(
  {
    input: NonNegativeInt('credits per 1M input tokens'),
    output: NonNegativeInt('credits per 1M output tokens'),
  },
  { additionalProperties: false },
);

/** Deployments of one model the router picks among (CONTRACT §7). */
export const DEPLOYMENTS_MAX = 16;
/** Ten years of days: the history's memory is days × keys × models, each bounded. */
export const USAGE_RETENTION_DAYS_MAX = 3_650;

export const DeploymentSchema = Type.Object(
  {
    provider: Type.String({ minLength: 1 }),
    upstream_model: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
    weight: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: 1_000_000,
        description: 'share of the picks; 1 default',
      }),
    ),
  },
  { additionalProperties: false },
);

export const ModelConfigSchema = Type.Object(
  {
    /** Shorthand for one deployment; `deployments` wins when both are set. */
    provider: Type.Optional(Type.String({ minLength: 1 })),
    upstream_model: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
    deployments: Type.Optional(
      Type.Array(DeploymentSchema, { minItems: 1, maxItems: DEPLOYMENTS_MAX }),
    ),
    tools: Type.Boolean(),
    top_k: Type.Boolean({ description: 'whether the model applies top_k' }),
    seed: Type.Boolean({ description: 'whether the model applies seed' }),
    rates: RatesSchema,
    context_window: PositiveInt('input + output tokens the model accepts'),
    max_output_tokens: PositiveInt('largest output limit the model accepts'),
    long_context: Type.Optional(
      Type.Union([
        Type.Null(),
        Type.Object(
          {
            threshold_tokens: PositiveInt('input tokens from which the long-context rates apply'),
            rates: RatesSchema,
          },
          { additionalProperties: false },
        ),
      ]),
    ),
    created: Type.Integer({ minimum: 0 }),
  },
  { additionalProperties: false },
);

export const ConfigSchema = Type.Object(
  {
    server: Type.Object(
      { host: Type.String({ minLength: 1 }), port: Type.Integer({ minimum: 0, maximum: 65535 }) },
      { additionalProperties: false },
    ),
    data_dir: Type.String({ minLength: 1 }),
    public_base_url: Type.Union([Type.Null(), Type.String({ pattern: '^https?://' })]),
    // Any length: an operator's short token (a test rig's, a demo's) starts the gateway with a
    // warning in the log rather than refusing it (CONTRACT §6 sets no lower bound).
    admin_token: Type.Union([Type.Null(), Type.String({ minLength: 1, maxLength: 1024 })]),
    log_level: Type.Union(
      ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'].map((l) => Type.Literal(l)),
    ),
    providers: Type.Record(Type.String({ minLength: 1 }), ProviderConfigSchema),
    models: Type.Record(Type.String({ pattern: '^[A-Za-z0-9._:/-]{1,128}$' }), ModelConfigSchema),
    aliases: Type.Record(Type.String({ minLength: 1 }), Type.String({ minLength: 1 })),
    decision: Type.Object(
      {
        models: Type.Object(
          {
            'decision-fast': Type.String({ minLength: 1 }),
            'decision-accurate': Type.String({ minLength: 1 }),
          },
          { additionalProperties: false },
        ),
        context_tokens: PositiveInt('input tokens a decision may carry (422 above)'),
        answer_tokens: PositiveInt('output budget reserved for one decision answer'),
        timeout_ms: DurationMs('upstream timeout of one decision call'),
      },
      { additionalProperties: false },
    ),
    limits: Type.Object(
      {
        stream_timeout_ms: DurationMs('a stream ends with stream_timeout after this'),
        upstream_timeout_ms: DurationMs('a non-stream call ends with 504 after this'),
        max_body_bytes: PositiveInt('HTTP body limit (413 above)'),
        max_body_bytes_in_flight: PositiveInt(
          'request body bytes being read at once, all connections together (503 past it)',
        ),
        max_body_json_values: PositiveInt(
          'JSON values and members a request body may ' +
            'hold (400 above), checked before it is parsed',
        ),
        default_rate_limit_rpm: PositiveInt('requests per minute per key when the key sets none'),
        max_messages: PositiveInt('messages per chat request'),
        max_tools: PositiveInt('tools per chat request'),
        max_stop_sequences: PositiveInt('stop sequences per chat request'),
        max_in_flight: PositiveInt('requests running at once; 503 above'),
        max_keys: PositiveInt('API keys the gateway holds'),
        request_records_max: PositiveInt('finished request records kept in memory'),
        idempotency_keys_max: PositiveInt('bound idempotency keys kept in memory'),
        shutdown_grace_ms: DurationMs(
          'SIGTERM, or a failed log: time in-flight requests get to finish',
          0,
        ),
        idempotency_keys_per_key: PositiveInt(
          'bound idempotency keys one API key may hold; its oldest goes first',
        ),
        request_records_per_key: PositiveInt(
          'finished request records one API key may hold; its oldest goes first',
        ),
        request_read_timeout_ms: DurationMs(
          'headers and body must arrive within this, counted before auth',
        ),
        stream_buffer_bytes: PositiveInt(
          'bytes a stream may queue for a slow reader before the upstream is paused',
        ),
        max_upstream_body_bytes: PositiveInt(
          'largest upstream answer (a JSON body, or all text of a stream)',
        ),
        max_upstream_event_bytes: PositiveInt('largest single SSE event from an upstream'),
        simulator_tool_arguments_bytes: PositiveInt(
          'largest tool-call arguments the simulator generates',
        ),
      },
      { additionalProperties: false },
    ),
    routing: Type.Object(
      {
        max_attempts: Type.Integer({
          minimum: 1,
          maximum: DEPLOYMENTS_MAX,
          description: 'deployments one call may try before it fails',
        }),
        failures_to_eject: PositiveInt('failures in a row after which a deployment is skipped'),
        cooldown_ms: DurationMs('how long an ejected deployment is skipped before a probe'),
      },
      { additionalProperties: false },
    ),
    billing: Type.Object(
      { on_error: Type.Union([Type.Literal('keep'), Type.Literal('release')]) },
      { additionalProperties: false },
    ),
    idempotency_ttl_s: PositiveInt(
      'how long a bound Idempotency-Key and a finished request record live after the request ends',
    ),
    usage_retention_days: Type.Integer({
      minimum: 1,
      maximum: USAGE_RETENTION_DAYS_MAX,
      description: 'UTC days of usage history kept (GET /admin/v1/usage)',
    }),
    wal: Type.Object(
      {
        fsync: Type.Union([Type.Literal('always'), Type.Literal('interval'), Type.Literal('off')]),
        fsync_interval_ms: DurationMs('fsync period of the interval policy'),
        segment_bytes: PositiveInt('a segment rolls over past this size'),
        snapshot_every_records: PositiveInt(
          'records between snapshots (then old segments are removed)',
        ),
      },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false },
);

/** The config as written (and as the schema checks it): a model may use the one-provider form. */
export type ConfigSettings = Static<typeof ConfigSchema>;
export type ModelSettings = Static<typeof ModelConfigSchema>;
export type Config = Omit<ConfigSettings, 'models'> & {
  models: Record<string, ModelConfig>;
};

/**
 * Every model with its deployments listed: `deployments` when given (its first provider is then
 * the model's `provider`, shown as `owned_by`), else the one-provider form as one deployment. The
 * loader checked that one of the two is there.
 */
export function withDeployments(settings: ConfigSettings): Config {
  const models: Record<string, ModelConfig> = {};
  for (const [id, model] of Object.entries(settings.models)) {
    const deployments = model.deployments ?? [
      {
        provider: model.provider as string,
        ...(model.upstream_model === undefined ? {} : { upstream_model: model.upstream_model }),
      },
    ];
    Object.defineProperty(models, id, {
      value: { ...model, provider: deployments[0]!.provider, deployments },
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return { ...settings, models };
}
export type Deployment = Static<typeof DeploymentSchema>;
/** A model as the loader leaves it: its deployments always listed (the shorthand expanded). */
export type ModelConfig = Static<typeof ModelConfigSchema> & {
  provider: string;
  deployments: Deployment[];
};
export type SimulatorProviderConfig = Static<typeof SimulatorProviderSchema>;
export type OpenAIProviderConfig = Static<typeof OpenAIProviderSchema>;
export type AnthropicProviderConfig = Static<typeof AnthropicProviderSchema>;
export type GeminiProviderConfig = Static<typeof GeminiProviderSchema>;
/** A provider reached over HTTP, whatever protocol it speaks. */
export type HttpProviderConfig =
  | OpenAIProviderConfig
  | AnthropicProviderConfig
  | GeminiProviderConfig;
export type Rates = Static<typeof RatesSchema>;
