// `llmgw admin-key reset`: for an operator who lost every admin key. On the server's
// machine, it opens the store the server uses (SQLite in the data dir, or --database),
// adds a new admin key, rewrites DATA_DIR/admin.key and returns the key to print once.
// It needs no running server and no admin key, only access to the data dir: whoever can
// read that can read the database anyway. Works while the server runs: SQLite in WAL mode
// takes a second writer, and the server's key check finds the new key at once.
import { writeAdminKeyFile } from "../core/data-dir.ts";
import type { Store } from "../store/store.ts";
import { KeyService, type ApiKeyInfo } from "./key-service.ts";

export const ADMIN_KEY_RESET_ACTOR = "system:admin-key-reset";

export async function resetAdminKey(options: {
  store: Store;
  dataDir: string;
  clock?: () => number;
}): Promise<{ key: string; info: ApiKeyInfo; file: string }> {
  const clock = options.clock ?? Date.now;
  const keys = new KeyService({ store: options.store, clock });
  // Named by the time, so it is easy to tell apart (and revoke by name) later.
  const stamp = new Date(clock()).toISOString().replace(/\.\d+Z$/, "Z");
  const { key, info } = await keys.create({ name: `admin-reset-${stamp}`, role: "admin" }, ADMIN_KEY_RESET_ACTOR);
  const file = writeAdminKeyFile(options.dataDir, key);
  return { key, info, file };
}
