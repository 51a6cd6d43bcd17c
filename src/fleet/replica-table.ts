// The replica table: every replica the server knows, with its state and endpoint. Agents
// (the local one inside `up`, remote ones later) and the external-profile sync write it;
// the gateway reads it on every request to pick a ready replica, so reads are in memory.
// Each change is also written through to the store's `replicas` table (state, attempt,
// last error), which is what the admin API and other servers read.
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { nowIso, type Store } from "../store/store.ts";

export type ReplicaState = "pending" | "placed" | "fetching" | "starting" | "ready" | "stopping" | "stopped" | "failed" | "parked";

export interface ReplicaEndpoint {
  /** scheme://host:port of the engine or external server. */
  origin: string;
  /** Path prefix before /v1 (empty for engines; an external URL may have one). */
  basePath: string;
}

export interface Replica {
  id: string;
  modelId: string;
  modelName: string;
  profile: string;
  engine: "llamacpp" | "vllm" | "external";
  nodeIds: string[];
  state: ReplicaState;
  endpoint: ReplicaEndpoint | null;
  /** Sent to the engine as a Bearer token; never leaves the server. */
  engineKey: string | null;
  /** The model name the engine or external server expects in request bodies. */
  upstreamModel: string;
  weight: number;
  /**
   * Requests the replica serves at once: an engine's parallel sequences, an external
   * server's max_inflight. The gateway never has more in flight there; the rest wait in
   * the model's queue.
   */
  slots: number;
  attempt: number;
  failures: number;
  lastError: string | null;
  startedAt: string | null;
  readyAt: string | null;
}

/** A replica as the admin API shows it: no engine key. */
export type ReplicaView = Omit<Replica, "engineKey">;

export type ReplicaListener = (replica: Replica, removed: boolean) => void;

export interface ReplicaTableOptions {
  store?: Store;
  logger?: Logger;
  clock?: () => number;
}

export class ReplicaTable {
  private readonly replicas = new Map<string, Replica>();
  private readonly byModel = new Map<string, Replica[]>();
  private readonly listeners = new Set<ReplicaListener>();
  private persistChain: Promise<void> = Promise.resolve();

  constructor(private readonly options: ReplicaTableOptions = {}) {}

  /** Adds or replaces a replica (by id) and tells listeners. */
  upsert(replica: Replica): void {
    const copy = { ...replica, nodeIds: [...replica.nodeIds] };
    this.replicas.set(copy.id, copy);
    this.reindex(copy.modelId);
    this.persist(copy, false);
    for (const listener of this.listeners) listener(copy, false);
  }

  /** Changes some fields of a known replica; unknown ids are ignored (it was removed). */
  update(id: string, change: Partial<Omit<Replica, "id" | "modelId">>): void {
    const current = this.replicas.get(id);
    if (current === undefined) return;
    this.upsert({ ...current, ...change });
  }

  remove(id: string): void {
    const current = this.replicas.get(id);
    if (current === undefined) return;
    this.replicas.delete(id);
    this.reindex(current.modelId);
    this.persist(current, true);
    for (const listener of this.listeners) listener(current, true);
  }

  get(id: string): Replica | undefined {
    return this.replicas.get(id);
  }

  forModel(modelId: string): readonly Replica[] {
    return this.byModel.get(modelId) ?? [];
  }

  all(): Replica[] {
    return [...this.replicas.values()];
  }

  onChange(listener: ReplicaListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /**
   * Removes the stored rows of a node's replicas from an earlier run of its agent: those
   * processes are gone. Other nodes' rows (other servers sharing the database) stay.
   */
  async forgetNode(nodeId: string): Promise<void> {
    const store = this.options.store;
    if (store === undefined) return;
    await store.db.deleteFrom("replicas").where("node_ids", "like", `%${JSON.stringify(nodeId)}%`).execute();
  }

  /** Resolves when every write-through so far has reached the store. */
  flush(): Promise<void> {
    return this.persistChain;
  }

  private reindex(modelId: string): void {
    const list = [...this.replicas.values()].filter((r) => r.modelId === modelId);
    if (list.length === 0) this.byModel.delete(modelId);
    else this.byModel.set(modelId, list);
  }

  /** Writes are chained so they land in order; a failed write is logged, never thrown at the writer. */
  private persist(replica: Replica, removed: boolean): void {
    const store = this.options.store;
    // External replicas follow from the catalog; every server derives them itself.
    if (store === undefined || replica.engine === "external") return;
    const now = nowIso(this.options.clock);
    this.persistChain = this.persistChain.then(async () => {
      try {
        if (removed) {
          await store.db.deleteFrom("replicas").where("id", "=", replica.id).execute();
          return;
        }
        const row = {
          model_id: replica.modelId,
          profile: replica.profile,
          node_ids: JSON.stringify(replica.nodeIds),
          endpoint: replica.endpoint === null ? null : replica.endpoint.origin + replica.endpoint.basePath,
          // Keys stay in memory: an engine key dies with its process, and an external
          // profile's key already lives in the catalog. A copy here would only be one more
          // place a secret sits in clear.
          engine_key: null,
          state: replica.state,
          attempt: replica.attempt,
          failures: replica.failures,
          last_error: replica.lastError,
          started_at: replica.startedAt,
          ready_at: replica.readyAt,
          updated_at: now,
        };
        await store.db
          .insertInto("replicas")
          .values({ id: replica.id, ...row })
          .onConflict((oc) => oc.column("id").doUpdateSet(row))
          .execute();
      } catch (error) {
        this.options.logger?.warn({ replica: replica.id, err: describeError(error) }, "could not record the replica state in the store");
      }
    });
  }
}

export function viewReplica({ engineKey: _secret, ...rest }: Replica): ReplicaView {
  return rest;
}

/** Splits an external URL into origin and the path before /v1 ("https://h/v1" and "https://h" both work). */
export function endpointFromUrl(url: string): ReplicaEndpoint {
  const parsed = new URL(url);
  const basePath = parsed.pathname.replace(/\/+$/, "").replace(/\/v1$/, "");
  return { origin: parsed.origin, basePath };
}
