// What the fleet knows of each engine model's weights (model-weights.ts): read once per
// definition, and again on every pass while they are a problem (the mirror may finish the
// file meanwhile). From it come the ways a replica can run (each profile with what it
// needs, highest priority first) and the files a new replica is placed with.
//
// With several servers, the leader reads the GGUF header from its own mirror: a mirrored
// file whose bytes only another server holds (fetched there, or by the last leader) is
// copied here from a running holder in the background (Mirror.replicate), and the model is
// placed once the copy is verified. Nodes do not wait for that: they are sent to a holder.
// What a leader read is kept in the store (`model_weights`): when no running server holds
// the bytes, the next leader places replicas from what the last one read, and nodes start
// them from their caches.
import { describeError, errorCode } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { nowIso, type Store } from "../store/store.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { AssignedAdapter, AssignedFile } from "./agent-protocol.ts";
import type { PlacementOption } from "./fleet-types.ts";
import { vllmLoraReserveBytes } from "../engines/vllm/vllm-launch.ts";
import { FileHashMemo } from "./adapter-pins.ts";
import { readModelWeights, type MirrorReader, weightsProblem, type ModelWeights } from "./model-weights.ts";
import { runsOnEngines } from "./reconciler.ts";
import { replicaNeeds } from "./replica-needs.ts";

type WeightsInfo = { definitionAt: string; weights: ModelWeights } | { definitionAt: string; problem: string };

export class WeightsKnowledge {
  private readonly known = new Map<string, WeightsInfo>();
  /** Mirror versions being copied here from another server, by `model/version`. */
  private readonly copying = new Set<string>();
  /** Adapter files hashed on this server, by stamp: a pass that reads the weights again does not hash them again. */
  private readonly hashes = new FileHashMemo();

  /** `onCopied`: a version copied from another server is here now (the fleet reconciles again). */
  /** `store`: where what was read is kept for the next leader (absent in some tests: nothing is kept). */
  constructor(private readonly options: { mirror: MirrorReader; logger: Logger; onCopied?: () => void; store?: Store }) {}

  /** Reads what is new or was a problem; calls `onNewProblem` with a model whose weights just became (another) problem. */
  async refresh(models: readonly CatalogModel[], onNewProblem: (modelId: string) => void): Promise<void> {
    for (const model of models) {
      if (!runsOnEngines(model)) continue;
      const known = this.known.get(model.id);
      if (known !== undefined && known.definitionAt === model.updated_at && "weights" in known) continue;
      try {
        const weights = await readModelWeights(model, this.options.mirror, this.hashes);
        this.known.set(model.id, { definitionAt: model.updated_at, weights });
        await this.keep(model, weights);
      } catch (error) {
        const copying = await this.copyFromHolder(model, error);
        const kept = errorCode(error) === "mirror_file_elsewhere" ? await this.kept(model) : null;
        if (kept !== null) {
          this.known.set(model.id, { definitionAt: model.updated_at, weights: kept });
          continue;
        }
        const problem =
          weightsProblem(model, error) +
          (copying ? " This server is copying them from that server now; the model is placed once they are here and verified." : "");
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

  /** Keeps what was read of the model's source, for the next leader (written at each read: once per definition). */
  private async keep(model: CatalogModel, weights: ModelWeights): Promise<void> {
    const store = this.options.store;
    if (store === undefined || model.definition.source?.kind !== "mirror") return;
    const values = { source: JSON.stringify(model.definition.source), weights: JSON.stringify(weights), updated_at: nowIso() };
    await store.db
      .insertInto("model_weights")
      .values({ model_id: model.id, ...values })
      .onConflict((oc) => oc.column("model_id").doUpdateSet(values))
      .execute()
      .catch((error: unknown) =>
        this.options.logger.warn({ model: model.name, err: describeError(error) }, "could not keep what was read of the model's weights"),
      );
  }

  /** What a leader read of the weights of this model's source, when the bytes are on no server here. */
  private async kept(model: CatalogModel): Promise<ModelWeights | null> {
    const row = await this.options.store?.db
      .selectFrom("model_weights")
      .selectAll()
      .where("model_id", "=", model.id)
      .executeTakeFirst()
      .catch(() => undefined);
    if (row === undefined || row.source !== JSON.stringify(model.definition.source)) return null;
    // The row is keyed by the source alone, so it says nothing sure of the adapters: a model
    // with adapters waits for bytes this server can read. Rows kept before adapters existed have none.
    if (model.definition.adapters.length > 0) return null;
    const weights = JSON.parse(row.weights) as ModelWeights;
    return { ...weights, adapters: weights.adapters ?? [] };
  }

  /**
   * Starts copying the mirrored versions of this model (its weights, its mirrored adapters)
   * held only by another server; true while a copy runs.
   */
  private async copyFromHolder(model: CatalogModel, error: unknown): Promise<boolean> {
    const replicate = this.options.mirror.replicate?.bind(this.options.mirror);
    if (errorCode(error) !== "mirror_file_elsewhere" || replicate === undefined) return false;
    // The weights' version is copied whichever of its files is elsewhere (a split part, the
    // projector, a vLLM shard: a copy may have brought some files and failed others); an
    // adapter's version, when its file is.
    const weights = model.definition.source?.kind === "mirror" ? [model.definition.source] : [];
    const adapters = model.definition.adapters.flatMap((adapter) => (adapter.source.kind === "mirror" ? [adapter.source] : []));
    let copying = false;
    for (const source of [...weights, ...adapters]) {
      const key = `${source.model}/${source.version}`;
      if (this.copying.has(key)) {
        copying = true;
        continue;
      }
      if (!weights.includes(source)) {
        const checked = await this.options.mirror.check(source.model, source.version, source.file).catch(() => null);
        if (checked?.kind !== "elsewhere" || !checked.holders.some((holder) => holder.live)) continue;
      }
      copying = true;
      this.copying.add(key);
      this.options.logger.info({ model: model.name, version: key }, "copying mirrored files from the server that holds them");
      void replicate(source.model, source.version, {})
        .then(
          (summary) => this.options.logger.info({ version: key, copied: summary.copied, failed: summary.failed }, "mirrored files copied from another server"),
          (copyError: unknown) =>
            this.options.logger.warn(
              { version: key, err: describeError(copyError) },
              "could not copy mirrored files from another server; trying again at the next pass",
            ),
        )
        .finally(() => {
          this.copying.delete(key);
          this.options.onCopied?.();
        });
    }
    return copying;
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

  adaptersOf(modelId: string): AssignedAdapter[] {
    return this.weightsOf(modelId)?.adapters ?? [];
  }

  /** How a model's replicas can run: each engine profile with what it needs, highest priority (then weight) first; null while unknown. */
  optionsFor(model: CatalogModel): PlacementOption[] | null {
    const weights = this.weightsOf(model.id);
    if (weights === undefined) return null;
    return [...model.definition.profiles]
      .filter((profile) => profile.engine !== "external")
      .sort((a, b) => b.priority - a.priority || b.weight - a.weight)
      .map((profile) => ({
        profile: profile.name,
        needs: replicaNeeds({
          profile,
          weightsBytes: weights.bytes,
          ...(weights.header ? { header: weights.header } : {}),
          ...(weights.projectorBytes === undefined ? {} : { projectorBytes: weights.projectorBytes }),
          ...(weights.adapters.length === 0
            ? {}
            : {
                adapterBytes: weights.adapters.reduce((sum, adapter) => sum + (adapter.bytes ?? 0), 0),
                ...(profile.engine === "vllm" ? { vllmLoraReserveBytes: vllmLoraReserveBytes(weights.adapters) } : {}),
              }),
        }),
      }));
  }

  private weightsOf(modelId: string): ModelWeights | undefined {
    const info = this.known.get(modelId);
    return info !== undefined && "weights" in info ? info.weights : undefined;
  }
}
