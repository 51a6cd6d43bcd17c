// A Kysely dialect around the real one (SQLite or PostgreSQL) that names storage faults
// where every query passes: a failure of a query, a transaction's begin, commit or
// rollback, or of getting a connection, that is a storage fault (storage-fault.ts)
// leaves as a StorageUnavailableError and is noted in the store's health. Every domain
// gets this for free, whether it runs a lone query or a transaction.
//
// It also keeps SQLite's own rollback from hiding the real error: on SQLITE_FULL,
// SQLITE_IOERR and a few others SQLite rolls the whole transaction back by itself, so the
// ROLLBACK Kysely then sends fails with "cannot rollback - no transaction is active", and
// that error, not the full disk, would reach the caller.
import type { DatabaseConnection, Dialect, Driver, QueryCompiler, QueryResult, TransactionSettings } from "kysely";
import { asStorageFault, type StorageHealth, type StorageUnavailableError } from "./storage-fault.ts";

export interface FaultNamingOptions {
  /** Where the data lives, in words, for messages. */
  where: string;
  health: StorageHealth;
  /** SQLite only: whether the connection is inside a transaction right now. */
  inTransaction?: () => boolean;
  /** PostgreSQL only: whether queries may go ahead (throws the outage's fault when not), and where faults are told. */
  gate?: { admit(): Promise<void>; observe(fault: StorageUnavailableError): void };
}

export class FaultNamingDialect implements Dialect {
  constructor(
    private readonly inner: Dialect,
    private readonly options: FaultNamingOptions,
  ) {}

  createDriver(): Driver {
    return new FaultNamingDriver(this.inner.createDriver(), this.options);
  }
  createQueryCompiler() {
    return this.inner.createQueryCompiler();
  }
  createAdapter() {
    return this.inner.createAdapter();
  }
  createIntrospector(...args: Parameters<Dialect["createIntrospector"]>) {
    return this.inner.createIntrospector(...args);
  }
}

class FaultNamingDriver implements Driver {
  /** Our connection objects and the inner driver's, which its own methods need back. */
  private readonly innerOf = new WeakMap<DatabaseConnection, DatabaseConnection>();
  private readonly outerOf = new WeakMap<DatabaseConnection, DatabaseConnection>();

  constructor(
    private readonly inner: Driver,
    private readonly options: FaultNamingOptions,
  ) {}

  /** Runs `work`; a storage fault it throws is rethrown named (and noted), anything else unchanged. */
  private async named<T>(work: () => Promise<T>): Promise<T> {
    try {
      return await work();
    } catch (error) {
      const fault = asStorageFault(error, this.options.where);
      if (fault === undefined) throw error;
      this.options.health.noteFault(fault);
      this.options.gate?.observe(fault);
      throw fault;
    }
  }

  private unwrap(connection: DatabaseConnection): DatabaseConnection {
    return this.innerOf.get(connection) ?? connection;
  }

  init(): Promise<void> {
    return this.named(() => this.inner.init());
  }

  async acquireConnection(): Promise<DatabaseConnection> {
    await this.options.gate?.admit();
    const inner = await this.named(() => this.inner.acquireConnection());
    let outer = this.outerOf.get(inner);
    if (outer === undefined) {
      outer = {
        executeQuery: <R>(query: Parameters<DatabaseConnection["executeQuery"]>[0]) => this.named<QueryResult<R>>(() => inner.executeQuery<R>(query)),
        streamQuery: <R>(query: Parameters<DatabaseConnection["streamQuery"]>[0], chunkSize?: number) => inner.streamQuery<R>(query, chunkSize),
      };
      this.outerOf.set(inner, outer);
      this.innerOf.set(outer, inner);
    }
    return outer;
  }

  beginTransaction(connection: DatabaseConnection, settings: TransactionSettings): Promise<void> {
    return this.named(() => this.inner.beginTransaction(this.unwrap(connection), settings));
  }

  commitTransaction(connection: DatabaseConnection): Promise<void> {
    return this.named(() => this.inner.commitTransaction(this.unwrap(connection)));
  }

  async rollbackTransaction(connection: DatabaseConnection): Promise<void> {
    // SQLite already rolled back by itself: a ROLLBACK now would fail and hide the cause.
    if (this.options.inTransaction?.() === false) return;
    await this.named(() => this.inner.rollbackTransaction(this.unwrap(connection)));
  }

  async savepoint(connection: DatabaseConnection, name: string, compileQuery: QueryCompiler["compileQuery"]): Promise<void> {
    await this.named(async () => this.inner.savepoint?.(this.unwrap(connection), name, compileQuery));
  }

  async rollbackToSavepoint(connection: DatabaseConnection, name: string, compileQuery: QueryCompiler["compileQuery"]): Promise<void> {
    await this.named(async () => this.inner.rollbackToSavepoint?.(this.unwrap(connection), name, compileQuery));
  }

  async releaseSavepoint(connection: DatabaseConnection, name: string, compileQuery: QueryCompiler["compileQuery"]): Promise<void> {
    await this.named(async () => this.inner.releaseSavepoint?.(this.unwrap(connection), name, compileQuery));
  }

  releaseConnection(connection: DatabaseConnection): Promise<void> {
    return this.inner.releaseConnection(this.unwrap(connection));
  }

  destroy(): Promise<void> {
    return this.inner.destroy();
  }
}
