// Replica records: what the reconciler placed where, and what the nodes report of it. The
// store's `replicas` rows are the truth (a restarted server reads them back and keeps
// routing to the engines its agents kept running); this module reads and writes them, in
// order, with the engine key sealed (core/secret-box.ts) so the database never holds one
// in clear. The gateway's in-memory ReplicaTable is fed from these records by the fleet.
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { SecretBox } from "../core/secret-box.ts";
import { nowIso, type Store, type Tx } from "../store/store.ts";
import type { Fence } from "../cluster/leadership.ts";
import type { ReplicaEndpoint, ReplicaState } from "./replica-table.ts";
import type { AssignedAdapter, AssignedFile } from "./agent-protocol.ts";
import type { ReplicaNeeds } from "./fleet-types.ts";
import type { ModelDefinition } from "../catalog/model-schema.ts";

type WeightsSource = NonNullable<ModelDefinition["source"]>;

export interface ReplicaRecord {
  id: string;
  modelId: string;
  profile: string;
  engine: "llamacpp" | "vllm";
  /** The head node first. */
  nodeIds: string[];
  gpus: Record<string, number[]>;
  fingerprint: string;
  /** What it takes of its nodes, as placed (its room is held until the node confirms it stopped). */
  needs: ReplicaNeeds | null;
  /** The weights files it was placed with, with their published size and sha256. */
  files: AssignedFile[];
  /** The adapters it was placed with, pinned (absent in rows stored before adapters existed). */
  adapters?: AssignedAdapter[];
  /**
   * The weights source it was placed with; null for rows stored before it was kept (they
   * follow the model's). An old replica held through an update keeps loading its own.
   */
  source: WeightsSource | null;
  /** What the node is told: run it, or stop it (the row goes once the node no longer has it). */
  desired: "run" | "stop";
  /** null only for a row whose sealed key could not be opened (another server secret): it is replaced. */
  engineKey: string | null;
  state: ReplicaState;
  endpoint: ReplicaEndpoint | null;
  attempt: number;
  failures: number;
  lastError: string | null;
  startedAt: string | null;
  readyAt: string | null;
  weightsVerified: boolean;
  /**
   * Kept out of routing by an update that has not smoke-tested it yet (outdated-holds.ts).
   * Stored so that other servers, which route from the rows, keep out of it too.
   */
  unproven?: boolean;
  /** A replica over several nodes (not stored: the nodes report them again): the Ray head's GCS address, and each worker's state. */
  rayAddress?: string | null;
  workerStates?: Record<string, string>;
}

export class ReplicaRows {
  private chain: Promise<void> = Promise.resolve();

  /**
   * `fence`: where the fleet's writes go through when several servers share the store
   * (cluster/leadership.ts): a server that no longer leads has them refused.
   */
  constructor(private readonly options: { store: Store; box: SecretBox; logger: Logger; clock?: () => number; fence?: Fence }) {}

  async load(): Promise<ReplicaRecord[]> {
    const rows = await this.options.store.db.selectFrom("replicas").selectAll().execute();
    return rows.map((row): ReplicaRecord => {
      const endpoint = row.endpoint === null ? null : this.readEndpoint(row.id, row.endpoint);
      // A ready replica whose endpoint could not be read is not routable: it waits for its node's report.
      const state = row.state === "ready" && row.endpoint !== null && endpoint === null ? "starting" : (row.state as ReplicaState);
      return {
        id: row.id,
        modelId: row.model_id,
        profile: row.profile,
        // Not stored: the fleet takes it from the model's profile when it reads the rows back.
        engine: "llamacpp" as const,
        nodeIds: JSON.parse(row.node_ids) as string[],
        gpus: row.gpus === null ? {} : (JSON.parse(row.gpus) as Record<string, number[]>),
        fingerprint: row.fingerprint ?? "",
        ...readSpec(row.spec),
        desired: row.desired === "stop" ? "stop" : "run",
        engineKey: row.engine_key === null ? null : this.options.box.open(row.engine_key),
        state,
        endpoint,
        attempt: row.attempt,
        failures: row.failures,
        lastError: row.last_error,
        startedAt: row.started_at,
        readyAt: row.ready_at,
      };
    });
  }

  /**
   * A row's endpoint, or null (with a warning) when no URL can be read from it: a row
   * written before node addresses were checked (an IPv6 zone id) must not stop the fleet
   * from starting, on every restart and every takeover; only that replica is not routed to.
   */
  private readEndpoint(replicaId: string, text: string): ReplicaEndpoint | null {
    try {
      return splitEndpoint(text);
    } catch {
      this.options.logger.warn(
        { replica: replicaId, endpoint: text },
        "a replica's stored endpoint is no URL; it is not routed to until its node reports it again (on an address an admin may need to change: 'llmgw ctl node update')",
      );
      return null;
    }
  }

  /** Writes the record (insert or update); writes land in call order, a failure is logged. */
  save(record: ReplicaRecord): void {
    const row = {
      model_id: record.modelId,
      profile: record.profile,
      node_ids: JSON.stringify(record.nodeIds),
      endpoint: record.endpoint === null ? null : record.endpoint.origin + record.endpoint.basePath,
      engine_key: record.engineKey === null ? null : this.options.box.seal(record.engineKey),
      state: record.state,
      attempt: record.attempt,
      failures: record.failures,
      last_error: record.lastError,
      started_at: record.startedAt,
      ready_at: record.readyAt,
      updated_at: nowIso(this.options.clock),
      fingerprint: record.fingerprint,
      gpus: JSON.stringify(record.gpus),
      spec: JSON.stringify({
        needs: record.needs,
        files: record.files,
        ...(record.adapters !== undefined && record.adapters.length > 0 ? { adapters: record.adapters } : {}),
        source: record.source,
        unproven: record.unproven === true,
        weightsVerified: record.weightsVerified,
      }),
      desired: record.desired,
    };
    this.enqueue(record.id, async (db) => {
      await db
        .insertInto("replicas")
        .values({ id: record.id, ...row })
        .onConflict((oc) => oc.column("id").doUpdateSet(row))
        .execute();
    });
  }

  delete(id: string): void {
    this.enqueue(id, async (db) => {
      await db.deleteFrom("replicas").where("id", "=", id).execute();
    });
  }

  /** Resolves when every write so far has reached the store (or failed and was logged). */
  flush(): Promise<void> {
    return this.chain;
  }

  private enqueue(id: string, write: (db: Store["db"] | Tx) => Promise<void>): void {
    const fence = this.options.fence;
    this.chain = this.chain.then(async () => {
      try {
        if (fence === undefined) await write(this.options.store.db);
        else await fence.write(write);
      } catch (error) {
        this.options.logger.warn({ replica: id, err: describeError(error) }, "could not record the replica in the store");
      }
    });
  }
}

function readSpec(text: string | null): Pick<ReplicaRecord, "needs" | "files" | "adapters" | "source" | "unproven" | "weightsVerified"> {
  if (text === null) return { needs: null, files: [], source: null, unproven: false, weightsVerified: false };
  const parsed = JSON.parse(text) as {
    needs?: ReplicaNeeds | null;
    files?: AssignedFile[];
    adapters?: AssignedAdapter[];
    source?: WeightsSource | null;
    unproven?: boolean;
    weightsVerified?: boolean;
  };
  return {
    needs: parsed.needs ?? null,
    files: parsed.files ?? [],
    ...(parsed.adapters === undefined ? {} : { adapters: parsed.adapters }),
    source: parsed.source ?? null,
    unproven: parsed.unproven === true,
    weightsVerified: parsed.weightsVerified === true,
  };
}

function splitEndpoint(text: string): ReplicaEndpoint {
  const url = new URL(text);
  return { origin: url.origin, basePath: url.pathname.replace(/\/+$/, "") };
}
