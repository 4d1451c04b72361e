// One key floods the shared tables (CONTRACT §8 "Retention is per key"): the victim keeps its
// bindings and records.
import { describe, expect, test } from 'bun:test';
import { bearer, chatBody, closedAfterEach, type TestGateway } from '../support/gateway.ts';

const gateways = closedAfterEach();

/**
 * Small global bounds, so a flood that would evict the victim under a shared LRU takes a second.
 */
const SMALL_TABLES = {
  limits: { idempotency_keys_max: 40, request_records_max: 40, default_rate_limit_rpm: 1_000_000 },
};

async function chat(
  gateway: TestGateway,
  key: string,
  body: Record<string, unknown>,
  idempotencyKey?: string,
) {
  const headers = bearer(key, idempotencyKey ? { 'idempotency-key': idempotencyKey } : {});
  return gateway.request('/api/v1/chat/completions', {
    method: 'POST',
    headers,
    body: JSON.stringify(body),
  });
}

async function balances(gateway: TestGateway, id: string) {
  const response = await gateway.request(`/admin/v1/keys/${id}`, {
    headers: { authorization: `Bearer ${gateway.config.admin_token}` },
  });
  return ((await response.json()) as { balances: Record<string, number> }).balances;
}

describe('a flooding key cannot take another key’s retention', () => {
  test(
    'the victim’s retry inside the TTL finds its ' +
      'binding after another key’s flood: no second charge',
    async () => {
      const gateway = gateways.gateway(SMALL_TABLES);
      const victim = await gateway.createKey({ credits: 100 });
      const attacker = await gateway.createKey({ credits: 100 });
      const body = chatBody({ messages: [{ role: 'user', content: 'Charge me once.' }] });
      const first = await chat(gateway, victim.key, body, 'victim-order-0001');
      expect(first.status).toBe(200);
      const original = ((await first.json()) as { id: string }).id;
      const charged = (await balances(gateway, victim.id)).charged;

      // Five times the whole table, each with its own Idempotency-Key (each binds one entry).
      for (let i = 0; i < 200; i++) {
        const flood = await chat(
          gateway,
          attacker.key,
          chatBody(),
          `flood-${String(i).padStart(6, '0')}`,
        );
        expect(flood.status).toBe(200);
      }

      const retry = await chat(gateway, victim.key, body, 'victim-order-0001');
      expect(retry.status).toBe(409);
      expect(retry.headers.get('x-request-id')).toBe(original);
      expect(await retry.json()).toMatchObject({
        error: { code: 'request_already_completed' },
        request_id: original,
      });
      expect((await balances(gateway, victim.id)).charged).toBe(charged);
      // Its record is still there for the status endpoint.
      const status = await gateway.request(`/api/v1/requests/${original}`, {
        headers: bearer(victim.key),
      });
      expect(status.status).toBe(200);
      expect(await status.json()).toMatchObject({
        request_id: original,
        request_status: 'completed',
      });
      // The attacker's own oldest went; its newest is still found.
      const attackerOld = await chat(gateway, attacker.key, chatBody(), 'flood-000000');
      expect(attackerOld.status).toBe(200);
      const attackerNew = await chat(gateway, attacker.key, chatBody(), 'flood-000199');
      expect(attackerNew.status).toBe(409);
    },
  );

  test(
    'a key past its own bound loses its own oldest binding and record, even with the table ' +
      'half empty',
    async () => {
      const gateway = gateways.gateway({
        limits: {
          idempotency_keys_per_key: 3,
          request_records_per_key: 3,
          default_rate_limit_rpm: 1_000_000,
        },
      });
      const key = await gateway.createKey({ credits: 100 });
      const ids: string[] = [];
      for (let i = 0; i < 4; i++) {
        const response = await chat(gateway, key.key, chatBody(), `own-bound-${i}-xyz`);
        expect(response.status).toBe(200);
        ids.push(((await response.json()) as { id: string }).id);
      }
      const lookup = (id: string) =>
        gateway.request(`/api/v1/requests/${id}`, { headers: bearer(key.key) });
      expect((await lookup(ids[0]!)).status).toBe(404);
      for (const id of ids.slice(1)) expect((await lookup(id)).status).toBe(200);
      // The evicted binding runs again (documented: the key went past its own bound); the kept ones
      // do not.
      expect((await chat(gateway, key.key, chatBody(), 'own-bound-3-xyz')).status).toBe(409);
      expect((await chat(gateway, key.key, chatBody(), 'own-bound-0-xyz')).status).toBe(200);
    },
  );

  test(
    'the victim’s bindings survive the flood ' + 'across a restart (snapshot and replay)',
    async () => {
      const gateway = gateways.gateway({ ...SMALL_TABLES, wal: { snapshot_every_records: 37 } });
      const victim = await gateway.createKey({ credits: 100 });
      const attacker = await gateway.createKey({ credits: 100 });
      const body = chatBody({ messages: [{ role: 'user', content: 'Across a restart.' }] });
      const first = await chat(gateway, victim.key, body, 'victim-restart-01');
      const original = ((await first.json()) as { id: string }).id;
      for (let i = 0; i < 150; i++)
        expect((await chat(gateway, attacker.key, chatBody(), `flood-r-${i}-xx`)).status).toBe(200);
      await gateway.gateway.store.close();
      const reopened = gateways.gatewayOn(gateway.config.data_dir, SMALL_TABLES);
      const retry = await chat(reopened, victim.key, body, 'victim-restart-01');
      expect(retry.status).toBe(409);
      expect(await retry.json()).toMatchObject({ request_id: original });
    },
  );
});
