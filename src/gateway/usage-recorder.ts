// Records one usage row per /v1 request (key, model, replica, tokens, time to first
// token, duration, status). Rows are queued in memory and written in batches off the
// request path, so a slow database never slows an answer; `flush` drains the queue on
// shutdown so nothing recorded is lost. On SQLite the write is synchronous and blocks the
// event loop, so it uses one cached prepared statement in a transaction (a few µs a row)
// rather than a many-parameter Kysely insert compiled per batch, which the gateway
// benchmark measured at ~15 µs a row and up to 40 ms of blocking per flush. When the
// store refuses writes with a storage fault (PostgreSQL unreachable, a full disk), rows
// are spooled (usage-spool.ts: memory, then files in the data dir, both bounded) and
// written when the store takes them again, retried with backoff; while rows are spooled,
// new batches join them rather than wait on a failing store. Only rows past the spool's
// bounds (or refused for another reason) are dropped: the count is kept (/readyz and
// /metrics show it) and logged at most once a minute.
// Each flush also adds the batch to the per-minute and per-hour aggregates (src/usage), in
// the same transaction: the batch is summed in memory first, so a flush costs one upsert
// per (minute, key, model) and one per (hour, key, model) it touched, not one per row.
import { Backoff } from "../core/backoff.ts";
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { StorageUnavailableError } from "../store/storage-fault.ts";
import { UsageSpool } from "./usage-spool.ts";
import type { Statement } from "better-sqlite3";
import type { Kysely } from "kysely";
import type { Store } from "../store/store.ts";
import type { UsageTable } from "../store/schema.ts";
import { aggregateUsage, sqliteUpsertSql, upsertAggregates, type Aggregate } from "../usage/usage-aggregates.ts";

/** A usage row to write; `estimated` may be left out (0: the upstream reported the counts). */
export type UsageRow = Omit<UsageTable, "id" | "estimated"> & { estimated?: number };

const USAGE_COLUMNS: readonly (keyof UsageRow)[] = [
  "at",
  "key_id",
  "model",
  "replica_id",
  "endpoint",
  "prompt_tokens",
  "completion_tokens",
  "ttft_ms",
  "duration_ms",
  "status",
  "stream",
  "cost_usd",
  "guard_ms",
  "estimated",
];

export interface UsageRecorderOptions {
  store: Store;
  logger?: Logger;
  flushIntervalMs?: number;
  maxBatch?: number;
  clock?: () => number;
  /** Where rows the store refuses are spooled past the memory bound (DATA_DIR/usage-spool); absent: memory only. */
  dataDir?: string;
  /** Spool bounds (tests make them small): rows kept in memory, bytes of files. */
  spoolMemoryRows?: number;
  spoolFileBytes?: number;
  /** Removes a spool file once its rows are written (tests make it fail); default: fs rm. */
  removeSpoolFile?: (file: string) => Promise<void>;
}

/** At most one log line a minute about dropped rows, however many requests there are. */
const DROP_LOG_INTERVAL_MS = 60_000;
/** Rows a PostgreSQL insert statement carries (13 parameters a row, well under its 65,535). */
const POSTGRES_INSERT_ROWS = 1000;

export class UsageRecorder {
  private queue: UsageRow[] = [];
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> = Promise.resolve();
  private readonly flushIntervalMs: number;
  private readonly maxBatch: number;
  private readonly insertSqlite: ((rows: UsageRow[]) => void) | undefined;
  private readonly clock: () => number;
  private droppedTotal = 0;
  /** Dropped since the last log line about it. */
  private droppedUnlogged = 0;
  private lastDropLogAt = Number.NEGATIVE_INFINITY;
  private readonly spool: UsageSpool;
  private readonly drainBackoff = new Backoff({ baseMs: 250, maxMs: 5000, jitter: 0.2 });
  private drainTimer: NodeJS.Timeout | undefined;
  private closed = false;
  /** The storage fault the spooled rows wait out: what a drop while they wait is logged with. */
  private lastFault: StorageUnavailableError | undefined;

  constructor(private readonly options: UsageRecorderOptions) {
    this.flushIntervalMs = options.flushIntervalMs ?? 1000;
    this.maxBatch = options.maxBatch ?? 500;
    this.clock = options.clock ?? Date.now;
    const sqlite = options.store.sqlite;
    if (sqlite !== undefined) {
      // Positional parameters: binding 13 named ones from an object cost ~1.5 µs more a row.
      const statement: Statement<unknown[]> = sqlite.prepare(
        `INSERT INTO usage (${USAGE_COLUMNS.join(", ")}) VALUES (${USAGE_COLUMNS.map(() => "?").join(", ")})`,
      );
      const upsertMinute: Statement<Aggregate> = sqlite.prepare(sqliteUpsertSql("minute"));
      const upsertHour: Statement<Aggregate> = sqlite.prepare(sqliteUpsertSql("hour"));
      this.insertSqlite = sqlite.transaction((rows: UsageRow[]) => {
        for (const row of rows) statement.run(USAGE_COLUMNS.map((column) => row[column] ?? (column === "estimated" ? 0 : null)));
        const aggregates = aggregateUsage(rows);
        for (const aggregate of aggregates.minute) upsertMinute.run(aggregate);
        for (const aggregate of aggregates.hour) upsertHour.run(aggregate);
      });
    }
    this.spool = new UsageSpool({
      ...(options.dataDir === undefined ? {} : { dataDir: options.dataDir }),
      ...(options.spoolMemoryRows === undefined ? {} : { memoryRows: options.spoolMemoryRows }),
      ...(options.spoolFileBytes === undefined ? {} : { fileBytes: options.spoolFileBytes }),
      ...(options.removeSpoolFile === undefined ? {} : { remove: options.removeSpoolFile }),
    });
    if (!this.spool.isEmpty()) {
      options.logger?.info(
        { rows: this.spool.rows(), dir: this.spool.where() },
        `found ${this.spool.rows()} usage rows spooled by an earlier run while the store refused them; writing them now`,
      );
      this.scheduleDrain();
    }
  }

  record(row: UsageRow): void {
    this.queue.push(row);
    if (this.queue.length >= this.maxBatch) {
      void this.flush();
    } else if (this.timer === undefined) {
      this.timer = setTimeout(() => void this.flush(), this.flushIntervalMs);
      this.timer.unref();
    }
  }

  /** Writes everything queued so far; resolves when it is in the store, or spooled while the store refuses it. */
  flush(): Promise<void> {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    const batch = this.queue;
    this.queue = [];
    if (batch.length > 0) {
      this.writing = this.writing.then(async () => {
        // Rows are waiting for the store: these join them instead of trying a store that just failed.
        if (!this.spool.isEmpty()) {
          await this.keep(batch, undefined);
          return;
        }
        try {
          await this.write(batch);
        } catch (error) {
          // The SQLite path runs outside Kysely: let the store name the fault (and note it for /readyz).
          const named = this.options.store.nameFault(error);
          if (named instanceof StorageUnavailableError) await this.keep(batch, named);
          else this.dropped(batch.length, named);
        }
      });
    }
    return this.writing;
  }

  /** Usage rows lost since start: refused by the store and past the spool's bounds, or refused for another reason. */
  droppedRows(): number {
    return this.droppedTotal;
  }

  /** Usage rows waiting in the spool (memory and files) for the store to take them. */
  spooledRows(): number {
    return this.spool.rows();
  }

  /**
   * Writes what is queued and what is spooled; what the store still refuses is moved to
   * the spool's files for the next start. Logs the drops not yet logged (on shutdown).
   */
  async close(): Promise<void> {
    await this.flush();
    this.closed = true;
    if (this.drainTimer !== undefined) clearTimeout(this.drainTimer);
    this.drainTimer = undefined;
    if (!this.spool.isEmpty()) {
      this.writing = this.writing.then(() => this.drain());
      await this.writing;
    }
    if (!this.spool.isEmpty()) {
      const { dropped, error } = await this.spool.persistMemory();
      if (dropped > 0) this.dropped(dropped, error);
      if (this.spool.rows() > 0) {
        this.options.logger?.warn(
          { rows: this.spool.rows(), dir: this.spool.where() },
          `${this.spool.rows()} usage rows the store refused are kept in the spool files; the next start writes them`,
        );
      }
    }
    if (this.droppedUnlogged > 0) this.logDrops(undefined);
  }

  /** Inserts rows and adds them to the aggregates, in one transaction. */
  private async write(rows: UsageRow[]): Promise<void> {
    if (this.insertSqlite !== undefined) {
      this.insertSqlite(rows);
      return;
    }
    await this.options.store.db.transaction().execute(async (trx) => {
      for (let start = 0; start < rows.length; start += POSTGRES_INSERT_ROWS) {
        await trx
          .insertInto("usage")
          .values(rows.slice(start, start + POSTGRES_INSERT_ROWS))
          .execute();
      }
      const aggregates = aggregateUsage(rows);
      await upsertAggregates(trx as unknown as Kysely<unknown>, "postgres", "minute", aggregates.minute);
      await upsertAggregates(trx as unknown as Kysely<unknown>, "postgres", "hour", aggregates.hour);
    });
  }

  /** Spools rows the store refused (the first time, says so); rows past the bounds are dropped and counted. */
  private async keep(rows: UsageRow[], fault: StorageUnavailableError | undefined): Promise<void> {
    const wasEmpty = this.spool.isEmpty();
    if (fault !== undefined) this.lastFault = fault;
    const { dropped, error } = await this.spool.add(rows);
    if (wasEmpty && fault !== undefined) {
      const { memoryRows, fileBytes } = this.spool.bounds;
      const files = this.spool.where() === undefined ? "" : `, then in ${this.spool.where()} up to ${Math.round(fileBytes / (1024 * 1024))} MB`;
      this.options.logger?.warn(
        { err: fault.message, memory_rows: memoryRows, file_bytes: fileBytes },
        `the store refuses usage rows: keeping them (up to ${memoryRows} in memory${files}) and writing them when it takes them again; requests are still answered`,
      );
    }
    if (dropped > 0) this.dropped(dropped, error ?? this.lastFault);
    this.scheduleDrain();
  }

  private scheduleDrain(): void {
    if (this.drainTimer !== undefined || this.closed) return;
    this.drainTimer = setTimeout(() => {
      this.drainTimer = undefined;
      this.writing = this.writing.then(() => this.drain());
    }, this.drainBackoff.delayMs || 250);
    this.drainTimer.unref();
  }

  /** Writes the spooled rows; on a storage fault tries again later, with backoff. */
  private async drain(): Promise<void> {
    if (this.spool.isEmpty()) return;
    const before = this.spool.rows();
    try {
      const { written, unreadable, notRemoved } = await this.spool.drain((rows) => this.writeOrDrop(rows));
      this.drainBackoff.succeeded();
      if (unreadable > 0) this.dropped(unreadable, undefined);
      this.options.logger?.info({ rows: written }, `wrote ${written} spooled usage rows: the store takes them again`);
      for (const { file, error } of notRemoved) {
        this.options.logger?.error(
          { file, err: describeError(error) },
          `the usage rows of spool file ${file} are in the store, but the file cannot be removed: this server does not write it again; remove it by hand before the next start, which would write its rows a second time`,
        );
      }
    } catch (error) {
      if (error instanceof StorageUnavailableError) this.lastFault = error;
      const waitMs = this.drainBackoff.failed();
      this.options.logger?.debug({ err: describeError(error), rows: before, retry_in_ms: waitMs }, "spooled usage rows are still refused");
      if (!this.closed) this.scheduleDrain();
    }
  }

  /** write(), except that a failure other than a storage fault drops the rows (counted): retrying cannot help them. */
  private async writeOrDrop(rows: UsageRow[]): Promise<void> {
    try {
      await this.write(rows);
    } catch (error) {
      const named = this.options.store.nameFault(error);
      if (named instanceof StorageUnavailableError) throw named;
      this.dropped(rows.length, named);
    }
  }

  private dropped(rows: number, named: unknown): void {
    this.droppedTotal += rows;
    this.droppedUnlogged += rows;
    if (this.clock() - this.lastDropLogAt >= DROP_LOG_INTERVAL_MS) this.logDrops(named);
  }

  private logDrops(error: unknown): void {
    const rows = this.droppedUnlogged;
    this.options.logger?.error(
      { rows, total: this.droppedTotal, ...(error === undefined ? {} : { err: describeError(error) }) },
      `dropped ${rows} usage ${rows === 1 ? "row" : "rows"} the store refused (${this.droppedTotal} since start); requests are still answered`,
    );
    this.droppedUnlogged = 0;
    this.lastDropLogAt = this.clock();
  }
}
