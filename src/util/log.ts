// The one pino root logger (JSON to stdout, no transports under Bun); children carry request
// context.
import pino, { type Logger } from 'pino';

export type { Logger };

/** `fd` 1 (stdout) for the server; the CLI logs to 2 so its stdout stays pure JSON. */
export function createLogger(level: string, fd: 1 | 2 = 1): Logger {
  return pino(
    {
      level,
      base: { service: 'tollgate' },
      // Secrets never reach a log line: redact anything that might hold one even if passed by
      // mistake.
      redact: {
        paths: ['authorization', 'headers.authorization', 'key', 'secret', 'admin_token'],
        censor: '[redacted]',
      },
    },
    pino.destination({ fd, sync: true }),
  );
}
