// The dashboard (CONTRACT §6, `/admin/`): one static page, its script and style and uPlot's, all
// embedded in the binary at build time (text imports) and served without a token: the page holds
// no data, and the token guards every admin API call the page makes.
import { createHash } from 'node:crypto';
import { Elysia } from 'elysia';
import uplotScript from 'uplot/dist/uPlot.iife.min.js' with { type: 'text' };
import uplotStyle from 'uplot/dist/uPlot.min.css' with { type: 'text' };
import { describeRoute } from '../../http/openapi.ts';
import { assert } from '../../util/assert.ts';
import { GatewayError } from '../../util/errors.ts';
import script from './app.js' with { type: 'text' };
import icon from './icon.svg' with { type: 'text' };
import pageImport from './page.html' with { type: 'text' };
import style from './style.css' with { type: 'text' };

/**
 * The page runs only its own files: no inline script or style, no other origin, no framing, and no
 * form may post anywhere (the sign-in form is handled by app.js; the token never leaves in a body).
 */
export const DASHBOARD_CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; " +
  "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; " +
  "frame-ancestors 'none'";

/**
 * A string (the text attribute), which TypeScript 7.0 does not read: it types every .html import as
 * Bun's HTMLBundle. The check below makes sure of it when the module loads.
 */
const pageTemplate = pageImport as unknown as string;
assert(typeof pageTemplate === 'string', 'page.html is not embedded as text');

const COMMON_HEADERS = {
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
};

interface Asset {
  /** The name the page uses: the file's own with its content's hash before the extension. */
  name: string;
  bytes: Uint8Array;
  headers: Record<string, string>;
}

const encoder = new TextEncoder();
const JS = 'text/javascript; charset=utf-8';
const CSS = 'text/css; charset=utf-8';
const FILES = [
  { name: 'app.js', text: script, type: JS },
  { name: 'style.css', text: style, type: CSS },
  { name: 'uPlot.iife.min.js', text: uplotScript, type: JS },
  { name: 'uPlot.min.css', text: uplotStyle, type: CSS },
  { name: 'icon.svg', text: icon, type: 'image/svg+xml' },
] as const;

/**
 * An asset served under a name that carries its content's hash, so a browser may keep it for good
 * (`immutable`) and the page of a new binary still loads its own files.
 */
function embed(file: { name: string; text: string; type: string }): Asset {
  assert(typeof file.text === 'string' && file.text.length > 0, `${file.name} is not embedded`);
  const hash = createHash('sha256').update(file.text).digest('hex').slice(0, 12);
  const dot = file.name.indexOf('.');
  return {
    name: `${file.name.slice(0, dot)}.${hash}${file.name.slice(dot)}`,
    bytes: encoder.encode(file.text),
    headers: {
      ...COMMON_HEADERS,
      'content-type': file.type,
      'cache-control': 'public, max-age=31536000, immutable',
    },
  };
}

const PAGE_DOC = describeRoute({
  summary: 'The dashboard (HTML); it signs in with the admin token by itself',
  tag: 'admin',
  auth: 'none',
  answers: { 200: { description: 'The page', content: { 'text/html': {} } } },
  errors: [],
});

const ASSET_DOC = describeRoute({
  summary: 'A file of the dashboard (script, style, icon), named by its content hash',
  tag: 'admin',
  auth: 'none',
  answers: { 200: { description: 'The file, cached for good (immutable)' } },
  errors: ['not_found'],
});

export function dashboardController() {
  const assets = new Map<string, Asset>();
  // The page names each file as `{{app.js}}`; it gets the hashed name.
  let html = pageTemplate;
  for (const file of FILES) {
    const asset = embed(file);
    assets.set(asset.name, asset);
    html = html.replaceAll(`{{${file.name}}}`, asset.name);
  }
  assert(!html.includes('{{'), 'the dashboard page names a file that is not embedded');
  const page = encoder.encode(html);
  const pageHeaders = {
    ...COMMON_HEADERS,
    'content-type': 'text/html; charset=utf-8',
    // Revalidated each time: the page names the assets of the binary that serves it.
    'cache-control': 'no-cache',
    'content-security-policy': DASHBOARD_CSP,
    'x-frame-options': 'DENY',
  };
  const servePage = () => new Response(page, { headers: pageHeaders });
  return (
    new Elysia({ name: 'dashboard' })
      // One operation in the document: both paths had the same operationId (getAdmin), which
      // OpenAPI forbids, and the document says every path is also served without its slash.
      .get('/admin', servePage, { detail: { hide: true } })
      .get('/admin/', servePage, { detail: PAGE_DOC })
      .get(
        '/admin/assets/:name',
        ({ params }) => {
          const asset = assets.get(params.name);
          if (asset === undefined)
            throw new GatewayError('not_found', `No dashboard asset ${params.name}.`);
          return new Response(asset.bytes, { headers: asset.headers });
        },
        { detail: ASSET_DOC },
      )
  );
}
