// `bun run build` makes one self-contained executable that serves and manages keys like `bun src/main.ts`.
import { expect, test } from 'bun:test';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { countPromptTokens } from '../../src/billing/tokens.ts';
import { tempDir } from '../support/gateway.ts';
import packageJson from '../../package.json';

/** `bun run build`'s own command (package.json "build"), writing to `outfile`: the test builds what users build. */
function buildCommand(outfile: string): string[] {
  const words = packageJson.scripts.build.split(' ');
  expect(words[0]).toBe('bun');
  const at = words.indexOf('--outfile');
  expect(at).toBeGreaterThan(0);
  words[at + 1] = outfile;
  return [process.execPath, ...words.slice(1)];
}

test('the compiled executable serves the API and runs the CLI', async () => {
  const dir = tempDir('tollgate-build-');
  const binary = join(dir, 'tollgate');
  const build = Bun.spawnSync(buildCommand(binary), { stdout: 'pipe', stderr: 'pipe' });
  expect(build.exitCode).toBe(0);

  const env = { ...process.env, DATA_DIR: join(dir, 'data'), ADMIN_TOKEN: 'build-test-admin-token', PORT: '0', LOG_LEVEL: 'info' };
  const created = Bun.spawnSync([binary, 'keys', 'create', '--name', 'demo', '--credits', '10'], { env, stdout: 'pipe', stderr: 'pipe' });
  expect(created.exitCode).toBe(0);
  const { key } = JSON.parse(created.stdout.toString());
  expect(key).toMatch(/^tg-[A-Za-z0-9]{40,}$/);

  const server = Bun.spawn([binary, 'serve'], { env, stdout: 'pipe', stderr: 'inherit' });
  try {
    const reader = server.stdout.getReader();
    let text = '';
    let url: string | null = null;
    while (url === null) {
      const { done, value } = await reader.read();
      if (done) throw new Error(`server exited: ${text}`);
      text += new TextDecoder().decode(value);
      for (const line of text.split('\n')) if (line.includes('tollgate listening')) url = JSON.parse(line).url;
    }
    const reply = await fetch(`${url}/api/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'hi' }] }),
    });
    expect(reply.status).toBe(200);
    expect(((await reply.json()) as any).object).toBe('chat.completion');
    // A prompt large enough to be counted by the count worker, a second entrypoint inside the binary.
    const prompt = 'The quick brown fox jumps over the lazy dog; 日本語 🙂 x=1;\n'.repeat(4_000);
    const large = await fetch(`${url}/api/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'idempotency-key': 'build-test-large-1' },
      body: JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: prompt }] }),
    });
    expect(large.status).toBe(200);
    expect(((await large.json()) as any).usage.prompt_tokens).toBe(countPromptTokens([{ role: 'user', content: prompt }], null));
    server.kill('SIGTERM');
    expect(await server.exited).toBe(0);
  } finally {
    server.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
}, 60_000);
