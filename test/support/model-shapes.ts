// Model shapes as their GGUF headers state them, for estimates and placement tests.
import type { GgufModelShape } from "../../src/gguf/memory-estimate.ts";

/** Llama-3-8B (32 layers, 8 KV heads, head size 128), Q4_K_M: 4.58 GiB of tensors. */
export const LLAMA3_8B: GgufModelShape = {
  architecture: "llama",
  contextLength: 8192,
  embeddingLength: 4096,
  blockCount: 32,
  headCount: 32,
  headCountKv: 8,
  keyLength: 128,
  valueLength: 128,
  feedForwardLength: 14336,
  vocabSize: 128256,
  tensorBytes: 4_920_734_720,
};
