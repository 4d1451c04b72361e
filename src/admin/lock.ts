// One process owns a data dir: the gateway holds DATA_DIR/lock; the CLI uses the admin API while it does.
import { closeSync, mkdirSync, openSync, readFileSync, unlinkSync, writeFileSync, writeSync } from 'node:fs';
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
      const pid = Number(readFileSync(this.path, 'utf8').split('\n')[0]!.trim());
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

  /** The address the live holder listens on, when it wrote one. */
  holderUrl(): string | null {
    if (this.holder() === null) return null;
    try {
      const url = readFileSync(this.path, 'utf8').split('\n')[1]?.trim();
      return url ? url : null;
    } catch {
      return null;
    }
  }

  /** Records where this process listens, so the CLI can reach it (PORT=0 included). */
  recordUrl(url: string): void {
    if (!this.held) return;
    writeFileSync(this.path, `${process.pid}\n${url}\n`, { mode: 0o600 });
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
