// `serve` runs with JSC's heap growth capped (src/ops/heap-growth.ts): the same process (execve),
// bun's own flags kept, the operator's values kept, and options this Bun knows.
import { afterAll, describe, expect, test } from 'bun:test';
import { readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { HEAP_OPTIONS } from '../../src/ops/heap-growth.ts';
import { ADMIN, BUN, cleanUp, dataDir, env, MAIN, REPO, serve } from '../admin/process.ts';

afterAll(cleanUp);

const OPTION_NAMES = Object.keys(HEAP_OPTIONS);
const GROWTH = 'BUN_JSC_heapGrowthMaxIncrease';

/** The environment and command line the kernel holds for `pid` (NUL-separated). */
function processImage(pid: number): { environ: string[]; cmdline: string[] } {
  const read = (name: string) =>
    readFileSync(`/proc/${pid}/${name}`, 'utf8')
      .split('\0')
      .filter((word) => word !== '');
  return { environ: read('environ'), cmdline: read('cmdline') };
}

function listeningLine(lines: readonly string[]): { heap?: Record<string, string | null> } {
  const line = lines.find((text) => text.includes('tollgate listening'));
  expect(line).toBeDefined();
  return JSON.parse(line!);
}

describe('serve and the heap options', () => {
  test('re-executes itself once, in the same process, with bun’s flags kept', async () => {
    expect(OPTION_NAMES).toContain(GROWTH);
    const server = await serve(env({ DATA_DIR: dataDir(), ADMIN_TOKEN: ADMIN }), [
      BUN,
      '--smol',
      MAIN,
      'serve',
    ]);
    try {
      // The pid Bun.spawn returned is the one serving: execve, not a child.
      const image = processImage(server.proc.pid);
      for (const [name, value] of Object.entries(HEAP_OPTIONS))
        expect(image.environ).toContain(`${name}=${value}`);
      expect(image.cmdline).toEqual([BUN, '--smol', MAIN, 'serve']);
      expect(listeningLine(server.stdout.all).heap).toEqual(HEAP_OPTIONS);
      expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  test('bun’s --cwd with a relative directory is not applied twice', async () => {
    // Bun changed into `src` before our code ran, and execve keeps the cwd: `--cwd src` again
    // would look for src/src and stop the start (exit 1).
    const server = await serve(env({ DATA_DIR: dataDir(), ADMIN_TOKEN: ADMIN }), [
      BUN,
      '--cwd',
      'src',
      MAIN,
      'serve',
    ]);
    try {
      expect(listeningLine(server.stdout.all).heap).toEqual(HEAP_OPTIONS);
      expect(readlinkSync(`/proc/${server.proc.pid}/cwd`)).toBe(join(REPO, 'src'));
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  test('keeps the operator’s own value and adds the others', async () => {
    const server = await serve(env({ DATA_DIR: dataDir(), ADMIN_TOKEN: ADMIN, [GROWTH]: '1' }));
    try {
      const image = processImage(server.proc.pid);
      expect(image.environ).toContain(`${GROWTH}=1`);
      expect(image.environ).not.toContain(`${GROWTH}=${HEAP_OPTIONS[GROWTH]}`);
      expect(listeningLine(server.stdout.all).heap).toEqual({ ...HEAP_OPTIONS, [GROWTH]: '1' });
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  test('the options are ones this Bun knows and applies (an unknown one stops it at start)', () => {
    const run = Bun.spawnSync([BUN, '-e', '0'], {
      env: { PATH: process.env.PATH ?? '', ...HEAP_OPTIONS, BUN_JSC_dumpOptions: '1' },
      stdout: 'pipe',
      stderr: 'pipe',
    });
    const output = run.stdout.toString() + run.stderr.toString();
    expect(run.exitCode).toBe(0);
    // "Modified JSC options:" lists each as `name=value (default: …)`.
    for (const [name, value] of Object.entries(HEAP_OPTIONS))
      expect(output).toContain(`${name.slice('BUN_JSC_'.length)}=${value} `);
  });
});
