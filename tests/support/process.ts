// Test support: the gateway as a real process (`bun src/main.ts serve`), its log lines and its
// exit.
import { resolve } from 'node:path';

const REPO_ROOT = resolve(import.meta.dir, '../..');
const START_TIMEOUT_MS = 20_000;

export interface GatewayProcess {
  url: string;
  proc: ReturnType<typeof Bun.spawn>;
  /** Every JSON log line so far, parsed. */
  lines: Array<Record<string, unknown>>;
  /** Resolves with the exit code. */
  exited: Promise<number>;
  kill(signal?: NodeJS.Signals): Promise<number>;
}

/**
 * Starts the gateway on port 0 with `env` over the defaults and waits for its "tollgate listening"
 * line. `command` may wrap the bun invocation (e.g. ['sh', '-c', 'ulimit -n 64; exec "$0" "$@"']).
 */
export async function startGatewayProcess(
  env: Record<string, string>,
  command: string[] = [],
): Promise<GatewayProcess> {
  const proc = Bun.spawn(
    [...command, process.execPath, resolve(REPO_ROOT, 'src/main.ts'), 'serve'],
    {
      cwd: REPO_ROOT,
      env: { ...process.env, PORT: '0', HOST: '127.0.0.1', LOG_LEVEL: 'info', ...env },
      stdin: 'ignore',
      stdout: 'pipe',
      stderr: 'inherit',
    },
  );
  const lines: Array<Record<string, unknown>> = [];
  const listening = Promise.withResolvers<string>();
  void (async () => {
    const decoder = new TextDecoder();
    let buffered = '';
    for await (const chunk of proc.stdout as ReadableStream<Uint8Array>) {
      buffered += decoder.decode(chunk, { stream: true });
      for (let newline = buffered.indexOf('\n'); newline !== -1; newline = buffered.indexOf('\n')) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        try {
          const entry = JSON.parse(line) as Record<string, unknown>;
          lines.push(entry);
          if (entry.msg === 'tollgate listening') listening.resolve(entry.url as string);
        } catch {
          // not a log line
        }
      }
    }
  })();
  const exited = proc.exited;
  void exited.then((code) =>
    listening.reject(
      new Error(`gateway exited with ${code} before listening: ${JSON.stringify(lines.slice(-5))}`),
    ),
  );
  const timer = setTimeout(
    () => listening.reject(new Error('gateway did not start in time')),
    START_TIMEOUT_MS,
  );
  try {
    const url = await listening.promise;
    return {
      url,
      proc,
      lines,
      exited,
      async kill(signal: NodeJS.Signals = 'SIGKILL') {
        proc.kill(signal);
        return exited;
      },
    };
  } catch (error) {
    proc.kill('SIGKILL');
    await exited;
    throw error;
  } finally {
    clearTimeout(timer);
  }
}
