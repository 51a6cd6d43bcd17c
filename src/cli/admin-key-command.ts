// `llmgw admin-key reset`: the way back in for an operator who lost every admin key. It
// runs on the server's machine, with the data dir (and --database, for PostgreSQL) the
// server uses, whether or not the server runs, and prints the new key once.
import { existsSync } from "node:fs";
import { BadRequestError } from "../core/errors.ts";
import { isPostgresUrl, openStore } from "../store/store.ts";
import { resetAdminKey } from "../keys/admin-key-reset.ts";
import { resolveDataDir, resolveDatabase } from "./config.ts";

export async function runAdminKeyReset(flags: { dataDir?: string; database?: string }): Promise<void> {
  const dataDir = resolveDataDir(flags.dataDir);
  const database = resolveDatabase(flags.database, dataDir);
  // Opening a SQLite file that is not there would create an empty database: a typo in
  // --data-dir would mint a key nobody's server knows.
  if (!isPostgresUrl(database) && !existsSync(database)) {
    throw new BadRequestError(
      `No llmgw database at ${database}. Pass the server's data dir with --data-dir (or LLMGW_DATA_DIR), and --database when it uses PostgreSQL.`,
    );
  }
  const store = await openStore({ database });
  try {
    const { key, info, file } = await resetAdminKey({ store, dataDir });
    process.stdout.write(
      `New admin key '${info.name}' (shown once; also saved to ${file}, mode 0600):\n  ${key}\n\n` +
        `It works at once, whether or not the server runs. Earlier admin keys stay valid: list them with 'llmgw ctl key list' and revoke the lost one.\n`,
    );
  } finally {
    await store.close();
  }
}
