// loadConfig: the built-in catalogue, GATEWAY_CONFIG deep-merged over it, env overrides, and errors that name the field.
import { afterAll, describe, expect, test } from 'bun:test';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, loadConfig } from '../../src/config/load.ts';
import { defaultConfig } from '../../src/config/defaults.ts';

const dir = mkdtempSync(join(tmpdir(), 'tollgate-config-'));
let fileCount = 0;

afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Writes `content` (an object as JSON, or raw text) to a fresh file and returns its path. */
function configFile(content: unknown): string {
  const path = join(dir, `config-${++fileCount}.json`);
  writeFileSync(path, typeof content === 'string' ? content : JSON.stringify(content));
  return path;
}

function loadWith(content: unknown, env: Record<string, string> = {}) {
  return loadConfig({ env: { GATEWAY_CONFIG: configFile(content), ...env } });
}

/** The ConfigError thrown by `load`, so its message can be checked; fails the test when none is thrown. */
function configError(load: () => unknown): ConfigError {
  try {
    load();
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return error as ConfigError;
  }
  throw new Error('expected a ConfigError, but the config loaded');
}

// The spec's catalogue (spec 000, "Models"): Tools flag and credits per 1M input / output tokens.
const CATALOGUE = {
  model_01: { tools: true, rates: { input: 2_778, output: 13_889 } },
  model_02: { tools: true, rates: { input: 2_778, output: 13_889 } },
  model_03: { tools: true, rates: { input: 5, output: 14 } },
  model_04: { tools: true, rates: { input: 78, output: 245 } },
  model_05: { tools: true, rates: { input: 78, output: 245 } },
  model_06: { tools: true, rates: { input: 84, output: 278 } },
  model_07: { tools: true, rates: { input: 834, output: 4_167 } },
  model_08: { tools: true, rates: { input: 84, output: 334 } },
  model_09: { tools: false, rates: { input: 98, output: 362 } },
  model_10: { tools: true, rates: { input: 126, output: 251 } },
  model_11: { tools: true, rates: { input: 39, output: 78 } },
};

describe('defaults', () => {
  test('with no file and no env the defaults load unchanged', () => {
    expect(loadConfig({ env: {} })).toEqual(defaultConfig());
  });

  test('the catalogue holds the spec\'s 11 models with their Tools flags and rates', () => {
    const config = loadConfig({ env: {} });
    const catalogue = Object.fromEntries(
      Object.entries(config.models).map(([id, model]) => [id, { tools: model.tools, rates: model.rates }]),
    );
    expect(catalogue).toEqual(CATALOGUE);
  });

  test('only model_01 has the long-context rule: from 272,000 input tokens at 5,556 / 20,834', () => {
    const config = loadConfig({ env: {} });
    const longContext = Object.fromEntries(Object.entries(config.models).map(([id, model]) => [id, model.long_context ?? null]));
    expect(longContext).toEqual({
      model_01: { threshold_tokens: 272_000, rates: { input: 5_556, output: 20_834 } },
      model_02: null,
      model_03: null,
      model_04: null,
      model_05: null,
      model_06: null,
      model_07: null,
      model_08: null,
      model_09: null,
      model_10: null,
      model_11: null,
    });
  });

  test('every model runs on the embedded simulator and its windows are consistent', () => {
    const config = loadConfig({ env: {} });
    expect(Object.keys(config.providers)).toEqual(['simulator']);
    expect(config.providers.simulator!.type).toBe('simulator');
    for (const model of Object.values(config.models)) {
      expect(model.provider).toBe('simulator');
      expect(model.max_output_tokens).toBeLessThanOrEqual(model.context_window);
    }
  });

  test('aliases, decision models and the contract\'s limits', () => {
    const config = loadConfig({ env: {} });
    expect(config.aliases).toEqual({ legacy_fast_1: 'model_03', legacy_fast_2: 'model_03' });
    expect(config.decision.models).toEqual({ 'decision-fast': 'model_03', 'decision-accurate': 'model_07' });
    expect(config.decision.context_tokens).toBe(32_000);
    expect(config.server).toEqual({ host: '127.0.0.1', port: 8080 });
    expect(config.data_dir).toBe('./data');
    expect(config.admin_token).toBeNull();
    expect(config.limits.max_body_bytes).toBe(4_194_304);
    expect(config.limits.stream_timeout_ms).toBe(90_000);
    expect(config.billing).toEqual({ on_error: 'keep' });
    expect(config.idempotency_ttl_s).toBe(86_400);
  });
});

describe('GATEWAY_CONFIG deep merge', () => {
  test('a model entry naming only provider keeps its rates, windows and flags', () => {
    const config = loadWith({
      providers: { upstream: { type: 'openai', base_url: 'http://127.0.0.1:9/v1' } },
      models: { model_03: { provider: 'upstream' }, model_01: { provider: 'upstream', upstream_model: 'big-one' } },
    });
    const defaults = defaultConfig();
    expect(config.models.model_03).toEqual({ ...defaults.models.model_03!, provider: 'upstream' });
    expect(config.models.model_01).toEqual({ ...defaults.models.model_01!, provider: 'upstream', upstream_model: 'big-one' });
    // Untouched models and the default provider stay.
    expect(config.models.model_02).toEqual(defaults.models.model_02!);
    expect(config.providers).toEqual({
      simulator: defaults.providers.simulator!,
      upstream: { type: 'openai', base_url: 'http://127.0.0.1:9/v1' },
    });
  });

  test('one nested field changes, its siblings stay', () => {
    const config = loadWith({ models: { model_03: { rates: { output: 20 } } }, limits: { max_body_bytes: 1024 }, wal: { fsync: 'off' } });
    const defaults = defaultConfig();
    expect(config.models.model_03!.rates).toEqual({ input: 5, output: 20 });
    expect(config.limits).toEqual({ ...defaults.limits, max_body_bytes: 1024 });
    expect(config.wal).toEqual({ ...defaults.wal, fsync: 'off' });
  });

  test('a new model with every field is added beside the catalogue; a new alias may point at it', () => {
    const extra = {
      provider: 'simulator',
      tools: false,
      top_k: false,
      seed: false,
      rates: { input: 1, output: 2 },
      context_window: 1000,
      max_output_tokens: 100,
      created: 0,
    };
    const config = loadWith({ models: { model_extra: extra }, aliases: { extra_alias: 'model_extra' } });
    expect(Object.keys(config.models)).toHaveLength(12);
    expect(config.models.model_extra).toEqual(extra);
    expect(config.aliases).toEqual({ legacy_fast_1: 'model_03', legacy_fast_2: 'model_03', extra_alias: 'model_extra' });
  });

  test('a file may remove model_01\'s long-context rule with null', () => {
    expect(loadWith({ models: { model_01: { long_context: null } } }).models.model_01!.long_context).toBeNull();
  });
});

describe('env overrides', () => {
  test('PORT, HOST, DATA_DIR, ADMIN_TOKEN and LOG_LEVEL override the defaults', () => {
    const config = loadConfig({
      env: { PORT: '0', HOST: '0.0.0.0', DATA_DIR: '/var/lib/tollgate', ADMIN_TOKEN: 'an-admin-token-of-length', LOG_LEVEL: 'debug' },
    });
    expect(config).toEqual({
      ...defaultConfig(),
      server: { host: '0.0.0.0', port: 0 },
      data_dir: '/var/lib/tollgate',
      admin_token: 'an-admin-token-of-length',
      log_level: 'debug',
    });
  });

  test('env wins over the file', () => {
    const config = loadWith(
      { server: { host: '10.0.0.1', port: 9000 }, data_dir: '/from/file', log_level: 'warn' },
      { PORT: '9100', DATA_DIR: '/from/env' },
    );
    expect(config.server).toEqual({ host: '10.0.0.1', port: 9100 });
    expect(config.data_dir).toBe('/from/env');
    expect(config.log_level).toBe('warn');
  });

  test('empty env values are ignored', () => {
    expect(loadConfig({ env: { PORT: '', HOST: '', DATA_DIR: '', ADMIN_TOKEN: '', LOG_LEVEL: '', GATEWAY_CONFIG: '' } })).toEqual(defaultConfig());
  });
});

describe('a bad config stops with a ConfigError naming the field', () => {
  const cases: Array<{ name: string; file?: unknown; env?: Record<string, string>; field: string }> = [
    { name: 'negative rate', file: { models: { model_03: { rates: { input: -1 } } } }, field: 'models.model_03.rates.input' },
    { name: 'rate as a string', file: { models: { model_03: { rates: { input: '5' } } } }, field: 'models.model_03.rates.input' },
    { name: 'fractional rate', file: { models: { model_03: { rates: { output: 1.5 } } } }, field: 'models.model_03.rates.output' },
    { name: 'unknown fsync policy', file: { wal: { fsync: 'sometimes' } }, field: 'wal.fsync' },
    { name: 'zero body limit', file: { limits: { max_body_bytes: 0 } }, field: 'limits.max_body_bytes' },
    { name: 'unknown billing.on_error', file: { billing: { on_error: 'refund' } }, field: 'billing.on_error' },
    { name: 'model on an unknown provider', file: { models: { model_03: { provider: 'nowhere' } } }, field: 'models.model_03.provider' },
    { name: 'alias to an unknown model', file: { aliases: { old_name: 'model_99' } }, field: 'aliases.old_name' },
    { name: 'alias shadowing a catalogue model', file: { aliases: { model_02: 'model_03' } }, field: 'aliases.model_02' },
    { name: 'output window above the context window', file: { models: { model_03: { max_output_tokens: 500_000 } } }, field: 'models.model_03.max_output_tokens' },
    { name: 'decision model not in the catalogue', file: { decision: { models: { 'decision-fast': 'model_99' } } }, field: 'decision.models.decision-fast' },
    { name: 'new model missing its fields', file: { models: { model_new: { provider: 'simulator' } } }, field: 'models.model_new.' },
    { name: 'unknown top-level section', file: { limitz: {} }, field: 'limitz' },
    { name: 'unknown provider type', file: { providers: { up: { type: 'grpc' } } }, field: 'providers.up' },
    { name: 'header name with a space', file: { providers: { up: { type: 'openai', base_url: 'http://x/v1', headers: { 'x bad': '1' } } } }, field: 'providers.up.headers' },
    { name: 'header value with a line break', file: { providers: { up: { type: 'openai', base_url: 'http://x/v1', headers: { 'x-a': 'v\r\nx-b: injected' } } } }, field: 'providers.up.headers.x-a' },
    { name: 'header the gateway sets itself', file: { providers: { up: { type: 'openai', base_url: 'http://x/v1', headers: { 'Content-Length': '5' } } } }, field: 'providers.up.headers.Content-Length' },
    { name: 'credentials in base_url', file: { providers: { up: { type: 'openai', base_url: 'http://user:pw@x/v1' } } }, field: 'providers.up.base_url' },
    { name: 'unreadable ca_file', file: { providers: { up: { type: 'openai', base_url: 'https://x/v1', ca_file: '/nonexistent/ca.pem' } } }, field: 'providers.up.ca_file' },
    { name: 'ca_file without a certificate', file: { providers: { up: { type: 'openai', base_url: 'https://x/v1', ca_file: configFile('not a certificate') } } }, field: 'providers.up.ca_file' },
    { name: 'a timeout too long for a timer (it would fire at once)', file: { providers: { up: { type: 'openai', base_url: 'http://x/v1', timeout_ms: 2 ** 31 } } }, field: 'providers.up' },
    { name: 'stream timeout too long for a timer', file: { limits: { stream_timeout_ms: 2 ** 31 } }, field: 'limits.stream_timeout_ms' },
    { name: 'PORT not a number', env: { PORT: 'abc' }, field: 'PORT' },
    { name: 'PORT out of range', env: { PORT: '70000' }, field: 'server.port' },
    { name: 'LOG_LEVEL unknown', env: { LOG_LEVEL: 'loud' }, field: 'log_level' },
    { name: 'ADMIN_TOKEN too short to be safe', env: { ADMIN_TOKEN: 'short' }, field: 'admin_token' },
  ];

  for (const c of cases) {
    test(`${c.name} → ${c.field}`, () => {
      const env: Record<string, string> = { ...c.env };
      if (c.file !== undefined) env.GATEWAY_CONFIG = configFile(c.file);
      const error = configError(() => loadConfig({ env }));
      expect(error.message).toContain(c.field);
    });
  }

  test('an unreadable file names the path', () => {
    const missing = join(dir, 'does-not-exist.json');
    expect(configError(() => loadConfig({ env: { GATEWAY_CONFIG: missing } })).message).toContain(missing);
  });

  test('a path that is a directory cannot be read and is named', () => {
    expect(configError(() => loadConfig({ env: { GATEWAY_CONFIG: dir } })).message).toContain(dir);
  });

  test('invalid JSON names the path and says so', () => {
    const path = configFile('{"models": ');
    const error = configError(() => loadConfig({ env: { GATEWAY_CONFIG: path } }));
    expect(error.message).toContain(path);
    expect(error.message).toContain('JSON');
  });

  test('a JSON array instead of an object is refused', () => {
    const path = configFile('[1, 2]');
    expect(configError(() => loadConfig({ env: { GATEWAY_CONFIG: path } })).message).toContain(path);
  });
});
