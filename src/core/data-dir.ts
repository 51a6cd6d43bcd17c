// Names of the files a server keeps in its data dir that other commands on the same
// machine read (`llmgw ctl` finds the server and its admin key through them), and the
// one writer of the admin key file.
import { chmodSync, renameSync, rmSync, writeFileSync } from "node:fs";
import path from "node:path";

export const ADMIN_KEY_FILE = "admin.key";
export const SERVER_INFO_FILE = "server.json";

/**
 * Writes DATA_DIR/admin.key (mode 0600, whatever the umask) whole or not at all: a reader
 * never sees half a key, and a failed write leaves the old one. Returns the file's path.
 */
export function writeAdminKeyFile(dataDir: string, key: string): string {
  const file = path.join(dataDir, ADMIN_KEY_FILE);
  const scratch = `${file}.${process.pid}.new`;
  try {
    writeFileSync(scratch, `${key}\n`, { mode: 0o600 });
    chmodSync(scratch, 0o600);
    renameSync(scratch, file);
  } finally {
    rmSync(scratch, { force: true });
  }
  return file;
}
