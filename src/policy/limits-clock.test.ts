// The limits' clock a test gives a server run as a process (LLMGW_TEST_LIMITS_CLOCK).
import { test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError } from "../core/errors.ts";
import { LIMITS_CLOCK_ENV, limitsClockFromEnv } from "./limits-clock.ts";

test("unset or empty: no clock, so the server keeps the real one", () => {
  assert.deepEqual(limitsClockFromEnv({}), {});
  assert.deepEqual(limitsClockFromEnv({ [LIMITS_CLOCK_ENV]: "" }), {});
});

test("an ISO time: a clock that stands still at it", () => {
  const { limitsClock } = limitsClockFromEnv({ [LIMITS_CLOCK_ENV]: "2026-12-01T10:00:59.500Z" });
  assert.equal(limitsClock?.(), Date.parse("2026-12-01T10:00:59.500Z"));
  assert.equal(limitsClock?.(), Date.parse("2026-12-01T10:00:59.500Z"), "it does not move");
});

test("anything else is refused, naming the variable and the value", () => {
  assert.throws(
    () => limitsClockFromEnv({ [LIMITS_CLOCK_ENV]: "yesterday" }),
    (error: unknown) => error instanceof BadRequestError && error.message.startsWith(`Invalid ${LIMITS_CLOCK_ENV} 'yesterday': give an ISO time`),
  );
});
