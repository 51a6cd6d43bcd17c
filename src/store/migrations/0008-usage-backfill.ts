// The backfill of migration 0008, frozen as it was released: usage rows written before the
// aggregates existed are added up into usage_minutes and usage_hours, so the week of raw
// rows a server already held shows in reports (and still counts once retention has deleted
// those rows).
//
// Why a copy and not a call into src/usage/: a migration must do the same thing on every
// database it ever meets, whatever the live code becomes. The recorder's aggregation may
// change (another error rule, other columns, another bucket layout with a migration of its
// own); this file must not follow it. So everything the backfill depends on is here: the
// row shape it reads, the minute and hour it files a row under, the histogram buckets, and
// the upserts for both databases. Nothing here may import live code beyond Kysely.
//
// How it works: the raw rows are read a page at a time in id order (memory stays flat
// whatever the number of rows) and added up per (minute or hour, key, model) in JS. The
// histograms have to be built in JS anyway: a latency's bucket is a log2 that the two
// databases would round differently at bucket edges. A group that two pages share is added
// up by the upsert (INSERT ... ON CONFLICT DO UPDATE SET x = x + excluded.x, histograms
// merged bucket by bucket). Rows from before 0008 have no cost (the column is new), so
// their cost adds 0. bench/usage/backfill.ts: 500,000 raw rows take ~15 s on SQLite and on
// PostgreSQL (a loaded 2-core machine), once, on the first start after upgrading.
import { sql, type Kysely, type RawBuilder } from "kysely";

type Dialect = "sqlite" | "postgres";
type Granularity = "minute" | "hour";

/** A raw usage row as 0001 defined it: the columns the backfill reads. */
interface RawRow {
  id: number | string;
  at: string;
  key_id: string | null;
  model: string;
  prompt_tokens: number | null;
  completion_tokens: number | null;
  ttft_ms: number | null;
  duration_ms: number | string;
  status: number | string;
  stream: number | string;
}

/** One row of usage_minutes or usage_hours as 0008 creates them, with `start` for `minute` or `hour`. */
interface AggregateRow {
  start: string;
  key_id: string;
  model: string;
  requests: number;
  errors: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost_usd: number;
  duration_hist: string;
  ttft_hist: string;
}

type Histogram = Record<string, number>;

/** Raw rows per page: a few MB in memory at most. */
const PAGE_ROWS = 5000;
/** A status this high or higher counted as an error (499: the client went away). */
const FIRST_ERROR_STATUS = 400;
/** Histogram buckets: 0 holds 0 ms; bucket i ≥ 1 holds [2^((i-1)/8), 2^(i/8)) ms. */
const BUCKETS_PER_DOUBLING = 8;
/** Groups per statement: 10 parameters each stays under SQLite's 32766 and PostgreSQL's 65535. */
const UPSERT_CHUNK = 1000;
const TABLES = { minute: "usage_minutes", hour: "usage_hours" } as const;
const COUNTER_COLUMNS = ["requests", "errors", "prompt_tokens", "completion_tokens", "cost_usd"] as const;
const HISTOGRAM_COLUMNS = ["duration_hist", "ttft_hist"] as const;
const VALUE_FIELDS = ["start", "key_id", "model", ...COUNTER_COLUMNS, ...HISTOGRAM_COLUMNS] as const;

/** Adds every raw usage row to the aggregate tables; returns how many rows it read. `pageRows` is for tests. */
export async function backfillUsageAggregates0008(db: Kysely<unknown>, dialect: Dialect, pageRows = PAGE_ROWS): Promise<number> {
  let afterId = 0;
  let total = 0;
  for (;;) {
    const page =
      await sql<RawRow>`SELECT id, at, key_id, model, prompt_tokens, completion_tokens, ttft_ms, duration_ms, status, stream FROM usage WHERE id > ${afterId} ORDER BY id LIMIT ${pageRows}`.execute(
        db,
      );
    if (page.rows.length === 0) return total;
    const groups = aggregate(page.rows);
    await upsert({ db, dialect, granularity: "minute", rows: groups.minute });
    await upsert({ db, dialect, granularity: "hour", rows: groups.hour });
    total += page.rows.length;
    // PostgreSQL's bigserial may come back as text, depending on the driver's int8 parser.
    afterId = Number(page.rows[page.rows.length - 1]!.id);
    if (page.rows.length < pageRows) return total;
  }
}

/** The start of the minute an ISO time falls in, as ISO text. */
function minuteOf(iso: string): string {
  if (iso.length === 24 && iso.endsWith("Z")) return `${iso.slice(0, 17)}00.000Z`;
  const ms = Date.parse(iso);
  return new Date(ms - (((ms % 60_000) + 60_000) % 60_000)).toISOString();
}

function bucketOf(ms: number): number {
  if (!(ms >= 1)) return 0;
  return Math.floor(Math.log2(ms) * BUCKETS_PER_DOUBLING) + 1;
}

function observe(histogram: Histogram, ms: number): void {
  const key = String(bucketOf(ms));
  histogram[key] = (histogram[key] ?? 0) + 1;
}

interface Group {
  row: AggregateRow;
  duration: Histogram;
  ttft: Histogram;
}

/** One page's rows added up per (minute, key, model) and per (hour, key, model), each sorted by that key. */
function aggregate(rows: readonly RawRow[]): Record<Granularity, AggregateRow[]> {
  const minutes = new Map<string, Group>();
  const hours = new Map<string, Group>();
  for (const raw of rows) {
    const minute = minuteOf(raw.at);
    const keyId = raw.key_id ?? "";
    for (const [groups, start] of [
      [minutes, minute],
      [hours, `${minute.slice(0, 13)}:00:00.000Z`],
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
      if (Number(raw.status) >= FIRST_ERROR_STATUS) row.errors += 1;
      row.prompt_tokens += raw.prompt_tokens ?? 0;
      row.completion_tokens += raw.completion_tokens ?? 0;
      observe(group.duration, Number(raw.duration_ms));
      // Time to first token means something only for a stream: for a whole JSON answer the
      // gateway timed the first byte, which is its duration by another name.
      if (Number(raw.stream) === 1 && raw.ttft_ms !== null) observe(group.ttft, raw.ttft_ms);
    }
  }
  return { minute: sorted(minutes), hour: sorted(hours) };
}

function sorted(groups: Map<string, Group>): AggregateRow[] {
  // One order for every writer, so two upserts of overlapping groups lock rows in the same order.
  return [...groups.entries()]
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([, group]) => ({ ...group.row, duration_hist: JSON.stringify(group.duration), ttft_hist: JSON.stringify(group.ttft) }));
}

/** The stored histogram plus the new one, bucket by bucket, as a JSON object (text). */
function mergeHistograms(dialect: Dialect, table: string, column: string): string {
  if (dialect === "sqlite") {
    return `(SELECT coalesce(json_group_object(bucket, total), '{}') FROM (SELECT key AS bucket, sum(value) AS total FROM (SELECT key, value FROM json_each(${table}.${column}) UNION ALL SELECT key, value FROM json_each(excluded.${column})) GROUP BY key))`;
  }
  return `(SELECT coalesce(json_object_agg(bucket, total), '{}'::json)::text FROM (SELECT key AS bucket, sum(value::bigint) AS total FROM (SELECT * FROM json_each_text(${table}.${column}::json) UNION ALL SELECT * FROM json_each_text(excluded.${column}::json)) AS entries GROUP BY key) AS merged)`;
}

/** Upserts one page's groups, many per statement; each (start, key, model) appears once per call. */
async function upsert(options: { db: Kysely<unknown>; dialect: Dialect; granularity: Granularity; rows: readonly AggregateRow[] }): Promise<void> {
  const { db, dialect, granularity, rows } = options;
  const table = TABLES[granularity];
  const columns = [granularity, "key_id", "model", ...COUNTER_COLUMNS, ...HISTOGRAM_COLUMNS].join(", ");
  const updates = [
    ...COUNTER_COLUMNS.map((c) => `${c} = ${table}.${c} + excluded.${c}`),
    ...HISTOGRAM_COLUMNS.map((c) => `${c} = ${mergeHistograms(dialect, table, c)}`),
  ];
  const conflict = `ON CONFLICT (${granularity}, key_id, model) DO UPDATE SET ${updates.join(", ")}`;
  for (let offset = 0; offset < rows.length; offset += UPSERT_CHUNK) {
    const values: RawBuilder<unknown>[] = rows.slice(offset, offset + UPSERT_CHUNK).map((row) => sql`(${sql.join(VALUE_FIELDS.map((field) => row[field]))})`);
    await sql`INSERT INTO ${sql.raw(table)} (${sql.raw(columns)}) VALUES ${sql.join(values)} ${sql.raw(conflict)}`.execute(db);
  }
}
