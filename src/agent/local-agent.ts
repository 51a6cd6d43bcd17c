// The agent that runs inside `llmgw up`: it keeps the replicas of this machine's models
// running. For every catalog model with a llama.cpp profile and a local weights file it
// runs `scaling.min` replicas of the bundled engine, each under its own EngineSupervisor
// (process group, free port, fresh engine key, readiness, backoff, parking), and mirrors
// each supervisor's state into the replica table the gateway routes from. A model whose
// definition changes gets new replicas (which also clears parking); a deleted model's
// replicas stop. The remote `llmgw agent` of the fleet issue reuses the supervisor and
// engine launch; only where the assignments come from differs.
import { randomBytes } from "node:crypto";
import { BadRequestError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { formatHost } from "../core/format.ts";
import type { Catalog, CatalogModel } from "../catalog/catalog.ts";
import type { Profile } from "../catalog/model-schema.ts";
import { checkWeightsFile, locateWeights, type MirrorLocator } from "../catalog/weights-check.ts";
import type { ReplicaState, ReplicaTable } from "../fleet/replica-table.ts";
import { llamaCppLaunch, llamaCppSlots } from "../engines/llamacpp/engine-launch.ts";
import { EngineSupervisor, pruneRunFolders, type SupervisorOptions, type SupervisorSnapshot } from "./engine-supervisor.ts";

export interface LocalAgentOptions {
  catalog: Catalog;
  replicas: ReplicaTable;
  logger: Logger;
  /** Engine run folders go below this (DATA_DIR/runs). */
  stateRoot: string;
  nodeId: string;
  /** Where mirror sources are found (the server's mirror, in `up`). */
  mirror?: MirrorLocator;
  host?: string;
  /** Supervisor timings; tests shorten them. */
  supervisor?: Partial<Pick<SupervisorOptions, "readyTimeoutMs" | "healthIntervalMs" | "stopGraceMs" | "backoff" | "parkAfter" | "livenessIntervalMs">>;
}

interface RunningReplica {
  id: string;
  modelId: string;
  modelName: string;
  /** What the replica was started from; a different fingerprint means replace it. */
  fingerprint: string;
  /** The model's updated_at when the replica was started or last unparked. */
  definitionAt: string;
  supervisor: EngineSupervisor;
  unsubscribe: () => void;
}

export class LocalAgent {
  private readonly running = new Map<string, RunningReplica>();
  private unsubscribeCatalog: (() => void) | undefined;
  private reconciling: Promise<void> = Promise.resolve();
  private stopped = false;

  constructor(private readonly options: LocalAgentOptions) {}

  async start(): Promise<void> {
    // Old run folders (attempt logs) would pile up forever; keep the newest few.
    void pruneRunFolders({ stateRoot: this.options.stateRoot, logger: this.options.logger }).catch((error: unknown) =>
      this.options.logger.warn({ err: describeError(error) }, "could not prune old engine run folders"),
    );
    // Rows of this node from an earlier run describe engine processes that are gone.
    await this.options.replicas.forgetNode(this.options.nodeId);
    this.unsubscribeCatalog = this.options.catalog.onChange((models) => this.schedule(models));
    this.schedule(this.options.catalog.list());
  }

  /** Unparks the parked replicas of a model; returns how many. */
  async unpark(modelName: string): Promise<number> {
    let count = 0;
    for (const replica of this.running.values()) {
      if (replica.modelName === modelName && replica.supervisor.unpark()) count += 1;
    }
    return count;
  }

  /** The engine processes this agent runs now (for diagnostics and tests). */
  engineProcesses(): Array<{ replicaId: string; modelName: string; pid: number }> {
    return [...this.running.values()].flatMap((replica) => {
      const pid = replica.supervisor.snapshot().pid;
      return pid === null ? [] : [{ replicaId: replica.id, modelName: replica.modelName, pid }];
    });
  }

  /** Stops every engine (SIGTERM to each group, SIGKILL after the grace). */
  async stop(): Promise<void> {
    this.stopped = true;
    this.unsubscribeCatalog?.();
    await this.reconciling;
    await Promise.all([...this.running.values()].map((replica) => this.retire(replica)));
  }

  /** Reconciliations run one after another, so two quick catalog changes cannot interleave. */
  private schedule(models: readonly CatalogModel[]): void {
    this.reconciling = this.reconciling
      .then(() => (this.stopped ? undefined : this.reconcile(models)))
      .catch((error: unknown) => this.options.logger.error({ err: describeError(error) }, "local agent reconcile failed"));
  }

  private async reconcile(models: readonly CatalogModel[]): Promise<void> {
    const wanted = new Map<string, { model: CatalogModel; profile: Profile; fingerprint: string; slot: number }>();
    for (const model of models) {
      const profile = localProfile(model);
      if (profile === undefined) continue;
      const fingerprint = JSON.stringify({ name: model.name, source: model.definition.source, profile });
      for (let slot = 0; slot < model.definition.scaling.min; slot += 1) {
        wanted.set(`${model.id}/${slot}`, { model, profile, fingerprint, slot });
      }
    }
    const retiring: Promise<void>[] = [];
    for (const [slotKey, replica] of this.running) {
      const want = wanted.get(slotKey);
      if (want === undefined || want.fingerprint !== replica.fingerprint) {
        this.running.delete(slotKey);
        retiring.push(this.retire(replica));
      }
    }
    await Promise.all(retiring);
    for (const [slotKey, want] of wanted) {
      const running = this.running.get(slotKey);
      if (running === undefined) {
        this.running.set(slotKey, this.launch(want.model, want.profile, want.fingerprint));
      } else if (running.definitionAt !== want.model.updated_at) {
        // Any change to the model's definition ends parking (DESIGN.md "Replica lifecycle"),
        // even one that does not change how the engine runs (say, a description).
        running.definitionAt = want.model.updated_at;
        running.supervisor.unpark();
      }
    }
  }

  private launch(model: CatalogModel, profile: Profile, fingerprint: string): RunningReplica {
    const id = `r-${randomBytes(6).toString("hex")}`;
    const engineKey = randomBytes(24).toString("hex");
    const host = this.options.host ?? "127.0.0.1";
    const { replicas, logger } = this.options;
    // Resolved before every attempt: a mirrored file may complete (or vanish) in between.
    let weightsPath: string | null = null;

    replicas.upsert({
      id,
      modelId: model.id,
      modelName: model.name,
      profile: profile.name,
      engine: "llamacpp",
      nodeIds: [this.options.nodeId],
      state: "pending",
      endpoint: null,
      engineKey,
      upstreamModel: model.name,
      weight: profile.weight,
      slots: llamaCppSlots(profile).parallel,
      attempt: 0,
      failures: 0,
      lastError: null,
      startedAt: null,
      readyAt: null,
    });

    const supervisor = new EngineSupervisor({
      replicaId: id,
      stateRoot: this.options.stateRoot,
      host,
      logger,
      ...this.options.supervisor,
      preflight: async () => {
        // Where the weights are, and the catalog's check at the door again: the file may
        // have changed (or a mirrored one completed or vanished) since.
        const source = model.definition.source;
        if (source === undefined) throw new BadRequestError(`Model '${model.name}' has no weights source; give it a file or mirror source.`, { code: "weights_missing" });
        const located = await locateWeights({ source, modelName: model.name, ...(this.options.mirror ? { mirror: this.options.mirror } : {}) });
        weightsPath = located.file;
        await checkWeightsFile({ ...located, modelName: model.name });
      },
      prepare: ({ port }) => llamaCppLaunch({ weightsPath: weightsPath!, modelName: model.name, profile, engineKey, host, port }),
    });
    const unsubscribe = supervisor.onChange((snapshot) => replicas.update(id, fromSnapshot(snapshot)));
    supervisor.start();
    logger.info({ model: model.name, replica: id }, "starting replica");
    return { id, modelId: model.id, modelName: model.name, fingerprint, definitionAt: model.updated_at, supervisor, unsubscribe };
  }

  private async retire(replica: RunningReplica): Promise<void> {
    this.options.logger.info({ model: replica.modelName, replica: replica.id }, "stopping replica");
    await replica.supervisor.stop();
    replica.unsubscribe();
    this.options.replicas.remove(replica.id);
  }
}

/** The llama.cpp profile this machine runs for a model (highest priority first), if any. */
function localProfile(model: CatalogModel): Profile | undefined {
  if (model.definition.scaling.min === 0) return undefined;
  return [...model.definition.profiles].filter((p) => p.engine === "llamacpp").sort((a, b) => b.priority - a.priority)[0];
}

function fromSnapshot(snapshot: SupervisorSnapshot) {
  const state: ReplicaState = snapshot.state;
  return {
    state,
    endpoint: snapshot.endpoint === null ? null : { origin: `http://${formatHost(snapshot.endpoint.host)}:${snapshot.endpoint.port}`, basePath: "" },
    attempt: snapshot.attempt,
    failures: snapshot.failures,
    lastError: snapshot.lastError,
    startedAt: snapshot.startedAt === null ? null : new Date(snapshot.startedAt).toISOString(),
    readyAt: snapshot.readyAt === null ? null : new Date(snapshot.readyAt).toISOString(),
  };
}
