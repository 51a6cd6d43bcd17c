// The shapes the fleet speaks in: what a node reports (its inventory, its replicas'
// states) and what it is told (its assignments), plus what placement reads and decides.
// They travel unchanged as JSON over /agent/v1 (`llmgw agent`) and in-process (`llmgw up`),
// so a laptop and a fleet run the same code (DESIGN.md "The fleet seam").

/** One GPU of a node, as `nvidia-smi --query-gpu=index,name,memory.total` reports it. */
export interface GpuInventory {
  index: number;
  /** The name the driver reports, for example "NVIDIA H200". */
  name: string;
  /** The normalised name placement matches profiles against, for example "H200" (see normalizeGpuClass). */
  class: string;
  memoryBytes: number;
}

/** Engines a node can run: the bundled llama.cpp, its own llama-server, vLLM. */
export type EngineName = "llamacpp" | "llama-server" | "vllm";

export interface EngineInventory {
  engine: EngineName;
  version: string;
}

export interface NodeInventory {
  cores: number;
  memoryBytes: number;
  gpus: GpuInventory[];
  engines: EngineInventory[];
  /**
   * What this node's agent can do beyond what every agent does (AGENT_FEATURES), so a
   * server places work that needs it only on agents that understand it. Absent: an agent
   * from before features were reported.
   */
  features?: string[];
}

/**
 * What agents of this version report: "adapters" — it loads a model's LoRA adapters and
 * checks them before every start. An older agent would start the base model alone and
 * serve it under every adapter's name.
 */
export const AGENT_FEATURES = ["adapters"];

export type NodeLabels = Record<string, string>;

/** ready: takes replicas; lost: missed heartbeats; draining: an operator is emptying it. */
export type NodeState = "ready" | "lost" | "draining";

/** What one replica needs of a node, from its profile and the model's weights. */
export interface ReplicaNeeds {
  /**
   * The catalog profile's engine. llamacpp runs on the bundled engine or a node's
   * llama-server; GPU profiles, and those with `llamaServerArgs`, need llama-server.
   */
  engine: "llamacpp" | "vllm";
  /**
   * llamacpp: the profile passes engine_args, which are llama-server's options (the
   * bundled engine takes none), so it runs only on nodes with llama-server. Absent: it
   * passes none, or the needs were stored before this was known.
   */
  llamaServerArgs?: true;
  /** llamacpp: the model has a vision projector, which only llama-server loads (--mmproj). */
  projector?: true;
  /** The model has LoRA adapters: only agents reporting the "adapters" feature load them. */
  adapters?: true;

  /** CPU profiles: memory on each node. */
  memoryBytes: number;
  /**
   * CPU cores reserved on each node: the profile's exact request, else a share that follows
   * the memory, in quarters from 0.25 to 1 (plan/cpu-share.ts); 1 for a GPU replica's host.
   */
  cores: number;
  /** GPU profiles: whole GPUs of one class, never shared with another replica. */
  gpu?: { class: string; perNode: number; nodes: number; memoryBytesPerGpu: number };
}

/** One way to run a replica: a profile of the model and what it needs. */
export interface PlacementOption {
  profile: string;
  needs: ReplicaNeeds;
}

/** A replica to place: its options in order of preference (priority, then weight). */
export interface PlacementRequest {
  /** The replica's id. */
  key: string;
  modelId: string;
  modelName: string;
  options: PlacementOption[];
  /** Identifies the weights (for example "mirror:qwen/abc123"); nodes that hold them are preferred. */
  weightsKey: string | null;
}

/** A node as placement sees it: what it has and what its current replicas already take. */
export interface PlacementNode {
  id: string;
  name: string;
  state: NodeState;
  inventory: NodeInventory;
  labels: NodeLabels;
  used: {
    memoryBytes: number;
    cores: number;
    /** Indexes of GPUs held by a replica. */
    gpus: number[];
  };
  /** Models with a replica on this node (replicas of one model spread over nodes first). */
  models: ReadonlySet<string>;
  /** weightsKeys of files already in this node's cache. */
  cachedWeights: ReadonlySet<string>;
}

export interface PlacedReplica {
  key: string;
  profile: string;
  /** One node, or several for a pipeline-parallel vLLM replica (the first is the head). */
  nodeIds: string[];
  /** GPU indexes taken on each node. */
  gpus: Record<string, number[]>;
}

export interface UnplaceableReplica {
  key: string;
  modelId: string;
  modelName: string;
  /** One line per node saying what it lacks, e.g. "node-a: 7.8 GB free, needs 12.1 GB". */
  explanation: string[];
}

export interface PlacementResult {
  placed: PlacedReplica[];
  unplaceable: UnplaceableReplica[];
}
