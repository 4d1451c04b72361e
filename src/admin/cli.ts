// CLI subcommands for keys and credits: through the running gateway's admin API, or on the log directly.
import { parseArgs } from 'node:util';
import type { Config } from '../config/model.ts';
import { createApp } from '../app.ts';
import { openGateway } from '../gateway.ts';
import { finishInterrupted } from '../requests/recovery.ts';
import type { Logger } from '../util/log.ts';
import { resolveAdminToken } from './token.ts';
import { DataDirLock } from './lock.ts';

const USAGE = `usage:
  tollgate serve
  tollgate keys create --name NAME [--credits N] [--services chat,decision] [--tokens N]
                       [--daily-budget CREDITS] [--rpm N] [--key EXISTING_SECRET]
  tollgate keys list
  tollgate keys show KEY_ID
  tollgate keys revoke KEY_ID
  tollgate credits add KEY_ID [--credits N] [--tokens N]`;

interface AdminCall {
  method: 'GET' | 'POST';
  path: string;
  body?: Record<string, unknown>;
}

function number(value: string | undefined, flag: string): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0) throw new Error(`--${flag}: expected a non-negative number, got ${JSON.stringify(value)}`);
  return n;
}

/** Turns argv into one admin API call, so both paths (HTTP and direct) share the same meaning. */
export function parseCommand(argv: string[]): AdminCall {
  const { values, positionals } = parseArgs({
    args: argv,
    allowPositionals: true,
    options: {
      name: { type: 'string' },
      credits: { type: 'string' },
      services: { type: 'string' },
      tokens: { type: 'string' },
      'daily-budget': { type: 'string' },
      rpm: { type: 'string' },
      key: { type: 'string' },
    },
  });
  const [group, action, id] = positionals;
  if (group === 'keys' && action === 'create') {
    if (!values.name) throw new Error('keys create needs --name');
    const body: Record<string, unknown> = { name: values.name };
    if (values.credits !== undefined) body.credits = number(values.credits, 'credits');
    if (values.services !== undefined) body.services = values.services.split(',').map((s) => s.trim());
    if (values.tokens !== undefined) body.token_wallet = number(values.tokens, 'tokens');
    if (values['daily-budget'] !== undefined) body.daily_decision_budget = number(values['daily-budget'], 'daily-budget');
    if (values.rpm !== undefined) body.rate_limit_rpm = number(values.rpm, 'rpm');
    if (values.key !== undefined) body.key = values.key;
    return { method: 'POST', path: '/keys', body };
  }
  if (group === 'keys' && action === 'list') return { method: 'GET', path: '/keys' };
  if (group === 'keys' && action === 'show' && id) return { method: 'GET', path: `/keys/${id}` };
  if (group === 'keys' && action === 'revoke' && id) return { method: 'POST', path: `/keys/${id}/revoke`, body: {} };
  if (group === 'credits' && action === 'add' && id) {
    const body: Record<string, unknown> = {};
    if (values.credits !== undefined) body.credits = number(values.credits, 'credits');
    if (values.tokens !== undefined) body.tokens = number(values.tokens, 'tokens');
    if (positionals[3] !== undefined && body.credits === undefined) body.credits = number(positionals[3], 'credits');
    return { method: 'POST', path: `/keys/${id}/credits`, body };
  }
  throw new Error(USAGE);
}

/**
 * Runs one admin call on this data dir with no gateway running: the same admin controller the HTTP
 * API uses, driven in process, so both paths validate and answer alike.
 */
async function runDirect(config: Config, call: AdminCall, logger: Logger): Promise<{ status: number; body: unknown }> {
  const token = `cli-${crypto.randomUUID()}`;
  const gateway = openGateway(config, logger, token);
  try {
    await finishInterrupted(gateway.store, logger);
    const app = createApp(gateway);
    const response = await app.handle(
      new Request(`http://tollgate.local/admin/v1${call.path}`, {
        method: call.method,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: call.body ? JSON.stringify(call.body) : undefined,
      }),
    );
    return { status: response.status, body: await response.json() };
  } finally {
    await gateway.store.close();
  }
}

async function runHttp(baseUrl: string, call: AdminCall, adminToken: string): Promise<{ status: number; body: unknown }> {
  const response = await fetch(`${baseUrl}/admin/v1${call.path}`, {
    method: call.method,
    headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' },
    body: call.body ? JSON.stringify(call.body) : undefined,
  });
  return { status: response.status, body: await response.json() };
}

/** Entry of every non-serve subcommand; returns the process exit code. */
export async function runCli(argv: string[], config: Config, logger: Logger): Promise<number> {
  let call: AdminCall;
  try {
    call = parseCommand(argv);
  } catch (error) {
    process.stderr.write(`${(error as Error).message}\n`);
    return 2;
  }
  const lock = new DataDirLock(config.data_dir);
  let result: { status: number; body: unknown };
  if (lock.tryAcquire()) {
    try {
      result = await runDirect(config, call, logger);
    } finally {
      lock.release();
    }
  } else {
    const admin = resolveAdminToken(config, false);
    if (!admin) {
      process.stderr.write('the gateway is running but no admin token was found (set ADMIN_TOKEN)\n');
      return 1;
    }
    // The running gateway wrote where it listens into the lock; the configured address is the fallback.
    const host = config.server.host === '0.0.0.0' || config.server.host === '::' ? '127.0.0.1' : config.server.host;
    const baseUrl = lock.holderUrl() ?? `http://${host.includes(':') ? `[${host}]` : host}:${config.server.port}`;
    try {
      result = await runHttp(baseUrl, call, admin.token);
    } catch (error) {
      process.stderr.write(`the gateway owns ${config.data_dir} but does not answer at ${baseUrl}: ${(error as Error).message}\n`);
      return 1;
    }
  }
  process.stdout.write(`${JSON.stringify(result.body, null, 2)}\n`);
  if (result.status === 201 && typeof result.body === 'object' && result.body && 'key' in result.body) {
    process.stderr.write('The key is shown once; store it now.\n');
  }
  return result.status < 300 ? 0 : 1;
}
