// The CLI as a process: keys and credits on the log directly, through a running server's admin API,
// and the generated admin token.
import { afterAll, describe, expect, test } from 'bun:test';
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ADMIN, cleanUp, cli, dataDir, env, logLine, serve } from './process.ts';

afterAll(cleanUp);

/** Runs the CLI and expects success with one JSON document on stdout. */
async function cliJson(args: string[], childEnv: Record<string, string>): Promise<any> {
  const result = await cli(args, childEnv);
  expect({ args, code: result.code, stderr: result.code === 0 ? '' : result.stderr }).toEqual({
    args,
    code: 0,
    stderr: '',
  });
  return JSON.parse(result.stdout);
}

/**
 * The key view the CLI prints (CONTRACT §6 plus `created` and `limits.rate_limit_rpm_in_force`).
 */
/** The admin API takes `token` and refuses `wrong` with a 401. */
async function expectAdminTokenChecked(url: string, token: string, wrong: string): Promise<void> {
  const ok = await fetch(`${url}/admin/v1/keys`, { headers: { authorization: `Bearer ${token}` } });
  expect(ok.status).toBe(200);
  const refused = await fetch(`${url}/admin/v1/keys`, {
    headers: { authorization: `Bearer ${wrong}` },
  });
  expect(refused.status).toBe(401);
}

function view(id: string, name: string, credits: number, revoked = false) {
  return {
    id,
    name,
    services: ['chat', 'decision'],
    revoked,
    created: expect.any(Number),
    limits: { rate_limit_rpm: null, rate_limit_rpm_in_force: 600, daily_decision_budget: null },
    balances: { credits, held: 0, charged: 0, credits_added: credits, token_wallet: 0 },
  };
}

describe('help, version and usage', () => {
  const { version } = JSON.parse(
    readFileSync(join(import.meta.dir, '../../package.json'), 'utf8'),
  ) as { version: string };
  // Neither needs the config: a broken one must not stop them.
  const broken = () =>
    env({
      DATA_DIR: dataDir(),
      GATEWAY_CONFIG: join(dataDir(), 'missing.json'),
      PORT: 'not-a-port',
    });

  for (const args of [['--help'], ['-h'], ['help'], ['keys', '--help'], ['credits', 'add', '-h']]) {
    test(`${args.join(' ')} prints the usage on stdout and exits 0`, async () => {
      const result = await cli(args, broken());
      expect(result).toEqual({ code: 0, stdout: expect.stringContaining('usage:'), stderr: '' });
      for (const command of ['tollgate keys create', 'tollgate credits add', '--version'])
        expect(result.stdout).toContain(command);
    });
  }

  for (const args of [['--version'], ['-v'], ['version']]) {
    test(`${args.join(' ')} prints the version of package.json and exits 0`, async () => {
      expect(await cli(args, broken())).toEqual({ code: 0, stdout: `${version}\n`, stderr: '' });
    });
  }

  for (const args of [
    ['bogus'],
    ['--bogus'],
    ['serve', '--port', '1'],
    ['serve', 'now'],
    ['keys', 'list', 'extra'],
  ]) {
    test(
      `${args.join(' ')} is a usage error: usage ` +
        `on stderr, exit 64, before the config is read`,
      async () => {
        const result = await cli(args, broken());
        expect(result).toEqual({ code: 64, stdout: '', stderr: expect.stringContaining('usage:') });
        expect(result.stderr.split('\n')[0]).toMatch(
          /^tollgate: (unknown command|Unknown option|unexpected argument|serve takes no option)/,
        );
      },
    );
  }

  test('a valid command with a broken config still stops on the config (exit 78)', async () => {
    const result = await cli(['keys', 'list'], broken());
    expect(result.code).toBe(78);
    expect(result.stderr).toContain('GATEWAY_CONFIG');
  });
});

describe('CLI on the log directly (no server running)', () => {
  test('keys create, list, show, credits add, revoke', async () => {
    const dir = dataDir();
    const childEnv = env({ DATA_DIR: dir });

    const created = await cli(['keys', 'create', '--name', 'demo', '--credits', '100'], childEnv);
    expect(created.code).toBe(0);
    const key = JSON.parse(created.stdout);
    expect(key.id).toMatch(/^key_[A-Za-z0-9]+$/);
    expect(key.key).toMatch(/^tg-[A-Za-z0-9]{40,}$/);
    expect(key).toEqual({ ...view(key.id, 'demo', 100), key: key.key });
    expect(created.stderr).toContain('shown once');

    const list = await cliJson(['keys', 'list'], childEnv);
    expect(list).toEqual({ object: 'list', data: [view(key.id, 'demo', 100)] });
    expect(JSON.stringify(list)).not.toContain(key.key);

    expect(await cliJson(['keys', 'show', key.id], childEnv)).toEqual(view(key.id, 'demo', 100));
    expect(await cliJson(['credits', 'add', key.id, '--credits', '5'], childEnv)).toEqual(
      view(key.id, 'demo', 105),
    );
    expect(await cliJson(['keys', 'revoke', key.id], childEnv)).toEqual(
      view(key.id, 'demo', 105, true),
    );
    expect(await cliJson(['keys', 'show', key.id], childEnv)).toEqual(
      view(key.id, 'demo', 105, true),
    );

    // The CLI left no lock behind and the state is durable: a server on the same dir sees it.
    expect(existsSync(join(dir, 'lock'))).toBe(false);
    const server = await serve({ ...childEnv, ADMIN_TOKEN: ADMIN });
    try {
      const response = await fetch(`${server.url}/api/v1/models`, {
        headers: { authorization: `Bearer ${key.key}` },
      });
      expect(response.status).toBe(401);
      expect(((await response.json()) as any).error.reason).toBe('revoked');
      const shown = await fetch(`${server.url}/admin/v1/keys/${key.id}`, {
        headers: { authorization: `Bearer ${ADMIN}` },
      });
      expect(await shown.json()).toEqual(view(key.id, 'demo', 105, true));
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  test(
    'an unknown key id exits 1 with the error; bad usage exits 64 (EX_USAGE) with the usage ' +
      'on stderr',
    async () => {
      const childEnv = env({ DATA_DIR: dataDir() });
      const missing = await cli(['keys', 'show', 'key_nope'], childEnv);
      expect(missing.code).toBe(1);
      expect(JSON.parse(missing.stdout).error.code).toBe('not_found');

      const noName = await cli(['keys', 'create'], childEnv);
      expect(noName).toEqual({
        code: 64,
        stdout: '',
        stderr: expect.stringContaining('keys create needs --name'),
      });
      expect(noName.stderr).toContain('usage:');

      const unknown = await cli(['keys', 'explode'], childEnv);
      expect(unknown).toEqual({
        code: 64,
        stdout: '',
        stderr: expect.stringContaining('unknown command "keys explode"'),
      });
      expect(unknown.stderr).toContain('usage:');

      const badNumber = await cli(['credits', 'add', 'key_x', '--credits', 'lots'], childEnv);
      expect(badNumber).toEqual({
        code: 64,
        stdout: '',
        stderr: expect.stringContaining('--credits: expected a non-negative number'),
      });
    },
  );

  test('stdout stays one JSON document even with LOG_LEVEL=info (logs go to stderr)', async () => {
    const result = await cli(
      ['keys', 'create', '--name', 'quiet', '--credits', '1'],
      env({ DATA_DIR: dataDir(), LOG_LEVEL: 'info' }),
    );
    expect(result.code).toBe(0);
    const key = JSON.parse(result.stdout);
    expect(key).toEqual({ ...view(key.id, 'quiet', 1), key: key.key });
    // The info log of opening the state went somewhere: stderr, never stdout, and it carries no
    // secret.
    expect(result.stderr).toContain('state: replayed');
    expect(result.stderr).not.toContain(key.key);
  });

  test(
    'serve refuses a provider whose api_key_env names an unset variable (exit 78, the field ' +
      'named); the admin CLI, which calls no provider, still runs',
    async () => {
      const dir = dataDir();
      const path = join(dir, 'config.json');
      await Bun.write(
        path,
        JSON.stringify({
          providers: {
            claude: { type: 'anthropic', api_key_env: 'TOLLGATE_TEST_NEVER_SET_KEY' },
          },
          models: { model_03: { provider: 'claude', upstream_model: 'claude-x' } },
        }),
      );
      const childEnv = env({ DATA_DIR: join(dir, 'data'), GATEWAY_CONFIG: path, PORT: '0' });
      const refused = await cli(['serve'], childEnv);
      expect(refused.code).toBe(78);
      expect(refused.stderr).toContain('providers.claude.api_key_env');
      expect(refused.stderr).toContain('TOLLGATE_TEST_NEVER_SET_KEY');
      expect((await cli(['keys', 'list'], childEnv)).code).toBe(0);
    },
  );

  test('a data dir that cannot be made stops serve and the CLI in one line (exit 73)', async () => {
    for (const args of [['serve'], ['keys', 'list']]) {
      const result = await cli(args, env({ DATA_DIR: '/proc/no-such-dir', PORT: '0' }));
      expect(result).toEqual({
        code: 73,
        stdout: '',
        stderr: 'tollgate: cannot create the data dir /proc/no-such-dir (ENOENT)\n',
      });
      // One that exists but cannot be used (here its lock path is a directory; for a non-root
      // user, no write permission does the same).
      const dir = dataDir();
      mkdirSync(join(dir, 'lock'), { recursive: true });
      const unusable = await cli(args, env({ DATA_DIR: dir, PORT: '0' }));
      expect(unusable).toEqual({
        code: 73,
        stdout: '',
        stderr: `tollgate: cannot use the data dir ${dir} (EISDIR)\n`,
      });
    }
  });

  test('a bad config stops the CLI with a message naming the field', async () => {
    const result = await cli(['keys', 'list'], env({ DATA_DIR: dataDir(), PORT: 'abc' }));
    expect(result.code).toBe(78);
    expect(result.stderr).toContain('PORT');
  });
});

describe('CLI against a running server', () => {
  test(
    'goes through the admin API: the created ' + 'key works at once on the running server',
    async () => {
      const dir = dataDir();
      const server = await serve(env({ DATA_DIR: dir, ADMIN_TOKEN: ADMIN }));
      // No PORT: the server listens on a port it chose (PORT=0); the CLI learns it from the lock
      // file.
      const childEnv = env({ DATA_DIR: dir, ADMIN_TOKEN: ADMIN });
      let keyId = '';
      try {
        const key = await cliJson(['keys', 'create', '--name', 'live', '--credits', '1'], childEnv);
        keyId = key.id;
        expect(key).toEqual({ ...view(key.id, 'live', 1), key: key.key });

        // Only the server's own state can know this key: the CLI could not have written the log
        // while the server holds it.
        const models = await fetch(`${server.url}/api/v1/models`, {
          headers: { authorization: `Bearer ${key.key}` },
        });
        expect(models.status).toBe(200);
        expect(((await models.json()) as any).data).toHaveLength(11);

        expect(
          await cliJson(['credits', 'add', key.id, '--credits', '2', '--tokens', '3'], childEnv),
        ).toEqual({
          ...view(key.id, 'live', 3),
          balances: { credits: 3, held: 0, charged: 0, credits_added: 3, token_wallet: 3 },
        });
        expect(await cliJson(['keys', 'list'], childEnv)).toEqual({
          object: 'list',
          data: [
            {
              ...view(key.id, 'live', 3),
              balances: { credits: 3, held: 0, charged: 0, credits_added: 3, token_wallet: 3 },
            },
          ],
        });

        expect(await cliJson(['keys', 'revoke', key.id], childEnv)).toMatchObject({
          id: key.id,
          revoked: true,
        });
        const revoked = await fetch(`${server.url}/api/v1/models`, {
          headers: { authorization: `Bearer ${key.key}` },
        });
        expect(revoked.status).toBe(401);
        expect(((await revoked.json()) as any).error.reason).toBe('revoked');

        // A wrong admin token is refused by the server, and the CLI says so with exit 1.
        const refused = await cli(['keys', 'list'], {
          ...childEnv,
          ADMIN_TOKEN: 'not-the-admin-token-0000',
        });
        expect(refused.code).toBe(1);
        expect(JSON.parse(refused.stdout).error.code).toBe('invalid_api_key');
      } finally {
        expect(await server.stop()).toBe(0);
      }

      // After the server stopped, the CLI works on the log directly and sees what the server wrote.
      expect(existsSync(join(dir, 'lock'))).toBe(false);
      expect(await cliJson(['keys', 'show', keyId], env({ DATA_DIR: dir }))).toEqual({
        ...view(keyId, 'live', 3, true),
        balances: { credits: 3, held: 0, charged: 0, credits_added: 3, token_wallet: 3 },
      });
    },
  );

  test.each(['::1', '::', '[::1]'])(
    'HOST=%s: the log gives a bracketed URL, and the CLI reaches the running server',
    async (host) => {
      const dir = dataDir();
      const server = await serve(env({ DATA_DIR: dir, ADMIN_TOKEN: ADMIN, HOST: host }));
      try {
        expect(server.url).toBe(`http://[${host.replace(/[[\]]/g, '')}]:${server.port}`);
        const listed = await cli(
          ['keys', 'list'],
          env({ DATA_DIR: dir, ADMIN_TOKEN: ADMIN, HOST: host }),
        );
        expect(listed).toMatchObject({ code: 0, stderr: '' });
        expect(JSON.parse(listed.stdout)).toEqual({ object: 'list', data: [] });
      } finally {
        expect(await server.stop()).toBe(0);
      }
    },
  );

  test(
    'a second gateway on the same port (another data dir) does not start (exit 69): it would ' +
      'take part of the first one’s connections',
    async () => {
      const first = await serve(env({ DATA_DIR: dataDir(), ADMIN_TOKEN: ADMIN }));
      try {
        const second = await cli(
          ['serve'],
          env({ DATA_DIR: dataDir(), ADMIN_TOKEN: ADMIN, PORT: String(first.port) }),
        );
        expect(second.code).toBe(69);
        expect(second.stderr).toContain(
          `tollgate: cannot listen on 127.0.0.1 port ${first.port}: the port is in use`,
        );
        // Every connection still reaches the first: its admin token is the only one that works.
        for (let i = 0; i < 8; i++) {
          const response = await fetch(`${first.url}/admin/v1/keys`, {
            headers: { authorization: `Bearer ${ADMIN}` },
          });
          expect(response.status).toBe(200);
          await response.text();
        }
      } finally {
        expect(await first.stop()).toBe(0);
      }
    },
  );
});

describe('generated admin token', () => {
  test(
    'with no ADMIN_TOKEN: DATA_DIR/admin-token, mode ' +
      '0600; the log names the path, never the token',
    async () => {
      const dir = dataDir();
      const path = join(dir, 'admin-token');
      const server = await serve(env({ DATA_DIR: dir }));
      let token = '';
      try {
        expect(statSync(path).mode & 0o777).toBe(0o600);
        token = readFileSync(path, 'utf8').trim();
        expect(token.length).toBeGreaterThanOrEqual(32);

        const generated = JSON.parse(
          await server.stdout.waitFor(logLine('admin token generated; read it from this file')),
        );
        expect(generated.path).toBe(path);

        // The token in the file is the one the server checks.
        await expectAdminTokenChecked(server.url, token, 'tga-guess');

        // The CLI finds the token in the file when ADMIN_TOKEN is not set.
        const key = await cliJson(
          ['keys', 'create', '--name', 'via-file'],
          env({ DATA_DIR: dir, PORT: String(server.port) }),
        );
        const models = await fetch(`${server.url}/api/v1/models`, {
          headers: { authorization: `Bearer ${key.key}` },
        });
        expect(models.status).toBe(200);
      } finally {
        expect(await server.stop()).toBe(0);
      }
      const output = [...server.stdout.all, ...server.stderr.all].join('\n');
      expect(output).toContain(path);
      expect(output).not.toContain(token);

      // A restart reads the same token from the file and says where it came from.
      const again = await serve(env({ DATA_DIR: dir }));
      try {
        const read = JSON.parse(await again.stdout.waitFor(logLine('admin token read from file')));
        expect(read.path).toBe(path);
        expect(readFileSync(path, 'utf8').trim()).toBe(token);
        const ok = await fetch(`${again.url}/admin/v1/keys`, {
          headers: { authorization: `Bearer ${token}` },
        });
        expect(ok.status).toBe(200);
      } finally {
        expect(await again.stop()).toBe(0);
      }
      expect([...again.stdout.all, ...again.stderr.all].join('\n')).not.toContain(token);
    },
  );

  test('an empty or oversized token file stops the start (exit 78), naming the file', async () => {
    for (const content of ['', '  \n', 'x'.repeat(1_025)]) {
      const dir = dataDir();
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, 'admin-token'), content);
      const result = await cli(['serve'], env({ DATA_DIR: dir, PORT: '0' }));
      expect(result.code).toBe(78);
      expect(result.stderr).toContain(
        `tollgate: ${join(dir, 'admin-token')}: the admin token must be 1-1024 characters`,
      );
    }
  });

  test('with ADMIN_TOKEN set, no token file is written', async () => {
    const dir = dataDir();
    const server = await serve(env({ DATA_DIR: dir, ADMIN_TOKEN: ADMIN }));
    try {
      expect(existsSync(join(dir, 'admin-token'))).toBe(false);
      const ok = await fetch(`${server.url}/admin/v1/keys`, {
        headers: { authorization: `Bearer ${ADMIN}` },
      });
      expect(ok.status).toBe(200);
    } finally {
      expect(await server.stop()).toBe(0);
    }
    expect([...server.stdout.all, ...server.stderr.all].join('\n')).not.toContain(ADMIN);
  });

  test('a short ADMIN_TOKEN starts the gateway and works; the log warns without it', async () => {
    const short = 'adm';
    const server = await serve(env({ DATA_DIR: dataDir(), ADMIN_TOKEN: short }));
    try {
      const warning = JSON.parse(
        await server.stdout.waitFor(
          logLine(
            'the admin token is shorter than 16 characters: ' +
              'anyone who guesses it controls every key',
          ),
        ),
      );
      expect(warning.level).toBe(40);
      await expectAdminTokenChecked(server.url, short, 'adn');
    } finally {
      expect(await server.stop()).toBe(0);
    }
    const log = [...server.stdout.all, ...server.stderr.all].join('\n');
    expect(log).not.toMatch(/"adm"|Bearer adm/);
  });
});
