// One key attacks, another key works: the victim's latency and the gateway's event-loop delay
// during each attack of CONTRACT §8 (measured here, never asserted in tests; tests/hostile asserts
// the behaviour).
//
// Usage: bun bench/attacks.ts [--seconds 6] [--only <phase name part>]      (npm run bench:attacks)
// Starts a fake upstream, a hostile upstream and tollgate (pinned to core 0; this process and the
// upstreams on core 1). Each phase runs the victim's load (4 loops of non-stream calls) beside one
// attack; prints a table and writes bench/results/attacks.md.
import { writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import {
  ADMIN_TOKEN,
  BUN,
  CORE_GATEWAY,
  CORE_LOAD,
  cleanup,
  fmt,
  installSignalCleanup,
  percentile,
  pinned,
  ROOT,
  rssMiB,
  type Service,
  startService,
  startUpstreamProcess,
  table,
  tempDir,
} from './lib.ts';

const SECONDS = Number(process.argv[process.argv.indexOf('--seconds') + 1] || 6);
/** `--only <text>`: the phases whose name contains it (and the baseline). */
const ONLY = process.argv.includes('--only')
  ? process.argv[process.argv.indexOf('--only') + 1]!
  : null;
const VICTIM_LOOPS = 4;
const MIB = 1024 * 1024;

interface Phase {
  name: string;
  /** What the attacker does, started beside the victim; resolves when `stop` is set. */
  attack(ctx: Context): Promise<void>;
}

interface Context {
  url: string;
  victimKey: string;
  brokeKey: string;
  attackerKey: string;
  stop: boolean;
  attackRequests: number;
  attackCodes: Map<string, number>;
}

async function post(
  url: string,
  key: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<Response> {
  return fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
}

async function count(ctx: Context, response: Response): Promise<void> {
  ctx.attackRequests++;
  let code = String(response.status);
  if (response.status !== 200) {
    try {
      code =
        `${response.status} ` +
        `${((await response.json()) as { error: { code: string } }).error.code}`;
    } catch {
      // not our envelope
    }
  } else await response.arrayBuffer().catch(() => {});
  ctx.attackCodes.set(code, (ctx.attackCodes.get(code) ?? 0) + 1);
}

/** `n` loops of `once` until the phase ends. */
async function loops(ctx: Context, n: number, once: (i: number) => Promise<void>): Promise<void> {
  await Promise.all(
    Array.from({ length: n }, async (_, loop) => {
      for (let i = 0; !ctx.stop; i++) await once(loop * 1_000_000 + i).catch(() => {});
    }),
  );
}

const WORDS = ['river', 'stone', 'light', 'quiet', 'garden', 'signal', 'answer', 'token'];
const FOUR_MB_PROMPT = (() => {
  const parts: string[] = [];
  let length = 0;
  for (let i = 0; length < 4 * MIB - 1024; i++) {
    const word = WORDS[i % WORDS.length]!;
    parts.push(word);
    length += word.length + 1;
  }
  return parts.join(' ');
})();

function rawConnection(url: string): Socket {
  const { hostname, port } = new URL(url);
  const socket = connect({ host: hostname, port: Number(port) });
  socket.on('error', () => {});
  return socket;
}

const PHASES: Phase[] = [
  { name: 'baseline (no attack)', attack: async () => {} },
  {
    name: '4 MB prompts, zero credit (model_01)',
    attack: (ctx) =>
      loops(ctx, 4, async () => {
        await count(
          ctx,
          await post(`${ctx.url}/api/v1/chat/completions`, ctx.brokeKey, {
            model: 'model_01',
            messages: [{ role: 'user', content: FOUR_MB_PROMPT }],
          }),
        );
      }),
  },
  {
    name: 'retention flood (a new Idempotency-Key each)',
    attack: (ctx) =>
      loops(ctx, 8, async (i) => {
        await count(
          ctx,
          await post(
            `${ctx.url}/api/v1/chat/completions`,
            ctx.attackerKey,
            { model: 'model_03', messages: [{ role: 'user', content: 'flood' }] },
            { 'idempotency-key': `flood-${i}-${Date.now()}` },
          ),
        );
      }),
  },
  {
    name: 'refusal flood (unknown models, bad JSON)',
    attack: (ctx) =>
      loops(ctx, 8, async (i) => {
        const body =
          i % 2 === 0
            ? { model: `m-${i}-${'z'.repeat(100)}`, messages: [{ role: 'user', content: 'x' }] }
            : '{"model":';
        await count(ctx, await post(`${ctx.url}/api/v1/chat/completions`, ctx.attackerKey, body));
      }),
  },
  {
    name: 'tool schema bomb (minItems 1e8, simulator)',
    attack: (ctx) =>
      loops(ctx, 4, async () => {
        const tools = [
          {
            type: 'function',
            function: {
              name: 'bomb',
              parameters: {
                type: 'object',
                properties: {
                  a: { type: 'array', minItems: 1e8, items: { type: 'string', minLength: 1000 } },
                },
                required: ['a'],
              },
            },
          },
        ];
        await count(
          ctx,
          await post(`${ctx.url}/api/v1/chat/completions`, ctx.attackerKey, {
            model: 'model_04',
            tool_choice: 'required',
            tools,
            messages: [{ role: 'user', content: 'x' }],
          }),
        );
      }),
  },
  {
    name: 'hostile upstream (huge, endless, big event, bad usage, many deltas)',
    attack: (ctx) =>
      loops(ctx, 6, async (i) => {
        const models = (
          process.env.HOSTILE_MODELS ?? 'model_05,model_06,model_08,model_10,model_11'
        ).split(',');
        const model = models[i % models.length]!;
        const response = await post(`${ctx.url}/api/v1/chat/completions`, ctx.attackerKey, {
          model,
          stream: i % 2 === 0,
          messages: [{ role: 'user', content: 'x' }],
        });
        await count(ctx, response);
      }),
  },
  {
    name: 'slowloris (1,000 connections trickling headers)',
    attack: async (ctx) => {
      const open = new Set<Socket>();
      const opened = () => {
        if (ctx.stop) return;
        const socket = rawConnection(ctx.url);
        open.add(socket);
        ctx.attackRequests++;
        socket.write('POST /api/v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n');
        const trickle = setInterval(() => socket.write('x'), 500);
        socket.once('close', () => {
          clearInterval(trickle);
          open.delete(socket);
          ctx.attackCodes.set(
            'closed by the gateway',
            (ctx.attackCodes.get('closed by the gateway') ?? 0) + (ctx.stop ? 0 : 1),
          );
          opened();
        });
      };
      for (let i = 0; i < 1_000; i++) opened();
      while (!ctx.stop) await Bun.sleep(100);
      for (const socket of open) socket.destroy();
    },
  },
  {
    name: 'stuck stream readers (100 streams never read)',
    attack: async (ctx) => {
      const open = new Set<Socket>();
      const body = JSON.stringify({
        model: 'model_07',
        stream: true,
        messages: [{ role: 'user', content: 'talk a lot' }],
      });
      const opened = () => {
        if (ctx.stop) return;
        const socket = rawConnection(ctx.url);
        open.add(socket);
        ctx.attackRequests++;
        socket.write(
          `POST /api/v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer ` +
            `${ctx.attackerKey}\r\ncontent-type: application/json\r\ncontent-length: ` +
            `${Buffer.byteLength(body)}\r\n\r\n${body}`,
        );
        socket.pause(); // never read a byte
        socket.once('close', () => {
          open.delete(socket);
          ctx.attackCodes.set(
            'closed by the gateway',
            (ctx.attackCodes.get('closed by the gateway') ?? 0) + (ctx.stop ? 0 : 1),
          );
          opened();
        });
      };
      for (let i = 0; i < 100; i++) opened();
      while (!ctx.stop) await Bun.sleep(100);
      for (const socket of open) socket.destroy();
    },
  },
];

async function scrapeLoopDelayMs(url: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  return Number(/^tollgate_event_loop_delay_max_seconds (\S+)$/m.exec(text)?.[1] ?? NaN) * 1000;
}

async function createKey(url: string, credits: number): Promise<string> {
  const response = await fetch(`${url}/admin/v1/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
    body: JSON.stringify({ name: 'bench', credits }),
  });
  return ((await response.json()) as { key: string }).key;
}

/** The gateway, pinned to its core, with the fake and the hostile upstream as its providers. */
async function startGateway(upstreamUrl: string, hostileUrl: string): Promise<Service> {
  const dir = tempDir('attacks');
  const configPath = join(dir, 'config.json');
  const on = (upstreamModel: string) => ({ provider: 'hostile', upstream_model: upstreamModel });
  writeFileSync(
    configPath,
    JSON.stringify({
      providers: {
        fake: { type: 'openai', base_url: `${upstreamUrl}/v1` },
        hostile: { type: 'openai', base_url: `${hostileUrl}/v1` },
        simulator: {
          type: 'simulator',
          ttft_ms: 0,
          tokens_per_second: 1_000_000,
          completion_tokens: 4_000,
        },
      },
      models: {
        model_03: { provider: 'fake', upstream_model: 'up' },
        model_05: on('huge'),
        model_06: on('endless'),
        model_08: on('bigevent'),
        model_10: on('badusage'),
        model_11: on('manydeltas'),
      },
      wal: { fsync: 'always' },
      limits: {
        default_rate_limit_rpm: 100_000_000,
        idempotency_keys_max: 5_000,
        request_records_max: 5_000,
        request_read_timeout_ms: 2_000,
        stream_timeout_ms: 3_000,
      },
    }),
  );
  return startService('tollgate', pinned(CORE_GATEWAY, [BUN, 'src/main.ts', 'serve']), {
    env: {
      PORT: '0',
      DATA_DIR: join(dir, 'data'),
      ADMIN_TOKEN,
      LOG_LEVEL: 'info',
      GATEWAY_CONFIG: configPath,
    },
    readyMsg: 'tollgate listening',
  });
}

const VICTIM_BODY = { model: 'model_03', messages: [{ role: 'user', content: 'victim' }] };
/** The victim's own Idempotency-Key binding, made before every attack: it must survive them all. */
const VICTIM_BINDING = { 'idempotency-key': 'victim-binding-0001' };

/**
 * The victim's load until `endMs`: VICTIM_LOOPS loops of calls, each call's latency kept; failed
 * calls are counted, and what they were goes to `victimErrors`.
 */
async function victimLoad(
  ctx: Context,
  endMs: number,
  victimErrors: Set<string>,
): Promise<{ latenciesMs: number[]; errors: number }> {
  const latenciesMs: number[] = [];
  let errors = 0;
  await Promise.all(
    Array.from({ length: VICTIM_LOOPS }, async () => {
      while (performance.now() < endMs) {
        const startMs = performance.now();
        const response = await post(
          `${ctx.url}/api/v1/chat/completions`,
          ctx.victimKey,
          VICTIM_BODY,
        ).catch((error: Error) => {
          victimErrors.add(error.message);
          return null;
        });
        if (response === null || response.status !== 200) errors++;
        if (response !== null && response.status !== 200)
          victimErrors.add(`HTTP ${response.status}`);
        await response?.arrayBuffer().catch(() => {});
        latenciesMs.push(performance.now() - startMs);
      }
    }),
  );
  return { latenciesMs, errors };
}

/** One phase: its attack beside the victim's load for SECONDS; the table row and the RSS peak. */
async function runPhase(
  phase: Phase,
  ctxBase: Omit<Context, 'stop' | 'attackRequests' | 'attackCodes'>,
  gatewayPid: number,
  victimErrors: Set<string>,
): Promise<{ row: string[]; rssPeak: number }> {
  const ctx: Context = { ...ctxBase, stop: false, attackRequests: 0, attackCodes: new Map() };
  await scrapeLoopDelayMs(ctx.url); // resets the worst delay
  let rssPeak = rssMiB(gatewayPid);
  const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, rssMiB(gatewayPid))), 100);
  const attack = phase.attack(ctx);
  const endMs = performance.now() + SECONDS * 1000;
  const { latenciesMs, errors } = await victimLoad(ctx, endMs, victimErrors);
  const loopDelayMs = await scrapeLoopDelayMs(ctx.url);
  ctx.stop = true;
  await attack;
  clearInterval(sampler);
  const codes = [...ctx.attackCodes]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 3)
    .map(([code, n]) => `${code} ×${n}`)
    .join(', ');
  process.stderr.write(
    `bench: ${phase.name}: victim p99 ${fmt(percentile(latenciesMs, 99))} ms, loop delay ` +
      `${fmt(loopDelayMs, 1)} ms\n`,
  );
  const row = [
    phase.name,
    String(latenciesMs.length),
    fmt(percentile(latenciesMs, 50)),
    fmt(percentile(latenciesMs, 99)),
    fmt(Math.max(...latenciesMs)),
    String(errors),
    fmt(loopDelayMs, 1),
    fmt(rssPeak, 0),
    `${ctx.attackRequests}${codes ? ` (${codes})` : ''}`,
  ];
  return { row, rssPeak };
}

const HEADER = [
  'phase',
  'victim calls',
  'p50 ms',
  'p99 ms',
  'max ms',
  'victim errors',
  'loop delay max ms',
  'gateway RSS peak MiB',
  'attack requests (top codes)',
];

async function main(): Promise<void> {
  installSignalCleanup();
  const upstream = await startUpstreamProcess();
  const hostile = await startService(
    'hostile upstream',
    pinned(CORE_LOAD, [BUN, 'bench/hostile-upstream.ts', '0']),
    { readyMsg: 'hostile upstream listening' },
  );
  const gateway = await startGateway(upstream.url, hostile.url);
  const ctxBase = {
    url: gateway.url,
    victimKey: await createKey(gateway.url, 1_000_000_000),
    brokeKey: await createKey(gateway.url, 0),
    attackerKey: await createKey(gateway.url, 1_000_000_000),
  };
  const completions = `${gateway.url}/api/v1/chat/completions`;
  const bound = await post(completions, ctxBase.victimKey, VICTIM_BODY, VICTIM_BINDING);
  const boundId = bound.headers.get('x-request-id');
  await bound.arrayBuffer();

  const rows: string[][] = [];
  /** What the victim's failed calls were, all phases together. */
  const victimErrors = new Set<string>();
  const rssStart = rssMiB(gateway.pid);
  let rssPeakAll = rssStart;
  for (const phase of PHASES.filter((p, i) => i === 0 || ONLY === null || p.name.includes(ONLY))) {
    const { row, rssPeak } = await runPhase(phase, ctxBase, gateway.pid, victimErrors);
    rows.push(row);
    rssPeakAll = Math.max(rssPeakAll, rssPeak);
  }
  const retry = await post(completions, ctxBase.victimKey, VICTIM_BODY, VICTIM_BINDING);
  const bindingKept = retry.status === 409 && retry.headers.get('x-request-id') === boundId;
  const binding = bindingKept ? 'kept (409 naming the original)' : `LOST (${retry.status})`;
  const report = [
    `# Attacks (bench/attacks.ts, ${SECONDS} s per ` +
      `phase, ${new Date().toISOString().slice(0, 10)})`,
    '',
    `Victim: ${VICTIM_LOOPS} loops of non-stream model_03 calls on a fake upstream; fsync ` +
      `always; gateway on core ${CORE_GATEWAY}, the rest on core ${CORE_LOAD}.`,
    `Victim errors were: ${[...victimErrors].join('; ') || 'none'}.`,
    `Target: the loop delay stays ≤ 50 ms in every phase. Victim's Idempotency-Key binding ` +
      `after every attack: ${binding}. RSS at start ${fmt(rssStart, 0)} MiB, peak ` +
      `${fmt(rssPeakAll, 0)} MiB, after ${fmt(rssMiB(gateway.pid), 0)} MiB.`,
    '',
    table(HEADER, rows),
    '',
  ].join('\n');
  console.log(report);
  writeFileSync(join(ROOT, 'bench/results/attacks.md'), report);
}

try {
  await main();
} finally {
  await cleanup();
}
