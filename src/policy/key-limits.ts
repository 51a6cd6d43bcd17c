// What a key's limits are, as the key service stores them and the limits service reads
// them: requests and tokens per minute (for the whole key, and optionally per model), and
// a budget in USD over a period (total, or a UTC day or month). The fields live on the
// api_keys row (migration 0007_key_limits) and travel with the Principal, so admitting a
// request needs no lookup; a key without any of them costs no store query at all.
import { z } from "zod";
import { MODEL_NAME_PATTERN } from "../catalog/model-schema.ts";

export const BUDGET_PERIODS = ["total", "day", "month"] as const;
export type BudgetPeriod = (typeof BUDGET_PERIODS)[number];

/** A budget needs a period; one given without it counts over the key's whole life. */
export const DEFAULT_BUDGET_PERIOD: BudgetPeriod = "total";

export interface RateLimits {
  /** Requests per minute; null: not limited. */
  rpm: number | null;
  /** Tokens (prompt + completion, reserved then settled) per minute; null: not limited. */
  tpm: number | null;
}

export interface KeyLimits extends RateLimits {
  budgetUsd: number | null;
  budgetPeriod: BudgetPeriod;
  /** Limits of one model for this key, on top of the key-wide ones (model name → limits). */
  models: ReadonlyMap<string, RateLimits>;
}

const perMinute = z.number().int("must be a whole number").positive("must be at least 1").max(100_000_000);
const budget = z.number().min(0, "must be 0 or more (USD)").max(1_000_000_000);
const modelRateLimits = z
  .strictObject({ rpm: perMinute.nullable().default(null), tpm: perMinute.nullable().default(null) })
  .refine((limits) => limits.rpm !== null || limits.tpm !== null, "needs rpm or tpm");
const modelLimits = z.record(z.string().regex(MODEL_NAME_PATTERN, "must be a model name"), modelRateLimits);

/** The limit fields of a key, as POST /api/v1/keys takes them (all optional). */
export const keyLimitFields = {
  rpm: perMinute.nullable().default(null),
  tpm: perMinute.nullable().default(null),
  budget_usd: budget.nullable().default(null),
  budget_period: z.enum(BUDGET_PERIODS, { error: `must be one of ${BUDGET_PERIODS.join(", ")}` }).default(DEFAULT_BUDGET_PERIOD),
  model_limits: modelLimits.nullable().default(null),
};

/** PATCH /api/v1/keys/:ref: the limit fields to change (key-service.ts adds the others); null removes a limit. */
export const keyLimitsPatchFields = {
  rpm: perMinute.nullable().optional(),
  tpm: perMinute.nullable().optional(),
  budget_usd: budget.nullable().optional(),
  budget_period: z.enum(BUDGET_PERIODS, { error: `must be one of ${BUDGET_PERIODS.join(", ")}` }).optional(),
  model_limits: modelLimits.nullable().optional(),
};

/** The limit columns of an api_keys row. */
export interface KeyLimitColumns {
  rpm: number | null;
  tpm: number | null;
  budget_usd: number | null;
  budget_period: string | null;
  /** JSON object: model name → {rpm, tpm}. */
  model_limits: string | null;
}

/** What the API shows of a key's limits. */
export interface KeyLimitsView {
  rpm: number | null;
  tpm: number | null;
  budget_usd: number | null;
  budget_period: BudgetPeriod;
  model_limits: Record<string, RateLimits> | null;
}

export function limitsView(row: KeyLimitColumns): KeyLimitsView {
  return {
    rpm: row.rpm,
    tpm: row.tpm,
    budget_usd: row.budget_usd === null ? null : Number(row.budget_usd),
    budget_period: (row.budget_period ?? DEFAULT_BUDGET_PERIOD) as BudgetPeriod,
    model_limits: row.model_limits === null ? null : (JSON.parse(row.model_limits) as Record<string, RateLimits>),
  };
}

/** The limits a Principal carries; undefined for a key without any, so admission skips the store. */
export function limitsOfRow(row: KeyLimitColumns): KeyLimits | undefined {
  const view = limitsView(row);
  const models = new Map(Object.entries(view.model_limits ?? {}));
  if (view.rpm === null && view.tpm === null && view.budget_usd === null && models.size === 0) return undefined;
  return { rpm: view.rpm, tpm: view.tpm, budgetUsd: view.budget_usd, budgetPeriod: view.budget_period, models };
}

/** The columns to write for a key's limit fields (create, or an update merged over the old ones). */
export function limitColumns(fields: KeyLimitsView): KeyLimitColumns {
  return {
    rpm: fields.rpm,
    tpm: fields.tpm,
    budget_usd: fields.budget_usd,
    budget_period: fields.budget_period,
    model_limits: fields.model_limits === null || Object.keys(fields.model_limits).length === 0 ? null : JSON.stringify(fields.model_limits),
  };
}
