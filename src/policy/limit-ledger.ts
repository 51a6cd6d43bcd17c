// The SQLite side of budgets and rate limits: the counters live in this process's memory
// and are written behind to SQLite. A SQLite database belongs to exactly one llmgw server
// (the data dir lock, and server.ts's lock on the directory of a --database file), so the
// event loop is the lock: a check and its update run with no await between them, which is
// as atomic as the conditional upserts PostgreSQL needs for several servers.
//
// A row (key_budgets per key and period, key_rate_windows per key, model and minute) is
// loaded from SQLite on first use, synchronously (better-sqlite3). Reservations, undos and
// settlements change memory at once, so reads (`ctl key show`, GET /api/v1/keys/:ref,
// metrics) see the truth, spent plus reserved. What must survive a restart, the spent
// amount of a budget and the requests and tokens of a window, is written up to 100 ms later
// in one transaction (FLUSH_DELAY_MS), retried with backoff while the store refuses; a crash
// loses at most the last flush interval (usage rows wait up to a second). The interval is
// what one write costs per request: every 5 ms, a commit cost ~5 µs of each request at the
// gateway benchmark's rate; every 100 ms, a fraction of one.
//
// Reservations of budgets are not persisted: after a restart no request of the old process
// is in flight, so a stored reservation could only leak. A budget row is written with
// reserved_nano = 0, and one loaded from SQLite starts with nothing reserved. (Window
// tokens include what requests in flight reserved; a window only lives for its minute.)
//
// Memory stays bounded: once written, a window of a past minute is dropped, and so is a
// budget row with nothing reserved whose day or month has ended.
import type { Database as SqliteDatabase, Statement } from "better-sqlite3";
import { Backoff } from "../core/backoff.ts";
import type { Logger } from "../core/log.ts";
import type { BudgetUse, ReserveTogether, Reserved, SettlementChange, WindowRef, WindowUse } from "./limit-store.ts";

/** How soon changed counters are written, and how long a failed write waits at most before it is tried again. */
const FLUSH_DELAY_MS = 100;
const RETRY_FIRST_MS = 100;
const RETRY_MAX_MS = 5000;

interface BudgetRow {
  keyId: string;
  period: string;
  spentNano: number;
  reservedNano: number;
  /** ms; formatted only when written (a Date per settlement costs more than the rest of it). */
  updatedAt: number;
}

interface WindowRow extends WindowRef, WindowUse {}

interface Statements {
  readBudget: Statement;
  readWindow: Statement;
  writeAll: (budgets: readonly BudgetRow[], windows: readonly WindowRow[]) => void;
}

/** One ledger per SQLite connection, shared by every LimitStore on it (so a second one reads the same truth). */
const ledgers = new WeakMap<SqliteDatabase, LimitLedger>();

export function ledgerOf(sqlite: SqliteDatabase, logger?: Logger): LimitLedger {
  let ledger = ledgers.get(sqlite);
  if (ledger === undefined) {
    ledger = new LimitLedger(sqlite);
    ledgers.set(sqlite, ledger);
  }
  if (logger !== undefined) ledger.logger = logger;
  return ledger;
}

export class LimitLedger {
  logger: Logger | undefined;
  private readonly budgets = new Map<string, BudgetRow>();
  private readonly windows = new Map<string, WindowRow>();
  // The rows themselves, not their ids: a Set of objects hashes by identity, where an id
  // string would be built and hashed again for every reservation and settlement.
  private readonly dirtyBudgets = new Set<BudgetRow>();
  private readonly dirtyWindows = new Set<WindowRow>();
  private readonly statements: Statements;
  private timer: NodeJS.Timeout | undefined;
  private readonly retryBackoff = new Backoff({ baseMs: RETRY_FIRST_MS, maxMs: RETRY_MAX_MS });
  /** The latest minute and time a reservation was made in: what is older may be dropped once written. */
  private latestWindowStart = "";
  private latestNow = 0;
  /** The rows the last lookups found (budget and window), forgotten whenever rows are dropped. */
  private lastBudget: BudgetRow | undefined;
  private lastWindow: WindowRow | undefined;

  constructor(private readonly sqlite: SqliteDatabase) {
    const writeBudget = sqlite.prepare(
      "INSERT INTO key_budgets (key_id, period, spent_nano, reserved_nano, updated_at) VALUES (@keyId, @period, @spentNano, 0, @updatedAt) " +
        "ON CONFLICT (key_id, period) DO UPDATE SET spent_nano = excluded.spent_nano, reserved_nano = 0, updated_at = excluded.updated_at",
    );
    const writeWindow = sqlite.prepare(
      "INSERT INTO key_rate_windows (key_id, model, window_start, requests, tokens) VALUES (@keyId, @model, @windowStart, @requests, @tokens) " +
        "ON CONFLICT (key_id, model, window_start) DO UPDATE SET requests = excluded.requests, tokens = excluded.tokens",
    );
    this.statements = {
      readBudget: sqlite.prepare("SELECT spent_nano FROM key_budgets WHERE key_id = ? AND period = ?"),
      readWindow: sqlite.prepare("SELECT requests, tokens FROM key_rate_windows WHERE key_id = ? AND model = ? AND window_start = ?"),
      writeAll: sqlite.transaction((budgets: readonly BudgetRow[], windows: readonly WindowRow[]) => {
        for (const row of budgets)
          writeBudget.run({ keyId: row.keyId, period: row.period, spentNano: row.spentNano, updatedAt: new Date(row.updatedAt).toISOString() });
        for (const row of windows)
          writeWindow.run({ keyId: row.keyId, model: row.model, windowStart: row.windowStart, requests: row.requests, tokens: row.tokens });
      }),
    };
  }

  /** Every reservation of a request, all or none: null when one does not fit (nothing changed then). */
  reserveTogether(request: ReserveTogether): Reserved | null {
    const windows = request.windows.map((ref) => this.window(ref));
    const fits = request.windows.every(({ tokens, rpm, tpm }, index) => windowFits(windows[index]!, tokens, rpm, tpm));
    const budget = request.budget === null ? null : this.budget(request.budget.keyId, request.budget.period);
    if (!fits || (budget !== null && budget.spentNano + budget.reservedNano + request.budget!.amountNano > request.budget!.limitNano)) return null;
    for (const [index, { tokens, windowStart }] of request.windows.entries()) this.countWindow(windows[index]!, 1, tokens, windowStart);
    if (budget !== null) {
      budget.reservedNano += request.budget!.amountNano;
      this.noteNow(request.budget!.now);
    }
    return {
      windows: windows.map(({ requests, tokens }) => ({ requests, tokens })),
      budget: budget === null ? null : { spentNano: budget.spentNano, reservedNano: budget.reservedNano },
    };
  }

  reserveBudget(options: { keyId: string; period: string; amountNano: number; limitNano: number; now: number }): BudgetUse | null {
    const found = this.reserveTogether({ windows: [], budget: options });
    return found === null ? null : found.budget;
  }

  reserveWindow(options: WindowRef & { tokens: number; rpm: number | null; tpm: number | null }): WindowUse | null {
    const found = this.reserveTogether({ windows: [options], budget: null });
    return found === null ? null : found.windows[0]!;
  }

  /** Corrects a window by a difference: settled tokens, or an undone request. */
  adjustWindow(ref: WindowRef, requests: number, tokens: number): void {
    if (requests === 0 && tokens === 0) return;
    this.countWindow(this.window(ref), requests, tokens, ref.windowStart);
  }

  /** Applies a settlement (or a window correction) now; it is written with the next flush. */
  apply(change: SettlementChange, now: number): void {
    if (change.kind === "window") {
      this.adjustWindow(change, change.requests, change.tokens);
      return;
    }
    const row = this.budget(change.keyId, change.period);
    row.spentNano += change.spentNano;
    // Never below zero: a reservation of this process is only released once.
    row.reservedNano = Math.max(0, row.reservedNano - change.releasedNano);
    row.updatedAt = now;
    this.markDirty(this.dirtyBudgets, row);
  }

  /** A budget row as it is now, without keeping it in memory when it was not there. */
  budgetUse(keyId: string, period: string): BudgetUse {
    const row = this.budgets.get(budgetId(keyId, period));
    if (row !== undefined) return { spentNano: row.spentNano, reservedNano: row.reservedNano };
    return { spentNano: this.storedSpent(keyId, period), reservedNano: 0 };
  }

  windowUse(ref: WindowRef): WindowUse {
    const row = this.windows.get(windowId(ref));
    if (row !== undefined) return { requests: row.requests, tokens: row.tokens };
    return this.storedWindow(ref);
  }

  /** Writes every changed counter now (shutdown); false when the write failed (logged). */
  flushNow(): boolean {
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.dirtyBudgets.size === 0 && this.dirtyWindows.size === 0) return true;
    if (!this.sqlite.open) {
      this.logger?.error(
        { rows: this.dirtyBudgets.size + this.dirtyWindows.size },
        "budget and rate-limit counters could not be written: the database is closed",
      );
      this.dirtyBudgets.clear();
      this.dirtyWindows.clear();
      return false;
    }
    if (this.sqlite.inTransaction) {
      // A Kysely transaction holds the connection: writing now would join it. Soon again.
      this.schedule(FLUSH_DELAY_MS);
      return false;
    }
    const budgetRows = [...this.dirtyBudgets];
    const windowRows = [...this.dirtyWindows];
    try {
      this.statements.writeAll(budgetRows, windowRows);
    } catch (error) {
      const retryInMs = this.retryBackoff.failed();
      this.logger?.warn(
        { err: error, rows: budgetRows.length + windowRows.length, retry_in_ms: retryInMs },
        "writing budget and rate-limit settlements failed; the counters stay right in memory and the write is tried again",
      );
      this.schedule(retryInMs);
      return false;
    }
    this.retryBackoff.succeeded();
    this.dirtyBudgets.clear();
    this.dirtyWindows.clear();
    this.dropOld();
    return true;
  }

  private budget(keyId: string, period: string): BudgetRow {
    // The row the last request used, most often this one's (the same key again): found by
    // comparing two strings, without building and hashing the map's id.
    const last = this.lastBudget;
    if (last !== undefined && last.keyId === keyId && last.period === period) return last;
    const id = budgetId(keyId, period);
    let row = this.budgets.get(id);
    if (row === undefined) {
      row = { keyId, period, spentNano: this.storedSpent(keyId, period), reservedNano: 0, updatedAt: Date.now() };
      this.budgets.set(id, row);
    }
    this.lastBudget = row;
    return row;
  }

  private window(ref: WindowRef): WindowRow {
    const last = this.lastWindow;
    if (last !== undefined && last.keyId === ref.keyId && last.model === ref.model && last.windowStart === ref.windowStart) return last;
    const id = windowId(ref);
    let row = this.windows.get(id);
    if (row === undefined) {
      row = { keyId: ref.keyId, model: ref.model, windowStart: ref.windowStart, ...this.storedWindow(ref) };
      this.windows.set(id, row);
    }
    this.lastWindow = row;
    return row;
  }

  private countWindow(row: WindowRow, requests: number, tokens: number, windowStart: string): void {
    row.requests += requests;
    row.tokens += tokens;
    if (windowStart > this.latestWindowStart) this.latestWindowStart = windowStart;
    this.markDirty(this.dirtyWindows, row);
  }

  private storedSpent(keyId: string, period: string): number {
    const found = this.statements.readBudget.get(keyId, period) as { spent_nano: number } | undefined;
    return Number(found?.spent_nano ?? 0);
  }

  private storedWindow(ref: WindowRef): WindowUse {
    const found = this.statements.readWindow.get(ref.keyId, ref.model, ref.windowStart) as { requests: number; tokens: number } | undefined;
    return { requests: Number(found?.requests ?? 0), tokens: Number(found?.tokens ?? 0) };
  }

  private noteNow(now: number): void {
    if (now > this.latestNow) this.latestNow = now;
  }

  private markDirty<Row>(set: Set<Row>, row: Row): void {
    set.add(row);
    if (this.timer === undefined) this.schedule(this.retryBackoff.delayMs > 0 ? this.retryBackoff.delayMs : FLUSH_DELAY_MS);
  }

  private schedule(delayMs: number): void {
    if (this.timer !== undefined) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.flushNow();
    }, delayMs);
    this.timer.unref();
  }

  /** Drops written rows nothing will reserve in again: windows of past minutes, budgets of ended days and months with nothing reserved. */
  private dropOld(): void {
    this.lastBudget = undefined;
    this.lastWindow = undefined;
    for (const [id, row] of this.windows) if (row.windowStart < this.latestWindowStart) this.windows.delete(id);
    if (this.latestNow === 0) return;
    const now = new Date(this.latestNow).toISOString();
    const today = now.slice(0, 10);
    const thisMonth = now.slice(0, 7);
    for (const [id, row] of this.budgets) {
      if (row.reservedNano !== 0) continue;
      const ended = row.period.length === 10 ? row.period < today : row.period.length === 7 ? row.period < thisMonth : false;
      if (ended) this.budgets.delete(id);
    }
  }
}

function windowFits(row: WindowUse, tokens: number, rpm: number | null, tpm: number | null): boolean {
  return (rpm === null || row.requests + 1 <= rpm) && (tpm === null || row.tokens + tokens <= tpm);
}

function budgetId(keyId: string, period: string): string {
  return `${keyId}\n${period}`;
}

function windowId(ref: WindowRef): string {
  return `${ref.keyId}\n${ref.model}\n${ref.windowStart}`;
}
