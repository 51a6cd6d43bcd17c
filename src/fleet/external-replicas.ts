// External profiles route a model to an OpenAI-compatible server the operator already
// runs. Nothing is started for them: each external profile becomes one replica that is
// always `ready`, kept in step with the catalog by this sync.
import type { Catalog, CatalogModel } from "../catalog/catalog.ts";
import { DEFAULT_EXTERNAL_MAX_INFLIGHT, type Profile } from "../catalog/model-schema.ts";
import { endpointFromUrl, type Replica, type ReplicaTable } from "./replica-table.ts";

export function externalReplicaId(modelId: string, profile: string): string {
  return `ext-${modelId}-${profile}`;
}

/** Whether a replica id is an external profile's (fleet replicas are `r-…`). */
export function isExternalReplicaId(id: string): boolean {
  return id.startsWith("ext-");
}

/** `apiKeyOf` opens a profile's sealed key (Catalog.apiKeyOf): the replica holds it in memory only. */
export function externalReplicasOf(model: CatalogModel, apiKeyOf: (profile: Profile) => string | null): Replica[] {
  return model.definition.profiles
    .filter((profile) => profile.engine === "external" && profile.url !== undefined)
    .map((profile) => ({
      id: externalReplicaId(model.id, profile.name),
      modelId: model.id,
      modelName: model.name,
      profile: profile.name,
      engine: "external" as const,
      nodeIds: [],
      state: "ready" as const,
      endpoint: endpointFromUrl(profile.url!),
      engineKey: apiKeyOf(profile),
      upstreamModel: profile.upstream_model ?? model.name,
      weight: profile.weight,
      priority: profile.priority,
      untrustedOutput: profile.trust_max_tokens !== true,
      slots: profile.max_inflight ?? DEFAULT_EXTERNAL_MAX_INFLIGHT,
      attempt: 0,
      failures: 0,
      lastError: null,
      startedAt: null,
      readyAt: null,
    }));
}

/** Mirrors the catalog's external profiles into the replica table now and after each change. */
export function syncExternalReplicas(catalog: Catalog, table: ReplicaTable): () => void {
  const apply = (models: readonly CatalogModel[]) => {
    const wanted = new Map(
      models.flatMap((model) => externalReplicasOf(model, (profile) => catalog.apiKeyOf(profile))).map((replica) => [replica.id, replica]),
    );
    for (const replica of table.all()) {
      if (replica.engine === "external" && !wanted.has(replica.id)) table.remove(replica.id);
    }
    for (const replica of wanted.values()) {
      const current = table.get(replica.id);
      if (current === undefined || JSON.stringify(current) !== JSON.stringify(replica)) table.upsert(replica);
    }
  };
  apply(catalog.list());
  return catalog.onChange(apply);
}
