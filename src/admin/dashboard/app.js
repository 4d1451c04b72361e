// The dashboard's script: signs in with the admin token (kept in this tab's sessionStorage only,
// sent as an Authorization header, never in a URL or a cookie) and draws the admin API's answers:
// keys, spend per day, live requests, deployments and the gateway's own figures. Loaded as a
// module (strict, nothing global), after uPlot's script, which defines `uPlot`.

const TOKEN_STORAGE_KEY = 'tollgate.admin_token';
/** Live requests come and go in seconds; everything else changes slowly or on our own actions. */
const LIVE_REFRESH_MS = 2000;
/** In ticks of LIVE_REFRESH_MS: the overview every 10 s, keys and spend every 30 s. */
const OVERVIEW_EVERY_TICKS = 5;
const SPEND_EVERY_TICKS = 15;
const SPEND_DAYS = 30;
const DAY_MS = 86_400_000;
/** An admin call that takes longer is reported as failed (the next refresh tries again). */
const CALL_TIMEOUT_MS = 10_000;
/** Lines the by-model chart draws; past it, the smallest models are summed as "other". */
const CHART_SERIES_MAX = 8;
/**
 * Keys the by-key chart draws a line for, the most charged, each its own small query; the rest are
 * one more line, "other".
 */
const KEY_SERIES_MAX = 7;
const PALETTE = [
  '#2563eb',
  '#dc2626',
  '#16a34a',
  '#d97706',
  '#7c3aed',
  '#0891b2',
  '#db2777',
  '#4b5563',
  '#65a30d',
];

const $ = (id) => document.getElementById(id);

/** The token of this tab's session, or null when signed out. */
let token = null;
let liveTimer = null;
let tick = 0;
/** Key id → name, for the tables and charts that show keys by id. */
let keyNames = new Map();
const charts = { model: null, key: null };

class ApiError extends Error {
  /** `param`: the request field the envelope names, or null. */
  constructor(status, code, message, param = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.param = param;
  }
}

/** One admin API call with `bearer`; the answer's JSON, or an ApiError with the envelope's code. */
async function api(method, path, body, bearer = token) {
  const headers = { authorization: `Bearer ${bearer}` };
  const init = {
    method,
    headers,
    cache: 'no-store',
    credentials: 'omit',
    signal: AbortSignal.timeout(CALL_TIMEOUT_MS),
  };
  if (body !== undefined) {
    headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    const what = error?.name === 'TimeoutError' ? 'in time' : '(network error)';
    throw new ApiError(0, 'network', `The gateway did not answer ${what}.`);
  }
  let json = null;
  try {
    json = await response.json();
  } catch {
    // Not JSON: reported below by status.
  }
  if (!response.ok) {
    const error = json?.error;
    throw new ApiError(
      response.status,
      error?.code ?? `http_${response.status}`,
      error?.message ?? `HTTP ${response.status}`,
      error?.param ?? null,
    );
  }
  return json;
}

// ---- formatting ----------------------------------------------------------------------------

/** Credits as the API gives them (µcr / 1e6) back to whole micro-credits, so sums stay exact. */
const microOf = (credits) => Math.round(credits * 1e6);

/** Whole micro-credits as an exact decimal of credits: 1780 → "0.00178", 9998220 → "9.99822". */
function formatMicro(micro) {
  const sign = micro < 0 ? '-' : '';
  const abs = Math.abs(micro);
  const whole = Math.floor(abs / 1e6).toLocaleString('en-US');
  const fraction = String(abs % 1e6)
    .padStart(6, '0')
    .replace(/0+$/, '');
  return `${sign}${whole}${fraction ? `.${fraction}` : ''}`;
}

const formatCredits = (credits) => formatMicro(microOf(credits));

function formatDuration(ms) {
  const s = Math.floor(ms / 1000);
  if (s < 60) return ms < 10_000 ? `${(ms / 1000).toFixed(1)} s` : `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${s % 60} s`;
  const h = Math.floor(m / 60);
  if (h < 24) return `${h} h ${m % 60} min`;
  return `${Math.floor(h / 24)} d ${h % 24} h`;
}

const formatMiB = (bytes) => `${(bytes / 1048576).toFixed(1)} MiB`;

/** Unix seconds as a UTC time of day, HH:MM:SS. */
const isoTime = (s) => new Date(s * 1000).toISOString().slice(11, 19);

/** A UTC day as YYYY-MM-DD. */
const isoDay = (ms) => new Date(ms).toISOString().slice(0, 10);

function keyLabel(id) {
  const name = keyNames.get(id);
  return name === undefined ? id : `${name} (${id})`;
}

// ---- DOM helpers (text only: names come from operators and never become markup) ------------

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name === 'text') node.textContent = value;
    else if (name === 'onclick') node.addEventListener('click', value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function cell(text, className) {
  return el('td', className ? { class: className, text } : { text });
}

/** Fills a table body with `rows`, or one muted row saying `empty`. */
function fillBody(table, rows, empty) {
  const body = table.tBodies[0];
  if (rows.length === 0) {
    const columns = table.tHead.rows[0].cells.length;
    rows = [el('tr', {}, el('td', { colspan: String(columns), class: 'muted', text: empty }))];
  }
  body.replaceChildren(...rows);
}

function showError(id, error) {
  const node = $(id);
  if (error === null) {
    node.hidden = true;
    node.textContent = '';
    return;
  }
  node.textContent = error.message;
  node.hidden = false;
}

/**
 * Runs one section's load; a 401 means the token is no longer good (signs out), any other error is
 * shown in the section's own error line, so one failing endpoint leaves the rest of the page.
 */
async function guarded(errorId, load) {
  // Signed out meanwhile (another section's 401): nothing to load, nothing to show.
  if (token === null) return;
  try {
    await load();
    showError(errorId, null);
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      signOut('The admin token is no longer accepted; sign in again.');
      return;
    }
    showError(errorId, error);
  }
}

// ---- sign-in ---------------------------------------------------------------------------------

async function signIn(event) {
  event.preventDefault();
  const input = $('token');
  const candidate = input.value.trim();
  if (candidate === '') return;
  const button = event.submitter ?? $('sign-in-form').querySelector('button');
  button.disabled = true;
  try {
    await api('GET', '/admin/v1/overview', undefined, candidate);
    input.value = '';
    sessionStorage.setItem(TOKEN_STORAGE_KEY, candidate);
    start(candidate);
  } catch (error) {
    showSignInError(error);
  } finally {
    button.disabled = false;
  }
}

function showSignInError(error) {
  const message =
    error instanceof ApiError && error.status === 401
      ? 'That admin token was not accepted (401). Use the server’s ADMIN_TOKEN or the ' +
        'contents of DATA_DIR/admin-token.'
      : `Could not sign in: ${error.message}`;
  showError('sign-in-error', new Error(message));
  $('token').focus();
}

function start(bearer) {
  token = bearer;
  showError('sign-in-error', null);
  $('sign-in').hidden = true;
  $('console').hidden = false;
  $('sign-out').hidden = false;
  $('refresh').hidden = false;
  tick = 0;
  refreshAll();
  scheduleLive();
}

function signOut(message) {
  token = null;
  sessionStorage.removeItem(TOKEN_STORAGE_KEY);
  clearTimeout(liveTimer);
  liveTimer = null;
  // Nothing read with the token stays on the page.
  for (const name of Object.keys(charts)) clearChart(name);
  for (const table of document.querySelectorAll('#console tbody')) table.replaceChildren();
  $('figures').replaceChildren();
  dismissSecret();
  $('console').hidden = true;
  $('sign-out').hidden = true;
  $('refresh').hidden = true;
  $('sign-in').hidden = false;
  if (message) showError('sign-in-error', new Error(message));
  $('token').focus();
}

// ---- refresh loop ----------------------------------------------------------------------------

async function refreshAll() {
  // Keys first: the spend and live tables name keys by their names.
  await loadKeys();
  await Promise.all([loadOverview(), loadSpend(), loadLive()]);
}

/** The next live tick, only while the tab is visible (a hidden tab costs the gateway nothing). */
function scheduleLive() {
  clearTimeout(liveTimer);
  liveTimer = null;
  if (token === null || document.visibilityState !== 'visible') return;
  liveTimer = setTimeout(async () => {
    tick++;
    const work = [loadLive()];
    if (tick % OVERVIEW_EVERY_TICKS === 0) work.push(loadOverview());
    if (tick % SPEND_EVERY_TICKS === 0) work.push(loadKeys().then(loadSpend));
    await Promise.all(work);
    scheduleLive();
  }, LIVE_REFRESH_MS);
}

document.addEventListener('visibilitychange', () => {
  if (token === null) return;
  if (document.visibilityState === 'visible') {
    loadLive();
    scheduleLive();
  } else {
    clearTimeout(liveTimer);
    liveTimer = null;
  }
});

// ---- gateway figures and deployments ---------------------------------------------------------

function loadOverview() {
  return guarded('gateway-error', async () => {
    const overview = await api('GET', '/admin/v1/overview');
    renderFigures(overview);
    renderDeployments(overview.deployments);
  });
}

function renderFigures(o) {
  const loop = o.event_loop;
  // Main measures the loop in a serving process; a gateway that does not says so, rather than 0.
  const measured = loop.samples > 0;
  const figures = [
    ['In flight', `${o.in_flight} / ${o.in_flight_max}${o.draining ? ' (draining)' : ''}`],
    ['Loop delay, mean', measured ? `${loop.mean_delay_ms} ms` : 'not measured'],
    ['Loop delay, p99', measured ? `≤ ${loop.p99_delay_ms_at_most ?? '> 5000'} ms` : '—'],
    ['Delays > 50 ms', measured ? String(loop.over_50ms) : '—'],
    ['Uptime', formatDuration(o.uptime_s * 1000)],
    ['Memory (RSS)', formatMiB(o.memory.rss_bytes)],
    ['JS heap used', formatMiB(o.memory.heap_used_bytes)],
    ['Version', o.version],
  ];
  $('figures').replaceChildren(
    ...figures.map(([name, value]) =>
      el('div', { class: 'figure' }, el('dt', { text: name }), el('dd', { text: value })),
    ),
  );
}

function renderDeployments(deployments) {
  const rows = deployments.map((d) =>
    el(
      'tr',
      {},
      cell(d.model),
      cell(d.provider),
      cell(d.upstream_model),
      cell(String(d.weight), 'num'),
      el('td', {}, el('span', { class: `badge ${d.state}`, text: d.state })),
      cell(String(d.consecutive_failures), 'num'),
      cell(d.retry_at === null ? '—' : `${isoTime(d.retry_at)} UTC`),
      cell(`${d.attempts.ok} / ${d.attempts.error} / ${d.attempts.cancelled}`, 'num'),
    ),
  );
  fillBody($('deployments'), rows, 'No deployments configured.');
}

// ---- keys ------------------------------------------------------------------------------------

function loadKeys() {
  return guarded('keys-error', async () => {
    const { data } = await api('GET', '/admin/v1/keys');
    keyNames = new Map(data.map((key) => [key.id, key.name]));
    renderKeys(data);
  });
}

function renderKeys(keys) {
  const rows = keys.map((key) => {
    const b = key.balances;
    const actions = key.revoked
      ? el('td')
      : el(
          'td',
          { class: 'actions' },
          el('button', {
            type: 'button',
            text: 'Top up',
            'aria-label': `Top up ${key.name} (${key.id})`,
            onclick: () => openTopUp(key),
          }),
          el('button', {
            type: 'button',
            class: 'danger',
            text: 'Revoke',
            'aria-label': `Revoke ${key.name} (${key.id})`,
            onclick: () => openRevoke(key),
          }),
        );
    return el(
      'tr',
      { 'data-key-id': key.id },
      cell(key.name),
      cell(key.id, 'mono'),
      cell(key.services.join(', ')),
      cell(formatCredits(b.credits), 'num'),
      cell(formatCredits(b.held), 'num'),
      cell(formatCredits(b.charged), 'num'),
      el(
        'td',
        {},
        el('span', {
          class: `badge ${key.revoked ? 'revoked' : 'active'}`,
          text: key.revoked ? 'revoked' : 'active',
        }),
      ),
      actions,
    );
  });
  fillBody($('keys'), rows, 'No keys yet: create one above.');
}

async function createKey(event) {
  event.preventDefault();
  const form = event.currentTarget;
  const services = [...form.querySelectorAll('input[name=services]:checked')].map((i) => i.value);
  const body = {
    name: $('new-key-name').value.trim(),
    credits: Number($('new-key-credits').value),
    services,
  };
  await guarded('keys-error', async () => {
    if (services.length === 0) throw new Error('Pick at least one service.');
    const created = await api('POST', '/admin/v1/keys', body);
    form.reset();
    showSecret(created);
  });
  await loadKeys();
}

/** The secret is shown once: it lives only in this box until it is dismissed or we sign out. */
function showSecret(created) {
  $('new-secret-name').textContent = `${created.name} (${created.id})`;
  $('new-secret-value').textContent = created.key;
  $('new-secret-copy').textContent = 'Copy';
  $('new-secret').hidden = false;
}

function dismissSecret() {
  $('new-secret-value').textContent = '';
  $('new-secret-name').textContent = '';
  $('new-secret').hidden = true;
}

async function copySecret() {
  const text = $('new-secret-value').textContent;
  try {
    // The Clipboard API exists only in a secure context (https or localhost).
    await navigator.clipboard.writeText(text);
    $('new-secret-copy').textContent = 'Copied';
  } catch {
    getSelection().selectAllChildren($('new-secret-value'));
    $('new-secret-copy').textContent = 'Selected: press Ctrl+C';
  }
}

let dialogKey = null;

function openTopUp(key) {
  dialogKey = key;
  $('top-up-title').textContent = `Top up ${key.name}`;
  $('top-up-form').reset();
  showError('top-up-error', null);
  $('top-up-dialog').showModal();
}

async function topUp(event) {
  event.preventDefault();
  const credits = Number($('top-up-credits').value);
  try {
    await api('POST', `/admin/v1/keys/${encodeURIComponent(dialogKey.id)}/credits`, { credits });
    $('top-up-dialog').close();
    await loadKeys();
  } catch (error) {
    showError('top-up-error', error);
  }
}

function openRevoke(key) {
  dialogKey = key;
  $('revoke-text').textContent =
    `Revoke ${key.name} (${key.id})? Every call with it is refused (401) from now on; ` +
    'this cannot be undone.';
  showError('revoke-error', null);
  $('revoke-dialog').showModal();
}

async function revoke(event) {
  event.preventDefault();
  try {
    await api('POST', `/admin/v1/keys/${encodeURIComponent(dialogKey.id)}/revoke`);
    $('revoke-dialog').close();
    await loadKeys();
  } catch (error) {
    showError('revoke-error', error);
  }
}

// ---- spend -----------------------------------------------------------------------------------

/**
 * The spend section: two charts and two totals tables, each loaded from its own usage queries and
 * failing on its own (one refused query leaves the other three panels). Every query is bounded in
 * rows whatever the number of keys, except the totals by key, which the API refuses past its row
 * bound (shown in that table and the chart that needs it).
 */
async function loadSpend() {
  if (token === null) return;
  const todayMs = Math.floor(Date.now() / DAY_MS) * DAY_MS;
  const fromMs = todayMs - (SPEND_DAYS - 1) * DAY_MS;
  const range = `from=${isoDay(fromMs)}&to=${isoDay(todayMs)}`;
  const days = [];
  for (let ms = fromMs; ms <= todayMs; ms += DAY_MS) days.push(ms / 1000);
  const usage = async (query) => (await api('GET', `/admin/v1/usage?${range}&${query}`)).data;
  const keyTotals = usage('group_by=key');
  // Read by the two panels that need it, each catching it; this keeps it from being unhandled.
  keyTotals.catch(() => {});
  await Promise.all([
    panel('model', 'Too many models to chart over 30 days; see the totals by model.', async () =>
      drawChart(
        'model',
        days,
        seriesOf(days, await usage('group_by=day,model'), (r) => r.model),
      ),
    ),
    panel('key', 'Too many keys to chart by key over 30 days; see the totals by model.', async () =>
      drawChart('key', days, await keySeries(days, await keyTotals, usage)),
    ),
    panel('totals-model', 'Too many models to list over 30 days.', async () =>
      renderTotals($('totals-model'), await usage('group_by=model'), (row) => row.model),
    ),
    panel('totals-key', 'Too many keys spent in the last 30 days to list them here.', async () =>
      renderTotals($('totals-key'), await keyTotals, (row) => keyLabel(row.key_id)),
    ),
  ]);
}

/**
 * One panel of the spend section (`chart-<name>` or a `<name>` table): its load, and on failure
 * its own error line in place of its content. A query refused for its size (a 400 naming group_by)
 * is said in the panel's own words, `tooMany`; a 401 signs out, as everywhere.
 */
function panel(name, tooMany, load) {
  const chart = name in charts;
  const errorId = chart ? `chart-${name}-error` : `${name}-error`;
  return guarded(errorId, async () => {
    try {
      await load();
      if (chart) $(`chart-${name}`).hidden = false;
    } catch (error) {
      // Nothing stale stays beside the error: the chart and its table, or the table's rows, go.
      if (chart) {
        clearChart(name);
        $(`chart-${name}`).hidden = true;
      } else {
        $(name).tBodies[0].replaceChildren();
      }
      const tooBig =
        error instanceof ApiError && error.status === 400 && error.param === 'group_by';
      throw tooBig ? new ApiError(400, error.code, tooMany, error.param) : error;
    }
  });
}

function renderTotals(table, rows, nameOf) {
  const sorted = [...rows].sort((a, b) => b.charged_credits - a.charged_credits);
  const body = sorted.map((row) =>
    el(
      'tr',
      {},
      cell(nameOf(row)),
      cell(row.requests.toLocaleString('en-US'), 'num'),
      cell(formatCredits(row.charged_credits), 'num'),
    ),
  );
  fillBody(table, body, 'No requests in the last 30 days.');
}

/** Whole micro-credits per day of `days`, from usage rows grouped by day (a missing day is 0). */
function dailyMicro(days, rows) {
  const index = new Map(days.map((s, i) => [isoDay(s * 1000), i]));
  const micro = new Array(days.length).fill(0);
  for (const row of rows) {
    const i = index.get(row.day);
    if (i !== undefined) micro[i] += microOf(row.charged_credits);
  }
  return micro;
}

/**
 * The by-key chart's series without a query whose rows grow with the number of keys: the
 * KEY_SERIES_MAX keys that were charged the most in the 30 days (from their totals), each from its
 * own daily query (at most 30 rows), and "other", the daily totals minus theirs, exact in µcr.
 */
async function keySeries(days, totals, usage) {
  const spenders = totals
    .map((row) => ({ id: row.key_id, micro: microOf(row.charged_credits) }))
    .filter((key) => key.micro > 0)
    .sort((a, b) => b.micro - a.micro || (a.id < b.id ? -1 : 1));
  const top = spenders.slice(0, KEY_SERIES_MAX);
  const series = await Promise.all(
    top.map(async (key) => ({
      name: keyLabel(key.id),
      micro: dailyMicro(days, await usage(`group_by=day&key_id=${encodeURIComponent(key.id)}`)),
    })),
  );
  if (spenders.length > top.length) {
    // Read after the top keys' series: spend only grows, so a request finishing meanwhile lands
    // in "other" rather than making it negative.
    const other = dailyMicro(days, await usage('group_by=day'));
    for (const { micro } of series) for (let i = 0; i < other.length; i++) other[i] -= micro[i];
    // Only a day dropped by retention between the reads could go below 0.
    series.push({ name: 'other', micro: other.map((m) => Math.max(0, m)) });
  }
  return series;
}

/**
 * One line per name (the CHART_SERIES_MAX - 1 largest, the rest as "other"), one point per day; a
 * day without spend is 0, not a gap.
 */
function seriesOf(days, rows, nameOf) {
  const rowsByName = new Map();
  for (const row of rows) {
    const name = nameOf(row);
    const own = rowsByName.get(name);
    if (own === undefined) rowsByName.set(name, [row]);
    else own.push(row);
  }
  const total = (values) => values.reduce((a, b) => a + b, 0);
  let named = [...rowsByName.entries()]
    .map(([name, own]) => ({ name, micro: dailyMicro(days, own) }))
    .sort((a, b) => total(b.micro) - total(a.micro));
  if (named.length > CHART_SERIES_MAX) {
    const other = new Array(days.length).fill(0);
    for (const { micro } of named.slice(CHART_SERIES_MAX - 1)) {
      for (let i = 0; i < micro.length; i++) other[i] += micro[i];
    }
    named = [...named.slice(0, CHART_SERIES_MAX - 1), { name: 'other', micro: other }];
  }
  return named;
}

function clearChart(name) {
  charts[name]?.destroy();
  charts[name] = null;
  $(`chart-${name}`).replaceChildren();
  const table = $(`chart-${name}-data`);
  table.tHead.replaceChildren();
  table.tBodies[0].replaceChildren();
}

/** Draws `series` ({ name, micro: µcr per day }) and fills the chart's table (its text form). */
function drawChart(name, days, series) {
  const container = $(`chart-${name}`);
  clearChart(name);
  fillChartTable($(`chart-${name}-data`), days, series);
  if (series.length === 0) {
    container.replaceChildren(el('p', { class: 'muted empty', text: 'No spend in 30 days.' }));
    return;
  }
  const options = {
    width: chartWidth(container),
    height: 240,
    // Days are UTC days: the axis must not shift them into the browser's time zone.
    tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), 'Etc/UTC'),
    scales: { x: { time: true }, y: { range: (_u, _min, max) => [0, max > 0 ? max * 1.1 : 1] } },
    axes: [{}, { size: 64, values: (_u, splits) => splits.map((v) => formatAxis(v)) }],
    series: [
      { label: 'Day', value: (_u, ts) => (ts == null ? '—' : isoDay(ts * 1000)) },
      ...series.map((s, i) => ({
        label: s.name,
        stroke: PALETTE[i % PALETTE.length],
        width: 2,
        // Dots on the days that had spend; the zero days are the line alone.
        points: { size: 6, filter: spentDays },
        value: (_u, v) => (v == null ? '—' : formatCredits(v)),
      })),
    ],
  };
  const data = [days, ...series.map((s) => s.micro.map((m) => m / 1e6))];
  charts[name] = new uPlot(options, data, container);
}

/**
 * The chart as a table, for screen readers (visually hidden): one row per day, one column per
 * line, exact credits.
 */
function fillChartTable(table, days, series) {
  if (series.length === 0) return;
  table.tHead.replaceChildren(
    el(
      'tr',
      {},
      el('th', { scope: 'col', text: 'Day' }),
      ...series.map((s) => el('th', { scope: 'col', class: 'num', text: s.name })),
    ),
  );
  table.tBodies[0].replaceChildren(
    ...days.map((s, i) =>
      el(
        'tr',
        {},
        el('th', { scope: 'row', text: isoDay(s * 1000) }),
        ...series.map((line) => cell(formatMicro(line.micro[i]), 'num')),
      ),
    ),
  );
}

/** The indexes of a series' non-zero days (uPlot's points filter). */
function spentDays(u, seriesIndex) {
  const values = u.data[seriesIndex];
  const days = [];
  for (let i = 0; i < values.length; i++) if (values[i] > 0) days.push(i);
  return days;
}

function formatAxis(credits) {
  if (credits === 0) return '0';
  if (credits >= 1000) return `${(credits / 1000).toLocaleString('en-US')}k`;
  return credits.toLocaleString('en-US', { maximumSignificantDigits: 3 });
}

function chartWidth(container) {
  return Math.max(240, Math.floor(container.getBoundingClientRect().width));
}

const resizer = new ResizeObserver(() => {
  for (const name of Object.keys(charts)) {
    const chart = charts[name];
    if (chart) chart.setSize({ width: chartWidth($(`chart-${name}`)), height: 240 });
  }
});

// ---- live requests ---------------------------------------------------------------------------

function loadLive() {
  return guarded('live-error', async () => {
    const { data } = await api('GET', '/admin/v1/requests?state=in_progress');
    renderLive(data);
  });
}

function renderLive(requests) {
  const rows = requests.map((r) =>
    el(
      'tr',
      { 'data-request-id': r.id },
      cell(r.id, 'mono'),
      cell(keyLabel(r.key_id)),
      cell(r.model),
      cell(r.stream ? 'yes' : 'no'),
      cell(formatDuration(r.age_ms), 'num'),
      cell(formatCredits(r.held_credits), 'num'),
      cell(String(r.attempt), 'num'),
      el(
        'td',
        { class: 'actions' },
        el('button', {
          type: 'button',
          class: 'danger',
          text: 'Cancel',
          'aria-label': `Cancel ${r.id}`,
          onclick: (event) => cancelRequest(event.currentTarget, r.id),
        }),
      ),
    ),
  );
  fillBody($('live-requests'), rows, 'Nothing running.');
}

async function cancelRequest(button, id) {
  button.disabled = true;
  await guarded('live-error', () =>
    api('POST', `/admin/v1/requests/${encodeURIComponent(id)}/cancel`),
  );
  await loadLive();
}

// ---- wiring ----------------------------------------------------------------------------------

$('sign-in-form').addEventListener('submit', signIn);
$('sign-out').addEventListener('click', () => signOut(null));
$('refresh').addEventListener('click', refreshAll);
$('create-key-form').addEventListener('submit', createKey);
$('new-secret-copy').addEventListener('click', copySecret);
$('new-secret-dismiss').addEventListener('click', dismissSecret);
$('top-up-form').addEventListener('submit', topUp);
$('top-up-cancel').addEventListener('click', () => $('top-up-dialog').close());
$('revoke-form').addEventListener('submit', revoke);
$('revoke-cancel').addEventListener('click', () => $('revoke-dialog').close());
resizer.observe($('chart-model'));
resizer.observe($('chart-key'));

// A reload of this tab keeps the session; a new tab or window asks again.
const saved = sessionStorage.getItem(TOKEN_STORAGE_KEY);
if (saved === null) {
  $('token').focus();
} else {
  api('GET', '/admin/v1/overview', undefined, saved).then(
    () => start(saved),
    (error) => {
      if (error instanceof ApiError && error.status === 401)
        sessionStorage.removeItem(TOKEN_STORAGE_KEY);
      showSignInError(error);
    },
  );
}
