// Usage reports, read from the aggregates (never from the raw rows, so a report over
// last month still works after retention deleted its rows): the minutes that start in
// [from, to), for some keys or one model, added up per key, model, hour or day, with
// p50/p95 of the duration and p50 of the time to first token read from the merged
// latency histograms (latency-histogram.ts says how close those are), and a total line.
//
// A long range must not stall the server: on SQLite every read blocks the event loop,
// and the work is per stored row (two JSON.parse and a merge). So whole hours are read
// from usage_hours (60 times fewer rows than minutes), only the partial hours at either
// end from usage_minutes, and both a page at a time in key order, yielding to the event
// loop between pages. bench/usage/report.ts, 30 days × 10 keys × 3 models (1.3 M minute
// rows) on SQLite, a loaded 2-core machine: reading every minute row in one select took
// 22-33 s, all of it with the event loop blocked; now 0.4-0.9 s in all, blocked at most
// 30-100 ms at a time. Adding up the minute rows in SQL instead (GROUP BY a prefix of
// `minute`, json_each with a sum per bucket) was no cure: 3 s for the counters and 15 s
// for one histogram over the month, each one blocking select.
import { sql, type RawBuilder } from "kysely";
import type { Store } from "../store/store.ts";
import { AGGREGATE_TABLES, type Aggregate, type Granularity } from "./usage-aggregates.ts";
import { mergeInto, parseHistogram, percentile, type Histogram } from "./latency-histogram.ts";

export const USAGE_GROUPS = ["key", "model", "minute", "hour", "day"] as const;
export type UsageGroup = (typeof USAGE_GROUPS)[number];

export interface UsageQuery {
  /** ISO times; a minute counts when it starts at or after `from` and before `to`. */
  from: string;
  to: string;
  /** Only these keys (ids); null: every key. */
  keyIds: readonly string[] | null;
  /** Only this model (its catalog name); null: every model. */
  model: string | null;
  /** What rows are per; empty: one row of totals. At most one of hour and day. */
  groupBy: readonly UsageGroup[];
}

/** One row of GET /api/v1/usage. Fields not grouped by are null. */
export interface UsageReportRow {
  key: string | null;
  model: string | null;
  /** Start of the hour or day (UTC), ISO. */
  period: string | null;
  requests: number;
  errors: number;
  prompt_tokens: number;
  completion_tokens: number;
  cost_usd: number;
  /** Requests whose upstream reported no usage: their tokens (and cost) are the gateway's estimate, an upper bound. */
  estimated_requests: number;
  p50_ms: number | null;
  p95_ms: number | null;
  ttft_p50_ms: number | null;
}

interface Group {
  row: UsageReportRow;
  duration: Histogram;
  ttft: Histogram;
}

/** The rows of GET /api/v1/usage and the line that adds them all up (its percentiles are those of every request). */
export interface UsageReport {
  rows: UsageReportRow[];
  total: UsageReportRow;
}

const HOUR_MS = 3_600_000;
/** Aggregates read per select: a few ms of blocking on SQLite. */
const PAGE_ROWS = 500;

/** Which table answers which part of [from, to): whole hours from usage_hours, the edges from usage_minutes. */
export function readPlan(fromMs: number, toMs: number): Array<{ granularity: Granularity; from: number; to: number }> {
  const firstHour = Math.ceil(fromMs / HOUR_MS) * HOUR_MS;
  const lastHour = Math.floor(toMs / HOUR_MS) * HOUR_MS;
  if (firstHour >= lastHour) return [{ granularity: "minute", from: fromMs, to: toMs }];
  const plan: Array<{ granularity: Granularity; from: number; to: number }> = [];
  if (fromMs < firstHour) plan.push({ granularity: "minute", from: fromMs, to: firstHour });
  plan.push({ granularity: "hour", from: firstHour, to: lastHour });
  if (lastHour < toMs) plan.push({ granularity: "minute", from: lastHour, to: toMs });
  return plan;
}

/**
 * Adds up the aggregates the query selects. `keyName` turns a key id into what rows
 * show (its name); keys with one name are one row, as the query selects them by name.
 */
export async function queryUsage(store: Store, query: UsageQuery, keyName: (keyId: string) => string | null): Promise<UsageReport> {
  const by = new Set(query.groupBy);
  const groups = new Map<string, Group>();
  const total = newGroup(null, null, null);
  const add = (aggregate: Aggregate) => {
    const key = by.has("key") ? (aggregate.key_id === "" ? null : keyName(aggregate.key_id)) : null;
    const model = by.has("model") ? aggregate.model : null;
    const period = by.has("minute")
      ? `${aggregate.start.slice(0, 16)}:00.000Z`
      : by.has("hour")
        ? `${aggregate.start.slice(0, 13)}:00:00.000Z`
        : by.has("day")
          ? `${aggregate.start.slice(0, 10)}T00:00:00.000Z`
          : null;
    const id = JSON.stringify([period, key, model]);
    let group = groups.get(id);
    if (group === undefined) {
      group = newGroup(key, model, period);
      groups.set(id, group);
    }
    addInto(group, aggregate);
  };
  if (query.keyIds === null || query.keyIds.length > 0) {
    // Minutes can only come from the per-minute table (the route bounds such a span to two days).
    const plan = by.has("minute")
      ? [{ granularity: "minute" as const, from: Date.parse(query.from), to: Date.parse(query.to) }]
      : readPlan(Date.parse(query.from), Date.parse(query.to));
    for (const part of plan) {
      await readPaged(store, query, part, add);
    }
  }
  for (const group of groups.values()) {
    addCounters(total.row, group.row);
    mergeInto(total.duration, group.duration);
    mergeInto(total.ttft, group.ttft);
  }
  const rows = [...groups.values()].map(finish);
  rows.sort((a, b) => compareText(a.period, b.period) || compareText(a.key, b.key) || compareText(a.model, b.model));
  return { rows, total: finish(total) };
}

/** Reads one part of the plan a page at a time, in primary-key order, yielding between pages. */
async function readPaged(
  store: Store,
  query: UsageQuery,
  part: { granularity: Granularity; from: number; to: number },
  add: (aggregate: Aggregate) => void,
): Promise<void> {
  const table = sql.raw(AGGREGATE_TABLES[part.granularity]);
  const start = sql.raw(part.granularity);
  const filters: RawBuilder<unknown>[] = [sql`${start} >= ${new Date(part.from).toISOString()}`, sql`${start} < ${new Date(part.to).toISOString()}`];
  if (query.keyIds !== null) filters.push(sql`key_id IN (${sql.join([...query.keyIds])})`);
  if (query.model !== null) filters.push(sql`model = ${query.model}`);
  // Every stored start is a non-empty ISO text, so the first page starts after ("", "", "").
  let after: [string, string, string] = ["", "", ""];
  for (;;) {
    const page =
      await sql<Aggregate>`SELECT ${start} AS start, key_id, model, requests, errors, prompt_tokens, completion_tokens, cost_usd, estimated_requests, duration_hist, ttft_hist FROM ${table} WHERE ${sql.join(filters, sql` AND `)} AND (${start}, key_id, model) > (${after[0]}, ${after[1]}, ${after[2]}) ORDER BY ${start}, key_id, model LIMIT ${PAGE_ROWS}`.execute(
        store.db,
      );
    for (const aggregate of page.rows) add(aggregate);
    const last = page.rows[page.rows.length - 1];
    if (last === undefined || page.rows.length < PAGE_ROWS) return;
    after = [last.start, last.key_id, last.model];
    // Let requests through between two pages (SQLite reads block the event loop).
    await new Promise((resolve) => setImmediate(resolve));
  }
}

function newGroup(key: string | null, model: string | null, period: string | null): Group {
  return {
    row: {
      key,
      model,
      period,
      requests: 0,
      errors: 0,
      prompt_tokens: 0,
      completion_tokens: 0,
      cost_usd: 0,
      estimated_requests: 0,
      p50_ms: null,
      p95_ms: null,
      ttft_p50_ms: null,
    },
    duration: {},
    ttft: {},
  };
}

function addInto(group: Group, aggregate: Aggregate): void {
  // PostgreSQL answers bigint sums as numbers (the store's int8 parser); Number() covers both.
  group.row.requests += Number(aggregate.requests);
  group.row.errors += Number(aggregate.errors);
  group.row.prompt_tokens += Number(aggregate.prompt_tokens);
  group.row.completion_tokens += Number(aggregate.completion_tokens);
  group.row.cost_usd += Number(aggregate.cost_usd);
  group.row.estimated_requests += Number(aggregate.estimated_requests);
  mergeInto(group.duration, parseHistogram(aggregate.duration_hist));
  mergeInto(group.ttft, parseHistogram(aggregate.ttft_hist));
}

function addCounters(into: UsageReportRow, from: UsageReportRow): void {
  into.requests += from.requests;
  into.errors += from.errors;
  into.prompt_tokens += from.prompt_tokens;
  into.completion_tokens += from.completion_tokens;
  into.cost_usd += from.cost_usd;
  into.estimated_requests += from.estimated_requests;
}

function finish({ row, duration, ttft }: Group): UsageReportRow {
  return {
    ...row,
    // Sums of many small doubles pick up noise in the last digits (0.30000000000000004).
    cost_usd: Math.round(row.cost_usd * 1e9) / 1e9,
    p50_ms: percentile(duration, 0.5),
    p95_ms: percentile(duration, 0.95),
    ttft_p50_ms: percentile(ttft, 0.5),
  };
}

function compareText(a: string | null, b: string | null): number {
  const left = a ?? "";
  const right = b ?? "";
  return left < right ? -1 : left > right ? 1 : 0;
}
