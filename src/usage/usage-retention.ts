// Usage retention: raw usage rows older than --usage-retention days (default 30) are
// deleted at start and then every hour; the per-minute and per-hour aggregates stay 400
// days (a year and a month back, so last year's same month can still be compared), after
// which they go too. Deletes run in slices of a few thousand rows: on SQLite a delete
// blocks the event loop (and the /v1 hot path) for as long as it runs, and the first
// sweep after a long stop may find months of rows. Two servers on one PostgreSQL both
// sweep; the second finds nothing left to delete.
import { describeError } from "../core/errors.ts";
import { HourlyJob } from "../core/hourly-job.ts";
import type { Logger } from "../core/log.ts";
import type { Store } from "../store/store.ts";

export const DEFAULT_USAGE_RETENTION_DAYS = 30;
export const AGGREGATE_RETENTION_DAYS = 400;
const DAY_MS = 86_400_000;
/** Rows deleted per statement: a few ms of blocking on SQLite. */
const DELETE_SLICE = 5000;

export interface UsageRetentionOptions {
  store: Store;
  /** Days raw rows are kept; 0 keeps them forever. */
  retentionDays?: number;
  logger?: Logger;
  clock?: () => number;
  /** Rows deleted per statement (tests make it small). */
  sliceRows?: number;
}

export interface SweepResult {
  rows: number;
  /** Per-minute aggregates deleted. */
  aggregates: number;
  /** Per-hour aggregates deleted. */
  hourly: number;
}

export class UsageRetention {
  private readonly retentionDays: number;
  private readonly clock: () => number;
  private readonly sliceRows: number;

  constructor(private readonly options: UsageRetentionOptions) {
    this.retentionDays = options.retentionDays ?? DEFAULT_USAGE_RETENTION_DAYS;
    this.clock = options.clock ?? Date.now;
    this.sliceRows = options.sliceRows ?? DELETE_SLICE;
  }

  /** Sweeps now (in the background) and every hour after. */
  start(): void {
    this.hourly.start();
  }

  /** Stops the timer and waits for a sweep under way. */
  async stop(): Promise<void> {
    await this.hourly.stop();
  }

  /** Deletes what is past retention; returns how many raw rows and aggregates went. */
  async sweep(): Promise<SweepResult> {
    const now = this.clock();
    const rows = this.retentionDays === 0 ? 0 : await this.deleteOlder("usage", new Date(now - this.retentionDays * DAY_MS).toISOString());
    const aggregatesBefore = new Date(now - AGGREGATE_RETENTION_DAYS * DAY_MS).toISOString();
    const aggregates = await this.deleteOlder("usage_minutes", aggregatesBefore);
    const hourly = await this.deleteOlder("usage_hours", aggregatesBefore);
    return { rows, aggregates, hourly };
  }

  private readonly hourly = new HourlyJob(() =>
    this.sweep().then(
      (result) => {
        if (result.rows + result.aggregates + result.hourly > 0) this.options.logger?.info(result, "usage retention deleted old rows");
      },
      // A full disk or an unreachable database: the next hour tries again.
      (error: unknown) => this.options.logger?.warn({ err: describeError(error) }, "usage retention sweep failed; it runs again within the hour"),
    ),
  );

  private async deleteOlder(table: "usage" | "usage_minutes" | "usage_hours", before: string): Promise<number> {
    const db = this.options.store.db;
    let total = 0;
    for (;;) {
      let deleted: number;
      if (table === "usage") {
        const slice = db.selectFrom("usage").select("id").where("at", "<", before).limit(this.sliceRows);
        const result = await db.deleteFrom("usage").where("id", "in", slice).executeTakeFirst();
        deleted = Number(result.numDeletedRows);
      } else if (table === "usage_minutes") {
        // No single-column key here: take the oldest minutes a slice at a time instead.
        const last = await db
          .selectFrom("usage_minutes")
          .select("minute")
          .where("minute", "<", before)
          .orderBy("minute")
          .offset(this.sliceRows - 1)
          .limit(1)
          .executeTakeFirst();
        const upTo = last === undefined ? before : last.minute;
        const result = await db
          .deleteFrom("usage_minutes")
          .where("minute", last === undefined ? "<" : "<=", upTo)
          .executeTakeFirst();
        deleted = Number(result.numDeletedRows);
        if (last === undefined) return total + deleted;
      } else {
        const last = await db
          .selectFrom("usage_hours")
          .select("hour")
          .where("hour", "<", before)
          .orderBy("hour")
          .offset(this.sliceRows - 1)
          .limit(1)
          .executeTakeFirst();
        const upTo = last === undefined ? before : last.hour;
        const result = await db
          .deleteFrom("usage_hours")
          .where("hour", last === undefined ? "<" : "<=", upTo)
          .executeTakeFirst();
        deleted = Number(result.numDeletedRows);
        if (last === undefined) return total + deleted;
      }
      total += deleted;
      if (deleted < this.sliceRows) return total;
      // Let requests through between two slices.
      await new Promise((resolve) => setImmediate(resolve));
    }
  }
}
