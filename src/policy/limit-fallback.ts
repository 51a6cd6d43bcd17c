// Budgets and rate limits while PostgreSQL cannot be reached (limits.ts): admission goes
// on from this server's own memory instead of failing every limited request. It knows
// what the database last said of each budget period and rate window this server reserved
// in (spent plus reserved, requests and tokens), adds what it admitted since, and admits
// a request only if that still fits the limit. What these requests use is queued as
// settlements (limit-settlements.ts) that add it to the database when it answers again.
//
// A budget is only counted from a known start: a key whose budget period this server has
// not reserved in since it started (or not in the current period) is refused with 503
// storage_unavailable while the outage lasts, rather than counted from 0, which would let
// it spend its whole budget again. Rate windows start from 0 (a minute's window is gone
// within the minute anyway).
//
// Each server counts on its own while the database is away, so with one server nothing
// is overspent, and with N servers a key may get up to what each server last saw left of
// its budget (at most N times its budget in all), and up to N times its rpm and tpm in
// each minute of the outage. While the database is known to be down no request waits on
// it: a probe query about once a second says when it is back.
import type { Logger } from "../core/log.ts";
import type { Store } from "../store/store.ts";
import type { StorageUnavailableError } from "../store/storage-fault.ts";
import type { BudgetUse, ReserveTogether, WindowRef, WindowUse } from "./limit-store.ts";

/** How often a probe asks whether the database is back. */
const PROBE_INTERVAL_MS = 1000;

/** What reserving from memory found: the windows after it, or which limit refused. */
export type MemoryReservation =
  | { windows: WindowUse[]; budgetUsedNano: number | null }
  | { refused: "window"; index: number; use: WindowUse }
  | { refused: "budget"; usedNano: number }
  /** What the budget's period held is not known here: the fault to answer with (503). */
  | { refused: "budget_unknown"; fault: StorageUnavailableError };

export interface LimitFallbackOptions {
  store: Store;
  logger: Logger;
}

export class LimitFallback {
  /** Spent plus reserved per budget row (key and period), as last seen in the database plus what was admitted here since. */
  private readonly budgets = new Map<string, number>();
  /** Requests and tokens per rate window (key, model, minute), the same way; only the current minute's are kept. */
  private readonly windows = new Map<string, WindowUse>();
  private latestWindowStart = "";
  private downSince: number | null = null;
  /** The fault that started the outage: a budget not known here is refused with it. */
  private fault: StorageUnavailableError | null = null;
  private probeTimer: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(private readonly options: LimitFallbackOptions) {}

  /** Whether the database is known to be unreachable now: admission then goes to memory without trying it. */
  down(): boolean {
    return this.downSince !== null;
  }

  /** A reservation failed with a storage fault: the outage starts (logged once) and the probe watches for its end. */
  failed(fault: StorageUnavailableError): void {
    if (this.downSince !== null) return;
    this.downSince = Date.now();
    this.fault = fault;
    this.options.logger.warn(
      { err: fault.message },
      "budgets and rate limits cannot be reserved in the database: this server admits limited keys from its own counts until it answers again (each server counts on its own meanwhile; a key whose budget it has not reserved in since it started gets 503)",
    );
    this.scheduleProbe();
  }

  /** What the database answered for a budget row this server reserved in. */
  sawBudget(keyId: string, period: string, use: BudgetUse): void {
    this.budgets.set(budgetId(keyId, period), use.spentNano + use.reservedNano);
  }

  /** What the database answered for a rate window this server reserved in. */
  sawWindow(ref: WindowRef, use: WindowUse): void {
    this.noteWindowStart(ref.windowStart);
    this.windows.set(windowId(ref), { requests: use.requests, tokens: use.tokens });
  }

  /** Every reservation of a request from memory, all or none. */
  reserve(request: ReserveTogether): MemoryReservation {
    const windows = request.windows.map((ref) => {
      this.noteWindowStart(ref.windowStart);
      return this.windows.get(windowId(ref)) ?? { requests: 0, tokens: 0 };
    });
    for (const [index, { tokens, rpm, tpm }] of request.windows.entries()) {
      const use = windows[index]!;
      if ((rpm !== null && use.requests + 1 > rpm) || (tpm !== null && use.tokens + tokens > tpm)) return { refused: "window", index, use };
    }
    const budget = request.budget;
    let budgetUsedNano: number | null = null;
    if (budget !== null) {
      const used = this.budgets.get(budgetId(budget.keyId, budget.period));
      if (used === undefined) return { refused: "budget_unknown", fault: this.fault! };
      if (used + budget.amountNano > budget.limitNano) return { refused: "budget", usedNano: used };
      budgetUsedNano = used + budget.amountNano;
      this.budgets.set(budgetId(budget.keyId, budget.period), budgetUsedNano);
    }
    const after = request.windows.map((ref, index) => {
      const use = { requests: windows[index]!.requests + 1, tokens: windows[index]!.tokens + ref.tokens };
      this.windows.set(windowId(ref), use);
      return use;
    });
    return { windows: after, budgetUsedNano };
  }

  /** Corrects memory once a request admitted from it settles: what it used in place of what it reserved. */
  adjust(change: { windows: readonly WindowRef[]; tokens: number; budget: { keyId: string; period: string; nano: number } | null }): void {
    for (const ref of change.windows) {
      const use = this.windows.get(windowId(ref));
      if (use !== undefined) use.tokens += change.tokens;
    }
    if (change.budget !== null) {
      const id = budgetId(change.budget.keyId, change.budget.period);
      const used = this.budgets.get(id);
      if (used !== undefined) this.budgets.set(id, Math.max(0, used + change.budget.nano));
    }
  }

  close(): void {
    this.closed = true;
    if (this.probeTimer !== undefined) clearTimeout(this.probeTimer);
    this.probeTimer = undefined;
  }

  /** Windows of past minutes are never reserved in again: only the current minute's are kept. */
  private noteWindowStart(windowStart: string): void {
    if (windowStart <= this.latestWindowStart) return;
    this.latestWindowStart = windowStart;
    for (const id of this.windows.keys()) if (!id.endsWith(`\n${windowStart}`)) this.windows.delete(id);
  }

  private scheduleProbe(): void {
    if (this.closed || this.probeTimer !== undefined) return;
    this.probeTimer = setTimeout(() => {
      this.probeTimer = undefined;
      void this.probe();
    }, PROBE_INTERVAL_MS);
    this.probeTimer.unref();
  }

  /** One cheap query: if it works the database is back, and admission uses it again. */
  private async probe(): Promise<void> {
    try {
      await this.options.store.db.selectFrom("key_budgets").select("key_id").limit(1).execute();
    } catch {
      this.scheduleProbe();
      return;
    }
    const seconds = this.downSince === null ? 0 : Math.round((Date.now() - this.downSince) / 1000);
    this.downSince = null;
    this.options.logger.info(
      { outage_s: seconds },
      `budgets and rate limits are reserved in the database again, after ${seconds} s on this server's own counts; their use is written now`,
    );
  }
}

function budgetId(keyId: string, period: string): string {
  return `${keyId}\n${period}`;
}

function windowId(ref: WindowRef): string {
  return `${ref.keyId}\n${ref.model}\n${ref.windowStart}`;
}
