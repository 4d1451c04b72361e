// One key cannot take every in-flight slot (CONTRACT §8): at limits.max_in_flight, a key under its
// fair share still gets in, the key holding the most does not.
import { describe, expect, test } from 'bun:test';
import { bearer, chatBody, closedAfterEach } from '../support/gateway.ts';
import { startFakeUpstream, upstreamOverrides } from '../support/upstream.ts';

const t = closedAfterEach();

describe('in-flight slots at the bound', () => {
  test('the flooding key is refused, the victim is admitted up to its share', async () => {
    const upstream = t.track(startFakeUpstream('hang'));
    const server = await t.server(
      upstreamOverrides(upstream, {
        limits: { max_in_flight: 4, default_rate_limit_rpm: 100_000 },
      }),
    );
    const attacker = await server.createKey({ credits: 1_000 });
    const victim = await server.createKey({ credits: 1_000 });
    const aborts = new AbortController();
    const post = (key: string) =>
      fetch(`${server.baseUrl}/api/v1/chat/completions`, {
        method: 'POST',
        headers: bearer(key),
        body: JSON.stringify(chatBody()),
        signal: aborts.signal,
      }).catch(() => null);
    const calls = upstream.calls;
    const hanging: Promise<Response | null>[] = [];
    for (let i = 0; i < 4; i++) {
      const reached = upstream.nextCall.promise;
      hanging.push(post(attacker.key));
      await reached;
    }
    expect(upstream.calls).toBe(calls + 4);
    expect(server.gateway.registry.size).toBe(4);
    // The attacker holds every slot: its next call is refused.
    const refused = await post(attacker.key);
    expect(refused?.status).toBe(503);
    // The victim runs none: its share of 4 slots between 2 keys is 2, so two calls get in, a third
    // does not.
    for (let i = 0; i < 2; i++) {
      const reached = upstream.nextCall.promise;
      hanging.push(post(victim.key));
      await reached;
    }
    expect(server.gateway.registry.size).toBe(6);
    const third = await post(victim.key);
    expect(third?.status).toBe(503);
    aborts.abort();
    await Promise.all(hanging);
  });
});
