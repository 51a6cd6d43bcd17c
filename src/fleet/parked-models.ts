// Parked models: a model whose replica's supervisor gave up gets no new attempts until it
// is unparked or its definition changes (DESIGN.md "Replica lifecycle"). Kept in memory for
// the reconciler and the health line, and in the store's `model_states` rows so that a
// restarted server keeps the parking. The fleet (fleet.ts) decides when to park and clear.
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { nowIso, type Store } from "../store/store.ts";

export interface ParkedModel {
  reason: string;
  at: string;
}

export class ParkedModels {
  private readonly parked = new Map<string, ParkedModel>();

  constructor(private readonly options: { store: Store; logger: Logger; clock: () => number }) {}

  async load(): Promise<void> {
    for (const row of await this.options.store.db.selectFrom("model_states").selectAll().execute()) {
      if (row.parked_reason !== null) this.parked.set(row.model_id, { reason: row.parked_reason, at: row.parked_at ?? row.updated_at });
    }
  }

  get(modelId: string): ParkedModel | undefined {
    return this.parked.get(modelId);
  }

  has(modelId: string): boolean {
    return this.parked.has(modelId);
  }

  /** The parked model ids, a copy (what the reconciler reads). */
  ids(): ReadonlySet<string> {
    return new Set(this.parked.keys());
  }

  /** The parked models, a copy: clearing one while going through them is fine. */
  entries(): Array<[string, ParkedModel]> {
    return [...this.parked];
  }

  /**
   * Parks the model. It is parked at once, before the write: a second replica that parks
   * meanwhile finds it parked. A failed write is logged; the parking holds for this run.
   */
  async park(model: { id: string; name: string }, reason: string): Promise<void> {
    const at = nowIso(this.options.clock);
    this.parked.set(model.id, { reason, at });
    try {
      await this.options.store.db
        .insertInto("model_states")
        .values({ model_id: model.id, parked_reason: reason, parked_at: at, updated_at: at })
        .onConflict((oc) => oc.column("model_id").doUpdateSet({ parked_reason: reason, parked_at: at, updated_at: at }))
        .execute();
    } catch (error) {
      this.options.logger.warn({ model: model.name, err: describeError(error) }, "could not record the model's parking");
    }
  }

  /** Ends the model's parking (at once, then in the store); false when it was not parked. */
  clear(modelId: string): Promise<boolean> {
    if (!this.parked.delete(modelId)) return Promise.resolve(false);
    return this.options.store.db
      .deleteFrom("model_states")
      .where("model_id", "=", modelId)
      .execute()
      .then(() => true);
  }
}
