// How the admin API shows the fleet: nodes with what they offer and what their replicas
// take, and a model's health with its replicas by state and node, parking, failures and
// the placement explanation. Views never carry a credential or an engine key.
import { countOf, formatBytes } from "../core/format.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Fleet } from "./fleet.ts";
import { modelHealth } from "./model-health.ts";
import type { FleetNode } from "./node-registry.ts";
import type { ReplicaTable } from "./replica-table.ts";

export interface NodeView {
  id: string;
  name: string;
  state: string;
  address: string;
  labels: Record<string, string>;
  last_heartbeat: string;
  joined_at: string;
  cores: { used: number; total: number };
  memory_bytes: { used: number; total: number };
  gpus: Array<{ index: number; name: string; class: string; memory_bytes: number; replica: string | null }>;
  engines: Array<{ engine: string; version: string }>;
  replicas: Array<{ id: string; model: string; state: string; profile: string }>;
}

export function nodeView(node: FleetNode, fleet: Fleet, table: ReplicaTable): NodeView {
  // A stopping replica holds its room until its node confirms the stop, as placement counts it.
  const records = fleet.recordsOn(node.id);
  const gpuOwner = new Map<number, string>();
  let memory = 0;
  let cores = 0;
  for (const record of records) {
    for (const index of record.gpus[node.id] ?? []) gpuOwner.set(index, record.id);
    memory += record.needs?.memoryBytes ?? 0;
    cores += record.needs?.cores ?? 0;
  }
  return {
    id: node.id,
    name: node.name,
    state: node.state,
    address: node.address,
    labels: node.labels,
    last_heartbeat: new Date(node.lastHeartbeat).toISOString(),
    joined_at: node.joinedAt,
    cores: { used: cores, total: node.inventory.cores },
    memory_bytes: { used: memory, total: node.inventory.memoryBytes },
    gpus: node.inventory.gpus.map((gpu) => ({
      index: gpu.index,
      name: gpu.name,
      class: gpu.class,
      memory_bytes: gpu.memoryBytes,
      replica: gpuOwner.get(gpu.index) ?? null,
    })),
    engines: node.inventory.engines.map((e) => ({ engine: e.engine, version: e.version })),
    replicas: fleet
      .recordsOn(node.id)
      .map((r) => ({ id: r.id, model: table.get(r.id)?.modelName ?? r.modelId, state: table.get(r.id)?.state ?? r.state, profile: r.profile })),
  };
}

/** One line for `ctl node list`'s memory column: "3.1 GiB / 16.0 GiB". */
export function usedOfTotal(used: number, total: number): string {
  return `${formatBytes(used)} / ${formatBytes(total)}`;
}

export function modelHealthView(model: CatalogModel, fleet: Fleet, table: ReplicaTable) {
  const replicas = table.forModel(model.id);
  const status = fleet.status(model.id);
  const health = modelHealth(model, replicas, status);
  const nodeName = (id: string) => fleet.nodes.get(id)?.name ?? id;
  const byState: Record<string, number> = {};
  for (const replica of replicas) byState[replica.state] = (byState[replica.state] ?? 0) + 1;
  return {
    model: model.name,
    ...health,
    by_state: byState,
    parked: status.parked,
    placement: status.unplaceable,
    spread: status.spread ?? null,
    autoscaling: status.autoscaling ?? null,
    weights_problem: status.weightsProblem,
    replicas: replicas.map((replica) => ({
      id: replica.id,
      state: replica.state,
      profile: replica.profile,
      engine: replica.engine,
      nodes: replica.nodeIds.map(nodeName),
      endpoint: replica.endpoint === null ? null : replica.endpoint.origin + replica.endpoint.basePath,
      attempt: replica.attempt,
      failures: replica.failures,
      last_error: replica.lastError,
      started_at: replica.startedAt,
      ready_at: replica.readyAt,
      weights_verified: fleet.weightsVerified(replica.id),
    })),
    summary:
      replicas.length === 0
        ? "no replicas"
        : Object.entries(byState)
            .map(([state, n]) => `${countOf(n, "replica")} ${state}`)
            .join(", "),
  };
}
