// Demand for models served on demand (scaling.min 0): which of them want a replica now,
// how many of their requests are in the gateway, and when the last one began or ended.
// A model wants a replica from its first request until it has been idle (no request in
// flight) for its idle_seconds; the fleet starts and stops replicas from this.
import type { CatalogModel } from "../catalog/catalog.ts";
import { runsOnEngines } from "./reconciler.ts";

export class Demand {
  /** On-demand models that want a replica now, with how many (what the reconciler reads). */
  readonly wanted = new Map<string, number>();
  private readonly active = new Map<string, number>();
  private readonly lastActivity = new Map<string, number>();

  constructor(private readonly clock: () => number) {}

  /** A request for the model arrived. True when an on-demand model now wants a replica it did not. */
  requested(model: CatalogModel): boolean {
    this.active.set(model.id, (this.active.get(model.id) ?? 0) + 1);
    this.lastActivity.set(model.id, this.clock());
    if (model.definition.scaling.min > 0 || !runsOnEngines(model) || this.wants(model.id)) return false;
    this.wanted.set(model.id, 1);
    return true;
  }

  /** That request is over: the idle clock starts from the last one's end. */
  finished(modelId: string): void {
    const left = (this.active.get(modelId) ?? 1) - 1;
    if (left > 0) this.active.set(modelId, left);
    else this.active.delete(modelId);
    this.lastActivity.set(modelId, this.clock());
  }

  /** A replica that ran before a restart stays wanted until it is idle. */
  keep(modelId: string): void {
    this.wanted.set(modelId, 1);
    this.lastActivity.set(modelId, this.clock());
  }

  wants(modelId: string): boolean {
    return (this.wanted.get(modelId) ?? 0) > 0;
  }

  /**
   * The models idle for their idle_seconds now, no longer wanted from here on. A model with
   * a request in flight is never idle; idle_seconds 0 keeps a started replica.
   */
  takeIdle(modelById: (modelId: string) => CatalogModel | undefined): CatalogModel[] {
    const now = this.clock();
    const idle: CatalogModel[] = [];
    for (const modelId of [...this.wanted.keys()]) {
      const model = modelById(modelId);
      if (model === undefined || model.definition.scaling.min > 0) {
        this.wanted.delete(modelId);
        continue;
      }
      const idleSeconds = model.definition.scaling.idle_seconds;
      if (idleSeconds === 0 || (this.active.get(modelId) ?? 0) > 0) continue;
      if (now - (this.lastActivity.get(modelId) ?? now) < idleSeconds * 1000) continue;
      this.wanted.delete(modelId);
      idle.push(model);
    }
    return idle;
  }
}
