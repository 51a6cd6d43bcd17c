import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { sql } from "kysely";
import { openStore, isUniqueViolation } from "./store.ts";
import { StorageUnavailableError } from "./storage-fault.ts";
import { readAudit, recordAudit } from "./audit.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { eventually } from "../../test/support/eventually.ts";

testBothStores("migrations create every table and record themselves", async (store) => {
  // Read the catalog of this schema only: introspecting every schema races with other tests dropping theirs.
  const listed =
    store.dialect === "postgres"
      ? await sql<{ name: string }>`select table_name as name from information_schema.tables where table_schema = ${store.schema}`.execute(store.db)
      : await sql<{ name: string }>`select name from sqlite_master where type = 'table'`.execute(store.db);
  const names = listed.rows.map((row) => row.name);
  for (const table of [
    "llmgw_migrations",
    "models",
    "model_aliases",
    "audit_log",
    "api_keys",
    "nodes",
    "replicas",
    "usage",
    "mirror_files",
    "store_probe",
    "model_states",
    "events",
    "usage_minutes",
    "usage_hours",
    "key_budgets",
    "key_rate_windows",
    "notify_channels",
    "notify_deliveries",
    "notify_cursor",
    "console_sessions",
    "mirror_holders",
    "cluster_members",
    "cluster_leader",
    "cluster_settings",
    "model_weights",
    "model_scaling",
    "gateway_loads",
  ]) {
    assert.ok(names.includes(table), `missing table ${table} in ${names.join(", ")}`);
  }
  const applied = await sql<{ name: string }>`select name from llmgw_migrations order by name`.execute(store.db);
  assert.deepEqual(
    applied.rows.map((r) => r.name),
    [
      "0001_foundation",
      "0002_mirror",
      "0003_mirror_verified",
      "0004_store_probe",
      "0005_fleet",
      "0006_jobs",
      "0007_key_limits",
      "0008_usage_aggregates",
      "0009_key_guards",
      "0010_notify",
      "0011_console_sessions",
      "0012_cluster",
      "0013_usage_estimated",
      "0014_autoscaling",
      "0015_responses",
    ],
  );
});

testBothStores("a store migrates in its own schema even when another schema holds llmgw tables", async (store) => {
  if (store.dialect !== "postgres") return;
  const { openPostgresTestStore } = await import("../../test/support/stores.ts");
  const other = await openPostgresTestStore();
  try {
    const rows = await other.store.db.selectFrom("models").select("id").execute();
    assert.deepEqual(rows, []);
    assert.notEqual(other.store.schema, store.schema);
  } finally {
    await other.cleanup();
  }
});

testBothStores("serial ids, integer round trip and unique violations are detected", async (store) => {
  await store.db
    .insertInto("usage")
    .values({
      at: "2026-01-01T00:00:00.000Z",
      key_id: null,
      model: "m",
      replica_id: null,
      endpoint: "/v1/chat/completions",
      prompt_tokens: 3,
      completion_tokens: 4,
      ttft_ms: null,
      duration_ms: 12,
      status: 200,
      stream: 0,
    })
    .execute();
  const rows = await store.db.selectFrom("usage").selectAll().execute();
  assert.equal(rows.length, 1);
  assert.equal(typeof rows[0]!.id, "number");
  assert.equal(rows[0]!.prompt_tokens, 3);

  const key = {
    id: "k1",
    name: "a",
    prefix: "p",
    hash: "h",
    role: "client",
    allowed_models: null,
    expires_at: null,
    revoked_at: null,
    created_at: "t",
    created_by: "x",
    last_used_at: null,
  };
  await store.db.insertInto("api_keys").values(key).execute();
  await assert.rejects(
    store.db
      .insertInto("api_keys")
      .values({ ...key, id: "k2" })
      .execute(),
    (error: unknown) => isUniqueViolation(error),
  );
});

test("a SQLite store reopens with its data and does not re-run migrations", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-store-"));
  try {
    const file = path.join(dir, "llmgw.db");
    const first = await openStore({ database: file });
    await first.db
      .insertInto("nodes")
      .values({ id: "n1", name: "local", address: "127.0.0.1", labels: "{}", inventory: "{}", state: "ready", last_heartbeat: "t" })
      .execute();
    await first.close();
    const second = await openStore({ database: file });
    const nodes = await second.db.selectFrom("nodes").select("name").execute();
    assert.deepEqual(nodes, [{ name: "local" }]);
    const journal = await sql<{ journal_mode: string }>`pragma journal_mode`.execute(second.db);
    assert.equal(journal.rows[0]?.journal_mode, "wal");
    await second.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("an unreachable PostgreSQL gives an error naming the server", async () => {
  await assert.rejects(openStore({ database: "postgres://nobody@127.0.0.1:1/none" }), /Cannot connect to PostgreSQL at postgres:\/\/127\.0\.0\.1:1\/none/);
});

test("a full disk inside a transaction is named as such, not as a failed rollback, and writes work again once there is room", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-store-"));
  const store = await openStore({ database: path.join(dir, "llmgw.db") });
  try {
    const sqlite = store.sqlite!;
    const bigRows = (trx: typeof store.db) =>
      Promise.all(
        Array.from({ length: 20 }, () =>
          trx
            .insertInto("audit_log")
            .values({ at: "t", actor: "a", action: "x", target: "y", detail: "z".repeat(3000) })
            .execute(),
        ),
      );
    // max_page_count makes SQLite answer SQLITE_FULL, and roll the transaction back by
    // itself, exactly as a full disk does: the real error path of a real database file.
    sqlite.pragma(`max_page_count = ${sqlite.pragma("page_count", { simple: true }) as number}`);
    const failure = await store.db
      .transaction()
      .execute((trx) => bigRows(trx))
      .then(
        () => assert.fail("the transaction should have failed"),
        (error: unknown) => error,
      );
    assert.ok(failure instanceof StorageUnavailableError, `a StorageUnavailableError, got ${String(failure)}`);
    assert.equal(failure.status, 503);
    assert.equal(failure.code, "storage_unavailable");
    assert.equal(failure.faultCode, "SQLITE_FULL");
    assert.match(failure.message, new RegExp(`the data dir ${dir} .*the disk is full \\(SQLITE_FULL\\)\\. Free space there`));
    assert.equal(store.health.fault()?.code, "SQLITE_FULL");
    // A lone statement is named the same way.
    await assert.rejects(bigRows(store.db), StorageUnavailableError);

    sqlite.pragma("max_page_count = 1000000");
    await store.db.transaction().execute((trx) => bigRows(trx));
    assert.equal(await store.checkWrites(), null, "the probe write clears the fault");
  } finally {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a read-only SQLite database is a storage fault until writes work again", async () => {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-store-"));
  const store = await openStore({ database: path.join(dir, "llmgw.db") });
  try {
    // query_only makes every write fail with SQLITE_READONLY, as a read-only data dir does.
    store.sqlite!.pragma("query_only = 1");
    const write = () =>
      store.db
        .insertInto("nodes")
        .values({ id: "n1", name: "local", address: "a", labels: "{}", inventory: "{}", state: "ready", last_heartbeat: "t" })
        .execute();
    await assert.rejects(
      write(),
      (error: unknown) => error instanceof StorageUnavailableError && error.kind === "read_only" && /read-only/.test(error.message),
    );
    assert.equal((await store.checkWrites())?.kind, "read_only", "the probe write fails too, so the fault stays");
    assert.equal((await store.db.selectFrom("nodes").selectAll().execute()).length, 0, "reads still work");
    store.sqlite!.pragma("query_only = 0");
    await eventually("the probe to clear the fault", async () => (await store.checkWrites()) === null);
    await write();
  } finally {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

testBothStores("a write refused by the database is a named storage fault", async (store) => {
  // A read-only transaction makes the database itself refuse the write (PostgreSQL 25006,
  // SQLite SQLITE_READONLY through query_only): the code, not the text, names the fault.
  const refused = store.db.transaction().execute(async (trx) => {
    if (store.dialect === "postgres") await sql`set transaction read only`.execute(trx);
    else await sql`pragma query_only = 1`.execute(trx);
    await trx
      .insertInto("nodes")
      .values({ id: "n1", name: "local", address: "a", labels: "{}", inventory: "{}", state: "ready", last_heartbeat: "t" })
      .execute();
  });
  await assert.rejects(
    refused,
    (error: unknown) =>
      error instanceof StorageUnavailableError &&
      error.kind === "read_only" &&
      error.message.includes(store.dialect === "postgres" ? "PostgreSQL at" : "the data dir"),
  );
  if (store.dialect === "sqlite") store.sqlite!.pragma("query_only = 0");
  assert.equal(store.health.fault()?.kind, "read_only");
  await eventually("the probe to clear the fault", async () => (await store.checkWrites()) === null);
  const unrelated = await store.db
    .insertInto("nodes")
    .values({ id: "n1", name: "x", address: "a", labels: "{}", inventory: "{}", state: "ready", last_heartbeat: "t" })
    .execute()
    .then(() =>
      store.db.insertInto("nodes").values({ id: "n1", name: "x", address: "a", labels: "{}", inventory: "{}", state: "ready", last_heartbeat: "t" }).execute(),
    )
    .catch((error: unknown) => error);
  assert.ok(isUniqueViolation(unrelated), "other database errors stay what they are");
});

testBothStores("the audit is read newest first, by exact action, by action prefix and by target", async (store) => {
  const entries = [
    ["key.create", "llmgw-aaa"],
    ["key.revoke", "llmgw-aaa"],
    ["model.create", "m_1"],
    ["model.unpark", "m_1"],
    ["mirror.fetch", "m_1/abc"],
    ["keyring.x", "other"],
  ];
  for (const [action, target] of entries)
    await recordAudit(store.db, { at: "2026-11-30T10:00:00.000Z", actor: "admin:root", action: action!, target: target!, detail: { n: 1 } });
  const actions = async (query: Parameters<typeof readAudit>[1]) => (await readAudit(store.db, query)).map((e) => e.action);
  assert.deepEqual(await actions({}), ["keyring.x", "mirror.fetch", "model.unpark", "model.create", "key.revoke", "key.create"]);
  assert.deepEqual(await actions({ action: "key." }), ["key.revoke", "key.create"], "a prefix ends at the dot: keyring.x is not key.*");
  assert.deepEqual(await actions({ action: "key.revoke" }), ["key.revoke"]);
  assert.deepEqual(await actions({ action: "key" }), []);
  assert.deepEqual(await actions({ action: "k_y." }), [], "'_' is a character, not a wildcard");
  assert.deepEqual(await actions({ target: "m_1" }), ["model.unpark", "model.create"]);
  assert.deepEqual(await actions({ target: "m%" }), []);
  assert.deepEqual(await actions({ action: "model.", target: "m_1", limit: 1 }), ["model.unpark"]);
  assert.deepEqual((await readAudit(store.db, { action: "mirror." }))[0]?.detail, { n: 1 });
});

test("migrations import nothing but Kysely and their own frozen code, so live changes cannot change them", async () => {
  const { readFileSync, readdirSync } = await import("node:fs");
  const { fileURLToPath } = await import("node:url");
  const here = path.dirname(fileURLToPath(import.meta.url));
  const files = ["migrations.ts", ...readdirSync(path.join(here, "migrations")).map((name) => path.join("migrations", name))];
  const imported = files.flatMap((file) =>
    [...readFileSync(path.join(here, file), "utf8").matchAll(/^import\b[^;]*?from\s+"([^"]+)"/gm)].map((match) => `${file}: ${match[1]}`),
  );
  const live = imported.filter((entry) => !/: (kysely|\.\/migrations\/[^/]+\.ts)$/.test(entry));
  assert.deepEqual(live, [], "a migration that calls live code changes when that code does: copy what it needs under src/store/migrations/");
  assert.ok(
    imported.some((entry) => entry.endsWith(": ./migrations/0008-usage-backfill.ts")),
    `the scan sees the imports (${imported.join("; ")})`,
  );
});
