// How long to wait before trying something again after it failed: the one exponential
// backoff of llmgw (the Hub client, mirror downloads, the notifier, the limits' and the
// ledger's store writes, the node agent's polling). Each wait doubles from `baseMs` up to
// `maxMs`; optional jitter spreads the retries of many callers that failed at the same
// moment (one receiver, one server restart) so they do not come back in step.

export interface BackoffPolicy {
  /** The wait after the first failure, in ms. */
  baseMs: number;
  /** No wait is longer than this, in ms. */
  maxMs: number;
  /** Each wait is moved at random by up to this fraction either way (0.2: ±20%); none when absent. */
  jitter?: number;
  /** A number in [0, 1), for the jitter; Math.random unless a test fixes it. */
  random?: () => number;
}

/**
 * The exponent stops growing here: 2 ** 40 times any sensible base is past every cap, and
 * a bounded exponent keeps `0 * 2 ** n` from becoming NaN for a failure count in the
 * thousands (a delivery retried for a day, a node polling a server that stays down).
 */
const MAX_DOUBLINGS = 40;

/** The wait in ms after `failures` failures in a row (1 for the first), whole milliseconds. */
export function backoffDelay(failures: number, policy: BackoffPolicy): number {
  const doublings = Math.min(Math.max(failures - 1, 0), MAX_DOUBLINGS);
  const plain = Math.min(policy.maxMs, policy.baseMs * 2 ** doublings);
  const jitter = policy.jitter ?? 0;
  if (jitter === 0) return Math.round(plain);
  const random = policy.random ?? Math.random;
  return Math.round(plain * (1 - jitter + random() * 2 * jitter));
}

/**
 * Backoff for a loop that keeps its own count of failures in a row: `failed()` after each
 * failure gives the next wait, `succeeded()` starts the count again.
 */
export class Backoff {
  private failures = 0;
  private lastDelayMs = 0;

  constructor(private readonly policy: BackoffPolicy) {}

  /** Counts one more failure in a row; returns the wait before the next try. */
  failed(): number {
    this.failures += 1;
    this.lastDelayMs = backoffDelay(this.failures, this.policy);
    return this.lastDelayMs;
  }

  /** The last try worked (or the count should start over): the next failure waits `baseMs` again. */
  succeeded(): void {
    this.failures = 0;
    this.lastDelayMs = 0;
  }

  /** The wait chosen after the last failure; 0 while nothing has failed since the last success. */
  get delayMs(): number {
    return this.lastDelayMs;
  }
}
