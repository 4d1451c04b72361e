// Test support: a real gateway on a temp data dir, driven through app.handle or a listening server.
import { afterEach } from 'bun:test';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type App, createApp } from '../../src/app.ts';
import { defaultSettings } from '../../src/config/defaults.ts';
import { deepMerge, validateConfig } from '../../src/config/load.ts';
import type { Config } from '../../src/config/model.ts';
import { type Gateway, openGateway } from '../../src/gateway.ts';
import { type RunningServer, startServer } from '../../src/server.ts';
import { createLogger } from '../../src/util/log.ts';

export const ADMIN_TOKEN = 'test-admin-token-0123456789';

/** A fast simulator so tests never wait on made-up latency. */
export const FAST_SIMULATOR = {
  type: 'simulator',
  ttft_ms: 0,
  tokens_per_second: 100_000,
  completion_tokens: 12,
};

export function tempDir(prefix = 'tollgate-test-'): string {
  return mkdtempSync(join(tmpdir(), prefix));
}

export function testConfig(overrides: unknown = {}, dataDir = tempDir()): Config {
  const base = deepMerge(
    defaultSettings() as any,
    {
      data_dir: dataDir,
      admin_token: ADMIN_TOKEN,
      log_level: 'silent',
      providers: { simulator: FAST_SIMULATOR },
      wal: { fsync: 'off' },
    } as any,
  );
  return validateConfig(deepMerge(base, overrides as any));
}

export interface TestGateway {
  gateway: Gateway;
  app: App;
  config: Config;
  /** app.handle with a path and init. */
  request(path: string, init?: RequestInit): Promise<Response>;
  createKey(body?: Record<string, unknown>): Promise<{ id: string; key: string }>;
  close(): Promise<void>;
}

export function openTestGateway(overrides: unknown = {}, dataDir?: string): TestGateway {
  const config = testConfig(overrides, dataDir);
  const logger = createLogger('silent');
  const gateway = openGateway(config, logger, ADMIN_TOKEN);
  const app = createApp(gateway);
  const request = (path: string, init?: RequestInit) =>
    app.handle(new Request(`http://gateway.test${path}`, init));
  return {
    gateway,
    app,
    config,
    request,
    async createKey(body = {}) {
      const response = await request('/admin/v1/keys', {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
        body: JSON.stringify({ name: 'test', credits: 1000, ...body }),
      });
      if (response.status !== 201)
        throw new Error(`key creation failed: ${response.status} ${await response.text()}`);
      return (await response.json()) as { id: string; key: string };
    },
    async close() {
      await gateway.store.close();
      if (!dataDir) rmSync(config.data_dir, { recursive: true, force: true });
    },
  };
}

export interface TestServer extends TestGateway {
  server: RunningServer;
  baseUrl: string;
}

/** A real listening gateway on port 0 (streaming, aborts, the SDK). */
export async function startTestServer(
  overrides: unknown = {},
  dataDir?: string,
): Promise<TestServer> {
  const opened = openTestGateway(overrides, dataDir);
  const server = await startServer(opened.gateway, { hostname: '127.0.0.1', port: 0 });
  return {
    ...opened,
    server,
    baseUrl: server.url,
    async close() {
      await server.shutdown(0);
      if (!dataDir) rmSync(opened.config.data_dir, { recursive: true, force: true });
    },
  };
}

/**
 * Per-file cleanup: gateways and servers made through it, and anything passed to `track` (fake
 * upstreams), are stopped after each test — upstreams first, so no request is left waiting on one.
 */
export function closedAfterEach() {
  const gateways: TestGateway[] = [];
  const stoppables: { stop(): void }[] = [];
  afterEach(async () => {
    for (const stoppable of stoppables.splice(0)) stoppable.stop();
    await Promise.all(gateways.splice(0).map((gateway) => gateway.close()));
  });
  return {
    gateway(overrides: unknown = {}): TestGateway {
      const opened = openTestGateway(overrides);
      gateways.push(opened);
      return opened;
    },
    /** A gateway on an existing data dir (a restart); the dir is left to whoever made it. */
    gatewayOn(dataDir: string, overrides: unknown = {}): TestGateway {
      const opened = openTestGateway(overrides, dataDir);
      gateways.push(opened);
      return opened;
    },
    async server(overrides: unknown = {}): Promise<TestServer> {
      const started = await startTestServer(overrides);
      gateways.push(started);
      return started;
    },
    track<T extends { stop(): void }>(stoppable: T): T {
      stoppables.push(stoppable);
      return stoppable;
    },
  };
}

export function chatBody(extra: Record<string, unknown> = {}): Record<string, unknown> {
  return { model: 'model_03', messages: [{ role: 'user', content: 'Say hello.' }], ...extra };
}

export function bearer(key: string, extra: Record<string, string> = {}): Record<string, string> {
  return { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...extra };
}
