// A model's replicas split by the definition they were made from, for server-side code that
// checks an update (a smoke test calls the new replicas' engines before the old ones go):
// each with its endpoint and engine key. The engine key is a secret, so these are never
// rendered to clients; the admin API shows replicas through fleet-views.ts instead. The
// fingerprint (what a replica was made from) is defined here too.
import { createHash } from "node:crypto";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { AssignedFile } from "./agent-protocol.ts";
import type { ReplicaRecord } from "./replica-rows.ts";
import type { ReplicaEndpoint, ReplicaState } from "./replica-table.ts";

export interface CurrentReplica {
  id: string;
  profile: string;
  engine: "llamacpp" | "vllm";
  state: ReplicaState;
  /** The head node first. */
  nodeNames: string[];
  endpoint: ReplicaEndpoint | null;
  /** The Bearer token the engine expects; never leaves the server. */
  engineKey: string | null;
  weightsVerified: boolean;
  lastError: string | null;
  /** The weights files it was placed with. */
  files: AssignedFile[];
}

export interface ReplicasByDefinition {
  /** Made from the model's current definition. */
  current: CurrentReplica[];
  /** Made from an earlier one (all of them when the model is gone). */
  outdated: CurrentReplica[];
}

/** The replicas of `modelId` that are meant to run (desired "run"), split by fingerprint. */
export function replicasByDefinition(options: {
  modelId: string;
  model: CatalogModel | undefined;
  records: Iterable<ReplicaRecord>;
  fingerprintOf: (model: CatalogModel, profile: string) => string;
  nodeName: (nodeId: string) => string;
}): ReplicasByDefinition {
  const split: ReplicasByDefinition = { current: [], outdated: [] };
  const { model } = options;
  for (const record of options.records) {
    if (record.modelId !== options.modelId || record.desired !== "run") continue;
    const replica: CurrentReplica = {
      id: record.id,
      profile: record.profile,
      engine: record.engine,
      state: record.state,
      nodeNames: record.nodeIds.map(options.nodeName),
      endpoint: record.endpoint === null ? null : { ...record.endpoint },
      engineKey: record.engineKey,
      weightsVerified: record.weightsVerified,
      lastError: record.lastError,
      files: record.files.map((file) => ({ ...file })),
    };
    const current = model !== undefined && record.fingerprint === options.fingerprintOf(model, record.profile);
    (current ? split.current : split.outdated).push(replica);
  }
  return split;
}

/** What a replica of this profile was made from: another value means its engine must be replaced. */
export function fingerprintOf(model: CatalogModel, profileName: string): string {
  const { source, profiles, adapters } = model.definition;
  const profile = profiles.find((p) => p.name === profileName);
  // Adapters only when there are some: models without them keep the fingerprints they had.
  return createHash("sha256")
    .update(JSON.stringify({ name: model.name, source, profile, ...(adapters.length > 0 ? { adapters } : {}) }))
    .digest("hex")
    .slice(0, 16);
}
