// Loads the config: built-in defaults, then GATEWAY_CONFIG deep-merged over them, then env;
// validated once.
import { readFileSync } from 'node:fs';
import { Value } from '@sinclair/typebox/value';
import { fieldPath, firstProblem } from '../util/validation.ts';
import { defaultSettings } from './defaults.ts';
import {
  type Config,
  ConfigSchema,
  type ConfigSettings,
  type HttpProviderConfig,
  ProviderConfigSchema,
  withDeployments,
} from './model.ts';

/** A config that cannot run; the message names the field so the operator can fix it. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

function isPlainObject(value: unknown): value is Record<string, Json> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * Objects merge key by key at every depth; anything else (arrays included) replaces. Keys are plain
 * data: a "__proto__" key is defined as an own field (an assignment would replace the object's
 * prototype), and "constructor" or "toString" find nothing in the base unless it has them itself.
 */
export function deepMerge(base: Json, override: Json): Json {
  if (!isPlainObject(base) || !isPlainObject(override)) return override;
  const merged: Record<string, Json> = { ...base };
  for (const [key, value] of Object.entries(override)) {
    const mergedValue = Object.hasOwn(base, key) ? deepMerge(base[key] as Json, value) : value;
    Object.defineProperty(merged, key, {
      value: mergedValue,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return merged;
}

export interface LoadOptions {
  env?: Record<string, string | undefined>;
  /** A config object merged over the defaults before the file and env (tests use this). */
  overrides?: unknown;
}

function envInteger(env: Record<string, string | undefined>, name: string): number | undefined {
  const raw = env[name];
  if (raw === undefined || raw === '') return undefined;
  if (!/^\d+$/.test(raw))
    throw new ConfigError(`env ${name}: expected a whole number, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

export function loadConfig(options: LoadOptions = {}): Config {
  const env = options.env ?? process.env;
  let merged = defaultSettings() as unknown as Json;
  if (options.overrides !== undefined) merged = deepMerge(merged, options.overrides as Json);

  const path = env.GATEWAY_CONFIG;
  if (path) {
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (error) {
      throw new ConfigError(`GATEWAY_CONFIG ${path}: cannot read (${(error as Error).message})`);
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (error) {
      throw new ConfigError(`GATEWAY_CONFIG ${path}: not valid JSON (${(error as Error).message})`);
    }
    if (!isPlainObject(parsed))
      throw new ConfigError(`GATEWAY_CONFIG ${path}: expected a JSON object`);
    merged = deepMerge(merged, parsed);
  }

  // biome-ignore lint/suspicious/noExplicitAny: validateConfig checks the whole tree just below.
  const config = merged as Record<string, any>;
  const port = envInteger(env, 'PORT');
  if (port !== undefined) config.server.port = port;
  if (env.HOST) config.server.host = env.HOST;
  if (env.DATA_DIR) config.data_dir = env.DATA_DIR;
  if (env.ADMIN_TOKEN) config.admin_token = env.ADMIN_TOKEN;
  if (env.LOG_LEVEL) config.log_level = env.LOG_LEVEL;

  return validateConfig(config);
}

/**
 * Header fields the HTTP client writes itself: a configured one would break the framing or the
 * routing.
 */
const RESERVED_HEADERS = new Set([
  'host',
  'content-length',
  'transfer-encoding',
  'connection',
  'accept-encoding',
  'content-type',
  'upgrade',
  'te',
  'trailer',
  'keep-alive',
]);
const TOKEN_RE = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
const HEADER_VALUE_RE = /^[\x20-\x7e]*$/;

function checkHttpProvider(name: string, provider: HttpProviderConfig): void {
  const field = `config field providers.${name}`;
  let url: URL;
  try {
    url = new URL(provider.base_url);
  } catch {
    throw new ConfigError(
      `${field}.base_url: not a URL (got ${JSON.stringify(provider.base_url)})`,
    );
  }
  if (url.username || url.password)
    throw new ConfigError(
      `${field}.base_url: credentials in the URL are not sent; use api_key_env`,
    );
  for (const [header, value] of Object.entries(provider.headers ?? {})) {
    if (!TOKEN_RE.test(header))
      throw new ConfigError(
        `${field}.headers: ${JSON.stringify(header)} is not a header field name`,
      );
    if (RESERVED_HEADERS.has(header.toLowerCase()))
      throw new ConfigError(`${field}.headers.${header}: set by the gateway itself`);
    if (!HEADER_VALUE_RE.test(value))
      throw new ConfigError(
        `${field}.headers.${header}: only visible ASCII and spaces are allowed`,
      );
  }
  if (provider.ca_file !== undefined) {
    let pem: string;
    try {
      pem = readFileSync(provider.ca_file, 'utf8');
    } catch (error) {
      throw new ConfigError(
        `${field}.ca_file: cannot read ${provider.ca_file} (${(error as Error).message})`,
      );
    }
    if (!pem.includes('-----BEGIN CERTIFICATE-----'))
      throw new ConfigError(`${field}.ca_file: ${provider.ca_file} holds no PEM certificate`);
  }
}

/**
 * Each provider with its options' defaults filled in from the schema's `default` annotations (so
 * `{"type": "simulator"}` alone is complete). Copies: the caller's objects are left as they were.
 */
function withProviderDefaults(candidate: unknown): unknown {
  if (!isPlainObject(candidate) || !isPlainObject(candidate.providers)) return candidate;
  const providers: Record<string, Json> = {};
  for (const [name, provider] of Object.entries(candidate.providers)) {
    const type = isPlainObject(provider) ? provider.type : undefined;
    const schema = ProviderConfigSchema.anyOf.find(
      (branch) => branch.properties.type.const === type,
    );
    const value = schema ? (Value.Default(schema, structuredClone(provider)) as Json) : provider;
    Object.defineProperty(providers, name, {
      value,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return { ...candidate, providers };
}

/**
 * Fields whose value a message must not repeat: the config error goes to the terminal and the logs.
 */
function isSecretField(segments: readonly string[]): boolean {
  return (
    segments[0] === 'admin_token' || (segments[0] === 'providers' && segments[2] === 'headers')
  );
}

/**
 * Validates the schema (defaults filled in first), then the references between sections that a
 * schema cannot express.
 */
export function validateConfig(input: unknown): Config {
  const candidate = withProviderDefaults(input);
  const problem = firstProblem(Value.Errors(ConfigSchema, candidate));
  if (problem) {
    const field = fieldPath(candidate, problem.segments) || '(root)';
    const got =
      problem.value === undefined || isSecretField(problem.segments)
        ? ''
        : ` (got ${JSON.stringify(problem.value)})`;
    throw new ConfigError(`config field ${field}: ${problem.problem}${got}`);
  }
  const settings = candidate as ConfigSettings;
  // Own keys only, here and below: a name such as "constructor" must not find Object.prototype's.
  const has = (record: object, key: string) => Object.hasOwn(record, key);
  for (const [name, provider] of Object.entries(settings.providers)) {
    if (provider.type !== 'simulator') checkHttpProvider(name, provider);
  }
  const { limits } = settings;
  // Else every body between the two would be a 503 "retry shortly", retried for ever.
  if (limits.max_body_bytes_in_flight < limits.max_body_bytes)
    throw new ConfigError(
      `config field limits.max_body_bytes_in_flight: must be ≥ limits.max_body_bytes ` +
        `(${limits.max_body_bytes}; got ${limits.max_body_bytes_in_flight})`,
    );
  for (const [id, model] of Object.entries(settings.models)) {
    if (model.deployments === undefined && model.provider === undefined) {
      throw new ConfigError(`config field models.${id}: needs a provider or deployments`);
    }
    const deployments = model.deployments ?? [{ provider: model.provider as string }];
    deployments.forEach((deployment, index) => {
      if (!has(settings.providers, deployment.provider)) {
        const field = model.deployments ? `deployments[${index}].provider` : 'provider';
        throw new ConfigError(
          `config field models.${id}.${field}: no provider named ` +
            `${JSON.stringify(deployment.provider)}`,
        );
      }
    });
    if (model.max_output_tokens > model.context_window) {
      throw new ConfigError(
        `config field models.${id}.max_output_tokens: larger than its context_window`,
      );
    }
  }
  const config = withDeployments(settings);
  for (const [alias, target] of Object.entries(config.aliases)) {
    if (!has(config.models, target))
      throw new ConfigError(
        `config field aliases.${alias}: no model named ${JSON.stringify(target)}`,
      );
    if (has(config.models, alias))
      throw new ConfigError(`config field aliases.${alias}: shadows a catalogue model`);
  }
  for (const [name, target] of Object.entries(config.decision.models)) {
    if (!has(config.models, target)) {
      throw new ConfigError(
        `config field decision.models.${name}: no model named ${JSON.stringify(target)}`,
      );
    }
  }
  return config;
}

/**
 * The header field each provider type carries its key in (the dialects' `keyField`; config does
 * not import providers): a key configured in `headers` stands in for `api_key_env`.
 */
const KEY_FIELDS: Record<string, string> = {
  openai: 'authorization',
  anthropic: 'x-api-key',
  gemini: 'x-goog-api-key',
};

/**
 * Refuses to serve when a provider some model uses names in `api_key_env` a variable that is unset
 * or empty, and has no key in its `headers` either: every call would go out without a key and come
 * back a 401, which the client would see as a 502 and pay for under `billing.on_error: "keep"`.
 * Checked when the gateway starts, not by the admin CLI, which calls no provider.
 */
export function checkProviderKeys(config: Config, env: NodeJS.ProcessEnv = process.env): void {
  const used = new Set<string>();
  for (const model of Object.values(config.models)) {
    if (model.provider !== undefined) used.add(model.provider);
    for (const deployment of model.deployments ?? []) used.add(deployment.provider);
  }
  for (const [name, provider] of Object.entries(config.providers)) {
    if (provider.type === 'simulator' || provider.api_key_env === undefined || !used.has(name))
      continue;
    const keyField = KEY_FIELDS[provider.type];
    const headers = Object.keys(provider.headers ?? {}).map((field) => field.toLowerCase());
    if (keyField !== undefined && headers.includes(keyField)) continue;
    const value = env[provider.api_key_env];
    if (value === undefined || value === '')
      throw new ConfigError(
        `config field providers.${name}.api_key_env: the environment variable ` +
          `${provider.api_key_env} is not set (or empty); set it, or drop api_key_env for an ` +
          'upstream that takes no key',
      );
  }
}
