// The data dir's single-owner lock is the kernel's (flock): it dies with its holder, however the
// holder dies, a second live owner is refused naming the holder's pid, and the file's content never
// decides ownership.
import { afterAll, describe, expect, test } from 'bun:test';
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { DataDirLock } from '../../src/admin/lock.ts';
import { ADMIN, BUN, cleanUp, cli, dataDir, env, Lines, logLine, MAIN, serve } from './process.ts';

afterAll(cleanUp);

const adminHeaders = { authorization: `Bearer ${ADMIN}`, 'content-type': 'application/json' };

describe(
  'DataDirLock in one process (each instance ' + 'is its own open file, as in two processes)',
  () => {
    test(
      'one owner at a time; the holder writes its pid and URL; release lets the next one in and ' +
        'leaves no file',
      () => {
        const dir = dataDir();
        const first = new DataDirLock(dir);
        const second = new DataDirLock(dir);
        expect(first.tryAcquire()).toBe(true);
        expect(second.tryAcquire()).toBe(false);
        expect(second.holder()).toEqual({ pid: process.pid, url: null });
        first.recordUrl('http://127.0.0.1:4321');
        expect(second.holder()).toEqual({ pid: process.pid, url: 'http://127.0.0.1:4321' });
        expect(readFileSync(join(dir, 'lock'), 'utf8')).toBe(
          `${process.pid}\nhttp://127.0.0.1:4321\n`,
        );
        expect(second.tryAcquire()).toBe(false);

        first.release();
        expect(existsSync(join(dir, 'lock'))).toBe(false);
        expect(second.tryAcquire()).toBe(true);
        expect(first.tryAcquire()).toBe(false);
        second.release();
      },
    );

    test(
      'a lock file naming a live process that holds ' +
        'no lock (a reused pid, a zombie) does not block',
      () => {
        const dir = dataDir();
        // pid 1 is always alive, and this test's own pid is too: neither holds the kernel lock.
        for (const pid of [1, process.pid]) {
          writeFileSync(join(dir, 'lock'), `${pid}\nhttp://127.0.0.1:1\n`);
          const lock = new DataDirLock(dir);
          expect(lock.tryAcquire()).toBe(true);
          // Taken over: the old content is gone, not mixed with ours.
          expect(readFileSync(join(dir, 'lock'), 'utf8')).toBe(`${process.pid}\n`);
          lock.release();
        }
      },
    );

    test('release never removes a file it does not hold (the path was replaced under it)', () => {
      const dir = dataDir();
      const stale = new DataDirLock(dir);
      expect(stale.tryAcquire()).toBe(true);
      // Someone removes the lock file by hand; a new process then takes the new file.
      rmSync(join(dir, 'lock'));
      const current = new DataDirLock(dir);
      expect(current.tryAcquire()).toBe(true);
      stale.release();
      expect(existsSync(join(dir, 'lock'))).toBe(true);
      expect(new DataDirLock(dir).tryAcquire()).toBe(false);
      current.release();
    });
  },
);

test('processes racing to take and release the lock ' +
  'never own the dir together (unlink + reopen races)', async () => {
  // A release unlinks the file while holding it; a contender that opened the old file just before
  // can lock that unlinked inode while another locks the new file. tryAcquire must notice and start
  // over.
  const dir = dataDir();
  const rounds = 3000;
  const contenders = Array.from({ length: 4 }, () =>
    Bun.spawn([BUN, join(import.meta.dir, 'lock-contender.ts'), dir, String(rounds)], {
      stdin: 'pipe',
      stdout: 'pipe',
      stderr: 'pipe',
    }),
  );
  const outputs = contenders.map((proc) => new Lines(proc.stdout));
  await Promise.all(outputs.map((lines) => lines.waitFor((line) => line === 'ready')));
  for (const proc of contenders) {
    proc.stdin.write('go\n');
    await proc.stdin.end();
  }
  const codes = await Promise.all(contenders.map((proc) => proc.exited));
  await Promise.all(outputs.map((lines) => lines.ended));
  const results = outputs.map(
    (lines) => JSON.parse(lines.all.at(-1)!) as { acquired: number; overlaps: number },
  );
  expect(codes).toEqual([0, 0, 0, 0]);
  expect(results.map((r) => r.overlaps)).toEqual([0, 0, 0, 0]);
  const acquired = results.reduce((sum, r) => sum + r.acquired, 0);
  // They did contend: the lock changed hands, and some attempts were refused.
  expect(results.filter((r) => r.acquired > 0).length).toBeGreaterThan(1);
  expect(acquired).toBeLessThan(rounds * contenders.length);
}, 30_000);

describe('the gateway process', () => {
  test('a restart straight after SIGKILL starts and serves, even while the killed gateway is an ' +
    'unreaped zombie', async () => {
    const dir = dataDir();
    const childEnv = env({ DATA_DIR: dir, ADMIN_TOKEN: ADMIN });
    // The gateway runs under a parent that never reaps it (sh exec'ing sleep), as a slow supervisor
    // would: once killed it stays a zombie, whose pid kill(pid, 0) still finds.
    const zombieMaker = [
      'sh',
      '-c',
      '"$0" "$@" & echo "pid $!" >&2; exec sleep 3600 >/dev/null 2>&1',
      BUN,
      MAIN,
      'serve',
    ];
    const first = await serve(childEnv, zombieMaker);
    const pid = Number((await first.stderr.waitFor((line) => line.startsWith('pid '))).slice(4));
    const created = await fetch(`${first.url}/admin/v1/keys`, {
      method: 'POST',
      headers: adminHeaders,
      body: JSON.stringify({ name: 'before-kill', credits: 5 }),
    });
    expect(created.status).toBe(201);
    const key = (await created.json()) as { id: string };
    expect(readFileSync(join(dir, 'lock'), 'utf8')).toBe(`${pid}\n${first.url}\n`);

    try {
      process.kill(pid, 'SIGKILL');
      // Its output ends when the kernel has closed its files (the lock's among them); the parent
      // never reaps it.
      await first.stdout.ended;
      expect(() => process.kill(pid, 0)).not.toThrow();
      expect(readFileSync(join(dir, 'lock'), 'utf8')).toBe(`${pid}\n${first.url}\n`);

      // At once, no retry: the CLI writes the log directly (nobody owns it), then a gateway starts
      // on it.
      const listed = await cli(['keys', 'show', key.id], childEnv);
      expect({ code: listed.code, stderr: listed.stderr }).toEqual({ code: 0, stderr: '' });
      expect(JSON.parse(listed.stdout)).toMatchObject({ id: key.id, balances: { credits: 5 } });

      const second = await serve(childEnv);
      try {
        const shown = await fetch(`${second.url}/admin/v1/keys/${key.id}`, {
          headers: adminHeaders,
        });
        expect(shown.status).toBe(200);
        expect(((await shown.json()) as any).name).toBe('before-kill');
        expect(readFileSync(join(dir, 'lock'), 'utf8')).toBe(`${second.proc.pid}\n${second.url}\n`);
      } finally {
        expect(await second.stop()).toBe(0);
      }
    } finally {
      // The never-reaping parent; its zombie child goes to init.
      first.proc.kill('SIGKILL');
      await first.proc.exited;
    }
  }, 30_000);

  test("a second live gateway on the same dir is refused naming the holder's pid; the holder " +
    'keeps serving', async () => {
    const dir = dataDir();
    const childEnv = env({ DATA_DIR: dir, ADMIN_TOKEN: ADMIN });
    const holder = await serve(childEnv);
    try {
      const second = await cli(['serve'], { ...childEnv, PORT: '0', LOG_LEVEL: 'info' });
      expect(second.code).toBe(1);
      expect(second.stderr).toBe(
        `tollgate: another tollgate process (pid ${holder.proc.pid}) owns the data dir ${dir}\n`,
      );
      const logged = JSON.parse(
        second.stdout.split('\n').find(logLine('another tollgate process owns this data dir'))!,
      );
      expect(logged).toMatchObject({ level: 60, pid: holder.proc.pid, dataDir: dir });
      // It never opened the log or listened.
      expect(second.stdout).not.toContain('tollgate listening');

      // The refusal changed nothing: the holder still owns the dir and serves, and the CLI goes
      // through it.
      expect(readFileSync(join(dir, 'lock'), 'utf8')).toBe(`${holder.proc.pid}\n${holder.url}\n`);
      const created = await cli(
        ['keys', 'create', '--name', 'via-api', '--credits', '1'],
        childEnv,
      );
      expect(created.code).toBe(0);
      const shown = await fetch(`${holder.url}/admin/v1/keys/${JSON.parse(created.stdout).id}`, {
        headers: adminHeaders,
      });
      expect(shown.status).toBe(200);
    } finally {
      expect(await holder.stop()).toBe(0);
    }
    expect(existsSync(join(dir, 'lock'))).toBe(false);
  }, 30_000);

  test('the CLI never writes the log while a gateway ' +
    'holds it, even when it cannot reach that gateway', async () => {
    const dir = dataDir();
    const childEnv = env({ DATA_DIR: dir, ADMIN_TOKEN: ADMIN });
    const holder = await serve(childEnv);
    try {
      // No admin token for the CLI: it cannot use the API, and must not fall back to the log.
      const noToken = await cli(['keys', 'create', '--name', 'nope'], env({ DATA_DIR: dir }));
      expect(noToken.code).toBe(1);
      expect(noToken.stderr).toContain(`pid ${holder.proc.pid}`);
      const keys = await fetch(`${holder.url}/admin/v1/keys`, { headers: adminHeaders });
      expect(((await keys.json()) as any).data).toEqual([]);
    } finally {
      expect(await holder.stop()).toBe(0);
    }
  }, 30_000);
});
