// What the fleet knows of each engine model's weights (model-weights.ts): read once per
// definition, and again on every pass while they are a problem (the mirror may finish the
// file meanwhile). From it come the ways a replica can run (each profile with what it
// needs, highest priority first) and the files a new replica is placed with.
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { AssignedFile } from "./agent-protocol.ts";
import type { PlacementOption } from "./fleet-types.ts";
import { readModelWeights, type MirrorReader, weightsProblem, type ModelWeights } from "./model-weights.ts";
import { runsOnEngines } from "./reconciler.ts";
import { replicaNeeds } from "./replica-needs.ts";

type WeightsInfo = { definitionAt: string; weights: ModelWeights } | { definitionAt: string; problem: string };

export class WeightsKnowledge {
  private readonly known = new Map<string, WeightsInfo>();

  constructor(private readonly options: { mirror: MirrorReader; logger: Logger }) {}

  /** Reads what is new or was a problem; calls `onNewProblem` with a model whose weights just became (another) problem. */
  async refresh(models: readonly CatalogModel[], onNewProblem: (modelId: string) => void): Promise<void> {
    for (const model of models) {
      if (!runsOnEngines(model)) continue;
      const known = this.known.get(model.id);
      if (known !== undefined && known.definitionAt === model.updated_at && "weights" in known) continue;
      try {
        this.known.set(model.id, { definitionAt: model.updated_at, weights: await readModelWeights(model, this.options.mirror) });
      } catch (error) {
        const problem = weightsProblem(model, error);
        if (known === undefined || !("problem" in known) || known.problem !== problem) {
          this.options.logger.warn({ model: model.name, err: describeError(error) }, "model weights not servable");
          onNewProblem(model.id);
        }
        this.known.set(model.id, { definitionAt: model.updated_at, problem });
      }
    }
    const ids = new Set(models.map((m) => m.id));
    for (const id of this.known.keys()) if (!ids.has(id)) this.known.delete(id);
  }

  /** Why the model's weights cannot be served now, or null (also while not yet read). */
  problem(modelId: string): string | null {
    const info = this.known.get(modelId);
    return info !== undefined && "problem" in info ? info.problem : null;
  }

  keyOf(modelId: string): string | null {
    return this.weightsOf(modelId)?.key ?? null;
  }

  filesOf(modelId: string): AssignedFile[] {
    return this.weightsOf(modelId)?.files ?? [];
  }

  /** How a model's replicas can run: each engine profile with what it needs, highest priority (then weight) first; null while unknown. */
  optionsFor(model: CatalogModel): PlacementOption[] | null {
    const weights = this.weightsOf(model.id);
    if (weights === undefined) return null;
    return [...model.definition.profiles]
      .filter((profile) => profile.engine !== "external")
      .sort((a, b) => b.priority - a.priority || b.weight - a.weight)
      .map((profile) => ({ profile: profile.name, needs: replicaNeeds({ profile, weightsBytes: weights.bytes, ...(weights.header ? { header: weights.header } : {}) }) }));
  }

  private weightsOf(modelId: string): ModelWeights | undefined {
    const info = this.known.get(modelId);
    return info !== undefined && "weights" in info ? info.weights : undefined;
  }
}
