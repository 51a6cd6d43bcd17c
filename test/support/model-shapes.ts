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

/** A llama the size of `up --demo`'s generated model: 2 layers of 64, a 400-token vocabulary, 200 kB of tensors. */
export const TINY_LLAMA: GgufModelShape = {
  ...LLAMA3_8B,
  embeddingLength: 64,
  blockCount: 2,
  headCount: 4,
  headCountKv: 4,
  keyLength: 16,
  valueLength: 16,
  feedForwardLength: 128,
  vocabSize: 400,
  tensorBytes: 200_000,
};

/** A 135M model of SmolLM's shape (30 layers of 576, 3 KV heads) at Q4: 100 MiB of tensors. */
export const SMOL_135M: GgufModelShape = {
  ...LLAMA3_8B,
  embeddingLength: 576,
  blockCount: 30,
  headCount: 9,
  headCountKv: 3,
  keyLength: 64,
  valueLength: 64,
  feedForwardLength: 1536,
  vocabSize: 49152,
  tensorBytes: 100 * 1024 * 1024,
};
