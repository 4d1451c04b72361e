// CLI entry: `serve` (default) runs the gateway; `keys …` and `credits …` manage keys and balances;
// help and version.
import { version } from '../package.json';
import {
  type Invocation,
  type OpenDirectAdmin,
  parseInvocation,
  runAdmin,
  USAGE,
  UsageError,
} from './admin/cli.ts';
import { DataDirError, DataDirLock, DataDirLockError } from './admin/lock.ts';
import { ADMIN_TOKEN_ADVISED_LENGTH, resolveAdminToken } from './admin/token.ts';
import { ConfigError, checkProviderKeys, loadConfig } from './config/load.ts';
import type { Config } from './config/model.ts';
import { execWithHeapOptions, heapOptionsInEffect } from './ops/heap-growth.ts';
import { createLogger, type Logger } from './util/log.ts';
import { WalCorruptionError } from './wal/log.ts';

/** EX_TEMPFAIL: the log could not be written; restart (CONTRACT §8, README "Operating"). */
const EXIT_LOG_FAILED = 75;
/** The server could not listen on its host and port (in use, or not an address here). */
const EXIT_CANNOT_LISTEN = 69;
/** What Bun.serve throws when it cannot listen. */
const LISTEN_FAILURES = new Set(['EADDRINUSE', 'EADDRNOTAVAIL', 'EACCES', 'EINVAL']);
const LISTEN_REASONS: Record<string, string> = {
  EADDRINUSE: 'the port is in use',
  EADDRNOTAVAIL: 'the host is not an address of this machine',
  EACCES: 'no permission (ports below 1024 need CAP_NET_BIND_SERVICE)',
  EINVAL: 'the host does not resolve to an address here',
};
/**
 * Errors of a full or failing disk (not of a wrong path or permission, which a restart does not
 * fix).
 */
const STORAGE_FAILURES = new Set(['ENOSPC', 'EDQUOT', 'EIO', 'EMFILE', 'ENFILE']);

async function serve(config: Config): Promise<number> {
  const logger = createLogger(config.log_level);
  const lock = new DataDirLock(config.data_dir);
  if (!lock.tryAcquire()) {
    const { pid } = lock.holder();
    logger.fatal({ dataDir: config.data_dir, pid }, 'another tollgate process owns this data dir');
    process.stderr.write(
      `tollgate: another tollgate process (pid ` +
        `${pid ?? 'unknown'}) owns the data dir ${config.data_dir}\n`,
    );
    return 1;
  }
  // Loaded here, not at the top: they bring the tokenizer (~0.4 s), which help, version and a
  // refused start do not need.
  const { openGateway } = await import('./gateway.ts');
  const { startServer } = await import('./server.ts');
  const admin = resolveAdminToken(config, true)!;
  if (admin.generated)
    logger.info({ path: admin.path }, 'admin token generated; read it from this file');
  else if (admin.path) logger.info({ path: admin.path }, 'admin token read from file');
  if (admin.token.length < ADMIN_TOKEN_ADVISED_LENGTH)
    logger.warn(
      `the admin token is shorter than ${ADMIN_TOKEN_ADVISED_LENGTH} characters: ` +
        'anyone who guesses it controls every key',
    );

  const gateway = openOrExit(() => openGateway(config, logger, admin.token), logger);
  if (typeof gateway === 'number') return gateway;
  gateway.onFatal = (error) => {
    logger.fatal({ err: error.stack }, 'broken invariant; stopping');
    process.exit(70);
  };
  const running = await startOrExit(gateway, startServer, logger);
  if (typeof running === 'number') return running;
  // For the CLI, which asks the running gateway: an address it can connect to.
  lock.recordUrl(running.localUrl);
  // The event-loop delay in /metrics (tollgate_event_loop_delay_*): the figure §8's 50 ms rule is
  // about.
  gateway.metrics.loopDelay.start();
  gateway.onLogFailure = (error) => exitOnLogFailure(error, gateway, running, lock, logger);
  // Before the line that says it listens: a supervisor may stop it as soon as it reads that line,
  // and a SIGTERM that comes before the handler exists kills the process (143) instead of draining.
  stopOnSignals(gateway, running, lock, logger);
  logger.info(
    {
      url: running.url,
      models: Object.keys(config.models).length,
      fsync: config.wal.fsync,
      dataDir: config.data_dir,
      heap: heapOptionsInEffect(),
    },
    'tollgate listening',
  );
  return -1;
}

type Running = Awaited<ReturnType<typeof import('./server.ts').startServer>>;
type OpenGateway = ReturnType<typeof import('./gateway.ts').openGateway>;

/**
 * The log could not be opened for writing (a full or failing disk): as a failure while running, a
 * temporary one for the supervisor to retry (75). A damaged log (74) and bugs go on to main's
 * handler.
 */
function openOrExit(open: () => OpenGateway, logger: Logger): OpenGateway | number {
  try {
    return open();
  } catch (error) {
    const code = (error as NodeJS.ErrnoException)?.code;
    if (code !== undefined && STORAGE_FAILURES.has(code)) {
      logger.fatal(
        { err: (error as Error).message },
        'cannot open the log for writing; exiting 75 to be restarted',
      );
      return EXIT_LOG_FAILED;
    }
    throw error;
  }
}

/**
 * Recovery's own commit (the interrupted requests) could not be written: the disk is still full or
 * failing. A temporary failure: the supervisor starts us again (EX_TEMPFAIL).
 */
async function startOrExit(
  gateway: OpenGateway,
  startServer: typeof import('./server.ts').startServer,
  logger: Logger,
): Promise<Running | number> {
  try {
    return await startServer(gateway);
  } catch (error) {
    if (gateway.store.unavailableReason) {
      logger.fatal(
        { reason: gateway.store.unavailableReason },
        'cannot write the log at start; exiting 75 to be restarted',
      );
      return EXIT_LOG_FAILED;
    }
    const { code, syscall } = (error ?? {}) as NodeJS.ErrnoException;
    if (code !== undefined && syscall === 'listen' && LISTEN_FAILURES.has(code)) {
      const { host, port } = gateway.config.server;
      const why = LISTEN_REASONS[code] ?? code;
      logger.fatal({ host, port, code }, `cannot listen on ${host} port ${port}: ${why}`);
      process.stderr.write(`tollgate: cannot listen on ${host} port ${port}: ${why}\n`);
      return EXIT_CANNOT_LISTEN;
    }
    throw error;
  }
}

// Crash-only (§8): once the log cannot be written, nothing more can be acknowledged and memory
// may hold what the log does not. For the grace every request and both probes answer 503 (a
// supervisor or a load balancer sees it at once), then the process exits and the next start
// recovers from the log, the holds of unfinished requests released.
function exitOnLogFailure(
  error: Error,
  gateway: OpenGateway,
  running: Running,
  lock: DataDirLock,
  logger: Logger,
): void {
  const config = gateway.config;
  const graceMs = config.limits.shutdown_grace_ms;
  logger.fatal(
    { err: error.message, graceMs },
    'write-ahead log failed; answering 503, then exiting 75 to restart from the log',
  );
  gateway.draining = true;
  // Their ends cannot be recorded: stop their upstream calls now (each answers 503) rather than
  // spend on answers nobody will be charged for.
  for (const actor of gateway.registry.all()) actor.abort('interrupted');
  setTimeout(() => {
    void running.shutdown(0).finally(() => {
      lock.release();
      process.exit(EXIT_LOG_FAILED);
    });
    setTimeout(() => process.exit(EXIT_LOG_FAILED), 1_000).unref();
  }, graceMs);
}

/** SIGTERM/SIGINT: refuse new work, let in-flight requests finish within the grace, exit. */
function stopOnSignals(
  gateway: OpenGateway,
  running: Running,
  lock: DataDirLock,
  logger: Logger,
): void {
  const stop = (signal: string) => {
    logger.info(
      { signal, inFlight: gateway.registry.size },
      'stopping: draining in-flight requests',
    );
    void running.shutdown().then(() => {
      lock.release();
      logger.info('stopped');
      // A stop asked for while the log had failed is still that failure's exit: the next start
      // recovers.
      process.exit(gateway.store.unavailableReason ? EXIT_LOG_FAILED : 0);
    });
  };
  process.once('SIGTERM', () => stop('SIGTERM'));
  process.once('SIGINT', () => stop('SIGINT'));
}

/**
 * The admin API in this process, on the log directly, for a key or credit command when no gateway
 * owns the data dir: recovery first (holds of interrupted requests released), then the app.
 */
const openDirectAdmin: OpenDirectAdmin = async (config, logger, token) => {
  // Loaded only on this path (they bring the tokenizer), so that help, usage and the HTTP path
  // start fast.
  const [{ createApp }, { openGateway }, { finishInterrupted }] = await Promise.all([
    import('./app.ts'),
    import('./gateway.ts'),
    import('./requests/recovery.ts'),
  ]);
  const gateway = openGateway(config, logger, token);
  try {
    await finishInterrupted(gateway.store, logger);
    const app = createApp(gateway);
    return { handle: (request) => app.handle(request), close: () => gateway.store.close() };
  } catch (error) {
    await gateway.store.close();
    throw error;
  }
};

async function main(argv: string[]): Promise<number> {
  // The command line first: help, version and usage errors need no config (a broken one included).
  let invocation: Invocation;
  try {
    invocation = parseInvocation(argv);
  } catch (error) {
    if (!(error instanceof UsageError)) throw error;
    process.stderr.write(`tollgate: ${error.message}\n${USAGE}\n`);
    return 64; // EX_USAGE
  }
  if (invocation.kind === 'help') {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  if (invocation.kind === 'version') {
    process.stdout.write(`${version}\n`);
    return 0;
  }
  // Before anything is opened or loaded: the process image is replaced (ops/heap-growth.ts).
  if (invocation.kind === 'serve') execWithHeapOptions();
  let config: Config;
  try {
    config = loadConfig();
    if (invocation.kind === 'serve') checkProviderKeys(config);
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`tollgate: ${error.message}\n`);
      return 78;
    }
    throw error;
  }
  try {
    if (invocation.kind === 'serve') return await serve(config);
    return await runAdmin(
      invocation.call,
      config,
      createLogger(process.env.LOG_LEVEL ?? 'warn', 2),
      openDirectAdmin,
    );
  } catch (error) {
    for (const [kind, status] of STOPPING_ERRORS) {
      if (!(error instanceof kind)) continue;
      process.stderr.write(`tollgate: ${(error as Error).message}\n`);
      return status;
    }
    throw error;
  }
}

/**
 * Errors that stop a command with one line and an exit status (README "Operating"); anything else
 * is a bug and keeps its stack.
 */
const STOPPING_ERRORS: ReadonlyArray<readonly [abstract new (...args: never[]) => Error, number]> =
  [
    [WalCorruptionError, 74], // EX_IOERR: damaged in a way a crash cannot explain
    [DataDirLockError, 71], // EX_OSERR: no libc flock
    // The admin token file (admin/token.ts): part of the config, read once the data dir is.
    [ConfigError, 78], // EX_CONFIG
    [DataDirError, 73], // EX_CANTCREAT
  ];

const code = await main(process.argv.slice(2));
if (code >= 0) process.exit(code);
