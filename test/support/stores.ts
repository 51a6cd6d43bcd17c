// Runs a store test against both databases: a SQLite file in a temp dir and a fresh
// schema in the PostgreSQL at LLMGW_TEST_POSTGRES (default 127.0.0.1:5432/test). When
// PostgreSQL is not reachable the PostgreSQL case is skipped with a message saying so,
// unless LLMGW_REQUIRE_POSTGRES=1 (CI sets it), where that is a failure.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { randomBytes } from "node:crypto";
import { test, type TestContext } from "node:test";
import pg from "pg";
import { openStore, type Store } from "../../src/store/store.ts";

export const TEST_POSTGRES_URL = process.env.LLMGW_TEST_POSTGRES ?? "postgres://postgres@127.0.0.1:5432/test";

let postgresReachable: Promise<string | null> | undefined;

/** Resolves to null when PostgreSQL answers, else the reason it does not. */
export function postgresProblem(): Promise<string | null> {
  postgresReachable ??= (async () => {
    const client = new pg.Client({ connectionString: TEST_POSTGRES_URL, connectionTimeoutMillis: 2000 });
    try {
      await client.connect();
      await client.query("select 1");
      return null;
    } catch (error) {
      return error instanceof Error ? error.message : String(error);
    } finally {
      await client.end().catch(() => undefined);
    }
  })();
  return postgresReachable;
}

export async function openSqliteTestStore(): Promise<{ store: Store; cleanup: () => Promise<void> }> {
  const dir = mkdtempSync(path.join(tmpdir(), "llmgw-store-"));
  const store = await openStore({ database: path.join(dir, "llmgw.db") });
  return {
    store,
    cleanup: async () => {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export async function openPostgresTestStore(): Promise<{ store: Store; cleanup: () => Promise<void> }> {
  const schema = `llmgw_test_${randomBytes(6).toString("hex")}`;
  let store: Store;
  try {
    store = await openStore({ database: TEST_POSTGRES_URL, schema });
  } catch (error) {
    await dropSchema(schema).catch(() => undefined);
    throw error;
  }
  return {
    store,
    cleanup: async () => {
      await store.close();
      await dropSchema(schema);
    },
  };
}

/**
 * For a test that needs PostgreSQL itself (two servers on one database): a fresh schema to
 * use, or null after skipping the test (or throws, with LLMGW_REQUIRE_POSTGRES=1) when it is
 * not reachable. The caller drops the schema (dropSchema).
 */
export async function postgresSchemaOrSkip(t: TestContext): Promise<{ database: string; schema: string } | null> {
  const problem = await postgresProblem();
  if (problem === null) return { database: TEST_POSTGRES_URL, schema: `llmgw_test_${randomBytes(6).toString("hex")}` };
  if (process.env.LLMGW_REQUIRE_POSTGRES === "1")
    throw new Error(`PostgreSQL at ${TEST_POSTGRES_URL} is required (LLMGW_REQUIRE_POSTGRES=1) but not reachable: ${problem}`);
  t.skip(`PostgreSQL not reachable at ${TEST_POSTGRES_URL} (${problem})`);
  return null;
}

/** Declares `name` twice, once per database, each with a fresh empty store. */
export function testBothStores(name: string, body: (store: Store, t: TestContext) => Promise<void>): void {
  testBothDatabases(name, async (database, t) => {
    const store = await database.open();
    try {
      await body(store, t);
    } finally {
      await store.close();
    }
  });
}

/** A fresh database that a test may open more than once, and hand to a child process. */
export interface TestDatabase {
  /** What `openStore` (here or in a child process) needs to open it. */
  spec: { database: string; schema?: string };
  /** Opens a new store on it; the caller closes each one. */
  open(): Promise<Store>;
}

/**
 * Declares `name` twice, once per database, each with a fresh empty database that the
 * test opens itself, as often as it likes: for tests of what survives a restart. The
 * PostgreSQL case is skipped (or fails, with LLMGW_REQUIRE_POSTGRES=1) when it is not reachable.
 */
export function testBothDatabases(name: string, body: (database: TestDatabase, t: TestContext) => Promise<void>): void {
  test(`${name} [sqlite]`, async (t) => {
    const dir = mkdtempSync(path.join(tmpdir(), "llmgw-store-"));
    const spec = { database: path.join(dir, "llmgw.db") };
    try {
      await body({ spec, open: () => openStore(spec) }, t);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  test(`${name} [postgres]`, async (t) => {
    const problem = await postgresProblem();
    if (problem !== null) {
      if (process.env.LLMGW_REQUIRE_POSTGRES === "1") {
        throw new Error(`PostgreSQL at ${TEST_POSTGRES_URL} is required (LLMGW_REQUIRE_POSTGRES=1) but not reachable: ${problem}`);
      }
      t.skip(`PostgreSQL not reachable at ${TEST_POSTGRES_URL} (${problem}); set LLMGW_TEST_POSTGRES or start it to run this case`);
      return;
    }
    const spec = { database: TEST_POSTGRES_URL, schema: `llmgw_test_${randomBytes(6).toString("hex")}` };
    try {
      await body({ spec, open: () => openStore(spec) }, t);
    } finally {
      await dropSchema(spec.schema);
    }
  });
}

export async function dropSchema(schema: string): Promise<void> {
  const client = new pg.Client({ connectionString: TEST_POSTGRES_URL });
  await client.connect();
  try {
    await client.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
  } finally {
    await client.end();
  }
}
