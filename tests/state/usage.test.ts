// The usage history: one row per UTC day, key and model, counted from finish events; old days go
// whole; a snapshot of it restores the same rows.
import { expect, test } from 'bun:test';
import { DAY_MS, UsageTable } from '../../src/state/usage.ts';
import { requestFinished } from './support.ts';

const DAY = 20_000;
const at = (day: number, hour = 0) => day * DAY_MS + hour * 3_600_000;

function finished(
  status: 'completed' | 'cancelled' | 'error',
  atMs: number,
  chargeMicro: number,
  tokens: [number, number] | null = [10, 20],
) {
  return requestFinished('r', chargeMicro, {
    status,
    at_ms: atMs,
    error_code: status === 'completed' ? null : 'upstream_error',
    usage:
      tokens === null
        ? null
        : {
            prompt_tokens: tokens[0],
            completion_tokens: tokens[1],
            total_tokens: tokens[0] + tokens[1],
          },
  });
}

const all = (table: UsageTable, keyId?: string, model?: string) => [
  ...table.rows(Number.NEGATIVE_INFINITY, Number.POSITIVE_INFINITY, keyId, model),
];

test('finishes of one day, key and model add up in one row; others get their own', () => {
  const table = new UsageTable(400);
  table.add('k1', 'm1', finished('completed', at(DAY, 1), 1_000));
  table.add('k1', 'm1', finished('cancelled', at(DAY, 23), 7, null));
  table.add('k1', 'm1', finished('error', at(DAY, 2), 0));
  table.add('k1', 'm2', finished('completed', at(DAY, 3), 5));
  table.add('k2', 'm1', finished('completed', at(DAY + 1), 9));
  expect(all(table)).toEqual([
    {
      day: DAY,
      keyId: 'k1',
      model: 'm1',
      requests: 3,
      completed: 1,
      cancelled: 1,
      errors: 1,
      promptTokens: 20,
      completionTokens: 40,
      chargedMicro: 1_007,
    },
    expect.objectContaining({ day: DAY, keyId: 'k1', model: 'm2', requests: 1, chargedMicro: 5 }),
    expect.objectContaining({ day: DAY + 1, keyId: 'k2', model: 'm1', chargedMicro: 9 }),
  ]);
  expect(all(table, 'k1').length).toBe(2);
  expect(all(table, 'k1', 'm2').length).toBe(1);
  expect(all(table, 'nobody')).toEqual([]);
  expect([...table.rows(DAY + 1, DAY + 1)].map((row) => row.keyId)).toEqual(['k2']);
});

test('a day past the retention goes whole; an older finish counts in the oldest kept day', () => {
  const table = new UsageTable(2);
  table.add('k1', 'm1', finished('completed', at(DAY), 1));
  table.add('k1', 'm1', finished('completed', at(DAY + 1), 2));
  expect(table.size).toBe(2);
  table.add('k1', 'm1', finished('completed', at(DAY + 2), 3));
  expect(all(table).map((row) => row.day)).toEqual([DAY + 1, DAY + 2]);
  // A clock stepped back: into a kept day it counts there, past the retention in the oldest kept
  // day, so the sums stay the ledger's.
  table.add('k1', 'm1', finished('completed', at(DAY + 1, 5), 4));
  table.add('k1', 'm1', finished('completed', at(DAY), 5));
  expect(all(table).map((row) => [row.day, row.chargedMicro])).toEqual([
    [DAY + 1, 11],
    [DAY + 2, 3],
  ]);
});

test('one finish dated far ahead empties nothing; the history moves a day a finish', () => {
  const table = new UsageTable(30);
  table.add('k1', 'm1', finished('completed', at(DAY), 100));
  table.add('k1', 'm1', finished('completed', at(DAY), 200));
  // A bad clock at boot: one finish dated two years ahead, then the clock is right again.
  table.add('k1', 'm1', finished('completed', at(DAY + 730), 300));
  table.add('k1', 'm1', finished('completed', at(DAY, 1), 400));
  const sum = all(table).reduce((total, row) => total + row.chargedMicro, 0);
  expect(sum).toBe(1_000);
  expect(all(table).map((row) => row.day)).toEqual([DAY, DAY + 730]);
  // Real days pass: the old ones go once the history has moved past them, one day per finish.
  for (let day = 1; day <= 40; day++)
    table.add('k1', 'm1', finished('completed', at(DAY + day), 1));
  expect(all(table)[0]!.day).toBe(DAY + 11);
  // A snapshot keeps where the history had moved to (not its furthest row).
  const copy = new UsageTable(30);
  const { meta, blobs } = table.serialize();
  copy.restore(JSON.parse(JSON.stringify(meta)), blobs);
  for (const t of [table, copy]) t.add('k2', 'm1', finished('completed', at(DAY + 41), 7));
  expect(all(copy)).toEqual(all(table));
});

test('many rows a day grow their columns; a snapshot restores every row', () => {
  const table = new UsageTable(400);
  for (let key = 0; key < 50; key++)
    for (let model = 0; model < 3; model++)
      table.add(
        `k${key}`,
        `m${model}`,
        finished('completed', at(DAY + (key % 2)), key * 10 + model),
      );
  const { meta, blobs } = table.serialize();
  const copy = new UsageTable(400);
  copy.restore(JSON.parse(JSON.stringify(meta)), blobs);
  expect(all(copy)).toEqual(all(table));
  expect(copy.size).toBe(150);
  // The restored table goes on adding to the same rows.
  for (const t of [table, copy]) t.add('k3', 'm1', finished('completed', at(DAY + 1, 4), 100));
  expect(all(copy)).toEqual(all(table));
  expect(() => copy.restore(meta, blobs)).toThrow('usage restored into a used table');
  expect(() => new UsageTable(400).restore(meta, [blobs[0]!.subarray(8), blobs[1]!])).toThrow(
    'snapshot usage: columns of the wrong size',
  );
});
