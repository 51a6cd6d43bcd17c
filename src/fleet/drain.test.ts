// Drains before a stop (drain.ts): alone, a replica without requests stops at once and one
// with requests waits for them; with several servers, every stop drains until counts read
// long enough after it began show nothing left, and counts that cannot be read hold it
// until the deadline.
import { test } from "node:test";
import assert from "node:assert/strict";
import { silentLogger } from "../core/log.ts";
import { Drains, type SharedCounts } from "./drain.ts";

function rig(shared?: SharedCounts) {
  let now = 1_000_000;
  const inFlight = new Map<string, number>();
  const drains = new Drains({ inFlight: (id) => inFlight.get(id) ?? 0, clock: () => now, timeoutMs: 60_000, logger: silentLogger(), shared });
  return { drains, inFlight, advance: (ms: number) => (now += ms), now: () => now };
}

test("alone: no request in flight stops at once; requests in flight are waited for", () => {
  const { drains, inFlight, advance } = rig();
  assert.equal(drains.begin("idle", "m"), false);
  inFlight.set("busy", 1);
  assert.equal(drains.begin("busy", "m"), true);
  assert.deepEqual(drains.takeDone(), []);
  inFlight.set("busy", 0);
  advance(10);
  assert.deepEqual(drains.takeDone(), ["busy"]);
});

test("several servers: every stop drains until a read settleMs after it began shows none; unread counts hold it until the deadline", () => {
  let readAt: number | null = null;
  let known = true;
  const counts: SharedCounts = { settleMs: 3_000, readAt: () => readAt, known: () => known };
  const { drains, inFlight, advance, now } = rig(counts);
  const began = now();
  assert.equal(drains.begin("r1", "m"), true, "another server may have a request there that its row does not show yet");
  readAt = began + 1_000;
  advance(1_000);
  assert.deepEqual(drains.takeDone(), [], "a read 1 s after the stop may miss another server's request");
  // Another server's request shows up in a later read; it ends; a read after the settle time shows none.
  inFlight.set("r1", 1);
  readAt = began + 3_000;
  advance(2_000);
  assert.deepEqual(drains.takeDone(), []);
  inFlight.set("r1", 0);
  readAt = began + 4_000;
  advance(1_000);
  assert.deepEqual(drains.takeDone(), ["r1"]);

  // Counts that cannot be read (stale): not done, until the deadline.
  const second = now();
  assert.equal(drains.begin("r2", "m"), true);
  known = false;
  readAt = second + 5_000;
  advance(5_000);
  assert.deepEqual(drains.takeDone(), []);
  advance(55_000);
  assert.deepEqual(drains.takeDone(), ["r2"], "the deadline ends it anyway");
});
