import { test } from "node:test";
import assert from "node:assert/strict";
import { Backoff, backoffDelay } from "./backoff.ts";

test("waits double from the base after each failure and stop at the cap", () => {
  const policy = { baseMs: 100, maxMs: 1_000 };
  assert.deepEqual(
    [1, 2, 3, 4, 5, 6].map((failures) => backoffDelay(failures, policy)),
    [100, 200, 400, 800, 1_000, 1_000],
  );
});

test("a failure count far past the cap still gives the cap, also with a base of 0", () => {
  assert.equal(backoffDelay(5_000, { baseMs: 5_000, maxMs: 3_600_000 }), 3_600_000);
  assert.equal(backoffDelay(5_000, { baseMs: 0, maxMs: 30_000 }), 0);
  assert.equal(backoffDelay(0, { baseMs: 250, maxMs: 30_000 }), 250, "no failure yet reads as the first");
});

test("jitter moves each wait by up to its fraction either way, from the random source given", () => {
  const policy = (value: number) => ({ baseMs: 1_000, maxMs: 60_000, jitter: 0.2, random: () => value });
  assert.equal(backoffDelay(1, policy(0)), 800);
  assert.equal(backoffDelay(1, policy(0.5)), 1_000);
  assert.equal(backoffDelay(3, policy(0.999_999)), 4_800);
  // The cap applies before the jitter, so waits at the cap still spread.
  assert.equal(backoffDelay(20, policy(0)), 48_000);
});

test("Backoff counts failures in a row and starts again after a success", () => {
  const backoff = new Backoff({ baseMs: 100, maxMs: 500 });
  assert.equal(backoff.delayMs, 0);
  assert.deepEqual([backoff.failed(), backoff.failed(), backoff.failed(), backoff.failed()], [100, 200, 400, 500]);
  assert.equal(backoff.delayMs, 500);
  backoff.succeeded();
  assert.equal(backoff.delayMs, 0);
  assert.equal(backoff.failed(), 100);
});
