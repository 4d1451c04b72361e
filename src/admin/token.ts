// The admin token: ADMIN_TOKEN, or one generated on first start into DATA_DIR/admin-token (mode
// 0600).
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Config } from '../config/model.ts';
import { randomBase62 } from '../util/ids.ts';

/** Shorter than this, the start warns: the generated token has 44 characters. */
export const ADMIN_TOKEN_ADVISED_LENGTH = 16;

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
  if (existsSync(path)) return { token: readFileSync(path, 'utf8').trim(), path, generated: false };
  if (!create) return null;
  mkdirSync(config.data_dir, { recursive: true, mode: 0o700 });
  const token = `tga-${randomBase62(40)}`;
  writeFileSync(path, `${token}\n`, { mode: 0o600, flag: 'wx' });
  chmodSync(path, 0o600);
  return { token, path, generated: true };
}
