// Refusals are cheap (CONTRACT §8): a flood of refused requests writes nothing and keeps nothing.
import { describe, expect, test } from 'bun:test';
import { randomBase62 } from '../../src/util/ids.ts';
import { bearer, chatBody, closedAfterEach } from '../support/gateway.ts';

const t = closedAfterEach();

describe('a flood of refused requests', () => {
  test('leaves the log, the record table and the victim untouched', async () => {
    const gateway = t.gateway({ limits: { default_rate_limit_rpm: 1_000_000 } });
    const attacker = await gateway.createKey({ credits: 0 });
    const victim = await gateway.createKey({ credits: 100 });
    const { store } = gateway.gateway;
    const wal = store as unknown as { wal: { lastSeq: number } };
    const seqBefore = wal.wal.lastSeq;
    const post = (path: string, key: string, body: unknown) =>
      gateway.request(path, { method: 'POST', headers: bearer(key), body: JSON.stringify(body) });
    const decision = (model: string) => ({
      model,
      state: { n: 1 },
      questions: { q: { type: 'choice', prompt: 'Which?', criteria: { a: 'first', b: 'second' } } },
    });
    const codes = new Map<string, number>();
    for (let i = 0; i < 1_000; i++) {
      // Model strings nobody has seen, each kept by the old gateway forever.
      const model = `m-${randomBase62(40)}${randomBase62(40)}${randomBase62(40)}`;
      for (const response of [
        await post('/decision/v1/decide/', attacker.key, decision(model)),
        await post('/decision/v1/decide/', attacker.key, decision('decision-fast')),
        await post('/api/v1/chat/completions', attacker.key, chatBody({ model })),
        await post('/api/v1/chat/completions', attacker.key, chatBody()),
        await post('/decision/v1/decide/', 'tg-unknown', decision(model)),
      ]) {
        const code = ((await response.json()) as { error: { code: string } }).error.code;
        codes.set(code, (codes.get(code) ?? 0) + 1);
      }
    }
    expect(Object.fromEntries(codes)).toEqual({
      model_not_found: 2_000,
      insufficient_quota: 2_000,
      invalid_api_key: 1_000,
    });
    expect(wal.wal.lastSeq).toBe(seqBefore);
    expect(store.state.finished.size).toBe(0);
    expect(store.state.inFlight.size).toBe(0);
    // The victim is served as if nothing had happened.
    const served = await post('/api/v1/chat/completions', victim.key, chatBody());
    expect(served.status).toBe(200);
  });
});
