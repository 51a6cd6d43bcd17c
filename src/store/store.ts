// The store: one Kysely handle over SQLite (better-sqlite3, a file in the data dir, WAL)
// or PostgreSQL (pg), with the migration history applied on open. Domains receive a
// Store and write their own tables; nothing else opens the database. Storage faults (a
// full disk, a read-only data dir, an unreachable PostgreSQL) are named here, once, for
// every query (fault-naming-dialect.ts), and the store keeps its own health for /readyz.
// On PostgreSQL every connection has deadlines (postgres-connections.ts) and an outage
// gate makes queries fail at once while the database is down (postgres-outage.ts).
import { chmodSync, mkdirSync, statfsSync } from "node:fs";
import path from "node:path";
import BetterSqlite3 from "better-sqlite3";
import { Kysely, PostgresDialect, SqliteDialect, type Transaction } from "kysely";
import type pg from "pg";
import { BadRequestError, InternalError, describeError, errorCode } from "../core/errors.ts";
import { applyMigrations, MigrationError, type Dialect } from "./migrations.ts";
import type { Database } from "./schema.ts";
import { FaultNamingDialect } from "./fault-naming-dialect.ts";
import { connectDedicatedClient, createPool, probeConnection, type PostgresTarget } from "./postgres-connections.ts";
import { OutageGate } from "./postgres-outage.ts";
import { asStorageFault, StorageHealth, StorageUnavailableError, type StorageFaultState } from "./storage-fault.ts";

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
  /** The last storage fault (full disk, read-only, unreachable), kept until a probe write succeeds. */
  readonly health: StorageHealth;
  /**
   * Names an error of a write made outside Kysely (the usage recorder's prepared
   * statement): a storage fault comes back as a StorageUnavailableError and is noted in
   * `health`; anything else comes back unchanged.
   */
  nameFault(error: unknown): unknown;
  /**
   * The current storage fault, re-checked first with a probe write (at most once a
   * second) when there is one; null when writes work. On PostgreSQL a probe runs at most
   * once a second even without a fault, within 2 s, so a database gone silent is seen.
   */
  checkWrites(): Promise<StorageFaultState | null>;
  /**
   * PostgreSQL only: a connection of its own, outside the pool, with the store's schema as
   * its search path: for what lives as long as a session (LISTEN, the leader's advisory
   * lock). The caller ends it.
   */
  dedicatedClient?(): Promise<pg.Client>;
  close(): Promise<void>;
}

export interface OpenStoreOptions {
  /** `postgres://...` for PostgreSQL; otherwise a SQLite file path (or ":memory:"). */
  database: string;
  /** PostgreSQL only: the schema to use (created if missing); tests use one each. */
  schema?: string;
  /** Tests only: apply the migrations up to this one (by name), not the later ones. */
  migrateUntil?: string;
}

/** Whether a --database value names PostgreSQL (else it is a SQLite file). */
export function isPostgresUrl(database: string): boolean {
  return /^postgres(ql)?:\/\//.test(database);
}

export async function openStore(options: OpenStoreOptions): Promise<Store> {
  if (isPostgresUrl(options.database)) return openPostgres(options);
  const store = openSqlite(options.database);
  try {
    await migrate(store.db, store.dialect, store.location, options.migrateUntil);
  } catch (error) {
    await store.close();
    throw error;
  }
  return store;
}

function openSqlite(file: string): Store {
  const inMemory = file === ":memory:";
  const where = inMemory ? "an in-memory SQLite database" : `the data dir ${path.dirname(path.resolve(file))} (database ${file})`;
  let database: BetterSqlite3.Database | undefined;
  try {
    if (!inMemory) mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
    database = new BetterSqlite3(file);
    // WAL lets the gateway read while the agent writes; a busy timeout rides out the short
    // moments when another connection holds the write lock.
    database.pragma("journal_mode = WAL");
    // The database holds key hashes and external servers' keys: owner only, whatever the umask.
    if (!inMemory) {
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
  } catch (error) {
    database?.close();
    throw (
      asStorageFault(error, where) ??
      new BadRequestError(`Cannot open the SQLite database at ${file}: ${describeError(error)}. Check the data dir and its permissions.`, {
        code: "database_unavailable",
        cause: error,
      })
    );
  }
  const sqlite = database;
  const health = new StorageHealth();
  const dialect = new FaultNamingDialect(new SqliteDialect({ database: sqlite }), { where, health, inTransaction: () => sqlite.inTransaction });
  const db = new Kysely<Database>({ dialect });
  // A full disk is only over once there is room again: a probe row can still fit in the
  // WAL file SQLite reuses while the next bigger write fails.
  const hasRoom = () => inMemory || freeBytes(path.dirname(path.resolve(file))) >= MIN_FREE_BYTES;
  return { db, dialect: "sqlite", location: file, sqlite, health, ...sqliteFaultHandling(db, where, health, hasRoom), close: () => db.destroy() };
}

async function openPostgres(options: OpenStoreOptions): Promise<Store> {
  const url = new URL(options.database);
  const location = `postgres://${url.host}${url.pathname}`;
  const schema = options.schema;
  if (schema !== undefined && !/^[a-z_][a-z0-9_]*$/.test(schema)) {
    throw new BadRequestError(`Invalid PostgreSQL schema name '${schema}': use lower-case letters, digits and underscores.`);
  }
  const target: PostgresTarget = { connectionString: options.database, ...(schema === undefined ? {} : { schema }) };
  const where = `PostgreSQL at ${location}`;
  await migratePostgres(target, location, where, options.migrateUntil);
  const pool = createPool(target, "queries");
  const health = new StorageHealth();
  const gate = new OutageGate({
    health,
    probe: async (faulted) => {
      try {
        // While a fault is recorded the probe writes, so that a full or read-only database is over only once writes work.
        // On a connection of its own: a pool with every connection busy is no outage.
        await probeConnection(target, faulted ? PROBE_WRITE : { text: "select 1" });
      } catch (error) {
        // "Too many connections" (the server's or the role's limit) is the database answering, with
        // no room for the probe's own connection: reachable, and the pooled ones go on. Thrown
        // unnamed, it leaves the gate up and clears no fault.
        if (errorCode(error) === TOO_MANY_CONNECTIONS) throw error;
        throw asStorageFault(error, where) ?? error;
      }
    },
  });
  const db = new Kysely<Database>({ dialect: new FaultNamingDialect(new PostgresDialect({ pool }), { where, health, gate }) });
  return {
    db,
    dialect: "postgres",
    schema: schema ?? "public",
    location,
    health,
    nameFault(error) {
      const fault = asStorageFault(error, where);
      if (fault === undefined) return error;
      health.noteFault(fault);
      gate.observe(fault);
      return fault;
    },
    async checkWrites() {
      await gate.check();
      return health.fault();
    },
    dedicatedClient: () => connectDedicatedClient(target),
    close: async () => {
      gate.close();
      await db.destroy();
    },
  };
}

/** SQLSTATE too_many_connections. */
const TOO_MANY_CONNECTIONS = "53300";

const PROBE_WRITE = {
  text: "insert into store_probe (name, at) values ('probe', $1) on conflict (name) do update set at = excluded.at",
  get values() {
    return [new Date().toISOString()];
  },
};

/**
 * Creates the schema and applies the migrations on a pool of their own, without the query
 * deadlines (a migration may wait for another server's, or rewrite a big table), then ends it.
 */
async function migratePostgres(target: PostgresTarget, location: string, where: string, until: string | undefined): Promise<void> {
  const pool = createPool(target, "migrations");
  try {
    const client = await pool.connect();
    try {
      if (target.schema !== undefined) await client.query(`CREATE SCHEMA IF NOT EXISTS ${target.schema}`);
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
  const db = new Kysely<Database>({ dialect: new FaultNamingDialect(new PostgresDialect({ pool }), { where, health: new StorageHealth() }) });
  try {
    await migrate(db, "postgres", location, until);
  } finally {
    await db.destroy();
  }
}

/** Below this much free space a data dir that ran full does not count as writable again. */
const MIN_FREE_BYTES = 4 * 1024 * 1024;
const PROBE_INTERVAL_MS = 1000;

/** Bytes the user running llmgw may still write where `dir` lives (root may use the reserved blocks). */
function freeBytes(dir: string): number {
  try {
    const stats = statfsSync(dir);
    return (process.getuid?.() === 0 ? stats.bfree : stats.bavail) * stats.bsize;
  } catch {
    // Cannot tell (the directory went away): let the probe write decide.
    return Number.POSITIVE_INFINITY;
  }
}

/** SQLite's `nameFault` and `checkWrites` (PostgreSQL's go through its outage gate). */
function sqliteFaultHandling(db: Db, where: string, health: StorageHealth, hasRoom: () => boolean): Pick<Store, "nameFault" | "checkWrites"> {
  let lastProbeAt = 0;
  let probing: Promise<void> | undefined;
  const probe = async () => {
    if (health.fault()?.kind === "full" && !hasRoom()) return;
    try {
      const at = new Date().toISOString();
      await db
        .insertInto("store_probe")
        .values({ name: "probe", at })
        .onConflict((oc) => oc.column("name").doUpdateSet({ at }))
        .execute();
      health.clear();
    } catch {
      // Still failing: the dialect noted the fault again; anything else (a bug) leaves the old one.
    }
  };
  return {
    nameFault(error) {
      const fault = asStorageFault(error, where);
      if (fault === undefined) return error;
      health.noteFault(fault);
      return fault;
    },
    async checkWrites() {
      if (health.fault() !== null && Date.now() - lastProbeAt >= PROBE_INTERVAL_MS) {
        lastProbeAt = Date.now();
        probing ??= probe().finally(() => (probing = undefined));
      }
      await probing;
      return health.fault();
    },
  };
}

async function migrate(db: Db, dialect: Dialect, location: string, until: string | undefined): Promise<void> {
  try {
    await applyMigrations(db as unknown as Kysely<unknown>, dialect, until);
  } catch (error) {
    // A full or read-only data dir is said as such, not as a broken migration.
    const cause = error instanceof MigrationError ? error.cause : error;
    if (cause instanceof StorageUnavailableError) throw cause;
    const which = error instanceof MigrationError ? ` (${error.migration})` : "";
    throw new InternalError(`Database migration${which} failed on ${location}: ${describeError(error instanceof MigrationError ? error.cause : error)}`, {
      cause: error,
    });
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
