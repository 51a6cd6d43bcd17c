import { test, describe } from "node:test";
import assert from "node:assert/strict";
import {
  estimateGgufMemory,
  estimateSafetensorsMemory,
  llamaCppPerGpuBytes,
  vllmPerGpuBytes,
  vllmUsableBytes,
  type GgufModelShape,
} from "./memory-estimate.ts";
import { BadRequestError } from "../core/errors.ts";
import { LLAMA3_8B as LLAMA3_8B_SHAPE } from "../../test/support/model-shapes.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

/** Llama-3-8B's shape as its GGUF header states it, with the size of its metadata. */
const LLAMA3_8B: GgufModelShape = { ...LLAMA3_8B_SHAPE, metadataBytes: 7_900_000 };

/** config.json of Llama-3-8B-Instruct (the fields that matter). */
const LLAMA3_8B_CONFIG = {
  architectures: ["LlamaForCausalLM"],
  hidden_size: 4096,
  intermediate_size: 14336,
  num_attention_heads: 32,
  num_hidden_layers: 32,
  num_key_value_heads: 8,
  max_position_embeddings: 8192,
  torch_dtype: "bfloat16",
  vocab_size: 128256,
};

describe("estimateGgufMemory", () => {
  test("KV cache for Llama-3-8B at 8192 tokens is exactly 1 GiB", () => {
    const estimate = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192 });
    assert.equal(estimate.kvBytesPerToken, 128 * 1024);
    assert.equal(estimate.kvCacheBytes, GiB);
    assert.equal(estimate.allocatedContext, 8192);
    assert.equal(estimate.weightsBytes, LLAMA3_8B.tensorBytes);
    assert.match(estimate.basis, /KV cache 1\.0 GiB \(32 layers × 8 KV heads × 128 dims × 2 \(K\+V\) × 2 bytes \(f16\) × 8192 tokens/);
    assert.match(estimate.basis, /^weights 4\.6 GiB/);
  });

  test("overhead: the logits stage dominates the compute buffer for a 128k vocabulary (258.5 MiB, as llama.cpp logs)", () => {
    const estimate = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192 });
    assert.equal(estimate.overhead.computeBytes, 512 * 4 * (128256 + 4096));
    assert.equal(estimate.overhead.computeBytes / MiB, 258.5);
    assert.equal(estimate.overhead.outputBytes, 4 * (128256 + 4096));
    assert.equal(estimate.overhead.fixedBytes, 5 * MiB + 7_900_000 + 96 * 128256);
    assert.equal(estimate.overheadBytes, estimate.overhead.computeBytes + estimate.overhead.outputBytes + estimate.overhead.fixedBytes);
    assert.equal(estimate.totalBytes, estimate.weightsBytes + estimate.kvCacheBytes + estimate.overheadBytes);
    assert.match(estimate.basis, /engine overhead 0\.3 GiB \(compute buffer 0\.3 GiB for a 512-token batch, logits stage, flash attention on/);
  });

  test("without flash attention the attention scores grow with the context", () => {
    const on = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192 });
    const off = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192, flashAttention: false });
    assert.equal(off.overhead.computeBytes, 4 * 512 * (8192 * 33 + 6 * 4096));
    assert.ok(off.overhead.computeBytes > on.overhead.computeBytes);
    assert.match(off.basis, /attention scores without flash attention/);
  });

  test("the compute buffer names the stage that sized it, whichever it is", () => {
    assert.equal(estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192 }).overhead.computeStage, "logits");
    // A small vocabulary and a long context: with flash attention the attention stage
    // (half the context per batch token) outgrows logits and feed-forward.
    const small: GgufModelShape = { ...LLAMA3_8B, vocabSize: 1000, embeddingLength: 64, feedForwardLength: 128, contextLength: 131072 };
    const long = estimateGgufMemory({ header: small, contextSize: 65536 });
    assert.equal(long.overhead.computeStage, "attention");
    assert.equal(long.overhead.computeBytes, 4 * 512 * (65536 / 2 + 6 * 64));
    assert.equal(long.overhead.computeStageName, "attention stage, flash attention");
    assert.match(long.basis, /for a 512-token batch, attention stage, flash attention;/);
    assert.doesNotMatch(long.basis, /logits stage/);
    const wide = estimateGgufMemory({ header: { ...small, feedForwardLength: 1_000_000 }, contextSize: 4096 });
    assert.equal(wide.overhead.computeStageName, "feed-forward stage");
    assert.equal(
      estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192, flashAttention: false }).overhead.computeStageName,
      "attention scores without flash attention",
    );
  });

  test("the basis counts in words that agree with their numbers", () => {
    const single = estimateGgufMemory({ header: { ...LLAMA3_8B, blockCount: 1, headCountKv: 1 }, contextSize: 256 });
    assert.match(single.basis, /\(1 layer × 1 KV head × 128 dims × 2 \(K\+V\)/);
    assert.match(single.basis, /one cache shared by 1 slot\)/);
    assert.match(estimateGgufMemory({ header: LLAMA3_8B, contextSize: 256, parallel: 2 }).basis, /32 layers × 8 KV heads .* shared by 2 slots\)/);
    const mqa = estimateSafetensorsMemory({
      config: { ...LLAMA3_8B_CONFIG, num_hidden_layers: 1, num_key_value_heads: 1 },
      totalBytes: GiB,
      contextSize: 1024,
    });
    assert.match(mqa.basis, /\(1 layer × 1 KV head × 128 dims/);
  });

  test("the context is padded to a multiple of 256 and shared by all slots", () => {
    const one = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 1000 });
    assert.equal(one.allocatedContext, 1024);
    assert.equal(one.kvCacheBytes, 128 * 1024 * 1024);
    assert.match(one.basis, /1024 tokens \(1000 padded to a multiple of 256\)/);
    const four = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 1000, parallel: 4 });
    assert.equal(four.kvCacheBytes, one.kvCacheBytes);
    assert.equal(four.overhead.outputBytes, 4 * one.overhead.outputBytes);
  });

  test("quantised KV cache and per-layer KV heads", () => {
    const q8 = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192, kvType: "q8_0" });
    assert.equal(q8.kvCacheBytes, (GiB / 2) * (34 / 32));
    const perLayer = estimateGgufMemory({
      header: { ...LLAMA3_8B, blockCount: 4, headCountKvPerLayer: [2, 4, 8, 0] },
      contextSize: 256,
    });
    assert.equal(perLayer.kvCacheBytes, 256 * 14 * 256 * 2);
    assert.match(perLayer.basis, /14 KV heads summed over 4 layers/);
  });

  test("a context beyond the trained one is said in the basis; a bad context is a 400", () => {
    const beyond = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 16384 });
    assert.match(beyond.basis, /exceeds the 8192 tokens the model was trained for/);
    assert.equal(beyond.trainedContext, 8192);
    assert.equal(beyond.warnings.length, 1);
    assert.match(beyond.warnings[0]!, /^The 16384-token context exceeds the 8192 tokens the model was trained for.*--context 8192/);
    assert.deepEqual(estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192 }).warnings, []);
    assert.throws(() => estimateGgufMemory({ header: LLAMA3_8B, contextSize: 0 }), BadRequestError);
  });

  test("llama.cpp's layer split divides weights and KV cache; each GPU keeps a compute buffer", () => {
    const estimate = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192 });
    const one = llamaCppPerGpuBytes(estimate, 1);
    const two = llamaCppPerGpuBytes(estimate, 2);
    assert.equal(one, estimate.weightsBytes + estimate.kvCacheBytes + estimate.overhead.computeBytes);
    assert.equal(two, Math.ceil((estimate.weightsBytes + estimate.kvCacheBytes) / 2) + estimate.overhead.computeBytes);
  });
});

describe("estimateSafetensorsMemory", () => {
  test("parameters and dtype from the index and config.json; KV cache from config.json", () => {
    const estimate = estimateSafetensorsMemory({
      config: LLAMA3_8B_CONFIG,
      index: { metadata: { total_size: 16_060_522_496 } },
      contextSize: 8192,
    });
    assert.equal(estimate.dtype, "bfloat16");
    assert.equal(estimate.servedDtype, "bfloat16");
    assert.equal(estimate.parameterCount, 8_030_261_248);
    assert.equal(estimate.weightsBytes, 16_060_522_496);
    assert.deepEqual(estimate.shape, { layers: 32, attentionHeads: 32, kvHeads: 8, headDim: 128, kvElementBytes: 2 });
    assert.equal(estimate.kvCacheBytes, GiB);
    assert.equal(estimate.ruleOfThumbBytes, Math.ceil(16_060_522_496 * 1.2) + 2 * GiB);
    assert.equal(estimate.withKvBytes, 16_060_522_496 + GiB + 2 * GiB);
    assert.equal(estimate.totalBytes, estimate.ruleOfThumbBytes, "at 8k the 20% margin is larger than the KV cache");
    assert.match(estimate.basis, /8\.0B parameters × 2 bytes \(bfloat16\)/);
    assert.match(estimate.basis, /0\.9 × its memory/);
  });

  test("a long context makes the KV cache decide", () => {
    const estimate = estimateSafetensorsMemory({ config: LLAMA3_8B_CONFIG, totalBytes: 16_060_522_496, contextSize: 131072 });
    assert.equal(estimate.kvCacheBytes, 16 * GiB);
    assert.equal(estimate.totalBytes, estimate.withKvBytes);
  });

  test("head_dim, text_config, float32 checkpoints and quantised weights", () => {
    const gemmaLike = estimateSafetensorsMemory({
      config: {
        torch_dtype: "float32",
        text_config: { num_hidden_layers: 10, num_attention_heads: 8, num_key_value_heads: 4, head_dim: 256, hidden_size: 1024 },
      },
      totalBytes: 4_000_000_000,
      contextSize: 1000,
    });
    assert.equal(gemmaLike.servedDtype, "float16", "vLLM's --dtype auto serves float32 in float16");
    assert.equal(gemmaLike.parameterCount, 1_000_000_000);
    assert.equal(gemmaLike.weightsBytes, 2_000_000_000);
    assert.equal(gemmaLike.kvCacheBytes, 10 * 4 * 256 * 2 * 2 * 1000);

    const awq = estimateSafetensorsMemory({
      config: { ...LLAMA3_8B_CONFIG, torch_dtype: "float16", quantization_config: { quant_method: "awq", bits: 4 } },
      index: { metadata: { total_size: "5730000000" } },
      contextSize: 8192,
    });
    assert.deepEqual(awq.quantisation, { method: "awq", bits: 4 });
    assert.equal(awq.weightsBytes, 5_730_000_000);
    assert.equal(awq.parameterCount, undefined);
  });

  test("an incomplete config.json is a 400 that says what is missing", () => {
    assert.throws(() => estimateSafetensorsMemory({ config: { hidden_size: 10 }, totalBytes: 1, contextSize: 1 }), /num_hidden_layers/);
    assert.throws(() => estimateSafetensorsMemory({ config: LLAMA3_8B_CONFIG, contextSize: 1 }), BadRequestError);
  });

  test("per GPU with tensor and pipeline parallel; KV heads replicate past their count", () => {
    const estimate = estimateSafetensorsMemory({ config: LLAMA3_8B_CONFIG, totalBytes: 16_060_522_496, contextSize: 8192 });
    assert.equal(vllmPerGpuBytes(estimate, { tensorParallel: 1, pipelineParallel: 1 }), estimate.totalBytes);
    const tp2 = vllmPerGpuBytes(estimate, { tensorParallel: 2, pipelineParallel: 1 });
    assert.equal(tp2, Math.ceil((16_060_522_496 / 2) * 1.2) + 2 * GiB);
    const tp2pp2 = vllmPerGpuBytes(estimate, { tensorParallel: 2, pipelineParallel: 2 });
    assert.ok(tp2pp2 < tp2);
    // 8 KV heads on 16 ranks: each rank still holds a whole head.
    const long = estimateSafetensorsMemory({ config: LLAMA3_8B_CONFIG, totalBytes: 1_000_000, contextSize: 131072 });
    assert.equal(
      vllmPerGpuBytes(long, { tensorParallel: 16, pipelineParallel: 1 }),
      vllmPerGpuBytes(long, { tensorParallel: 8, pipelineParallel: 1 }) - Math.ceil(1_000_000 / 8 - 1_000_000 / 16),
    );
    assert.equal(vllmUsableBytes(80 * GiB), Math.floor(72 * GiB));
  });
});
