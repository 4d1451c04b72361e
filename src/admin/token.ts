// The admin token: ADMIN_TOKEN, or one generated on first start into DATA_DIR/admin-token (mode
// 0600).
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError } from '../config/load.ts';
import type { Config } from '../config/model.ts';
import { randomBase62 } from '../util/ids.ts';

/** Shorter than this, the start warns: the generated token has 44 characters. */
export const ADMIN_TOKEN_ADVISED_LENGTH = 16;
/** As ADMIN_TOKEN's (config/model.ts). */
const ADMIN_TOKEN_CHARS_MAX = 1024;

export interface AdminToken {
  token: string;
  /** Where it was read from or written to; null when it came from the environment or config. */
  path: string | null;
  generated: boolean;
}

function adminTokenPath(config: Config): string {
  return join(config.data_dir, 'admin-token');
}

export function resolveAdminToken(config: Config, create: boolean): AdminToken | null {
  if (config.admin_token) return { token: config.admin_token, path: null, generated: false };
  const path = adminTokenPath(config);
  if (existsSync(path)) {
    const token = readFileSync(path, 'utf8').trim();
    // Held to ADMIN_TOKEN's bounds: an empty file started a gateway whose admin API nobody could
    // use (every token refused), and said nothing.
    if (token.length === 0 || token.length > ADMIN_TOKEN_CHARS_MAX)
      throw new ConfigError(
        `${path}: the admin token must be 1-${ADMIN_TOKEN_CHARS_MAX} characters, got ` +
          `${token.length}; write one in, or remove the file for \`serve\` to generate one`,
      );
    return { token, path, generated: false };
  }
  if (!create) return null;
  mkdirSync(config.data_dir, { recursive: true, mode: 0o700 });
  const token = `tga-${randomBase62(40)}`;
  writeFileSync(path, `${token}\n`, { mode: 0o600, flag: 'wx' });
  chmodSync(path, 0o600);
  return { token, path, generated: true };
}
