// The finished-record ring: what goes in comes out the same, the oldest go first, old ones expire.
import { describe, expect, test } from 'bun:test';
import type { RequestRecord } from '../../src/state/records.ts';
import { RecordTable } from '../../src/state/records.ts';

const NOW_MS = 1_800_000_000_000;
const TTL_MS = 60_000;

function record(id: string, overrides: Partial<RequestRecord> = {}): RequestRecord {
  return {
    id,
    keyId: 'key_abc',
    service: 'chat',
    model: 'model_03',
    stream: true,
    status: 'completed',
    createdAtMs: NOW_MS - 20,
    finishedAtMs: NOW_MS - 10,
    hold: { credits_micro: 9_007_199_254_740_991, tokens: 0 },
    charge: { credits_micro: 1_234_567, tokens: 0 },
    budgetHoldMicro: 0,
    usage: { prompt_tokens: 11, completion_tokens: 22, total_tokens: 33 },
    errorCode: null,
    httpStatus: 200,
    answers: null,
    attempts: null,
    idempotencyKey: null,
    ...overrides,
  };
}

/**
 * The columns a snapshot made before layout 3 holds (177-byte rows: eleven Float64 numbers, six
 * Int32, 40-byte ids, their lengths, then the first attempt and its Float64 latency), written here
 * from the format's description, not by the table, so that a change to the table cannot follow it.
 */
function layout2Snapshot(
  records: RequestRecord[],
  withAttempts = true,
): { meta: Record<string, unknown>; blobs: Uint8Array[] } {
  const strings: string[] = [];
  const position = (text: string) => {
    const known = strings.indexOf(text);
    if (known !== -1) return known;
    strings.push(text);
    return strings.length - 1;
  };
  const count = records.length;
  const numbers = new Float64Array(count * 11);
  const small = new Int32Array(count * 6);
  const idBytes = new Uint8Array(count * 40);
  const idLengths = new Uint8Array(count);
  const attempt = new Int32Array(count * 4);
  const latency = new Float64Array(count);
  const otherIds: Record<number, string> = {};
  const answers: Record<number, unknown> = {};
  const attempts: Record<number, unknown> = {};
  records.forEach((r, row) => {
    numbers.set(
      [
        r.createdAtMs,
        r.finishedAtMs ?? r.createdAtMs,
        r.hold.credits_micro,
        r.hold.tokens,
        r.charge.credits_micro,
        r.charge.tokens,
        r.budgetHoldMicro,
        r.usage?.prompt_tokens ?? -1,
        r.usage?.completion_tokens ?? -1,
        r.usage?.total_tokens ?? -1,
        r.httpStatus ?? -1,
      ],
      row * 11,
    );
    small.set(
      [
        ['chat', 'decision'].indexOf(r.service),
        r.stream ? 1 : 0,
        ['in_progress', 'completed', 'cancelled', 'error'].indexOf(r.status),
        position(r.keyId),
        position(r.model),
        r.errorCode === null ? -1 : position(r.errorCode),
      ],
      row * 6,
    );
    if (r.id.length > 40) {
      idLengths[row] = 255;
      otherIds[row] = r.id;
    } else {
      for (let i = 0; i < r.id.length; i++) idBytes[row * 40 + i] = r.id.charCodeAt(i);
      idLengths[row] = r.id.length;
    }
    if (r.answers !== null) answers[row] = r.answers;
    const tried = r.attempts;
    if (withAttempts && tried?.length === 1) {
      const only = tried[0]!;
      attempt.set(
        [
          position(only.provider),
          position(only.upstream_model),
          ['ok', 'error', 'cancelled'].indexOf(only.outcome),
          only.error_code === null ? -1 : position(only.error_code),
        ],
        row * 4,
      );
      latency[row] = only.latency_ms;
    } else {
      attempt[row * 4 + 2] = -1;
      if (tried !== null && tried.length > 0 && (tried.length > 1 || !withAttempts))
        attempts[row] = tried;
    }
  });
  const columns = [numbers, small, idBytes, idLengths, ...(withAttempts ? [attempt, latency] : [])];
  return {
    meta: { count, strings, otherIds, answers, attempts },
    blobs: columns.map((column) => new Uint8Array(column.buffer)),
  };
}

describe('RecordTable', () => {
  test('a record reads back field for field, nulls included', () => {
    const table = new RecordTable(4, TTL_MS);
    const completed = record('a');
    const failed = record('b', {
      service: 'decision',
      stream: false,
      status: 'error',
      usage: null,
      errorCode: 'upstream_timeout',
      httpStatus: null,
      hold: { credits_micro: 5, tokens: 700 },
      charge: { credits_micro: 0, tokens: 650 },
      budgetHoldMicro: 42,
    });
    const decided = record('c', { service: 'decision', answers: { q1: 'yes', q2: 3 } });
    for (const r of [completed, failed, decided]) table.add(r);
    expect(table.get('a', NOW_MS)).toEqual(completed);
    expect(table.get('b', NOW_MS)).toEqual(failed);
    expect(table.get('c', NOW_MS)).toEqual(decided);
    expect(table.get('nope', NOW_MS)).toBeUndefined();
    expect(table.size).toBe(3);
  });

  test('when full, the oldest record makes room, and its answers go with it', () => {
    const table = new RecordTable(3, TTL_MS);
    table.add(record('a', { answers: { q: 'first' } }));
    for (const id of ['b', 'c', 'd', 'e']) table.add(record(id));
    expect(table.size).toBe(3);
    expect(table.has('a')).toBe(false);
    expect(table.has('b')).toBe(false);
    expect([...table.values(NOW_MS)].map((r) => r.id)).toEqual(['c', 'd', 'e']);
    // The slot 'a' had now holds 'd', which must not inherit a's answers.
    expect(table.get('d', NOW_MS)?.answers).toBeNull();
  });

  test('a record older than the TTL is gone for reads and snapshots', () => {
    const table = new RecordTable(8, TTL_MS);
    table.add(record('old', { finishedAtMs: NOW_MS - TTL_MS }));
    table.add(record('new', { finishedAtMs: NOW_MS - TTL_MS + 1 }));
    expect(table.get('old', NOW_MS)).toBeUndefined();
    expect(table.get('new', NOW_MS)?.id).toBe('new');
    expect([...table.values(NOW_MS)].map((r) => r.id)).toEqual(['new']);
  });

  test('values() in order refill a table to the same state (the snapshot path)', () => {
    const table = new RecordTable(3, TTL_MS);
    for (const id of ['a', 'b', 'c', 'd'])
      table.add(record(id, { charge: { credits_micro: id.charCodeAt(0), tokens: 0 } }));
    const copy = new RecordTable(3, TTL_MS);
    for (const r of table.values(NOW_MS)) copy.add(r);
    copy.add(record('e'));
    table.add(record('e'));
    expect([...copy.values(NOW_MS)]).toEqual([...table.values(NOW_MS)]);
  });

  test(
    'a table larger than its first allocation ' + 'grows, then wraps, keeping the newest in order',
    () => {
      const table = new RecordTable(3_000, TTL_MS);
      for (let i = 0; i < 7_000; i++)
        table.add(
          record(`r${i}`, {
            charge: { credits_micro: i, tokens: 0 },
            answers: i % 1000 === 999 ? { i } : null,
          }),
        );
      expect(table.size).toBe(3_000);
      const ids = [...table.values(NOW_MS)].map((r) => r.id);
      expect(ids).toEqual(Array.from({ length: 3_000 }, (_, k) => `r${4_000 + k}`));
      expect(table.get('r3999', NOW_MS)).toBeUndefined();
      expect(table.get('r4000', NOW_MS)?.charge.credits_micro).toBe(4_000);
      expect(table.get('r6999', NOW_MS)).toMatchObject({
        charge: { credits_micro: 6_999, tokens: 0 },
        answers: { i: 6_999 },
      });
      expect(table.get('r5998', NOW_MS)?.answers).toBeNull();
    },
  );

  test('ids that are long or not ASCII are kept and found like the others', () => {
    const table = new RecordTable(4, TTL_MS);
    const ids = ['x'.repeat(128), 'déjà-vu', `chatcmpl-${'A'.repeat(24)}`, ''];
    for (const id of ids) table.add(record(id));
    for (const id of ids) expect(table.get(id, NOW_MS)?.id).toBe(id);
    expect([...table.values(NOW_MS)].map((r) => r.id)).toEqual(ids);
    table.add(record('next'));
    expect(table.has(ids[0]!)).toBe(false);
    expect(table.get('déjà-vu', NOW_MS)?.id).toBe('déjà-vu');
  });

  test('lookups stay right through many evictions (against a reference of what is kept)', () => {
    // A capacity that wraps at odd places and a hash table small enough for long probe runs.
    const capacity = 97;
    const table = new RecordTable(capacity, TTL_MS);
    let seed = 42;
    const random = () => (seed = (Math.imul(seed, 1_103_515_245) + 12_345) >>> 0) / 2 ** 32;
    const alphabet = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789';
    const kept: string[] = [];
    const gone: string[] = [];
    for (let i = 0; i < 20_000; i++) {
      let id = `r${i}-`;
      const length = Math.floor(random() * 30);
      for (let k = 0; k < length; k++) id += alphabet[Math.floor(random() * alphabet.length)];
      table.add(record(id, { charge: { credits_micro: i, tokens: 0 } }));
      kept.push(id);
      if (kept.length > capacity) gone.push(kept.shift()!);
      if (i % 250 === 0 || i > 19_900) {
        for (const [at, keptId] of kept.entries())
          expect(table.get(keptId, NOW_MS)?.charge.credits_micro).toBe(i - kept.length + 1 + at);
        for (const goneId of gone.slice(-300)) expect(table.has(goneId)).toBe(false);
      }
    }
    expect([...table.values(NOW_MS)].map((r) => r.id)).toEqual(kept);
  });

  test(
    'the columns of a wrapped table restore the same records in the same order, expired ones ' +
      'kept but never read',
    () => {
      const table = new RecordTable(5, TTL_MS);
      const added = [
        record('a'),
        record('b', { answers: { q: 'gone with a' } }),
        record('déjà', {
          service: 'decision',
          answers: { q: 'yes' },
          usage: null,
          httpStatus: null,
        }),
        record('d', {
          status: 'error',
          errorCode: 'upstream_timeout',
          finishedAtMs: NOW_MS - TTL_MS,
        }),
        record('e', { keyId: 'key_other', model: 'model_07', stream: false }),
        record('f'),
        record('g', {
          status: 'cancelled',
          errorCode: 'request_cancelled',
          charge: { credits_micro: 0, tokens: 0 },
        }),
      ];
      for (const r of added) table.add(r);
      const copy = new RecordTable(5, TTL_MS);
      const { meta, blobs } = table.serializeColumns();
      copy.restoreColumns(JSON.parse(JSON.stringify(meta)), blobs);
      const live = ['déjà', 'e', 'f', 'g'];
      expect([...copy.values(NOW_MS)]).toEqual([...table.values(NOW_MS)]);
      expect([...copy.values(NOW_MS)].map((r) => r.id)).toEqual(live);
      for (const r of added.filter((r) => live.includes(r.id)))
        expect(copy.get(r.id, NOW_MS)).toEqual(r);
      // Kept, so that the restored table is the one the log made (FairSlots), but never read.
      expect(copy.has('d')).toBe(true);
      expect(copy.get('d', NOW_MS)).toBeUndefined();
      // The restored table keeps evicting oldest first.
      copy.add(record('h'));
      copy.add(record('i'));
      expect([...copy.values(NOW_MS)].map((r) => r.id)).toEqual(['e', 'f', 'g', 'h', 'i']);
    },
  );

  test(
    'one key flooding a full table evicts its own ' + 'records, never another key within its share',
    () => {
      const table = new RecordTable(50, TTL_MS, 1_000);
      table.add(record('victim-1', { keyId: 'key_victim' }));
      table.add(record('victim-2', { keyId: 'key_victim' }));
      for (let i = 0; i < 5_000; i++) table.add(record(`flood-${i}`, { keyId: 'key_attacker' }));
      expect(table.get('victim-1', NOW_MS)?.keyId).toBe('key_victim');
      expect(table.get('victim-2', NOW_MS)?.keyId).toBe('key_victim');
      expect(table.heldBy('key_attacker')).toBe(48);
      expect(table.has('flood-4951')).toBe(false);
      expect(table.has('flood-4952')).toBe(true);
      // The per-key bound: a key past it loses its own oldest even when the table has room.
      const bounded = new RecordTable(1_000, TTL_MS, 3);
      for (const id of ['a', 'b', 'c', 'd']) bounded.add(record(id));
      bounded.add(record('other', { keyId: 'key_other' }));
      expect([...bounded.values(NOW_MS)].map((r) => r.id)).toEqual(['b', 'c', 'd', 'other']);
    },
  );

  test(
    'a snapshot of interleaved keys restores each key’s own order, so eviction goes on the ' +
      'same way',
    () => {
      const table = new RecordTable(6, TTL_MS, 4);
      for (let i = 0; i < 20; i++)
        table.add(record(`r${i}`, { keyId: i % 3 === 0 ? 'key_a' : 'key_b' }));
      const copy = new RecordTable(6, TTL_MS, 4);
      const { meta, blobs } = table.serializeColumns();
      copy.restoreColumns(JSON.parse(JSON.stringify(meta)), blobs);
      expect([...copy.values(NOW_MS)]).toEqual([...table.values(NOW_MS)]);
      for (const t of [table, copy]) {
        t.add(record('n1', { keyId: 'key_b' }));
        t.add(record('n2', { keyId: 'key_a' }));
      }
      expect([...copy.values(NOW_MS)]).toEqual([...table.values(NOW_MS)]);
      expect([copy.heldBy('key_a'), copy.heldBy('key_b')]).toEqual([
        table.heldBy('key_a'),
        table.heldBy('key_b'),
      ]);
    },
  );

  test('attempts read back as written: none, one (in the columns), several; a snapshot too', () => {
    const ok = { provider: 'a', upstream_model: 'up-a', outcome: 'ok' as const };
    const one = [{ ...ok, error_code: null, latency_ms: 2 ** 31 - 1 }];
    // A latency the Int32 column cannot hold keeps its list aside, exact.
    const slow = [{ ...ok, error_code: null, latency_ms: 2 ** 40 }];
    const fraction = [{ ...ok, error_code: null, latency_ms: 2.5 }];
    const several = [
      { ...ok, outcome: 'error' as const, error_code: 'upstream_error', latency_ms: 3 },
      { ...ok, provider: 'b', upstream_model: 'up-b', error_code: null, latency_ms: 4 },
    ];
    const cancelled = [{ ...ok, outcome: 'cancelled' as const, error_code: null, latency_ms: 0 }];
    const table = new RecordTable(8, TTL_MS);
    const added = [
      record('none'),
      record('one', { attempts: one }),
      record('several', { attempts: several }),
      record('cancelled', { attempts: cancelled }),
      record('slow', { attempts: slow }),
      record('fraction', { attempts: fraction }),
    ];
    for (const r of added) table.add(r);
    // An empty list is no attempt, read as null (the status view shows [] for both).
    table.add(record('empty', { attempts: [] }));
    for (const r of added) expect(table.get(r.id, NOW_MS)).toEqual(r);
    expect(table.get('empty', NOW_MS)?.attempts).toBeNull();
    const { meta, blobs } = table.serializeColumns();
    // Only the list of the request that failed over is JSON (and the single attempts whose latency
    // is no Int32); the other single attempts are columns.
    expect(Object.values(meta.attempts ?? {})).toEqual([several, slow, fraction]);
    const copy = new RecordTable(8, TTL_MS);
    copy.restoreColumns(JSON.parse(JSON.stringify(meta)), blobs);
    expect([...copy.values(NOW_MS)]).toEqual([...table.values(NOW_MS)]);
    // A slot reused after eviction forgets the attempts of the record it held.
    const small = new RecordTable(1, TTL_MS);
    small.add(record('x', { attempts: several }));
    small.add(record('y', { attempts: one }));
    small.add(record('z'));
    expect(small.get('z', NOW_MS)?.attempts).toBeNull();
    expect(small.serializeColumns().meta.attempts).toEqual({});
  });

  test('a snapshot made before the attempt columns (every list in JSON) still restores', () => {
    const tried = [
      {
        provider: 'a',
        upstream_model: 'up',
        outcome: 'ok' as const,
        error_code: null,
        latency_ms: 7,
      },
    ];
    const { meta, blobs } = layout2Snapshot(
      [record('old', { attempts: tried }), record('older')],
      false,
    );
    expect(blobs).toHaveLength(4);
    const copy = new RecordTable(4, TTL_MS);
    copy.restoreColumns(JSON.parse(JSON.stringify(meta)), blobs);
    expect(copy.get('old', NOW_MS)?.attempts).toEqual(tried);
    expect(copy.get('older', NOW_MS)?.attempts).toBeNull();
  });

  test('a snapshot in the layout before 3 (177-byte rows) restores every field', () => {
    const ok = { provider: 'a', upstream_model: 'up-a', outcome: 'ok' as const, error_code: null };
    const records = [
      record('chatcmpl-ABCDEFGHIJKLMNOPQRSTUVWX', { attempts: [{ ...ok, latency_ms: 12 }] }),
      record('dec_ABCDEFGHIJKLMNOPQRSTUVWX', {
        service: 'decision',
        stream: false,
        status: 'error',
        usage: null,
        errorCode: 'upstream_timeout',
        httpStatus: null,
        hold: { credits_micro: 5, tokens: 2 ** 40 },
        answers: { q: { type: 'score', score: 2 } },
        attempts: [
          { ...ok, outcome: 'error' as const, error_code: 'upstream_error', latency_ms: 3 },
          { ...ok, provider: 'b', latency_ms: 2 ** 40 },
        ],
      }),
      record(`x${'y'.repeat(45)}`, {
        status: 'cancelled',
        usage: { prompt_tokens: 2 ** 33, completion_tokens: 1, total_tokens: 2 ** 33 + 1 },
        attempts: [{ ...ok, outcome: 'cancelled' as const, latency_ms: 2 ** 40 }],
      }),
      record('plain', {
        hold: { credits_micro: 3, tokens: 17 },
        charge: { credits_micro: 7, tokens: 11 },
        budgetHoldMicro: 13,
        httpStatus: 201,
      }),
    ];
    const { meta, blobs } = layout2Snapshot(records);
    const copy = new RecordTable(8, TTL_MS);
    copy.restoreColumns(JSON.parse(JSON.stringify(meta)), blobs);
    expect([...copy.values(NOW_MS)]).toEqual(records);
    // And on through a snapshot of the new layout.
    const again = copy.serializeColumns();
    expect(again.meta.layout).toBe(3);
    const third = new RecordTable(8, TTL_MS);
    third.restoreColumns(JSON.parse(JSON.stringify(again.meta)), again.blobs);
    expect([...third.values(NOW_MS)]).toEqual(records);
  });

  test('a layout-3 snapshot with flags out of range is refused', () => {
    const table = new RecordTable(2, TTL_MS);
    table.add(record('a'));
    const { meta, blobs } = table.serializeColumns();
    const small = new Int32Array(blobs[2]!.slice().buffer);
    small[0] = 16;
    const copy = new RecordTable(2, TTL_MS);
    const damaged = [...blobs];
    damaged[2] = new Uint8Array(small.buffer);
    expect(() => copy.restoreColumns(JSON.parse(JSON.stringify(meta)), damaged)).toThrow(
      'bad service or status',
    );
  });

  test('counts that are no Int32 from 0 read back exact, and through a snapshot', () => {
    const records = [
      record('big', { hold: { credits_micro: 1, tokens: 2 ** 40 } }),
      record('usage', {
        usage: { prompt_tokens: 2 ** 31, completion_tokens: 0, total_tokens: 2 ** 31 },
      }),
      record('fraction', { charge: { credits_micro: 1, tokens: 0.5 } }),
      record('negative', { usage: { prompt_tokens: -3, completion_tokens: 0, total_tokens: -3 } }),
      record('status', { httpStatus: 2 ** 32, usage: null }),
      record('max', {
        hold: { credits_micro: 1, tokens: 2 ** 31 - 1 },
        usage: { prompt_tokens: 0, completion_tokens: 2 ** 31 - 1, total_tokens: 2 ** 31 - 1 },
      }),
    ];
    const table = new RecordTable(8, TTL_MS);
    for (const r of records) table.add(r);
    for (const r of records) expect(table.get(r.id, NOW_MS)).toEqual(r);
    const { meta, blobs } = table.serializeColumns();
    // Only the records whose counts do not fit keep them aside.
    expect(Object.keys(meta.bigCounts ?? {})).toEqual(['0', '1', '2', '3', '4']);
    const copy = new RecordTable(8, TTL_MS);
    copy.restoreColumns(JSON.parse(JSON.stringify(meta)), blobs);
    expect([...copy.values(NOW_MS)]).toEqual(records);
    // A slot reused forgets the counts it kept aside.
    const one = new RecordTable(1, TTL_MS);
    one.add(records[0]!);
    one.add(record('small'));
    expect(one.serializeColumns().meta.bigCounts).toEqual({});
    // A flood of such records keeps no more aside than the table holds records.
    const flooded = new RecordTable(100, TTL_MS);
    for (let i = 0; i < 1_000; i++)
      flooded.add(record(`flood-${i}`, { hold: { credits_micro: 1, tokens: 2 ** 40 + i } }));
    const kept = flooded.serializeColumns().meta.bigCounts ?? {};
    expect(Object.keys(kept)).toHaveLength(100);
    expect(flooded.get('flood-999', NOW_MS)?.hold.tokens).toBe(2 ** 40 + 999);
    expect(flooded.get('flood-899', NOW_MS)).toBeUndefined();
  });

  test('an id is added once; an unfinished record is refused', () => {
    const table = new RecordTable(3, TTL_MS);
    table.add(record('a'));
    expect(() => table.add(record('a'))).toThrow('record a exists');
    expect(() => table.add(record('b', { status: 'in_progress' }))).toThrow('not finished');
  });
});
