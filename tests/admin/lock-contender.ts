// A process that takes and releases the data dir lock in a tight loop (tests/admin/lock.test.ts
// runs several at once). While it holds the lock it creates DATA_DIR/owner exclusively: if two
// processes ever own the dir together, one sees EEXIST.
import { closeSync, openSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { DataDirLock } from '../../src/admin/lock.ts';

const [dataDir, roundsText] = process.argv.slice(2);
const rounds = Number(roundsText);
const lock = new DataDirLock(dataDir!);
const owner = join(dataDir!, 'owner');
let acquired = 0;
let overlaps = 0;

process.stdout.write('ready\n');
// Start together: the test writes one line to every contender's stdin once all are ready.
for await (const _ of process.stdin) break;
for (let round = 0; round < rounds; round++) {
  if (!lock.tryAcquire()) continue;
  acquired++;
  try {
    closeSync(openSync(owner, 'wx'));
    unlinkSync(owner);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
    overlaps++;
  } finally {
    lock.release();
  }
}
process.stdout.write(`${JSON.stringify({ acquired, overlaps })}\n`);
