// External servers' keys at rest (issue 25), on both databases: the catalog stores them
// sealed, shows them as set, opens them for the external replica only; rows an older
// llmgw wrote with a plain key are sealed when a server starts, and the key still reaches
// the upstream (a stand-in OpenAI-compatible server on loopback that demands it).
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, existsSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { Catalog } from "./catalog.ts";
import { redactDefinition } from "./model-schema.ts";
import { BadRequestError } from "../core/errors.ts";
import { SecretBox } from "../core/secret-box.ts";
import { syncExternalReplicas } from "../fleet/external-replicas.ts";
import { ReplicaTable } from "../fleet/replica-table.ts";
import { readAudit } from "../store/audit.ts";
import { openStore, type Store } from "../store/store.ts";
import { startFakeUpstream } from "../../test/support/fake-upstream.ts";
import { startHarness } from "../../test/support/server-harness.ts";
import { testBothDatabases, testBothStores } from "../../test/support/stores.ts";

const noWeights = { check: async () => undefined };

async function storedDefinition(store: Store, name: string): Promise<string> {
  const row = await store.db.selectFrom("models").select("definition").where("name", "=", name).executeTakeFirstOrThrow();
  return row.definition;
}

testBothStores("an external key is stored sealed, shown as set, and opened only for the replica that calls the server", async (store) => {
  const box = SecretBox.fromKey(randomBytes(32));
  const catalog = new Catalog({ store, box, weights: noWeights });
  await catalog.refresh();
  const table = new ReplicaTable();
  const stopSync = syncExternalReplicas(catalog, table);
  try {
    await catalog.create({ name: "ext", profiles: [{ name: "up", engine: "external", url: "http://127.0.0.1:9", api_key: "sk-first-plain-key" }] }, "t");

    const stored = await storedDefinition(store, "ext");
    assert.doesNotMatch(stored, /sk-first-plain-key/);
    const sealed = (JSON.parse(stored) as { profiles: { api_key?: string; api_key_sealed?: string }[] }).profiles[0];
    assert.equal(sealed?.api_key, undefined);
    assert.equal(box.open(sealed?.api_key_sealed ?? ""), "sk-first-plain-key", "sealed with the server's box");
    assert.doesNotMatch(JSON.stringify(catalog.list()), /sk-first-plain-key/, "the snapshot holds the sealed form only");
    const replica = table.all().find((r) => r.modelName === "ext");
    assert.equal(replica?.engineKey, "sk-first-plain-key", "the external replica carries the opened key");

    const shown = redactDefinition(catalog.get("ext").definition);
    assert.doesNotMatch(JSON.stringify(shown), /sk-first-plain-key|api_key_sealed/);
    assert.equal((shown.profiles as { api_key_set: boolean }[])[0]?.api_key_set, true);

    // The same key sent again is no change: the row keeps its sealed text.
    await catalog.update("ext", { profiles: [{ name: "up", engine: "external", url: "http://127.0.0.1:9", api_key: "sk-first-plain-key" }] }, "t");
    assert.equal(await storedDefinition(store, "ext"), stored);
    assert.deepEqual((await readAudit(store.db, { action: "model.update" }))[0]?.detail, { changed: [] });

    await catalog.update("ext", { profiles: [{ name: "up", engine: "external", url: "http://127.0.0.1:9", api_key: "sk-second-plain-key" }] }, "t");
    assert.doesNotMatch(await storedDefinition(store, "ext"), /sk-(first|second)-plain-key/);
    assert.equal(table.all().find((r) => r.modelName === "ext")?.engineKey, "sk-second-plain-key");
    assert.doesNotMatch(JSON.stringify(await readAudit(store.db)), /plain-key|api_key_sealed/);

    // A sealed value comes from the catalog only, never from a client.
    const sealedByClient = { name: "up", engine: "external", url: "http://127.0.0.1:9", api_key_sealed: sealed?.api_key_sealed };
    for (const attempt of [
      () => catalog.create({ name: "copied", profiles: [sealedByClient] }, "t"),
      () => catalog.update("ext", { profiles: [sealedByClient] }, "t"),
    ]) {
      await assert.rejects(
        attempt(),
        (e: unknown) => e instanceof BadRequestError && e.param === "profiles.0.api_key_sealed" && /send the external server's key as api_key/.test(e.message),
      );
    }

    // A server with another secret cannot open the key, and says which model needs it again.
    const stranger = new Catalog({ store, box: SecretBox.fromKey(randomBytes(32)), weights: noWeights });
    await stranger.refresh();
    assert.equal(stranger.apiKeyOf(stranger.get("ext").definition.profiles[0]!), null);
    assert.match(stranger.unreadableModels()[0] ?? "", /^ext: profile 'up' has an api_key sealed with another secret/);
  } finally {
    stopSync();
  }
});

testBothDatabases("a plain external key an older llmgw stored is sealed when the server starts, and still reaches the upstream", async (database) => {
  const plainKey = `sk-older-llmgw-${randomBytes(8).toString("hex")}`;
  const upstream = await startFakeUpstream({ key: plainKey, reply: "sealed and still working" });
  // The database as an llmgw before issue 25 left it: the key in the definition as it was sent.
  const older = await openStore({ ...database.spec, migrateUntil: "0013_usage_estimated" });
  try {
    await older.db
      .insertInto("models")
      .values({
        id: "m-old",
        name: "old-external",
        definition: JSON.stringify({ profiles: [{ name: "up", engine: "external", url: upstream.url, api_key: plainKey }] }),
        created_by: "admin:old",
        created_at: "2026-01-01T00:00:00.000Z",
        updated_by: "admin:old",
        updated_at: "2026-01-01T00:00:00.000Z",
      })
      .execute();
    // Rows after it on the same page: the sealed row's old text is then freed in the middle
    // of the page, where SQLite leaves it unless told to overwrite freed space.
    for (const name of ["later-a", "later-b", "later-c"]) {
      await older.db
        .insertInto("models")
        .values({
          id: `m-${name}`,
          name,
          definition: JSON.stringify({ description: name.repeat(40), profiles: [{ name: "up", engine: "external", url: upstream.url }] }),
          created_by: "admin:old",
          created_at: "2026-01-01T00:00:00.000Z",
          updated_by: "admin:old",
          updated_at: "2026-01-01T00:00:00.000Z",
        })
        .execute();
    }
  } finally {
    await older.close();
  }
  const sqlite = !("schema" in database.spec) || database.spec.schema === undefined;
  const harness = await startHarness(
    sqlite ? { dataDir: path.dirname(database.spec.database) } : { database: database.spec, dataDir: mkdtempSync(path.join(tmpdir(), "llmgw-sealed-")) },
  );
  try {
    const response = await fetch(`${harness.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${await harness.clientKey()}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "old-external", messages: [{ role: "user", content: "hi" }] }),
    });
    assert.equal(response.status, 200, await response.clone().text());
    assert.match(JSON.stringify(await response.json()), /sealed and still working/);
    assert.equal(upstream.requests.at(-1)?.authorization, `Bearer ${plainKey}`, "the upstream got the key the older llmgw stored");

    const listed = await harness.admin("GET", "/api/v1/models");
    assert.doesNotMatch(JSON.stringify(listed.body), new RegExp(plainKey));
    assert.equal(listed.body.data.find((m: { name: string }) => m.name === "old-external").profiles[0].api_key_set, true);

    const store = await openStore(database.spec);
    try {
      const stored = await storedDefinition(store, "old-external");
      assert.doesNotMatch(stored, new RegExp(plainKey));
      assert.match(stored, /"api_key_sealed":"v1:/);
      const audit = await readAudit(store.db, { action: "model.seal_keys" });
      assert.deepEqual(
        audit.map((entry) => [entry.actor, entry.target, entry.detail]),
        [["llmgw", "old-external", { profiles: ["up"] }]],
      );
    } finally {
      await store.close();
    }
    if (sqlite) {
      // The old text must not stay behind in free pages or the WAL either.
      for (const file of [database.spec.database, `${database.spec.database}-wal`].filter((f) => existsSync(f))) {
        assert.equal(readFileSync(file).includes(plainKey), false, `${path.basename(file)} still holds the plain key`);
      }
    }
  } finally {
    await harness.close();
    await upstream.close();
  }
});
