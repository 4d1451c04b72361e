// CLI subcommands for keys and credits: through the running gateway's admin API, or on the log directly.
import { parseArgs } from 'node:util';
import type { Config } from '../config/model.ts';
import { GatewayError } from '../http/errors.ts';
import { createKey, creditKey, creditsToMicro, findKey, keyView, revokeKey } from '../keys/store.ts';
import { finishInterrupted } from '../requests/recovery.ts';
import { StateStore } from '../state/store.ts';
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

/** Runs one admin call against a store opened here (the gateway is not running on this data dir). */
async function runDirect(config: Config, call: AdminCall, logger: Logger): Promise<{ status: number; body: unknown }> {
  const store = StateStore.open({
    dataDir: config.data_dir,
    fsync: 'always',
    fsyncIntervalMs: config.wal.fsync_interval_ms,
    segmentBytes: config.wal.segment_bytes,
    snapshotEveryRecords: config.wal.snapshot_every_records,
    limits: {
      requestRecordsMax: config.limits.request_records_max,
      requestRecordTtlMs: config.idempotency_ttl_s * 1000,
      idempotencyKeysMax: config.limits.idempotency_keys_max,
    },
    logger,
  });
  const rpm = config.limits.default_rate_limit_rpm;
  try {
    await finishInterrupted(store, logger);
    const body = call.body ?? {};
    if (call.method === 'POST' && call.path === '/keys') {
      const { account, secret } = await createKey(
        store,
        {
          name: String(body.name),
          services: (body.services as Array<'chat' | 'decision'>) ?? ['chat', 'decision'],
          creditsMicro: creditsToMicro(Number(body.credits ?? 0), 'credits'),
          tokenWallet: Number(body.token_wallet ?? 0),
          dailyDecisionBudgetMicro: body.daily_decision_budget === undefined ? null : creditsToMicro(Number(body.daily_decision_budget), 'daily_decision_budget'),
          rateLimitRpm: body.rate_limit_rpm === undefined ? null : Number(body.rate_limit_rpm),
          secret: body.key === undefined ? undefined : String(body.key),
        },
        config.limits.max_keys,
      );
      return { status: 201, body: { ...keyView(account, rpm), key: secret } };
    }
    if (call.path === '/keys') return { status: 200, body: { object: 'list', data: [...store.state.keys.values()].map((a) => keyView(a, rpm)) } };
    const [, , id, verb] = call.path.split('/');
    if (!verb) return { status: 200, body: keyView(findKey(store, id!), rpm) };
    if (verb === 'revoke') return { status: 200, body: keyView(await revokeKey(store, id!), rpm) };
    const account = await creditKey(store, id!, creditsToMicro(Number(body.credits ?? 0), 'credits'), Number(body.tokens ?? 0));
    return { status: 200, body: keyView(account, rpm) };
  } catch (error) {
    if (error instanceof GatewayError) return { status: error.status, body: { error: { message: error.message, code: error.code } } };
    throw error;
  } finally {
    await store.close();
  }
}

async function runHttp(config: Config, call: AdminCall, adminToken: string): Promise<{ status: number; body: unknown }> {
  const host = config.server.host === '0.0.0.0' ? '127.0.0.1' : config.server.host;
  const response = await fetch(`http://${host.includes(':') ? `[${host}]` : host}:${config.server.port}/admin/v1${call.path}`, {
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
    result = await runHttp(config, call, admin.token);
  }
  process.stdout.write(`${JSON.stringify(result.body, null, 2)}\n`);
  if (result.status === 201 && typeof result.body === 'object' && result.body && 'key' in result.body) {
    process.stderr.write('The key is shown once; store it now.\n');
  }
  return result.status < 300 ? 0 : 1;
}
