// One process owns a data dir: the gateway holds DATA_DIR/lock; the CLI uses the admin API while it does.
import { mkdirSync, openSync, readFileSync, unlinkSync, writeSync, closeSync } from 'node:fs';
import { join } from 'node:path';

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export class DataDirLock {
  private readonly path: string;
  private held = false;

  constructor(dataDir: string) {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    this.path = join(dataDir, 'lock');
  }

  /** The pid holding the lock, if that process is alive. */
  holder(): number | null {
    try {
      const pid = Number(readFileSync(this.path, 'utf8').trim());
      return Number.isInteger(pid) && pid > 0 && pid !== process.pid && alive(pid) ? pid : null;
    } catch {
      return null;
    }
  }

  /** Takes the lock; a lock left by a dead process (a crash) is taken over. */
  tryAcquire(): boolean {
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        const fd = openSync(this.path, 'wx', 0o600);
        writeSync(fd, `${process.pid}\n`);
        closeSync(fd);
        this.held = true;
        return true;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
        if (this.holder() !== null) return false;
        try {
          unlinkSync(this.path);
        } catch {
          // Another process removed it first; try again.
        }
      }
    }
    return false;
  }

  release(): void {
    if (!this.held) return;
    this.held = false;
    try {
      unlinkSync(this.path);
    } catch {
      // Already gone.
    }
  }
}
