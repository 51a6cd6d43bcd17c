// `llmgw ctl key ...`: API keys over the admin API: create (with its models, expiry,
// limits and guard models), list, show (limits, guards, what the key spent in its budget
// period and its rate use this minute), update (budget, rate limits, guards), revoke. The
// key itself is printed once, at creation.
import type { Command } from "commander";
import { BadRequestError } from "../core/errors.ts";
import { type CtlHelpers, type CtlOptions as Options, withExamples } from "./ctl-common.ts";
import { renderTable } from "./output.ts";

interface RateUse {
  rpm: number | null;
  tpm: number | null;
  requests: number;
  tokens: number;
}

interface KeyView {
  id: string;
  name: string;
  prefix: string;
  role: string;
  allowed_models: string[] | null;
  expires_at: string | null;
  revoked_at: string | null;
  last_used_at: string | null;
  rpm: number | null;
  tpm: number | null;
  budget_usd: number | null;
  budget_period: string;
  model_limits: Record<string, { rpm: number | null; tpm: number | null }> | null;
  guards: { input: string[]; output: string[] } | null;
  usage?: {
    budget: {
      limit_usd: number;
      period: string;
      period_id: string;
      spent_usd: number;
      reserved_usd: number;
      remaining_usd: number;
      resets_at: string | null;
    } | null;
    rate: (RateUse & { resets_at: string }) | null;
    models: Record<string, RateUse>;
  } | null;
}

/** The limit flags create and update share. */
function withLimitFlags(command: Command): Command {
  return command
    .option("--rpm <n>", "requests per minute ('none' removes the limit)")
    .option("--tpm <n>", "tokens per minute, prompt and output ('none' removes the limit)")
    .option("--budget <usd>", "budget in USD over the budget period ('none' removes it)")
    .option("--budget-period <period>", "total (default), day or month; days and months are UTC")
    .option(
      "--model-limit <limit>",
      "limits for one model: MODEL:rpm=N,tpm=N (repeat for more models; on update, replaces them all; 'none' removes them)",
      collect,
      [],
    )
    .option("--input-guards <names>", "comma-separated guard models that check every request of the key, besides its model's own ('none': no input guards)")
    .option("--output-guards <names>", "comma-separated guard models that check every non-stream answer to the key ('none': no output guards)");
}

export function registerKeyCommands(ctl: Command, { connect, print }: CtlHelpers): void {
  const key = ctl.command("key").description("API keys, their budgets and rate limits");
  withLimitFlags(
    withExamples(
      key.command("create [name]"),
      "llmgw ctl key create ci --models tiny-llama --expires 30d",
      "llmgw ctl key create team-a --rpm 60 --tpm 100000 --budget 20 --budget-period month",
      "llmgw ctl key create kiosk --input-guards lg --output-guards lg",
      "llmgw ctl key create --name ops --admin",
    )
      .description("Create an API key; it is shown once")
      .option("--name <name>", "who or what the key is for (or give it as the first argument)")
      .option("--admin", "an admin key (admin API and every model)")
      .option("--models <names>", "comma-separated models the key may use (default: all)")
      .option("--expires <when>", "expiry: an ISO date-time or a duration like 30d, 12h"),
  )
    .option("--json", "print JSON")
    .action(async (positionalName: string | undefined, options: Options, command: Command) => {
      if (positionalName !== undefined && typeof options.name === "string" && options.name !== positionalName) {
        throw new BadRequestError(`Two names given: '${positionalName}' and --name '${options.name}'. Give the key's name once.`);
      }
      const name = positionalName ?? options.name;
      if (typeof name !== "string") throw new BadRequestError("Name the key: llmgw ctl key create NAME (or --name NAME).");
      const created = await connect(command).call<KeyView & { key: string }>("POST", "/api/v1/keys", {
        name,
        role: options.admin === true ? "admin" : "client",
        ...(typeof options.models === "string"
          ? {
              allowed_models: options.models
                .split(",")
                .map((m) => m.trim())
                .filter(Boolean),
            }
          : {}),
        ...(typeof options.expires === "string" ? { expires_at: parseExpiry(options.expires) } : {}),
        ...limitFields(options),
        ...guardFields(options),
      });
      print(command, created, () => `${created.key}\n\nThis is the only time the key is shown; store it now. (id ${created.id}, prefix ${created.prefix})`);
    });
  withExamples(key.command("list"), "llmgw ctl key list")
    .description("API keys: name, prefix, role, models, limits, expiry, state and last use (never the key)")
    .option("--json", "print JSON")
    .action(async (_options: Options, command: Command) => {
      const { data } = await connect(command).call<{ data: KeyView[] }>("GET", "/api/v1/keys");
      print(command, data, () =>
        renderTable(
          ["ID", "NAME", "PREFIX", "ROLE", "MODELS", "LIMITS", "EXPIRES", "STATE", "LAST USED"],
          data.map((k) => [
            k.id,
            k.name,
            `${k.prefix}…`,
            k.role,
            k.allowed_models?.join(",") ?? "all",
            limitsSummary(k),
            k.expires_at,
            k.revoked_at === null ? "active" : "revoked",
            k.last_used_at,
          ]),
        ),
      );
    });
  withExamples(key.command("show <ref>"), "llmgw ctl key show ci")
    .description("One key: its limits, what it spent of its budget this period, and its requests and tokens this minute")
    .option("--json", "print JSON")
    .action(async (ref: string, _options: Options, command: Command) => {
      const k = await connect(command).call<KeyView>("GET", `/api/v1/keys/${encodeURIComponent(ref)}`);
      print(command, k, () => showKey(k));
    });
  withLimitFlags(
    withExamples(
      key.command("update <ref>"),
      "llmgw ctl key update ci --budget 50 --budget-period month",
      "llmgw ctl key update ci --rpm none --model-limit big-model:rpm=5",
      "llmgw ctl key update kiosk --input-guards lg,jg --output-guards none",
    ),
  )
    .description(
      "Change a key's budget, rate limits and guard models; applies to its next request (within 5 s on other servers). Spending so far stays counted",
    )
    .option("--json", "print JSON")
    .action(async (ref: string, options: Options, command: Command) => {
      const fields = { ...limitFields(options), ...guardFields(options) };
      if (Object.keys(fields).length === 0)
        throw new BadRequestError("Nothing to update: give --rpm, --tpm, --budget, --budget-period, --model-limit, --input-guards or --output-guards.");
      const updated = await connect(command).call<KeyView>("PATCH", `/api/v1/keys/${encodeURIComponent(ref)}`, fields);
      print(command, updated, () => `Updated key '${updated.name}' (${updated.prefix}…): ${limitsSummary(updated)}; guards: ${guardsSummary(updated)}.`);
    });
  withExamples(key.command("revoke <ref>"), "llmgw ctl key revoke ci")
    .description("Revoke a key by id, prefix or name; applies to its next request")
    .option("--json", "print JSON")
    .action(async (ref: string, _options: Options, command: Command) => {
      const revoked = await connect(command).call<KeyView>("DELETE", `/api/v1/keys/${encodeURIComponent(ref)}`);
      print(command, revoked, () => `Revoked key '${revoked.name}' (${revoked.prefix}…).`);
    });
}

function collect(value: string, previous: string[]): string[] {
  return [...previous, value];
}

/** The API fields of the limit flags given (absent flags are left out, 'none' becomes null). */
export function limitFields(options: Options): Record<string, unknown> {
  const fields: Record<string, unknown> = {};
  if (typeof options.rpm === "string") fields.rpm = wholeOrNone(options.rpm, "--rpm", "requests per minute");
  if (typeof options.tpm === "string") fields.tpm = wholeOrNone(options.tpm, "--tpm", "tokens per minute");
  if (typeof options.budget === "string") {
    const value = options.budget.trim().replace(/^\$/, "");
    if (value === "none") fields.budget_usd = null;
    else if (/^\d+(\.\d+)?$/.test(value)) fields.budget_usd = Number(value);
    else throw new BadRequestError(`Invalid --budget '${options.budget}': give an amount in USD such as 20 or 12.50, or 'none' to remove the budget.`);
  }
  if (typeof options.budgetPeriod === "string") fields.budget_period = options.budgetPeriod;
  const modelLimits = (options.modelLimit as string[] | undefined) ?? [];
  if (modelLimits.length > 0)
    fields.model_limits = modelLimits.length === 1 && modelLimits[0] === "none" ? null : Object.fromEntries(modelLimits.map(parseModelLimit));
  return fields;
}

/**
 * The API's `guards` field from --input-guards / --output-guards: a side given replaces
 * that side ('none' empties it), a side not given is left as it is (on update) or empty.
 */
export function guardFields(options: Options): Record<string, unknown> {
  const guards: Record<string, string[]> = {};
  for (const [flag, side] of [
    ["inputGuards", "input"],
    ["outputGuards", "output"],
  ] as const) {
    const value = options[flag];
    if (typeof value !== "string") continue;
    const names = value
      .split(",")
      .map((name) => name.trim())
      .filter(Boolean);
    if (names.length === 0)
      throw new BadRequestError(`Invalid --${side}-guards '${value}': give comma-separated guard model names, or 'none' for no ${side} guards.`);
    guards[side] = names.length === 1 && names[0] === "none" ? [] : names;
  }
  return Object.keys(guards).length === 0 ? {} : { guards };
}

function wholeOrNone(value: string, flag: string, what: string): number | null {
  if (value.trim() === "none") return null;
  if (!/^\d+$/.test(value.trim()) || Number(value) < 1)
    throw new BadRequestError(`Invalid ${flag} '${value}': give a whole number of ${what} (1 or more), or 'none' to remove the limit.`);
  return Number(value);
}

/** "big-model:rpm=5,tpm=20000" → ["big-model", {rpm: 5, tpm: 20000}]. */
function parseModelLimit(text: string): [string, { rpm?: number; tpm?: number }] {
  const match = /^([^:]+):(.+)$/.exec(text.trim());
  const hint = `Invalid --model-limit '${text}': write MODEL:rpm=N,tpm=N (either or both), e.g. big-model:rpm=5.`;
  if (match === null) throw new BadRequestError(hint);
  const limits: { rpm?: number; tpm?: number } = {};
  for (const part of match[2]!.split(",")) {
    const [name, value] = part.split("=").map((s) => s.trim());
    if ((name !== "rpm" && name !== "tpm") || value === undefined || !/^\d+$/.test(value)) throw new BadRequestError(hint);
    limits[name] = Number(value);
  }
  return [match[1]!.trim(), limits];
}

function limitsSummary(k: KeyView): string {
  const parts = [
    ...(k.rpm === null ? [] : [`${k.rpm} rpm`]),
    ...(k.tpm === null ? [] : [`${k.tpm} tpm`]),
    ...(k.budget_usd === null ? [] : [`$${k.budget_usd} ${k.budget_period === "total" ? "total" : `per ${k.budget_period}`}`]),
    ...Object.entries(k.model_limits ?? {}).map(
      ([model, l]) =>
        `${model}: ${[l.rpm === null || l.rpm === undefined ? "" : `${l.rpm} rpm`, l.tpm === null || l.tpm === undefined ? "" : `${l.tpm} tpm`].filter(Boolean).join(" ")}`,
    ),
  ];
  return parts.length === 0 ? "none" : parts.join(", ");
}

function guardsSummary(k: KeyView): string {
  if (k.guards === null) return "none";
  const side = (names: string[]) => (names.length === 0 ? "none" : names.join(", "));
  return `input ${side(k.guards.input)}; output ${side(k.guards.output)}`;
}

function showKey(k: KeyView): string {
  const lines = [
    `key ${k.name} (${k.prefix}…): ${k.role}, ${k.revoked_at === null ? "active" : `revoked at ${k.revoked_at}`}`,
    `models: ${k.allowed_models?.join(", ") ?? "all"}; expires: ${k.expires_at ?? "never"}; last used: ${k.last_used_at ?? "never"}`,
    `guards: ${guardsSummary(k)}`,
  ];
  const budget = k.usage?.budget ?? null;
  if (budget === null) lines.push("budget: none");
  else {
    const period = budget.period === "total" ? "in total" : `this ${budget.period} (${budget.period_id}, UTC)`;
    lines.push(
      `budget: $${round(budget.spent_usd)} spent of $${budget.limit_usd} ${period}` +
        (budget.reserved_usd > 0 ? `, $${round(budget.reserved_usd)} reserved by requests in flight` : "") +
        `; $${round(budget.remaining_usd)} left; ${budget.resets_at === null ? "never resets" : `resets at ${budget.resets_at}`}`,
    );
  }
  const rate = k.usage?.rate ?? null;
  const models = Object.entries(k.usage?.models ?? {});
  if (rate === null && models.length === 0) lines.push("rate limits: none");
  else {
    const rows = [...(rate === null ? [] : [["(key)", rate] as const]), ...models];
    lines.push(
      `rate use this minute${rate === null ? "" : ` (resets at ${rate.resets_at})`}:`,
      renderTable(
        ["SCOPE", "REQUESTS", "TOKENS"],
        rows.map(([scope, use]) => [scope, `${use.requests}/${use.rpm ?? "∞"}`, `${use.tokens}/${use.tpm ?? "∞"}`]),
      ),
    );
  }
  return lines.join("\n");
}

function round(usd: number): string {
  return String(Number(usd.toFixed(usd >= 1 ? 2 : 6)));
}

/** "30d", "12h", "45m" from now, or an ISO date-time as given. */
export function parseExpiry(value: string, now: number = Date.now()): string {
  const match = /^(\d+)\s*([dhm])$/.exec(value.trim());
  if (match !== null) {
    const unit = { d: 86_400_000, h: 3_600_000, m: 60_000 }[match[2] as "d" | "h" | "m"];
    return new Date(now + Number(match[1]) * unit).toISOString();
  }
  if (Number.isNaN(Date.parse(value))) throw new BadRequestError(`Invalid --expires '${value}': use a duration like 30d or 12h, or an ISO date-time.`);
  return value;
}
