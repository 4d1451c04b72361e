// loadConfig: the built-in catalogue, GATEWAY_CONFIG deep-merged over it, env overrides, and errors
// that name the field.
import { afterAll, describe, expect, test } from 'bun:test';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { defaultConfig } from '../../src/config/defaults.ts';
import { ConfigError, checkProviderKeys, deepMerge, loadConfig } from '../../src/config/load.ts';
import type { SimulatorProviderConfig } from '../../src/config/model.ts';
import { bearer, chatBody, openTestGateway } from '../support/gateway.ts';

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

/**
 * The ConfigError thrown by `load`, so its message can be checked; fails the test when none is
 * thrown.
 */
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

  test("the catalogue holds the spec's 11 models with their Tools flags and rates", () => {
    const config = loadConfig({ env: {} });
    const catalogue = Object.fromEntries(
      Object.entries(config.models).map(([id, model]) => [
        id,
        { tools: model.tools, rates: model.rates },
      ]),
    );
    expect(catalogue).toEqual(CATALOGUE);
  });

  test(
    'only model_01 has the long-context rule: ' + 'from 272,000 input tokens at 5,556 / 20,834',
    () => {
      const config = loadConfig({ env: {} });
      const longContext = Object.fromEntries(
        Object.entries(config.models).map(([id, model]) => [id, model.long_context ?? null]),
      );
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
    },
  );

  test('every model runs on the embedded simulator and its windows are consistent', () => {
    const config = loadConfig({ env: {} });
    expect(Object.keys(config.providers)).toEqual(['simulator']);
    expect(config.providers.simulator!.type).toBe('simulator');
    for (const model of Object.values(config.models)) {
      expect(model.provider).toBe('simulator');
      expect(model.max_output_tokens).toBeLessThanOrEqual(model.context_window);
    }
  });

  test("aliases, decision models and the contract's limits", () => {
    const config = loadConfig({ env: {} });
    expect(config.aliases).toEqual({ legacy_fast_1: 'model_03', legacy_fast_2: 'model_03' });
    expect(config.decision.models).toEqual({
      'decision-fast': 'model_03',
      'decision-accurate': 'model_07',
    });
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
      models: {
        model_03: { provider: 'upstream' },
        model_01: { provider: 'upstream', upstream_model: 'big-one' },
      },
    });
    const defaults = defaultConfig();
    expect(config.models.model_03).toEqual({
      ...defaults.models.model_03!,
      provider: 'upstream',
      deployments: [{ provider: 'upstream' }],
    });
    expect(config.models.model_01).toEqual({
      ...defaults.models.model_01!,
      provider: 'upstream',
      upstream_model: 'big-one',
      deployments: [{ provider: 'upstream', upstream_model: 'big-one' }],
    });
    // Untouched models and the default provider stay.
    expect(config.models.model_02).toEqual(defaults.models.model_02!);
    expect(config.providers).toEqual({
      simulator: defaults.providers.simulator!,
      upstream: { type: 'openai', base_url: 'http://127.0.0.1:9/v1' },
    });
  });

  test('one nested field changes, its siblings stay', () => {
    const config = loadWith({
      models: { model_03: { rates: { output: 20 } } },
      limits: { max_body_bytes: 1024 },
      wal: { fsync: 'off' },
    });
    const defaults = defaultConfig();
    expect(config.models.model_03!.rates).toEqual({ input: 5, output: 20 });
    expect(config.limits).toEqual({ ...defaults.limits, max_body_bytes: 1024 });
    expect(config.wal).toEqual({ ...defaults.wal, fsync: 'off' });
  });

  test(
    'a new model with every field is added beside ' + 'the catalogue; a new alias may point at it',
    () => {
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
      const config = loadWith({
        models: { model_extra: extra },
        aliases: { extra_alias: 'model_extra' },
      });
      expect(Object.keys(config.models)).toHaveLength(12);
      // The one-provider form comes back with its deployment listed.
      expect(config.models.model_extra).toEqual({
        ...extra,
        deployments: [{ provider: extra.provider }],
      });
      expect(config.aliases).toEqual({
        legacy_fast_1: 'model_03',
        legacy_fast_2: 'model_03',
        extra_alias: 'model_extra',
      });
    },
  );

  test("a file may remove model_01's long-context rule with null", () => {
    expect(
      loadWith({ models: { model_01: { long_context: null } } }).models.model_01!.long_context,
    ).toBeNull();
  });
});

describe('env overrides', () => {
  test('PORT, HOST, DATA_DIR, ADMIN_TOKEN and LOG_LEVEL override the defaults', () => {
    const config = loadConfig({
      env: {
        PORT: '0',
        HOST: '0.0.0.0',
        DATA_DIR: '/var/lib/tollgate',
        ADMIN_TOKEN: 'an-admin-token-of-length',
        LOG_LEVEL: 'debug',
      },
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
    expect(
      loadConfig({
        env: {
          PORT: '',
          HOST: '',
          DATA_DIR: '',
          ADMIN_TOKEN: '',
          LOG_LEVEL: '',
          GATEWAY_CONFIG: '',
        },
      }),
    ).toEqual(defaultConfig());
  });
});

describe('a bad config stops with a ConfigError naming the field', () => {
  const cases: Array<{
    name: string;
    file?: unknown;
    env?: Record<string, string>;
    field: string;
  }> = [
    {
      name: 'negative rate',
      file: { models: { model_03: { rates: { input: -1 } } } },
      field: 'models.model_03.rates.input',
    },
    {
      name: 'rate as a string',
      file: { models: { model_03: { rates: { input: '5' } } } },
      field: 'models.model_03.rates.input',
    },
    {
      name: 'fractional rate',
      file: { models: { model_03: { rates: { output: 1.5 } } } },
      field: 'models.model_03.rates.output',
    },
    { name: 'unknown fsync policy', file: { wal: { fsync: 'sometimes' } }, field: 'wal.fsync' },
    {
      name: 'zero body limit',
      file: { limits: { max_body_bytes: 0 } },
      field: 'limits.max_body_bytes',
    },
    {
      name: 'unknown billing.on_error',
      file: { billing: { on_error: 'refund' } },
      field: 'billing.on_error',
    },
    {
      name: 'model on an unknown provider',
      file: { models: { model_03: { provider: 'nowhere' } } },
      field: 'models.model_03.provider',
    },
    {
      name: 'alias to an unknown model',
      file: { aliases: { old_name: 'model_99' } },
      field: 'aliases.old_name',
    },
    {
      name: 'alias shadowing a catalogue model',
      file: { aliases: { model_02: 'model_03' } },
      field: 'aliases.model_02',
    },
    {
      name: 'output window above the context window',
      file: { models: { model_03: { max_output_tokens: 500_000 } } },
      field: 'models.model_03.max_output_tokens',
    },
    {
      name: 'decision model not in the catalogue',
      file: { decision: { models: { 'decision-fast': 'model_99' } } },
      field: 'decision.models.decision-fast',
    },
    {
      name: 'new model missing its fields',
      file: { models: { model_new: { provider: 'simulator' } } },
      field: 'models.model_new.',
    },
    { name: 'unknown top-level section', file: { limitz: {} }, field: 'limitz' },
    {
      name: 'unknown provider type',
      file: { providers: { up: { type: 'grpc' } } },
      field: 'providers.up',
    },
    {
      name: 'header name with a space',
      file: {
        providers: { up: { type: 'openai', base_url: 'http://x/v1', headers: { 'x bad': '1' } } },
      },
      field: 'providers.up.headers',
    },
    {
      name: 'header value with a line break',
      file: {
        providers: {
          up: { type: 'openai', base_url: 'http://x/v1', headers: { 'x-a': 'v\r\nx-b: injected' } },
        },
      },
      field: 'providers.up.headers.x-a',
    },
    {
      name: 'header the gateway sets itself',
      file: {
        providers: {
          up: { type: 'openai', base_url: 'http://x/v1', headers: { 'Content-Length': '5' } },
        },
      },
      field: 'providers.up.headers.Content-Length',
    },
    {
      name: 'credentials in base_url',
      file: { providers: { up: { type: 'openai', base_url: 'http://user:pw@x/v1' } } },
      field: 'providers.up.base_url',
    },
    {
      name: 'unreadable ca_file',
      file: {
        providers: {
          up: { type: 'openai', base_url: 'https://x/v1', ca_file: '/nonexistent/ca.pem' },
        },
      },
      field: 'providers.up.ca_file',
    },
    {
      name: 'ca_file without a certificate',
      file: {
        providers: {
          up: {
            type: 'openai',
            base_url: 'https://x/v1',
            ca_file: configFile('not a certificate'),
          },
        },
      },
      field: 'providers.up.ca_file',
    },
    {
      name: 'a timeout too long for a timer (it would fire at once)',
      file: { providers: { up: { type: 'openai', base_url: 'http://x/v1', timeout_ms: 2 ** 31 } } },
      field: 'providers.up',
    },
    {
      name: 'stream timeout too long for a timer',
      file: { limits: { stream_timeout_ms: 2 ** 31 } },
      field: 'limits.stream_timeout_ms',
    },
    { name: 'PORT not a number', env: { PORT: 'abc' }, field: 'PORT' },
    { name: 'PORT out of range', env: { PORT: '70000' }, field: 'server.port' },
    { name: 'LOG_LEVEL unknown', env: { LOG_LEVEL: 'loud' }, field: 'log_level' },
    {
      name: 'admin_token not a string',
      file: { admin_token: 12345 },
      field: 'admin_token',
    },
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
    expect(configError(() => loadConfig({ env: { GATEWAY_CONFIG: missing } })).message).toContain(
      missing,
    );
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
    expect(configError(() => loadConfig({ env: { GATEWAY_CONFIG: path } })).message).toContain(
      path,
    );
  });
});

describe(
  'a bad config names the field and the bound ' + '(CONTRACT §8), never "Expected union value"',
  () => {
    const cases: Array<{
      name: string;
      file?: unknown;
      env?: Record<string, string>;
      message: string;
    }> = [
      {
        name: 'admin token empty in the config file',
        file: { admin_token: '' },
        message: 'config field admin_token: must not be empty',
      },
      {
        name: 'max_in_flight zero',
        file: { limits: { max_in_flight: 0 } },
        message: 'config field limits.max_in_flight: must be ≥ 1 (got 0)',
      },
      {
        name: 'default rpm fractional',
        file: { limits: { default_rate_limit_rpm: 1.5 } },
        message: 'config field limits.default_rate_limit_rpm: must be an integer (got 1.5)',
      },
      {
        name: 'stream timeout too long for a timer',
        file: { limits: { stream_timeout_ms: 2 ** 31 } },
        message: 'config field limits.stream_timeout_ms: must be ≤ 2147483647 (got 2147483648)',
      },
      {
        name: 'an openai timeout inside the provider union',
        file: {
          providers: { up: { type: 'openai', base_url: 'http://x/v1', timeout_ms: 2 ** 31 } },
        },
        message: 'config field providers.up.timeout_ms: must be ≤ 2147483647 (got 2147483648)',
      },
      {
        name: 'a simulator option below its bound',
        file: { providers: { simulator: { ttft_ms: -1 } } },
        message: 'config field providers.simulator.ttft_ms: must be ≥ 0 (got -1)',
      },
      {
        name: 'a simulator option of the wrong type',
        file: { providers: { sim2: { type: 'simulator', tokens_per_second: 'fast' } } },
        message: 'config field providers.sim2.tokens_per_second: must be an integer (got "fast")',
      },
      {
        name: 'unknown provider type',
        file: { providers: { up: { type: 'grpc' } } },
        message:
          'config field providers.up.type: must be one of "simulator", "openai", ' +
          '"anthropic" or "gemini" (got "grpc")',
      },
      {
        name: 'provider without a type',
        file: { providers: { up: { ttft_ms: 5 } } },
        message:
          'config field providers.up.type: must be one of "simulator", "openai", ' +
          '"anthropic" or "gemini"',
      },
      {
        name: 'log level unknown',
        env: { LOG_LEVEL: 'loud' },
        message:
          'config field log_level: must be one of "fatal", "error", "warn", "info", "debug", ' +
          '"trace" or "silent" (got "loud")',
      },
      {
        name: 'billing.on_error unknown',
        file: { billing: { on_error: 'refund' } },
        message: 'config field billing.on_error: must be one of "keep" or "release" (got "refund")',
      },
      {
        name: 'public_base_url not http',
        file: { public_base_url: 'ftp://x' },
        message: 'config field public_base_url: must match ^https?:// (got "ftp://x")',
      },
      {
        name: 'port out of range',
        env: { PORT: '70000' },
        message: 'config field server.port: must be ≤ 65535 (got 70000)',
      },
      {
        name: 'a new model missing a field',
        file: { models: { model_new: { provider: 'simulator' } } },
        message: 'config field models.model_new.tools: is required',
      },
      {
        name: 'an unknown section',
        file: { limitz: {} },
        message: 'config field limitz: is not a known field (got {})',
      },
      // Object.prototype's names are not models: an alias to "constructor" names nothing.
      {
        name: 'alias to constructor',
        file: { aliases: { old: 'constructor' } },
        message: 'config field aliases.old: no model named "constructor"',
      },
      {
        name: 'decision model toString',
        file: { decision: { models: { 'decision-fast': 'toString' } } },
        message: 'config field decision.models.decision-fast: no model named "toString"',
      },
      {
        name: 'model on provider hasOwnProperty',
        file: { models: { model_03: { provider: 'hasOwnProperty' } } },
        message: 'config field models.model_03.provider: no provider named "hasOwnProperty"',
      },
    ];

    for (const c of cases) {
      test(c.name, () => {
        const env: Record<string, string> = { ...c.env };
        if (c.file !== undefined) env.GATEWAY_CONFIG = configFile(c.file);
        expect(configError(() => loadConfig({ env })).message).toBe(c.message);
      });
    }

    test('the admin token a message refuses is not repeated in it', () => {
      const message = configError(() =>
        loadConfig({ env: { ADMIN_TOKEN: 'sekrit'.repeat(200) } }),
      ).message;
      expect(message).toBe('config field admin_token: must be at most 1024 characters');
      expect(message).not.toContain('sekrit');
    });
  },
);

describe(
  'every provider option has a default: {"type": ' + '"simulator"} alone is valid (CONTRACT §8)',
  () => {
    const defaults = defaultConfig().providers.simulator as SimulatorProviderConfig;

    test(
      "through overrides, with the catalogue default's values, leaving the caller's object as " +
        'it was',
      () => {
        const overrides = {
          providers: { bare: { type: 'simulator' } },
          models: { model_03: { provider: 'bare' } },
        };
        const config = loadConfig({ env: {}, overrides });
        expect(config.providers.bare).toEqual(defaults);
        expect(config.providers.bare).toEqual({
          type: 'simulator',
          ttft_ms: 40,
          tokens_per_second: 400,
          completion_tokens: 24,
        });
        expect(overrides.providers.bare).toEqual({ type: 'simulator' });
      },
    );

    test('through GATEWAY_CONFIG, with some options given and the rest defaulted', () => {
      const config = loadWith({
        providers: { simulator: { type: 'simulator' }, quick: { type: 'simulator', ttft_ms: 0 } },
      });
      expect(config.providers.simulator).toEqual(defaults);
      expect(config.providers.quick).toEqual({ ...defaults, ttft_ms: 0 });
    });

    test('the HTTP providers too: {"type": "openai" | "anthropic" | "gemini"} alone loads', () => {
      const config = loadWith({
        providers: { o: { type: 'openai' }, a: { type: 'anthropic' }, g: { type: 'gemini' } },
      });
      expect(config.providers.o).toEqual({ type: 'openai', base_url: 'https://api.openai.com/v1' });
      expect(config.providers.a).toEqual({
        type: 'anthropic',
        base_url: 'https://api.anthropic.com/v1',
        version: '2023-06-01',
      });
      expect(config.providers.g).toEqual({
        type: 'gemini',
        base_url: 'https://generativelanguage.googleapis.com/v1beta',
      });
    });

    test('a chat call is served by such a provider', async () => {
      const t = openTestGateway({
        providers: { bare: { type: 'simulator' } },
        models: { model_03: { provider: 'bare' } },
      });
      try {
        expect(t.config.providers.bare).toEqual(defaults);
        const { key } = await t.createKey();
        const response = await t.request('/api/v1/chat/completions', {
          method: 'POST',
          headers: bearer(key),
          body: JSON.stringify(chatBody()),
        });
        expect(response.status).toBe(200);
        const body = (await response.json()) as any;
        expect(body.model).toBe('model_03');
        expect(body.usage.completion_tokens).toBe(defaults.completion_tokens);
      } finally {
        await t.close();
      }
    });
  },
);

describe('config keys are plain data', () => {
  test('a "__proto__" key merges as an own field, not as the prototype', () => {
    const merged = deepMerge(
      { a: 1 },
      JSON.parse('{"__proto__": {"polluted": true}, "b": 2}'),
    ) as Record<string, unknown>;
    expect(Object.getPrototypeOf(merged)).toBe(Object.prototype);
    expect(Object.keys(merged)).toEqual(['a', '__proto__', 'b']);
    expect((merged as any).polluted).toBeUndefined();
    expect(JSON.stringify(merged)).toBe('{"a":1,"__proto__":{"polluted":true},"b":2}');
  });

  test('a provider named "__proto__" is a provider like any other', () => {
    const config = loadWith(
      JSON.parse(
        '{"providers": {"__proto__": {"type": "simulator", "ttft_ms": 0}}, "models": ' +
          '{"model_03": {"provider": "__proto__"}}}',
      ),
    );
    expect(Object.hasOwn(config.providers, '__proto__')).toBe(true);
    expect(Object.getOwnPropertyDescriptor(config.providers, '__proto__')!.value).toEqual({
      ...defaultConfig().providers.simulator!,
      ttft_ms: 0,
    });
    expect(config.models.model_03!.provider).toBe('__proto__');
  });
});

describe('provider keys at serve (checkProviderKeys)', () => {
  const withProvider = (provider: Record<string, unknown>, used = true) =>
    loadWith({
      providers: { up: { type: 'anthropic', ...provider } },
      ...(used ? { models: { model_03: { provider: 'up', upstream_model: 'x' } } } : {}),
    });

  test('an api_key_env naming an unset or empty variable stops the start, naming the field', () => {
    const config = withProvider({ api_key_env: 'UP_KEY' });
    for (const env of [{}, { UP_KEY: '' }])
      expect(configError(() => checkProviderKeys(config, env)).message).toContain(
        'providers.up.api_key_env: the environment variable UP_KEY is not set',
      );
    expect(() => checkProviderKeys(config, { UP_KEY: 'sk-1' })).not.toThrow();
  });

  test('a key in headers stands in for it; a provider no model uses is not checked', () => {
    const headers = { 'X-Api-Key': 'sk-in-config' };
    expect(() =>
      checkProviderKeys(withProvider({ api_key_env: 'UP_KEY', headers }), {}),
    ).not.toThrow();
    expect(() =>
      checkProviderKeys(withProvider({ api_key_env: 'UP_KEY' }, false), {}),
    ).not.toThrow();
    // Another header is no key.
    const other = withProvider({ api_key_env: 'UP_KEY', headers: { 'x-trace': '1' } });
    expect(() => checkProviderKeys(other, {})).toThrow(ConfigError);
  });
});

test('limits.max_body_bytes_in_flight below limits.max_body_bytes is refused, naming both', () => {
  const error = configError(() =>
    loadWith({ limits: { max_body_bytes: 4_194_304, max_body_bytes_in_flight: 1_000_000 } }),
  );
  expect(error.message).toBe(
    'config field limits.max_body_bytes_in_flight: must be ≥ limits.max_body_bytes ' +
      '(4194304; got 1000000)',
  );
});
