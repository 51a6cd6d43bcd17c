// Usage reports, read from the per-minute aggregates (never from the raw rows, so a
// report over last month still works after retention deleted its rows): the minutes
// that start in [from, to), for some keys or one model, added up per key, model, hour or
// day, with p50/p95 of the duration and p50 of the time to first token read from the
// merged latency histograms (latency-histogram.ts says how close those are).
import type { Store } from "../store/store.ts";
import { mergeInto, parseHistogram, percentile, type Histogram } from "./latency-histogram.ts";

export const USAGE_GROUPS = ["key", "model", "hour", "day"] as const;
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
  p50_ms: number | null;
  p95_ms: number | null;
  ttft_p50_ms: number | null;
}

interface Group {
  row: UsageReportRow;
  duration: Histogram;
  ttft: Histogram;
}

/**
 * Adds up the aggregates the query selects. `keyName` turns a key id into what rows
 * show (its name); keys with one name are one row, as the query selects them by name.
 */
export async function queryUsage(store: Store, query: UsageQuery, keyName: (keyId: string) => string | null): Promise<UsageReportRow[]> {
  if (query.keyIds !== null && query.keyIds.length === 0) return [];
  let select = store.db
    .selectFrom("usage_minutes")
    .selectAll()
    .where("minute", ">=", new Date(query.from).toISOString())
    .where("minute", "<", new Date(query.to).toISOString());
  if (query.keyIds !== null) select = select.where("key_id", "in", [...query.keyIds]);
  if (query.model !== null) select = select.where("model", "=", query.model);
  const stored = await select.execute();

  const by = new Set(query.groupBy);
  const groups = new Map<string, Group>();
  for (const aggregate of stored) {
    const key = by.has("key") ? (aggregate.key_id === "" ? null : keyName(aggregate.key_id)) : null;
    const model = by.has("model") ? aggregate.model : null;
    const period = by.has("hour") ? `${aggregate.minute.slice(0, 13)}:00:00.000Z` : by.has("day") ? `${aggregate.minute.slice(0, 10)}T00:00:00.000Z` : null;
    const id = JSON.stringify([period, key, model]);
    let group = groups.get(id);
    if (group === undefined) {
      group = {
        row: { key, model, period, requests: 0, errors: 0, prompt_tokens: 0, completion_tokens: 0, cost_usd: 0, p50_ms: null, p95_ms: null, ttft_p50_ms: null },
        duration: {},
        ttft: {},
      };
      groups.set(id, group);
    }
    // PostgreSQL answers bigint sums as numbers (the store's int8 parser); Number() covers both.
    group.row.requests += Number(aggregate.requests);
    group.row.errors += Number(aggregate.errors);
    group.row.prompt_tokens += Number(aggregate.prompt_tokens);
    group.row.completion_tokens += Number(aggregate.completion_tokens);
    group.row.cost_usd += Number(aggregate.cost_usd);
    mergeInto(group.duration, parseHistogram(aggregate.duration_hist));
    mergeInto(group.ttft, parseHistogram(aggregate.ttft_hist));
  }

  const rows = [...groups.values()].map(({ row, duration, ttft }) => ({
    ...row,
    // Sums of many small doubles pick up noise in the last digits (0.30000000000000004).
    cost_usd: Math.round(row.cost_usd * 1e9) / 1e9,
    p50_ms: percentile(duration, 0.5),
    p95_ms: percentile(duration, 0.95),
    ttft_p50_ms: percentile(ttft, 0.5),
  }));
  return rows.sort((a, b) => compareText(a.period, b.period) || compareText(a.key, b.key) || compareText(a.model, b.model));
}

function compareText(a: string | null, b: string | null): number {
  const left = a ?? "";
  const right = b ?? "";
  return left < right ? -1 : left > right ? 1 : 0;
}
