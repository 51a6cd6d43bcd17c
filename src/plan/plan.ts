// The planner: which artifact of a repository runs where. Given the candidate artifacts
// (each quantisation of a GGUF repository, the original safetensors weights), the context
// to serve and the pool of nodes, it lists the options (artifact × placement), whether
// each fits the hardware, how many hosts could run it now, and recommends one; when
// nothing fits it says what each artifact needs and what the largest node offers. It is
// pure: the registry, header reads and the fleet's inventory are the caller's.
//
// Placement rules (each option is the smallest shape of its kind that fits, or the largest
// one tried when none does):
// - GGUF runs on llama.cpp. On the CPU of one node: it needs the estimate's total within
//   the node's memory less a reserve for the OS and the agent (the larger of 2 GiB and 10%).
//   On GPUs of one class in one node: llama.cpp splits layers across the node's GPUs (any
//   count, 1..all); each GPU offers its memory less 512 MiB for the CUDA context. It never
//   spans nodes. GPU llama.cpp needs a GPU build (llama-server): a node that reports its
//   engines must say `llamacpp.gpu`; the bundled engine is the CPU build.
// - Safetensors run on vLLM on GPUs only, each GPU offering 0.9 of its memory (vLLM's
//   --gpu-memory-utilization). Tensor parallel inside a node with 1, 2, 4 or 8 GPUs (powers
//   of two, which must divide the attention heads, as vLLM requires), then pipeline
//   parallel across several nodes of the same GPU class when one node is not enough (the
//   fewest GPUs in all, then the fewest nodes).
// - Before the fleet reports engines, a node without `engines` is assumed to have every
//   engine its hardware allows (bundled llama.cpp everywhere; GPU llama.cpp and vLLM where
//   there are GPUs).
//
// Recommendation, among options that fit:
// 1. the best quality: original weights, then GGUF F32/BF16/F16, then Q8_0 > Q6_K >
//    Q5_K_M > Q4_K_M > … > Q2_K (see artifacts.ts). Quality comes first because the
//    operator asked for this model; a smaller quantisation is a compromise to make only
//    when the better one does not fit.
// 2. at equal quality, GPUs before the CPU: a GPU answers an order of magnitude faster, and
//    a pool that has GPUs has them for this. Among GPU placements, the fewest GPUs in all,
//    then the fewest nodes (fewest resources, and no network between pipeline stages).
// 3. then an option some host can run now; then, among GPU placements, the smallest GPU
//    that fits (an 8B model goes on the 24 GB card and leaves the H200 for what needs it);
//    then the smallest need.
// The plan says whether hosts are free now, but fit is judged on the hardware: a model that
// fits a busy node is placed when room frees up.
//
// Cores: each option says the cores one replica reserves on a node (`cores`): on the CPU
// the share that follows its memory (cpu-share.ts, the rule the fleet places by), on GPUs
// the one core of the engine process that drives them. Memory decides fit; the cores are
// shown so a person sees how many such replicas a node's cores take.
//
// Text rendering lives in render.ts, which imports from here and never the other way.
import type { GgufMemoryEstimate, SafetensorsMemoryEstimate } from "../gguf/memory-estimate.ts";
import { formatBytes, llamaCppPerGpuBytes, vllmPerGpuBytes, vllmUsableBytes, VLLM_GPU_MEMORY_UTILIZATION } from "../gguf/memory-estimate.ts";
import { cpuCoreShare } from "./cpu-share.ts";

export type ArtifactFormat = "gguf" | "safetensors";

export interface PlanArtifact {
  /** Stable id, for example "Q4_K_M" or "safetensors". */
  id: string;
  /** For people, for example "Q4_K_M" or "safetensors BF16". */
  label: string;
  format: ArtifactFormat;
  /** Bytes of the artifact's files. */
  bytes: number;
  /** Higher is better; see artifacts.ts. */
  qualityRank: number;
  /** Memory for the plan's context on the artifact's engine. */
  memory: GgufMemoryEstimate | SafetensorsMemoryEstimate;
  /** Set when the engine cannot load it (for example an architecture the nodes' llama.cpp lacks). */
  unsupportedReason?: string;
  files?: string[];
}

export interface PoolGpu {
  index: number;
  /** For example "H200", "RTX 4090". */
  class: string;
  memoryBytes: number;
  /** Free now; defaults to memoryBytes. */
  memoryFreeBytes?: number;
}

export interface PoolNode {
  name: string;
  cores: number;
  memoryBytes: number;
  /** Free now; defaults to memoryBytes. */
  memoryFreeBytes?: number;
  gpus: PoolGpu[];
  /** Engines the node reported; absent means "whatever its hardware allows". */
  engines?: { llamacpp?: { version: string; gpu?: boolean }; vllm?: { version: string } };
}

export interface Pool {
  nodes: PoolNode[];
}

export type Placement = { kind: "cpu" } | { kind: "gpu"; gpuClass: string; gpusPerNode: number; nodes: number };

export interface ArtifactRef {
  id: string;
  label: string;
  format: ArtifactFormat;
  bytes: number;
  qualityRank: number;
}

export interface PlanOption {
  artifact: ArtifactRef;
  placement: Placement;
  engine: "llamacpp" | "vllm";
  /** Memory needed, per node (CPU) or per GPU; see `per`. */
  neededBytes: number;
  /** The best offer for this shape in the pool, per node (CPU) or per GPU. */
  availableBytes: number;
  per: "node" | "gpu";
  /** Cores one replica reserves on each node: the CPU share of its memory (cpu-share.ts), or 1 for a GPU replica's host process. */
  cores: number;
  /** Nodes (or groups of nodes, for pipeline parallel) that can run it with what is free now. */
  hostsNow: number;
  fits: boolean;
  why?: string;
  /** The placement in words ("CPU", "2× H100 (TP 2)"), as `llmgw ctl plan` prints it; for the console's table. */
  where: string;
}

/** An option as the builders below make it; planModel adds the words for its placement. */
type OptionShape = Omit<PlanOption, "where">;

export interface ModelPlan {
  contextSize: number;
  artifacts: PlanArtifact[];
  options: PlanOption[];
  recommendation: PlanOption | null;
  explanation: string;
}

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;
/** Node memory kept for the OS, the agent and page cache when a model runs on the CPU. */
export function cpuReserveBytes(memoryBytes: number): number {
  return Math.max(2 * GiB, Math.ceil(memoryBytes * 0.1));
}
/** GPU memory llama.cpp cannot use: the CUDA context and driver. */
export const LLAMA_CPP_GPU_RESERVE_BYTES = 512 * MiB;
const TENSOR_PARALLEL_SIZES = [1, 2, 4, 8, 16];
/** The host core of the engine process that drives a GPU replica (fleet/replica-needs.ts). */
const GPU_HOST_CORES = 1;

function cpuOffer(node: PoolNode): number {
  return Math.max(0, node.memoryBytes - cpuReserveBytes(node.memoryBytes));
}
function cpuOfferNow(node: PoolNode): number {
  return Math.min(cpuOffer(node), node.memoryFreeBytes ?? node.memoryBytes);
}

type GpuOffer = (gpu: PoolGpu, now: boolean) => number;
const llamaGpuOffer: GpuOffer = (gpu, now) => Math.max(0, (now ? (gpu.memoryFreeBytes ?? gpu.memoryBytes) : gpu.memoryBytes) - LLAMA_CPP_GPU_RESERVE_BYTES);
// vLLM claims 0.9 of the whole GPU, so the GPU must have that much free when it starts.
const vllmGpuOffer: GpuOffer = (gpu, now) => {
  const usable = vllmUsableBytes(gpu.memoryBytes);
  return now && (gpu.memoryFreeBytes ?? gpu.memoryBytes) < usable ? 0 : usable;
};

/** What `count` GPUs of `gpuClass` on `node` offer each: the count-th best offer, or 0 without enough GPUs. */
function nodeGpuOffer(node: PoolNode, gpuClass: string, count: number, offer: GpuOffer, now: boolean): number {
  const offers = node.gpus
    .filter((gpu) => gpu.class === gpuClass)
    .map((gpu) => offer(gpu, now))
    .sort((a, b) => b - a);
  return offers.length >= count ? (offers[count - 1] ?? 0) : 0;
}

function gpuClasses(nodes: PoolNode[]): string[] {
  return [...new Set(nodes.flatMap((node) => node.gpus.map((gpu) => gpu.class)))].sort();
}

function gpusOfClass(node: PoolNode, gpuClass: string): number {
  return node.gpus.filter((gpu) => gpu.class === gpuClass).length;
}

function refOf(artifact: PlanArtifact): ArtifactRef {
  return { id: artifact.id, label: artifact.label, format: artifact.format, bytes: artifact.bytes, qualityRank: artifact.qualityRank };
}

function largestNode(nodes: PoolNode[]): PoolNode | undefined {
  return [...nodes].sort((a, b) => b.memoryBytes - a.memoryBytes)[0];
}

function cpuOffersText(node: PoolNode): string {
  return `${formatBytes(cpuOffer(node))} (${formatBytes(node.memoryBytes)} less a ${formatBytes(cpuReserveBytes(node.memoryBytes))} reserve)`;
}

function cpuOption(artifact: PlanArtifact, memory: GgufMemoryEstimate, nodes: PoolNode[]): OptionShape {
  const needed = memory.totalBytes;
  const best = [...nodes].sort((a, b) => cpuOffer(b) - cpuOffer(a))[0];
  const available = best ? cpuOffer(best) : 0;
  const fits = best !== undefined && needed <= available && artifact.unsupportedReason === undefined;
  const option: OptionShape = {
    artifact: refOf(artifact),
    placement: { kind: "cpu" },
    engine: "llamacpp",
    neededBytes: needed,
    availableBytes: available,
    per: "node",
    cores: cpuCoreShare(needed),
    hostsNow: fits ? nodes.filter((node) => cpuOfferNow(node) >= needed).length : 0,
    fits,
  };
  if (artifact.unsupportedReason !== undefined) option.why = artifact.unsupportedReason;
  else if (!best) option.why = "the pool has no nodes";
  else if (!fits) option.why = `needs ${formatBytes(needed)}; the largest node, ${best.name}, offers ${cpuOffersText(best)}`;
  return option;
}

function llamaGpuOptions(artifact: PlanArtifact, memory: GgufMemoryEstimate, nodes: PoolNode[]): OptionShape[] {
  const eligible = nodes.filter((node) => node.gpus.length > 0 && (node.engines === undefined || node.engines.llamacpp?.gpu === true));
  return gpuClasses(eligible).map((gpuClass) => {
    const withClass = eligible.filter((node) => gpusOfClass(node, gpuClass) > 0);
    const maxCount = Math.max(...withClass.map((node) => gpusOfClass(node, gpuClass)));
    let count = 1;
    for (; count <= maxCount; count++) {
      const need = llamaCppPerGpuBytes(memory, count);
      if (withClass.some((node) => nodeGpuOffer(node, gpuClass, count, llamaGpuOffer, false) >= need)) break;
    }
    const fitsSomewhere = count <= maxCount;
    const gpus = fitsSomewhere ? count : maxCount;
    const needed = llamaCppPerGpuBytes(memory, gpus);
    const available = Math.max(...withClass.map((node) => nodeGpuOffer(node, gpuClass, gpus, llamaGpuOffer, false)));
    const fits = fitsSomewhere && artifact.unsupportedReason === undefined;
    const option: OptionShape = {
      artifact: refOf(artifact),
      placement: { kind: "gpu", gpuClass, gpusPerNode: gpus, nodes: 1 },
      engine: "llamacpp",
      neededBytes: needed,
      availableBytes: available,
      per: "gpu",
      cores: GPU_HOST_CORES,
      hostsNow: fits ? withClass.filter((node) => nodeGpuOffer(node, gpuClass, gpus, llamaGpuOffer, true) >= needed).length : 0,
      fits,
    };
    if (artifact.unsupportedReason !== undefined) option.why = artifact.unsupportedReason;
    else if (!fits) {
      option.why = `needs ${formatBytes(needed)} per GPU on ${gpus} ${gpuClass}; the most a node has is ${maxCount} ${gpuClass} offering ${formatBytes(available)} each (llama.cpp does not span nodes)`;
    }
    return option;
  });
}

function vllmOptions(artifact: PlanArtifact, memory: SafetensorsMemoryEstimate, nodes: PoolNode[]): OptionShape[] {
  const eligible = nodes.filter((node) => node.gpus.length > 0 && (node.engines === undefined || node.engines.vllm !== undefined));
  const classes = gpuClasses(eligible);
  if (classes.length === 0) {
    const anyGpus = nodes.some((node) => node.gpus.length > 0);
    return [
      {
        artifact: refOf(artifact),
        placement: { kind: "gpu", gpuClass: "none", gpusPerNode: 1, nodes: 1 },
        engine: "vllm",
        neededBytes: memory.totalBytes,
        availableBytes: 0,
        per: "gpu",
        cores: GPU_HOST_CORES,
        hostsNow: 0,
        fits: false,
        why: `vLLM runs safetensors on GPUs only; ${anyGpus ? "no GPU node reports vLLM" : "no node in the pool has a GPU"} (needs ${formatBytes(memory.totalBytes)} on one GPU)`,
      },
    ];
  }
  return classes.map((gpuClass) => {
    const withClass = eligible.filter((node) => gpusOfClass(node, gpuClass) > 0);
    const maxCount = Math.max(...withClass.map((node) => gpusOfClass(node, gpuClass)));
    const sizes = TENSOR_PARALLEL_SIZES.filter((tp) => tp <= maxCount && memory.shape.attentionHeads % tp === 0);
    const tried: Array<{ tp: number; pp: number; needed: number; available: number; fits: boolean }> = [];
    for (const tp of sizes) {
      // Each node that has tp GPUs of the class offers the tp-th best of them, per GPU.
      const offers = withClass
        .map((node) => nodeGpuOffer(node, gpuClass, tp, vllmGpuOffer, false))
        .filter((o) => o > 0)
        .sort((a, b) => b - a);
      for (let pp = 1; pp <= Math.min(offers.length, memory.shape.layers); pp++) {
        const needed = vllmPerGpuBytes(memory, { tensorParallel: tp, pipelineParallel: pp });
        const available = offers[pp - 1] ?? 0;
        tried.push({ tp, pp, needed, available, fits: needed <= available });
      }
    }
    // One node first (the fewest GPUs); only when no node is enough, several nodes (the
    // fewest GPUs in all, then the fewest nodes).
    const fitting = tried.filter((t) => t.fits).sort((a, b) => Number(a.pp > 1) - Number(b.pp > 1) || a.tp * a.pp - b.tp * b.pp || a.pp - b.pp)[0];
    // When nothing fits, show the biggest shape tried: the most GPUs, then the fewest nodes.
    const shown = fitting ?? [...tried].sort((a, b) => b.tp * b.pp - a.tp * a.pp || a.pp - b.pp)[0];
    if (!shown) {
      return {
        artifact: refOf(artifact),
        placement: { kind: "gpu", gpuClass, gpusPerNode: 1, nodes: 1 },
        engine: "vllm",
        neededBytes: memory.totalBytes,
        availableBytes: 0,
        per: "gpu",
        cores: GPU_HOST_CORES,
        hostsNow: 0,
        fits: false,
        why: `no tensor-parallel size up to ${maxCount} divides the model's ${memory.shape.attentionHeads} attention heads`,
      } satisfies OptionShape;
    }
    const fits = fitting !== undefined && artifact.unsupportedReason === undefined;
    const readyNodes = withClass.filter((node) => nodeGpuOffer(node, gpuClass, shown.tp, vllmGpuOffer, true) >= shown.needed).length;
    const option: OptionShape = {
      artifact: refOf(artifact),
      placement: { kind: "gpu", gpuClass, gpusPerNode: shown.tp, nodes: shown.pp },
      engine: "vllm",
      neededBytes: shown.needed,
      availableBytes: shown.available,
      per: "gpu",
      cores: GPU_HOST_CORES,
      hostsNow: fits ? Math.floor(readyNodes / shown.pp) : 0,
      fits,
    };
    if (artifact.unsupportedReason !== undefined) option.why = artifact.unsupportedReason;
    else if (!fits) {
      const shape = shown.pp > 1 ? `${shown.pp} nodes × ${shown.tp} ${gpuClass}` : `${shown.tp} ${gpuClass}`;
      option.why = `needs ${formatBytes(shown.needed)} per GPU on ${shape}; those GPUs offer ${formatBytes(shown.available)} each (${VLLM_GPU_MEMORY_UTILIZATION} of their memory)`;
    }
    return option;
  });
}

function totalGpus(placement: Placement): number {
  return placement.kind === "cpu" ? 0 : placement.gpusPerNode * placement.nodes;
}

/** Orders fitting options best first by the recommendation rules in the header comment. */
export function compareOptions(a: PlanOption, b: PlanOption): number {
  return (
    b.artifact.qualityRank - a.artifact.qualityRank ||
    Number(b.placement.kind === "gpu") - Number(a.placement.kind === "gpu") ||
    totalGpus(a.placement) - totalGpus(b.placement) ||
    (a.placement.kind === "gpu" && b.placement.kind === "gpu" ? a.placement.nodes - b.placement.nodes : 0) ||
    Number(b.hostsNow > 0) - Number(a.hostsNow > 0) ||
    (a.placement.kind === "gpu" && b.placement.kind === "gpu" ? a.availableBytes - b.availableBytes : 0) ||
    a.neededBytes - b.neededBytes
  );
}

export function describePlacement(option: Pick<PlanOption, "placement" | "engine">): string {
  const { placement } = option;
  if (placement.kind === "cpu") return "CPU";
  if (placement.gpuClass === "none") return "GPU (none)";
  const gpus = `${placement.gpusPerNode}× ${placement.gpuClass}`;
  if (placement.nodes > 1) return `${placement.nodes} nodes × ${gpus} (TP ${placement.gpusPerNode}, PP ${placement.nodes})`;
  if (placement.gpusPerNode === 1) return gpus;
  return option.engine === "vllm" ? `${gpus} (TP ${placement.gpusPerNode})` : `${gpus} (layer split)`;
}

/** What an artifact needs at the least, in words, for the nothing-fits explanation. */
function needText(artifact: PlanArtifact): string {
  if (artifact.unsupportedReason !== undefined) return `${artifact.label}: cannot run (${artifact.unsupportedReason})`;
  if (artifact.memory.engine === "llamacpp") {
    return `${artifact.label} needs ${formatBytes(artifact.memory.totalBytes)} of memory on one node for the CPU, or ${formatBytes(llamaCppPerGpuBytes(artifact.memory, 1))} on one GPU (llama.cpp)`;
  }
  return `${artifact.label} needs ${formatBytes(artifact.memory.totalBytes)} on one GPU, or ${formatBytes(vllmPerGpuBytes(artifact.memory, { tensorParallel: 8, pipelineParallel: 1 }))} per GPU on 8 (vLLM, GPUs only)`;
}

function offerText(node: PoolNode): string {
  const classes = gpuClasses([node]);
  const gpus =
    classes.length === 0
      ? "no GPUs"
      : classes
          .map((gpuClass) => {
            const memory = Math.max(...node.gpus.filter((gpu) => gpu.class === gpuClass).map((gpu) => gpu.memoryBytes));
            return `${gpusOfClass(node, gpuClass)}× ${gpuClass} of ${formatBytes(memory)} (${formatBytes(vllmUsableBytes(memory))} each for vLLM, ${formatBytes(memory - LLAMA_CPP_GPU_RESERVE_BYTES)} for llama.cpp)`;
          })
          .join(" and ");
  return `${node.name} offers ${cpuOffersText(node)} for the CPU and ${gpus}`;
}

/** Lists the options for serving these artifacts with `contextSize` on `pool` and recommends one. */
export function planModel(input: { artifacts: PlanArtifact[]; contextSize: number; pool: Pool }): ModelPlan {
  const { contextSize, pool } = input;
  const artifacts = [...input.artifacts].sort((a, b) => b.qualityRank - a.qualityRank);
  const shapes: OptionShape[] = [];
  for (const artifact of artifacts) {
    const memory = artifact.memory;
    if (memory.engine === "llamacpp") {
      shapes.push(cpuOption(artifact, memory, pool.nodes), ...llamaGpuOptions(artifact, memory, pool.nodes));
    } else {
      shapes.push(...vllmOptions(artifact, memory, pool.nodes));
    }
  }
  const options: PlanOption[] = shapes.map((option) => ({ ...option, where: describePlacement(option) }));

  const recommendation = options.filter((option) => option.fits).sort(compareOptions)[0] ?? null;
  let explanation: string;
  if (artifacts.length === 0) {
    explanation = "There is nothing to plan: the repository has no GGUF or safetensors artifact llmgw can serve.";
  } else if (pool.nodes.length === 0) {
    explanation = "There is nothing to plan on: the pool has no nodes. Start an agent (llmgw agent) or run llmgw up.";
  } else if (recommendation) {
    const unit = recommendation.per === "gpu" ? " per GPU" : "";
    const where = recommendation.placement.kind === "cpu" ? "on the CPU" : `on ${describePlacement(recommendation)}`;
    const engine = recommendation.engine === "vllm" ? "vLLM" : "llama.cpp";
    const better = artifacts.filter((a) => a.qualityRank > recommendation.artifact.qualityRank).map((a) => a.label);
    const hosts = recommendation.hostsNow === 1 ? "1 host can run it now" : `${recommendation.hostsNow} hosts can run it now`;
    explanation =
      `Recommended: ${recommendation.artifact.label} ${where} with ${engine}, needing ${formatBytes(recommendation.neededBytes)}${unit} of ${formatBytes(recommendation.availableBytes)} available; ${hosts}.` +
      (better.length > 0 ? ` Better quality that does not fit: ${better.join(", ")}.` : " It is the best quality available.");
  } else {
    const largest = largestNode(pool.nodes);
    const gpuNodes = pool.nodes.filter((node) => node.gpus.length > 0);
    const largestGpu = [...gpuNodes].sort(
      (a, b) => b.gpus.reduce((sum, gpu) => sum + gpu.memoryBytes, 0) - a.gpus.reduce((sum, gpu) => sum + gpu.memoryBytes, 0),
    )[0];
    const offers = [largest, largestGpu].filter((node, i, all): node is PoolNode => node !== undefined && all.indexOf(node) === i).map(offerText);
    explanation =
      `Nothing fits this pool for a ${contextSize}-token context. ${artifacts.map(needText).join("; ")}. ` +
      `The largest node: ${offers.join("; the largest GPU node: ")}.`;
  }
  return { contextSize, artifacts, options, recommendation, explanation };
}
