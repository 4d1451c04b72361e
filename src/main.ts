// CLI entry: `serve` (default) runs the gateway; `keys …` and `credits …` manage keys and balances; help and version.
import { version } from '../package.json';
import { parseInvocation, runAdmin, USAGE, UsageError, type Invocation } from './admin/cli.ts';
import { DataDirLock, DataDirLockError } from './admin/lock.ts';
import { resolveAdminToken } from './admin/token.ts';
import { ConfigError, loadConfig } from './config/load.ts';
import type { Config } from './config/model.ts';
import { createLogger } from './util/log.ts';
import { WalCorruptionError } from './wal/log.ts';

async function serve(config: Config): Promise<number> {
  const logger = createLogger(config.log_level);
  const lock = new DataDirLock(config.data_dir);
  if (!lock.tryAcquire()) {
    const { pid } = lock.holder();
    logger.fatal({ dataDir: config.data_dir, pid }, 'another tollgate process owns this data dir');
    process.stderr.write(`tollgate: another tollgate process (pid ${pid ?? 'unknown'}) owns the data dir ${config.data_dir}\n`);
    return 1;
  }
  // Loaded here, not at the top: they bring the tokenizer (~0.4 s), which help, version and a refused
  // start do not need.
  const { openGateway } = await import('./gateway.ts');
  const { startServer } = await import('./server.ts');
  const admin = resolveAdminToken(config, true)!;
  if (admin.generated) logger.info({ path: admin.path }, 'admin token generated; read it from this file');
  else if (admin.path) logger.info({ path: admin.path }, 'admin token read from file');

  const gateway = openGateway(config, logger, admin.token);
  gateway.onFatal = (error) => {
    logger.fatal({ err: error.stack }, 'broken invariant; stopping');
    process.exit(70);
  };
  const running = await startServer(gateway);
  lock.recordUrl(running.url);
  logger.info(
    { url: running.url, models: Object.keys(config.models).length, fsync: config.wal.fsync, dataDir: config.data_dir },
    'tollgate listening',
  );
  const stop = (signal: string) => {
    logger.info({ signal, inFlight: gateway.registry.size }, 'stopping: draining in-flight requests');
    void running.shutdown().then(() => {
      lock.release();
      logger.info('stopped');
      process.exit(0);
    });
  };
  process.once('SIGTERM', () => stop('SIGTERM'));
  process.once('SIGINT', () => stop('SIGINT'));
  return -1;
}

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
  let config: Config;
  try {
    config = loadConfig();
  } catch (error) {
    if (error instanceof ConfigError) {
      process.stderr.write(`tollgate: ${error.message}\n`);
      return 78;
    }
    throw error;
  }
  try {
    if (invocation.kind === 'serve') return await serve(config);
    return await runAdmin(invocation.call, config, createLogger(process.env.LOG_LEVEL ?? 'warn', 2));
  } catch (error) {
    if (error instanceof WalCorruptionError) {
      process.stderr.write(`tollgate: ${error.message}\n`);
      return 74;
    }
    if (error instanceof DataDirLockError) {
      process.stderr.write(`tollgate: ${error.message}\n`);
      return 71; // EX_OSERR
    }
    throw error;
  }
}

const code = await main(process.argv.slice(2));
if (code >= 0) process.exit(code);
