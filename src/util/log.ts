// The one pino root logger (JSON to stdout, no transports under Bun); children carry request context.
import pino, { type Logger } from 'pino';

export type { Logger };

export function createLogger(level: string): Logger {
  return pino({
    level,
    base: { service: 'tollgate' },
    // Secrets never reach a log line: redact anything that might hold one even if passed by mistake.
    redact: { paths: ['authorization', 'headers.authorization', 'key', 'secret', 'admin_token'], censor: '[redacted]' },
  });
}
