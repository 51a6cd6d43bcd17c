// What one replica of a catalog profile needs of a node: host memory, cores and, for a GPU
// profile, whole GPUs of a class with memory per GPU. The reconciler turns each profile into
// a PlacementOption with it; placement (placement.ts) decides where. It is pure: the
// weights' size and GGUF header are the caller's (the mirror and the header cache).
//
// Rules (memory-estimate.ts has the formulas and their sources):
// - CPU profiles: `hardware.cpu.min_memory_gb` when set replaces the estimate (the operator
//   measured it, or knows the engine mmaps the weights); a GB is a GiB (1024³ bytes), as
//   memory is sold and as explanations print it, so a "16 GB" node offers 16 GiB less its
//   reserve. Otherwise llama.cpp with a header: estimateGgufMemory for the replica's context
//   pool and slots (llamaCppSlots, what the engine is started with); without a header:
//   weights × 1.2 + 256 MiB, the KV cache and buffers of a typical 16k context being about
//   a fifth of a small model's weights, on the safe side. vLLM on a CPU: weights × 1.2 +
//   2 GiB (GPUStack's rule, engines.md). Cores: `hardware.cpu.cores` exactly, else a share
//   of a core that follows the memory (plan/cpu-share.ts: a core per 2 GiB, in quarters
//   from 0.25 to 1), so several small models share a small machine's cores.
// - GPU profiles: `gpus_per_node` whole GPUs of `class` on each of `nodes` nodes. llama.cpp
//   splits layers over the GPUs of one node (llamaCppPerGpuBytes); without a header, the
//   same weights × 1.2 + 256 MiB split evenly. llama.cpp does not span nodes, so such a
//   profile is refused. vLLM: weights × 1.2 split over tensor × pipeline parallel GPUs plus
//   its 2 GiB runtime on each GPU (memory-estimate.ts applies the 2 GiB per GPU when split).
//   What a GPU offers each engine (vLLM claims 90% of it; llama.cpp loses 512 MiB to the
//   CUDA context) is placement's concern, not counted here. The host side of a GPU replica
//   is the engine process: 1 GiB and 1 core.
// - A llamacpp profile with engine_args needs llama-server, whose options they are
//   (engines/engine-args-check.ts): `llamaServerArgs`, which placement reads; so does a
//   model with a vision projector (`projector`), which only llama-server loads.
import { DEFAULT_ADAPTER_CONTEXTS } from "../engines/llamacpp/adapter-lanes.ts";
import type { Profile } from "../catalog/model-schema.ts";
import { BadRequestError } from "../core/errors.ts";
import { llamaCppSlots } from "../engines/llamacpp/engine-launch.ts";
import { estimateGgufMemory, llamaCppPerGpuBytes, type GgufModelShape } from "../gguf/memory-estimate.ts";
import { cpuCoreShare } from "../plan/cpu-share.ts";
import type { ReplicaNeeds } from "./fleet-types.ts";

const MiB = 1024 * 1024;
const GiB = 1024 * MiB;

/** Without a GGUF header: weights × 1.2 + 256 MiB on llama.cpp. */
const LLAMACPP_WEIGHTS_FACTOR = 1.2;
const LLAMACPP_HEADERLESS_EXTRA_BYTES = 256 * MiB;
/** GPUStack's rule for vLLM (engines.md): weights × 1.2 + 2 GiB runtime per GPU. */
const VLLM_WEIGHTS_FACTOR = 1.2;
const VLLM_RUNTIME_BYTES = 2 * GiB;
/** Host memory of the engine process that drives a GPU replica. */
const GPU_REPLICA_HOST_BYTES = GiB;

export interface ReplicaNeedsInput {
  profile: Profile;
  /** Bytes of the weights (every shard of a split GGUF; the safetensors files for vLLM). */
  weightsBytes: number;
  /** The GGUF header summary, when the reconciler has read it; llamacpp only. */
  header?: GgufModelShape;
  /** llamacpp: the vision projector's bytes; llama-server loads it beside the weights (on the GPU for GPU profiles). */
  projectorBytes?: number;
  /** The LoRA adapters' bytes (all of them: every replica loads every adapter), when the model has any. */
  adapterBytes?: number;
  /** vllm: the GPU memory vLLM reserves for adapters (vllmLoraReserveBytes), which holds them. */
  vllmLoraReserveBytes?: number;
}

export function replicaNeeds(input: ReplicaNeedsInput): ReplicaNeeds {
  const { profile, weightsBytes } = input;
  const engine = profile.engine;
  if (engine === "external") {
    throw new BadRequestError(`Profile '${profile.name}' is external: it routes to an existing server and is not placed on a node.`, {
      code: "profile_not_placeable",
    });
  }
  const gpu = profile.hardware.gpu;
  if (gpu === undefined) {
    const minMemoryGb = profile.hardware.cpu?.min_memory_gb;
    const memoryBytes =
      minMemoryGb !== undefined
        ? Math.ceil(minMemoryGb * GiB)
        : engine === "llamacpp"
          ? llamaCppTotalBytes(input) + (input.projectorBytes ?? 0) + (input.adapterBytes ?? 0) + bundledAdapterContextBytes(input)
          : vllmBytes(weightsBytes, 1);
    return {
      engine,
      memoryBytes,
      cores: profile.hardware.cpu?.cores ?? cpuCoreShare(memoryBytes),
      ...llamaServerOnly(profile, input),
      ...adapterAgents(input),
    };
  }
  const { class: gpuClass, gpus_per_node: perNode, nodes } = gpu;
  let memoryBytesPerGpu: number;
  if (engine === "llamacpp") {
    if (nodes > 1) {
      throw new BadRequestError(
        `Profile '${profile.name}' asks for ${nodes} nodes, but llama.cpp runs on the GPUs of one node; set hardware.gpu.nodes to 1, or use a vllm profile to span nodes.`,
        { code: "profile_not_placeable", param: "hardware.gpu.nodes" },
      );
    }
    memoryBytesPerGpu =
      input.header === undefined
        ? Math.ceil(headerlessLlamaCppBytes(weightsBytes) / perNode)
        : llamaCppPerGpuBytes(llamaCppEstimate(input.header, input), perNode);
    // llama-server puts the projector on the first GPU; counted on each, as the split is even.
    memoryBytesPerGpu += (input.projectorBytes ?? 0) + (input.adapterBytes ?? 0);
  } else {
    // Not split between the GPUs: vLLM shards only part of the adapter slots with tensor parallelism.
    memoryBytesPerGpu = vllmBytes(weightsBytes, perNode * nodes) + (input.vllmLoraReserveBytes ?? input.adapterBytes ?? 0);
  }
  return {
    engine,
    memoryBytes: GPU_REPLICA_HOST_BYTES,
    cores: 1,
    gpu: { class: gpuClass, perNode, nodes, memoryBytesPerGpu },
    ...llamaServerOnly(profile, input),
    ...adapterAgents(input),
  };
}

/** What keeps a llamacpp profile off the bundled engine: engine_args (llama-server's options), a vision projector. */
function llamaServerOnly(profile: Profile, input: ReplicaNeedsInput): Pick<ReplicaNeeds, "llamaServerArgs" | "projector"> {
  if (profile.engine !== "llamacpp") return {};
  return { ...(profile.engine_args.length > 0 ? { llamaServerArgs: true } : {}), ...(input.projectorBytes !== undefined ? { projector: true } : {}) };
}

/** Whether only agents that load adapters may run it. */
function adapterAgents(input: ReplicaNeedsInput): Pick<ReplicaNeeds, "adapters"> {
  return input.adapterBytes === undefined ? {} : { adapters: true };
}

/**
 * The bundled engine serves adapters from contexts of their own (adapter-lanes.ts: up to
 * DEFAULT_ADAPTER_CONTEXTS, each with a KV cache and compute buffer as large as the base
 * context's); llama-server switches adapters within its one context. Placement does not know
 * yet which engine a CPU replica meets, so a replica that may run on the bundled engine is
 * sized for its adapter contexts: a llama-server node holds that much more than it uses.
 */
function bundledAdapterContextBytes(input: ReplicaNeedsInput): number {
  if (input.adapterBytes === undefined || input.header === undefined || input.projectorBytes !== undefined || input.profile.engine_args.length > 0) return 0;
  const estimate = llamaCppEstimate(input.header, input);
  return DEFAULT_ADAPTER_CONTEXTS * (estimate.kvCacheBytes + estimate.overhead.computeBytes);
}

function llamaCppEstimate(header: GgufModelShape, input: ReplicaNeedsInput) {
  const { contextPool, parallel } = llamaCppSlots(input.profile);
  return estimateGgufMemory({ header, contextSize: contextPool, parallel, weightsBytes: input.weightsBytes });
}

function llamaCppTotalBytes(input: ReplicaNeedsInput): number {
  return input.header === undefined ? headerlessLlamaCppBytes(input.weightsBytes) : llamaCppEstimate(input.header, input).totalBytes;
}

function headerlessLlamaCppBytes(weightsBytes: number): number {
  return Math.ceil(weightsBytes * LLAMACPP_WEIGHTS_FACTOR) + LLAMACPP_HEADERLESS_EXTRA_BYTES;
}

/** Per GPU (or on the CPU, gpus = 1): the weights' share × 1.2 + the 2 GiB runtime. */
function vllmBytes(weightsBytes: number, gpus: number): number {
  return Math.ceil((weightsBytes * VLLM_WEIGHTS_FACTOR) / gpus) + VLLM_RUNTIME_BYTES;
}
