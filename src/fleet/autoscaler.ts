// Autoscaling between scaling.min and scaling.max (issue 28), as a pure decision: from a
// model's scaling policy, the load the gateways report (requests in flight and queued, all
// servers together) and the replicas ready now, how many replicas the model should have.
// The leader runs it each tick (autoscaling.ts) and feeds `desired` to the reconciler,
// which places new replicas like any other and drains the ones it stops.
//
// The rules:
// - The load a model needs replicas for is `ceil(load / target)`: `target` requests in
//   flight and queued per ready replica (the replica's `parallel` by default).
// - Up: while more replicas are needed than desired, continuously for `upAfterMs`, desired
//   becomes what is needed, at most `max`. A burst shorter than that scales nothing (the
//   queue absorbs it); one long overload adds every replica it needs at once rather than
//   one per period.
// - Down: while the load per desired replica stays below half the target, continuously for
//   `downAfterMs`, desired drops by one, never below `min` nor below 1 (an on-demand
//   model's stop when idle is demand.ts's, not this). One at a time, and the clock
//   starts again after each, so the replicas left are seen to carry the load before the
//   next goes.
// - Between the two (needed ≤ desired, per-replica load ≥ half the target), nothing moves
//   and both clocks stop: a load that hovers near a step does not make replicas flap.

export interface ScalingPolicy {
  min: number;
  max: number;
  /** Requests in flight and queued per ready replica that one replica is meant to carry. */
  target: number;
  upAfterMs: number;
  downAfterMs: number;
}

export interface ScalingDecision {
  direction: "up" | "down";
  from: number;
  to: number;
  /** One sentence, for `ctl model show`, the console and the `model_scaled` event. */
  why: string;
  at: number;
}

/** What the autoscaler remembers of a model between ticks. */
export interface ScalingState {
  desired: number;
  /** Since when more replicas have been needed than desired, or null. */
  overSince: number | null;
  /** Since when the load per desired replica has been below half the target, or null. */
  underSince: number | null;
  last: ScalingDecision | null;
}

export function initialScalingState(policy: ScalingPolicy): ScalingState {
  return { desired: Math.min(policy.max, Math.max(policy.min, 1)), overSince: null, underSince: null, last: null };
}

/** The next state after a tick at `now` with `load` requests in flight and queued across the gateways. */
export function decideScaling(policy: ScalingPolicy, state: ScalingState, load: number, now: number): ScalingState {
  const floor = Math.max(policy.min, 1);
  // The policy may have changed since the last tick: desired keeps within its bounds at once.
  const bounded = Math.min(policy.max, Math.max(floor, state.desired));
  if (bounded !== state.desired) {
    const direction = bounded > state.desired ? "up" : "down";
    const why = `scaling.${direction === "up" ? "min" : "max"} is now ${direction === "up" ? policy.min : policy.max}`;
    return { desired: bounded, overSince: null, underSince: null, last: { direction, from: state.desired, to: bounded, why, at: now } };
  }
  const needed = Math.ceil(load / policy.target);
  const perReplica = load / bounded;
  const over = needed > bounded && bounded < policy.max;
  const under = perReplica < policy.target / 2 && bounded > floor;
  const overSince = over ? (state.overSince ?? now) : null;
  const underSince = under ? (state.underSince ?? now) : null;
  if (overSince !== null && now - overSince >= policy.upAfterMs) {
    const to = Math.min(policy.max, needed);
    const why = `${formatLoad(load)} in flight and queued over ${bounded} replica${bounded === 1 ? "" : "s"} (target ${policy.target} each) for ${seconds(now - overSince)}`;
    return { desired: to, overSince: null, underSince: null, last: { direction: "up", from: bounded, to, why, at: now } };
  }
  if (underSince !== null && now - underSince >= policy.downAfterMs) {
    const to = bounded - 1;
    const why = `${formatLoad(load)} in flight and queued over ${bounded} replica${bounded === 1 ? "" : "s"}, below half the target of ${policy.target} each, for ${seconds(now - underSince)}`;
    return { desired: to, overSince: null, underSince: null, last: { direction: "down", from: bounded, to, why, at: now } };
  }
  return { ...state, overSince, underSince };
}

function formatLoad(load: number): string {
  return `${Number.isInteger(load) ? load : load.toFixed(1)} request${load === 1 ? "" : "s"}`;
}

function seconds(ms: number): string {
  return `${Math.round(ms / 1000)} s`;
}
