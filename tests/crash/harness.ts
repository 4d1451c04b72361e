// Crash loop: load a real gateway process, SIGKILL it on an event of the load (after N acknowledged
// finishes), restart it at once on the same data dir, check recovery. Never a timer: a busy machine
// changes how long things take, not what the kills hit, so the checks keep their meaning under any
// load. Shared by tests/crash/crash-loop.test.ts (≥ 20 cycles in `bun test`) and bench/soak.ts (the
// long soak).
import {
  closeSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const REPO_ROOT = resolve(import.meta.dir, '../..');
const SERVER_ENTRY = join(REPO_ROOT, 'src/main.ts');
const ADMIN_TOKEN = 'crash-loop-admin-token-0123456789';
const MICRO_PER_CREDIT = 1_000_000;
/**
 * model_03's catalogue rates: credits per 1M tokens, i.e. µcr per token (src/config/defaults.ts).
 */
const MODEL_03_RATES = { input: 5, output: 14 };
/**
 * No single request may take longer than this; a hang is reported as a violation, not waited out.
 */
const REQUEST_TIMEOUT_MS = 15_000;
/** A server that has not logged "tollgate listening" by then is reported as a failed start. */
const START_TIMEOUT_MS = 15_000;
/** Log lines kept per server process for a violation's context. */
const LOG_TAIL_LINES = 40;

/** A model whose answer takes about 2 s (40 tokens at 20/s): no kill ever waits for it to end. */
const SLOW_MODEL = 'model_03_slow';

/**
 * The brief's config: a slightly slow simulator (about 25 ms per answer) so that requests are in
 * flight when the kill lands, and fsync on every commit so that every acknowledgement is a promise
 * about disk. A second simulator streams for about 2 s behind SLOW_MODEL (model_03's rates, so
 * charges check alike): each cycle's slow stream is still running when the kill lands, whatever the
 * machine's load.
 */
export const CRASH_CONFIG = {
  providers: {
    simulator: { type: 'simulator', ttft_ms: 5, tokens_per_second: 2000, completion_tokens: 40 },
    slow_simulator: { type: 'simulator', ttft_ms: 5, tokens_per_second: 20, completion_tokens: 40 },
  },
  models: {
    [SLOW_MODEL]: {
      provider: 'slow_simulator',
      tools: true,
      top_k: false,
      seed: true,
      rates: MODEL_03_RATES,
      context_window: 400_000,
      max_output_tokens: 128_000,
      long_context: null,
      created: 0,
    },
  },
  wal: { fsync: 'always' },
};

/**
 * Keys with modest credits: model_03 without an output cap reserves ≈ 1.79 credits, so some
 * requests get 402. The slow key carries only the slow streams (a small hold each), so they are
 * never refused for credit.
 */
const KEY_PLANS = [
  { name: 'crash-roomy', creditsMicro: 8_000_000, slow: false },
  { name: 'crash-tight', creditsMicro: 2_500_000, slow: false },
  { name: 'crash-tiny', creditsMicro: 60_000, slow: false },
  { name: 'crash-slow', creditsMicro: 1_000_000, slow: true },
] as const;
/** The slow streams' output cap: a hold of ≈ 0.03 credits. */
const SLOW_STREAM_CAP = 2_000;

/**
 * Output caps a request may carry: none (the 128k model cap, ≈ 1.79 cr hold), a medium one, one
 * below the answer length.
 */
const OUTPUT_CAPS: readonly (number | null)[] = [null, null, 2_000, 30];
const WORDS = [
  'river',
  'stone',
  'light',
  'quiet',
  'garden',
  'signal',
  'answer',
  'token',
  'cloud',
  'bridge',
  'winter',
  'market',
];

export interface CrashLoopOptions {
  cycles: number;
  /**
   * Seed of the PRNGs that draw the load mix and the kill schedule; the same seed replays the same
   * plan.
   */
  seed: number;
  /** Concurrent chat requests per cycle (besides the slow stream). */
  requestsPerCycle?: number;
  /**
   * The kill lands when the load generator has seen N acknowledged finishes (a non-stream 200, a
   * stream's [DONE]) and the cycle's slow stream has been acknowledged; or, for N = 0, as soon as
   * the load is sent. N runs over 0..killAfterFinishesMax in a seeded order, each value once per
   * round of cycles.
   */
  killAfterFinishesMax?: number;
  /** Deep-merged over CRASH_CONFIG (e.g. a small wal.snapshot_every_records). */
  configOverrides?: Record<string, unknown>;
  /**
   * Old idempotency keys and records re-checked each cycle, besides this cycle's (all are checked
   * at the end).
   */
  historySamplePerCycle?: number;
  /** Progress lines (the soak prints them); silent when absent. */
  log?: (line: string) => void;
  /** Keep the data dir after the run (it is always kept when there are violations). */
  keepDataDir?: boolean;
}

export interface CrashLoopResult {
  seed: number;
  cycles: number;
  requestsSent: number;
  /** 200s (non-stream) and streams that delivered their 200 and chatcmpl id. */
  acknowledged: number;
  /** Acknowledged and complete: a full JSON body, or a stream that reached [DONE]. */
  completed: number;
  quotaRefused: number;
  /** Concurrent duplicates answered 409 request_in_progress while their twin ran. */
  duplicatesRefused: number;
  /** No HTTP status: cut off by the kill. */
  cutOff: number;
  topUps: { acknowledged: number; cutOff: number };
  idempotentRetriesChecked: number;
  recordsChecked: number;
  interruptedRecovered: number;
  /** Each cycle's N (kill after N acknowledged finishes). */
  killAfterFinishes: number[];
  /**
   * Distinct snapshots found in the data dir at the kills (the log's own,
   * `snapshot_every_records`).
   */
  snapshotsSeen: number;
  /** Log segments seen at one kill and gone at a later one (removed after a snapshot). */
  segmentsRemoved: number;
  statusCounts: Record<string, number>;
  violations: string[];
  dataDir: string;
  elapsedMs: number;
}

// ------------------------------------------------------------------------------------------
// PRNG

/** mulberry32: small, fast, and the same sequence for the same seed on every platform. */
export class SeededRandom {
  private state: number;
  constructor(seed: number) {
    this.state = seed >>> 0;
  }
  next(): number {
    this.state = (this.state + 0x6d2b79f5) >>> 0;
    let t = this.state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  }
  int(maxExclusive: number): number {
    return Math.floor(this.next() * maxExclusive);
  }
  chance(probability: number): boolean {
    return this.next() < probability;
  }
  pick<T>(items: readonly T[]): T {
    return items[this.int(items.length)]!;
  }
  sample<T>(items: readonly T[], count: number): T[] {
    if (items.length <= count) return [...items];
    const chosen = new Set<number>();
    while (chosen.size < count) chosen.add(this.int(items.length));
    return [...chosen].map((index) => items[index]!);
  }
}

// ------------------------------------------------------------------------------------------ the
// server

function toMicro(credits: unknown): number {
  if (typeof credits !== 'number' || !Number.isFinite(credits)) return Number.NaN;
  return Math.round(credits * MICRO_PER_CREDIT);
}

function deepMerge(base: unknown, override: unknown): unknown {
  const isObject = (v: unknown): v is Record<string, unknown> =>
    typeof v === 'object' && v !== null && !Array.isArray(v);
  if (!isObject(base) || !isObject(override)) return override;
  const merged: Record<string, unknown> = { ...base };
  for (const [key, value] of Object.entries(override))
    merged[key] = key in base ? deepMerge(base[key], value) : value;
  return merged;
}

/**
 * One `bun src/main.ts serve` process; its port is learned from the "tollgate listening" log line.
 */
export class ServerProcess {
  readonly logTail: string[] = [];
  /** Log lines at level error (50) or above: in a crash loop each one is a bug. */
  readonly errorLines: string[] = [];
  private stderrText = '';
  private constructor(
    readonly proc: ReturnType<typeof Bun.spawn>,
    private readonly stdoutDone: Promise<void>,
    private readonly stderrDone: Promise<void>,
  ) {}

  url = '';

  static async start(dataDir: string, configPath: string): Promise<ServerProcess> {
    const proc = Bun.spawn([process.execPath, SERVER_ENTRY, 'serve'], {
      cwd: REPO_ROOT,
      env: {
        ...process.env,
        PORT: '0',
        HOST: '127.0.0.1',
        DATA_DIR: dataDir,
        ADMIN_TOKEN,
        LOG_LEVEL: 'info',
        GATEWAY_CONFIG: configPath,
      },
      stdin: 'ignore',
      stdout: 'pipe',
      stderr: 'pipe',
    });
    const listening = Promise.withResolvers<string>();
    let server!: ServerProcess;
    const stdoutDone = (async () => {
      const decoder = new TextDecoder();
      let buffered = '';
      for await (const chunk of proc.stdout as ReadableStream<Uint8Array>) {
        buffered += decoder.decode(chunk, { stream: true });
        let newline = buffered.indexOf('\n');
        while (newline !== -1) {
          const line = buffered.slice(0, newline);
          buffered = buffered.slice(newline + 1);
          newline = buffered.indexOf('\n');
          if (line.length === 0) continue;
          server?.remember(line);
          try {
            const entry = JSON.parse(line) as { msg?: string; url?: string; level?: number };
            if (entry.msg === 'tollgate listening' && typeof entry.url === 'string')
              listening.resolve(entry.url);
            if ((entry.level ?? 0) >= 50) server?.errorLines.push(line);
          } catch {
            // Not a pino line (Bun itself printing something); kept in the tail only.
          }
        }
      }
      if (buffered.length > 0) server?.remember(buffered);
    })();
    const stderrDone = (async () => {
      const text = await new Response(proc.stderr as ReadableStream<Uint8Array>).text();
      if (server) server.stderrText = text;
    })();
    server = new ServerProcess(proc, stdoutDone, stderrDone);
    const timer = setTimeout(
      () =>
        listening.reject(new Error(`no "tollgate listening" line within ${START_TIMEOUT_MS} ms`)),
      START_TIMEOUT_MS,
    );
    void proc.exited.then((code) =>
      listening.reject(new Error(`server exited with code ${code} before listening`)),
    );
    try {
      server.url = await listening.promise;
    } catch (error) {
      proc.kill('SIGKILL');
      await proc.exited;
      await Promise.allSettled([stdoutDone, stderrDone]);
      throw new Error(`${(error as Error).message}\n${server.diagnostics()}`);
    } finally {
      clearTimeout(timer);
    }
    return server;
  }

  private remember(line: string): void {
    this.logTail.push(line);
    if (this.logTail.length > LOG_TAIL_LINES) this.logTail.shift();
  }

  /** True when the process ended on its own (it must only ever die by our SIGKILL). */
  get exitedOnItsOwn(): boolean {
    return this.proc.exitCode !== null;
  }

  async kill(): Promise<void> {
    this.proc.kill('SIGKILL');
    await this.proc.exited;
    await Promise.allSettled([this.stdoutDone, this.stderrDone]);
  }

  diagnostics(): string {
    return [
      `exit code ${this.proc.exitCode}, signal ${this.proc.signalCode}`,
      `stderr: ${this.stderrText.trim()}`,
      ...this.logTail.slice(-12),
    ].join('\n');
  }
}

// ------------------------------------------------------------------------------------------ the
// client

interface KeyHandle {
  id: string;
  secret: string;
}

interface Balances {
  creditsMicro: number;
  heldMicro: number;
  chargedMicro: number;
  addedMicro: number;
}

interface ChatPlan {
  index: number;
  key: KeyHandle;
  stream: boolean;
  idempotencyKey: string | null;
  body: string;
  /** Sent twice at once: the twin must be refused while the original runs. */
  duplicate: boolean;
  /**
   * The cycle's slow stream (SLOW_MODEL): the kill waits for its acknowledgement, never for its
   * end.
   */
  slow: boolean;
}

interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

interface ChatOutcome {
  plan: ChatPlan;
  status: number | null;
  requestId: string | null;
  /** The server committed to this request: a 200, or (streams) the chatcmpl id it sent. */
  acknowledged: boolean;
  /** The whole answer arrived: JSON body, or a stream through [DONE]. */
  complete: boolean;
  usage: Usage | null;
  errorCode: string | null;
  requestStatus: string | null;
  transportError: string | null;
}

/**
 * What a cycle learned about an acknowledged request, kept for later cycles and the final sweep.
 */
interface Remembered {
  cycle: number;
  plan: ChatPlan;
  requestId: string;
  /** The terminal status read after the first restart; it must never change afterwards. */
  status: string;
  chargedMicro: number;
}

function fetchWithTimeout(url: string, init: RequestInit = {}): Promise<Response> {
  return fetch(url, {
    ...init,
    keepalive: false,
    signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
  } as RequestInit);
}

function adminHeaders(): Record<string, string> {
  return { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' };
}

async function readJson(response: Response): Promise<any> {
  const text = await response.text();
  try {
    return JSON.parse(text);
  } catch {
    return { unparsed: text };
  }
}

async function createKey(baseUrl: string, name: string, creditsMicro: number): Promise<KeyHandle> {
  const response = await fetchWithTimeout(`${baseUrl}/admin/v1/keys`, {
    method: 'POST',
    headers: adminHeaders(),
    body: JSON.stringify({
      name,
      services: ['chat'],
      credits: creditsMicro / MICRO_PER_CREDIT,
      rate_limit_rpm: 1_000_000,
    }),
  });
  const body = await readJson(response);
  if (response.status !== 201)
    throw new Error(`creating key ${name}: ${response.status} ${JSON.stringify(body)}`);
  return { id: body.id, secret: body.key };
}

async function readBalances(baseUrl: string, keyId: string): Promise<Balances> {
  const response = await fetchWithTimeout(`${baseUrl}/admin/v1/keys/${keyId}`, {
    headers: adminHeaders(),
  });
  const body = await readJson(response);
  if (response.status !== 200)
    throw new Error(`reading key ${keyId}: ${response.status} ${JSON.stringify(body)}`);
  const b = body.balances ?? {};
  return {
    creditsMicro: toMicro(b.credits),
    heldMicro: toMicro(b.held),
    chargedMicro: toMicro(b.charged),
    addedMicro: toMicro(b.credits_added),
  };
}

/** What the load generator tells the kill trigger, the moment it sees it. */
interface LoadObserver {
  /** A 200: the server is committed to the request. */
  acknowledged(outcome: ChatOutcome): void;
  /**
   * An acknowledged request's whole answer: a non-stream 200 (sent once the finish is durable), a
   * stream's [DONE].
   */
  finished(outcome: ChatOutcome): void;
}

const UNOBSERVED: LoadObserver = { acknowledged() {}, finished() {} };

/**
 * Reads an SSE body to its end (or until the connection dies), noting the id, usage, [DONE] and
 * error events.
 */
async function readStream(
  response: Response,
  outcome: ChatOutcome,
  observer: LoadObserver,
): Promise<void> {
  const decoder = new TextDecoder();
  let buffered = '';
  const handle = (event: string) => {
    for (const line of event.split('\n')) {
      if (!line.startsWith('data: ')) continue;
      const data = line.slice(6);
      if (data === '[DONE]') {
        outcome.complete = true;
        observer.finished(outcome);
        continue;
      }
      const chunk = JSON.parse(data);
      if (chunk.error) outcome.errorCode = chunk.error.code ?? 'unknown';
      if (typeof chunk.id === 'string') outcome.requestId ??= chunk.id;
      if (chunk.usage) outcome.usage = chunk.usage;
    }
  };
  try {
    for await (const piece of response.body as ReadableStream<Uint8Array>) {
      buffered += decoder.decode(piece, { stream: true });
      let end = buffered.indexOf('\n\n');
      while (end !== -1) {
        handle(buffered.slice(0, end));
        buffered = buffered.slice(end + 2);
        end = buffered.indexOf('\n\n');
      }
    }
  } catch (error) {
    outcome.transportError = `stream cut: ${(error as Error).message}`;
  }
}

async function sendChat(
  baseUrl: string,
  plan: ChatPlan,
  observer: LoadObserver = UNOBSERVED,
): Promise<ChatOutcome> {
  const outcome: ChatOutcome = {
    plan,
    status: null,
    requestId: null,
    acknowledged: false,
    complete: false,
    usage: null,
    errorCode: null,
    requestStatus: null,
    transportError: null,
  };
  const headers: Record<string, string> = {
    authorization: `Bearer ${plan.key.secret}`,
    'content-type': 'application/json',
  };
  if (plan.idempotencyKey) headers['idempotency-key'] = plan.idempotencyKey;
  try {
    const response = await fetchWithTimeout(`${baseUrl}/api/v1/chat/completions`, {
      method: 'POST',
      headers,
      body: plan.body,
    });
    outcome.status = response.status;
    outcome.requestId = response.headers.get('x-request-id');
    if (response.status === 200) {
      // A 200 is sent only once the hold (and any Idempotency-Key binding) is durable: the server
      // is committed.
      outcome.acknowledged = true;
      observer.acknowledged(outcome);
      if (plan.stream) {
        await readStream(response, outcome, observer);
      } else {
        // A non-stream 200 is sent only after the terminal state is durable, even if its body is
        // then cut.
        outcome.complete = true;
        observer.finished(outcome);
        try {
          const body = (await response.json()) as { id?: unknown; usage?: Usage };
          outcome.usage = body.usage ?? null;
          if (typeof body.id === 'string') outcome.requestId = body.id;
        } catch (error) {
          outcome.transportError = `body cut: ${(error as Error).message}`;
        }
      }
    } else {
      const body = await readJson(response);
      outcome.errorCode = body?.error?.code ?? null;
      if (typeof body?.request_id === 'string') outcome.requestId = body.request_id;
      outcome.requestStatus = body?.request_status ?? null;
    }
  } catch (error) {
    outcome.transportError = (error as Error).message;
  }
  return outcome;
}

/** Sends a chat request again and reads the whole answer, whatever it is. */
async function retryChat(baseUrl: string, plan: ChatPlan): Promise<ChatOutcome> {
  return sendChat(baseUrl, plan);
}

async function readRecord(
  baseUrl: string,
  key: KeyHandle,
  requestId: string,
): Promise<{ status: number; body: any }> {
  const response = await fetchWithTimeout(`${baseUrl}/api/v1/requests/${requestId}`, {
    headers: { authorization: `Bearer ${key.secret}` },
  });
  return { status: response.status, body: await readJson(response) };
}

// -------------------------------------------------------------------------------------------- the
// loop

function planChat(
  random: SeededRandom,
  keys: KeyHandle[],
  seed: number,
  cycle: number,
  index: number,
): ChatPlan {
  const stream = random.chance(0.5);
  const withKey = random.chance(1 / 3);
  const cap = random.pick(OUTPUT_CAPS);
  const body: Record<string, unknown> = {
    model: 'model_03',
    messages: [
      {
        role: 'user',
        content:
          `crash loop ${seed} cycle ${cycle} request ${index}: ` +
          `${random.pick(WORDS)} ${random.pick(WORDS)}`,
      },
    ],
    stream,
  };
  if (cap !== null) body.max_completion_tokens = cap;
  return {
    index,
    key: random.pick(keys),
    stream,
    idempotencyKey: withKey ? `crash-${seed}-${cycle}-${index}` : null,
    body: JSON.stringify(body),
    duplicate: withKey && random.chance(0.25),
    slow: false,
  };
}

/**
 * The cycle's slow stream: acknowledged within milliseconds, answered in full only after about 2 s,
 * so a kill after its acknowledgement always cuts it mid-stream (its record must read
 * error/interrupted, charged 0). It carries no Idempotency-Key: a retry after restart would have to
 * wait out the whole answer.
 */
function planSlowStream(key: KeyHandle, seed: number, cycle: number, index: number): ChatPlan {
  const body = {
    model: SLOW_MODEL,
    messages: [{ role: 'user', content: `crash loop ${seed} cycle ${cycle}: the slow stream` }],
    stream: true,
    max_completion_tokens: SLOW_STREAM_CAP,
  };
  return {
    index,
    key,
    stream: true,
    idempotencyKey: null,
    body: JSON.stringify(body),
    duplicate: false,
    slow: true,
  };
}

/**
 * Resolves `moment` when the cycle's kill condition holds: N acknowledged finishes of the ordinary
 * load seen (or all of it settled, when fewer could finish), and the slow stream acknowledged (or
 * settled). Told by the load generator as it sees each event, so the kill lands between two events,
 * never at a time.
 */
class KillTrigger {
  readonly moment = Promise.withResolvers<void>();
  private finishes = 0;
  private openOrdinary = 0;
  private waitingSlow = 0;
  private readonly acknowledgedSlow = new Set<ChatOutcome>();
  readonly observer: LoadObserver = {
    acknowledged: (outcome) => {
      if (outcome.plan.slow) this.slowAnswered(outcome);
    },
    finished: (outcome) => {
      if (!outcome.plan.slow) this.finishes++;
      this.check();
    },
  };

  constructor(private readonly finishesWanted: number) {}

  /**
   * Registers one request of the load; its settling (answer, cut or timeout) is noted when `send`
   * resolves.
   */
  track(send: Promise<ChatOutcome>, slow: boolean): void {
    if (slow) this.waitingSlow++;
    else this.openOrdinary++;
    void send.then((outcome) => {
      if (slow) this.slowAnswered(outcome);
      else this.openOrdinary--;
      this.check();
    });
  }

  private slowAnswered(outcome: ChatOutcome): void {
    if (this.acknowledgedSlow.has(outcome)) return;
    this.acknowledgedSlow.add(outcome);
    this.waitingSlow--;
    this.check();
  }

  private check(): void {
    if ((this.finishes >= this.finishesWanted || this.openOrdinary === 0) && this.waitingSlow === 0)
      this.moment.resolve();
  }
}

/**
 * Each value of 0..max once per round, in an order drawn from `random`: every run covers every kind
 * of kill.
 */
function killSchedule(random: SeededRandom, max: number, cycles: number): number[] {
  const schedule: number[] = [];
  while (schedule.length < cycles) {
    const round = Array.from({ length: max + 1 }, (_, n) => n);
    for (let i = round.length - 1; i > 0; i--) {
      const j = random.int(i + 1);
      [round[i], round[j]] = [round[j]!, round[i]!];
    }
    schedule.push(...round);
  }
  return schedule.slice(0, cycles);
}

/**
 * What the log directory holds between a kill and the restart: the snapshot's seq and the segment
 * numbers.
 */
function readWalDir(dataDir: string): { snapshotSeq: number | null; segments: number[] } {
  const dir = join(dataDir, 'wal');
  const segments: number[] = [];
  let snapshotSeq: number | null = null;
  for (const name of readdirSync(dir)) {
    const segment = /^segment-(\d+)\.wal$/.exec(name);
    if (segment) segments.push(Number(segment[1]));
    if (name !== 'snapshot.json') continue;
    // Format 2 starts with a one-line JSON header holding `seq`; the state after it may be large.
    const fd = openSync(join(dir, name), 'r');
    const head = Buffer.alloc(4096);
    const bytes = readSync(fd, head, 0, head.length, 0);
    closeSync(fd);
    const line = head.subarray(0, bytes).toString('utf8').split('\n')[0]!;
    snapshotSeq = (JSON.parse(line) as { seq: number }).seq;
  }
  return { snapshotSeq, segments };
}

function expectedChargeMicro(usage: Usage, holdMicro: number): number {
  return Math.min(
    holdMicro,
    usage.prompt_tokens * MODEL_03_RATES.input + usage.completion_tokens * MODEL_03_RATES.output,
  );
}

/**
 * What the run's steps share: its settings, the live server, the keys, what earlier cycles learned,
 * and the result being filled.
 */
interface Loop {
  options: CrashLoopOptions;
  requestsPerCycle: number;
  historySample: number;
  log: (line: string) => void;
  random: SeededRandom;
  schedule: number[];
  dataDir: string;
  configPath: string;
  result: CrashLoopResult;
  /** The cycle under way (options.cycles + 1 in the final sweep): violations name it. */
  cycle: number;
  /** Null between a kill and the restart. */
  server: ServerProcess | null;
  keys: KeyHandle[];
  loadKeys: KeyHandle[];
  slowKey: KeyHandle;
  /**
   * What each key's ledger must show: the last observed balances, to bound the next cycle's
   * changes.
   */
  last: Map<string, Balances>;
  snapshotSeqs: Set<number>;
  segmentsSeen: Set<number>;
  rememberedIdempotent: Remembered[];
  rememberedRecords: Remembered[];
}

/** A top-up sent with a cycle's load; `promise` tells whether it was acknowledged (a 200). */
interface TopUp {
  keyId: string;
  creditsMicro: number;
  promise: Promise<boolean>;
}

/** One cycle's load and what the load generator saw of it by the kill. */
interface CycleLoad {
  /** The balances at the cycle's start. */
  before: Map<string, Balances>;
  killAfterFinishes: number;
  topUps: TopUp[];
  outcomes: ChatOutcome[];
  /** Per top-up, in order: acknowledged or not. */
  topUpResults: boolean[];
  /** The killed process, for its log if the restart fails. */
  dead: ServerProcess;
}

/** A cycle's load once the server is back: what every check after the restart reads. */
interface Restarted extends CycleLoad {
  url: string;
  /** The prefix of this cycle's violation messages. */
  when: string;
  /** The balances first read after the restart. */
  after: Map<string, Balances>;
}

export async function runCrashLoop(options: CrashLoopOptions): Promise<CrashLoopResult> {
  const startedMs = performance.now();
  const loop = await openLoop(options);
  try {
    for (loop.cycle = 1; loop.cycle <= options.cycles; loop.cycle++) {
      if (!(await runCycle(loop))) break;
    }
    if (loop.server && loop.result.cycles === options.cycles) await finalSweep(loop, loop.server);
  } finally {
    if (loop.server) await loop.server.kill();
    loop.result.elapsedMs = Math.round(performance.now() - startedMs);
    if (loop.result.violations.length === 0 && !options.keepDataDir)
      rmSync(loop.result.dataDir, { recursive: true, force: true });
  }
  return loop.result;
}

/** The run's setup: the data dir and config, the kill schedule, a first server and its keys. */
async function openLoop(options: CrashLoopOptions): Promise<Loop> {
  const random = new SeededRandom(options.seed);
  // Its own generator: how many draws the checks make depends on what the kills hit, the schedule
  // must not.
  const schedule = killSchedule(
    new SeededRandom(options.seed ^ 0x6b696c6c),
    options.killAfterFinishesMax ?? 8,
    options.cycles,
  );
  const dataRoot = mkdtempSync(join(tmpdir(), 'tollgate-crash-'));
  const dataDir = join(dataRoot, 'data');
  const configPath = join(dataRoot, 'config.json');
  writeFileSync(configPath, JSON.stringify(deepMerge(CRASH_CONFIG, options.configOverrides ?? {})));
  const result = emptyResult(options.seed, schedule, dataRoot);
  const server = await ServerProcess.start(dataDir, configPath);
  const keys: KeyHandle[] = [];
  const last = new Map<string, Balances>();
  for (const plan of KEY_PLANS) {
    const key = await createKey(server.url, plan.name, plan.creditsMicro);
    keys.push(key);
    last.set(key.id, await readBalances(server.url, key.id));
  }
  return {
    options,
    requestsPerCycle: options.requestsPerCycle ?? 16,
    historySample: options.historySamplePerCycle ?? 6,
    log: options.log ?? (() => {}),
    random,
    schedule,
    dataDir,
    configPath,
    result,
    cycle: 0,
    server,
    keys,
    loadKeys: keys.filter((_, i) => !KEY_PLANS[i]!.slow),
    slowKey: keys[KEY_PLANS.findIndex((plan) => plan.slow)]!,
    last,
    snapshotSeqs: new Set(),
    segmentsSeen: new Set(),
    rememberedIdempotent: [],
    rememberedRecords: [],
  };
}

function emptyResult(seed: number, schedule: number[], dataRoot: string): CrashLoopResult {
  return {
    seed,
    cycles: 0,
    requestsSent: 0,
    acknowledged: 0,
    completed: 0,
    quotaRefused: 0,
    duplicatesRefused: 0,
    cutOff: 0,
    topUps: { acknowledged: 0, cutOff: 0 },
    idempotentRetriesChecked: 0,
    recordsChecked: 0,
    interruptedRecovered: 0,
    killAfterFinishes: schedule,
    snapshotsSeen: 0,
    segmentsRemoved: 0,
    statusCounts: {},
    violations: [],
    dataDir: dataRoot,
    elapsedMs: 0,
  };
}

/** Notes a broken promise and goes on, so that one bug does not hide the next. */
function violation(loop: Loop, message: string): void {
  loop.result.violations.push(`cycle ${loop.cycle} (seed ${loop.options.seed}): ${message}`);
  loop.log(`VIOLATION cycle ${loop.cycle}: ${message}`);
}

/**
 * The ledger of every key: the invariant to the µcr, nothing held while nothing runs, nothing
 * negative.
 */
async function checkLedgers(
  loop: Loop,
  baseUrl: string,
  when: string,
): Promise<Map<string, Balances>> {
  const now = new Map<string, Balances>();
  for (const key of loop.keys) {
    const b = await readBalances(baseUrl, key.id);
    now.set(key.id, b);
    const values = [b.creditsMicro, b.heldMicro, b.chargedMicro, b.addedMicro];
    if (!values.every(Number.isSafeInteger))
      violation(loop, `${when}: key ${key.id} balances are not whole µcr: ${JSON.stringify(b)}`);
    if (b.addedMicro !== b.creditsMicro + b.heldMicro + b.chargedMicro) {
      violation(
        loop,
        `${when}: key ${key.id} ledger broken: added ${b.addedMicro} ≠ balance ` +
          `${b.creditsMicro} + held ${b.heldMicro} + charged ${b.chargedMicro}`,
      );
    }
    if (b.creditsMicro < 0 || b.heldMicro < 0 || b.chargedMicro < 0)
      violation(loop, `${when}: key ${key.id} has a negative balance: ${JSON.stringify(b)}`);
    if (b.heldMicro !== 0)
      violation(
        loop,
        `${when}: key ${key.id} still holds ${b.heldMicro} µcr with nothing in flight`,
      );
  }
  return now;
}

/** A remembered record must still read back with the same terminal status and charge. */
async function checkRemembered(
  loop: Loop,
  baseUrl: string,
  entry: Remembered,
  when: string,
): Promise<void> {
  loop.result.recordsChecked++;
  const { status, body } = await readRecord(baseUrl, entry.plan.key, entry.requestId);
  if (status !== 200)
    return violation(
      loop,
      `${when}: record ${entry.requestId} (cycle ${entry.cycle}) no longer readable: ` +
        `${status} ${JSON.stringify(body)}`,
    );
  if (
    body.request_status !== entry.status ||
    toMicro(body.charged_credits) !== entry.chargedMicro
  ) {
    violation(
      loop,
      `${when}: record ${entry.requestId} (cycle ${entry.cycle}) changed: was ` +
        `${entry.status}/${entry.chargedMicro} µcr, now ` +
        `${body.request_status}/${toMicro(body.charged_credits)} µcr`,
    );
  }
}

/** A retry of an acknowledged Idempotency-Key: 409 naming the original, never a new task. */
async function checkRetry(
  loop: Loop,
  baseUrl: string,
  entry: Remembered,
  when: string,
): Promise<void> {
  loop.result.idempotentRetriesChecked++;
  const retry = await retryChat(baseUrl, entry.plan);
  const ok =
    retry.status === 409 &&
    (retry.errorCode === 'request_already_completed' ||
      retry.errorCode === 'request_in_progress') &&
    retry.requestId === entry.requestId;
  if (!ok) {
    violation(
      loop,
      `${when}: retry of Idempotency-Key ${entry.plan.idempotencyKey} (original ` +
        `${entry.requestId}, cycle ${entry.cycle}) answered ` +
        `${retry.status} ${retry.errorCode ?? ''} ` +
        `request_id=${retry.requestId} ${retry.transportError ?? ''}`,
    );
  } else if (retry.requestStatus !== entry.status) {
    violation(
      loop,
      `${when}: retry of ${entry.plan.idempotencyKey} reports status ${retry.requestStatus}, ` +
        `the record says ${entry.status}`,
    );
  }
}

/** One cycle: the load, the kill, the restart and the checks; false when the restart failed. */
async function runCycle(loop: Loop): Promise<boolean> {
  const load = await loadAndKill(loop);
  noteWalDir(loop);
  // Restart on the same data dir at once (no sleep, no retry): the kernel lock died with the
  // process.
  try {
    loop.server = await ServerProcess.start(loop.dataDir, loop.configPath);
  } catch (error) {
    violation(
      loop,
      `restart failed after the kill: ${(error as Error).message}\nlast ` +
        `log of the killed process:\n${load.dead.diagnostics()}`,
    );
    return false;
  }
  const url = loop.server.url;
  const when = `after kill at finish ${load.killAfterFinishes}`;
  const cycle: Restarted = { ...load, url, when, after: await checkLedgers(loop, url, when) };
  checkLedgerBounds(loop, cycle);
  const idempotentOutcomes = await checkOutcomes(loop, cycle);
  const unacknowledged = await checkIdempotency(loop, cycle, idempotentOutcomes);
  for (const plan of unacknowledged) await retryCutOff(loop, cycle, plan);
  await endCycle(loop, url, when);
  return true;
}

/**
 * The cycle's load (concurrent chat requests, some sent twice at once, now and then a top-up) and
 * the kill on its event; returns what the load generator saw.
 */
async function loadAndKill(loop: Loop): Promise<CycleLoad> {
  const server = loop.server!;
  const before = new Map(loop.last);
  const plans = Array.from({ length: loop.requestsPerCycle }, (_, index) =>
    planChat(loop.random, loop.loadKeys, loop.options.seed, loop.cycle, index),
  );
  plans.push(planSlowStream(loop.slowKey, loop.options.seed, loop.cycle, loop.requestsPerCycle));
  const topUps = planTopUps(loop, before);
  const killAfterFinishes = loop.schedule[loop.cycle - 1]!;
  const trigger = new KillTrigger(killAfterFinishes);
  const sends = sendLoad(server.url, plans, topUps, trigger);
  // N = 0: the kill follows the sends within the same turn, before the server can answer
  // anything. Otherwise the kill lands the moment the load generator sees the cycle's event.
  if (killAfterFinishes > 0) await trigger.moment.promise;
  if (server.exitedOnItsOwn)
    violation(loop, `the server exited on its own during load:\n${server.diagnostics()}`);
  await server.kill();
  for (const line of server.errorLines) violation(loop, `the server logged an error: ${line}`);
  loop.server = null;
  const outcomes = await Promise.all(sends);
  const topUpResults = await Promise.all(topUps.map((t) => t.promise));
  loop.result.requestsSent += sends.length;
  return { before, killAfterFinishes, topUps, outcomes, topUpResults, dead: server };
}

/** At most one top-up per key and cycle, drawn so that balances stay near the plan's. */
function planTopUps(loop: Loop, before: Map<string, Balances>): TopUp[] {
  const topUps: TopUp[] = [];
  for (const key of loop.keys) {
    const b = before.get(key.id)!;
    const plan = KEY_PLANS[loop.keys.indexOf(key)]!;
    // Balances stay near the plan's, so the same share of requests meets 402 in cycle 500 as in
    // cycle 5; amounts are arbitrary µcr, so that any rounding of credits on the way would show
    // in the ledger check.
    let creditsMicro = 0;
    if (b.creditsMicro < plan.creditsMicro / 2)
      creditsMicro = plan.creditsMicro - b.creditsMicro + loop.random.int(1_000) + 1;
    else if (b.creditsMicro < plan.creditsMicro && loop.random.chance(0.1))
      creditsMicro = loop.random.int(plan.creditsMicro - b.creditsMicro) + 1;
    if (creditsMicro > 0)
      topUps.push({ keyId: key.id, creditsMicro, promise: Promise.resolve(false) });
  }
  return topUps;
}

/**
 * Sends the chats and top-ups without awaiting anything, so that a kill at N = 0 follows them in
 * the same turn.
 */
function sendLoad(
  baseUrl: string,
  plans: ChatPlan[],
  topUps: TopUp[],
  trigger: KillTrigger,
): Promise<ChatOutcome>[] {
  const sends: Promise<ChatOutcome>[] = [];
  for (const plan of plans) {
    for (let copy = plan.duplicate ? 2 : 1; copy > 0; copy--) {
      const send = sendChat(baseUrl, plan, trigger.observer);
      trigger.track(send, plan.slow);
      sends.push(send);
    }
  }
  for (const topUp of topUps) {
    topUp.promise = fetchWithTimeout(`${baseUrl}/admin/v1/keys/${topUp.keyId}/credits`, {
      method: 'POST',
      headers: adminHeaders(),
      body: JSON.stringify({ credits: topUp.creditsMicro / MICRO_PER_CREDIT }),
    }).then(
      async (response) => {
        await response.arrayBuffer().catch(() => {});
        return response.status === 200;
      },
      () => false,
    );
  }
  return sends;
}

/** What the log kept on disk: snapshots taken and segments they let go, whatever the kill hit. */
function noteWalDir(loop: Loop): void {
  const wal = readWalDir(loop.dataDir);
  if (wal.snapshotSeq !== null) loop.snapshotSeqs.add(wal.snapshotSeq);
  for (const index of [...loop.segmentsSeen]) {
    if (wal.segments.includes(index)) continue;
    loop.segmentsSeen.delete(index);
    loop.result.segmentsRemoved++;
  }
  for (const index of wal.segments) loop.segmentsSeen.add(index);
  loop.result.snapshotsSeen = loop.snapshotSeqs.size;
}

/** 1. The bounds the acknowledged work sets on every key's ledger (its invariant is checked). */
function checkLedgerBounds(loop: Loop, cycle: Restarted): void {
  for (const key of loop.keys) {
    const b0 = cycle.before.get(key.id)!;
    const b1 = cycle.after.get(key.id)!;
    let ackedTopUpMicro = 0;
    let cutTopUpMicro = 0;
    cycle.topUps.forEach((t, i) => {
      if (t.keyId !== key.id) return;
      if (cycle.topUpResults[i]) ackedTopUpMicro += t.creditsMicro;
      else cutTopUpMicro += t.creditsMicro;
    });
    const addedDelta = b1.addedMicro - b0.addedMicro;
    // An acknowledged top-up is durable; one cut off by the kill may or may not have been
    // written. At most one top-up per key and cycle, so the change is exactly one of two
    // amounts.
    if (addedDelta !== ackedTopUpMicro && addedDelta !== ackedTopUpMicro + cutTopUpMicro) {
      violation(
        loop,
        `${cycle.when}: key ${key.id} credits_added moved by ${addedDelta} µcr; acknowledged ` +
          `top-ups ${ackedTopUpMicro}, cut off ${cutTopUpMicro}`,
      );
    }
    if (b1.chargedMicro < b0.chargedMicro)
      violation(
        loop,
        `${cycle.when}: key ${key.id} charged went down ` +
          `from ${b0.chargedMicro} to ${b1.chargedMicro}`,
      );
  }
  loop.result.topUps.acknowledged += cycle.topUpResults.filter(Boolean).length;
  loop.result.topUps.cutOff += cycle.topUpResults.filter((ok) => !ok).length;
}

/**
 * 2. Every request the server acknowledged has a durable record; counts what happened. Returns the
 * outcomes per Idempotency-Key, for step 3.
 */
async function checkOutcomes(loop: Loop, cycle: Restarted): Promise<Map<string, ChatOutcome[]>> {
  const chargedByKey = new Map<string, number>();
  const idempotentOutcomes = new Map<string, ChatOutcome[]>();
  for (const outcome of cycle.outcomes) {
    countOutcome(loop, outcome);
    if (outcome.plan.idempotencyKey) {
      const list = idempotentOutcomes.get(outcome.plan.idempotencyKey) ?? [];
      list.push(outcome);
      idempotentOutcomes.set(outcome.plan.idempotencyKey, list);
    }
    if (!outcome.acknowledged) continue;
    loop.result.acknowledged++;
    if (outcome.complete) loop.result.completed++;
    if (!outcome.requestId) {
      violation(loop, `request ${outcome.plan.index} was acknowledged without a request id`);
      continue;
    }
    const chargedMicro = await checkAcknowledged(loop, cycle, outcome, outcome.requestId);
    if (chargedMicro === null) continue;
    const keyId = outcome.plan.key.id;
    chargedByKey.set(keyId, (chargedByKey.get(keyId) ?? 0) + chargedMicro);
  }
  // Charges of acknowledged requests are part of the key's charged total (others may add to it,
  // never subtract).
  for (const key of loop.keys) {
    const grew = cycle.after.get(key.id)!.chargedMicro - cycle.before.get(key.id)!.chargedMicro;
    const known = chargedByKey.get(key.id) ?? 0;
    if (grew < known)
      violation(
        loop,
        `${cycle.when}: key ${key.id} charged grew by ${grew} µcr, but acknowledged requests ` +
          `were charged ${known}`,
      );
  }
  return idempotentOutcomes;
}

/** Counts one outcome by status; answers no request may get before the kill are violations. */
function countOutcome(loop: Loop, outcome: ChatOutcome): void {
  const result = loop.result;
  const label = outcome.status === null ? 'cut' : String(outcome.status);
  result.statusCounts[label] = (result.statusCounts[label] ?? 0) + 1;
  if (outcome.status === null) result.cutOff++;
  if (outcome.status === 402) result.quotaRefused++;
  if (outcome.status !== null && outcome.status >= 500) {
    violation(
      loop,
      `request ${outcome.plan.index} answered ${outcome.status} ${outcome.errorCode} ` +
        `before the kill`,
    );
  }
  // A twin that arrives while the original runs is in progress; one that arrives after it,
  // already completed.
  const twinRefusal =
    outcome.errorCode === 'request_in_progress' ||
    outcome.errorCode === 'request_already_completed';
  if (outcome.status === 409 && outcome.plan.duplicate && twinRefusal) result.duplicatesRefused++;
  else if (outcome.status === 409)
    violation(loop, `request ${outcome.plan.index} answered 409 ${outcome.errorCode} during load`);
  if (outcome.errorCode && outcome.status === 200) {
    violation(
      loop,
      `stream ${outcome.requestId} ended with an error event ${outcome.errorCode} before ` +
        `the kill`,
    );
  }
}

/**
 * An acknowledged request's record after the restart: readable, and its status and charge what the
 * answer promised. Remembers it for later cycles; returns its charge (null when unreadable).
 */
async function checkAcknowledged(
  loop: Loop,
  cycle: Restarted,
  outcome: ChatOutcome,
  requestId: string,
): Promise<number | null> {
  loop.result.recordsChecked++;
  const { status, body } = await readRecord(cycle.url, outcome.plan.key, requestId);
  if (status !== 200) {
    violation(
      loop,
      `${cycle.when}: acknowledged request ${requestId} is not readable after restart: ` +
        `${status} ${JSON.stringify(body)}`,
    );
    return null;
  }
  const chargedMicro = toMicro(body.charged_credits);
  checkRecordStatus(loop, cycle.when, outcome, body);
  loop.rememberedRecords.push({
    cycle: loop.cycle,
    plan: outcome.plan,
    requestId,
    status: body.request_status,
    chargedMicro,
  });
  return chargedMicro;
}

/**
 * A complete answer's record is completed and charged for its usage; a cut one's is completed
 * within its hold or error/interrupted and charged nothing.
 */
function checkRecordStatus(loop: Loop, when: string, outcome: ChatOutcome, body: any): void {
  const recordStatus: string = body.request_status;
  const chargedMicro = toMicro(body.charged_credits);
  const reservedMicro = toMicro(body.reserved_credits);
  const id = outcome.requestId;
  if (outcome.complete) {
    if (recordStatus !== 'completed')
      violation(
        loop,
        `${when}: request ${id} answered in full but its record is ${recordStatus}/` +
          `${body.error_code}`,
      );
    if (!outcome.usage) return;
    if (JSON.stringify(body.usage) !== JSON.stringify(outcome.usage)) {
      violation(
        loop,
        `${when}: request ${id} usage ${JSON.stringify(outcome.usage)} ` +
          `but the record has ${JSON.stringify(body.usage)}`,
      );
    }
    const expected = expectedChargeMicro(outcome.usage, reservedMicro);
    if (chargedMicro !== expected)
      violation(
        loop,
        `${when}: request ${id} charged ${chargedMicro} µcr, its usage costs ${expected}`,
      );
  } else if (recordStatus === 'completed') {
    if (chargedMicro > reservedMicro)
      violation(
        loop,
        `${when}: request ${id} charged ${chargedMicro} above its hold ${reservedMicro}`,
      );
  } else if (recordStatus === 'error' && body.error_code === 'interrupted') {
    loop.result.interruptedRecovered++;
    if (chargedMicro !== 0)
      violation(loop, `${when}: interrupted request ${id} was charged ${chargedMicro} µcr`);
  } else {
    violation(
      loop,
      `${when}: stream ${id} cut by the kill ended as ` +
        `${recordStatus}/${body.error_code}, expected completed or error/interrupted`,
    );
  }
}

/**
 * 3. Idempotency: twins never both ran; acknowledged keys answer 409 on retry and charge nothing
 *    more. Returns the plans whose key no answer acknowledged, for step 4.
 */
async function checkIdempotency(
  loop: Loop,
  cycle: Restarted,
  idempotentOutcomes: Map<string, ChatOutcome[]>,
): Promise<ChatPlan[]> {
  const retriesNow: Remembered[] = [];
  const unacknowledged: ChatPlan[] = [];
  for (const [idempotencyKey, list] of idempotentOutcomes) {
    const acked = list.filter((o) => o.acknowledged);
    if (acked.length > 1)
      violation(
        loop,
        `Idempotency-Key ${idempotencyKey} ran twice: ` +
          `${acked.map((o) => o.requestId).join(', ')}`,
      );
    const refused = list.find((o) => o.status === 409 && o.requestId);
    if (acked.length === 1) {
      const entry = loop.rememberedRecords.find((r) => r.requestId === acked[0]!.requestId);
      if (entry) {
        loop.rememberedIdempotent.push(entry);
        retriesNow.push(entry);
      }
      if (refused && refused.requestId !== acked[0]!.requestId) {
        violation(
          loop,
          `Idempotency-Key ${idempotencyKey}: the twin was told ${refused.requestId}, the ` +
            `original is ${acked[0]!.requestId}`,
        );
      }
    } else if (refused) {
      const entry = await readRefusedTwin(loop, cycle, idempotencyKey, refused);
      if (entry) retriesNow.push(entry);
      else unacknowledged.push(refused.plan);
    } else if (list.some((o) => o.status === null)) {
      unacknowledged.push(list[0]!.plan);
    }
  }
  await retryAcknowledged(loop, cycle, retriesNow);
  return unacknowledged;
}

/**
 * The twin learned the original's id (a 409 is an acknowledgement that the request exists) but the
 * original's own answer was cut off. Its record must exist; the status is read like any other.
 * Returns the record remembered, or null when it does not exist.
 */
async function readRefusedTwin(
  loop: Loop,
  cycle: Restarted,
  idempotencyKey: string,
  refused: ChatOutcome,
): Promise<Remembered | null> {
  loop.result.recordsChecked++;
  const { status, body } = await readRecord(cycle.url, refused.plan.key, refused.requestId!);
  if (status !== 200) {
    violation(
      loop,
      `${cycle.when}: Idempotency-Key ${idempotencyKey}: a 409 ${refused.errorCode} named ` +
        `request ${refused.requestId}, ` +
        `which does not exist after restart (${status} ${body?.error?.code}); the ` +
        `binding was acknowledged before it was durable`,
    );
    return null;
  }
  const entry = remembered(loop.cycle, refused.plan, refused.requestId!, body);
  if (body.request_status === 'error' && body.error_code === 'interrupted')
    loop.result.interruptedRecovered++;
  loop.rememberedRecords.push(entry);
  loop.rememberedIdempotent.push(entry);
  return entry;
}

/** What a cycle keeps of a record it read: its terminal status and charge. */
function remembered(cycle: number, plan: ChatPlan, requestId: string, body: any): Remembered {
  return {
    cycle,
    plan,
    requestId,
    status: body.request_status,
    chargedMicro: toMicro(body.charged_credits),
  };
}

/**
 * Retries this cycle's acknowledged keys and a sample of older ones, re-reads a sample of older
 * records; the retries must charge nothing.
 */
async function retryAcknowledged(
  loop: Loop,
  cycle: Restarted,
  retriesNow: Remembered[],
): Promise<void> {
  const { url, when, after } = cycle;
  const older = loop.random.sample(
    loop.rememberedIdempotent.filter((r) => r.cycle < loop.cycle),
    loop.historySample,
  );
  for (const entry of [...retriesNow, ...older]) await checkRetry(loop, url, entry, when);
  for (const entry of loop.random.sample(
    loop.rememberedRecords.filter((r) => r.cycle < loop.cycle),
    loop.historySample,
  )) {
    await checkRemembered(loop, url, entry, when);
  }
  const afterRetries = await checkLedgers(loop, url, `${when}, after idempotent retries`);
  for (const key of loop.keys) {
    if (afterRetries.get(key.id)!.chargedMicro !== after.get(key.id)!.chargedMicro) {
      violation(
        loop,
        `${when}: retries of acknowledged Idempotency-Keys changed key ${key.id}'s charged ` +
          `total from ${after.get(key.id)!.chargedMicro} ` +
          `to ${afterRetries.get(key.id)!.chargedMicro}`,
      );
    }
  }
}

/**
 * 4. A key whose first attempt was cut before any answer may or may not be bound; either way a
 *    retry yields exactly one task: a 409 naming a readable record, or a new 200 (the first never
 *    became durable).
 */
async function retryCutOff(loop: Loop, cycle: Restarted, plan: ChatPlan): Promise<void> {
  const { url, when } = cycle;
  const retry = await retryChat(url, plan);
  loop.result.idempotentRetriesChecked++;
  if (retry.status === 409) {
    if (
      !retry.requestId ||
      (retry.errorCode !== 'request_already_completed' && retry.errorCode !== 'request_in_progress')
    ) {
      return violation(
        loop,
        `${when}: retry of cut-off ${plan.idempotencyKey} answered 409 ${retry.errorCode} ` +
          `without a usable request_id`,
      );
    }
    const { status, body } = await readRecord(url, plan.key, retry.requestId);
    if (status !== 200)
      violation(
        loop,
        `${when}: retry of ${plan.idempotencyKey} names ${retry.requestId}, which is not ` +
          `readable (${status})`,
      );
    else loop.rememberedIdempotent.push(remembered(loop.cycle, plan, retry.requestId, body));
  } else if (retry.status === 200 && retry.acknowledged && retry.complete && retry.requestId) {
    const { status, body } = await readRecord(url, plan.key, retry.requestId);
    if (status === 200) {
      loop.rememberedIdempotent.push(remembered(loop.cycle, plan, retry.requestId, body));
      loop.rememberedRecords.push(remembered(loop.cycle, plan, retry.requestId, body));
    } else {
      violation(
        loop,
        `${when}: retry of ${plan.idempotencyKey} completed as ${retry.requestId}, which ` +
          `is not readable (${status})`,
      );
    }
  } else if (retry.status !== 402) {
    violation(
      loop,
      `${when}: retry of cut-off ${plan.idempotencyKey} answered ${retry.status} ` +
        `${retry.errorCode} ${retry.transportError ?? ''}`,
    );
  }
}

/** The next cycle's baseline, read once everything above has settled; progress every 25 cycles. */
async function endCycle(loop: Loop, url: string, when: string): Promise<void> {
  const { result, cycle, options } = loop;
  const settled = await checkLedgers(loop, url, `${when}, end of cycle`);
  for (const [id, b] of settled) loop.last.set(id, b);
  result.cycles = cycle;
  if (cycle % 25 === 0 || cycle === options.cycles) {
    loop.log(
      `cycle ${cycle}/${options.cycles}: sent ${result.requestsSent}, acknowledged ` +
        `${result.acknowledged}, completed ${result.completed}, ` +
        `402 ${result.quotaRefused}, cut ${result.cutOff}, interrupted ` +
        `${result.interruptedRecovered}, violations ${result.violations.length}`,
    );
  }
}

/**
 * The final sweep, against the last server: every acknowledged key and every record, not a
 * sample.
 */
async function finalSweep(loop: Loop, server: ServerProcess): Promise<void> {
  loop.cycle = loop.options.cycles + 1;
  const url = server.url;
  const before = await checkLedgers(loop, url, 'final sweep');
  for (const entry of loop.rememberedIdempotent) await checkRetry(loop, url, entry, 'final sweep');
  for (const entry of loop.rememberedRecords)
    await checkRemembered(loop, url, entry, 'final sweep');
  const after = await checkLedgers(loop, url, 'final sweep, after retries');
  for (const key of loop.keys) {
    if (after.get(key.id)!.chargedMicro !== before.get(key.id)!.chargedMicro) {
      violation(
        loop,
        `final sweep: retries changed key ${key.id}'s charged total from ` +
          `${before.get(key.id)!.chargedMicro} to ${after.get(key.id)!.chargedMicro}`,
      );
    }
  }
  for (const line of server.errorLines) violation(loop, `the server logged an error: ${line}`);
}

/** One line per number, for the soak's summary and a failing test's message. */
export function summarize(result: CrashLoopResult): string {
  return [
    `seed ${result.seed}: ${result.cycles} cycles in ${(result.elapsedMs / 1000).toFixed(1)} s`,
    `requests sent ${result.requestsSent}, acknowledged ${result.acknowledged} (complete ` +
      `${result.completed}), ` +
      `402 ${result.quotaRefused}, duplicate 409 ${result.duplicatesRefused}, cut off before ` +
      `an answer ${result.cutOff}`,
    `recovered as interrupted ${result.interruptedRecovered}; top-ups acknowledged ` +
      `${result.topUps.acknowledged}, cut off ${result.topUps.cutOff}`,
    `checked: idempotent retries ${result.idempotentRetriesChecked}, ` +
      `records ${result.recordsChecked}`,
    `statuses ${JSON.stringify(result.statusCounts)}`,
    `violations ${result.violations.length}${
      result.violations.length > 0 ? ` (data kept in ${result.dataDir})` : ''
    }`,
    ...result.violations.slice(0, 20).map((v) => `  - ${v}`),
  ].join('\n');
}
