// `llmgw ctl usage`: what keys and models used, from GET /api/v1/usage (the server's
// usage aggregates, so it reaches back past the raw rows' retention): requests,
// errors, tokens, cost and latency per key, model, minute, hour or day, as an aligned table with
// a total line (the API's `total`, whose percentiles are those of all requests), or the
// API's rows with --json. The key filter is --key-name because
// --key is ctl's own flag for the admin key (commander gives a parent's flag precedence,
// wherever on the line it stands).
import type { Command } from "commander";
import { BadRequestError } from "../core/errors.ts";
import { type CtlHelpers, type CtlOptions as Options, wantsJson, withExamples } from "./ctl-common.ts";
import { renderTable } from "./output.ts";
import type { UsageReportRow } from "../usage/usage-query.ts";

/** One row of GET /api/v1/usage, as the API answers it. */
export type UsageRowView = UsageReportRow;

const UNIT_MS = { d: 86_400_000, h: 3_600_000, m: 60_000 } as const;

/** "7d", "12h", "30m" back from `now`, or an ISO date or date-time as given. */
export function parseSince(value: string, now: number): string {
  const match = /^(\d+)\s*([dhm])$/.exec(value.trim());
  if (match !== null) return new Date(now - Number(match[1]) * UNIT_MS[match[2] as keyof typeof UNIT_MS]).toISOString();
  if (!/^\d{4}-\d{2}-\d{2}/.test(value) || Number.isNaN(Date.parse(value))) {
    throw new BadRequestError(`Invalid --since '${value}': use a duration like 7d, 12h or 30m, or an ISO date such as 2026-11-01.`);
  }
  return new Date(value).toISOString();
}

/** The API path for the flags: the last `--since` up to now, grouped by `--by`. */
export function usagePath(options: { by: string; since: string; keyName?: string; model?: string }, now: number): string {
  const query = new URLSearchParams({ from: parseSince(options.since, now), to: new Date(now).toISOString(), group_by: options.by });
  if (options.keyName !== undefined) query.set("key", options.keyName);
  if (options.model !== undefined) query.set("model", options.model);
  return `/api/v1/usage?${query.toString()}`;
}

/**
 * The table: a column for each dimension grouped by, then the counts; `total` (the API's
 * total, whose percentiles are those of all requests) is the last line.
 */
export function renderUsage(rows: readonly UsageRowView[], groupBy: readonly string[], total?: UsageRowView): string {
  const period = groupBy.includes("minute") ? "minute" : groupBy.includes("hour") ? "hour" : groupBy.includes("day") ? "day" : null;
  const dimensions: Array<[string, (row: UsageRowView) => string | null]> = [];
  if (period !== null)
    dimensions.push([
      period.toUpperCase(),
      (row) => (row.period === null ? null : period === "day" ? row.period.slice(0, 10) : `${row.period.slice(0, 10)} ${row.period.slice(11, 16)}`),
    ]);
  if (groupBy.includes("key")) dimensions.push(["KEY", (row) => row.key]);
  if (groupBy.includes("model")) dimensions.push(["MODEL", (row) => row.model]);
  const headers = [
    ...dimensions.map(([header]) => header),
    "REQUESTS",
    "ERRORS",
    "PROMPT TOK",
    "COMPLETION TOK",
    "ESTIMATED",
    "COST",
    "P50",
    "P95",
    "TTFT P50",
  ];
  const line = (row: UsageRowView, labels: Array<string | null>) => [
    ...labels,
    row.requests,
    row.errors,
    row.prompt_tokens,
    row.completion_tokens,
    // Requests whose upstream reported no usage: their tokens and cost are llmgw's upper-bound estimate.
    row.estimated_requests,
    formatCost(row.cost_usd),
    formatMs(row.p50_ms),
    formatMs(row.p95_ms),
    formatMs(row.ttft_p50_ms),
  ];
  const table = rows.map((row) =>
    line(
      row,
      dimensions.map(([, cell]) => cell(row)),
    ),
  );
  if (total !== undefined && dimensions.length > 0)
    table.push(
      line(
        total,
        dimensions.map((_, index) => (index === 0 ? "TOTAL" : "")),
      ),
    );
  return renderTable(headers, table);
}

function formatCost(usd: number): string {
  if (usd === 0) return "$0";
  return `$${usd >= 1 ? usd.toFixed(2) : usd.toFixed(6)}`;
}

function formatMs(ms: number | null): string | null {
  return ms === null ? null : `${ms} ms`;
}

export function registerUsageCommand(ctl: Command, { connect, print }: CtlHelpers): void {
  withExamples(
    ctl.command("usage"),
    "llmgw ctl usage",
    "llmgw ctl usage --by key --since 7d",
    "llmgw ctl usage --by day,model --since 30d --model tiny-llama",
    "llmgw ctl usage --by hour --key-name ci --json",
  )
    .description("Requests, errors, tokens, cost and latency (p50, p95, time to first token) per key, model, hour or day")
    .option("--by <groups>", "key, model, minute, hour or day; several comma-separated, e.g. day,model (minute: spans up to 48h)", "model")
    .option("--since <when>", "how far back: 7d, 12h, 30m, or an ISO date", "24h")
    .option("--key-name <key>", "only this API key: its name, id or prefix (--key is the admin key)")
    .option("--model <name>", "only this model or alias")
    .option("--json", "print JSON")
    .action(async (options: Options, command: Command) => {
      const flags = {
        by: String(options.by),
        since: String(options.since),
        ...(typeof options.keyName === "string" ? { keyName: options.keyName } : {}),
        ...(typeof options.model === "string" ? { model: options.model } : {}),
      };
      const client = connect(command);
      const now = Date.now();
      const { data, total } = await client.call<{ data: UsageRowView[]; total: UsageRowView }>("GET", usagePath(flags, now));
      const groupBy = flags.by.split(",").map((group) => group.trim());
      if (wantsJson(command)) {
        print(command, data, () => "");
        return;
      }
      if (data.length === 0) {
        print(
          command,
          data,
          () =>
            `No usage in the last ${flags.since}${flags.keyName === undefined ? "" : ` for key '${flags.keyName}'`}${flags.model === undefined ? "" : ` of model '${flags.model}'`}.`,
        );
        return;
      }
      print(command, data, () => renderUsage(data, groupBy, data.length > 1 ? total : undefined));
    });
}
