// Test support: `bun src/main.ts …` as a child process (CLI runs, a serving gateway, its output
// line by line).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { Subprocess } from 'bun';

export const REPO = resolve(import.meta.dir, '../..');
export const MAIN = join(REPO, 'src/main.ts');
export const BUN = process.execPath;
export const ADMIN = 'cli-test-admin-token-0123456789';

const dirs: string[] = [];
const servers = new Set<Subprocess>();

/** A temp data dir, removed by cleanUp(). */
export function dataDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-cli-'));
  dirs.push(dir);
  return dir;
}

/** For afterAll: kills what a failed test left running, removes the temp dirs. */
export async function cleanUp(): Promise<void> {
  for (const proc of servers) {
    proc.kill('SIGKILL');
    await proc.exited;
  }
  servers.clear();
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
}

/** A clean environment: nothing of the caller's GATEWAY_CONFIG, PORT or ADMIN_TOKEN leaks in. */
export function env(extra: Record<string, string>): Record<string, string> {
  return {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? tmpdir(),
    HOST: '127.0.0.1',
    ...extra,
  };
}

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `bun src/main.ts …args` (or another command line) to its end. */
export async function cli(
  args: string[],
  childEnv: Record<string, string>,
  command: string[] = [BUN, MAIN],
): Promise<CliResult> {
  const proc = Bun.spawn([...command, ...args], {
    cwd: REPO,
    env: childEnv,
    stdout: 'pipe',
    stderr: 'pipe',
  });
  const [stdout, stderr, code] = await Promise.all([
    new Response(proc.stdout).text(),
    new Response(proc.stderr).text(),
    proc.exited,
  ]);
  return { code, stdout, stderr };
}

/** Collects a stream's lines and lets a test wait for the first line that matches. */
export class Lines {
  readonly all: string[] = [];
  private waiters: Array<{
    match: (line: string) => boolean;
    resolve: (line: string) => void;
    reject: (error: Error) => void;
  }> = [];
  readonly ended: Promise<void>;

  constructor(stream: ReadableStream<Uint8Array>) {
    this.ended = this.pump(stream);
  }

  private async pump(stream: ReadableStream<Uint8Array>): Promise<void> {
    const decoder = new TextDecoder();
    let buffered = '';
    for await (const chunk of stream) {
      buffered += decoder.decode(chunk, { stream: true });
      let newline: number;
      while ((newline = buffered.indexOf('\n')) >= 0) {
        this.push(buffered.slice(0, newline));
        buffered = buffered.slice(newline + 1);
      }
    }
    if (buffered) this.push(buffered);
    for (const waiter of this.waiters)
      waiter.reject(new Error(`stream ended without the line; saw:\n${this.all.join('\n')}`));
    this.waiters = [];
  }

  private push(line: string): void {
    this.all.push(line);
    this.waiters = this.waiters.filter((waiter) => {
      if (!waiter.match(line)) return true;
      waiter.resolve(line);
      return false;
    });
  }

  waitFor(match: (line: string) => boolean): Promise<string> {
    const found = this.all.find(match);
    if (found !== undefined) return Promise.resolve(found);
    const { promise, resolve, reject } = Promise.withResolvers<string>();
    this.waiters.push({ match, resolve, reject });
    return promise;
  }
}

export function logLine(message: string) {
  return (line: string) => {
    try {
      return JSON.parse(line).msg === message;
    } catch {
      return false;
    }
  };
}

export interface Server {
  proc: Subprocess<'ignore', 'pipe', 'pipe'>;
  stdout: Lines;
  stderr: Lines;
  url: string;
  port: number;
  /** SIGTERM, then the exit code once the process is gone and its output read. */
  stop(): Promise<number>;
}

/**
 * `bun src/main.ts serve` on PORT=0 (or `command`, which must exec that with its arguments); the
 * port comes from the "tollgate listening" log line.
 */
export async function serve(
  childEnv: Record<string, string>,
  command: string[] = [BUN, MAIN, 'serve'],
): Promise<Server> {
  const proc = Bun.spawn(command, {
    cwd: REPO,
    env: { ...childEnv, PORT: '0', LOG_LEVEL: 'info' },
    stdin: 'ignore',
    stdout: 'pipe',
    stderr: 'pipe',
  });
  servers.add(proc);
  const stdout = new Lines(proc.stdout);
  const stderr = new Lines(proc.stderr);
  const listening = JSON.parse(await stdout.waitFor(logLine('tollgate listening')));
  const url = listening.url as string;
  return {
    proc,
    stdout,
    stderr,
    url,
    port: Number(new URL(url).port),
    async stop() {
      proc.kill('SIGTERM');
      const code = await proc.exited;
      await Promise.all([stdout.ended, stderr.ended]);
      servers.delete(proc);
      return code;
    },
  };
}
