// What the fleet tells others of a replica record: a node's agent gets it as an assignment
// (agent-protocol.ts), the gateway as an entry of its ReplicaTable. Pure mappings, so the
// fleet (fleet.ts) decides only when to tell them.
import type { CatalogModel } from "../catalog/catalog.ts";
import { DEFAULT_EXTERNAL_MAX_INFLIGHT } from "../catalog/model-schema.ts";
import { llamaCppSlots } from "../engines/llamacpp/engine-launch.ts";
import type { Assignment } from "./agent-protocol.ts";
import type { NewReplica } from "./reconciler.ts";
import type { ReplicaRecord } from "./replica-rows.ts";
import type { Replica } from "./replica-table.ts";

/**
 * What `nodeId` must run of the record, or null when it runs nothing of it: the record is
 * not meant to run, is parked, is not on that node, or its model or profile is gone.
 */
export function assignmentOf(record: ReplicaRecord, model: CatalogModel | undefined, nodeId: string): Assignment | null {
  if (record.desired !== "run" || record.engineKey === null || !record.nodeIds.includes(nodeId)) return null;
  // A parked replica's supervisor gave up: an agent that restarts must not try it again.
  if (record.state === "parked") return null;
  const profile = model?.definition.profiles.find((p) => p.name === record.profile);
  // The source and files it was placed with: an old replica held through an update keeps
  // its own weights, and what the server's weights check says now does not take a running replica away.
  const source = record.source ?? model?.definition.source;
  if (model === undefined || profile === undefined || source === undefined) return null;
  const index = record.nodeIds.indexOf(nodeId);
  return {
    ...(record.nodeIds.length > 1
      ? { ray: { role: index === 0 ? ("head" as const) : ("worker" as const), headAddress: record.rayAddress ?? null, workersReady: workersReady(record) } }
      : {}),
    replicaId: record.id,
    modelId: model.id,
    modelName: model.name,
    profile,
    // Only the head runs the engine; a Ray worker has no use for its key.
    engineKey: index === 0 ? record.engineKey : "",
    fingerprint: record.fingerprint,
    source,
    files: record.files,
    ...(record.adapters !== undefined && record.adapters.length > 0 ? { adapters: record.adapters } : {}),
    gpus: record.gpus[nodeId] ?? [],
    nodeIds: record.nodeIds,
  };
}

/**
 * The gateway's table entry for the record. `leaving`: it is being stopped or drained, so
 * it stays visible as "stopping" but takes no requests. `previous` is the entry so far
 * (its names are kept when the model is gone from the catalog). `unproven`: a new replica
 * an update has not yet smoke-tested; it is listed as starting without an endpoint, so
 * nothing routes to it (the update job reaches it directly) and requests wait for it.
 */
export function tableEntryOf(
  record: ReplicaRecord,
  model: CatalogModel | undefined,
  previous: Replica | undefined,
  leaving: boolean,
  unproven = false,
): Replica {
  const profile = model?.definition.profiles.find((p) => p.name === record.profile);
  return {
    id: record.id,
    modelId: record.modelId,
    modelName: model?.name ?? previous?.modelName ?? record.modelId,
    profile: record.profile,
    engine: record.engine,
    nodeIds: record.nodeIds,
    // Unproven and ready: "starting" to clients, so requests wait for it rather than give up.
    state: leaving && record.state !== "stopped" ? "stopping" : unproven && record.state === "ready" ? "starting" : record.state,
    endpoint: unproven ? null : record.endpoint,
    engineKey: record.engineKey,
    upstreamModel: model?.name ?? previous?.upstreamModel ?? record.modelId,
    ...(record.adapters !== undefined && record.adapters.length > 0 ? { adapters: record.adapters.map((adapter) => adapter.servedName) } : {}),
    weight: profile?.weight ?? 1,
    priority: profile?.priority ?? 0,
    slots: profile === undefined ? 1 : profileSlots(profile),
    attempt: record.attempt,
    failures: record.failures,
    lastError: record.lastError,
    startedAt: record.startedAt,
    readyAt: record.readyAt,
  };
}

/** Whether every worker node of a replica over several nodes runs its Ray worker. */
export function workersReady(record: ReplicaRecord): boolean {
  return record.nodeIds.slice(1).every((nodeId) => record.workerStates?.[nodeId] === "ready");
}

/** Requests one replica of the profile serves at once: llama.cpp's parallel sequences, else its in-flight limit. */
export function profileSlots(profile: CatalogModel["definition"]["profiles"][number]): number {
  return profile.engine === "llamacpp" ? llamaCppSlots(profile).parallel : (profile.max_inflight ?? DEFAULT_EXTERNAL_MAX_INFLIGHT);
}

/** The record of a replica the reconciler just placed: to run, not started yet, with what its node needs to start it. */
export function placedRecord(replica: NewReplica, extra: Pick<ReplicaRecord, "files" | "adapters" | "source"> & { engineKey: string }): ReplicaRecord {
  const { id, modelId, profile, engine, nodeIds, gpus, fingerprint, needs } = replica;
  return {
    ...{ id, modelId, profile, engine, nodeIds, gpus, fingerprint, needs },
    ...extra,
    desired: "run",
    state: "placed",
    endpoint: null,
    attempt: 0,
    failures: 0,
    lastError: null,
    startedAt: null,
    readyAt: null,
    weightsVerified: false,
  };
}
