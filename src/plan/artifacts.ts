// Candidate artifacts for the planner: a GGUF quantisation (from its header) or the
// repository's safetensors weights (from config.json and the index), each with its quality
// rank and its memory estimate for the plan's context.
//
// Quality rank, higher is better:
// - original safetensors weights: 1000. They are what the authors published; a GGUF F16
//   converted from BF16 is as good in practice but ranks just below, so a GPU that fits the
//   original serves it with vLLM.
// - GGUF F32, BF16 and F16: 900, equal, so the smaller one wins on resources.
// - other GGUF quantisations: 900 minus the position in @huggingface/gguf's
//   GGUF_QUANT_ORDER (best first: Q8_0 > Q6_K > Q5_K_M > Q5_K_S > … > Q4_K_M > … > Q2_K >
//   IQ2 … > IQ1), so Q8_0 = 896, Q4_K_M = 885, Q2_K = 864.
// - quantised safetensors (a quantization_config: AWQ, GPTQ, FP8 …): ranked as the GGUF of
//   the same bits (8 → Q8_0, 6 → Q6_K, 5 → Q5_K_M, 4 → Q4_K_M, 3 → Q3_K_M, 2 → Q2_K).
// - unknown: 0.
import { GGMLFileQuantizationType, GGUF_QUANT_ORDER, parseGGUFQuantLabel } from "@huggingface/gguf";
import type { ArchitectureSupport } from "../gguf/llama-support.ts";
import { estimateGgufMemory, estimateSafetensorsMemory, type GgufModelShape, type KvCacheType, type SafetensorsIndex } from "../gguf/memory-estimate.ts";
import type { PlanArtifact } from "./plan.ts";

export const ORIGINAL_WEIGHTS_RANK = 1000;
const FULL_PRECISION_RANK = 900;
const FULL_PRECISION = new Set(["F32", "BF16", "F16"]);
// ggml tensor-type names (the fallback label when a file has no general.file_type) → the file type they usually mean.
const TENSOR_TYPE_ALIASES: Record<string, string> = { Q2_K: "Q2_K", Q3_K: "Q3_K_M", Q4_K: "Q4_K_M", Q5_K: "Q5_K_M", Q6_K: "Q6_K", MXFP4: "MXFP4_MOE" };
const BITS_TO_GGUF: Record<number, string> = { 8: "Q8_0", 6: "Q6_K", 5: "Q5_K_M", 4: "Q4_K_M", 3: "Q3_K_M", 2: "Q2_K" };

/** The quality rank of a GGUF quantisation label such as "Q4_K_M" (case-insensitive). */
export function ggufQualityRank(label: string): number {
  const upper = label.toUpperCase();
  const name = TENSOR_TYPE_ALIASES[upper] ?? upper;
  if (FULL_PRECISION.has(name)) return FULL_PRECISION_RANK;
  const fileType = (GGMLFileQuantizationType as unknown as Record<string, number | undefined>)[name];
  if (fileType === undefined) return 0;
  const position = GGUF_QUANT_ORDER.indexOf(fileType);
  return position < 0 ? 0 : FULL_PRECISION_RANK - position;
}

export interface GgufArtifactInput {
  /** A header summary from readGgufHeader, or any object with these fields. */
  header: GgufModelShape & { quantisation: string; fileBytes?: number };
  contextSize: number;
  /** Bytes of the artifact's files (all shards). Default the header's file size, else its tensor bytes. */
  bytes?: number;
  /** Sum of tensorBytes over every shard, for split files. Default header.tensorBytes. */
  weightsBytes?: number;
  files?: string[];
  /** Label override; default the header's quantisation, else the file name's. */
  label?: string;
  parallel?: number;
  kvType?: KvCacheType;
  /** The architecture check for the nodes' llama.cpp; an unsupported one makes every option unfit. */
  support?: ArchitectureSupport;
}

export function ggufArtifact(input: GgufArtifactInput): PlanArtifact {
  const { header } = input;
  const fromName = input.files?.[0] ? parseGGUFQuantLabel(input.files[0]) : undefined;
  const label = input.label ?? (header.quantisation !== "unknown" ? header.quantisation : (fromName ?? "unknown"));
  const memory = estimateGgufMemory({
    header,
    contextSize: input.contextSize,
    ...(input.parallel === undefined ? {} : { parallel: input.parallel }),
    ...(input.kvType === undefined ? {} : { kvType: input.kvType }),
    ...(input.weightsBytes === undefined ? {} : { weightsBytes: input.weightsBytes }),
  });
  return {
    id: label,
    label,
    format: "gguf",
    bytes: input.bytes ?? header.fileBytes ?? header.tensorBytes,
    qualityRank: ggufQualityRank(label),
    memory,
    ...(input.support && !input.support.supported ? { unsupportedReason: input.support.reason } : {}),
    ...(input.files ? { files: input.files } : {}),
  };
}

export interface SafetensorsArtifactInput {
  config: Record<string, unknown>;
  index?: SafetensorsIndex;
  /** Sum of the .safetensors file sizes. */
  totalBytes?: number;
  dtype?: string;
  contextSize: number;
  files?: string[];
}

export function safetensorsArtifact(input: SafetensorsArtifactInput): PlanArtifact {
  const memory = estimateSafetensorsMemory({
    config: input.config,
    contextSize: input.contextSize,
    ...(input.index ? { index: input.index } : {}),
    ...(input.totalBytes === undefined ? {} : { totalBytes: input.totalBytes }),
    ...(input.dtype === undefined ? {} : { dtype: input.dtype }),
  });
  const dtypeLabel = ({ bfloat16: "BF16", float16: "F16", float32: "F32" } as Record<string, string>)[memory.dtype] ?? memory.dtype.toUpperCase();
  const quant = memory.quantisation;
  const label = quant ? `safetensors ${quant.method.toUpperCase()}${quant.bits ? ` ${quant.bits}-bit` : ""}` : `safetensors ${dtypeLabel}`;
  const qualityRank = quant ? ggufQualityRank(BITS_TO_GGUF[quant.bits ?? 4] ?? "Q4_K_M") : ORIGINAL_WEIGHTS_RANK;
  const totalSize = Number(input.index?.metadata?.total_size ?? NaN);
  return {
    id: "safetensors",
    label,
    format: "safetensors",
    bytes: input.totalBytes ?? (Number.isFinite(totalSize) ? totalSize : memory.weightsBytes),
    qualityRank,
    memory,
    ...(input.files ? { files: input.files } : {}),
  };
}
