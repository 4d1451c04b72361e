// One process owns a data dir: a kernel lock (flock) on DATA_DIR/lock that dies with its holder;
// the CLI uses the admin API while it is held.
import { dlopen, FFIType, type Pointer, read } from 'bun:ffi';
import {
  closeSync,
  constants,
  fstatSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readSync,
  statSync,
  unlinkSync,
  writeSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { assert } from '../util/assert.ts';

/** flock(2) operations: the same values on Linux, macOS and the BSDs. */
const LOCK_EX = 2;
const LOCK_NB = 4;
/**
 * A release unlinks the file; a racing opener may lock the unlinked inode and must start over, at
 * most this often.
 */
const ACQUIRE_ATTEMPTS_MAX = 8;
/**
 * The lock file holds a pid and a URL; a reader looks at this much of it, whatever else was put
 * there.
 */
const LOCK_FILE_BYTES_MAX = 4096;

/**
 * The data dir cannot be locked at all (no flock on this platform, or the kernel refused for a
 * reason other than a holder).
 */
export class DataDirLockError extends Error {
  override name = 'DataDirLockError';
}

/** The data dir cannot be made or used (a path under /proc, no permission, a read-only disk). */
export class DataDirError extends Error {
  override name = 'DataDirError';
}

interface Libc {
  flock(fd: number, operation: number): number;
  errno(): number;
  /** EWOULDBLOCK: the lock is held by another open file description. */
  wouldBlock: number;
}

/**
 * Where libc and its errno live on each platform; glibc first, then musl (which answers to
 * "libc.so").
 */
const LIBC_BY_PLATFORM: Partial<
  Record<NodeJS.Platform, { names: string[]; errnoSymbol: string; wouldBlock: number }>
> = {
  linux: { names: ['libc.so.6', 'libc.so'], errnoSymbol: '__errno_location', wouldBlock: 11 },
  darwin: {
    names: ['libSystem.B.dylib', '/usr/lib/libSystem.B.dylib'],
    errnoSymbol: '__error',
    wouldBlock: 35,
  },
  freebsd: { names: ['libc.so.7'], errnoSymbol: '__error', wouldBlock: 35 },
};

let libc: Libc | null = null;

/**
 * Loads flock from the system's libc once, on first use (bun:ffi; also inside a `bun build
 * --compile` binary).
 */
function loadLibc(): Libc {
  if (libc) return libc;
  const platform = LIBC_BY_PLATFORM[process.platform];
  if (!platform)
    throw new DataDirLockError(
      `the data dir lock needs flock(2), which tollgate ` +
        `does not know how to reach on ${process.platform}`,
    );
  const failures: string[] = [];
  for (const name of platform.names) {
    try {
      const { symbols } = dlopen(name, {
        flock: { args: [FFIType.i32, FFIType.i32], returns: FFIType.i32 },
        [platform.errnoSymbol]: { args: [], returns: FFIType.ptr },
      });
      const errnoLocation = symbols[platform.errnoSymbol]!;
      libc = {
        flock: (fd, operation) => symbols.flock(fd, operation) as number,
        errno: () => {
          const location = errnoLocation() as Pointer | null;
          return location === null ? -1 : read.i32(location, 0);
        },
        wouldBlock: platform.wouldBlock,
      };
      return libc;
    } catch (error) {
      failures.push(`${name}: ${(error as Error).message}`);
    }
  }
  throw new DataDirLockError(
    `the data dir lock needs flock(2) from libc, ` +
      `which could not be loaded (${failures.join('; ')})`,
  );
}

/** True when `fd` is the file `path` names now (same device and inode). */
function isCurrentFile(fd: number, path: string): boolean {
  const current = statSync(path, { bigint: true, throwIfNoEntry: false });
  if (!current) return false;
  const held = fstatSync(fd, { bigint: true });
  return current.dev === held.dev && current.ino === held.ino;
}

export interface LockHolder {
  /**
   * The holder's pid as it wrote it; null if it has not written it yet (it has just taken the
   * lock).
   */
  pid: number | null;
  /** Where the holder listens, once a gateway has started serving. */
  url: string | null;
}

/**
 * Ownership is decided by the kernel alone: an exclusive flock on DATA_DIR/lock, held through a
 * file descriptor that stays open for the holder's life. The kernel drops it when the process dies
 * however it dies (SIGKILL included), so a restart straight after a crash finds it free; no pid is
 * ever checked for liveness (a zombie or a reused pid used to block restarts). The pid and URL in
 * the file are information for the refusal message and the CLI, never a claim.
 *
 * A flock belongs to the open file description, not the process: the fd is opened O_CLOEXEC (Bun's
 * default), so no child inherits it and outlives us holding the lock, and reading the file through
 * another descriptor (as holder() does) never releases it, unlike fcntl record locks.
 */
export class DataDirLock {
  readonly path: string;
  private fd = -1;

  constructor(dataDir: string) {
    try {
      mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    } catch (error) {
      const { code, message } = error as NodeJS.ErrnoException;
      throw new DataDirError(`cannot create the data dir ${dataDir} (${code ?? message})`);
    }
    this.path = join(dataDir, 'lock');
  }

  /** Takes the lock, or returns false at once (no waiting) when another live process holds it. */
  tryAcquire(): boolean {
    assert(this.fd < 0, 'the data dir lock is already held by this process');
    const { flock, errno, wouldBlock } = loadLibc();
    for (let attempt = 0; attempt < ACQUIRE_ATTEMPTS_MAX; attempt++) {
      let fd: number;
      try {
        fd = openSync(this.path, constants.O_RDWR | constants.O_CREAT, 0o600);
      } catch (error) {
        // A data dir that exists but cannot be written (no permission, a read-only disk).
        const { code, message } = error as NodeJS.ErrnoException;
        throw new DataDirError(
          `cannot use the data dir ${dirname(this.path)} (${code ?? message})`,
        );
      }
      let kept = false;
      try {
        if (flock(fd, LOCK_EX | LOCK_NB) !== 0) {
          const code = errno();
          if (code === wouldBlock) return false;
          throw new DataDirLockError(`flock(${this.path}) failed with errno ${code}`);
        }
        // A holder releasing before us unlinked the file while it still held it; if what we locked
        // is that unlinked inode, the path is a new file (or none) that another process may lock
        // too: start over.
        if (!isCurrentFile(fd, this.path)) continue;
        kept = true;
      } finally {
        if (!kept) closeSync(fd);
      }
      this.fd = fd;
      // Emptied first: a reader sees nothing (pid unknown) rather than a mix of our pid and an old
      // URL.
      ftruncateSync(fd, 0);
      this.write(`${process.pid}\n`);
      return true;
    }
    throw new DataDirLockError(
      `the lock file ${this.path} was replaced ` +
        `${ACQUIRE_ATTEMPTS_MAX} times while it was being locked`,
    );
  }

  /** What the holder wrote into the lock file; meaningful after tryAcquire() returned false. */
  holder(): LockHolder {
    let text: string;
    try {
      const fd = openSync(this.path, 'r');
      try {
        const head = Buffer.alloc(LOCK_FILE_BYTES_MAX);
        text = head.toString('utf8', 0, readSync(fd, head, 0, head.length, 0));
      } finally {
        closeSync(fd);
      }
    } catch {
      return { pid: null, url: null };
    }
    const [pidLine, urlLine] = text.split('\n');
    const pid = Number(pidLine?.trim());
    const url = urlLine?.trim();
    return {
      pid: Number.isSafeInteger(pid) && pid > 0 ? pid : null,
      url: url && /^https?:\/\//.test(url) ? url : null,
    };
  }

  /** Records where this process listens, so the CLI can reach it (PORT=0 included). */
  recordUrl(url: string): void {
    if (this.fd < 0) return;
    // The new text extends the pid line already there, so a concurrent reader sees the old or the
    // new text.
    this.write(`${process.pid}\n${url}\n`);
  }

  /**
   * Removes the file while still holding it (see tryAcquire's inode check), then lets the lock go.
   */
  release(): void {
    if (this.fd < 0) return;
    const fd = this.fd;
    this.fd = -1;
    try {
      // Never someone else's file: only a holder unlinks, and only the inode it holds.
      if (isCurrentFile(fd, this.path)) unlinkSync(this.path);
    } finally {
      closeSync(fd);
    }
  }

  private write(text: string): void {
    const bytes = Buffer.from(text);
    writeSync(this.fd, bytes, 0, bytes.length, 0);
    ftruncateSync(this.fd, bytes.length);
  }
}
