// GET /api/v1/usage, mounted by the admin API behind its admin-key middleware:
// `?from=&to=&key=&model=&group_by=key,model,minute|hour|day` → {"data": [UsageReportRow],
// "total": UsageReportRow} (the total of all rows, with the percentiles of all requests).
// The handler checks the query (a 400 names the field), resolves the key to its ids (by
// id, shown prefix or name: every key of that name) and an alias to its model, and hands
// over to usage-query.ts. Without from and to it reports the last 24 hours.
import type { Hono } from "hono";
import { z } from "zod";
import { BadRequestError, parseWith } from "../core/errors.ts";
import type { KeyService, Principal } from "../keys/key-service.ts";
import type { Store } from "../store/store.ts";
import { queryUsage, USAGE_GROUPS, type UsageGroup, type UsageQuery } from "./usage-query.ts";

type Env = { Variables: { principal: Principal } };

export interface UsageRoutesOptions {
  store: Store;
  keys: Pick<KeyService, "list">;
  /** Resolves an alias to its model, so ?model= takes either. */
  catalog: { resolve(nameOrAlias: string): { name: string } | undefined };
  clock?: () => number;
}

const DEFAULT_SPAN_MS = 24 * 3_600_000;
const MAX_MINUTE_SPAN_MS = 48 * 3_600_000;

/** A date (UTC midnight) or a date-time with Z or an offset: a time without a zone would depend on the server's. */
const ISO_TIME = /^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:?\d{2}))?$/;
const timeSchema = z
  .string()
  .refine(
    (value) => ISO_TIME.test(value) && !Number.isNaN(Date.parse(value)),
    "must be an ISO date or date-time with a zone, e.g. 2026-11-30 or 2026-11-30T10:00:00Z",
  );

const usageQuerySchema = z.strictObject({
  from: timeSchema.optional(),
  to: timeSchema.optional(),
  key: z.string().min(1, "names a key: its name, id or prefix").optional(),
  model: z.string().min(1, "names a model or alias").optional(),
  group_by: z
    .string()
    .optional()
    .transform((value, ctx): UsageGroup[] => {
      if (value === undefined || value.trim() === "") return [];
      const groups = value.split(",").map((part) => part.trim());
      for (const group of groups) {
        if (!(USAGE_GROUPS as readonly string[]).includes(group)) {
          ctx.addIssue({ code: "custom", message: `'${group}' is not one of ${USAGE_GROUPS.join(", ")} (several may be comma-separated, e.g. key,day)` });
          return z.NEVER;
        }
      }
      if (new Set(groups).size !== groups.length) {
        ctx.addIssue({ code: "custom", message: "names a group twice" });
        return z.NEVER;
      }
      if (groups.filter((group) => group === "minute" || group === "hour" || group === "day").length > 1) {
        ctx.addIssue({ code: "custom", message: "takes one of minute, hour or day, not several" });
        return z.NEVER;
      }
      return groups as UsageGroup[];
    }),
});

export function mountUsageRoutes(app: Hono<Env>, options: UsageRoutesOptions): void {
  const clock = options.clock ?? Date.now;
  app.get("/api/v1/usage", async (c) => {
    const parsed = parseWith(usageQuerySchema, c.req.query(), "usage query");
    const to = parsed.to === undefined ? clock() : Date.parse(parsed.to);
    const from = parsed.from === undefined ? to - DEFAULT_SPAN_MS : Date.parse(parsed.from);
    if (from >= to) {
      throw new BadRequestError(`Invalid usage query: field 'to': must be after from (${new Date(from).toISOString()}); got ${new Date(to).toISOString()}.`, {
        code: "invalid_field",
        param: "to",
      });
    }
    // Per minute, a report has a row for each minute and group: two days is 2,880 minutes already.
    if (parsed.group_by.includes("minute") && to - from > MAX_MINUTE_SPAN_MS) {
      throw new BadRequestError(
        "Invalid usage query: field 'group_by': per minute, the span from 'from' to 'to' may be at most 48 hours; group by hour or day for longer spans.",
        { code: "invalid_field", param: "group_by" },
      );
    }
    const keys = await options.keys.list();
    let keyIds: string[] | null = null;
    if (parsed.key !== undefined) {
      const reference = parsed.key;
      keyIds = keys.filter((key) => key.id === reference || key.prefix === reference || key.name === reference).map((key) => key.id);
      if (keyIds.length === 0) {
        throw new BadRequestError(
          `Invalid usage query: field 'key': no API key has the name, id or prefix '${reference}'. List keys with 'llmgw ctl key list'.`,
          {
            code: "key_not_found",
            param: "key",
          },
        );
      }
    }
    const names = new Map(keys.map((key) => [key.id, key.name]));
    const query: UsageQuery = {
      from: new Date(from).toISOString(),
      to: new Date(to).toISOString(),
      keyIds,
      // A model removed from the catalog keeps its usage under its name.
      model: parsed.model === undefined ? null : (options.catalog.resolve(parsed.model)?.name ?? parsed.model),
      groupBy: parsed.group_by,
    };
    const report = await queryUsage(options.store, query, (keyId) => names.get(keyId) ?? keyId);
    return c.json({ data: report.rows, total: report.total });
  });
}
