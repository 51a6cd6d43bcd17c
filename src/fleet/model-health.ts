// One line of truth about whether a model can answer, derived from its replicas. The
// admin API, `ctl model list` and (later) notifications show this, so it says why in
// words when the answer is no.
import { countOf } from "../core/format.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Replica, ReplicaState } from "./replica-table.ts";

/** States from which a replica may still become ready: waiting for it is worthwhile. */
const COMING_UP: ReadonlySet<ReplicaState> = new Set(["pending", "placed", "fetching", "starting"]);

export function isComingUp(replica: Pick<Replica, "state">): boolean {
  return COMING_UP.has(replica.state);
}

/** A replica the gateway can send requests to now. */
export function isRoutable(replica: Pick<Replica, "state" | "endpoint">): boolean {
  return replica.state === "ready" && replica.endpoint !== null;
}

export type HealthState = "ready" | "starting" | "failed" | "parked" | "unplaceable" | "stopped" | "no-replicas";

export interface ModelHealth {
  state: HealthState;
  ready: number;
  replicas: number;
  reason: string | null;
}

/** What the fleet knows of a model beyond its replicas (fleet.ts `status`). */
export interface FleetStatusOfModel {
  parked: { reason: string } | null;
  unplaceable: string[] | null;
  weightsProblem: string | null;
}

export function modelHealth(model: CatalogModel, replicas: readonly Replica[], fleet?: FleetStatusOfModel): ModelHealth {
  const ready = replicas.filter((r) => r.state === "ready").length;
  const base = { ready, replicas: replicas.length };
  if (ready > 0) return { state: "ready", ...base, reason: null };
  if (fleet?.parked) return { state: "parked", ...base, reason: `parked: ${fleet.parked.reason}` };
  if (fleet?.weightsProblem) return { state: "failed", ...base, reason: fleet.weightsProblem };
  const parked = replicas.find((r) => r.state === "parked");
  if (fleet?.unplaceable && !replicas.some(isComingUp) && parked === undefined)
    return { state: "unplaceable", ...base, reason: `no node can take a replica: ${fleet.unplaceable.join("; ")}` };
  if (parked !== undefined)
    return { state: "parked", ...base, reason: `parked after ${countOf(parked.failures, "failed start")}: ${parked.lastError ?? "no error recorded"}` };
  const starting = replicas.find(isComingUp);
  if (starting !== undefined) return { state: "starting", ...base, reason: `replica ${starting.state} (attempt ${starting.attempt})` };
  const failed = replicas.find((r) => r.state === "failed");
  if (failed !== undefined) return { state: "failed", ...base, reason: failed.lastError ?? "start failed" };
  if (replicas.length > 0) return { state: "stopped", ...base, reason: "replicas are stopping or stopped" };
  return {
    state: "no-replicas",
    ...base,
    reason: model.definition.scaling.min === 0 ? "scaling.min is 0" : "no replica placed yet",
  };
}
