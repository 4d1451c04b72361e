// GatewayState.apply: holds, charges and releases keep credits_added = balance + held + charged;
// bad moves assert.
import { describe, expect, test } from 'bun:test';
import { DAY_MS, GatewayState, type KeyAccount } from '../../src/state/apply.ts';
import { checkEvent, type Event } from '../../src/state/events.ts';
import { restoreState, serializeState } from '../../src/state/snapshot.ts';
import { AssertionError } from '../../src/util/assert.ts';
import { readWhole } from '../../src/wal/log.ts';
import { keyCreated, keyCredited, LIMITS, requestFinished, requestStarted } from './support.ts';

interface Ledger {
  added: number;
  balance: number;
  held: number;
  charged: number;
}

function ledgerOf(account: KeyAccount): Ledger {
  return {
    added: account.creditsAddedMicro,
    balance: account.balanceMicro,
    held: account.heldMicro,
    charged: account.chargedMicro,
  };
}

/** Applies one event (checked as the store would) and asserts the invariant on every account. */
function step(state: GatewayState, event: Event): void {
  state.apply(checkEvent(event));
  for (const account of state.keys.values()) {
    expect(account.creditsAddedMicro).toBe(
      account.balanceMicro + account.heldMicro + account.chargedMicro,
    );
    expect(account.tokensAdded).toBe(
      account.tokenWallet + account.tokensHeld + account.tokensCharged,
    );
    for (const value of [
      account.balanceMicro,
      account.heldMicro,
      account.chargedMicro,
      account.tokenWallet,
      account.tokensHeld,
    ]) {
      expect(Number.isSafeInteger(value) && value >= 0).toBe(true);
    }
  }
}

/** The snapshot of `state` as plain values: its JSON parsed, and the record columns' bytes. */
async function snapshotForm(state: GatewayState): Promise<{ state: unknown; blobs: Uint8Array[] }> {
  const { json, blobs, written } = await serializeState(state);
  const bytes = blobs.map((blob) => readWhole(blob).slice());
  written?.();
  return { state: JSON.parse(Buffer.concat(json).toString()), blobs: bytes };
}

/** Restores `from`'s snapshot into `into`, as a restart would. */
async function restoreFrom(into: GatewayState, from: GatewayState): Promise<void> {
  const { state, blobs } = await snapshotForm(from);
  restoreState(into, state, NOW, blobs);
}

/** A deep copy of everything apply can touch, to show a refused event changed nothing. */
function snapshotOf(state: GatewayState): unknown {
  return structuredClone({
    keys: [...state.keys.values()],
    inFlight: [...state.inFlight.values()],
    finished: [...state.finished.values(Number.NEGATIVE_INFINITY)],
    finishedOwners: state.finished.serializeColumns().meta.owners,
    bindings: [...state.idempotency.allEntries()],
    bindingOwners: state.idempotency.ownerOrder(),
  });
}

function expectRefused(state: GatewayState, event: Event, message: string): void {
  const before = snapshotOf(state);
  expect(() => state.apply(event)).toThrow(AssertionError);
  expect(() => state.apply(event)).toThrow(message);
  expect(snapshotOf(state)).toEqual(before);
}

const NOW = Date.now();
const LATER = NOW + 3_600_000;

describe('ledger', () => {
  test(
    'a hold moves credits from balance to held; a finish charges at most the hold and returns ' +
      'the rest',
    () => {
      const state = new GatewayState(LIMITS);
      step(state, keyCreated('k1', 1_000_000));
      const account = state.account('k1');
      expect(ledgerOf(account)).toEqual({
        added: 1_000_000,
        balance: 1_000_000,
        held: 0,
        charged: 0,
      });

      step(state, requestStarted('r1', 'k1', 300_000));
      expect(ledgerOf(account)).toEqual({
        added: 1_000_000,
        balance: 700_000,
        held: 300_000,
        charged: 0,
      });
      expect(state.request('r1')).toMatchObject({
        status: 'in_progress',
        hold: { credits_micro: 300_000, tokens: 0 },
      });

      step(state, requestStarted('r2', 'k1', 200_000));
      expect(ledgerOf(account)).toEqual({
        added: 1_000_000,
        balance: 500_000,
        held: 500_000,
        charged: 0,
      });

      step(state, requestFinished('r1', 120_000));
      expect(ledgerOf(account)).toEqual({
        added: 1_000_000,
        balance: 680_000,
        held: 200_000,
        charged: 120_000,
      });
      expect(state.inFlight.has('r1')).toBe(false);
      expect(state.request('r1')).toMatchObject({
        status: 'completed',
        charge: { credits_micro: 120_000, tokens: 0 },
      });

      // A charge of exactly the hold is allowed and returns nothing.
      step(state, requestFinished('r2', 200_000));
      expect(ledgerOf(account)).toEqual({
        added: 1_000_000,
        balance: 680_000,
        held: 0,
        charged: 320_000,
      });

      step(state, keyCredited('k1', 20_000));
      expect(ledgerOf(account)).toEqual({
        added: 1_020_000,
        balance: 700_000,
        held: 0,
        charged: 320_000,
      });

      // A cancel with nothing charged releases the whole hold.
      step(state, requestStarted('r3', 'k1', 700_000));
      expect(ledgerOf(account)).toEqual({
        added: 1_020_000,
        balance: 0,
        held: 700_000,
        charged: 320_000,
      });
      step(
        state,
        requestFinished('r3', 0, {
          status: 'cancelled',
          error_code: 'request_cancelled',
          http_status: 499,
          usage: null,
        }),
      );
      expect(ledgerOf(account)).toEqual({
        added: 1_020_000,
        balance: 700_000,
        held: 0,
        charged: 320_000,
      });
      expect(state.request('r3')!.status).toBe('cancelled');
    },
  );

  test('a hold larger than the balance asserts and changes nothing', () => {
    const state = new GatewayState(LIMITS);
    step(state, keyCreated('k1', 1_000));
    step(state, requestStarted('r1', 'k1', 600));
    expectRefused(state, requestStarted('r2', 'k1', 401), 'hold exceeds the balance');
    // Exactly the rest is fine.
    step(state, requestStarted('r2', 'k1', 400));
    expect(ledgerOf(state.account('k1'))).toEqual({
      added: 1_000,
      balance: 0,
      held: 1_000,
      charged: 0,
    });
    expectRefused(state, requestStarted('r3', 'k1', 1), 'hold exceeds the balance');
  });

  test(
    'a charge larger than the hold asserts and ' + 'changes nothing; the request stays in flight',
    () => {
      const state = new GatewayState(LIMITS);
      step(state, keyCreated('k1', 1_000_000));
      step(state, requestStarted('r1', 'k1', 5_000));
      expectRefused(state, requestFinished('r1', 5_001), 'charge exceeds the credit hold');
      expect(state.inFlight.get('r1')!.status).toBe('in_progress');
      step(state, requestFinished('r1', 5_000));
    },
  );

  test(
    'token holds and charges keep the token ledger; ' +
      'over-hold and over-charge of tokens assert',
    () => {
      const state = new GatewayState(LIMITS);
      step(state, keyCreated('k1', 0, { token_wallet: 1_000 }));
      const decision = { service: 'decision' as const, model: 'decision-fast' };
      expectRefused(
        state,
        requestStarted('d0', 'k1', 0, { ...decision, hold: { credits_micro: 0, tokens: 1_001 } }),
        'hold exceeds the token wallet',
      );
      step(
        state,
        requestStarted('d1', 'k1', 0, { ...decision, hold: { credits_micro: 0, tokens: 800 } }),
      );
      const account = state.account('k1');
      expect([account.tokenWallet, account.tokensHeld, account.tokensCharged]).toEqual([
        200, 800, 0,
      ]);
      expectRefused(
        state,
        requestFinished('d1', 0, { charge: { credits_micro: 0, tokens: 801 } }),
        'charge exceeds the token hold',
      );
      step(state, requestFinished('d1', 0, { charge: { credits_micro: 0, tokens: 300 } }));
      expect([account.tokenWallet, account.tokensHeld, account.tokensCharged]).toEqual([
        700, 0, 300,
      ]);
    },
  );

  test(
    'illegal sequences assert: unknown key, duplicate request, finish twice, unknown request, ' +
      'duplicate key',
    () => {
      const state = new GatewayState(LIMITS);
      step(state, keyCreated('k1', 1_000));
      expectRefused(state, requestStarted('r1', 'nope', 1), 'unknown key nope');
      expectRefused(state, keyCredited('nope', 1), 'unknown key nope');
      expectRefused(state, keyCreated('k1', 5), 'key k1 exists');
      expectRefused(
        state,
        keyCreated('k2', 5, { secret_sha256: state.account('k1').secretSha256 }),
        'secret already in use',
      );
      step(state, requestStarted('r1', 'k1', 10));
      expectRefused(state, requestStarted('r1', 'k1', 10), 'request r1 exists');
      step(state, requestFinished('r1', 5));
      expectRefused(state, requestStarted('r1', 'k1', 10), 'request r1 exists');
      expectRefused(state, requestFinished('r1', 5), 'finish of unknown or finished request r1');
      expectRefused(state, requestFinished('r9', 0), 'finish of unknown or finished request r9');
    },
  );

  test('a top-up that would leave the safe-integer range asserts', () => {
    const state = new GatewayState(LIMITS);
    step(state, keyCreated('k1', Number.MAX_SAFE_INTEGER - 10));
    expectRefused(state, keyCredited('k1', 11), 'amount overflows a safe integer');
    step(state, keyCredited('k1', 10));
  });

  test('a version 2 snapshot (records in layout 2) restores; another version refuses', async () => {
    const state = new GatewayState(LIMITS);
    step(state, keyCreated('k1', 1_000_000));
    const { state: json, blobs } = await snapshotForm(state);
    const form = json as { version: number; finished: Record<string, unknown> };
    expect(form.version).toBe(3);
    form.version = 2;
    delete form.finished.layout;
    const restored = new GatewayState(LIMITS);
    restoreState(restored, form, NOW, blobs);
    expect(ledgerOf(restored.keys.get('k1')!)).toEqual(ledgerOf(state.keys.get('k1')!));
    form.version = 4;
    expect(() => restoreState(new GatewayState(LIMITS), form, NOW, blobs)).toThrow(
      'snapshot state version 4 is unknown',
    );
  });

  test('a long random history never breaks the invariant and never overdraws', () => {
    let seed = 12345;
    const random = (n: number) => {
      seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648;
      return seed % n;
    };
    const state = new GatewayState(LIMITS);
    step(state, keyCreated('k1', 50_000));
    const open: string[] = [];
    for (let i = 0; i < 2_000; i++) {
      const action = random(4);
      const account = state.account('k1');
      if (action === 0) step(state, keyCredited('k1', random(1_000)));
      else if (action === 1 && account.balanceMicro > 0) {
        step(state, requestStarted(`r${i}`, 'k1', 1 + random(account.balanceMicro)));
        open.push(`r${i}`);
      } else if (open.length > 0) {
        const id = open.splice(random(open.length), 1)[0]!;
        const hold = state.inFlight.get(id)!.hold.credits_micro;
        step(
          state,
          requestFinished(id, random(hold + 1), {
            status: random(3) === 0 ? 'error' : 'completed',
          }),
        );
      }
    }
    const account = state.account('k1');
    expect(account.heldMicro).toBe(
      open.reduce((sum, id) => sum + state.inFlight.get(id)!.hold.credits_micro, 0),
    );
  });
});

describe('idempotency bindings on finish', () => {
  const idem = (key: string) => ({ key, fingerprint: 'f'.repeat(64), expires_at_ms: LATER });

  function started(id: string, service: 'chat' | 'decision', key: string) {
    return requestStarted(id, 'k1', 100, { service, idempotency: idem(key) });
  }

  function setup(): GatewayState {
    const state = new GatewayState(LIMITS);
    step(state, keyCreated('k1', 1_000_000));
    return state;
  }

  test('request.started binds the key to the request', () => {
    const state = setup();
    step(state, started('r1', 'chat', 'idem-chat-1'));
    expect(state.binding('k1', 'idem-chat-1', NOW)).toEqual({
      requestId: 'r1',
      fingerprint: 'f'.repeat(64),
      expiresAtMs: LATER,
    });
    // Scoped per API key; kept past its expiry while its request runs.
    expect(state.binding('k2', 'idem-chat-1', NOW)).toBeUndefined();
    expect(state.binding('k1', 'idem-chat-1', LATER)?.requestId).toBe('r1');
    // Once it ends, the binding lives its TTL (as the start event set it) from the end.
    const endMs = LATER + 10;
    step(state, requestFinished('r1', 10, { at_ms: endMs }));
    const ttlMs = LATER - started('r1', 'chat', 'idem-chat-1').at_ms;
    expect(state.binding('k1', 'idem-chat-1', endMs + ttlMs - 1)?.expiresAtMs).toBe(endMs + ttlMs);
    expect(state.binding('k1', 'idem-chat-1', endMs + ttlMs)).toBeUndefined();
  });

  test('the TTL from the end is the log’s, not the config’s; the binding is the newest', () => {
    // A state whose config TTL differs from the one the start event was written with.
    const state = new GatewayState({ ...LIMITS, requestRecordTtlMs: 5 });
    step(state, keyCreated('k1', 1_000_000));
    const start = started('r1', 'chat', 'idem-chat-2');
    step(state, start);
    step(state, started('r2', 'chat', 'idem-chat-3'));
    step(state, requestFinished('r1', 10, { at_ms: start.at_ms + 7 }));
    expect(state.binding('k1', 'idem-chat-2', NOW)?.expiresAtMs).toBe(LATER + 7);
    expect([...state.idempotency.allEntries()].map(([, binding]) => binding.requestId)).toEqual([
      'r2',
      'r1',
    ]);
  });

  test('a decision that ends in error frees its binding', () => {
    const state = setup();
    step(state, started('d1', 'decision', 'idem-dec-1'));
    step(
      state,
      requestFinished('d1', 0, {
        status: 'error',
        error_code: 'upstream_error',
        http_status: 502,
        usage: null,
      }),
    );
    expect(state.binding('k1', 'idem-dec-1', NOW)).toBeUndefined();
    // The retry with the same key can bind it again.
    step(state, started('d2', 'decision', 'idem-dec-1'));
    expect(state.binding('k1', 'idem-dec-1', NOW)?.requestId).toBe('d2');
  });

  test('a cancelled decision frees its binding too (CONTRACT §5: any error or cancel)', () => {
    const state = setup();
    step(state, started('d1', 'decision', 'idem-dec-2'));
    step(
      state,
      requestFinished('d1', 0, {
        status: 'cancelled',
        error_code: 'request_cancelled',
        http_status: 499,
        usage: null,
      }),
    );
    expect(state.binding('k1', 'idem-dec-2', NOW)).toBeUndefined();
  });

  test('a completed decision keeps its binding', () => {
    const state = setup();
    step(state, started('d1', 'decision', 'idem-dec-3'));
    step(state, requestFinished('d1', 50, { answers: { q1: 'yes' } }));
    expect(state.binding('k1', 'idem-dec-3', NOW)?.requestId).toBe('d1');
  });

  test('a chat request that ends in error keeps its binding', () => {
    const state = setup();
    step(state, started('c1', 'chat', 'idem-chat-2'));
    step(
      state,
      requestFinished('c1', 0, {
        status: 'error',
        error_code: 'upstream_error',
        http_status: 502,
        usage: null,
      }),
    );
    expect(state.binding('k1', 'idem-chat-2', NOW)?.requestId).toBe('c1');
  });

  test('a decision error frees only a binding that is still its own', () => {
    const state = setup();
    step(state, started('d1', 'decision', 'idem-dec-4'));
    step(state, started('d2', 'decision', 'idem-dec-4'));
    step(
      state,
      requestFinished('d1', 0, {
        status: 'error',
        error_code: 'upstream_error',
        http_status: 502,
        usage: null,
      }),
    );
    expect(state.binding('k1', 'idem-dec-4', NOW)?.requestId).toBe('d2');
  });

  test(
    'a binding replayed after its TTL is kept (the table must not depend on when the log is ' +
      'read), found only while its request runs',
    () => {
      const state = setup();
      step(
        state,
        requestStarted('r1', 'k1', 1, {
          idempotency: { key: 'idem-old-1', fingerprint: 'f', expires_at_ms: NOW - 1 },
        }),
      );
      expect(state.idempotency.size).toBe(1);
      // Found while its request runs (it did when it was written), not after its end.
      expect(state.binding('k1', 'idem-old-1', NOW)?.requestId).toBe('r1');
      step(state, requestFinished('r1', 1, { at_ms: NOW - LIMITS.requestRecordTtlMs }));
      expect(state.binding('k1', 'idem-old-1', NOW)).toBeUndefined();
    },
  );
});

describe('daily decision budget', () => {
  test('held while in flight, spent on finish, reset on a new UTC day', () => {
    const state = new GatewayState(LIMITS);
    step(state, keyCreated('k1', 1_000_000, { daily_decision_budget_micro: 10_000 }));
    const day = 20_000;
    const decision = (id: string) =>
      requestStarted(id, 'k1', 1_000, {
        service: 'decision',
        budget_hold_micro: 1_000,
        at_ms: day * DAY_MS,
      });
    step(state, decision('d1'));
    expect(state.account('k1').budgetHeldMicro).toBe(1_000);
    step(state, requestFinished('d1', 600, { budget_spend_micro: 600, at_ms: day * DAY_MS + 5 }));
    expect(state.account('k1')).toMatchObject({
      budgetHeldMicro: 0,
      budgetSpentMicro: 600,
      budgetDay: day,
    });
    step(state, decision('d2'));
    step(state, requestFinished('d2', 400, { budget_spend_micro: 400, at_ms: day * DAY_MS + 6 }));
    expect(state.account('k1')).toMatchObject({ budgetSpentMicro: 1_000, budgetDay: day });
    step(state, decision('d3'));
    step(state, requestFinished('d3', 100, { budget_spend_micro: 100, at_ms: (day + 1) * DAY_MS }));
    expect(state.account('k1')).toMatchObject({
      budgetHeldMicro: 0,
      budgetSpentMicro: 100,
      budgetDay: day + 1,
    });
  });
});

describe('snapshot form', () => {
  test(
    'serialize then restore gives the same ledger, in-flight holds and bindings, and finishing ' +
      'still balances',
    async () => {
      const state = new GatewayState(LIMITS);
      step(state, keyCreated('k1', 100_000));
      step(state, keyCreated('k2', 5_000, { token_wallet: 10 }));
      step(
        state,
        requestStarted('r1', 'k1', 40_000, {
          idempotency: { key: 'idem-snap-1', fingerprint: 'f', expires_at_ms: LATER },
        }),
      );
      step(state, requestStarted('r2', 'k1', 10_000));
      step(state, requestFinished('r2', 3_000));
      const restored = new GatewayState(LIMITS);
      await restoreFrom(restored, state);
      expect(await snapshotForm(restored)).toEqual(await snapshotForm(state));
      expect(restored.keysBySecret.get(restored.account('k1').secretSha256)).toBe(
        restored.account('k1'),
      );
      expect(restored.binding('k1', 'idem-snap-1', NOW)?.requestId).toBe('r1');
      step(restored, requestFinished('r1', 40_000));
      expect(ledgerOf(restored.account('k1'))).toEqual({
        added: 100_000,
        balance: 57_000,
        held: 0,
        charged: 43_000,
      });
    },
  );

  test(
    'finished records survive as columns (answers, nulls, errors); a snapshot of another ' +
      'version refuses to restore',
    async () => {
      const state = new GatewayState(LIMITS);
      step(state, keyCreated('k1', 100_000, { token_wallet: 50 }));
      step(state, requestStarted('r1', 'k1', 10_000));
      step(state, requestFinished('r1', 3_000));
      step(state, requestStarted('r2', 'k1', 10_000));
      step(
        state,
        requestFinished('r2', 0, {
          status: 'error',
          error_code: 'upstream_timeout',
          http_status: 504,
          usage: null,
        }),
      );
      step(
        state,
        requestStarted('d1', 'k1', 0, {
          service: 'decision',
          hold: { credits_micro: 0, tokens: 20 },
        }),
      );
      step(
        state,
        requestFinished('d1', 0, {
          charge: { credits_micro: 0, tokens: 12 },
          answers: { q: { type: 'choice', label: 'yes' } },
        }),
      );
      const records = [...state.finished.values(NOW)];
      expect(records.map((r) => r.id)).toEqual(['r1', 'r2', 'd1']);
      const v2 = new GatewayState(LIMITS);
      await restoreFrom(v2, state);
      expect([...v2.finished.values(NOW)]).toEqual(records);
      const { keys, inFlight, idempotency } = (await snapshotForm(state)).state as Record<
        string,
        unknown
      >;
      const v1 = { keys, inFlight, idempotency, finished: records };
      expect(() => restoreState(new GatewayState(LIMITS), v1, NOW, [])).toThrow(
        /snapshot state version undefined is unknown/,
      );
    },
  );
});
