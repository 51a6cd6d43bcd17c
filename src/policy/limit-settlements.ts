// The settlements of budget and rate-limit permits (limits.ts) on their way to the store.
// A settlement turns a request's reservation into what it actually used: on SQLite it is
// applied to the in-memory counters at once (LimitStore.applyNow, limit-ledger.ts); on
// PostgreSQL it is queued here, summed per row (budget period or rate window), and written
// a few ms after the first one is queued, one statement per row.
//
// A settlement only gives back part of a reservation (or adds what a request used beyond
// it), so writing it a few ms late holds a reservation a few ms longer than needed:
// conservative, never lets a request past a limit. A write that fails stays queued and is
// tried again with backoff, so a store hiccup does not leak reservations for good.
import { Backoff } from "../core/backoff.ts";
import type { Logger } from "../core/log.ts";
import type { LimitStore, SettlementChange, WindowRef } from "./limit-store.ts";

/** The budget a permit reserved, which its settlement gives back. */
export interface ReservedBudget {
  keyId: string;
  period: string;
  reservedNano: number;
}

export interface SettlementQueueOptions {
  limitStore: LimitStore;
  logger: Logger;
  clock: () => number;
}

/** How soon queued settlements are written, and how long a failed write waits at most before it is tried again. */
const SETTLE_DELAY_MS = 5;
const RETRY_FIRST_MS = 100;
const RETRY_MAX_MS = 5000;

export class SettlementQueue {
  /** Settlements not yet written, summed per row, by the row's id. */
  private pending = new Map<string, SettlementChange>();
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> = Promise.resolve();
  private readonly retryBackoff = new Backoff({ baseMs: RETRY_FIRST_MS, maxMs: RETRY_MAX_MS });

  constructor(private readonly options: SettlementQueueOptions) {}

  /**
   * Adds `tokens` (negative: gives them back) to a rate window's count, and `requests`:
   * 1 for a request admitted from memory (never counted in the database), -1 to undo one.
   */
  window(ref: WindowRef, tokens: number, requests = 0): void {
    if (tokens === 0 && requests === 0) return;
    if (
      this.options.limitStore.applyNow(
        { kind: "window", keyId: ref.keyId, model: ref.model, windowStart: ref.windowStart, requests, tokens },
        this.options.clock(),
      )
    )
      return;
    const id = `w\n${ref.keyId}\n${ref.model}\n${ref.windowStart}`;
    const change = this.pending.get(id);
    if (change?.kind === "window") {
      change.tokens += tokens;
      change.requests += requests;
    } else this.pending.set(id, { kind: "window", keyId: ref.keyId, model: ref.model, windowStart: ref.windowStart, requests, tokens });
    this.scheduleFlush();
  }

  /** Releases a budget reservation and charges `chargedNano` in its place. */
  budget(budget: ReservedBudget, chargedNano: number): void {
    if (
      this.options.limitStore.applyNow(
        { kind: "budget", keyId: budget.keyId, period: budget.period, spentNano: chargedNano, releasedNano: budget.reservedNano },
        this.options.clock(),
      )
    )
      return;
    const id = `b\n${budget.keyId}\n${budget.period}`;
    const change = this.pending.get(id);
    if (change?.kind === "budget") {
      change.spentNano += chargedNano;
      change.releasedNano += budget.reservedNano;
    } else this.pending.set(id, { kind: "budget", keyId: budget.keyId, period: budget.period, spentNano: chargedNano, releasedNano: budget.reservedNano });
    this.scheduleFlush();
  }

  private scheduleFlush(): void {
    if (this.timer !== undefined) return;
    this.timer = setTimeout(() => void this.flush(), this.retryBackoff.delayMs > 0 ? this.retryBackoff.delayMs : SETTLE_DELAY_MS);
    this.timer.unref();
  }

  /** Writes the queued settlements; what fails goes back in the queue, tried again with backoff. */
  flush(): Promise<void> {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    this.writing = this.writing.then(async () => {
      if (this.pending.size === 0) return;
      const batch = this.pending;
      this.pending = new Map();
      const { failed, error } = await this.options.limitStore.settleAll([...batch.values()], this.options.clock());
      if (failed.length === 0) {
        this.retryBackoff.succeeded();
        return;
      }
      // Put the failures back, merged with what was queued meanwhile (the sums add up).
      for (const change of failed) {
        if (change.kind === "window") this.requeueWindow(change);
        else this.requeueBudget(change);
      }
      const retryInMs = this.retryBackoff.failed();
      this.options.logger.warn(
        { err: error, settlements: failed.length, retry_in_ms: retryInMs },
        "writing budget or rate-limit settlements failed; the reservations stay counted until a retry succeeds",
      );
      if (this.timer !== undefined) clearTimeout(this.timer);
      this.timer = undefined;
      this.scheduleFlush();
    });
    return this.writing;
  }

  private requeueWindow(change: Extract<SettlementChange, { kind: "window" }>): void {
    this.window({ keyId: change.keyId, model: change.model, windowStart: change.windowStart }, change.tokens, change.requests);
  }

  private requeueBudget(change: Extract<SettlementChange, { kind: "budget" }>): void {
    this.budget({ keyId: change.keyId, period: change.period, reservedNano: change.releasedNano }, change.spentNano);
  }

  /** Writes the settlements still queued (before the store closes); one more try for any that failed, then they are logged as lost. */
  async close(): Promise<void> {
    await this.flush();
    if (this.pending.size > 0) {
      this.retryBackoff.succeeded();
      await this.flush();
    }
    if (this.timer !== undefined) clearTimeout(this.timer);
    this.timer = undefined;
    if (this.pending.size > 0) {
      this.options.logger.error(
        { settlements: this.pending.size },
        "budget or rate-limit settlements could not be written before shutdown; those reservations stay counted",
      );
      this.pending.clear();
    }
  }
}
