// Imports point down the layers and never close a circle: every import of every src/**/*.ts file is
// read (static, re-export, dynamic and `typeof import()`), placed in its layer, and checked.
import { describe, expect, test } from 'bun:test';
import { readFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

const SRC = resolve(import.meta.dir, '../../src');

/**
 * The layers, bottom first; a module may import its own layer or one below.
 * - `http/` sits with the controllers: it reads requests and renders answers for them, and nothing
 *   below may know HTTP (what billing, idempotency and the simulator needed of it, the JSON
 *   bounds, is util/json.ts). chat/sse.ts is there too: it is the chat stream's HTTP side (the
 *   service's ChatSink, written as SSE frames and error events in the one envelope), used only by
 *   the controller and the server.
 * - The domain is split in two so that the shared parts never reach up into a service: billing,
 *   keys, idempotency, providers, the client and ops metrics are below chat and decision.
 * - gateway.ts builds the running parts from the domain and hands them to the controllers.
 */
const LAYERS: ReadonlyArray<{ name: string; test: (path: string) => boolean }> = [
  { name: 'util/config', test: (path) => /^(util|config)\//.test(path) },
  { name: 'wal', test: (path) => path.startsWith('wal/') },
  { name: 'state', test: (path) => path.startsWith('state/') },
  // The Idempotency-Key rules (format, fingerprint, what a bound key answers) read the state and
  // are applied by admission.
  { name: 'idempotency', test: (path) => path.startsWith('idempotency/') },
  { name: 'requests', test: (path) => path.startsWith('requests/') },
  {
    name: 'shared domain',
    test: (path) =>
      /^(billing|keys|providers|client)\//.test(path) ||
      path === 'ops/metrics.ts' ||
      /^admin\/(lock|token|model)\.ts$/.test(path),
  },
  {
    name: 'services',
    test: (path) =>
      (/^(chat|decision)\//.test(path) && !path.endsWith('/index.ts') && path !== 'chat/sse.ts') ||
      path === 'admin/usage.ts' ||
      path === 'admin/live.ts' ||
      path === 'admin/overview.ts',
  },
  { name: 'gateway', test: (path) => path === 'gateway.ts' },
  {
    name: 'controllers/http',
    test: (path) =>
      /^(chat|decision|admin)\/index\.ts$/.test(path) ||
      path === 'ops/health.ts' ||
      path === 'chat/sse.ts' ||
      path.startsWith('http/') ||
      path.startsWith('admin/dashboard/'),
  },
  {
    name: 'app/entrypoints',
    // ops/heap-growth.ts: how the process starts (main's re-exec), nothing any layer below uses.
    test: (path) =>
      /^(app|server|main|count-worker)\.ts$/.test(path) ||
      path === 'admin/cli.ts' ||
      path === 'ops/heap-growth.ts',
  },
];

/**
 * Imports that still point up, each to be removed by the work it names. Matched on the importing
 * file and the imported file (paths under src/).
 */
const ALLOWED_UPWARD: ReadonlyArray<{ from: string; to: string }> = [
  // None today; an entry names the issue that removes it.
];

/** Import cycles still open, each as its files sorted; none today. */
const ALLOWED_CYCLES: ReadonlyArray<string[]> = [];

function sourceFiles(): string[] {
  const glob = new Bun.Glob('**/*.ts');
  return [...glob.scanSync({ cwd: SRC })].map((path) => path.replaceAll('\\', '/')).sort();
}

/**
 * What a file imports, as paths under src/. Comment lines are skipped so that an import named in a
 * comment does not count; static imports and re-exports start a line once the tree is formatted.
 */
function importsOf(path: string): string[] {
  const text = readFileSync(join(SRC, path), 'utf8')
    .split('\n')
    .filter((line) => !/^\s*(\/\/|\/\*|\*)/.test(line))
    .join('\n');
  const specifiers = [
    ...text.matchAll(/^(?:import|export)\b[^;]*?\bfrom\s*['"]([^'"]+)['"]/gm),
    ...text.matchAll(/^import\s*['"]([^'"]+)['"]/gm),
    ...text.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g),
  ].map((match) => match[1]!);
  const targets = new Set<string>();
  for (const specifier of specifiers) {
    if (!specifier.startsWith('.')) continue; // a package
    const target = relative(SRC, resolve(dirname(join(SRC, path)), specifier)).replaceAll(
      '\\',
      '/',
    );
    if (target.startsWith('..') || !target.endsWith('.ts')) continue; // package.json
    targets.add(target);
  }
  return [...targets].sort();
}

function layerOf(path: string): number {
  return LAYERS.findIndex((layer) => layer.test(path));
}

/** Strongly connected components of more than one file (or a file importing itself): cycles. */
function cycles(graph: Map<string, string[]>): string[][] {
  // Tarjan's algorithm, iterative so a deep chain cannot overflow the stack.
  let next = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  for (const root of graph.keys()) {
    if (index.has(root)) continue;
    const work: Array<{ node: string; edge: number }> = [{ node: root, edge: 0 }];
    index.set(root, next);
    low.set(root, next++);
    stack.push(root);
    onStack.add(root);
    while (work.length > 0) {
      const frame = work[work.length - 1]!;
      const edges = graph.get(frame.node) ?? [];
      if (frame.edge < edges.length) {
        const to = edges[frame.edge++]!;
        if (!index.has(to)) {
          index.set(to, next);
          low.set(to, next++);
          stack.push(to);
          onStack.add(to);
          work.push({ node: to, edge: 0 });
        } else if (onStack.has(to)) {
          low.set(frame.node, Math.min(low.get(frame.node)!, index.get(to)!));
        }
        continue;
      }
      work.pop();
      const parent = work[work.length - 1];
      if (parent) low.set(parent.node, Math.min(low.get(parent.node)!, low.get(frame.node)!));
      if (low.get(frame.node) !== index.get(frame.node)) continue;
      const component: string[] = [];
      for (;;) {
        const node = stack.pop()!;
        onStack.delete(node);
        component.push(node);
        if (node === frame.node) break;
      }
      const selfLoop = component.length === 1 && edges.includes(frame.node);
      if (component.length > 1 || selfLoop) found.push(component.sort());
    }
  }
  return found;
}

const files = sourceFiles();
const graph = new Map(files.map((path) => [path, importsOf(path)]));

describe('src/ imports', () => {
  test('the scan finds the tree and its imports', () => {
    // A scan that silently read nothing would pass every check below.
    expect(files).toContain('main.ts');
    expect(graph.get('app.ts')).toContain('chat/index.ts');
    expect(graph.get('main.ts')).toContain('server.ts'); // a dynamic import
    expect(importsOf('chat/model.ts')).toContain('providers/wire.ts'); // a multi-line import
  });

  test('every file is in exactly one layer', () => {
    const placed = (path: string) => LAYERS.filter((layer) => layer.test(path)).length;
    expect(files.filter((path) => placed(path) !== 1)).toEqual([]);
  });

  test('no import points up a layer', () => {
    const upward: string[] = [];
    for (const [from, targets] of graph) {
      for (const to of targets) {
        if (layerOf(to) <= layerOf(from)) continue;
        if (ALLOWED_UPWARD.some((allowed) => allowed.from === from && allowed.to === to)) continue;
        upward.push(
          `${from} (${LAYERS[layerOf(from)]!.name}) → ${to} (${LAYERS[layerOf(to)]!.name})`,
        );
      }
    }
    expect(upward).toEqual([]);
  });

  test('the allowed upward imports still exist (an entry fixed is an entry to delete)', () => {
    const stale = ALLOWED_UPWARD.filter(
      ({ from, to }) => !graph.get(from)?.includes(to) || layerOf(to) <= layerOf(from),
    );
    expect(stale).toEqual([]);
  });

  test('no import cycle', () => {
    const allowed = new Set(ALLOWED_CYCLES.map((cycle) => cycle.join(' ')));
    expect(cycles(graph).filter((cycle) => !allowed.has(cycle.join(' ')))).toEqual([]);
  });
});
