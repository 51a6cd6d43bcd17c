// The join token, one for the whole cluster: a node joins through any server (or through a
// standby, which passes the join to the leader), so every server must accept the same
// token. On PostgreSQL it lives sealed with the cluster secret in `cluster_settings`; the
// first server to start puts its own data dir's token there (so a server that ran alone
// keeps the token its nodes know), and every server writes the shared one to its
// DATA_DIR/join.token too, where operators look for it. SQLite: the data dir's, as before.
import { ConflictError } from "../core/errors.ts";
import type { SecretBox } from "../core/secret-box.ts";
import { ensureJoinToken, writeJoinToken } from "../fleet/node-credentials.ts";
import { nowIso, type Store } from "../store/store.ts";

const SETTING = "join_token";

/**
 * `othersRunning`: whether another server runs on the database now. A server that ran
 * alone and is given a cluster secret for the first time cannot open the token it sealed
 * with its own key: with nobody else running, it seals its token again with the new one.
 */
export async function sharedJoinToken(store: Store, box: SecretBox, dataDir: string, othersRunning: () => Promise<boolean>): Promise<string> {
  const own = ensureJoinToken(dataDir);
  if (store.dialect !== "postgres") return own;
  await store.db
    .insertInto("cluster_settings")
    .values({ name: SETTING, value: box.seal(own), updated_at: nowIso() })
    .onConflict((oc) => oc.column("name").doNothing())
    .execute();
  const row = await store.db.selectFrom("cluster_settings").select("value").where("name", "=", SETTING).executeTakeFirstOrThrow();
  const shared = box.open(row.value);
  if (shared === null && !(await othersRunning())) {
    await store.db
      .updateTable("cluster_settings")
      .set({ value: box.seal(own), updated_at: nowIso() })
      .where("name", "=", SETTING)
      .execute();
    return own;
  }
  if (shared === null) {
    throw new ConflictError(
      "The cluster's join token in the database was sealed with another cluster secret. Give this server the secret the other servers have (--cluster-secret-file or LLMGW_CLUSTER_SECRET).",
      { code: "cluster_secret_mismatch" },
    );
  }
  return shared === own ? own : writeJoinToken(dataDir, shared);
}
