// The command line: usage, help and version, and the key and credit subcommands (through the
// running gateway's admin API, or on the log directly).
import { parseArgs } from 'node:util';
import type { Config } from '../config/model.ts';
import type { Logger } from '../util/log.ts';
import { DataDirLock } from './lock.ts';
import { resolveAdminToken } from './token.ts';

export const USAGE = `usage:
  tollgate [serve]            run the gateway
  tollgate keys create --name NAME [--credits N] [--services chat,decision] [--tokens N]
                       [--daily-budget CREDITS] [--rpm N] [--key EXISTING_SECRET]
  tollgate keys list
  tollgate keys show KEY_ID
  tollgate keys revoke KEY_ID
  tollgate credits add KEY_ID [--credits N] [--tokens N]
  tollgate help | --help | -h
  tollgate version | --version | -v

Key and credit commands go through the running gateway's admin API when one owns DATA_DIR,
and write the log directly otherwise.

environment: PORT, HOST, DATA_DIR, ADMIN_TOKEN, LOG_LEVEL,
  GATEWAY_CONFIG (JSON merged over the defaults)`;

/** Bad usage: the caller prints the message and USAGE and exits 64 (EX_USAGE). */
export class UsageError extends Error {
  override name = 'UsageError';
}

interface AdminCall {
  method: 'GET' | 'POST';
  path: string;
  body?: Record<string, unknown>;
}

export type Invocation =
  | { kind: 'serve' }
  | { kind: 'help' }
  | { kind: 'version' }
  | { kind: 'admin'; call: AdminCall };

const HELP_WORDS = new Set(['help', '--help', '-h']);
const VERSION_WORDS = new Set(['version', '--version', '-v']);

function number(value: string | undefined, flag: string): number | undefined {
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0)
    throw new UsageError(`--${flag}: expected a non-negative number, got ${JSON.stringify(value)}`);
  return n;
}

function parseOptions(argv: string[]) {
  try {
    return parseArgs({
      args: argv,
      allowPositionals: true,
      options: {
        help: { type: 'boolean', short: 'h' },
        name: { type: 'string' },
        credits: { type: 'string' },
        services: { type: 'string' },
        tokens: { type: 'string' },
        'daily-budget': { type: 'string' },
        rpm: { type: 'string' },
        key: { type: 'string' },
      },
    });
  } catch (error) {
    // node:util's own wording ("Unknown option '--x'", "Option '--name <value>' argument missing"),
    // without its advice on passing '--x' as a positional, which no command here takes.
    throw new UsageError(
      (error as Error).message.replace(/\. To specify a positional argument.*$/s, ''),
    );
  }
}

/**
 * Reads the command line without the config, so that help and version work even when the config
 * does not load. Keys and credits become one admin API call, shared by both paths (HTTP and
 * direct).
 */
export function parseInvocation(argv: string[]): Invocation {
  const first = argv[0];
  if (first === undefined) return { kind: 'serve' };
  if (HELP_WORDS.has(first)) return { kind: 'help' };
  if (VERSION_WORDS.has(first)) return { kind: 'version' };
  const { values, positionals } = parseOptions(argv);
  if (values.help) return { kind: 'help' };
  const [group, action, id] = positionals;
  const extra = (count: number) => {
    if (positionals.length > count)
      throw new UsageError(`unexpected argument ${JSON.stringify(positionals[count])}`);
  };
  if (group === 'serve') {
    extra(1);
    const flag = Object.keys(values)[0];
    if (flag !== undefined)
      throw new UsageError(
        `serve takes no option (got --${flag}); configure ` +
          `it with the environment or GATEWAY_CONFIG`,
      );
    return { kind: 'serve' };
  }
  if (group === 'keys' && action === 'create') {
    extra(2);
    if (!values.name) throw new UsageError('keys create needs --name');
    const body: Record<string, unknown> = { name: values.name };
    if (values.credits !== undefined) body.credits = number(values.credits, 'credits');
    if (values.services !== undefined)
      body.services = values.services.split(',').map((s) => s.trim());
    if (values.tokens !== undefined) body.token_wallet = number(values.tokens, 'tokens');
    if (values['daily-budget'] !== undefined)
      body.daily_decision_budget = number(values['daily-budget'], 'daily-budget');
    if (values.rpm !== undefined) body.rate_limit_rpm = number(values.rpm, 'rpm');
    if (values.key !== undefined) body.key = values.key;
    return { kind: 'admin', call: { method: 'POST', path: '/keys', body } };
  }
  if (group === 'keys' && action === 'list') {
    extra(2);
    return { kind: 'admin', call: { method: 'GET', path: '/keys' } };
  }
  if (group === 'keys' && action === 'show' && id) {
    extra(3);
    return { kind: 'admin', call: { method: 'GET', path: `/keys/${id}` } };
  }
  if (group === 'keys' && action === 'revoke' && id) {
    extra(3);
    return { kind: 'admin', call: { method: 'POST', path: `/keys/${id}/revoke`, body: {} } };
  }
  if (group === 'credits' && action === 'add' && id) {
    extra(4);
    const body: Record<string, unknown> = {};
    if (values.credits !== undefined) body.credits = number(values.credits, 'credits');
    if (values.tokens !== undefined) body.tokens = number(values.tokens, 'tokens');
    if (positionals[3] !== undefined && body.credits === undefined)
      body.credits = number(positionals[3], 'credits');
    return { kind: 'admin', call: { method: 'POST', path: `/keys/${id}/credits`, body } };
  }
  throw new UsageError(`unknown command ${JSON.stringify(positionals.join(' ') || first)}`);
}

/**
 * The admin API served in this process on the data dir's log, for when no gateway owns it; it
 * answers requests that bear the token it was opened with. main builds it from the app: the CLI
 * sits beside the app, not above it, so it is handed the builder instead of importing it.
 */
export interface DirectAdmin {
  handle(request: Request): Promise<Response>;
  close(): Promise<void>;
}

export type OpenDirectAdmin = (
  config: Config,
  logger: Logger,
  token: string,
) => Promise<DirectAdmin>;

/**
 * Runs one admin call on this data dir with no gateway running: the same admin controller the HTTP
 * API uses, driven in process, so both paths validate and answer alike.
 */
async function runDirect(
  config: Config,
  call: AdminCall,
  logger: Logger,
  openDirect: OpenDirectAdmin,
): Promise<{ status: number; body: unknown }> {
  const token = `cli-${crypto.randomUUID()}`;
  const admin = await openDirect(config, logger, token);
  try {
    const response = await admin.handle(
      new Request(`http://tollgate.local/admin/v1${call.path}`, {
        method: call.method,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: call.body ? JSON.stringify(call.body) : undefined,
      }),
    );
    return { status: response.status, body: await response.json() };
  } finally {
    await admin.close();
  }
}

async function runHttp(
  baseUrl: string,
  call: AdminCall,
  adminToken: string,
): Promise<{ status: number; body: unknown }> {
  const response = await fetch(`${baseUrl}/admin/v1${call.path}`, {
    method: call.method,
    headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' },
    body: call.body ? JSON.stringify(call.body) : undefined,
  });
  return { status: response.status, body: await response.json() };
}

/** Runs one key or credit command; returns the process exit code. */
export async function runAdmin(
  call: AdminCall,
  config: Config,
  logger: Logger,
  openDirect: OpenDirectAdmin,
): Promise<number> {
  const lock = new DataDirLock(config.data_dir);
  let result: { status: number; body: unknown };
  if (lock.tryAcquire()) {
    // Nobody else can open the log while this process holds the lock.
    try {
      result = await runDirect(config, call, logger, openDirect);
    } finally {
      lock.release();
    }
  } else {
    // A live process owns the log (the kernel says so): never write it, ask the owner's admin API.
    const holder = lock.holder();
    const admin = resolveAdminToken(config, false);
    if (!admin) {
      process.stderr.write(
        `tollgate (pid ${holder.pid ?? 'unknown'}) owns ${config.data_dir}, but no admin token ` +
          `was found (set ADMIN_TOKEN)\n`,
      );
      return 1;
    }
    // The running gateway wrote where it listens into the lock file; the configured address is the
    // fallback.
    const host =
      config.server.host === '0.0.0.0' || config.server.host === '::'
        ? '127.0.0.1'
        : config.server.host;
    const baseUrl =
      holder.url ?? `http://${host.includes(':') ? `[${host}]` : host}:${config.server.port}`;
    try {
      result = await runHttp(baseUrl, call, admin.token);
    } catch (error) {
      process.stderr.write(
        `tollgate (pid ${holder.pid ?? 'unknown'}) owns ${config.data_dir} but does not answer ` +
          `at ${baseUrl}: ${(error as Error).message}\n`,
      );
      return 1;
    }
  }
  process.stdout.write(`${JSON.stringify(result.body, null, 2)}\n`);
  if (
    result.status === 201 &&
    typeof result.body === 'object' &&
    result.body &&
    'key' in result.body
  ) {
    process.stderr.write('The key is shown once; store it now.\n');
  }
  return result.status < 300 ? 0 : 1;
}
