// The backfill of migration 0008: usage rows written before the aggregates existed are
// added up into usage_minutes and usage_hours when the migration runs, so the week of
// raw rows a server already holds shows in reports (and still counts once retention has
// deleted those rows). It reads the raw rows a page at a time in id order and sends each
// page through the recorder's own aggregation and adding upserts (usage-aggregates.ts):
// the histograms have to be built in JS anyway (the bucket of a latency is a log2 that the
// two databases would round differently at bucket edges), a group that two pages share is
// added up by the upsert like two flushes, and the backfill counts exactly what a live
// flush would (the ttft of streams only, errors from 400 up). Pages keep memory flat
// whatever the number of rows. Rows from before 0008 have no cost (the column is new),
// so their cost adds 0. bench/usage/backfill.ts: 500,000 raw rows take ~15 s on SQLite
// and on PostgreSQL (a loaded 2-core machine), once, on the first start after upgrading.
import { sql, type Kysely } from "kysely";
import type { Dialect } from "../store/store.ts";
import type { UsageTable } from "../store/schema.ts";
import { aggregateUsage, upsertAggregates } from "./usage-aggregates.ts";

/** Raw rows per page: a few MB in memory at most. */
const BACKFILL_PAGE_ROWS = 5000;

type StoredRow = Omit<UsageTable, "cost_usd" | "guard_ms">;

/** Adds every raw usage row to the aggregate tables; returns how many rows it read. */
export async function backfillUsageAggregates(db: Kysely<unknown>, dialect: Dialect, pageRows = BACKFILL_PAGE_ROWS): Promise<number> {
  let afterId = 0;
  let total = 0;
  for (;;) {
    const page = await sql<StoredRow>`SELECT id, at, key_id, model, replica_id, endpoint, prompt_tokens, completion_tokens, ttft_ms, duration_ms, status, stream FROM usage WHERE id > ${afterId} ORDER BY id LIMIT ${pageRows}`.execute(db);
    if (page.rows.length === 0) return total;
    // PostgreSQL's bigserial comes back as a number (the store's int8 parser); Number() covers a driver that gives text.
    const aggregates = aggregateUsage(page.rows.map((row) => ({ ...row, duration_ms: Number(row.duration_ms), stream: Number(row.stream), status: Number(row.status), cost_usd: null, guard_ms: null })));
    await upsertAggregates(db, dialect, "minute", aggregates.minute);
    await upsertAggregates(db, dialect, "hour", aggregates.hour);
    total += page.rows.length;
    afterId = Number(page.rows[page.rows.length - 1]!.id);
    if (page.rows.length < pageRows) return total;
  }
}
