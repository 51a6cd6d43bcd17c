// Usage aggregates per minute (table `usage_minutes`) and per hour (`usage_hours`, the
// same columns with `hour` for `minute`): the raw usage rows of one flush, added up in
// memory per (minute or hour, key, model), then written as one upsert per group that adds
// to what is stored (INSERT ... ON CONFLICT DO UPDATE SET x = x + excluded.x). The
// addition happens in the database, so two servers on one PostgreSQL add up correctly,
// and histograms merge there too (sparse JSON objects, bucket by bucket). The usage
// recorder runs these in the same transaction as the raw rows: all are written, or none
// is (and the batch counts as dropped). The hourly rows exist for reports over long
// ranges: a month is 60 times fewer rows to read (usage-query.ts has the figures).
import { sql, type Kysely, type RawBuilder } from "kysely";
import type { Dialect } from "../store/store.ts";
import type { UsageMinutesTable, UsageTable } from "../store/schema.ts";
import { observe, type Histogram } from "./latency-histogram.ts";

type RawUsageRow = Omit<UsageTable, "id" | "estimated"> & { estimated?: number };

export type Granularity = "minute" | "hour";
export const AGGREGATE_TABLES = { minute: "usage_minutes", hour: "usage_hours" } as const;

/** One aggregate row: a usage_minutes or usage_hours row whose `minute` or `hour` column is read as `start`. */
export type Aggregate = Omit<UsageMinutesTable, "minute"> & { start: string };

/** A status this high or higher is an error in the aggregates (499: the client went away). */
const FIRST_ERROR_STATUS = 400;

/** The start of the minute `iso` falls in, as the ISO text the table stores. */
export function minuteOf(iso: string): string {
  // The gateway writes `at` with toISOString (YYYY-MM-DDTHH:MM:SS.sssZ): cutting the text
  // is several times cheaper than parsing it, and the flush blocks the event loop on SQLite.
  if (iso.length === 24 && iso.endsWith("Z")) return `${iso.slice(0, 17)}00.000Z`;
  const ms = Date.parse(iso);
  return new Date(ms - (((ms % 60_000) + 60_000) % 60_000)).toISOString();
}

/** The start of the hour a minute (as minuteOf writes it) falls in. */
export function hourOf(minute: string): string {
  return `${minute.slice(0, 13)}:00:00.000Z`;
}

interface Group {
  row: Aggregate;
  duration: Histogram;
  ttft: Histogram;
}

/** Adds up a batch of raw rows per (minute, key, model) and per (hour, key, model), each sorted by that key. */
export function aggregateUsage(rows: readonly RawUsageRow[]): Record<Granularity, Aggregate[]> {
  const minutes = new Map<string, Group>();
  const hours = new Map<string, Group>();
  for (const raw of rows) {
    const minute = minuteOf(raw.at);
    const keyId = raw.key_id ?? "";
    for (const [groups, start] of [
      [minutes, minute],
      [hours, hourOf(minute)],
    ] as const) {
      const id = `${start}\u0000${keyId}\u0000${raw.model}`;
      let group = groups.get(id);
      if (group === undefined) {
        group = {
          row: {
            start,
            key_id: keyId,
            model: raw.model,
            requests: 0,
            errors: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            cost_usd: 0,
            estimated_requests: 0,
            duration_hist: "",
            ttft_hist: "",
          },
          duration: {},
          ttft: {},
        };
        groups.set(id, group);
      }
      const { row } = group;
      row.requests += 1;
      if (raw.status >= FIRST_ERROR_STATUS) row.errors += 1;
      row.prompt_tokens += raw.prompt_tokens ?? 0;
      row.completion_tokens += raw.completion_tokens ?? 0;
      row.cost_usd += raw.cost_usd ?? 0;
      if (raw.estimated === 1) row.estimated_requests += 1;
      observe(group.duration, raw.duration_ms);
      // Time to first token means something only for a stream: the gateway also times the
      // first byte of a whole JSON answer, which is its duration by another name.
      if (raw.stream === 1 && raw.ttft_ms !== null) observe(group.ttft, raw.ttft_ms);
    }
  }
  return { minute: sortedRows(minutes), hour: sortedRows(hours) };
}

function sortedRows(groups: Map<string, Group>): Aggregate[] {
  // One order for every writer: two servers upserting overlapping groups on PostgreSQL
  // then lock the rows in the same order, so neither waits for the other in a cycle.
  return [...groups.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([, group]) => ({ ...group.row, duration_hist: JSON.stringify(group.duration), ttft_hist: JSON.stringify(group.ttft) }));
}

const COUNTER_COLUMNS = ["requests", "errors", "prompt_tokens", "completion_tokens", "cost_usd", "estimated_requests"] as const;
const HISTOGRAM_COLUMNS = ["duration_hist", "ttft_hist"] as const;
const VALUE_FIELDS = ["start", "key_id", "model", ...COUNTER_COLUMNS, ...HISTOGRAM_COLUMNS] as const;

function columnsOf(granularity: Granularity): string[] {
  return [granularity, "key_id", "model", ...COUNTER_COLUMNS, ...HISTOGRAM_COLUMNS];
}

/** SQLite: the stored histogram plus the new one, bucket by bucket, as a JSON object. */
function sqliteMerge(table: string, column: string): string {
  return `(SELECT coalesce(json_group_object(bucket, total), '{}') FROM (SELECT key AS bucket, sum(value) AS total FROM (SELECT key, value FROM json_each(${table}.${column}) UNION ALL SELECT key, value FROM json_each(excluded.${column})) GROUP BY key))`;
}

/** PostgreSQL: the same merge with its JSON functions (the column is text, read as json). */
function postgresMerge(table: string, column: string): string {
  return `(SELECT coalesce(json_object_agg(bucket, total), '{}'::json)::text FROM (SELECT key AS bucket, sum(value::bigint) AS total FROM (SELECT * FROM json_each_text(${table}.${column}::json) UNION ALL SELECT * FROM json_each_text(excluded.${column}::json)) AS entries GROUP BY key) AS merged)`;
}

function upsertClause(dialect: Dialect, granularity: Granularity): string {
  const table = AGGREGATE_TABLES[granularity];
  const merge = dialect === "sqlite" ? sqliteMerge : postgresMerge;
  const updates = [...COUNTER_COLUMNS.map((c) => `${c} = ${table}.${c} + excluded.${c}`), ...HISTOGRAM_COLUMNS.map((c) => `${c} = ${merge(table, c)}`)];
  return `ON CONFLICT (${granularity}, key_id, model) DO UPDATE SET ${updates.join(", ")}`;
}

/**
 * The SQLite upsert of one aggregate, as SQL for a prepared statement (named parameters,
 * the fields of Aggregate): the recorder's SQLite path is synchronous and blocks the event
 * loop, so it prepares this once per table and runs it once per group of the batch.
 */
export function sqliteUpsertSql(granularity: Granularity): string {
  return `INSERT INTO ${AGGREGATE_TABLES[granularity]} (${columnsOf(granularity).join(", ")}) VALUES (${VALUE_FIELDS.map((c) => `@${c}`).join(", ")}) ${upsertClause("sqlite", granularity)}`;
}

/** Groups per statement: 11 parameters each stays under SQLite's 32766 and PostgreSQL's 65535. */
const UPSERT_CHUNK = 1000;

/**
 * Upserts aggregates through Kysely, many per statement: the PostgreSQL flush. (Migration
 * 0008's backfill has its own frozen copy.) Each (start, key, model) may appear only
 * once per call, which aggregateUsage guarantees and a multi-row upsert requires.
 */
export async function upsertAggregates(db: Kysely<unknown>, dialect: Dialect, granularity: Granularity, aggregates: readonly Aggregate[]): Promise<void> {
  for (let offset = 0; offset < aggregates.length; offset += UPSERT_CHUNK) {
    const values: RawBuilder<unknown>[] = aggregates
      .slice(offset, offset + UPSERT_CHUNK)
      .map((row) => sql`(${sql.join(VALUE_FIELDS.map((field) => row[field]))})`);
    await sql`INSERT INTO ${sql.raw(AGGREGATE_TABLES[granularity])} (${sql.raw(columnsOf(granularity).join(", "))}) VALUES ${sql.join(values)} ${sql.raw(upsertClause(dialect, granularity))}`.execute(
      db,
    );
  }
}
