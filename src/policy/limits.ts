// Budgets and rate limits of API keys: the RequestLimits the gateway asks before a request
// runs. Admission reserves the request's worst case (token-bound.ts) in the store, one
// atomic statement per limit (limit-store.ts): the key's one-minute window, the window of
// the model for this key when it has its own limits, then the budget of the current
// period. A refusal undoes what was already reserved and answers 429, with the
// x-ratelimit-* headers OpenAI sends. The permit settles once, when the request ends:
// the reservation becomes the actual cost and tokens.
//
// A key without limits costs nothing here: its Principal carries no limits, and admission
// returns a shared empty permit without a query. Limits come with the Principal (cached 5 s
// by the key service), so a change made on this server applies to the next request, and
// one made on another server within 5 s.
import { TooManyRequestsError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { TokenUsage } from "../gateway/usage-tap.ts";
import type { Store } from "../store/store.ts";
import { costUsd } from "./cost.ts";
import type { BudgetPeriod, KeyLimits, KeyLimitsView, RateLimits } from "./key-limits.ts";
import { budgetPeriodAt, LimitStore, nanoToUsd, usdToNano, WHOLE_KEY, windowAt, type BudgetUse, type WindowRef, type WindowUse } from "./limit-store.ts";
import type { LimitsPermit, PolicyRequest, RequestLimits } from "./request-policy.ts";
import { tokenBound } from "./token-bound.ts";

export interface LimitsServiceOptions {
  store: Store;
  logger: Logger;
  clock?: () => number;
}

/** What `ctl key show` and GET /api/v1/keys/:ref show of a key's limits now. */
export interface KeyLimitsUse {
  budget: {
    limit_usd: number;
    period: BudgetPeriod;
    /** The row it counts in: 'total', '2026-12-01' or '2026-12'. */
    period_id: string;
    spent_usd: number;
    reserved_usd: number;
    remaining_usd: number;
    /** null: a total budget never resets. */
    resets_at: string | null;
  } | null;
  rate: (RateUse & { window_start: string; resets_at: string }) | null;
  models: Record<string, RateUse>;
}

interface RateUse {
  rpm: number | null;
  tpm: number | null;
  requests: number;
  tokens: number;
}

/** One rate scope a request is counted in: the whole key, or one model for it. */
interface Scope {
  ref: WindowRef;
  limits: RateLimits;
  /** How the scope is named in messages. */
  label: string;
}

const UNLIMITED: LimitsPermit = { headers: {}, settle: () => undefined };

export class LimitsService implements RequestLimits {
  private readonly limitStore: LimitStore;
  private readonly clock: () => number;
  private readonly settling = new Set<Promise<void>>();

  constructor(private readonly options: LimitsServiceOptions) {
    this.limitStore = new LimitStore(options.store);
    this.clock = options.clock ?? Date.now;
  }

  async admit(request: PolicyRequest): Promise<LimitsPermit> {
    const limits = request.principal.limits;
    if (limits === undefined) return UNLIMITED;
    const now = this.clock();
    const bound = tokenBound(request.endpoint, request.body, request.model);
    const tokens = bound.prompt + bound.output;
    const costNano = usdToNano(costUsd(request.model.definition.prices, { prompt_tokens: bound.prompt, completion_tokens: bound.output }));
    const window = windowAt(now);
    const scopes = rateScopes(request, limits, window.start);
    const reserved: Array<{ scope: Scope; use: WindowUse }> = [];
    const undoWindows = () => Promise.all(reserved.map(({ scope }) => this.limitStore.adjustWindow({ ...scope.ref, requests: -1, tokens: -tokens })));
    try {
      return await this.reserve({ request, limits, bound, tokens, costNano, now, window, scopes, reserved, undoWindows });
    } catch (error) {
      // A store that failed halfway (the refusals below undo their own): give back what was counted.
      if (!(error instanceof TooManyRequestsError)) await undoWindows().catch(() => undefined);
      throw error;
    }
  }

  private async reserve(admission: {
    request: PolicyRequest;
    limits: KeyLimits;
    bound: { prompt: number; output: number };
    tokens: number;
    costNano: number;
    now: number;
    window: { start: string; endsAt: number };
    scopes: Scope[];
    reserved: Array<{ scope: Scope; use: WindowUse }>;
    undoWindows: () => Promise<unknown>;
  }): Promise<LimitsPermit> {
    const { request, limits, bound, tokens, costNano, now, window, scopes, reserved, undoWindows } = admission;
    const keyName = request.principal.name;
    for (const scope of scopes) {
      const { rpm, tpm } = scope.limits;
      if (tpm !== null && tokens > tpm) {
        await undoWindows();
        throw new TooManyRequestsError(
          `This request may use up to ${tokens} tokens (a prompt of up to ${bound.prompt} and up to ${bound.output} of output), more than the ${tpm} tokens per minute ${scope.label} allows, so it can never be admitted. Lower max_tokens or shorten the prompt, or ask an administrator to raise the tpm limit ('llmgw ctl key update ${keyName} --tpm N').`,
          { code: "rate_limit_exceeded", type: "tokens", headers: { ...rateHeaders(reserved, now, window.endsAt), "x-should-retry": "false" } },
        );
      }
      const use = await this.limitStore.reserveWindow({ ...scope.ref, tokens, rpm, tpm });
      if (use === null) {
        await undoWindows();
        const seen = await this.limitStore.windowUse(scope.ref);
        const byRequests = rpm !== null && seen.requests + 1 > rpm;
        const retryAfterSeconds = Math.max(1, Math.ceil((window.endsAt - now) / 1000));
        const what = byRequests ? `requests per minute: limit ${rpm}, used ${seen.requests}` : `tokens per minute: limit ${tpm}, used ${seen.tokens}, this request may use up to ${tokens}`;
        throw new TooManyRequestsError(
          `Rate limit reached ${scope.label} on ${what}. Retry after ${retryAfterSeconds} s, when this minute's window ends (${new Date(window.endsAt).toISOString()}).`,
          {
            code: "rate_limit_exceeded",
            type: byRequests ? "requests" : "tokens",
            retryAfterSeconds,
            headers: rateHeaders([...reserved, { scope, use: seen }], now, window.endsAt),
          },
        );
      }
      reserved.push({ scope, use });
    }
    const headers = rateHeaders(reserved, now, window.endsAt);
    let budget: { keyId: string; period: string; reservedNano: number } | null = null;
    if (limits.budgetUsd !== null && costNano > 0) {
      const period = budgetPeriodAt(limits.budgetPeriod, now);
      const limitNano = Math.round(limits.budgetUsd * 1e9);
      const keyId = request.principal.keyId;
      const use = costNano > limitNano ? null : await this.limitStore.reserveBudget({ keyId, period: period.id, amountNano: costNano, limitNano, now });
      if (use === null) {
        await undoWindows();
        const seen = await this.limitStore.budgetUse(keyId, period.id);
        throw budgetRefusal({ keyName, limits, period, seen, costNano, now, headers: rateHeaders(reserved.map(({ scope, use: u }) => ({ scope, use: { requests: u.requests - 1, tokens: u.tokens - tokens } })), now, window.endsAt) });
      }
      budget = { keyId, period: period.id, reservedNano: costNano };
    }
    return this.permit({ request, headers, reservedTokens: tokens, windows: reserved.map(({ scope }) => scope.ref), budget });
  }

  private permit(held: {
    request: PolicyRequest;
    headers: Record<string, string>;
    reservedTokens: number;
    windows: WindowRef[];
    budget: { keyId: string; period: string; reservedNano: number } | null;
  }): LimitsPermit {
    let settled = false;
    return {
      headers: held.headers,
      settle: ({ usage, answered }) => {
        if (settled) return;
        settled = true;
        const work = this.settle(held, usage, answered).catch((error: unknown) => {
          this.options.logger.warn({ err: error, key: held.request.principal.name }, "a budget or rate-limit settlement failed; the reservation stays counted");
        });
        this.settling.add(work);
        void work.finally(() => this.settling.delete(work));
      },
    };
  }

  private async settle(
    held: { request: PolicyRequest; reservedTokens: number; windows: WindowRef[]; budget: { keyId: string; period: string; reservedNano: number } | null },
    usage: TokenUsage | null,
    answered: boolean,
  ): Promise<void> {
    // No usage and no answer: nothing ran, nothing is owed. Answered without counts: the
    // reservation is the best bound there is, so it stands.
    const tokens = usage !== null ? usage.prompt_tokens + usage.completion_tokens : answered ? held.reservedTokens : 0;
    const now = this.clock();
    await Promise.all(held.windows.map((ref) => this.limitStore.adjustWindow({ ...ref, requests: 0, tokens: tokens - held.reservedTokens })));
    if (held.budget === null) return;
    let chargedNano = usage !== null ? usdToNano(costUsd(held.request.model.definition.prices, usage)) : answered ? held.budget.reservedNano : 0;
    if (chargedNano > held.budget.reservedNano) {
      // The bound is an upper bound for text, so this means a replica counted more than it
      // can have (or media the context length did not cap). The budget must still hold:
      // the charge stops at the reservation, and the log says so.
      this.options.logger.warn(
        { key: held.request.principal.name, model: held.request.model.name, usage, reserved_usd: nanoToUsd(held.budget.reservedNano) },
        "a request cost more than its reservation; the budget is charged the reservation",
      );
      chargedNano = held.budget.reservedNano;
    }
    await this.limitStore.settleBudget({ ...held.budget, chargedNano, now });
  }

  /** Waits for settlements still being written (before the store closes). */
  async close(): Promise<void> {
    while (this.settling.size > 0) await Promise.all([...this.settling]);
  }

  /** A key's budget and rate use now, for `ctl key show`. */
  async usageOf(key: { id: string } & KeyLimitsView): Promise<KeyLimitsUse> {
    const now = this.clock();
    const window = windowAt(now);
    let budget: KeyLimitsUse["budget"] = null;
    if (key.budget_usd !== null) {
      const period = budgetPeriodAt(key.budget_period, now);
      const use = await this.limitStore.budgetUse(key.id, period.id);
      budget = {
        limit_usd: key.budget_usd,
        period: key.budget_period,
        period_id: period.id,
        spent_usd: nanoToUsd(use.spentNano),
        reserved_usd: nanoToUsd(use.reservedNano),
        remaining_usd: Math.max(0, nanoToUsd(Math.round(key.budget_usd * 1e9) - use.spentNano - use.reservedNano)),
        resets_at: period.resetsAt === null ? null : new Date(period.resetsAt).toISOString(),
      };
    }
    const rateUse = async (model: string, limits: RateLimits): Promise<RateUse> => ({
      ...limits,
      ...(await this.limitStore.windowUse({ keyId: key.id, model, windowStart: window.start })),
    });
    const models: Record<string, RateUse> = {};
    for (const [model, limits] of Object.entries(key.model_limits ?? {})) models[model] = await rateUse(model, limits);
    const rate = key.rpm === null && key.tpm === null ? null : { ...(await rateUse(WHOLE_KEY, { rpm: key.rpm, tpm: key.tpm })), window_start: window.start, resets_at: new Date(window.endsAt).toISOString() };
    return { budget, rate, models };
  }

  /** Spend in the current budget period of every key with a budget (metrics, at scrape time). */
  async spentByKey(): Promise<Array<{ key: string; spent_usd: number; reserved_usd: number; limit_usd: number; period: BudgetPeriod }>> {
    const keys = await this.options.store.db.selectFrom("api_keys").select(["id", "name", "budget_usd", "budget_period"]).where("budget_usd", "is not", null).orderBy("name").execute();
    const rows = await this.limitStore.budgetRows(keys.map((key) => key.id));
    const now = this.clock();
    return keys.map((key) => {
      const period = (key.budget_period ?? "total") as BudgetPeriod;
      const id = budgetPeriodAt(period, now).id;
      const row = rows.find((r) => r.keyId === key.id && r.period === id);
      return { key: key.name, spent_usd: nanoToUsd(row?.spentNano ?? 0), reserved_usd: nanoToUsd(row?.reservedNano ?? 0), limit_usd: Number(key.budget_usd), period };
    });
  }
}

function rateScopes(request: PolicyRequest, limits: KeyLimits, windowStart: string): Scope[] {
  const keyId = request.principal.keyId;
  const scopes: Scope[] = [];
  if (limits.rpm !== null || limits.tpm !== null) {
    scopes.push({ ref: { keyId, model: WHOLE_KEY, windowStart }, limits, label: `for key '${request.principal.name}'` });
  }
  const ofModel = limits.models.get(request.model.name);
  if (ofModel !== undefined) {
    scopes.push({ ref: { keyId, model: request.model.name, windowStart }, limits: ofModel, label: `for key '${request.principal.name}' on model '${request.model.name}'` });
  }
  return scopes;
}

/**
 * OpenAI's rate-limit headers, for the scope with the least left of each kind (the key's
 * own, or the model's for this key). Only for keys with rpm or tpm.
 */
function rateHeaders(counted: ReadonlyArray<{ scope: Scope; use: WindowUse }>, now: number, endsAt: number): Record<string, string> {
  const headers: Record<string, string> = {};
  const reset = openAiDuration(endsAt - now);
  for (const [kind, limitOf, usedOf] of [
    ["requests", (l: RateLimits) => l.rpm, (u: WindowUse) => u.requests],
    ["tokens", (l: RateLimits) => l.tpm, (u: WindowUse) => u.tokens],
  ] as const) {
    let tightest: { limit: number; remaining: number } | null = null;
    for (const { scope, use } of counted) {
      const limit = limitOf(scope.limits);
      if (limit === null) continue;
      const remaining = Math.max(0, limit - usedOf(use));
      if (tightest === null || remaining < tightest.remaining) tightest = { limit, remaining };
    }
    if (tightest === null) continue;
    headers[`x-ratelimit-limit-${kind}`] = String(tightest.limit);
    headers[`x-ratelimit-remaining-${kind}`] = String(tightest.remaining);
    headers[`x-ratelimit-reset-${kind}`] = reset;
  }
  return headers;
}

/** A wait the way OpenAI writes it (Go's durations): "850ms", "12s", "1m0s". Whole seconds above one, rounded up. */
export function openAiDuration(ms: number): string {
  if (ms < 1000) return `${Math.max(0, Math.ceil(ms))}ms`;
  const seconds = Math.ceil(ms / 1000);
  return seconds < 60 ? `${seconds}s` : `${Math.floor(seconds / 60)}m${seconds % 60}s`;
}

function budgetRefusal(options: {
  keyName: string;
  limits: KeyLimits;
  period: ReturnType<typeof budgetPeriodAt>;
  seen: BudgetUse;
  costNano: number;
  now: number;
  headers: Record<string, string>;
}): TooManyRequestsError {
  const { keyName, limits, period, seen, costNano, now } = options;
  const periodText = limits.budgetPeriod === "total" ? "in total" : limits.budgetPeriod === "day" ? `for ${period.id} (UTC)` : `for ${period.id} (UTC month)`;
  const where =
    `The key '${keyName}' has spent ${usd(nanoToUsd(seen.spentNano))} of its ${usd(limits.budgetUsd ?? 0)} budget ${periodText}` +
    (seen.reservedNano > 0 ? `, and requests in flight hold ${usd(nanoToUsd(seen.reservedNano))}` : "") +
    `; this request may cost up to ${usd(nanoToUsd(costNano))}` +
    (costNano > Math.round((limits.budgetUsd ?? 0) * 1e9) ? `, more than the whole budget: lower max_tokens or shorten the prompt.` : ".");
  const next =
    period.resetsAt === null
      ? ` A total budget does not reset: an administrator can raise it with 'llmgw ctl key update ${keyName} --budget USD'.`
      : ` The budget resets at ${new Date(period.resetsAt).toISOString()}; an administrator can raise it with 'llmgw ctl key update ${keyName} --budget USD'.`;
  return new TooManyRequestsError(where + next, {
    code: "insufficient_quota",
    type: "insufficient_quota",
    retryable: false,
    headers: options.headers,
    ...(period.resetsAt === null ? {} : { retryAfterSeconds: Math.max(1, Math.ceil((period.resetsAt - now) / 1000)) }),
  });
}

function usd(amount: number): string {
  return `$${Number(amount.toFixed(amount >= 1 ? 2 : 6))}`;
}
