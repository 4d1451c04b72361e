// Micro benchmarks (mitata) of the per-request and per-chunk hot paths, each on its own.
//
// Usage: bun bench/micro.ts [filter-regex]   (BENCH_JSON=1 prints one JSON line: [{name, avgNs,
// p50Ns, p99Ns}]) What is measured, with the inputs the whole-server benchmark sends:
//   SSE parse of one upstream chunk (SseParser.feed), the chunk rewrite (ChunkEncoder.text), and
//   the
//   whole per-chunk relay (feed + JSON.parse + rewrite); request validation (validateChatRequest
//   with the
//   default config); the Idempotency-Key fingerprint (requestFingerprint); token counts of 1 KB and
//   100 KB of text (countTextTokens) and a prompt seen before (the count cache); WAL append per
//   fsync
//   policy, one at a time and 32 at once (group commit); the o200k_base counter (bpe.ts) beside
//   gpt-tokenizer, which it replaced, on chat-sized and long texts; per provider adapter (openai,
//   anthropic) the request body, one 20-chunk stream from the fake upstream parsed and translated,
//   and one whole answer.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { bench, do_not_optimize, group, run } from 'mitata';
import { countBpeTokens } from '../src/billing/bpe.ts';
import { countPromptTokens, countTextTokens } from '../src/billing/tokens.ts';
import { validateChatRequest } from '../src/chat/model.ts';
import { ChunkEncoder } from '../src/chat/sse.ts';
import { defaultConfig } from '../src/config/defaults.ts';
import { requestFingerprint } from '../src/idempotency/fingerprint.ts';
import { anthropicDialect } from '../src/providers/anthropic/index.ts';
import { parseJson } from '../src/providers/http/answer.ts';
import type { Dialect } from '../src/providers/http/http-provider.ts';
import { OPENAI_DIALECT } from '../src/providers/openai/index.ts';
import type { Delta, ProviderRequest } from '../src/providers/provider.ts';
import { createLogger } from '../src/util/log.ts';
import { SseParser } from '../src/util/sse-parse.ts';
import { type FsyncPolicy, WriteAheadLog } from '../src/wal/log.ts';
import {
  ANTHROPIC_STREAM_FRAMES,
  COMPLETION_JSON,
  MESSAGE_JSON,
  STREAM_FRAMES,
} from './upstream.ts';
import { benchRecord } from './wal.ts';

export interface MicroResult {
  name: string;
  avgNs: number;
  p50Ns: number;
  p99Ns: number;
  /** Items per iteration (e.g. 32 appends): per-item time is avg / perIteration. */
  perIteration: number;
}

const encoder = new TextEncoder();

const UPSTREAM_CHUNK = encoder.encode(
  `data: ${JSON.stringify({
    id: 'chatcmpl-bench',
    object: 'chat.completion.chunk',
    created: 1_767_225_600,
    model: 'up',
    choices: [{ index: 0, delta: { content: 'tok07 ' }, finish_reason: null }],
  })}\n\n`,
);

const SMALL_BODY = {
  model: 'model_03',
  messages: [{ role: 'user', content: 'hello' }],
  max_completion_tokens: 64,
};
const TOOLS_BODY = {
  model: 'model_03',
  max_completion_tokens: 256,
  temperature: 0.2,
  messages: [
    { role: 'system', content: 'You are a helpful assistant that answers briefly.' },
    ...Array.from({ length: 9 }, (_, i) => [
      { role: 'user', content: `Question ${i}: what is the weather like in city number ${i}?` },
      { role: 'assistant', content: `It is sunny in city ${i}, about ${15 + i} degrees.` },
    ]).flat(),
    { role: 'user', content: 'And tomorrow?' },
  ],
  tools: Array.from({ length: 4 }, (_, i) => ({
    type: 'function',
    function: {
      name: `tool_${i}`,
      description: `Tool number ${i} looks things up.`,
      parameters: {
        type: 'object',
        properties: { city: { type: 'string' }, days: { type: 'integer' } },
        required: ['city'],
      },
    },
  })),
};

/** Deterministic English-like text of about `bytes` bytes (a fixed word list, an LCG to pick). */
export function prose(bytes: number): string {
  const words = [
    'the',
    'gateway',
    'streams',
    'tokens',
    'from',
    'an',
    'upstream',
    'model',
    'and',
    'bills',
    'each',
    'request',
    'in',
    'micro-credits',
    'while',
    'a',
    'write-ahead',
    'log',
    'keeps',
    'every',
    'fact',
    'durable',
    'across',
    'crashes,',
    'restarts',
    'or',
    'timeouts.',
    'Latency',
    'matters:',
    '42',
    'ms',
    'is',
    'too',
    'slow!',
    'naïve',
    'café',
    '東京',
  ];
  let seed = 12_345;
  let out = '';
  while (out.length < bytes) {
    seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648;
    out += `${words[seed % words.length]} `;
  }
  return out.slice(0, bytes);
}

const logger = createLogger('silent');
const walDirs: string[] = [];
const wals: WriteAheadLog[] = [];

function openWal(policy: FsyncPolicy): WriteAheadLog {
  const dir = mkdtempSync(join(tmpdir(), `tollgate-bench-micro-wal-${policy}-`));
  walDirs.push(dir);
  const wal = WriteAheadLog.open(
    { dir, fsync: policy, fsyncIntervalMs: 10, segmentBytes: 64 * 1024 * 1024, logger },
    { loadSnapshot() {}, applyRecord() {} },
  );
  wals.push(wal);
  return wal;
}

const WAL_RECORD = benchRecord(0, 1_767_225_600_000);

/** The request the whole-server benchmark sends, as the chat service hands it to a provider. */
const PROVIDER_REQUEST: ProviderRequest = {
  model: 'up',
  messages: [{ role: 'user', content: 'hello' }],
  maxOutputTokens: 64,
  outputCapTokens: 64,
  temperature: null,
  topP: null,
  topK: null,
  seed: null,
  stop: null,
  tools: null,
  toolChoice: null,
  promptTokens: 9,
  stream: true,
};

/**
 * What the HTTP provider's relay does with one whole streamed answer, socket reads to deltas
 * (http-provider.ts relaySse, without the socket and the turns): each write of the fake upstream
 * fed to the SSE parser, each event parsed and translated.
 */
function relayStream(dialect: Dialect, frames: readonly Uint8Array[], out: Delta[]): Delta {
  const parser = new SseParser();
  const translator = dialect.streamTranslator('bench', Number.MAX_SAFE_INTEGER);
  for (const frame of frames) {
    for (const data of parser.feed(frame)) {
      if (data === '[DONE]' || translator.ended) break;
      translator.translate(parseJson(data, 'bench'), out);
    }
    out.length = 0;
  }
  return translator.finish();
}

const PER_ITERATION: Record<string, number> = {};

/**
 * Texts for the counter against gpt-tokenizer: what a chat request carries (a greeting, a
 * question, a message of a few sentences, a tool list) and long texts (code with unicode, prose).
 */
function counterTexts(): Array<[name: string, text: string]> {
  const code =
    'function total(items) {\n  // 合計を返す 🙂\n' +
    '  return items.reduce((sum, x) => sum + x.price, 0);\n}\n';
  return [
    ['"hello"', 'hello'],
    ['question, 60 chars', 'What is the weather like in city number 7 tomorrow morning?'],
    ['message, 600 chars', prose(600)],
    ['tools JSON, 4 tools', JSON.stringify(TOOLS_BODY.tools)],
    ['code + unicode, 4 KB', code.repeat(Math.ceil(4096 / code.length)).slice(0, 4096)],
    ['prose, 100 KB', prose(100 * 1024)],
  ];
}

async function register(): Promise<void> {
  // Loaded here, not at the top: its 400,000 objects would weigh on every other benchmark's GC.
  const reference = await import('gpt-tokenizer/encoding/o200k_base');
  // As tokens.ts configured it before bpe.ts replaced it.
  reference.setMergeCacheSize(2_000);
  const asText = { disallowedSpecial: new Set<string>() };
  const config = defaultConfig();
  const chunkEncoder = new ChunkEncoder('chatcmpl-0123456789abcdefghij', 1_767_225_600, 'model_03');
  const parser = new SseParser();
  const relayParser = new SseParser();
  const text1k = prose(1024);
  const text100k = prose(100 * 1024);

  group('stream, per chunk', () => {
    bench('sse parse (SseParser.feed, 1 chunk)', () =>
      do_not_optimize(parser.feed(UPSTREAM_CHUNK)),
    );
    bench('chunk rewrite (ChunkEncoder.text)', () => do_not_optimize(chunkEncoder.text('tok07 ')));
    bench('relay: feed + JSON.parse + rewrite', () => {
      const events = relayParser.feed(UPSTREAM_CHUNK);
      for (const data of events) {
        const chunk = JSON.parse(data) as { choices: Array<{ delta: { content: string } }> };
        do_not_optimize(chunkEncoder.text(chunk.choices[0]!.delta.content));
      }
    });
  });

  // The two adapters on the fake upstream's own answers (same text, usage and writes): the cost the
  // provider adds per request beyond the exchange they share (issue 14).
  const anthropic = anthropicDialect({ version: '2023-06-01' });
  const out: Delta[] = [];
  for (const [name, dialect, frames, json] of [
    ['openai', OPENAI_DIALECT, STREAM_FRAMES, COMPLETION_JSON],
    ['anthropic', anthropic, ANTHROPIC_STREAM_FRAMES, MESSAGE_JSON],
  ] as const) {
    group(`provider adapter: ${name}`, () => {
      bench(`${name}: request body (dialect.body + JSON.stringify)`, () =>
        do_not_optimize(JSON.stringify(dialect.body(PROVIDER_REQUEST))),
      );
      bench(`${name}: one 20-chunk stream, parsed and translated`, () =>
        do_not_optimize(relayStream(dialect, frames, out)),
      );
      bench(`${name}: one whole answer, parsed and translated`, () =>
        do_not_optimize(dialect.completion(JSON.parse(json), 'bench')),
      );
    });
  }

  group('per request', () => {
    bench('validateChatRequest (1 message)', () =>
      do_not_optimize(validateChatRequest(SMALL_BODY, config)),
    );
    bench('validateChatRequest (20 messages, 4 tools)', () =>
      do_not_optimize(validateChatRequest(TOOLS_BODY, config)),
    );
    bench('requestFingerprint (1 message)', () =>
      do_not_optimize(requestFingerprint('POST', '/api/v1/chat/completions', SMALL_BODY)),
    );
    bench('requestFingerprint (20 messages, 4 tools)', () =>
      do_not_optimize(requestFingerprint('POST', '/api/v1/chat/completions', TOOLS_BODY)),
    );
  });

  // countTextTokens is the tokenizer alone; countPromptTokens looks prompt texts up in the count
  // cache first, and the "seen before" case measures that lookup (a system prompt or history resent
  // every turn).
  const seenMessages = [{ role: 'user' as const, content: text1k }];
  group('tokenizer', () => {
    bench('countTextTokens 1 KB', () => do_not_optimize(countTextTokens(text1k)));
    bench('countTextTokens 100 KB', () => do_not_optimize(countTextTokens(text100k)));
    bench('countPromptTokens 1 KB message, seen before', () =>
      do_not_optimize(countPromptTokens(seenMessages, null)),
    );
  });

  // The same texts through the o200k_base counter and through gpt-tokenizer (the count alone, no
  // slicing or cache of tokens.ts): the counter is on the request path, it must not be slower.
  for (const [name, text] of counterTexts()) {
    group(`o200k count: ${name}`, () => {
      bench(`bpe.ts countBpeTokens, ${name}`, () => do_not_optimize(countBpeTokens(text)));
      bench(`gpt-tokenizer countTokens, ${name}`, () =>
        do_not_optimize(reference.countTokens(text, asText)),
      );
    });
  }

  group('wal append + group commit', () => {
    for (const policy of ['always', 'interval', 'off'] as const) {
      const wal = openWal(policy);
      bench(`wal append x1 (fsync ${policy})`, async () => {
        await wal.append(WAL_RECORD);
      });
      const name = `wal append x32 together (fsync ${policy})`;
      PER_ITERATION[name] = 32;
      bench(name, async () => {
        const pending: Promise<void>[] = [];
        for (let i = 0; i < 32; i++) pending.push(wal.append(WAL_RECORD));
        await Promise.all(pending);
      });
    }
  });
}

async function closeWals(): Promise<void> {
  for (const wal of wals) await wal.close();
  for (const dir of walDirs) rmSync(dir, { recursive: true, force: true });
  wals.length = 0;
  walDirs.length = 0;
}

/** Runs every micro benchmark quietly and returns the figures (ns per iteration). */
export async function runMicro(filter?: RegExp): Promise<MicroResult[]> {
  await register();
  try {
    const { benchmarks } = await run({ format: 'quiet', ...(filter ? { filter } : {}) });
    const results: MicroResult[] = [];
    for (const trial of benchmarks) {
      for (const r of trial.runs) {
        if (!r.stats) continue;
        results.push({
          name: r.name,
          avgNs: r.stats.avg,
          p50Ns: r.stats.p50,
          p99Ns: r.stats.p99,
          perIteration: PER_ITERATION[r.name] ?? 1,
        });
      }
    }
    return results;
  } finally {
    await closeWals();
  }
}

if (import.meta.main) {
  const filter = process.argv[2] ? new RegExp(process.argv[2]) : undefined;
  if (process.env.BENCH_JSON === '1') {
    console.log(JSON.stringify(await runMicro(filter)));
  } else {
    await register();
    try {
      await run(filter ? { filter } : {});
    } finally {
      await closeWals();
    }
  }
}
