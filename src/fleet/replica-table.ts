// The replica table: every replica the server routes to, with its state and endpoint, in
// memory because the gateway reads it on every request. It is a cache: the fleet
// (fleet.ts) feeds it from the replica records whose rows in the store are the truth, and
// the external-profile sync adds one always-ready replica per external profile.

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
  /**
   * The served names of the adapters its engine loaded, in their order (their ids there):
   * the replica's own list, which differs from the catalog's while a change rolls out.
   */
  adapters?: readonly string[];
  weight: number;
  /** The profile's priority: the gateway prefers ready replicas of the highest (default 0). */
  priority?: number;
  /**
   * An external server the gateway does not trust to keep to max_tokens (its profile did not
   * say `trust_max_tokens`): a non-stream request with an output bound runs as a stream there.
   */
  untrustedOutput?: boolean;
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

export class ReplicaTable {
  private readonly replicas = new Map<string, Replica>();
  private readonly byModel = new Map<string, Replica[]>();
  private readonly listeners = new Set<ReplicaListener>();

  /** Adds or replaces a replica (by id) and tells listeners. */
  upsert(replica: Replica): void {
    const copy = { ...replica, nodeIds: [...replica.nodeIds] };
    this.replicas.set(copy.id, copy);
    this.reindex(copy.modelId);
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

  private reindex(modelId: string): void {
    const list = [...this.replicas.values()].filter((r) => r.modelId === modelId);
    if (list.length === 0) this.byModel.delete(modelId);
    else this.byModel.set(modelId, list);
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
