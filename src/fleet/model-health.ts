// One line of truth about whether a model can answer, derived from its replicas. The
// admin API, `ctl model list` and (later) notifications show this, so it says why in
// words when the answer is no.
import { countOf } from "../core/format.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Replica } from "./replica-table.ts";

export type HealthState = "ready" | "starting" | "failed" | "parked" | "stopped" | "no-replicas";

export interface ModelHealth {
  state: HealthState;
  ready: number;
  replicas: number;
  reason: string | null;
}

export function modelHealth(model: CatalogModel, replicas: readonly Replica[]): ModelHealth {
  const ready = replicas.filter((r) => r.state === "ready").length;
  const base = { ready, replicas: replicas.length };
  if (ready > 0) return { state: "ready", ...base, reason: null };
  const parked = replicas.find((r) => r.state === "parked");
  if (parked !== undefined) return { state: "parked", ...base, reason: `parked after ${countOf(parked.failures, "failed start")}: ${parked.lastError ?? "no error recorded"}` };
  const starting = replicas.find((r) => ["pending", "placed", "fetching", "starting"].includes(r.state));
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
