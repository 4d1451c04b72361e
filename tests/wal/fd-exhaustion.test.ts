// Out of file descriptors (CONTRACT §8): idle connections use up the process's table; the log still
// rolls segments and writes snapshots from the descriptors it reserved at start, and never fails; a
// call that cannot open its upstream connection is the gateway's failure (503), never a provider
// error billed.
import { afterAll, describe, expect, test } from 'bun:test';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type GatewayProcess, startGatewayProcess } from '../support/process.ts';

const ADMIN_TOKEN = 'fd-exhaustion-admin-token-01234';
const FD_LIMIT = 128;
const root = mkdtempSync(join(tmpdir(), 'tollgate-fds-'));
const running: GatewayProcess[] = [];
const sockets: Socket[] = [];

afterAll(async () => {
  for (const socket of sockets) socket.destroy();
  for (const gateway of running) if (gateway.proc.exitCode === null) await gateway.kill();
  rmSync(root, { recursive: true, force: true });
});

/**
 * One keep-alive HTTP/1.1 connection, opened while descriptors are plenty, used for requests in
 * order.
 */
class Connection {
  private buffered = Buffer.alloc(0);
  private waiter: (() => void) | null = null;
  private constructor(private readonly socket: Socket) {
    socket.on('data', (chunk: Buffer) => {
      this.buffered = Buffer.concat([this.buffered, chunk]);
      this.waiter?.();
    });
  }

  static open(url: string): Promise<Connection> {
    const { hostname, port } = new URL(url);
    return new Promise((resolve, reject) => {
      const socket = connect({ host: hostname, port: Number(port) }, () =>
        resolve(new Connection(socket)),
      );
      socket.once('error', reject);
      sockets.push(socket);
    });
  }

  async request(
    method: string,
    path: string,
    headers: Record<string, string>,
    body = '',
  ): Promise<{ status: number; body: string }> {
    let head =
      `${method} ${path} HTTP/1.1\r\nhost: ` +
      `gateway\r\ncontent-length: ${Buffer.byteLength(body)}\r\n`;
    for (const [name, value] of Object.entries(headers)) head += `${name}: ${value}\r\n`;
    this.socket.write(`${head}\r\n${body}`);
    for (;;) {
      const end = this.buffered.indexOf('\r\n\r\n');
      if (end !== -1) {
        const headText = this.buffered.subarray(0, end).toString('latin1');
        const length = Number(/content-length: *(\d+)/i.exec(headText)?.[1] ?? 0);
        if (this.buffered.length >= end + 4 + length) {
          const text = this.buffered.subarray(end + 4, end + 4 + length).toString('utf8');
          this.buffered = this.buffered.subarray(end + 4 + length);
          return { status: Number(headText.split(' ')[1]), body: text };
        }
      }
      await new Promise<void>((resolve) => (this.waiter = resolve));
    }
  }
}

function openDescriptors(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

describe('descriptor exhaustion', () => {
  test(
    'idle connections take every descriptor; segment rolls and snapshots still succeed, nothing ' +
      'is lost',
    async () => {
      const dataDir = join(root, 'data');
      const configPath = join(root, 'config.json');
      // A segment rolls every few records and a snapshot comes every 10: each needs a descriptor.
      writeFileSync(
        configPath,
        JSON.stringify({
          providers: {
            simulator: {
              type: 'simulator',
              ttft_ms: 0,
              tokens_per_second: 100_000,
              completion_tokens: 8,
            },
          },
          wal: { fsync: 'always', segment_bytes: 1_024, snapshot_every_records: 10 },
          limits: { default_rate_limit_rpm: 100_000, request_read_timeout_ms: 600_000 },
        }),
      );
      const env = { DATA_DIR: dataDir, ADMIN_TOKEN, GATEWAY_CONFIG: configPath };
      const gateway = await startGatewayProcess(env, [
        'sh',
        '-c',
        `ulimit -n ${FD_LIMIT}; exec "$0" "$@"`,
      ]);
      running.push(gateway);
      const connection = await Connection.open(gateway.url);
      const created = await connection.request(
        'POST',
        '/admin/v1/keys',
        { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
        JSON.stringify({ name: 'fds', credits: 100 }),
      );
      expect(created.status).toBe(201);
      const { key } = JSON.parse(created.body) as { key: string };
      const chat = (n: number) =>
        connection.request(
          'POST',
          '/api/v1/chat/completions',
          { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
          JSON.stringify({
            model: 'model_03',
            max_completion_tokens: 20,
            messages: [{ role: 'user', content: `n ${n}` }],
          }),
        );
      expect((await chat(0)).status).toBe(200);

      // Idle connections until the process has no descriptor left (watched, not waited for by
      // time).
      const pid = gateway.proc.pid;
      for (let opened = 0; openDescriptors(pid) < FD_LIMIT && opened < FD_LIMIT * 3; opened++) {
        const socket = connect({ host: '127.0.0.1', port: Number(new URL(gateway.url).port) });
        socket.on('error', () => {});
        socket.write('POST /api/v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n');
        sockets.push(socket);
        await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
        // Let the server's loop take the connection before counting again.
        for (let turn = 0; turn < 20 && openDescriptors(pid) < FD_LIMIT; turn++)
          await new Promise((resolve) => setImmediate(resolve));
      }
      expect(openDescriptors(pid)).toBe(FD_LIMIT);

      const ids: string[] = [];
      for (let n = 1; n <= 30; n++) {
        const answer = await chat(n);
        expect(answer.status).toBe(200);
        ids.push((JSON.parse(answer.body) as { id: string }).id);
      }
      expect((await connection.request('GET', '/readyz', {})).status).toBe(200);
      expect(gateway.lines.filter((line) => (line.level as number) >= 60)).toEqual([]);

      // Every answer is in the log: after a SIGKILL and a restart each is found, completed.
      await gateway.kill();
      for (const socket of sockets.splice(0)) socket.destroy();
      const second = await startGatewayProcess(env);
      running.push(second);
      for (const id of ids) {
        const status = await fetch(`${second.url}/api/v1/requests/${id}`, {
          headers: { authorization: `Bearer ${key}` },
        });
        expect(((await status.json()) as { request_status: string }).request_status).toBe(
          'completed',
        );
      }
    },
  );

  test(
    'a call that cannot open a connection to its upstream for want of descriptors is a 503 that ' +
      'charges nothing',
    async () => {
      // An upstream that closes every connection after its answer: each call needs a new
      // descriptor.
      const upstream = Bun.serve({
        port: 0,
        hostname: '127.0.0.1',
        async fetch(request) {
          await request.json();
          const completion = {
            id: 'x',
            object: 'chat.completion',
            created: 0,
            model: 'u',
            choices: [
              { index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' },
            ],
            usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 },
          };
          return new Response(JSON.stringify(completion), {
            headers: { 'content-type': 'application/json', connection: 'close' },
          });
        },
      });
      try {
        const dataDir = join(root, 'data-upstream');
        const configPath = join(root, 'config-upstream.json');
        writeFileSync(
          configPath,
          JSON.stringify({
            providers: { up: { type: 'openai', base_url: `http://127.0.0.1:${upstream.port}/v1` } },
            models: { model_03: { provider: 'up', upstream_model: 'u' } },
            limits: { default_rate_limit_rpm: 100_000, request_read_timeout_ms: 600_000 },
          }),
        );
        const gateway = await startGatewayProcess(
          { DATA_DIR: dataDir, ADMIN_TOKEN, GATEWAY_CONFIG: configPath },
          ['sh', '-c', `ulimit -n ${FD_LIMIT}; exec "$0" "$@"`],
        );
        running.push(gateway);
        const connection = await Connection.open(gateway.url);
        const created = await connection.request(
          'POST',
          '/admin/v1/keys',
          { authorization: `Bearer ${ADMIN_TOKEN}`, 'content-type': 'application/json' },
          JSON.stringify({ name: 'fds', credits: 100 }),
        );
        const { key, id } = JSON.parse(created.body) as { key: string; id: string };
        const chat = () =>
          connection.request(
            'POST',
            '/api/v1/chat/completions',
            { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
            JSON.stringify({ model: 'model_03', messages: [{ role: 'user', content: 'hi' }] }),
          );
        expect((await chat()).status).toBe(200);
        const pid = gateway.proc.pid;
        for (let opened = 0; openDescriptors(pid) < FD_LIMIT && opened < FD_LIMIT * 3; opened++) {
          const socket = connect({ host: '127.0.0.1', port: Number(new URL(gateway.url).port) });
          socket.on('error', () => {});
          socket.write('GET /healthz HTTP/1.1\r\nhost: gateway\r\n');
          sockets.push(socket);
          await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
          for (let turn = 0; turn < 20 && openDescriptors(pid) < FD_LIMIT; turn++)
            await new Promise((resolve) => setImmediate(resolve));
        }
        expect(openDescriptors(pid)).toBe(FD_LIMIT);
        const refused = await chat();
        expect(refused.status).toBe(503);
        expect(JSON.parse(refused.body)).toMatchObject({ error: { code: 'service_unavailable' } });
        const view = JSON.parse(
          (
            await connection.request('GET', `/admin/v1/keys/${id}`, {
              authorization: `Bearer ${ADMIN_TOKEN}`,
            })
          ).body,
        ) as { balances: { held: number; charged: number } };
        expect(view.balances.held).toBe(0);
        // Only the first call (2 tokens at model_03's rates) was charged.
        expect(view.balances.charged).toBeLessThan(0.001);
        await gateway.kill();
        for (const socket of sockets.splice(0)) socket.destroy();
      } finally {
        upstream.stop(true);
      }
    },
  );
});
