// Memory estimates: how much memory a model needs on an engine for a given context, with
// the basis in words so an operator can check the arithmetic. GGUF files run on llama.cpp
// (weights + KV cache + engine overhead); safetensors repositories run on vLLM (GPUStack's
// rule of thumb, or weights + KV cache when that is larger). Facts and formulas come from
// shared/reference/engines.md ("Memory estimates") and protocols.md §2, and from the source
// of the llama.cpp that node-llama-cpp 3.21.1 bundles (llama.cpp v0.4.0) where those
// differ; each approximation is named where it is made.
import { BadRequestError } from "../core/errors.ts";
import { countOf, formatBytes } from "../core/format.ts";

export { formatBytes };

const KiB = 1024;
const MiB = 1024 * KiB;
const GiB = 1024 * MiB;

/** "4.6 GiB", or "258 MiB" below 0.1 GiB. */

// ---------------------------------------------------------------------------------------
// GGUF on llama.cpp

/** The fields of a GGUF header summary (see header.ts) the estimate uses. */
export interface GgufModelShape {
  architecture: string;
  contextLength: number;
  embeddingLength: number;
  blockCount: number;
  headCount: number;
  headCountKv: number;
  headCountKvPerLayer?: number[];
  keyLength: number;
  valueLength: number;
  feedForwardLength?: number;
  vocabSize?: number;
  tensorBytes: number;
  metadataBytes?: number;
}

/** KV cache types llama.cpp accepts for `--cache-type-k/-v`, with bytes per element. */
const KV_TYPE_BYTES = {
  f32: 4,
  f16: 2,
  bf16: 2,
  q8_0: 34 / 32,
  q5_1: 24 / 32,
  q5_0: 22 / 32,
  q4_1: 20 / 32,
  q4_0: 18 / 32,
} as const;
export type KvCacheType = keyof typeof KV_TYPE_BYTES;

export interface GgufMemoryOptions {
  header: GgufModelShape;
  /** The context the engine is started with (`--ctx-size`), shared by all slots. */
  contextSize: number;
  /** Slots (`--parallel`). The KV cache is unified and shared, so only the output buffer grows with it. Default 1. */
  parallel?: number;
  /** Default f16, llama.cpp's default for both K and V. */
  kvType?: KvCacheType;
  /** Weights when the header is one shard of several (sum of every shard's tensorBytes). Default header.tensorBytes. */
  weightsBytes?: number;
  /** llama.cpp's and node-llama-cpp's default is "auto", which turns it on for CPU and CUDA. Default true. */
  flashAttention?: boolean;
}

/** The part of the graph that sizes llama.cpp's compute buffer (the largest of them). */
export type ComputeStage = "logits" | "feed-forward" | "attention";

export interface GgufMemoryEstimate {
  engine: "llamacpp";
  contextSize: number;
  /** The context the model was trained for (`{arch}.context_length`); 0 when the header does not say. */
  trainedContext: number;
  /** The context llama.cpp allocates: contextSize padded to a multiple of 256. */
  allocatedContext: number;
  parallel: number;
  kvType: KvCacheType;
  weightsBytes: number;
  kvCacheBytes: number;
  kvBytesPerToken: number;
  overheadBytes: number;
  /** `computeStage` is the stage that sized the compute buffer; `computeStageName` says it for people. */
  overhead: { computeBytes: number; computeStage: ComputeStage; computeStageName: string; outputBytes: number; fixedBytes: number };
  totalBytes: number;
  basis: string;
  /** What the operator should know before serving with this context (for example a context beyond the trained one). */
  warnings: string[];
}

// llama.cpp v0.4.0 pads n_ctx to a multiple of 256 whatever the attention kernel
// (src/llama-context.cpp: `cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256)`); engines.md's
// "32, or 256 with flash attention" describes older builds. Padding up is the safe side.
const CONTEXT_PADDING = 256;
// Micro-batch: llama-server's n_ubatch default and node-llama-cpp's batch size (it sets
// n_ubatch = n_batch = min(512, context × sequences)). Compute buffers are reserved for it.
const MICRO_BATCH = 512;
// engines.md / gguf-parser: a fixed ~5 MiB plus the metadata and ~96 bytes per token for
// the tokenizer's tables.
const FIXED_BYTES = 5 * MiB;
const TOKENIZER_BYTES_PER_TOKEN = 96;

/** Weights + KV cache for `contextSize` + engine overhead for a GGUF model on llama.cpp. */
export function estimateGgufMemory(options: GgufMemoryOptions): GgufMemoryEstimate {
  const { header } = options;
  const parallel = Math.max(1, Math.floor(options.parallel ?? 1));
  const kvType = options.kvType ?? "f16";
  const flashAttention = options.flashAttention ?? true;
  if (!Number.isInteger(options.contextSize) || options.contextSize <= 0) {
    throw new BadRequestError(`Context size must be a positive integer, got ${options.contextSize}.`, { param: "context" });
  }
  const allocatedContext = Math.ceil(options.contextSize / CONTEXT_PADDING) * CONTEXT_PADDING;
  const elementBytes = KV_TYPE_BYTES[kvType];
  const weightsBytes = options.weightsBytes ?? header.tensorBytes;

  // KV cache (protocols.md §2, engines.md): per layer K[n_embd_head_k × n_head_kv, n_ctx]
  // and V[n_embd_head_v × n_head_kv, n_ctx] of the cache type. Sliding-window layers
  // (Gemma 2/3 and others) really get a smaller cache and recurrent layers a fixed state;
  // both are counted as full attention here, which overestimates those models.
  const kvHeadsPerLayer = header.headCountKvPerLayer ?? Array.from({ length: header.blockCount }, () => header.headCountKv);
  const kvHeadsTotal = kvHeadsPerLayer.reduce((sum, n) => sum + n, 0);
  const kvBytesPerToken = kvHeadsTotal * (header.keyLength + header.valueLength) * elementBytes;
  const kvCacheBytes = Math.ceil(kvBytesPerToken * allocatedContext);

  // Compute buffer: ggml reserves the graph for one micro-batch and reuses memory between
  // stages, so the buffer is about its largest stage, in f32 values per batch token:
  // - logits: n_vocab + n_embd;
  // - feed-forward: gate, up, their activation and product (4 × n_ff) + 3 × n_embd;
  // - attention without flash attention: the scores and the f32 mask (n_ctx × (n_head + 1))
  //   + 6 × n_embd; with flash attention the scores are never materialised (the f16 mask,
  //   n_ctx / 2, remains).
  // Checked against llama.cpp v0.4.0's own "compute buffer size" log line through
  // node-llama-cpp on generated llama models (feed-forward and attention stages, with and
  // without flash attention, to within 0.5 MiB), and it gives Llama-3-8B's 258.5 MiB.
  const microBatch = Math.min(MICRO_BATCH, allocatedContext);
  const vocab = header.vocabSize ?? 0;
  const embd = header.embeddingLength;
  const logitsStage = 4 * microBatch * (vocab + embd);
  const ffnStage = 4 * microBatch * (4 * (header.feedForwardLength ?? 4 * embd) + 3 * embd);
  const attentionStage = flashAttention
    ? 4 * microBatch * (allocatedContext / 2 + 6 * embd)
    : 4 * microBatch * (allocatedContext * (header.headCount + 1) + 6 * embd);
  // The first of equal stages wins, in this order, so a tie names the stage named before.
  const stages: Array<{ stage: ComputeStage; bytes: number }> = [
    { stage: "logits", bytes: logitsStage },
    { stage: "feed-forward", bytes: ffnStage },
    { stage: "attention", bytes: attentionStage },
  ];
  const largest = stages.reduce((best, next) => (next.bytes > best.bytes ? next : best));
  const computeBytes = largest.bytes;
  const computeStage = largest.stage;
  const computeStageName =
    computeStage === "attention" ? (flashAttention ? "attention stage, flash attention" : "attention scores without flash attention") : `${computeStage} stage`;
  // Output buffer: llama.cpp v0.4.0 reserves logits for one token per sequence
  // (llama_context::output_reserve(n_seq_max)), growing only when a request asks for more
  // outputs (prompt logprobs). engines.md's 4 · min(n_ctx, 512) · (n_embd + n_vocab) is
  // gguf-parser's older sizing and would add ~250 MiB for a 128k vocabulary.
  const outputBytes = 4 * parallel * (vocab + embd);
  const fixedBytes = FIXED_BYTES + (header.metadataBytes ?? 0) + TOKENIZER_BYTES_PER_TOKEN * vocab;
  const overheadBytes = computeBytes + outputBytes + fixedBytes;
  const totalBytes = weightsBytes + kvCacheBytes + overheadBytes;

  const kvShape = header.headCountKvPerLayer
    ? `${countOf(kvHeadsTotal, "KV head")} summed over ${countOf(header.blockCount, "layer")}`
    : `${countOf(header.blockCount, "layer")} × ${countOf(header.headCountKv, "KV head")}`;
  const dims = header.keyLength === header.valueLength ? `${header.keyLength} dims × 2 (K+V)` : `(${header.keyLength} K + ${header.valueLength} V) dims`;
  const tokens =
    allocatedContext === options.contextSize
      ? `${allocatedContext} tokens`
      : `${allocatedContext} tokens (${options.contextSize} padded to a multiple of ${CONTEXT_PADDING})`;
  const beyondTraining =
    header.contextLength > 0 && options.contextSize > header.contextLength
      ? `; the context exceeds the ${header.contextLength} tokens the model was trained for`
      : "";
  const warnings =
    beyondTraining === ""
      ? []
      : [
          `The ${options.contextSize}-token context exceeds the ${header.contextLength} tokens the model was trained for: answers that run past ${header.contextLength} tokens may lose coherence. Plan with --context ${header.contextLength} or less unless the model is known to extend its context.`,
        ];
  const noAttention = kvHeadsTotal === 0 ? " (the header has no attention heads, so no KV cache is counted)" : "";
  const basis =
    `weights ${formatBytes(weightsBytes)} (tensor data in the header)` +
    ` + KV cache ${formatBytes(kvCacheBytes)} (${kvShape} × ${dims} × ${elementBytes} bytes (${kvType}) × ${tokens}, one cache shared by ${countOf(parallel, "slot")})${noAttention}` +
    ` + engine overhead ${formatBytes(overheadBytes)} (compute buffer ${formatBytes(computeBytes)} for a ${microBatch}-token batch, ${computeStageName}${flashAttention && computeStage !== "attention" ? ", flash attention on" : ""};` +
    ` output buffer ${formatBytes(outputBytes)}; metadata and tokenizer ${formatBytes(fixedBytes)})` +
    ` = ${formatBytes(totalBytes)} on llama.cpp${beyondTraining}`;

  return {
    engine: "llamacpp",
    contextSize: options.contextSize,
    trainedContext: header.contextLength,
    allocatedContext,
    parallel,
    kvType,
    weightsBytes,
    kvCacheBytes,
    kvBytesPerToken,
    overheadBytes,
    overhead: { computeBytes, computeStage, computeStageName, outputBytes, fixedBytes },
    totalBytes,
    basis,
    warnings,
  };
}

/**
 * Memory per GPU when llama.cpp offloads every layer to `gpus` GPUs of one node (its
 * default layer split): weights and KV cache divide by layers, about evenly; each GPU holds
 * a compute buffer. The output buffer and tokenizer stay in host memory. Partial offload
 * (some layers on the CPU) is not modelled.
 */
export function llamaCppPerGpuBytes(estimate: GgufMemoryEstimate, gpus: number): number {
  const count = Math.max(1, Math.floor(gpus));
  return Math.ceil((estimate.weightsBytes + estimate.kvCacheBytes) / count) + estimate.overhead.computeBytes;
}

// ---------------------------------------------------------------------------------------
// safetensors on vLLM

/** vLLM's `--gpu-memory-utilization` default: it claims 90% of each GPU. */
export const VLLM_GPU_MEMORY_UTILIZATION = 0.9;
// GPUStack's rule (engines.md): weights × 1.2 + 2 GiB. The 2 GiB (CUDA context, the
// activation peak vLLM profiles, CUDA graphs) is applied per GPU when the model is split.
const VLLM_WEIGHTS_FACTOR = 1.2;
const VLLM_RUNTIME_BYTES = 2 * GiB;

/** What a GPU offers vLLM: its memory × `--gpu-memory-utilization`. */
export function vllmUsableBytes(gpuMemoryBytes: number, utilization = VLLM_GPU_MEMORY_UTILIZATION): number {
  return Math.floor(gpuMemoryBytes * utilization);
}

const DTYPE_BYTES: Record<string, number> = {
  float32: 4,
  float: 4,
  fp32: 4,
  float16: 2,
  half: 2,
  fp16: 2,
  bfloat16: 2,
  bf16: 2,
  float8_e4m3fn: 1,
  float8_e5m2: 1,
  fp8: 1,
};

export interface SafetensorsIndex {
  metadata?: { total_size?: number | string; total_parameters?: number | string };
}

export interface SafetensorsMemoryOptions {
  /** The repository's config.json. */
  config: Record<string, unknown>;
  /** model.safetensors.index.json, for metadata.total_size (and total_parameters where present). */
  index?: SafetensorsIndex;
  /** Sum of the .safetensors file sizes, when there is no index (single-file models). */
  totalBytes?: number;
  /** Overrides config.json's torch_dtype. */
  dtype?: string;
  /** vLLM's `--max-model-len`. */
  contextSize: number;
}

export interface SafetensorsMemoryEstimate {
  engine: "vllm";
  contextSize: number;
  /** The dtype the weights are stored in (config.json). */
  dtype: string;
  /** The dtype vLLM computes and caches in (`--dtype auto`: float32 models run in float16). */
  servedDtype: string;
  /** Set when config.json has a quantization_config; weights are then the stored bytes. */
  quantisation?: { method: string; bits?: number };
  parameterCount?: number;
  weightsBytes: number;
  kvCacheBytes: number;
  kvBytesPerToken: number;
  /** weights × 1.2 + 2 GiB (GPUStack's rule). */
  ruleOfThumbBytes: number;
  /** weights + KV cache for one full-length sequence + 2 GiB runtime. */
  withKvBytes: number;
  /** The larger of the two, on one GPU. */
  totalBytes: number;
  shape: { layers: number; attentionHeads: number; kvHeads: number; headDim: number; kvElementBytes: number };
  basis: string;
}

function configNumber(config: Record<string, unknown>, ...keys: string[]): number | undefined {
  for (const key of keys) {
    const value = config[key];
    if (typeof value === "number" && Number.isFinite(value)) return value;
  }
  return undefined;
}

function asNumber(value: number | string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const parsed = typeof value === "number" ? value : Number(value);
  return Number.isFinite(parsed) && parsed > 0 ? parsed : undefined;
}

/**
 * vLLM memory for a safetensors repository: parameters and dtype from the index metadata
 * and config.json, KV cache from config.json for `--max-model-len` tokens (vLLM refuses to
 * start unless one full-length sequence fits). Multi-head latent attention (DeepSeek's
 * kv_lora_rank) and sliding windows cache less than counted here.
 */
export function estimateSafetensorsMemory(options: SafetensorsMemoryOptions): SafetensorsMemoryEstimate {
  const root = options.config;
  // Multimodal configs (Llava, Gemma 3, Mistral 3) keep the language model's shape in text_config.
  const text = typeof root.text_config === "object" && root.text_config !== null ? (root.text_config as Record<string, unknown>) : root;
  const layers = configNumber(text, "num_hidden_layers", "n_layer", "num_layers");
  const attentionHeads = configNumber(text, "num_attention_heads", "n_head");
  const hidden = configNumber(text, "hidden_size", "n_embd", "d_model");
  if (layers === undefined || attentionHeads === undefined) {
    throw new BadRequestError("config.json lacks num_hidden_layers or num_attention_heads, so llmgw cannot size the KV cache.", {
      code: "config_incomplete",
    });
  }
  const kvHeads = configNumber(text, "num_key_value_heads", "n_head_kv") ?? (text.multi_query === true ? 1 : attentionHeads);
  const headDim = configNumber(text, "head_dim") ?? (hidden === undefined ? undefined : hidden / attentionHeads);
  if (headDim === undefined) {
    throw new BadRequestError("config.json has neither head_dim nor hidden_size, so llmgw cannot size the KV cache.", { code: "config_incomplete" });
  }

  const dtype = String(options.dtype ?? root.torch_dtype ?? root.dtype ?? text.torch_dtype ?? text.dtype ?? "bfloat16").toLowerCase();
  const storedBytes = DTYPE_BYTES[dtype];
  if (storedBytes === undefined) {
    throw new BadRequestError(`Unknown dtype '${dtype}' in config.json; expected one of ${Object.keys(DTYPE_BYTES).join(", ")}.`, {
      code: "config_incomplete",
    });
  }
  // vLLM's --dtype auto serves float32 checkpoints in float16 and keeps 16-bit ones as they are.
  const servedDtype = storedBytes === 4 ? "float16" : storedBytes === 1 ? "bfloat16" : dtype;
  const servedBytes = DTYPE_BYTES[servedDtype] ?? 2;

  const quantConfig = root.quantization_config;
  const quantisation =
    typeof quantConfig === "object" && quantConfig !== null
      ? (() => {
          const q = quantConfig as Record<string, unknown>;
          const method = typeof q.quant_method === "string" ? q.quant_method : "quantised";
          const bits = configNumber(q, "bits", "w_bit", "weight_bits") ?? (/fp8/i.test(method) ? 8 : undefined);
          return bits === undefined ? { method } : { method, bits };
        })()
      : undefined;

  const storedTotal = asNumber(options.index?.metadata?.total_size) ?? asNumber(options.totalBytes);
  const declaredParameters = asNumber(options.index?.metadata?.total_parameters);
  if (storedTotal === undefined && declaredParameters === undefined) {
    throw new BadRequestError("Neither the safetensors index's metadata.total_size nor the files' total size is known, so llmgw cannot size the weights.", {
      code: "config_incomplete",
    });
  }
  let parameterCount: number | undefined;
  let weightsBytes: number;
  let weightsWhy: string;
  if (quantisation) {
    // Packed integer weights: the stored bytes are what is loaded; parameters are not derivable.
    parameterCount = declaredParameters;
    weightsBytes = storedTotal ?? (declaredParameters ?? 0) * servedBytes;
    weightsWhy = `${quantisation.method}${quantisation.bits ? ` ${quantisation.bits}-bit` : ""} weights as stored`;
  } else {
    parameterCount = declaredParameters ?? Math.round((storedTotal ?? 0) / storedBytes);
    weightsBytes = parameterCount * servedBytes;
    weightsWhy = `${(parameterCount / 1e9).toFixed(1)}B parameters × ${servedBytes} bytes (${servedDtype}${servedDtype === dtype ? "" : `, stored as ${dtype}`})`;
  }

  const kvBytesPerToken = layers * kvHeads * headDim * 2 * servedBytes;
  const kvCacheBytes = kvBytesPerToken * options.contextSize;
  const ruleOfThumbBytes = Math.ceil(weightsBytes * VLLM_WEIGHTS_FACTOR) + VLLM_RUNTIME_BYTES;
  const withKvBytes = weightsBytes + kvCacheBytes + VLLM_RUNTIME_BYTES;
  const totalBytes = Math.max(ruleOfThumbBytes, withKvBytes);

  const basis =
    `weights ${formatBytes(weightsBytes)} (${weightsWhy}); KV cache ${formatBytes(kvCacheBytes)} for one ${options.contextSize}-token sequence` +
    ` (${countOf(layers, "layer")} × ${countOf(kvHeads, "KV head")} × ${headDim} dims × 2 (K+V) × ${servedBytes} bytes); needs the larger of` +
    ` weights × ${VLLM_WEIGHTS_FACTOR} + 2 GiB = ${formatBytes(ruleOfThumbBytes)} (GPUStack's rule) and weights + KV cache + 2 GiB runtime = ${formatBytes(withKvBytes)}` +
    ` → ${formatBytes(totalBytes)} on one GPU; vLLM claims ${VLLM_GPU_MEMORY_UTILIZATION * 100}% of each GPU (--gpu-memory-utilization), so a GPU offers 0.9 × its memory`;

  return {
    engine: "vllm",
    contextSize: options.contextSize,
    dtype,
    servedDtype,
    ...(quantisation ? { quantisation } : {}),
    ...(parameterCount === undefined ? {} : { parameterCount }),
    weightsBytes,
    kvCacheBytes,
    kvBytesPerToken,
    ruleOfThumbBytes,
    withKvBytes,
    totalBytes,
    shape: { layers, attentionHeads, kvHeads, headDim, kvElementBytes: servedBytes },
    basis,
  };
}

/**
 * Memory per GPU for vLLM with tensor parallel `tensorParallel` (GPUs per node) and
 * pipeline parallel `pipelineParallel` (nodes): weights divide over every GPU; the KV cache
 * divides by layers across pipeline stages and by KV heads across tensor-parallel ranks,
 * except that a rank always holds at least one KV head (vLLM replicates them when there are
 * fewer KV heads than ranks). The 1.2 factor and the 2 GiB runtime apply per GPU.
 */
export function vllmPerGpuBytes(estimate: SafetensorsMemoryEstimate, parallel: { tensorParallel: number; pipelineParallel: number }): number {
  const tp = Math.max(1, Math.floor(parallel.tensorParallel));
  const pp = Math.max(1, Math.floor(parallel.pipelineParallel));
  const { layers, kvHeads, headDim, kvElementBytes } = estimate.shape;
  const weightsShare = estimate.weightsBytes / (tp * pp);
  const kvShare = Math.ceil(layers / pp) * Math.max(1, kvHeads / tp) * headDim * 2 * kvElementBytes * estimate.contextSize;
  return Math.ceil(Math.max(weightsShare * VLLM_WEIGHTS_FACTOR, weightsShare + kvShare)) + VLLM_RUNTIME_BYTES;
}
