// The autoscaling rule on its own: up after a sustained overload to what the load needs,
// down one at a time after a sustained quiet, nothing on a short burst or near a step.
import { test } from "node:test";
import assert from "node:assert/strict";
import { decideScaling, initialScalingState, type ScalingPolicy, type ScalingState } from "./autoscaler.ts";

const policy: ScalingPolicy = { min: 1, max: 3, target: 2, upAfterMs: 15_000, downAfterMs: 300_000 };

/** Ticks once a second from `from` to `to` (ms) at a constant load. */
function run(state: ScalingState, load: number, from: number, to: number, p = policy): ScalingState {
  let current = state;
  for (let now = from; now <= to; now += 1000) current = decideScaling(p, current, load, now);
  return current;
}

test("a sustained overload adds the replicas it needs at once, after up_after and not before", () => {
  const start = initialScalingState(policy);
  assert.equal(start.desired, 1);
  // 6 requests against a target of 2: three replicas needed.
  const early = run(start, 6, 0, 14_000);
  assert.equal(early.desired, 1, "not before 15 s");
  const scaled = run(early, 6, 15_000, 15_000);
  assert.equal(scaled.desired, 3);
  assert.deepEqual({ ...scaled.last, why: undefined }, { direction: "up", from: 1, to: 3, why: undefined, at: 15_000 });
  assert.match(scaled.last!.why, /6 requests in flight and queued over 1 replica \(target 2 each\) for 15 s/);
  // Never past max, however high the load.
  assert.equal(run(initialScalingState(policy), 40, 0, 20_000).desired, 3);
});

test("a burst shorter than up_after scales nothing: the clock starts again", () => {
  let state = run(initialScalingState(policy), 6, 0, 10_000);
  state = run(state, 1, 11_000, 12_000);
  state = run(state, 6, 13_000, 27_000);
  assert.equal(state.desired, 1, "10 s, a pause, then 14 s: never 15 s in a row");
  assert.equal(run(state, 6, 28_000, 28_000).desired, 3);
});

test("below half the target for down_after, one replica goes; the next waits a whole down_after again", () => {
  const three = { ...initialScalingState(policy), desired: 3 };
  // 2 requests over 3 replicas: 0.67 each, below half of 2.
  const before = run(three, 2, 0, 299_000);
  assert.equal(before.desired, 3);
  const two = run(before, 2, 300_000, 300_000);
  assert.equal(two.desired, 2);
  assert.equal(two.last?.direction, "down");
  assert.match(two.last!.why, /below half the target of 2 each, for 300 s/);
  // 2 over 2 is 1 each: not below half of 2, so the second stays.
  assert.equal(run(two, 2, 301_000, 900_000).desired, 2);
  // Quiet: one more goes after another whole down_after, and never below min.
  const one = run(two, 0, 901_000, 1_201_000);
  assert.equal(one.desired, 1);
  assert.equal(run(one, 0, 1_202_000, 3_000_000).desired, 1);
});

test("a load that hovers between the steps moves nothing", () => {
  const two = { ...initialScalingState(policy), desired: 2 };
  // 3 or 4 requests over 2 replicas: needs at most 2, and 1.5–2 each is above half of 2.
  let state = two;
  for (let now = 0; now < 1_000_000; now += 1000) state = decideScaling(policy, state, now % 2000 === 0 ? 3 : 4, now);
  assert.equal(state.desired, 2);
  assert.equal(state.last, null);
});

test("a changed policy bounds desired at once, saying why", () => {
  const three = { ...initialScalingState(policy), desired: 3 };
  const lowered = decideScaling({ ...policy, max: 2 }, three, 10, 5000);
  assert.equal(lowered.desired, 2);
  assert.deepEqual(lowered.last, { direction: "down", from: 3, to: 2, why: "scaling.max is now 2", at: 5000 });
  const raised = decideScaling({ ...policy, min: 3 }, initialScalingState(policy), 0, 6000);
  assert.equal(raised.desired, 3);
  assert.equal(raised.last?.why, "scaling.min is now 3");
});
