// Loads the config: built-in defaults, then GATEWAY_CONFIG deep-merged over them, then env; validated once.
import { readFileSync } from 'node:fs';
import { Value } from '@sinclair/typebox/value';
import { ConfigSchema, type Config } from './model.ts';
import { defaultConfig } from './defaults.ts';

/** A config that cannot run; the message names the field so the operator can fix it. */
export class ConfigError extends Error {
  override name = 'ConfigError';
}

type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

function isPlainObject(value: unknown): value is Record<string, Json> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Objects merge key by key at every depth; anything else (arrays included) replaces. */
export function deepMerge(base: Json, override: Json): Json {
  if (!isPlainObject(base) || !isPlainObject(override)) return override;
  const merged: Record<string, Json> = { ...base };
  for (const [key, value] of Object.entries(override)) {
    merged[key] = key in base ? deepMerge(base[key] as Json, value) : value;
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
  if (!/^\d+$/.test(raw)) throw new ConfigError(`env ${name}: expected a whole number, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

export function loadConfig(options: LoadOptions = {}): Config {
  const env = options.env ?? process.env;
  let merged = defaultConfig() as unknown as Json;
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
    if (!isPlainObject(parsed)) throw new ConfigError(`GATEWAY_CONFIG ${path}: expected a JSON object`);
    merged = deepMerge(merged, parsed);
  }

  const config = merged as Record<string, any>;
  const port = envInteger(env, 'PORT');
  if (port !== undefined) config.server.port = port;
  if (env.HOST) config.server.host = env.HOST;
  if (env.DATA_DIR) config.data_dir = env.DATA_DIR;
  if (env.ADMIN_TOKEN) config.admin_token = env.ADMIN_TOKEN;
  if (env.LOG_LEVEL) config.log_level = env.LOG_LEVEL;

  return validateConfig(config);
}

/** Validates the schema, then the references between sections that a schema cannot express. */
export function validateConfig(candidate: unknown): Config {
  const first = Value.Errors(ConfigSchema, candidate).First();
  if (first) {
    const field = first.path.replace(/^\//, '').replaceAll('/', '.') || '(root)';
    throw new ConfigError(`config field ${field}: ${first.message} (got ${JSON.stringify(first.value)})`);
  }
  const config = candidate as Config;
  for (const [id, model] of Object.entries(config.models)) {
    if (!config.providers[model.provider]) {
      throw new ConfigError(`config field models.${id}.provider: no provider named ${JSON.stringify(model.provider)}`);
    }
    if (model.max_output_tokens > model.context_window) {
      throw new ConfigError(`config field models.${id}.max_output_tokens: larger than its context_window`);
    }
  }
  for (const [alias, target] of Object.entries(config.aliases)) {
    if (!config.models[target]) throw new ConfigError(`config field aliases.${alias}: no model named ${JSON.stringify(target)}`);
    if (config.models[alias]) throw new ConfigError(`config field aliases.${alias}: shadows a catalogue model`);
  }
  for (const [name, target] of Object.entries(config.decision.models)) {
    if (!config.models[target]) {
      throw new ConfigError(`config field decision.models.${name}: no model named ${JSON.stringify(target)}`);
    }
  }
  return config;
}
