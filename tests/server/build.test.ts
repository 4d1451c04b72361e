// `bun run build` makes one self-contained executable that serves and manages keys like `bun src/main.ts`.
import { expect, test } from 'bun:test';
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { tempDir } from '../support/gateway.ts';

test('the compiled executable serves the API and runs the CLI', async () => {
  const dir = tempDir('tollgate-build-');
  const binary = join(dir, 'tollgate');
  const build = Bun.spawnSync([process.execPath, 'build', '--compile', 'src/main.ts', '--outfile', binary], { stdout: 'pipe', stderr: 'pipe' });
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
    server.kill('SIGTERM');
    expect(await server.exited).toBe(0);
  } finally {
    server.kill('SIGKILL');
    rmSync(dir, { recursive: true, force: true });
  }
}, 60_000);
