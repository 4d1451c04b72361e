// `bun run build` makes one self-contained executable that serves and manages keys like `bun
// src/main.ts`.
import { expect, test } from 'bun:test';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import packageJson from '../../package.json';
import { countPromptTokens } from '../../src/billing/tokens.ts';
import { HEAP_OPTIONS } from '../../src/ops/heap-growth.ts';
import { tempDir } from '../support/gateway.ts';

/**
 * `bun run build`'s own command (package.json "build"), writing to `outfile`: the test builds what
 * users build.
 */
function buildCommand(outfile: string): string[] {
  const words = packageJson.scripts.build.split(' ');
  expect(words[0]).toBe('bun');
  const at = words.indexOf('--outfile');
  expect(at).toBeGreaterThan(0);
  words[at + 1] = outfile;
  return [process.execPath, ...words.slice(1)];
}

const { version } = packageJson;

/** Starts `binary serve` and resolves with its URL from the "tollgate listening" line. */
async function start(binary: string, env: Record<string, string | undefined>) {
  const server = Bun.spawn([binary, 'serve'], { env, stdout: 'pipe', stderr: 'inherit' });
  const reader = server.stdout.getReader();
  let text = '';
  let url: string | null = null;
  let heap: unknown;
  while (url === null) {
    const { done, value } = await reader.read();
    if (done) throw new Error(`server exited: ${text}`);
    text += new TextDecoder().decode(value);
    for (const line of text.split('\n'))
      if (line.includes('tollgate listening')) ({ url, heap } = JSON.parse(line));
  }
  reader.releaseLock();
  // The binary re-executed itself with the heap options (src/ops/heap-growth.ts): its embedded
  // entry point was not handed to it again as a command.
  expect(heap).toEqual(HEAP_OPTIONS);
  return { server, url: url! };
}

test('the compiled executable serves the API, runs ' +
  'the CLI, and owns its data dir with a kernel lock', async () => {
  const dir = tempDir('tollgate-build-');
  const binary = join(dir, 'tollgate');
  const build = Bun.spawnSync(buildCommand(binary), { stdout: 'pipe', stderr: 'pipe' });
  expect(build.exitCode).toBe(0);

  // Help and version come from the binary alone (the version is embedded), whatever the config.
  const broken = { ...process.env, GATEWAY_CONFIG: join(dir, 'missing.json') };
  const versionRun = Bun.spawnSync([binary, '--version'], {
    env: broken,
    cwd: dir,
    stdout: 'pipe',
    stderr: 'pipe',
  });
  expect({ code: versionRun.exitCode, stdout: versionRun.stdout.toString() }).toEqual({
    code: 0,
    stdout: `${version}\n`,
  });
  const help = Bun.spawnSync([binary, '--help'], {
    env: broken,
    cwd: dir,
    stdout: 'pipe',
    stderr: 'pipe',
  });
  expect(help.exitCode).toBe(0);
  expect(help.stdout.toString()).toContain('usage:');

  const env = {
    ...process.env,
    DATA_DIR: join(dir, 'data'),
    ADMIN_TOKEN: 'build-test-admin-token',
    PORT: '0',
    LOG_LEVEL: 'info',
  };
  const created = Bun.spawnSync([binary, 'keys', 'create', '--name', 'demo', '--credits', '10'], {
    env,
    stdout: 'pipe',
    stderr: 'pipe',
  });
  expect(created.exitCode).toBe(0);
  const { key } = JSON.parse(created.stdout.toString());
  expect(key).toMatch(/^tg-[A-Za-z0-9]{40,}$/);

  let { server, url } = await start(binary, env);
  try {
    const reply = await fetch(`${url}/api/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(reply.status).toBe(200);
    expect(((await reply.json()) as any).object).toBe('chat.completion');
    // A prompt large enough to be counted by the count worker, a second entrypoint inside the
    // binary.
    const prompt = 'The quick brown fox jumps over the lazy dog; 日本語 🙂 x=1;\n'.repeat(4_000);
    const large = await fetch(`${url}/api/v1/chat/completions`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${key}`,
        'content-type': 'application/json',
        'idempotency-key': 'build-test-large-1',
      },
      body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: prompt }] }),
    });
    expect(large.status).toBe(200);
    expect(((await large.json()) as any).usage.prompt_tokens).toBe(
      countPromptTokens([{ role: 'user', content: prompt }], null),
    );

    // The lock (flock through bun:ffi) works inside the binary: a second one is refused, naming the
    // holder.
    const second = Bun.spawnSync([binary, 'serve'], { env, stdout: 'pipe', stderr: 'pipe' });
    expect(second.exitCode).toBe(1);
    expect(second.stderr.toString()).toContain(`(pid ${server.pid})`);

    // SIGKILL, and a restart at once serves on the same data dir.
    server.kill('SIGKILL');
    await server.exited;
    ({ server, url } = await start(binary, env));
    const again = await fetch(`${url}/api/v1/models`, {
      headers: { authorization: `Bearer ${key}` },
    });
    expect(again.status).toBe(200);
    server.kill('SIGTERM');
    expect(await server.exited).toBe(0);
  } finally {
    server.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
}, 60_000);
