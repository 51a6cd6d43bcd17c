// The one way tests wait: poll a condition until it holds, never sleep for a fixed time.
// A loaded CI machine (two cores, other jobs) makes anything time-based flaky, so the
// deadline is generous and only bounds a test that is really broken; a passing test
// returns as soon as the condition holds.

export interface EventuallyOptions {
  /** Give up after this long (default 60 s: a bound for broken tests, not a pace). */
  timeoutMs?: number;
  /** Pause between probes (default 20 ms). */
  intervalMs?: number;
}

/**
 * Calls `probe` until it returns something other than `undefined`, `null` or `false`, and
 * returns that value. A probe that throws counts as "not yet"; its last error is named in
 * the timeout message, so a failure says what was seen, not only what was awaited.
 */
export async function eventually<T>(
  what: string,
  probe: () => T | undefined | null | false | Promise<T | undefined | null | false>,
  options: EventuallyOptions = {},
): Promise<T> {
  const timeoutMs = options.timeoutMs ?? 60_000;
  const intervalMs = options.intervalMs ?? 20;
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined && value !== null && value !== false) return value;
      lastError = undefined;
    } catch (error) {
      lastError = error;
    }
    if (Date.now() > deadline) {
      const seen = lastError === undefined ? "" : ` (last probe failed: ${lastError instanceof Error ? lastError.message : String(lastError)})`;
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${seen}`);
    }
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}
