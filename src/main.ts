// CLI entry: `serve` (default) runs the gateway; `keys …` and `credits …` manage keys and balances.
import { runCli } from './admin/cli.ts';
import { DataDirLock } from './admin/lock.ts';
import { resolveAdminToken } from './admin/token.ts';
import { ConfigError, loadConfig } from './config/load.ts';
import type { Config } from './config/model.ts';
import { openGateway } from './gateway.ts';
import { startServer } from './server.ts';
import { createLogger } from './util/log.ts';
import { WalCorruptionError } from './wal/log.ts';

async function serve(config: Config): Promise<number> {
  const logger = createLogger(config.log_level);
  const lock = new DataDirLock(config.data_dir);
  if (!lock.tryAcquire()) {
    logger.fatal({ dataDir: config.data_dir, pid: lock.holder() }, 'another tollgate process owns this data dir');
    return 1;
  }
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
  const command = argv[0] ?? 'serve';
  try {
    if (command === 'serve') return await serve(config);
    return await runCli(argv, config, createLogger(process.env.LOG_LEVEL ?? 'warn', 2));
  } catch (error) {
    if (error instanceof WalCorruptionError) {
      process.stderr.write(`tollgate: ${error.message}\n`);
      return 74;
    }
    throw error;
  }
}

const code = await main(process.argv.slice(2));
if (code >= 0) process.exit(code);
