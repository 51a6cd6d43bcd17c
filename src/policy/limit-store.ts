// The store side of budgets and rate limits: one atomic statement per reservation and one
// per settlement, the same on SQLite and PostgreSQL. A reservation is an upsert whose
// update only happens when the new total still fits the limit (INSERT ... ON CONFLICT DO
// UPDATE ... WHERE ... RETURNING): the database decides under its row lock, so requests
// in flight on one server or on many sharing PostgreSQL can never add up past a limit,
// and no counter is synced later. Nothing here reads and then writes.
//
// Budget periods are UTC: a day ('2026-12-01'), a month ('2026-12'), or the key's whole
// life ('total'). Rate limits count in fixed one-minute windows: one row per key (or key
// and model) per minute, so a reservation is a single-row upsert and the reset time the
// x-ratelimit-reset-* headers give is exact. The price of a fixed window is that a client
// may spend one window's allowance at its end and the next one's at the start of the
// next; a sliding window would need a row per request or a read of two windows.
//
// That is how PostgreSQL works. On SQLite, which one server owns, the counters live in
// memory and are written behind instead (limit-ledger.ts): the event loop is the lock, and
// a reservation costs no statement. Every method here takes that path on SQLite, so the
// limits service does not tell the two apart.
import { sql } from "kysely";
import type { Logger } from "../core/log.ts";
import type { Store } from "../store/store.ts";
import type { BudgetPeriod } from "./key-limits.ts";
import { ledgerOf, type LimitLedger } from "./limit-ledger.ts";

/** Money in the store is integer nano-USD: sums and comparisons stay exact. */
export const NANO_PER_USD = 1_000_000_000;
export const WINDOW_MS = 60_000;
/** The model column of a key-wide rate window. */
export const WHOLE_KEY = "*";
/** Old windows are deleted once they are this old (nothing reads them after their minute). */
const WINDOW_RETENTION_MS = 60 * 60_000;

export function usdToNano(usd: number): number {
  // The tolerance keeps float noise (0.1 + 0.2) from adding a nano-USD; ceil keeps an
  // upper bound an upper bound.
  return Math.max(0, Math.ceil(usd * NANO_PER_USD - 1e-6));
}

export function nanoToUsd(nano: number): number {
  return nano / NANO_PER_USD;
}

/** One budget period of a key: the row it counts in and when it ends. */
export interface BudgetPeriodAt {
  id: string;
  /** When the period began (null for total). */
  startsAt: number | null;
  /** When the next period begins (null for total: it never resets). */
  resetsAt: number | null;
}

export function budgetPeriodAt(period: BudgetPeriod, now: number): BudgetPeriodAt {
  // Every request of a day asks for the same period: work it out once (the result is shared, read-only).
  const cached = lastPeriods.get(period);
  if (cached !== undefined && (cached.startsAt === null || (now >= cached.startsAt && now < cached.resetsAt!))) return cached;
  const found = Object.freeze(periodAt(period, now));
  lastPeriods.set(period, found);
  return found;
}

const lastPeriods = new Map<BudgetPeriod, BudgetPeriodAt>();

function periodAt(period: BudgetPeriod, now: number): BudgetPeriodAt {
  const date = new Date(now);
  const year = date.getUTCFullYear();
  const month = date.getUTCMonth();
  if (period === "total") return { id: "total", startsAt: null, resetsAt: null };
  if (period === "day") {
    const startsAt = Date.UTC(year, month, date.getUTCDate());
    return { id: new Date(startsAt).toISOString().slice(0, 10), startsAt, resetsAt: Date.UTC(year, month, date.getUTCDate() + 1) };
  }
  const startsAt = Date.UTC(year, month, 1);
  return { id: new Date(startsAt).toISOString().slice(0, 7), startsAt, resetsAt: Date.UTC(year, month + 1, 1) };
}

/** The fixed one-minute window `now` falls in. */
export function windowAt(now: number): { readonly start: string; readonly endsAt: number } {
  const startMs = Math.floor(now / WINDOW_MS) * WINDOW_MS;
  // Every request of a minute asks for the same window: made and formatted once.
  if (startMs !== lastWindow.startMs) lastWindow = { startMs, window: Object.freeze({ start: new Date(startMs).toISOString(), endsAt: startMs + WINDOW_MS }) };
  return lastWindow.window;
}

let lastWindow: { startMs: number; window: { readonly start: string; readonly endsAt: number } } = { startMs: Number.NaN, window: { start: "", endsAt: 0 } };

export interface BudgetUse {
  spentNano: number;
  reservedNano: number;
}

export interface WindowUse {
  requests: number;
  tokens: number;
}

export interface WindowRef {
  keyId: string;
  /** A model name, or WHOLE_KEY. */
  model: string;
  windowStart: string;
}

/**
 * The change one flush of settlements makes to one row: summed, so a row gets one
 * statement however many requests settled in it. Requests admitted from memory while
 * PostgreSQL was unreachable (limit-fallback.ts) were never counted in the database: their
 * settlements add the requests themselves (`requests`) and release nothing, and the row
 * may not exist yet, so settlements are upserts.
 */
export type SettlementChange =
  | { kind: "budget"; keyId: string; period: string; spentNano: number; releasedNano: number }
  | { kind: "window"; keyId: string; model: string; windowStart: string; requests: number; tokens: number };

/** Every reservation of one request: its rate windows and its budget (null: none). */
export interface ReserveTogether {
  windows: ReadonlyArray<WindowRef & { tokens: number; rpm: number | null; tpm: number | null }>;
  budget: { keyId: string; period: string; amountNano: number; limitNano: number; now: number } | null;
}

/** What reserveTogether reserved: the windows after it, in order, and the budget after it. */
export interface Reserved {
  windows: WindowUse[];
  budget: BudgetUse | null;
}

export class LimitStore {
  private lastPruneAt = 0;
  /** The window the last prune check saw: the check runs once per minute, not per request. */
  private lastPruneWindow = "";
  /** SQLite: the in-memory counters, shared by every LimitStore on the connection. */
  private readonly ledger: LimitLedger | undefined;

  constructor(
    private readonly store: Store,
    logger?: Logger,
  ) {
    this.ledger = store.sqlite === undefined ? undefined : ledgerOf(store.sqlite, logger);
  }

  /** Runs a ledger step (a first use reads SQLite); a storage fault comes back named, as Kysely's do. */
  private run<T>(work: (ledger: LimitLedger) => T): T {
    try {
      return work(this.ledger!);
    } catch (error) {
      throw this.store.nameFault(error);
    }
  }

  /** SQLite: applies a settlement to the counters now (written behind) and returns true; PostgreSQL: false, the caller batches it. */
  applyNow(change: SettlementChange, now: number): boolean {
    if (this.ledger === undefined) return false;
    this.run((ledger) => ledger.apply(change, now));
    return true;
  }

  /** SQLite: writes the changed counters now (before the store closes). */
  close(): void {
    this.ledger?.flushNow();
  }

  /**
   * Adds `amountNano` to the period's reservations if spent + reserved + amount stays
   * within `limitNano`; returns the row after it, or null when it did not fit. The
   * caller checks amount <= limit first (a fresh row is inserted without a condition).
   */
  async reserveBudget(options: { keyId: string; period: string; amountNano: number; limitNano: number; now: number }): Promise<BudgetUse | null> {
    const { keyId, period, amountNano, limitNano } = options;
    const updatedAt = new Date(options.now).toISOString();
    if (this.ledger !== undefined) return this.run((ledger) => ledger.reserveBudget(options));
    const row = await this.store.db
      .insertInto("key_budgets")
      .values({ key_id: keyId, period, spent_nano: 0, reserved_nano: amountNano, updated_at: updatedAt })
      .onConflict((oc) =>
        oc
          .columns(["key_id", "period"])
          .doUpdateSet({ reserved_nano: sql`key_budgets.reserved_nano + ${amountNano}`, updated_at: updatedAt })
          .where(sql<boolean>`key_budgets.spent_nano + key_budgets.reserved_nano + ${amountNano} <= ${limitNano}`),
      )
      .returning(["spent_nano", "reserved_nano"])
      .executeTakeFirst();
    return row === undefined ? null : { spentNano: Number(row.spent_nano), reservedNano: Number(row.reserved_nano) };
  }

  /**
   * SQLite only: every reservation of a request at once, all or none, in memory (no await
   * between the checks and the updates). Returns "refused" when one does not fit (the
   * caller then reserves step by step to say which limit refused), undefined on PostgreSQL.
   * Synchronous, so the gateway admits a request on SQLite without a single await.
   */
  reserveTogether(request: ReserveTogether): Reserved | "refused" | undefined {
    if (this.ledger === undefined) return undefined;
    const reserved = this.run((ledger) => ledger.reserveTogether(request));
    const windowStart = request.windows[0]?.windowStart;
    if (windowStart !== undefined) this.pruneNow(windowStart);
    return reserved ?? "refused";
  }

  /** Replaces a reservation by what was charged (0 to undo it). */
  async settleBudget(options: { keyId: string; period: string; reservedNano: number; chargedNano: number; now: number }): Promise<void> {
    await this.settleAll(
      [{ kind: "budget", keyId: options.keyId, period: options.period, spentNano: options.chargedNano, releasedNano: options.reservedNano }],
      options.now,
    );
  }

  /**
   * Applies settlements, one statement per row. SQLite: all in one transaction (one commit
   * for the lot). PostgreSQL: each its own statement, so no row lock is held across them;
   * the returned list is what failed (all of it on SQLite, where the transaction rolled back).
   */
  async settleAll(changes: readonly SettlementChange[], now: number): Promise<{ failed: SettlementChange[]; error?: unknown }> {
    const updatedAt = new Date(now).toISOString();
    if (this.ledger !== undefined) {
      try {
        for (const change of changes) this.applyNow(change, now);
        return { failed: [] };
      } catch (error) {
        return { failed: [...changes], error };
      }
    }
    const results = await Promise.allSettled(changes.map((change) => this.settleOne(change, updatedAt)));
    const failed = changes.filter((_, index) => results[index]!.status === "rejected");
    const firstError = results.find((result): result is PromiseRejectedResult => result.status === "rejected");
    return firstError === undefined ? { failed } : { failed, error: firstError.reason };
  }

  private async settleOne(change: SettlementChange, updatedAt: string): Promise<void> {
    if (change.kind === "window") {
      // Only a request admitted from memory can find its window missing; a correction or an undo updates a row it counted in.
      if (change.requests <= 0) {
        await this.adjustWindow({
          keyId: change.keyId,
          model: change.model,
          windowStart: change.windowStart,
          requests: change.requests,
          tokens: change.tokens,
        });
        return;
      }
      await this.store.db
        .insertInto("key_rate_windows")
        .values({ key_id: change.keyId, model: change.model, window_start: change.windowStart, requests: change.requests, tokens: Math.max(0, change.tokens) })
        .onConflict((oc) =>
          oc.columns(["key_id", "model", "window_start"]).doUpdateSet({
            requests: sql`key_rate_windows.requests + ${change.requests}`,
            tokens: sql`key_rate_windows.tokens + ${change.tokens}`,
          }),
        )
        .execute();
      return;
    }
    await this.store.db
      .insertInto("key_budgets")
      .values({ key_id: change.keyId, period: change.period, spent_nano: change.spentNano, reserved_nano: 0, updated_at: updatedAt })
      .onConflict((oc) =>
        oc.columns(["key_id", "period"]).doUpdateSet({
          spent_nano: sql`key_budgets.spent_nano + ${change.spentNano}`,
          reserved_nano: sql`key_budgets.reserved_nano - ${change.releasedNano}`,
          updated_at: updatedAt,
        }),
      )
      .execute();
  }

  /** What a key spent and has reserved in a period (zeros when nothing was). For messages and `ctl key show`, never for a decision. */
  async budgetUse(keyId: string, period: string): Promise<BudgetUse> {
    if (this.ledger !== undefined) return this.run((ledger) => ledger.budgetUse(keyId, period));
    const row = await this.store.db
      .selectFrom("key_budgets")
      .select(["spent_nano", "reserved_nano"])
      .where("key_id", "=", keyId)
      .where("period", "=", period)
      .executeTakeFirst();
    return { spentNano: Number(row?.spent_nano ?? 0), reservedNano: Number(row?.reserved_nano ?? 0) };
  }

  /**
   * Budget rows of many keys in the given periods (spend per key for metrics): the caller
   * passes the current periods only, so past days and months are never read.
   */
  async budgetRows(keyIds: readonly string[], periods: readonly string[]): Promise<Array<{ keyId: string; period: string } & BudgetUse>> {
    if (keyIds.length === 0 || periods.length === 0) return [];
    if (this.ledger !== undefined) {
      // The in-memory truth for each key (the caller keeps the row of the key's own period).
      return this.run((ledger) => keyIds.flatMap((keyId) => periods.map((period) => ({ keyId, period, ...ledger.budgetUse(keyId, period) }))));
    }
    const rows = await this.store.db
      .selectFrom("key_budgets")
      .select(["key_id", "period", "spent_nano", "reserved_nano"])
      .where("key_id", "in", keyIds)
      .where("period", "in", periods)
      .execute();
    return rows.map((row) => ({ keyId: row.key_id, period: row.period, spentNano: Number(row.spent_nano), reservedNano: Number(row.reserved_nano) }));
  }

  /**
   * Counts one request and `tokens` in the window if both stay within the limits (null:
   * not limited); returns the window after it, or null when it did not fit. The caller
   * checks tokens <= tpm first.
   */
  async reserveWindow(options: WindowRef & { tokens: number; rpm: number | null; tpm: number | null }): Promise<WindowUse | null> {
    const { keyId, model, windowStart, tokens, rpm, tpm } = options;
    if (this.ledger !== undefined) {
      const found = this.run((ledger) => ledger.reserveWindow(options));
      this.pruneNow(windowStart);
      return found;
    }
    const fits = [
      ...(rpm === null ? [] : [sql`key_rate_windows.requests + 1 <= ${rpm}`]),
      ...(tpm === null ? [] : [sql`key_rate_windows.tokens + ${tokens} <= ${tpm}`]),
    ];
    const row = await this.store.db
      .insertInto("key_rate_windows")
      .values({ key_id: keyId, model, window_start: windowStart, requests: 1, tokens })
      .onConflict((oc) => {
        const update = oc.columns(["key_id", "model", "window_start"]).doUpdateSet({
          requests: sql`key_rate_windows.requests + 1`,
          tokens: sql`key_rate_windows.tokens + ${tokens}`,
        });
        return fits.length === 0 ? update : update.where(sql<boolean>`${sql.join(fits, sql` and `)}`);
      })
      .returning(["requests", "tokens"])
      .executeTakeFirst();
    this.pruneNow(options.windowStart);
    return row === undefined ? null : { requests: Number(row.requests), tokens: Number(row.tokens) };
  }

  /** Corrects a window by a difference: the settled tokens, or an undone request. */
  async adjustWindow(options: WindowRef & { requests: number; tokens: number }): Promise<void> {
    if (options.requests === 0 && options.tokens === 0) return;
    if (this.ledger !== undefined) {
      this.run((ledger) => ledger.adjustWindow(options, options.requests, options.tokens));
      return;
    }
    await this.store.db
      .updateTable("key_rate_windows")
      .set({ requests: sql`requests + ${options.requests}`, tokens: sql`tokens + ${options.tokens}` })
      .where("key_id", "=", options.keyId)
      .where("model", "=", options.model)
      .where("window_start", "=", options.windowStart)
      .execute();
  }

  /** A window's counts (zeros when empty). For messages, headers of refusals and `ctl key show`. */
  async windowUse(ref: WindowRef): Promise<WindowUse> {
    if (this.ledger !== undefined) return this.run((ledger) => ledger.windowUse(ref));
    const row = await this.store.db
      .selectFrom("key_rate_windows")
      .select(["requests", "tokens"])
      .where("key_id", "=", ref.keyId)
      .where("model", "=", ref.model)
      .where("window_start", "=", ref.windowStart)
      .executeTakeFirst();
    return { requests: Number(row?.requests ?? 0), tokens: Number(row?.tokens ?? 0) };
  }

  /** Deletes windows older than the retention, at most once per retention period per server, off the request path. */
  private pruneNow(windowStart: string): void {
    if (windowStart === this.lastPruneWindow) return;
    this.lastPruneWindow = windowStart;
    const now = Date.parse(windowStart);
    if (now - this.lastPruneAt < WINDOW_RETENTION_MS) return;
    this.lastPruneAt = now;
    const before = new Date(now - WINDOW_RETENTION_MS).toISOString();
    this.store.db
      .deleteFrom("key_rate_windows")
      .where("window_start", "<", before)
      .execute()
      .catch(() => {
        // Old rows only take room; the next prune tries again.
      });
  }
}
