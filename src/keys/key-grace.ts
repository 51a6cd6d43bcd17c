// The key service's view of a database outage (key-service.ts): whether key reads are
// failing now, the one log line at its start and at its end, and the background re-check
// of cached keys that runs at most once a second while it lasts. Requests never wait on
// a database known to be down: graced keys are served from memory and re-checked here;
// other keys are asked of the store, whose outage gate answers 503 storage_unavailable at
// once while it is down and lets them through as soon as it is back.
import type { Logger } from "../core/log.ts";
import { StorageUnavailableError } from "../store/storage-fault.ts";

/** --key-grace's default: keys read from the database within this long keep working while it is down. */
export const DEFAULT_KEY_GRACE_MS = 10 * 60_000;
/** Re-checks of cached keys while the database fails: about once a second, never more often. */
const RECHECK_INTERVAL_MS = 1000;
/** Rows asked for in one query of a re-check (a bounded IN list). */
const RECHECK_BATCH = 500;

export interface KeyOutageOptions {
  keyGraceMs: number;
  logger?: Logger;
  /** Reads the given keys' rows again; throws what the store threw (a StorageUnavailableError while it is down). */
  recheck: (hashes: readonly string[]) => Promise<void>;
}

export class KeyOutage {
  /** The fault that started the outage being lived through, null while key reads work. */
  private current: { fault: StorageUnavailableError; since: number } | null = null;
  private readonly wanted = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private running = false;
  private lastRunAt = Number.NEGATIVE_INFINITY;

  constructor(private readonly options: KeyOutageOptions) {}

  /** Whether key reads are known to fail now. */
  active(): boolean {
    return this.current !== null;
  }

  /** Whether a background re-check is asked for or running. */
  pending(): boolean {
    return this.wanted.size > 0 || this.running || this.timer !== undefined;
  }

  /** A key read failed with a storage fault: the outage starts (logged once) or goes on. */
  failed(fault: StorageUnavailableError): void {
    if (this.current !== null) return;
    this.current = { fault, since: Date.now() };
    const grace = this.options.keyGraceMs;
    this.options.logger?.warn(
      { err: fault.message, key_grace_s: Math.round(grace / 1000) },
      grace > 0
        ? `API keys cannot be checked against the database: keys read within the last ${describeMs(grace)} keep working from memory, other keys get 503 storage_unavailable until it answers again`
        : "API keys cannot be checked against the database: requests get 503 storage_unavailable until it answers again (--key-grace is 0)",
    );
  }

  /** A key read worked: an outage being lived through is over (logged once). */
  answered(): void {
    if (this.current === null) return;
    const seconds = Math.round((Date.now() - this.current.since) / 1000);
    this.current = null;
    this.options.logger?.info({ outage_s: seconds }, `API keys are checked against the database again, after ${seconds} s without it`);
  }

  /**
   * Asks for these keys to be read again in the background: together, at most once a
   * second, and again after each failure until the database answers.
   */
  recheckSoon(hashes: Iterable<string>): void {
    for (const hash of hashes) this.wanted.add(hash);
    if (this.wanted.size === 0 || this.timer !== undefined || this.running) return;
    const waitMs = Math.max(0, this.lastRunAt + RECHECK_INTERVAL_MS - Date.now());
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.run();
    }, waitMs);
    this.timer.unref();
  }

  private async run(): Promise<void> {
    this.running = true;
    this.lastRunAt = Date.now();
    const hashes = [...this.wanted].slice(0, RECHECK_BATCH);
    for (const hash of hashes) this.wanted.delete(hash);
    try {
      await this.options.recheck(hashes);
      this.answered();
    } catch (error) {
      if (error instanceof StorageUnavailableError) {
        this.failed(error);
        // Still down: these keys are read again on the next round, which is also what notices the database is back.
        for (const hash of hashes) this.wanted.add(hash);
      }
      // Anything else (the store closed, a bug) ends this round; a later request asks again.
    } finally {
      this.running = false;
    }
    this.recheckSoon([]);
  }
}

function describeMs(ms: number): string {
  if (ms % 60_000 === 0) return `${ms / 60_000} min`;
  return `${Math.round(ms / 1000)} s`;
}
