// The fleet as a server that does not lead sees it: the leader's replica rows, parking and
// nodes, read from the store whenever the change feed says they changed (and at resyncs).
// It keeps the gateway's ReplicaTable equal to the rows, so this server routes to every
// replica the leader placed, with the engine keys opened by the cluster secret; and it
// answers what the gateway and the admin API ask of the fleet (parking, node credentials
// for mirror downloads) without the reconciler, which only the leader runs.
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { SecretBox } from "../core/secret-box.ts";
import type { Catalog } from "../catalog/catalog.ts";
import type { Store } from "../store/store.ts";
import { NodeRegistry, type FleetNode } from "../fleet/node-registry.ts";
import { ParkedModels } from "../fleet/parked-models.ts";
import { ReplicaRows, type ReplicaRecord } from "../fleet/replica-rows.ts";
import type { ReplicaTable } from "../fleet/replica-table.ts";
import { tableEntryOf } from "../fleet/record-projections.ts";
import { isExternalReplicaId } from "../fleet/external-replicas.ts";
import type { ModelFleetStatus } from "../fleet/fleet.ts";
import { scalingDecisionView, scalingPolicyOf, type AutoscalingView } from "../fleet/autoscaling.ts";
import { wantedReplicas } from "../fleet/reconciler.ts";
import type { ChangeFeed, FollowedTable } from "./change-feed.ts";

export class FleetFollower {
  private records = new Map<string, ReplicaRecord>();
  private parked: ParkedModels;
  /** Autoscaled models' replicas wanted and last decision, as the leader recorded them (`model_scaling`). */
  private scaling = new Map<string, { desired: number; last: AutoscalingView["last"] }>();
  private registry: NodeRegistry;
  private unsubscribe: (() => void) | undefined;
  /** The reload in progress: `stop` waits for it, so it cannot overwrite what a new leader's Fleet publishes. */
  private reloading: Promise<void> = Promise.resolve();
  private following = false;
  private readonly rows: ReplicaRows;
  private readonly clock: () => number;

  constructor(
    private readonly options: {
      store: Store;
      box: SecretBox;
      catalog: Catalog;
      replicas: ReplicaTable;
      feed: ChangeFeed;
      joinToken: () => string;
      logger: Logger;
      clock?: () => number;
    },
  ) {
    this.clock = options.clock ?? Date.now;
    this.rows = new ReplicaRows({ store: options.store, box: options.box, logger: options.logger, clock: this.clock });
    this.parked = this.newParked();
    this.registry = this.newRegistry();
  }

  /** Follows the changes, then reads everything once (a change meanwhile is read again after). */
  async start(): Promise<void> {
    if (this.following) return;
    this.following = true;
    const unsubscribeRows = this.options.feed.subscribe(["replicas", "model_states", "nodes", "model_scaling"], (tables) => this.reload(tables));
    // The catalog follows its own rows; a change there renames or reweighs entries, from the records already read.
    const unsubscribeCatalog = this.options.catalog.onChange(() => {
      if (this.following) this.sync([...this.records.values()]);
    });
    this.unsubscribe = () => {
      unsubscribeRows();
      unsubscribeCatalog();
    };
    await this.reload(new Set(["replicas", "model_states", "nodes", "model_scaling"])).catch((error: unknown) => {
      this.options.logger.warn({ err: describeError(error) }, "could not read the fleet's rows; reading them again at the next resync");
      this.options.feed.resync();
    });
  }

  /** Stops following, once a reload in progress is over; the table keeps its entries (a new leader takes them over). */
  async stop(): Promise<void> {
    this.following = false;
    this.unsubscribe?.();
    this.unsubscribe = undefined;
    await this.reloading;
  }

  get nodes(): NodeRegistry {
    return this.registry;
  }

  status(modelId: string): ModelFleetStatus {
    // Placement and weights problems are the leader's to know; the follower says "none".
    // Autoscaling as the leader last recorded it; the load is the leader's to read. An
    // on-demand model is awake while the leader keeps a replica of it running.
    const model = this.options.catalog.list().find((m) => m.id === modelId);
    const policy = model === undefined ? null : scalingPolicyOf(model);
    const scaled = this.scaling.get(modelId);
    const awake = [...this.records.values()].some((record) => record.modelId === modelId && record.desired === "run");
    const desired = model === undefined ? 0 : wantedReplicas(model, awake ? 1 : 0, scaled?.desired);
    const autoscaling =
      policy === null
        ? null
        : {
            min: policy.min,
            max: policy.max,
            target: policy.target,
            up_after: policy.upAfterMs / 1000,
            down_after: policy.downAfterMs / 1000,
            load: null,
            desired,
            last: scaled?.last ?? null,
          };
    return { parked: this.parked.get(modelId) ?? null, unplaceable: null, weightsProblem: null, desired, autoscaling };
  }

  /** Whether an on-demand model may be getting a replica from the leader (it is not parked). */
  startsOnDemand(modelId: string): boolean {
    const model = this.options.catalog.list().find((m) => m.id === modelId);
    return model !== undefined && model.definition.scaling.min === 0 && !this.parked.has(modelId);
  }

  weightsVerified(replicaId: string): boolean {
    return this.records.get(replicaId)?.weightsVerified ?? false;
  }

  nodeList(): FleetNode[] {
    return this.registry.list();
  }

  private reload(tables: ReadonlySet<FollowedTable>): Promise<void> {
    const run = this.reloading.then(() => (this.following ? this.read(tables) : undefined));
    this.reloading = run.catch(() => undefined);
    return run;
  }

  /** Reads the tables; a failure is thrown, so the change feed asks again (resync at the latest). */
  private async read(tables: ReadonlySet<FollowedTable>): Promise<void> {
    if (tables.has("model_states")) {
      const parked = this.newParked();
      await parked.load();
      this.parked = parked;
    }
    if (tables.has("model_scaling")) {
      const rows = await this.options.store.db.selectFrom("model_scaling").selectAll().execute();
      this.scaling = new Map(rows.map((row) => [row.model_id, { desired: row.desired, last: scalingDecisionView(row.last_decision) }]));
    }
    if (tables.has("nodes")) {
      const registry = this.newRegistry();
      await registry.load();
      this.registry = registry;
    }
    if (tables.has("replicas")) {
      const records = await this.rows.load();
      // Stopped meanwhile (this server took the lead): the new Fleet owns the table now.
      if (this.following) this.sync(records);
    }
  }

  /** Makes the table equal to the rows: what the leader placed, in the states it recorded. */
  private sync(records: ReplicaRecord[]): void {
    const models = new Map(this.options.catalog.list().map((model) => [model.id, model]));
    const seen = new Set<string>();
    for (const record of records) {
      const model = models.get(record.modelId);
      record.engine = model?.definition.profiles.find((p) => p.name === record.profile)?.engine === "vllm" ? "vllm" : "llamacpp";
      seen.add(record.id);
      this.options.replicas.upsert(tableEntryOf(record, model, this.options.replicas.get(record.id), record.desired === "stop", record.unproven === true));
    }
    for (const replica of this.options.replicas.all()) {
      // External replicas (catalog endpoints) are not the fleet's: they have no rows.
      if (!seen.has(replica.id) && !isExternalReplicaId(replica.id)) this.options.replicas.remove(replica.id);
    }
    this.records = new Map(records.map((record) => [record.id, record]));
  }

  private newParked(): ParkedModels {
    return new ParkedModels({ store: this.options.store, logger: this.options.logger, clock: this.clock });
  }

  private newRegistry(): NodeRegistry {
    return new NodeRegistry({ store: this.options.store, joinToken: this.options.joinToken, logger: this.options.logger, clock: this.clock });
  }
}
