// The dashboard's routes (CONTRACT §6, `/admin/`): the page with its CSP, its embedded assets and
// their caching, 404 for anything else.
import { expect, test } from 'bun:test';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { ADMIN_TOKEN, closedAfterEach } from '../support/gateway.ts';

const cleanup = closedAfterEach();
const admin = { authorization: `Bearer ${ADMIN_TOKEN}` };
const ROOT = join(import.meta.dir, '../..');

/** The /admin/assets/… paths the page loads (scripts, styles, icon), in document order. */
function assetPaths(html: string): string[] {
  return [...html.matchAll(/(?:src|href)="(\/admin\/assets\/[^"]+)"/g)].map((m) => m[1]!);
}

test('/admin/ and /admin serve the page under a strict CSP, without a token', async () => {
  const t = cleanup.gateway();
  const page = await t.request('/admin/');
  expect(page.status).toBe(200);
  const headers = Object.fromEntries(page.headers);
  expect(headers).toMatchObject({
    'content-type': 'text/html; charset=utf-8',
    'cache-control': 'no-cache',
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'x-frame-options': 'DENY',
  });
  const csp = headers['content-security-policy']!;
  expect(csp.split('; ')).toEqual(
    expect.arrayContaining([
      "default-src 'self'",
      "script-src 'self'",
      "style-src 'self'",
      "form-action 'none'",
      "frame-ancestors 'none'",
    ]),
  );
  expect(csp).not.toContain('unsafe');
  const html = await page.text();
  expect(html.startsWith('<!doctype html>')).toBe(true);
  // No inline script or style for the CSP to refuse: every script has a src, nothing is styled
  // inline, no handler attribute.
  expect([...html.matchAll(/<script\b[^>]*>/g)].map((m) => m[0].includes(' src="'))).toEqual([
    true,
    true,
  ]);
  expect(html).not.toMatch(/<style\b|\sstyle=|\son[a-z]+=/);
  expect(html).not.toContain('{{');
  // The same page without the trailing slash (its asset paths are absolute).
  const bare = await t.request('/admin');
  expect(bare.status).toBe(200);
  expect(await bare.text()).toBe(html);
});

test('the page holds no data: the same bytes with or without a token, keys or not', async () => {
  const t = cleanup.gateway();
  const before = await (await t.request('/admin/')).text();
  const { key } = await t.createKey({ name: 'a-name-only-the-api-knows' });
  const signedIn = await (await t.request('/admin/', { headers: admin })).text();
  expect(signedIn).toBe(before);
  for (const secret of [key, ADMIN_TOKEN, 'a-name-only-the-api-knows'])
    expect(before).not.toContain(secret);
});

test('every asset the page names is embedded, typed and cached for good', async () => {
  const t = cleanup.gateway();
  const html = await (await t.request('/admin/')).text();
  const paths = assetPaths(html);
  const expected: Record<string, { source: string; type: string }> = {
    icon: { source: 'src/admin/dashboard/icon.svg', type: 'image/svg+xml' },
    'uPlot.min.css': { source: 'node_modules/uplot/dist/uPlot.min.css', type: 'text/css' },
    style: { source: 'src/admin/dashboard/style.css', type: 'text/css' },
    'uPlot.iife': { source: 'node_modules/uplot/dist/uPlot.iife.min.js', type: 'text/javascript' },
    app: { source: 'src/admin/dashboard/app.js', type: 'text/javascript' },
  };
  expect(paths).toHaveLength(Object.keys(expected).length);
  for (const path of paths) {
    const name = path.slice('/admin/assets/'.length);
    // The content's hash is in the name: app.<12 hex>.js.
    expect(name).toMatch(/^[A-Za-z]+\.[0-9a-f]{12}\.[a-z.]+$/);
    const hashless = name.replace(/\.[0-9a-f]{12}/, '');
    const which = Object.entries(expected).find(([prefix]) =>
      hashless.startsWith(`${prefix}.`) ? true : hashless === prefix,
    );
    expect(which).toBeDefined();
    const [, { source, type }] = which!;
    const response = await t.request(path);
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')!.split(';')[0]).toBe(type);
    expect(response.headers.get('cache-control')).toBe('public, max-age=31536000, immutable');
    expect(response.headers.get('x-content-type-options')).toBe('nosniff');
    expect(await response.text()).toBe(readFileSync(join(ROOT, source), 'utf8'));
  }
});

test('an unknown asset, an unhashed name or another path under /admin/ is a 404', async () => {
  const t = cleanup.gateway();
  const html = await (await t.request('/admin/')).text();
  const app = assetPaths(html).find((path) => path.includes('/app.'))!;
  for (const path of [
    '/admin/assets/nope.js',
    '/admin/assets/app.js',
    app.replace(/\.[0-9a-f]{12}\./, '.000000000000.'),
    '/admin/assets/',
    '/admin/index.html',
    '/admin/assets/..%2Fpage.html',
  ]) {
    const response = await t.request(path);
    expect({ path, status: response.status }).toEqual({ path, status: 404 });
    expect(((await response.json()) as any).error.code).toBe('not_found');
  }
});
