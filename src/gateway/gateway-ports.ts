// The narrow interfaces through which the gateway reaches the rest of llmgw: the catalog
// (names to models), the key service, the usage table and the fleet's on-demand starts.
// They sit in a file of their own so that the modules that implement them (catalog, keys,
// cluster, metrics, server) can name them without importing the gateway's hot path, and
// the gateway never imports those modules' classes.
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Principal } from "../keys/key-service.ts";
import type { UsageRow } from "./usage-recorder.ts";
import type { AdapterResolver } from "./adapter-route.ts";

/** What the gateway reads of the catalog: names and aliases to models. */
export interface ModelResolver extends AdapterResolver {
  resolve(nameOrAlias: string): CatalogModel | undefined;
  list(): readonly CatalogModel[];
}

/** What the gateway asks of the key service. */
export interface KeyVerifier {
  verify(token: string | undefined): Promise<Principal>;
}

/** Where the gateway leaves one usage row per request. */
export interface UsageSink {
  record(row: UsageRow): void;
}

/** What the gateway tells the fleet about requests, for models served on demand. */
export interface OnDemand {
  /** A request for the model is about to wait for a replica: start one if it has none. */
  requested(model: CatalogModel): void;
  /** That request is over (answered, failed or gone): the idle clock starts from the last one. */
  finished(model: CatalogModel): void;
  /** Whether a replica is being started on demand, so a request may wait for it. */
  starting(modelId: string): boolean;
}
