// Placement: which node (or nodes) runs each replica the reconciler wants, by the memory,
// cores and GPUs actually free, and, for a replica no node can take, one line per node
// saying what it lacks. It is pure and deterministic: the same nodes and requests give the
// same answer, so a reconciler pass can be repeated and tested; the caller's objects are
// never changed.
//
// Rules:
// - Only `ready` nodes take replicas; `lost` and `draining` ones are named in explanations.
// - Requests are placed in the order given (the reconciler puts the more important first),
//   each seeing what earlier ones took. A request's options are tried in order: the second
//   is used only when no node has room for the first.
// - CPU option: free memory (the node's memory less cpuReserveBytes, the same reserve the
//   planner uses, less what its replicas use) and free cores cover the need, and the node
//   has the engine (llamacpp: the bundled llama.cpp or llama-server, only llama-server when
//   the profile passes engine_args, which are its options; vllm: vLLM). Cores
//   may be fractions (a small model's share, plan/cpu-share.ts): a node takes replicas
//   while the sum of their cores stays within its own, and quarters add up exactly.
// - GPU option: `perNode` whole GPUs of the class (normalizeGpuClass on both sides), free,
//   each offering the engine `memoryBytesPerGpu`: vLLM claims 90% of a GPU
//   (--gpu-memory-utilization), llama.cpp loses 512 MiB to the CUDA context (the planner's
//   figures). A GPU held by a replica is never offered to another. `nodes` > 1 takes that
//   many distinct nodes (pipeline parallel; the first is the head). GPU llama.cpp needs the
//   node's llama-server, since the bundled llama.cpp is the CPU build. The replica's host
//   memory and cores are checked on each node as for a CPU option.
// - Among nodes that fit: first those without a replica of the model (a node's `models`
//   holds modelIds; replicas of one model on different nodes survive a node's loss; the
//   reconciler leaves out replicas being replaced, so an update's successors spread too,
//   and moves a replica when a model's replicas ended up together), then those that hold
//   the weights (no fetch), then the best fit (least free memory left; for GPUs the fewest free GPUs of the class
//   left, then the least memory), then the node's name. GPUs within a node: the smallest
//   that fit, then the lowest index.
// - An explanation gives each node's first shortfall per option: first what the node lacks
//   even when empty (engine, GPU class, GPU count, GPU memory, memory in all after its
//   reserve, cores in all), then what others use now (free GPUs, free memory, free cores).
//   Only the second kind says "free, needs" (ROOM_TAKEN): room that can free, which
//   `waitsForRoom` finds, so a serve job waits for it rather than failing, and never waits
//   for room no node has.
//
// Cost: one scan of the nodes per option tried, comparing numbers precomputed per node (free
// memory, cores, engines as bits, GPUs with their offers) and looking the request's model
// and weights up once in inverted indexes; strings are built only for requests that stay
// unplaceable (bench/fleet/placement.ts: 1,000 models onto 1,000 nodes).
//
// PlacedReplica.gpus has an entry for every node in nodeIds, empty for a CPU replica.
import { countOf, formatBytes } from "../core/format.ts";
import { vllmUsableBytes, VLLM_GPU_MEMORY_UTILIZATION } from "../gguf/memory-estimate.ts";
import { formatCores } from "../plan/cpu-share.ts";
import { cpuReserveBytes, LLAMA_CPP_GPU_RESERVE_BYTES } from "../plan/plan.ts";
import type { PlacedReplica, PlacementNode, PlacementOption, PlacementRequest, PlacementResult, UnplaceableReplica } from "./fleet-types.ts";
import { normalizeGpuClass } from "./gpu-class.ts";

export interface PlacementInput {
  nodes: PlacementNode[];
  requests: PlacementRequest[];
}

/**
 * What every explanation line of a shortfall that room freeing cures contains, and no other
 * line does (node and profile names hold no spaces or commas).
 */
export const ROOM_TAKEN = " free, needs ";

/**
 * Whether some node of an explanation has what the replica needs but others use it now:
 * the replica fits once a replica there stops, so it is worth waiting for.
 */
export function waitsForRoom(explanation: readonly string[]): boolean {
  return explanation.some((line) => line.includes(ROOM_TAKEN));
}

export const NO_NODES_EXPLANATION = "no nodes have joined; start one with 'llmgw agent --server URL --join-token TOKEN'";

interface WorkGpu {
  index: number;
  gpuClass: string;
  memoryBytes: number;
  /** What the GPU offers each engine. */
  llamaCppOffer: number;
  vllmOffer: number;
  free: boolean;
}

/** A node as this pass sees it: the caller's node plus what this pass has taken. */
interface WorkNode {
  node: PlacementNode;
  ready: boolean;
  /** The node's memory less the reserve: what its replicas may use when it runs none. */
  memoryForReplicas: number;
  freeMemory: number;
  freeCores: number;
  /** Sorted by memory, then index, so the first that fit are the smallest. */
  gpus: WorkGpu[];
  /** Its position in name order, for the indexes of the pass. */
  order: number;
  /** ENGINE_* bits of the engines it reports. */
  engines: number;
  /** Its agent loads LoRA adapters (AGENT_FEATURES). */
  loadsAdapters: boolean;
  /** Texts for explanations, made on first use (see gpuSummary, freeMemoryText). */
  gpuSummary: string | null;
  freeMemoryText: string | null;
  freeMemoryTextOf: number;
}

/** How good a fitting node is; lower is better in each field, compared in order. */
interface Score {
  sameModel: number;
  uncached: number;
  gpusLeft: number;
  memoryLeft: number;
}

// Engines as bits, so "has an engine this option runs on" is one AND.
const ENGINE_BUNDLED_LLAMACPP = 1;
const ENGINE_LLAMA_SERVER = 2;
const ENGINE_VLLM = 4;
const ENGINE_BITS: Record<string, number> = { llamacpp: ENGINE_BUNDLED_LLAMACPP, "llama-server": ENGINE_LLAMA_SERVER, vllm: ENGINE_VLLM };

/** What one pass works on: its copy of the nodes and indexes into them. */
interface Pass {
  /** In name order (then id), which is also the order of explanations and of ties. */
  work: WorkNode[];
  /** modelId → orders of the nodes with a replica of it (the callers' and this pass's). */
  modelNodes: Map<string, Set<number>>;
  /** weightsKey → orders of the nodes that hold it. */
  cachedNodes: Map<string, Set<number>>;
  classOf: (name: string) => string;
}

type OptionOutcome = { placed: PlacedReplica } | { placed: null; fittingNodes: number };

/** Places each request on the ready nodes, or explains per node why it cannot. */
export function placeReplicas(input: PlacementInput): PlacementResult {
  const work = input.nodes.map(workNode).sort((a, b) => compareStrings(a.node.name, b.node.name) || compareStrings(a.node.id, b.node.id));
  // Inverted indexes: most requests' models and weights are on no node or a few, so the
  // scan looks them up once per request rather than in each node's sets.
  const modelNodes = new Map<string, Set<number>>();
  const cachedNodes = new Map<string, Set<number>>();
  work.forEach((node, order) => {
    node.order = order;
    for (const model of node.node.models) addTo(modelNodes, model, order);
    for (const weights of node.node.cachedWeights) addTo(cachedNodes, weights, order);
  });
  const classes = new Map<string, string>();
  const classOf = (name: string): string => {
    let normalized = classes.get(name);
    if (normalized === undefined) {
      normalized = normalizeGpuClass(name);
      classes.set(name, normalized);
    }
    return normalized;
  };
  const pass: Pass = { work, modelNodes, cachedNodes, classOf };

  const placed: PlacedReplica[] = [];
  const unplaceable: UnplaceableReplica[] = [];
  for (const request of input.requests) {
    const fitting: number[] = [];
    let done = false;
    for (const option of request.options) {
      const outcome = placeOption({ pass, request, option });
      if (outcome.placed) {
        placed.push(outcome.placed);
        done = true;
        break;
      }
      fitting.push(outcome.fittingNodes);
    }
    if (!done) {
      unplaceable.push({ key: request.key, modelId: request.modelId, modelName: request.modelName, explanation: explain({ work, request, fitting, classOf }) });
    }
  }
  return { placed, unplaceable };
}

function addTo(index: Map<string, Set<number>>, key: string, order: number): void {
  let orders = index.get(key);
  if (orders === undefined) {
    orders = new Set();
    index.set(key, orders);
  }
  orders.add(order);
}

function compareStrings(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function workNode(node: PlacementNode): WorkNode {
  const { inventory, used } = node;
  const held = new Set(used.gpus);
  const gpus = inventory.gpus
    .map((gpu) => ({
      index: gpu.index,
      gpuClass: normalizeGpuClass(gpu.class),
      memoryBytes: gpu.memoryBytes,
      llamaCppOffer: Math.max(0, gpu.memoryBytes - LLAMA_CPP_GPU_RESERVE_BYTES),
      vllmOffer: vllmUsableBytes(gpu.memoryBytes),
      free: !held.has(gpu.index),
    }))
    .sort((a, b) => a.memoryBytes - b.memoryBytes || a.index - b.index);
  let engines = 0;
  for (const e of inventory.engines) engines |= ENGINE_BITS[e.engine] ?? 0;
  const memoryForReplicas = inventory.memoryBytes - cpuReserveBytes(inventory.memoryBytes);
  return {
    node,
    ready: node.state === "ready",
    memoryForReplicas,
    freeMemory: memoryForReplicas - used.memoryBytes,
    freeCores: inventory.cores - used.cores,
    gpus,
    order: 0,
    engines,
    loadsAdapters: inventory.features?.includes("adapters") === true,
    gpuSummary: null,
    freeMemoryText: null,
    freeMemoryTextOf: 0,
  };
}

/** ENGINE_* bits of the engines an option runs on: GPU llama.cpp, and llama.cpp with engine_args, need llama-server. */
function enginesFor(option: PlacementOption): number {
  const { needs } = option;
  if (needs.engine === "vllm") return ENGINE_VLLM;
  const bundled = needs.gpu === undefined && needs.llamaServerArgs !== true && needs.projector !== true;
  return bundled ? ENGINE_BUNDLED_LLAMACPP | ENGINE_LLAMA_SERVER : ENGINE_LLAMA_SERVER;
}

function hasEngine(node: WorkNode, option: PlacementOption): boolean {
  return (node.engines & enginesFor(option)) !== 0;
}

function gpuOffer(gpu: WorkGpu, engine: "llamacpp" | "vllm"): number {
  return engine === "vllm" ? gpu.vllmOffer : gpu.llamaCppOffer;
}

/** -1 when `a` is the better node, 1 when `b` is, 0 when they tie (then the name decides). */
function compareScores(a: Score, b: Score): number {
  return a.sameModel - b.sameModel || a.uncached - b.uncached || a.gpusLeft - b.gpusLeft || a.memoryLeft - b.memoryLeft;
}

function placeOption(options: { pass: Pass; request: PlacementRequest; option: PlacementOption }): OptionOutcome {
  const { pass, request, option } = options;
  const { work } = pass;
  const { needs } = option;
  const gpu = needs.gpu;
  const gpuClass = gpu === undefined ? "" : pass.classOf(gpu.class);
  const engines = enginesFor(option);
  const withModel = pass.modelNodes.get(request.modelId);
  const withWeights = request.weightsKey === null ? undefined : pass.cachedNodes.get(request.weightsKey);
  const nodesWanted = gpu === undefined ? 1 : Math.max(1, gpu.nodes);
  const perNode = gpu === undefined ? 0 : gpu.perNode;
  // Single-node options keep the best so far without allocating; pipeline-parallel ones
  // collect the fitting nodes and take the best `nodes` of them.
  let best: WorkNode | null = null;
  const bestScore: Score = { sameModel: 0, uncached: 0, gpusLeft: 0, memoryLeft: 0 };
  const score: Score = { sameModel: 0, uncached: 0, gpusLeft: 0, memoryLeft: 0 };
  const candidates: Array<{ node: WorkNode; score: Score }> = [];
  let fittingNodes = 0;
  for (let i = 0; i < work.length; i++) {
    const node = work[i]!;
    if (!node.ready || node.freeMemory < needs.memoryBytes || node.freeCores < needs.cores || (node.engines & engines) === 0) continue;
    if (needs.adapters === true && !node.loadsAdapters) continue;
    let gpusLeft = 0;
    if (gpu !== undefined) {
      let usable = 0;
      let freeOfClass = 0;
      for (const g of node.gpus) {
        if (!g.free || g.gpuClass !== gpuClass) continue;
        freeOfClass++;
        if (gpuOffer(g, needs.engine) >= gpu.memoryBytesPerGpu) usable++;
      }
      if (usable < perNode) continue;
      gpusLeft = freeOfClass - perNode;
    }
    fittingNodes++;
    score.sameModel = withModel?.has(i) ? 1 : 0;
    score.uncached = withWeights?.has(i) ? 0 : 1;
    score.gpusLeft = gpusLeft;
    score.memoryLeft = node.freeMemory - needs.memoryBytes;
    if (nodesWanted > 1) {
      candidates.push({ node, score: { ...score } });
    } else if (best === null || compareScores(score, bestScore) < 0) {
      best = node;
      Object.assign(bestScore, score);
    }
  }

  let chosen: WorkNode[];
  if (nodesWanted > 1) {
    if (candidates.length < nodesWanted) return { placed: null, fittingNodes };
    candidates.sort((a, b) => compareScores(a.score, b.score) || a.node.order - b.node.order);
    chosen = candidates.slice(0, nodesWanted).map((c) => c.node);
  } else {
    if (best === null) return { placed: null, fittingNodes };
    chosen = [best];
  }

  const gpus: Record<string, number[]> = {};
  for (const node of chosen) {
    const taken: number[] = [];
    if (gpu !== undefined) {
      for (const g of node.gpus) {
        if (taken.length === perNode) break;
        if (g.free && g.gpuClass === gpuClass && gpuOffer(g, needs.engine) >= gpu.memoryBytesPerGpu) {
          g.free = false;
          taken.push(g.index);
        }
      }
      taken.sort((a, b) => a - b);
    }
    gpus[node.node.id] = taken;
    node.freeMemory -= needs.memoryBytes;
    node.freeCores -= needs.cores;
    addTo(pass.modelNodes, request.modelId, node.order);
  }
  return { placed: { key: request.key, profile: option.profile, nodeIds: chosen.map((node) => node.node.id), gpus } };
}

// ---------------------------------------------------------------------------------------
// Explanations
//
// A crowded fleet can leave hundreds of requests unplaceable, each explained on every node,
// so the texts that do not change between lines are made once: what each option needs
// (per request), what a node has (its GPU summary; its free memory until it changes).

/** An option's figures as text, made once per unplaceable request. */
interface OptionText {
  option: PlacementOption;
  gpuClass: string;
  fittingNodes: number;
  memory: string;
  perGpu: string;
}

function explain(options: { work: WorkNode[]; request: PlacementRequest; fitting: number[]; classOf: (name: string) => string }): string[] {
  const { work, request, fitting, classOf } = options;
  if (work.length === 0) return [NO_NODES_EXPLANATION];
  if (request.options.length === 0) return ["the model has no llamacpp or vllm profile to place on a node"];
  const texts: OptionText[] = request.options.map((option, i) => ({
    option,
    gpuClass: option.needs.gpu ? classOf(option.needs.gpu.class) : "",
    fittingNodes: fitting[i] ?? 0,
    memory: formatBytes(option.needs.memoryBytes),
    perGpu: option.needs.gpu ? formatBytes(option.needs.gpu.memoryBytesPerGpu) : "",
  }));
  const lines: string[] = new Array<string>(work.length);
  for (let n = 0; n < work.length; n++) {
    const node = work[n]!;
    const name = node.node.name;
    if (!node.ready) {
      lines[n] = `${name}: ${node.node.state}`;
    } else if (texts.length === 1) {
      lines[n] = `${name}: ${shortfall(node, texts[0]!)}`;
    } else {
      let line = `${name}: `;
      for (let i = 0; i < texts.length; i++) line += `${i > 0 ? "; " : ""}${texts[i]!.option.profile}: ${shortfall(node, texts[i]!)}`;
      lines[n] = line;
    }
  }
  return lines;
}

/** What `node` lacks for an option: its first shortfall, short and with the figures. */
function shortfall(node: WorkNode, text: OptionText): string {
  const { option, gpuClass } = text;
  const { needs } = option;
  const gpu = needs.gpu;
  if (!hasEngine(node, option)) {
    if (needs.engine === "vllm") return "no vllm engine";
    if (gpu !== undefined) return "no llama-server engine (the bundled llama.cpp runs on the CPU only)";
    if (needs.llamaServerArgs === true) return "no llama-server engine (the profile's engine_args are llama-server options)";
    if (needs.projector === true) return "no llama-server engine (the model's vision projector loads only there, with --mmproj)";
    return "no llama.cpp engine";
  }
  if (needs.adapters === true && !node.loadsAdapters) return "its agent does not load LoRA adapters (an older llmgw): upgrade llmgw on the node";
  // One pass over the node's GPUs (sorted by memory): of the class, large enough, free.
  let big = 0;
  let bigFree = 0;
  if (gpu !== undefined) {
    let ofClass = 0;
    let smallest: WorkGpu | null = null;
    let largest: WorkGpu | null = null;
    for (const g of node.gpus) {
      if (g.gpuClass !== gpuClass) continue;
      ofClass++;
      smallest ??= g;
      largest = g;
      if (gpuOffer(g, needs.engine) >= gpu.memoryBytesPerGpu) {
        big++;
        if (g.free) bigFree++;
      }
    }
    if (largest === null || smallest === null) return `no ${gpuClass} GPU (has ${gpuSummary(node)})`;
    if (ofClass < gpu.perNode) return `has ${countOf(ofClass, `${gpuClass} GPU`)}, needs ${gpu.perNode}`;
    if (big === 0) {
      const offered = needs.engine === "vllm" ? largest.vllmOffer : largest.llamaCppOffer;
      const basis =
        needs.engine === "vllm"
          ? `to vLLM (${VLLM_GPU_MEMORY_UTILIZATION * 100}% of ${formatBytes(largest.memoryBytes)})`
          : `to llama.cpp (${formatBytes(largest.memoryBytes)} less ${formatBytes(LLAMA_CPP_GPU_RESERVE_BYTES)} for CUDA)`;
      const offer =
        ofClass === 1
          ? `its ${gpuClass} offers ${formatBytes(offered)}`
          : smallest.memoryBytes === largest.memoryBytes
            ? `its ${gpuClass} GPUs offer ${formatBytes(offered)} each`
            : `its ${gpuClass} GPUs offer at most ${formatBytes(offered)}`;
      return `${offer} ${basis}, needs ${text.perGpu} per GPU`;
    }
    if (big < gpu.perNode) return `only ${big} of ${ofClass} ${gpuClass} GPUs ${big === 1 ? "offers" : "offer"} ${text.perGpu}, needs ${gpu.perNode}`;
  }
  // What the node lacks even with no replicas on it: no wait can cure that, so no "free".
  const { memoryBytes, cores } = node.node.inventory;
  if (node.memoryForReplicas < needs.memoryBytes) {
    const reserve = formatBytes(memoryBytes - node.memoryForReplicas);
    return `has ${formatBytes(Math.max(0, node.memoryForReplicas))} in all (${formatBytes(memoryBytes)} less ${reserve} kept for the system), needs ${text.memory}`;
  }
  if (cores < needs.cores) return `has ${countOf(cores, "core")} in all, needs ${formatCores(needs.cores)}`;
  // The node has it all, but its replicas use some: room frees when one stops.
  if (gpu !== undefined && bigFree < gpu.perNode) return `${bigFree} of ${big} ${gpuClass} ${big === 1 ? "GPU" : "GPUs"}${ROOM_TAKEN}${gpu.perNode}`;
  if (node.freeMemory < needs.memoryBytes) return `${freeMemoryText(node)}${ROOM_TAKEN}${text.memory}`;
  if (node.freeCores < needs.cores) return `${formatCores(Math.max(0, node.freeCores))} of ${cores} cores${ROOM_TAKEN}${formatCores(needs.cores)}`;
  // The node has room; only a replica spanning several nodes gets here, short of nodes.
  const nodes = gpu?.nodes ?? 1;
  return `has room, but the replica spans ${nodes} nodes and ${text.fittingNodes === 1 ? "only this one has" : `only ${text.fittingNodes} have`} room`;
}

function freeMemoryText(node: WorkNode): string {
  if (node.freeMemoryText === null || node.freeMemoryTextOf !== node.freeMemory) {
    node.freeMemoryText = formatBytes(Math.max(0, node.freeMemory));
    node.freeMemoryTextOf = node.freeMemory;
  }
  return node.freeMemoryText;
}

/** "2× A100, 1× RTX4090", or "no GPUs"; the inventory does not change, so made once per node. */
function gpuSummary(node: WorkNode): string {
  if (node.gpuSummary !== null) return node.gpuSummary;
  const counts = new Map<string, number>();
  for (const g of node.gpus) counts.set(g.gpuClass, (counts.get(g.gpuClass) ?? 0) + 1);
  node.gpuSummary =
    counts.size === 0
      ? "no GPUs"
      : [...counts]
          .sort(([a], [b]) => compareStrings(a, b))
          .map(([gpuClass, count]) => `${count}× ${gpuClass}`)
          .join(", ");
  return node.gpuSummary;
}
