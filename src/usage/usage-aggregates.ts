// Per-minute usage aggregates (table `usage_minutes`): the raw usage rows of one flush,
// added up in memory per (minute, key, model), then written as one upsert per group that
// adds to what is stored (INSERT ... ON CONFLICT DO UPDATE SET x = x + excluded.x). The
// addition happens in the database, so two servers on one PostgreSQL add up correctly,
// and histograms merge there too (sparse JSON objects, bucket by bucket). The usage
// recorder runs these in the same transaction as the raw rows: both are written, or
// neither is (and the batch counts as dropped).
import { sql } from "kysely";
import type { Tx } from "../store/store.ts";
import type { UsageMinutesTable, UsageTable } from "../store/schema.ts";
import { observe, type Histogram } from "./latency-histogram.ts";

type RawUsageRow = Omit<UsageTable, "id">;

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

/** Adds up a batch of raw rows per (minute, key, model), sorted by that key. */
export function aggregateByMinute(rows: readonly RawUsageRow[]): UsageMinutesTable[] {
  const groups = new Map<string, { row: UsageMinutesTable; duration: Histogram; ttft: Histogram }>();
  for (const raw of rows) {
    const minute = minuteOf(raw.at);
    const keyId = raw.key_id ?? "";
    const id = `${minute}\u0000${keyId}\u0000${raw.model}`;
    let group = groups.get(id);
    if (group === undefined) {
      group = {
        row: { minute, key_id: keyId, model: raw.model, requests: 0, errors: 0, prompt_tokens: 0, completion_tokens: 0, cost_usd: 0, duration_hist: "", ttft_hist: "" },
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
    observe(group.duration, raw.duration_ms);
    if (raw.ttft_ms !== null) observe(group.ttft, raw.ttft_ms);
  }
  // One order for every writer: two servers upserting overlapping groups on PostgreSQL
  // then lock the rows in the same order, so neither waits for the other in a cycle.
  return [...groups.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([, group]) => ({ ...group.row, duration_hist: JSON.stringify(group.duration), ttft_hist: JSON.stringify(group.ttft) }));
}

const COUNTER_COLUMNS = ["requests", "errors", "prompt_tokens", "completion_tokens", "cost_usd"] as const;
const HISTOGRAM_COLUMNS = ["duration_hist", "ttft_hist"] as const;
const ALL_COLUMNS: readonly (keyof UsageMinutesTable)[] = ["minute", "key_id", "model", ...COUNTER_COLUMNS, ...HISTOGRAM_COLUMNS];

/** SQLite: the stored histogram plus the new one, bucket by bucket, as a JSON object. */
function sqliteMerge(column: string): string {
  return `(SELECT coalesce(json_group_object(bucket, total), '{}') FROM (SELECT key AS bucket, sum(value) AS total FROM (SELECT key, value FROM json_each(usage_minutes.${column}) UNION ALL SELECT key, value FROM json_each(excluded.${column})) GROUP BY key))`;
}

/** PostgreSQL: the same merge with its JSON functions (the column is text, read as json). */
function postgresMerge(column: string): string {
  return `(SELECT coalesce(json_object_agg(bucket, total), '{}'::json)::text FROM (SELECT key AS bucket, sum(value::bigint) AS total FROM (SELECT * FROM json_each_text(usage_minutes.${column}::json) UNION ALL SELECT * FROM json_each_text(excluded.${column}::json)) AS entries GROUP BY key) AS merged)`;
}

/**
 * The SQLite upsert of one aggregate, as SQL for a prepared statement (named parameters):
 * the recorder's SQLite path is synchronous and blocks the event loop, so it prepares this
 * once and runs it once per group of the batch.
 */
export function sqliteUpsertSql(): string {
  const updates = [...COUNTER_COLUMNS.map((c) => `${c} = usage_minutes.${c} + excluded.${c}`), ...HISTOGRAM_COLUMNS.map((c) => `${c} = ${sqliteMerge(c)}`)];
  return (
    `INSERT INTO usage_minutes (${ALL_COLUMNS.join(", ")}) VALUES (${ALL_COLUMNS.map((c) => `@${c}`).join(", ")}) ` +
    `ON CONFLICT (minute, key_id, model) DO UPDATE SET ${updates.join(", ")}`
  );
}

/**
 * PostgreSQL: one statement for the whole batch. Each (minute, key, model) appears once
 * in it (aggregateByMinute grouped them), which an upsert of several rows requires.
 */
export async function upsertPostgres(trx: Tx, aggregates: readonly UsageMinutesTable[]): Promise<void> {
  if (aggregates.length === 0) return;
  await trx
    .insertInto("usage_minutes")
    .values([...aggregates])
    .onConflict((oc) =>
      oc.columns(["minute", "key_id", "model"]).doUpdateSet({
        requests: sql`usage_minutes.requests + excluded.requests`,
        errors: sql`usage_minutes.errors + excluded.errors`,
        prompt_tokens: sql`usage_minutes.prompt_tokens + excluded.prompt_tokens`,
        completion_tokens: sql`usage_minutes.completion_tokens + excluded.completion_tokens`,
        cost_usd: sql`usage_minutes.cost_usd + excluded.cost_usd`,
        duration_hist: sql.raw(postgresMerge("duration_hist")),
        ttft_hist: sql.raw(postgresMerge("ttft_hist")),
      }),
    )
    .execute();
}
