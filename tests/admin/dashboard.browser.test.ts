// The dashboard in a real browser (issue 16): headless Chromium, driven by playwright-core, signs
// in to a real gateway on port 0 whose model_03 is a fake upstream, and does what an operator does:
// create a key, watch its spend, cancel its stream, revoke it. TOLLGATE_SCREENSHOTS=1 also saves
// one screenshot per state under docs/ (for the README); a normal run writes nothing.
import { afterAll, afterEach, beforeAll, expect, test } from 'bun:test';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { type Browser, type BrowserContext, chromium, type Page } from 'playwright-core';
import { USAGE_ROWS_MAX } from '../../src/admin/usage.ts';
import { errorBody } from '../../src/http/errors.ts';
import { GatewayError } from '../../src/util/errors.ts';
import { ADMIN_TOKEN, bearer, chatBody, closedAfterEach } from '../support/gateway.ts';
import {
  ANSWER_COST_MICRO,
  expectStreamError,
  lifecycleOverrides,
  startLifecycleUpstream,
} from '../support/lifecycle-harness.ts';
import { SseReader } from '../support/sse.ts';

const cleanup = closedAfterEach();
const SCREENSHOTS = process.env.TOLLGATE_SCREENSHOTS === '1';
const DOCS = join(import.meta.dir, '../../docs');
/** Each wait on the page; generous for a loaded CI machine, far below the test's own timeout. */
const WAIT_MS = 15_000;

/**
 * Debian's chromium (.ci/run installs it). Missing, the test fails saying so: a dashboard that
 * silently goes untested is worse than a red build.
 */
function chromiumPath(): string {
  const path =
    process.env.CHROMIUM_PATH ??
    Bun.which('chromium') ??
    Bun.which('chromium-browser') ??
    '/usr/bin/chromium';
  if (!existsSync(path)) {
    throw new Error(
      `The dashboard's browser test needs Chromium and found none at ${path}: ` +
        'install it (`apt-get install chromium`, as .ci/run does) or set CHROMIUM_PATH.',
    );
  }
  return path;
}

let browser: Browser | null = null;
let context: BrowserContext | null = null;

/** One browser for the file, started again if a failed test's timeout took it down. */
async function theBrowser(): Promise<Browser> {
  if (browser === null || !browser.isConnected())
    browser = await chromium.launch({ executablePath: chromiumPath(), args: ['--no-sandbox'] });
  return browser;
}

beforeAll(async () => {
  await theBrowser();
});

afterAll(async () => {
  await browser?.close();
});

afterEach(async () => {
  await context?.close();
  context = null;
});

interface Opened {
  page: Page;
  /** Console errors and uncaught exceptions of the page. */
  problems: string[];
}

async function openPage(width = 1280, height = 800): Promise<Opened> {
  context = await (await theBrowser()).newContext({ viewport: { width, height } });
  const page = await context.newPage();
  page.setDefaultTimeout(WAIT_MS);
  const problems: string[] = [];
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(message.text());
  });
  page.on('pageerror', (error) => problems.push(error.message));
  return { page, problems };
}

async function screenshot(page: Page, name: string): Promise<void> {
  if (SCREENSHOTS) await page.screenshot({ path: join(DOCS, `dashboard-${name}.png`) });
}

/** The exact credits the page shows for whole micro-credits: 1780 → "0.00178". */
function credits(micro: number): string {
  const fraction = String(micro % 1_000_000)
    .padStart(6, '0')
    .replace(/0+$/, '');
  const whole = Math.floor(micro / 1_000_000).toLocaleString('en-US');
  return fraction ? `${whole}.${fraction}` : whole;
}

/** The page's exact credits back to whole micro-credits: "1,234.00178" → 1234001780. */
function microOf(text: string): number {
  const [whole, fraction = ''] = text.replaceAll(',', '').split('.');
  expect(fraction.length).toBeLessThanOrEqual(6);
  return Number(whole) * 1_000_000 + Number(fraction.padEnd(6, '0'));
}

async function signIn(page: Page, token: string): Promise<void> {
  await page.getByLabel('Admin token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
}

test('sign in, create a key, see its spend, top up, cancel its stream, revoke it', async () => {
  const upstream = cleanup.track(startLifecycleUpstream());
  const t = await cleanup.server(lifecycleOverrides(upstream));
  // As main does for a serving process: the page shows the event-loop figures it measures.
  t.gateway.metrics.loopDelay.start();
  cleanup.track(t.gateway.metrics.loopDelay);
  const { page, problems } = await openPage();
  await page.goto(`${t.baseUrl}/admin/`);

  // A wrong token: a clear error, the sign-in form still there, nothing stored.
  await signIn(page, 'not-the-admin-token');
  await page.getByRole('alert').filter({ hasText: 'not accepted (401)' }).waitFor();
  expect(await page.getByLabel('Admin token').isVisible()).toBe(true);
  expect(await page.locator('#console').isHidden()).toBe(true);
  expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
  await screenshot(page, 'signed-out');

  await signIn(page, ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
  expect(await page.getByRole('alert').filter({ hasText: 'not accepted' }).count()).toBe(0);
  // A second key, spending on the simulator's models, so the charts have more than one line.
  const other = await t.createKey({ name: 'batch-jobs', credits: 1000 });
  for (const model of ['model_01', 'model_05', 'model_01']) {
    const response = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: bearer(other.key),
      body: JSON.stringify(chatBody({ model, max_completion_tokens: 64 })),
    });
    expect(response.status).toBe(200);
  }

  // Create a key in the page; its secret is shown once.
  await page.getByLabel('Name', { exact: true }).fill('alice');
  await page.getByLabel('Credits', { exact: true }).fill('10');
  await page.getByRole('button', { name: 'Create key' }).click();
  const secretBox = page.getByRole('region', { name: 'New key secret' });
  const secret = (await secretBox.locator('code').filter({ hasText: /^tg-/ }).textContent())!;
  expect(secret).toMatch(/^tg-[A-Za-z0-9]{40,}$/);
  const keyId = /key_[A-Za-z0-9]+/.exec((await secretBox.textContent())!)![0];

  // A call with it, charged exactly its usage at model_03's rates.
  const answered = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(secret),
    body: JSON.stringify(chatBody()),
  });
  expect(answered.status).toBe(200);
  const charged = credits(ANSWER_COST_MICRO);
  const balance = credits(10_000_000 - ANSWER_COST_MICRO);
  await page.getByRole('button', { name: 'Refresh' }).click();
  const totalsRow = page
    .getByRole('table', { name: 'Totals by key' })
    .getByRole('row', { name: `alice (${keyId})` });
  await totalsRow.getByRole('cell', { name: charged, exact: true }).waitFor();
  expect(await totalsRow.getByRole('cell').allTextContents()).toEqual([
    `alice (${keyId})`,
    '1',
    charged,
  ]);
  const modelRow = page
    .getByRole('table', { name: 'Totals by model' })
    .getByRole('row', { name: 'model_03' });
  expect(await modelRow.getByRole('cell').allTextContents()).toEqual(['model_03', '1', charged]);
  const keyRow = page.locator(`#keys tr[data-key-id="${keyId}"]`);
  expect((await keyRow.getByRole('cell').allTextContents()).slice(0, 7)).toEqual([
    'alice',
    keyId,
    'chat, decision',
    balance,
    '0',
    charged,
    'active',
  ]);
  // The ledger says the same, exactly.
  const ledger = (await (
    await fetch(`${t.baseUrl}/admin/v1/keys/${keyId}`, {
      headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
    })
  ).json()) as any;
  expect(Math.round(ledger.balances.charged * 1e6)).toBe(ANSWER_COST_MICRO);
  // Both charts drew lines (a canvas each), one per model and per key that spent.
  expect(await page.locator('#chart-model canvas').count()).toBe(1);
  expect(await page.locator('#chart-key canvas').count()).toBe(1);
  expect(await page.locator('#chart-model .u-legend .u-series').count()).toBe(1 + 3);
  expect(await page.locator('#chart-key .u-legend .u-series').count()).toBe(1 + 2);
  const figures = page.locator('#figures');
  // The overview is read beside the usage: waited for, not assumed.
  await figures.getByText(`0 / ${t.config.limits.max_in_flight}`).waitFor();
  await figures.getByText(/^≤ [0-9.]+ ms$/).waitFor();
  // Top up through the dialog: the balance grows by exactly that.
  await page.getByRole('button', { name: `Top up alice (${keyId})` }).click();
  await page.getByRole('dialog').getByLabel('Credits to add').fill('5.5');
  await page.getByRole('dialog').getByRole('button', { name: 'Add credits' }).click();
  await keyRow
    .getByRole('cell', { name: credits(15_500_000 - ANSWER_COST_MICRO), exact: true })
    .waitFor();
  expect(await page.getByRole('dialog').count()).toBe(0);
  await page.getByRole('button', { name: 'Dismiss' }).click();
  expect(await secretBox.isHidden()).toBe(true);
  expect(await page.getByText(secret).count()).toBe(0);
  await screenshot(page, 'main');

  // A held stream appears in the live list (refreshed by the page itself) and is cancelled there.
  upstream.act = () => ({ kind: 'hold' });
  const streaming = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(secret),
    body: JSON.stringify(chatBody({ stream: true })),
  });
  const reader = new SseReader(streaming);
  const { id } = JSON.parse((await reader.next())!) as { id: string };
  const live = page.getByRole('table', { name: 'Live requests' });
  const liveRow = live.getByRole('row', { name: id });
  await liveRow.waitFor();
  expect((await liveRow.getByRole('cell').allTextContents()).slice(1, 4)).toEqual([
    `alice (${keyId})`,
    'model_03',
    'yes',
  ]);
  await page.locator('#live').scrollIntoViewIfNeeded();
  await screenshot(page, 'live');
  const cancelled = page.waitForResponse((r) => r.request().method() === 'POST');
  await page.getByRole('button', { name: `Cancel ${id}` }).click();
  const answer = await cancelled;
  expect({ url: answer.url(), status: answer.status() }).toEqual({
    url: `${t.baseUrl}/admin/v1/requests/${id}/cancel`,
    status: 202,
  });
  await expectStreamError(reader, 'request_cancelled');
  await upstream.calls.at(-1)!.aborted;
  await live.getByRole('cell', { name: 'Nothing running.' }).waitFor();

  // Revoke, with a confirmation; the key is refused from then on.
  await page.getByRole('button', { name: `Revoke alice (${keyId})` }).click();
  const dialog = page.getByRole('dialog');
  await dialog.getByText(`Revoke alice (${keyId})?`).waitFor();
  await dialog.getByRole('button', { name: 'Revoke', exact: true }).click();
  await keyRow.getByText('revoked', { exact: true }).waitFor();
  const refused = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
    method: 'POST',
    headers: bearer(secret),
    body: JSON.stringify(chatBody()),
  });
  expect(refused.status).toBe(401);

  // Signing out leaves nothing behind: no token in storage, the URL or a cookie.
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByLabel('Admin token').waitFor();
  expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
  expect(page.url()).toBe(`${t.baseUrl}/admin/`);
  expect(await context!.cookies()).toEqual([]);
  expect(await page.locator('#console tbody tr').count()).toBe(0);
  // The only error the page logged is the browser's note on the wrong token's 401; no CSP refusal.
  expect(problems).toEqual([expect.stringContaining('401')]);
});

test('a reload keeps the tab signed in; a token the server stops taking signs it out', async () => {
  const t = await cleanup.server();
  const { page } = await openPage();
  await page.goto(`${t.baseUrl}/admin`);
  await signIn(page, ADMIN_TOKEN);
  await page.getByRole('button', { name: 'Sign out' }).waitFor();
  await page.reload();
  const deployments = page.getByRole('table', { name: 'Deployments' });
  await deployments.getByRole('row', { name: /model_03/ }).waitFor();
  // The server now takes another token (as after a restart with a new ADMIN_TOKEN): the page's
  // next call signs it out, with the reason, and forgets the token.
  t.gateway.adminToken = 'another-admin-token-0123456789';
  await page.getByRole('button', { name: 'Refresh' }).click();
  await page.getByRole('alert').filter({ hasText: 'no longer accepted' }).waitFor();
  expect(await page.locator('#console').isHidden()).toBe(true);
  expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
  // A stored token that is not good when the page loads: asked again, with the reason.
  await page.evaluate(() => sessionStorage.setItem('tollgate.admin_token', 'stale-token'));
  await page.reload();
  await page.getByRole('alert').filter({ hasText: 'not accepted (401)' }).waitFor();
  expect(await page.evaluate(() => sessionStorage.length)).toBe(0);
});

test('on a narrow screen the page fits its width; wide tables scroll in their card', async () => {
  const t = await cleanup.server();
  await t.createKey({ name: 'a key with a rather long name for a phone' });
  const { page, problems } = await openPage(390, 844);
  await page.goto(`${t.baseUrl}/admin/`);
  await signIn(page, ADMIN_TOKEN);
  await page
    .getByRole('table', { name: 'Keys' })
    .getByRole('row', { name: /a key with a rather long name/ })
    .waitFor();
  await page.locator('#chart-model .empty, #chart-model canvas').first().waitFor();
  // A string, evaluated in the page (the tests' TypeScript has no DOM types).
  const overflow = await page.evaluate(
    'document.documentElement.scrollWidth - document.documentElement.clientWidth',
  );
  expect(overflow).toBe(0);
  expect(problems).toEqual([]);
});

/** The usage API's answer to a query past its row bound: a 400 naming group_by. */
const TOO_MANY_ROWS = errorBody(
  new GatewayError(
    'invalid_request_error',
    `the query has more than ${USAGE_ROWS_MAX} rows: narrow from..to, name a key_id or model, ` +
      'or group by fewer dimensions',
    { param: 'group_by' },
  ),
);

/** A usage query the page makes, as a predicate on its URL (for page.route). */
function usageQuery(which: (params: URLSearchParams) => boolean): (url: URL) => boolean {
  return (url) => url.pathname === '/admin/v1/usage' && which(url.searchParams);
}

test('one refused usage query blanks only its own panel of the spend section', async () => {
  const t = await cleanup.server();
  const { key, id } = await t.createKey({ name: 'alice' });
  for (const model of ['model_03', 'model_01']) {
    const response = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody({ model, max_completion_tokens: 64 })),
    });
    expect(response.status).toBe(200);
  }
  const { page, problems } = await openPage();
  const spend = page.locator('section', { has: page.getByRole('heading', { name: /^Spend/ }) });
  const alert = (text: string) => spend.getByRole('alert').filter({ hasText: text });
  const totalsKey = page.getByRole('table', { name: 'Totals by key' });
  const totalsModel = page.getByRole('table', { name: 'Totals by model' });
  const modelChart = page.locator('#chart-model canvas');
  const keyChart = page.locator('#chart-key canvas');

  // Past 10,000 keys with spend, the totals by key are refused for their size: the by-key chart
  // and table say so, each in its own place; the by-model chart and totals are drawn.
  const byKey = usageQuery((params) => params.get('group_by') === 'key');
  await page.route(byKey, (route) =>
    route.fulfill({ status: 400, contentType: 'application/json', json: TOO_MANY_ROWS }),
  );
  await page.goto(`${t.baseUrl}/admin/`);
  await signIn(page, ADMIN_TOKEN);
  await modelChart.waitFor();
  expect(await page.locator('#chart-model .u-legend .u-label').allTextContents()).toEqual([
    'Day',
    'model_01',
    'model_03',
  ]);
  await totalsModel.getByRole('row', { name: /^model_03 / }).waitFor();
  await alert('Too many keys to chart by key over 30 days; see the totals by model.').waitFor();
  await alert('Too many keys spent in the last 30 days to list them here.').waitFor();
  expect(await totalsModel.getByRole('row').count()).toBe(1 + 2);
  expect(await totalsKey.locator('tbody tr').count()).toBe(0);
  expect(await keyChart.count()).toBe(0);
  expect(await page.locator('#chart-key').isHidden()).toBe(true);
  expect(await spend.getByRole('alert').count()).toBe(2);
  await page.unroute(byKey);

  // A key's own daily series fails otherwise (here a 503): the API's message in the by-key chart
  // alone; the refresh brings the totals by key back and clears their message.
  const ownSeries = usageQuery((params) => params.has('key_id'));
  await page.route(ownSeries, (route) =>
    route.fulfill({
      status: 503,
      contentType: 'application/json',
      json: { error: { message: 'usage is resting', type: 'server_error', code: 'overloaded' } },
    }),
  );
  await page.getByRole('button', { name: 'Refresh' }).click();
  await totalsKey.getByRole('row', { name: `alice (${id})` }).waitFor();
  await alert('usage is resting').waitFor();
  expect(await spend.getByRole('alert').count()).toBe(1);
  expect(await modelChart.count()).toBe(1);
  expect(await keyChart.count()).toBe(0);
  await page.unroute(ownSeries);

  // The by-model chart refused for its size: its own message; everything else is drawn.
  const byModel = usageQuery((params) => params.get('group_by') === 'day,model');
  await page.route(byModel, (route) =>
    route.fulfill({ status: 400, contentType: 'application/json', json: TOO_MANY_ROWS }),
  );
  await page.getByRole('button', { name: 'Refresh' }).click();
  await alert('Too many models to chart over 30 days; see the totals by model.').waitFor();
  await keyChart.waitFor();
  expect(await modelChart.count()).toBe(0);
  expect(await spend.getByRole('alert').count()).toBe(1);
  expect(await totalsModel.getByRole('row').count()).toBe(1 + 2);
  expect(await totalsKey.getByRole('row').count()).toBe(1 + 1);
  await page.unroute(byModel);

  // All answered again: no message left, both charts drawn.
  await page.getByRole('button', { name: 'Refresh' }).click();
  await modelChart.waitFor();
  expect(await spend.getByRole('alert').count()).toBe(0);
  expect(await keyChart.count()).toBe(1);
  // The only errors the page logged are the browser's notes on the refused answers.
  expect(problems.filter((text) => !/status of (400|503)/.test(text))).toEqual([]);
});

test('the by-key chart: the 7 most charged keys, each its own query, then "other"', async () => {
  const t = await cleanup.server();
  const { page, problems } = await openPage();
  const keys: { id: string; name: string }[] = [];
  for (let i = 1; i <= 9; i++) {
    const { id, key } = await t.createKey({ name: `team-${i}` });
    keys.push({ id, name: `team-${i}` });
    // One small call each, its prompt longer with i, so every key is charged a different amount.
    const content = 'Say hello. '.repeat(i * 10);
    const response = await fetch(`${t.baseUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers: bearer(key),
      body: JSON.stringify(chatBody({ messages: [{ role: 'user', content }] })),
    });
    expect(response.status).toBe(200);
  }
  const charged = new Map<string, number>();
  for (const { id } of keys) {
    const ledger = (await (
      await fetch(`${t.baseUrl}/admin/v1/keys/${id}`, {
        headers: { authorization: `Bearer ${ADMIN_TOKEN}` },
      })
    ).json()) as any;
    charged.set(id, Math.round(ledger.balances.charged * 1e6));
  }
  expect(new Set(charged.values()).size).toBe(9);
  const ranked = [...keys].sort((a, b) => charged.get(b.id)! - charged.get(a.id)!);
  const top = ranked.slice(0, 7);
  const rest = ranked.slice(7);
  const label = (key: { id: string; name: string }) => `${key.name} (${key.id})`;

  const usage: URLSearchParams[] = [];
  page.on('request', (request) => {
    const url = new URL(request.url());
    if (url.pathname === '/admin/v1/usage') usage.push(url.searchParams);
  });
  await page.goto(`${t.baseUrl}/admin/`);
  await signIn(page, ADMIN_TOKEN);
  const legend = page.locator('#chart-key .u-legend .u-label');
  await legend.nth(8).waitFor();

  // No query grouped by day and key (its rows grow with the keys): a key's own series is asked
  // for the 7 drawn only, besides the totals per key, per day and the by-model ones.
  const groups = usage.map((params) => params.get('group_by'));
  expect(groups).not.toContain('day,key');
  const own = usage.filter((params) => params.has('key_id'));
  expect(own.map((params) => params.get('group_by'))).toEqual(new Array(7).fill('day'));
  expect(own.map((params) => params.get('key_id')).sort()).toEqual(top.map((k) => k.id).sort());
  expect([...new Set(groups)].sort()).toEqual(['day', 'day,model', 'key', 'model']);

  // The legend and the table: the 7 most charged keys, most first, then "other".
  const names = ['Day', ...top.map(label), 'other'];
  expect(await legend.allTextContents()).toEqual(names);
  const table = page.getByRole('table', { name: 'Spend per day by key, as a table' });
  expect(await table.locator('thead th').allTextContents()).toEqual(names);
  // Each column sums to exactly what the ledger charged: a key its own, "other" the two others'.
  const rows = await table.locator('tbody tr').all();
  expect(rows).toHaveLength(30);
  const sums = new Array<number>(8).fill(0);
  for (const row of rows) {
    const cells = await row.getByRole('cell').allTextContents();
    expect(cells).toHaveLength(8);
    cells.forEach((text, i) => {
      sums[i]! += microOf(text);
    });
  }
  expect(sums).toEqual([
    ...top.map((key) => charged.get(key.id)!),
    charged.get(rest[0]!.id)! + charged.get(rest[1]!.id)!,
  ]);
  // Today's row holds it all (the calls were made today, UTC).
  const today = new Date().toISOString().slice(0, 10);
  expect(await rows.at(-1)!.getByRole('rowheader').textContent()).toBe(today);

  expect(problems).toEqual([]);
});
