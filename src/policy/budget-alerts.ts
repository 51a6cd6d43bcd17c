// Budget events: `budget_threshold` when a key's spend in its current period reaches a
// share of its budget (80% by default), `budget_exhausted` when it reaches the budget or
// what was spent leaves no room for a request that a fresh budget would take (a refusal
// caused only by other requests in flight is not one: see LimitsService), and `budget_exceeded`
// when the spend went past the budget (an upstream that generated more than the output it
// was asked for is charged in full), saying by how much. Each is recorded once per
// key and period: what was announced is remembered, and read back from the events table
// at start, so a restart does not announce again. Spend is read every `intervalMs` (one
// query over keys with a budget), off the request path; refusals arrive at once.
import type { Logger } from "../core/log.ts";
import { describeError } from "../core/errors.ts";
import type { EventLog, NewEvent } from "../events/event-log.ts";
import type { Store } from "../store/store.ts";
import type { BudgetRefused } from "./limits.ts";

export const DEFAULT_BUDGET_ALERT_SHARE = 0.8;
const DEFAULT_INTERVAL_MS = 5_000;

export interface KeySpend {
  id: string;
  key: string;
  prefix: string;
  spent_usd: number;
  limit_usd: number;
  period: string;
  period_id: string;
  resets_at: number | null;
  /** Set when a refused request is what showed the budget spent: what it could have cost. */
  refused_usd?: number;
}

export interface BudgetAlertsOptions {
  store: Store;
  events: EventLog;
  logger: Logger;
  /** Spend of every live key with a budget, in its current period (LimitsService.spentByKey). */
  spent: () => Promise<readonly KeySpend[]>;
  /** The share of a budget that is announced as nearly spent (0 < share < 1). */
  share?: number;
  intervalMs?: number;
  clock?: () => number;
}

type Alert = "budget_threshold" | "budget_exhausted" | "budget_exceeded";

export class BudgetAlerts {
  private readonly announced = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private checking: Promise<void> | null = null;
  /** Refusals being announced: stop() waits for them, so none writes after the store closes. */
  private readonly pending = new Set<Promise<unknown>>();
  private stopped = false;
  private readonly share: number;

  constructor(private readonly options: BudgetAlertsOptions) {
    this.share = options.share ?? DEFAULT_BUDGET_ALERT_SHARE;
  }

  async start(): Promise<void> {
    // Started again when a server leads again after standing by.
    this.stopped = false;
    // What earlier runs announced in periods that may still be current (a month at most, or a total budget's one).
    const since = new Date((this.options.clock ?? Date.now)() - 32 * 86_400_000).toISOString();
    for (const event of await this.options.events.list({ kinds: ["budget_threshold", "budget_exhausted", "budget_exceeded"], since, limit: 1000 })) {
      const { key_id: keyId, period } = event.data;
      if (typeof keyId === "string" && typeof period === "string") this.announced.add(`${event.kind}\n${keyId}\n${period}`);
    }
    const interval = this.options.intervalMs ?? DEFAULT_INTERVAL_MS;
    this.timer = setInterval(() => void this.checkNow(), interval);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    await this.checking;
    await Promise.allSettled([...this.pending]);
  }

  /** Reads every budget's spend and announces what crossed a line. */
  checkNow(): Promise<void> {
    if (this.stopped) return Promise.resolve();
    this.checking ??= (async () => {
      try {
        for (const spend of await this.options.spent()) {
          if (spend.limit_usd <= 0) continue;
          const used = spend.spent_usd / spend.limit_usd;
          if (used > 1) await this.announce("budget_exceeded", spend);
          if (used >= 1) await this.announce("budget_exhausted", spend);
          else if (used >= this.share) await this.announce("budget_threshold", spend);
        }
      } catch (error) {
        this.options.logger.warn({ err: describeError(error) }, "could not read budgets' spending for budget events");
      } finally {
        this.checking = null;
      }
    })();
    return this.checking;
  }

  /** LimitsService's hook: the budget had no room for a request. */
  refused(refusal: BudgetRefused): void {
    // A client that keeps sending on a spent key costs no query per refusal.
    const over = refusal.spentUsd > refusal.limitUsd;
    const told = (kind: Alert) => this.announced.has(`${kind}\n${refusal.keyId}\n${refusal.period}`);
    if (told("budget_exhausted") && (!over || told("budget_exceeded"))) return;
    // A refusal counts as spent only once the spend is past the alert share: a request whose
    // worst case does not fit a half-used budget says that request is large, not that the
    // budget is gone (and announcing it would hide the real exhaustion later in the period).
    // The periodic check still sees the spend; a flood of refusals adds no reads here.
    if (refusal.limitUsd <= 0 || refusal.spentUsd / refusal.limitUsd < this.share) return;
    const work = (async () => {
      const row = await this.options.store.db.selectFrom("api_keys").select(["prefix", "budget_period"]).where("id", "=", refusal.keyId).executeTakeFirst();
      const spend: KeySpend = {
        id: refusal.keyId,
        key: refusal.keyName,
        prefix: row?.prefix ?? "",
        spent_usd: refusal.spentUsd,
        limit_usd: refusal.limitUsd,
        period: row?.budget_period ?? "total",
        period_id: refusal.period,
        resets_at: refusal.resetsAt,
        refused_usd: refusal.requestUsd,
      };
      if (over) await this.announce("budget_exceeded", spend);
      await this.announce("budget_exhausted", spend);
    })().catch((error: unknown) => this.options.logger.warn({ err: describeError(error) }, "could not record a budget event"));
    this.pending.add(work);
    void work.finally(() => this.pending.delete(work));
  }

  private async announce(kind: Alert, spend: KeySpend): Promise<void> {
    const id = `${kind}\n${spend.id}\n${spend.period_id}`;
    if (this.announced.has(id)) return;
    // Once the budget is spent, "nearly spent" is old news.
    if (kind === "budget_threshold" && this.announced.has(`budget_exhausted\n${spend.id}\n${spend.period_id}`)) return;
    this.announced.add(id);
    if ((await this.options.events.record(budgetEvent(kind, spend, this.share))) === null) this.announced.delete(id);
  }
}

function budgetEvent(kind: Alert, spend: KeySpend, share: number): NewEvent {
  const percent = Math.floor((spend.spent_usd / spend.limit_usd) * 100);
  const periodText =
    spend.period === "total" ? "total budget" : spend.period === "day" ? `budget for ${spend.period_id} (UTC)` : `budget for ${spend.period_id} (UTC month)`;
  const resets = spend.resets_at === null ? "It does not reset" : `It resets at ${new Date(spend.resets_at).toISOString()}`;
  const money = (usd: number) => `$${Number(usd.toFixed(usd >= 1 ? 2 : 6))}`;
  const overUsd = Math.max(0, Math.round((spend.spent_usd - spend.limit_usd) * 1e9) / 1e9);
  const message =
    kind === "budget_exceeded"
      ? `Key '${spend.key}' (${spend.prefix}) went over its ${periodText} by ${money(overUsd)}: ${money(spend.spent_usd)} spent of ${money(spend.limit_usd)} when this was recorded. Requests are charged what they used: an upstream that answered past the output it was asked for (max_tokens) without a stream to cut, requests admitted together before one of them went over, or a budget lowered below the spend. Its requests are refused until the spend is back under the budget. ${resets}; raise it with 'llmgw ctl key update ${spend.key} --budget USD'.`
      : kind === "budget_exhausted"
        ? `Key '${spend.key}' (${spend.prefix}) has spent its ${periodText}: ${money(spend.spent_usd)} of ${money(spend.limit_usd)}${spend.refused_usd === undefined ? "" : `, no room for a request of up to ${money(spend.refused_usd)}`}; its requests are refused. ${resets}; raise it with 'llmgw ctl key update ${spend.key} --budget USD'.`
        : `Key '${spend.key}' (${spend.prefix}) has spent ${percent}% of its ${periodText} (${money(spend.spent_usd)} of ${money(spend.limit_usd)}; alert at ${Math.round(share * 100)}%). ${resets}.`;
  return {
    kind,
    subject: `key:${spend.key}`,
    data: {
      key: spend.key,
      key_prefix: spend.prefix,
      key_id: spend.id,
      period: spend.period_id,
      budget_period: spend.period,
      spent_usd: spend.spent_usd,
      limit_usd: spend.limit_usd,
      ...(kind === "budget_exceeded" ? { over_usd: overUsd } : {}),
      resets_at: spend.resets_at === null ? null : new Date(spend.resets_at).toISOString(),
    },
    message,
  };
}
