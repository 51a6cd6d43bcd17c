// Budgets and rate limits of API keys: the RequestLimits the gateway asks before a request
// runs. Admission reserves the request's worst case (token-bound.ts) in the store, one
// atomic statement per limit (limit-store.ts): the key's one-minute window, the window of
// the model for this key when it has its own limits, then the budget of the current
// period. A refusal undoes what was already reserved and answers 429, with the
// x-ratelimit-* headers OpenAI sends. The permit settles once, when the request ends:
// the reservation becomes the actual cost and tokens. On PostgreSQL it is written a few ms
// later in a batch (limit-settlements.ts), retried until the store takes it; on SQLite the
// counters live in memory (limit-ledger.ts), so it applies at once and is written behind.
// While PostgreSQL cannot be reached, admission goes on from this server's own counts
// (limit-fallback.ts) and what those requests use is settled once it answers again.
//
// A key without limits costs nothing here: its Principal carries no limits, and admission
// returns a shared empty permit without a query. Limits come with the Principal (cached 5 s
// by the key service), so a change made on this server applies to the next request, and
// one made on another server within 5 s.
import { TooManyRequestsError } from "../core/errors.ts";
import { StorageUnavailableError } from "../store/storage-fault.ts";
import { LimitFallback } from "./limit-fallback.ts";
import type { Logger } from "../core/log.ts";
import type { TokenUsage } from "../core/token-usage.ts";
import type { Store } from "../store/store.ts";
import { costUsd, type Prices } from "./cost.ts";
import type { BudgetPeriod, KeyLimits, KeyLimitsView, RateLimits } from "./key-limits.ts";
import { budgetPeriodAt, LimitStore, nanoToUsd, usdToNano, WHOLE_KEY, windowAt, type BudgetUse, type WindowUse } from "./limit-store.ts";
import { SettlementQueue, type ReservedBudget } from "./limit-settlements.ts";
import { labelOf, rateHeaders, rateScopes, type RateScope } from "./rate-scopes.ts";
import type { LimitsPermit, PolicyRequest, RequestLimits } from "./request-policy.ts";
import { tokenBound, type TokenBound } from "./token-bound.ts";

export interface LimitsServiceOptions {
  store: Store;
  logger: Logger;
  clock?: () => number;
  /** Told when what a key spent leaves no room for a request that would fit a fresh budget: it is spent (budget_exhausted). */
  onBudgetRefused?: (refusal: BudgetRefused) => void;
}

export interface BudgetRefused {
  keyId: string;
  keyName: string;
  period: string;
  limitUsd: number;
  spentUsd: number;
  /** What the refused request could have cost. */
  requestUsd: number;
  resetsAt: number | null;
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

const UNLIMITED: LimitsPermit = { headers: {}, maxOutputTokens: null, settle: () => undefined };

/** What a permit holds until it settles. */
interface Held {
  request: PolicyRequest;
  reservedTokens: number;
  /** The rate scopes it counted in (their windows settle). */
  scopes: readonly RateScope[];
  budget: ReservedBudget | null;
  /** Admitted from memory while the database was unreachable (limit-fallback.ts): nothing of it is in the database yet. */
  fromMemory?: true;
}

/** A request's admission, worked out once (LimitsService.admissionOf). */
interface Admission {
  request: PolicyRequest;
  limits: KeyLimits;
  bound: TokenBound;
  costNano: number;
  now: number;
  window: { start: string; endsAt: number };
  scopes: RateScope[];
  /** The budget period the request counts in; null: no budget, or nothing to charge. */
  budgetPeriod: ReturnType<typeof budgetPeriodAt> | null;
  budgetLimitNano: number;
}

export class LimitsService implements RequestLimits {
  private readonly limitStore: LimitStore;
  private readonly clock: () => number;
  private readonly settlements: SettlementQueue;
  private readonly fallback: LimitFallback;

  constructor(private readonly options: LimitsServiceOptions) {
    this.limitStore = new LimitStore(options.store, options.logger);
    this.clock = options.clock ?? Date.now;
    this.settlements = new SettlementQueue({ limitStore: this.limitStore, logger: options.logger, clock: this.clock });
    this.fallback = new LimitFallback({ store: options.store, logger: options.logger });
  }

  /**
   * Synchronous when it can be: on SQLite a request that fits every limit is reserved in
   * memory at once (limit-ledger.ts) and its permit returned without a promise, which the
   * gateway benchmark measured as a real share of a limited key's cost per request. A
   * request that may be refused, and every request on PostgreSQL, takes the async path.
   */
  admit(request: PolicyRequest): LimitsPermit | Promise<LimitsPermit> {
    const limits = request.principal.limits;
    if (limits === undefined) return UNLIMITED;
    try {
      const admission = this.admissionOf(request, limits);
      // The database is known to be unreachable: no request waits on it.
      if (this.fallback.down()) return this.reserveFromMemory(admission);
      return this.reserveAtOnce(admission) ?? this.reserveStepByStep(admission);
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /** What admitting a request needs to know, worked out once. */
  private admissionOf(request: PolicyRequest, limits: KeyLimits): Admission {
    const now = this.clock();
    const bound = tokenBound(request.endpoint, request.body, request.model, request.rawBytes);
    const costNano = usdToNano(costUsd(request.model.definition.prices, worstCaseUsage(bound, request.model.definition.prices)));
    const window = windowAt(now);
    const scopes = rateScopes(request, limits, window.start);
    const budgetPeriod = limits.budgetUsd !== null && costNano > 0 ? budgetPeriodAt(limits.budgetPeriod, now) : null;
    return { request, limits, bound, costNano, now, window, scopes, budgetPeriod, budgetLimitNano: Math.round((limits.budgetUsd ?? 0) * 1e9) };
  }

  /**
   * The common case on SQLite: everything fits, reserved in memory in one step. Undefined
   * when this path does not apply (PostgreSQL) or something may be refused: the step-by-step
   * path then says which limit refused.
   */
  private reserveAtOnce(admission: Admission): LimitsPermit | undefined {
    const { request, bound, costNano, now, window, scopes, budgetPeriod, budgetLimitNano } = admission;
    const tokens = bound.total;
    const mayFit = scopes.every(({ limits: l }) => l.tpm === null || tokens <= l.tpm) && (budgetPeriod === null || costNano <= budgetLimitNano);
    if (!mayFit) return undefined;
    const together = this.limitStore.reserveTogether({
      // Fields written out: an object spread here cost more than the rest of the reservation.
      windows: scopes.map(({ ref, limits: l }) => ({ keyId: ref.keyId, model: ref.model, windowStart: ref.windowStart, tokens, rpm: l.rpm, tpm: l.tpm })),
      budget: budgetPeriod === null ? null : { keyId: request.principal.keyId, period: budgetPeriod.id, amountNano: costNano, limitNano: budgetLimitNano, now },
    });
    if (together === undefined || together === "refused") return undefined;
    return this.permit(
      {
        request,
        reservedTokens: tokens,
        scopes,
        budget: budgetPeriod === null ? null : { keyId: request.principal.keyId, period: budgetPeriod.id, reservedNano: costNano },
      },
      rateHeaders(scopes, together.windows, now, window.endsAt),
      this.outputCap(request, admission.limits, scopes, bound),
    );
  }

  /** One atomic statement per limit, in order; a refusal undoes what was counted before it. */
  private async reserveStepByStep(admission: Admission): Promise<LimitsPermit> {
    const reserved: Array<{ scope: RateScope; use: WindowUse }> = [];
    let undone = false;
    // Undoes the windows counted so far, at most once, whichever path gets here first.
    const undoWindows = async () => {
      if (undone) return;
      undone = true;
      await Promise.all(reserved.map(({ scope }) => this.limitStore.adjustWindow({ ...scope.ref, requests: -1, tokens: -admission.bound.total })));
    };
    try {
      return await this.reserve(admission, reserved, undoWindows);
    } catch (error) {
      // Only an unreachable database counts as an outage: a busy pool or a slow statement is a
      // 503 for this request alone, not a reason to count from memory on every server.
      if (error instanceof StorageUnavailableError && error.kind === "unreachable" && this.options.store.dialect === "postgres" && !undone) {
        // The database went away halfway: what it counted is given back once it answers
        // (a settlement), and the request is admitted from this server's own counts.
        undone = true;
        for (const { scope } of reserved) this.settlements.window(scope.ref, -admission.bound.total, -1);
        this.fallback.failed(error);
        return this.reserveFromMemory(admission);
      }
      // A store that failed halfway (the refusals below undo their own): give back what was counted.
      await undoWindows().catch(() => undefined);
      throw error;
    }
  }

  /** Admission from this server's own counts while the database is unreachable (limit-fallback.ts). */
  private reserveFromMemory(admission: Admission): LimitsPermit {
    const { request, limits, bound, costNano, now, window, scopes, budgetPeriod, budgetLimitNano } = admission;
    const tokens = bound.total;
    const keyId = request.principal.keyId;
    const found = this.fallback.reserve({
      windows: scopes.map(({ ref, limits: l }) => ({ ...ref, tokens, rpm: l.rpm, tpm: l.tpm })),
      budget: budgetPeriod === null ? null : { keyId, period: budgetPeriod.id, amountNano: costNano, limitNano: budgetLimitNano, now },
    });
    if ("refused" in found) {
      if (found.refused === "budget_unknown") throw found.fault;
      const retryAfterSeconds = Math.max(1, Math.ceil((window.endsAt - now) / 1000));
      if (found.refused === "budget") {
        throw budgetRefusal({ keyName: request.principal.name, limits, period: budgetPeriod!, seen: null, costNano, now, headers: {} });
      }
      const scope = scopes[found.index]!;
      const byRequests = scope.limits.rpm !== null && found.use.requests + 1 > scope.limits.rpm;
      const what = byRequests
        ? `requests per minute: limit ${scope.limits.rpm}`
        : `tokens per minute: limit ${scope.limits.tpm}, this request may use up to ${tokens}`;
      throw new TooManyRequestsError(
        `Rate limit reached ${labelOf(scope)} on ${what} (counted by this server while the database cannot be reached). Retry after ${retryAfterSeconds} s, when this minute's window ends (${new Date(window.endsAt).toISOString()}).`,
        { code: "rate_limit_exceeded", type: byRequests ? "requests" : "tokens", retryAfterSeconds },
      );
    }
    return this.permit(
      {
        request,
        reservedTokens: tokens,
        scopes,
        budget: budgetPeriod === null ? null : { keyId, period: budgetPeriod.id, reservedNano: costNano },
        fromMemory: true,
      },
      rateHeaders(scopes, found.windows, now, window.endsAt),
      this.outputCap(request, limits, scopes, bound),
    );
  }

  private async reserve(admission: Admission, reserved: Array<{ scope: RateScope; use: WindowUse }>, undoWindows: () => Promise<void>): Promise<LimitsPermit> {
    const { request, limits, bound, costNano, now, window, scopes } = admission;
    const tokens = bound.total;
    const keyName = request.principal.name;
    for (const scope of scopes) {
      const { rpm, tpm } = scope.limits;
      if (tpm !== null && tokens > tpm) {
        await undoWindows();
        throw new TooManyRequestsError(
          `This request may use up to ${tokens} tokens (a prompt of up to ${bound.prompt} and up to ${bound.output} of output), more than the ${tpm} tokens per minute ${labelOf(scope)} allows, so it can never be admitted. Lower max_tokens or shorten the prompt, or ask an administrator to raise the tpm limit ('llmgw ctl key update ${keyName} --tpm N').`,
          {
            code: "rate_limit_exceeded",
            type: "tokens",
            headers: { ...(await this.refusalHeaders(scopes, reserved, tokens, now, window.endsAt)), "x-should-retry": "false" },
          },
        );
      }
      const use = await this.limitStore.reserveWindow({ ...scope.ref, tokens, rpm, tpm });
      if (use === null) {
        await undoWindows();
        const seen = await this.limitStore.windowUse(scope.ref).catch(() => null);
        const byRequests = rpm !== null && (seen === null ? tpm === null || tokens <= tpm : seen.requests + 1 > rpm);
        const retryAfterSeconds = Math.max(1, Math.ceil((window.endsAt - now) / 1000));
        const what = byRequests
          ? `requests per minute: limit ${rpm}${seen === null ? "" : `, used ${seen.requests}`}`
          : `tokens per minute: limit ${tpm}${seen === null ? "" : `, used ${seen.tokens}`}, this request may use up to ${tokens}`;
        throw new TooManyRequestsError(
          `Rate limit reached ${labelOf(scope)} on ${what}. Retry after ${retryAfterSeconds} s, when this minute's window ends (${new Date(window.endsAt).toISOString()}).`,
          {
            code: "rate_limit_exceeded",
            type: byRequests ? "requests" : "tokens",
            retryAfterSeconds,
            headers: await this.refusalHeaders(scopes, reserved, tokens, now, window.endsAt, seen === null ? undefined : { scope, use: seen }),
          },
        );
      }
      this.fallback.sawWindow(scope.ref, use);
      reserved.push({ scope, use });
    }
    const headers = rateHeaders(
      reserved.map(({ scope }) => scope),
      reserved.map(({ use }) => use),
      now,
      window.endsAt,
    );
    let budget: Held["budget"] = null;
    const { budgetPeriod: period, budgetLimitNano: limitNano } = admission;
    if (period !== null) {
      const keyId = request.principal.keyId;
      const use = costNano > limitNano ? null : await this.limitStore.reserveBudget({ keyId, period: period.id, amountNano: costNano, limitNano, now });
      if (use === null) {
        await undoWindows();
        const seen = await this.limitStore.budgetUse(keyId, period.id).catch(() => null);
        // Spent, not merely busy: what was spent leaves no room for this request even with
        // nothing else in flight (a refusal caused by other requests' reservations passes),
        // and the request would fit a fresh budget (one dearer than the whole budget says
        // nothing about what is left).
        if (seen !== null && seen.spentNano + costNano > limitNano && costNano <= limitNano) {
          this.options.onBudgetRefused?.({
            keyId,
            keyName,
            period: period.id,
            limitUsd: limits.budgetUsd ?? 0,
            spentUsd: nanoToUsd(seen.spentNano),
            requestUsd: nanoToUsd(costNano),
            resetsAt: period.resetsAt,
          });
        }
        throw budgetRefusal({ keyName, limits, period, seen, costNano, now, headers: await this.refusalHeaders(scopes, reserved, tokens, now, window.endsAt) });
      }
      this.fallback.sawBudget(keyId, period.id, use);
      budget = { keyId, period: period.id, reservedNano: costNano };
    }
    return this.permit(
      { request, reservedTokens: tokens, scopes: reserved.map(({ scope }) => scope), budget },
      headers,
      this.outputCap(request, limits, scopes, bound),
    );
  }

  /** The output the upstream may generate: capped where the reservation is what holds the line (a budget or a tpm). */
  private outputCap(request: PolicyRequest, limits: KeyLimits, scopes: readonly RateScope[], bound: TokenBound): number | null {
    const capsOutput = request.endpoint !== "/v1/embeddings" && (limits.budgetUsd !== null || scopes.some(({ limits: l }) => l.tpm !== null));
    return capsOutput ? bound.output : null;
  }

  /**
   * The x-ratelimit-* headers of a refusal: every scope of the request, as the windows are
   * once this request was undone (a window it had counted in shows its count less this
   * request). A scope whose count cannot be read is left out rather than failing the refusal.
   */
  private async refusalHeaders(
    scopes: readonly RateScope[],
    reserved: ReadonlyArray<{ scope: RateScope; use: WindowUse }>,
    tokens: number,
    now: number,
    endsAt: number,
    refused?: { scope: RateScope; use: WindowUse },
  ): Promise<Record<string, string>> {
    const counted: Array<{ scope: RateScope; use: WindowUse }> = [];
    for (const scope of scopes) {
      const mine = reserved.find((r) => r.scope === scope);
      if (mine !== undefined) counted.push({ scope, use: { requests: mine.use.requests - 1, tokens: mine.use.tokens - tokens } });
      else if (refused?.scope === scope) counted.push(refused);
      else {
        const use = await this.limitStore.windowUse(scope.ref).catch(() => null);
        if (use !== null) counted.push({ scope, use });
      }
    }
    return rateHeaders(
      counted.map(({ scope }) => scope),
      counted.map(({ use }) => use),
      now,
      endsAt,
    );
  }

  private permit(held: Held, headers: Record<string, string>, maxOutputTokens: number | null): LimitsPermit {
    let settled = false;
    return {
      headers,
      maxOutputTokens,
      settle: ({ usage, answered }) => {
        if (settled) return;
        settled = true;
        try {
          this.settle(held, usage, answered);
        } catch (error) {
          this.options.logger.warn(
            { err: error, key: held.request.principal.name },
            "a budget or rate-limit settlement could not be queued; the reservation stays counted",
          );
        }
      },
    };
  }

  /** Queues what a request used in place of what it reserved (written by flushSettlements). */
  private settle(held: Held, usage: TokenUsage | null, answered: boolean): void {
    // No usage and no answer: nothing ran, nothing is owed. Answered without counts: the
    // reservation is the best bound there is, so it stands.
    const tokens = usage !== null ? usage.prompt_tokens + usage.completion_tokens : answered ? held.reservedTokens : 0;
    const chargedNano =
      held.budget === null ? 0 : usage !== null ? usdToNano(costUsd(held.request.model.definition.prices, usage)) : answered ? held.budget.reservedNano : 0;
    if (held.fromMemory === true) {
      // Never counted in the database: the whole request is added there, and memory corrected to what it used.
      for (const scope of held.scopes) this.settlements.window(scope.ref, tokens, 1);
      if (held.budget !== null) this.settlements.budget({ ...held.budget, reservedNano: 0 }, chargedNano);
      this.fallback.adjust({
        windows: held.scopes.map((scope) => scope.ref),
        tokens: tokens - held.reservedTokens,
        budget: held.budget === null ? null : { keyId: held.budget.keyId, period: held.budget.period, nano: chargedNano - held.budget.reservedNano },
      });
      return;
    }
    for (const scope of held.scopes) this.settlements.window(scope.ref, tokens - held.reservedTokens);
    if (held.budget === null) return;
    if (chargedNano > held.budget.reservedNano) {
      // The bound is an upper bound for text and the upstream's max_tokens is capped, so
      // this means a replica counted more than it can have (or media the context length did
      // not cap). The key pays what it used, even past its budget; the log says so.
      this.options.logger.warn(
        { key: held.request.principal.name, model: held.request.model.name, usage, reserved_usd: nanoToUsd(held.budget.reservedNano) },
        "a request cost more than its reservation; the budget is charged what it used",
      );
    }
    this.settlements.budget(held.budget, chargedNano);
  }

  /** Writes the queued settlements now (limit-settlements.ts); what fails is tried again with backoff. */
  flushSettlements(): Promise<void> {
    return this.settlements.flush();
  }

  /** Writes the settlements still queued, then closes the store side. */
  async close(): Promise<void> {
    this.fallback.close();
    await this.settlements.close();
    this.limitStore.close();
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
    const rate =
      key.rpm === null && key.tpm === null
        ? null
        : { ...(await rateUse(WHOLE_KEY, { rpm: key.rpm, tpm: key.tpm })), window_start: window.start, resets_at: new Date(window.endsAt).toISOString() };
    return { budget, rate, models };
  }

  /**
   * Spend in the current budget period of every live key with a budget (metrics, at scrape
   * time): revoked and expired keys are left out, and only current periods are read. Names
   * are not unique (a rotated key keeps its name), so each entry carries the key's prefix too.
   */
  async spentByKey(): Promise<
    Array<{
      id: string;
      key: string;
      prefix: string;
      spent_usd: number;
      reserved_usd: number;
      limit_usd: number;
      period: BudgetPeriod;
      period_id: string;
      resets_at: number | null;
    }>
  > {
    const now = this.clock();
    const nowIso = new Date(now).toISOString();
    const keys = await this.options.store.db
      .selectFrom("api_keys")
      .select(["id", "name", "prefix", "budget_usd", "budget_period"])
      .where("budget_usd", "is not", null)
      .where("revoked_at", "is", null)
      .where((eb) => eb.or([eb("expires_at", "is", null), eb("expires_at", ">", nowIso)]))
      .orderBy("name")
      .orderBy("prefix")
      .execute();
    const periodAtOf = new Map(keys.map((key) => [key.id, budgetPeriodAt((key.budget_period ?? "total") as BudgetPeriod, now)]));
    const periodOf = new Map([...periodAtOf].map(([id, period]) => [id, period.id]));
    const rows = await this.limitStore.budgetRows([...periodOf.keys()], [...new Set(periodOf.values())]);
    const current = new Map<string, BudgetUse>();
    for (const row of rows) if (periodOf.get(row.keyId) === row.period) current.set(row.keyId, row);
    return keys.map((key) => {
      const row = current.get(key.id);
      return {
        id: key.id,
        key: key.name,
        prefix: key.prefix,
        spent_usd: nanoToUsd(row?.spentNano ?? 0),
        reserved_usd: nanoToUsd(row?.reservedNano ?? 0),
        limit_usd: Number(key.budget_usd),
        period: (key.budget_period ?? "total") as BudgetPeriod,
        period_id: periodAtOf.get(key.id)!.id,
        resets_at: periodAtOf.get(key.id)!.resetsAt,
      };
    });
  }
}

/**
 * The usage a request's bound could cost the most: prompt and output each at most their
 * bound, both together at most the total (the context length). The dearer kind fills first.
 */
export function worstCaseUsage(bound: TokenBound, prices: Prices | undefined): TokenUsage {
  const outputFirst = prices === undefined || prices.output_per_million >= prices.input_per_million;
  if (outputFirst) {
    const completion = Math.min(bound.output, bound.total);
    return { prompt_tokens: Math.min(bound.prompt, bound.total - completion), completion_tokens: completion };
  }
  const prompt = Math.min(bound.prompt, bound.total);
  return { prompt_tokens: prompt, completion_tokens: Math.min(bound.output, bound.total - prompt) };
}

function budgetRefusal(options: {
  keyName: string;
  limits: KeyLimits;
  period: ReturnType<typeof budgetPeriodAt>;
  /** null: the use could not be read (the refusal still goes out). */
  seen: BudgetUse | null;
  costNano: number;
  now: number;
  headers: Record<string, string>;
}): TooManyRequestsError {
  const { keyName, limits, period, seen, costNano, now } = options;
  const periodText = limits.budgetPeriod === "total" ? "in total" : limits.budgetPeriod === "day" ? `for ${period.id} (UTC)` : `for ${period.id} (UTC month)`;
  const where =
    (seen === null
      ? `The key '${keyName}' has no room left in its ${usd(limits.budgetUsd ?? 0)} budget ${periodText}`
      : `The key '${keyName}' has spent ${usd(nanoToUsd(seen.spentNano))} of its ${usd(limits.budgetUsd ?? 0)} budget ${periodText}`) +
    (seen !== null && seen.reservedNano > 0 ? `, and requests in flight hold ${usd(nanoToUsd(seen.reservedNano))}` : "") +
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
    // The SDKs retry 429s on their own; waiting a few seconds does not refill a budget.
    headers: { ...options.headers, "x-should-retry": "false" },
    ...(period.resetsAt === null ? {} : { retryAfterSeconds: Math.max(1, Math.ceil((period.resetsAt - now) / 1000)) }),
  });
}

function usd(amount: number): string {
  return `$${Number(amount.toFixed(amount >= 1 ? 2 : 6))}`;
}
