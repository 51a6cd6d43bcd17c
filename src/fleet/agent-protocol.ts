// The agent protocol: the one interface between the server's fleet and a node's agent
// (DESIGN.md "The fleet seam"). `llmgw agent` speaks it over HTTP under /agent/v1
// (agent/http-assignments.ts ↔ fleet/agent-routes.ts); `llmgw up` hands its in-process
// agent the server's Fleet itself. Either way the same calls carry the same JSON, so what
// `up` does, a fleet does.
//
//   join        join token + who the node is      → node id + node credential (kept on the node)
//   heartbeat   credential + inventory + replicas   → node state, assignment version
//               (refused whole, 409 node_address_mismatch, when it names another address than the node's)
//   assignments credential + the version it has     → the replicas this node must run (long poll)
import { z } from "zod";
import type { ModelDefinition, Profile } from "../catalog/model-schema.ts";
import type { NodeInventory, NodeLabels, NodeState } from "./fleet-types.ts";
import { addressProblem } from "./node-address.ts";

export interface JoinRequest {
  joinToken: string;
  name: string;
  /** Where the gateway reaches this node's engines (a host name or IP, no port). */
  address: string;
  inventory: NodeInventory;
  labels: NodeLabels;
}

export interface JoinReply {
  nodeId: string;
  name: string;
  /** The node's own credential: kept in the agent's data dir, sent as Bearer on every later call. */
  credential: string;
}

/** A replica as its agent sees it. `fetching`: weights are coming to the node's cache. */
export type ReportedState = "fetching" | "starting" | "ready" | "failed" | "parked" | "stopping" | "stopped";

export interface ReplicaReport {
  id: string;
  state: ReportedState;
  /** Where the engine listens while its process runs. */
  endpoint: { host: string; port: number } | null;
  attempt: number;
  failures: number;
  lastError: string | null;
  lastErrorCode: string | null;
  /** Epoch ms. */
  startedAt: number | null;
  readyAt: number | null;
  /** Whether the weights passed the identity check (size and sha256) before the current start. */
  weightsVerified: boolean;
  /** A replica over several nodes, from its head: the Ray head's GCS address once it is up. */
  rayAddress?: string | null;
}

export interface HeartbeatReport {
  name: string;
  /** The address the node joined with (or an admin set): a report with another one is refused whole (node-address.ts). */
  address: string;
  inventory: NodeInventory;
  labels: NodeLabels;
  replicas: ReplicaReport[];
  /** weightsKeys of the weights this node holds (placement prefers such nodes). */
  cached?: string[];
  /** Differs for each start of the agent: a new one has none of the engines the last one ran. */
  agentRun?: string;
}

export interface HeartbeatReply {
  nodeId: string;
  state: NodeState;
  /** The node's assignment version now; an agent that holds another one polls. */
  assignmentsVersion: string;
  /** How often the server expects a heartbeat. */
  heartbeatIntervalMs: number;
}

/** One file of the weights and what it must be (from the mirror's verified rows). */
export interface AssignedFile {
  /** Path inside the mirrored version (or the absolute path of a file source). */
  file: string;
  bytes: number | null;
  sha256: string | null;
}

/**
 * A LoRA adapter the replica's engine loads beside the weights (model-schema.ts `adapters`),
 * in the model's order: its position is the id requests select it by. Pinned like weights:
 * a node checks size and sha256 before every start. A vLLM adapter folder has no sha256 of
 * its own: `files` pins each of its files, and the folder must hold exactly those.
 */
export interface AssignedAdapter {
  name: string;
  /** The model name clients ask for it by (vLLM serves it under this name). */
  servedName: string;
  scale: number;
  source: { kind: "file"; path: string } | { kind: "mirror"; model: string; version: string; file: string };
  bytes: number | null;
  sha256: string | null;
  /** A vLLM adapter folder's files ('/'-separated paths inside it), each with its size and sha256. */
  files?: { file: string; bytes: number; sha256: string }[];
  /** A vLLM adapter's LoRA rank (adapter_config.json `r`), for --max-lora-rank. */
  rank?: number;
}

export interface Assignment {
  replicaId: string;
  modelId: string;
  modelName: string;
  profile: Profile;
  /** The key the engine must require; the gateway sends it. Only this node is told. */
  engineKey: string;
  /** Changes whenever the model's definition changes in a way that needs a new replica. */
  fingerprint: string;
  source: NonNullable<ModelDefinition["source"]>;
  /** The source file first, then the other parts of a split GGUF. */
  files: AssignedFile[];
  /** The model's LoRA adapters, when it has any. */
  adapters?: AssignedAdapter[];
  /** GPU indexes this replica holds on this node. */
  gpus: number[];
  /** Every node of the replica, the head first (several only for a pipeline-parallel vLLM replica). */
  nodeIds: string[];
  /**
   * A vLLM replica over several nodes runs on a Ray cluster of its own: the head node runs
   * the Ray head and, once every worker has joined it, `vllm serve`; each other node runs a
   * Ray worker that joins the head's address (reference/engines.md, "vLLM").
   */
  ray?: RayPart;
}

export interface RayPart {
  role: "head" | "worker";
  /** HOST:PORT of the head's GCS, once the head reported it; a worker waits for it. */
  headAddress: string | null;
  /** Whether every worker reported its Ray worker ready; the head starts vLLM then. */
  workersReady: boolean;
}

export interface AssignmentSet {
  version: string;
  assignments: Assignment[];
}

export interface Assignments {
  join(request: JoinRequest): Promise<JoinReply>;
  heartbeat(credential: string, report: HeartbeatReport): Promise<HeartbeatReply>;
  /** Answers at once when `knownVersion` differs from the node's; otherwise when it changes, or after `waitMs` with the same set. */
  assignments(credential: string, options: { knownVersion: string | null; waitMs: number; signal: AbortSignal }): Promise<AssignmentSet>;
}

// --- What arrives over HTTP, checked at the door ------------------------------------------

const labelsSchema = z.record(z.string().max(63), z.string().max(63));

export const nodeNameSchema = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, "must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit");

/** A node's address: a host name or an IP, without scheme, port, path or IPv6 zone id (node-address.ts says why one is not; the fleet keeps it canonical). */
export const addressSchema = z
  .string()
  .max(255)
  .superRefine((value, ctx) => {
    const problem = addressProblem(value);
    if (problem !== null) ctx.addIssue({ code: "custom", message: problem });
  });

export const joinBodySchema = z.strictObject({
  join_token: z.string().min(1, "is required: the server's join token ('llmgw ctl node join-token')"),
  name: nodeNameSchema,
  address: addressSchema,
  inventory: z.unknown(),
  labels: labelsSchema.default({}),
});

const reportSchema = z.strictObject({
  id: z.string().min(1).max(100),
  state: z.enum(["fetching", "starting", "ready", "failed", "parked", "stopping", "stopped"]),
  endpoint: z.strictObject({ host: z.string().min(1).max(255), port: z.number().int().min(1).max(65535) }).nullable(),
  attempt: z.number().int().min(0),
  failures: z.number().int().min(0),
  lastError: z.string().max(20_000).nullable(),
  lastErrorCode: z.string().max(100).nullable(),
  startedAt: z.number().nullable(),
  readyAt: z.number().nullable(),
  weightsVerified: z.boolean().default(false),
  rayAddress: z.string().max(300).nullable().optional(),
});

export const heartbeatBodySchema = z.strictObject({
  name: nodeNameSchema,
  address: addressSchema,
  inventory: z.unknown(),
  labels: labelsSchema.default({}),
  replicas: z.array(reportSchema).max(10_000),
  cached: z.array(z.string().max(2000)).max(10_000).optional(),
  agentRun: z.string().max(100).optional(),
});
