// The store: one Kysely handle over SQLite (better-sqlite3, a file in the data dir, WAL)
// or PostgreSQL (pg), with the migration history applied on open. Domains receive a
// Store and write their own tables; nothing else opens the database.
import { chmodSync, mkdirSync } from "node:fs";
import path from "node:path";
import BetterSqlite3 from "better-sqlite3";
import { Kysely, PostgresDialect, SqliteDialect, type Transaction } from "kysely";
import pg from "pg";
import { BadRequestError, InternalError, describeError } from "../core/errors.ts";
import { applyMigrations, MigrationError, type Dialect } from "./migrations.ts";
import type { Database } from "./schema.ts";

export type { Dialect };
export type Db = Kysely<Database>;
export type Tx = Transaction<Database>;

export interface Store {
  readonly db: Db;
  readonly dialect: Dialect;
  /** PostgreSQL: the schema llmgw's tables live in ("public" unless configured). */
  readonly schema?: string;
  /** Where the data lives, for messages (never includes a password). */
  readonly location: string;
  /**
   * The SQLite connection itself, for the few hot writes (usage rows) that use a cached
   * prepared statement instead of compiling a Kysely query each time. Undefined on PostgreSQL.
   */
  readonly sqlite?: BetterSqlite3.Database;
  close(): Promise<void>;
}

export interface OpenStoreOptions {
  /** `postgres://...` for PostgreSQL; otherwise a SQLite file path (or ":memory:"). */
  database: string;
  /** PostgreSQL only: the schema to use (created if missing); tests use one each. */
  schema?: string;
}

const INT8_OID = 20;

export async function openStore(options: OpenStoreOptions): Promise<Store> {
  const isPostgres = /^postgres(ql)?:\/\//.test(options.database);
  const store = isPostgres ? await openPostgres(options) : openSqlite(options.database);
  try {
    await migrate(store);
  } catch (error) {
    await store.close();
    throw error;
  }
  return store;
}

function openSqlite(file: string): Store {
  if (file !== ":memory:") mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
  let database: BetterSqlite3.Database;
  try {
    database = new BetterSqlite3(file);
  } catch (error) {
    throw new BadRequestError(`Cannot open the SQLite database at ${file}: ${describeError(error)}. Check the data dir and its permissions.`, {
      code: "database_unavailable",
      cause: error,
    });
  }
  // WAL lets the gateway read while the agent writes; a busy timeout rides out the short
  // moments when another connection holds the write lock.
  database.pragma("journal_mode = WAL");
  // The database holds key hashes and external servers' keys: owner only, whatever the umask.
  if (file !== ":memory:") {
    for (const suffix of ["", "-wal", "-shm"]) {
      try {
        chmodSync(file + suffix, 0o600);
      } catch {
        // -wal and -shm exist only while a connection is open; the main file always does.
      }
    }
  }
  database.pragma("busy_timeout = 5000");
  database.pragma("foreign_keys = ON");
  database.pragma("synchronous = NORMAL");
  const db = new Kysely<Database>({ dialect: new SqliteDialect({ database }) });
  return { db, dialect: "sqlite", location: file, sqlite: database, close: () => db.destroy() };
}

async function openPostgres(options: OpenStoreOptions): Promise<Store> {
  const url = new URL(options.database);
  const location = `postgres://${url.host}${url.pathname}`;
  const schema = options.schema;
  if (schema !== undefined && !/^[a-z_][a-z0-9_]*$/.test(schema)) {
    throw new BadRequestError(`Invalid PostgreSQL schema name '${schema}': use lower-case letters, digits and underscores.`);
  }
  const pool = new pg.Pool({
    connectionString: options.database,
    max: 10,
    ...(schema === undefined ? {} : { options: `-c search_path=${schema}` }),
    // Counts and byte sizes are int8; they fit in a double for anything llmgw stores.
    types: {
      getTypeParser: ((oid: number, format?: "text" | "binary") =>
        oid === INT8_OID ? (value: string) => Number(value) : pg.types.getTypeParser(oid, format as "text")) as typeof pg.types.getTypeParser,
    },
  });
  pool.on("error", () => {
    // An idle client lost its connection; the pool replaces it on the next query.
  });
  try {
    const client = await pool.connect();
    try {
      if (schema !== undefined) await client.query(`CREATE SCHEMA IF NOT EXISTS ${schema}`);
    } finally {
      client.release();
    }
  } catch (error) {
    await pool.end().catch(() => undefined);
    throw new BadRequestError(`Cannot connect to PostgreSQL at ${location}: ${describeError(error)}. Check --database and that the server is running.`, {
      code: "database_unavailable",
      cause: error,
    });
  }
  const db = new Kysely<Database>({ dialect: new PostgresDialect({ pool }) });
  return { db, dialect: "postgres", schema: schema ?? "public", location, close: () => db.destroy() };
}

async function migrate(store: Store): Promise<void> {
  try {
    await applyMigrations(store.db as unknown as Kysely<unknown>, store.dialect);
  } catch (error) {
    const which = error instanceof MigrationError ? ` (${error.migration})` : "";
    throw new InternalError(`Database migration${which} failed on ${store.location}: ${describeError(error instanceof MigrationError ? error.cause : error)}`, { cause: error });
  }
}

/** Current time as the ISO text every table stores. */
export function nowIso(clock: () => number = Date.now): string {
  return new Date(clock()).toISOString();
}

/** True when a database error is a unique-constraint violation (both dialects). */
export function isUniqueViolation(error: unknown): boolean {
  if (typeof error !== "object" || error === null) return false;
  const code = (error as { code?: unknown }).code;
  return code === "23505" || code === "SQLITE_CONSTRAINT_UNIQUE" || code === "SQLITE_CONSTRAINT_PRIMARYKEY";
}
