// The clock of budget periods and rate windows, for a server run as a process by a test.
// In-process tests pass `limitsClock` to startServer; a test that runs `llmgw server` as a
// child process cannot, and a per-minute rate window then depends on where in the minute
// the test happens to run (a window that ends between two requests resets the count). With
// LLMGW_TEST_LIMITS_CLOCK set to an ISO time, the limits' clock stands still at that time,
// so every server given the same value counts in the same window, however long the test
// takes. For tests only: a real server needs the real clock (windows and budgets would
// never reset), so it is not in the README.
import { BadRequestError } from "../core/errors.ts";

export const LIMITS_CLOCK_ENV = "LLMGW_TEST_LIMITS_CLOCK";

/** `{ limitsClock }` frozen at the time the environment names, or nothing when it names none. */
export function limitsClockFromEnv(env: NodeJS.ProcessEnv): { limitsClock?: () => number } {
  const value = env[LIMITS_CLOCK_ENV];
  if (value === undefined || value === "") return {};
  const at = Date.parse(value);
  if (!Number.isFinite(at)) {
    throw new BadRequestError(`Invalid ${LIMITS_CLOCK_ENV} '${value}': give an ISO time such as 2026-12-01T10:00:00Z, or unset it to use the real clock.`, {
      code: "invalid_limits_clock",
    });
  }
  return { limitsClock: () => at };
}
