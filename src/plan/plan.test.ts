import { test, describe, before, after } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { planModel, type PlanArtifact, type Pool, type PoolNode } from "./plan.ts";
import { ggufArtifact, ggufQualityRank, safetensorsArtifact, ORIGINAL_WEIGHTS_RANK } from "./artifacts.ts";
import { localPool } from "./local-pool.ts";
import { renderPlanTable } from "./render.ts";
import type { GgufModelShape } from "../gguf/memory-estimate.ts";
import { SMOL_135M, TINY_LLAMA } from "../../test/support/model-shapes.ts";
import { readGgufHeader } from "../gguf/header.ts";
import { checkArchitectureSupport } from "../gguf/llama-support.ts";
import { llamaMetadata, llamaTensors, writeGgufFixture } from "../../test/support/gguf-fixture.ts";

const GiB = 1024 ** 3;
const MiB = 1024 ** 2;
const CONTEXT = 8192;

// Shapes as the GGUF headers and config.json files of Llama-3-8B and Llama-3-70B state them.
const LLAMA3_8B: GgufModelShape = {
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
  tensorBytes: 0,
};
const LLAMA3_70B: GgufModelShape = { ...LLAMA3_8B, embeddingLength: 8192, blockCount: 80, headCount: 64, feedForwardLength: 28672 };
const CONFIG_8B = { hidden_size: 4096, num_attention_heads: 32, num_hidden_layers: 32, num_key_value_heads: 8, torch_dtype: "bfloat16" };
const CONFIG_70B = { hidden_size: 8192, num_attention_heads: 64, num_hidden_layers: 80, num_key_value_heads: 8, torch_dtype: "bfloat16" };

function gguf(shape: GgufModelShape, quantisation: string, bytes: number): PlanArtifact {
  return ggufArtifact({ header: { ...shape, tensorBytes: bytes, quantisation }, bytes, contextSize: CONTEXT });
}

// A 7-8B model repository: three GGUF quantisations and the original BF16 weights.
const repo8b = (): PlanArtifact[] => [
  gguf(LLAMA3_8B, "Q4_K_M", 4_920_000_000),
  gguf(LLAMA3_8B, "Q8_0", 8_540_000_000),
  gguf(LLAMA3_8B, "F16", 16_070_000_000),
  safetensorsArtifact({ config: CONFIG_8B, index: { metadata: { total_size: 16_060_522_496 } }, contextSize: CONTEXT }),
];
// A 70B repository of original weights (~141 GB BF16).
const repo70b = (): PlanArtifact[] => [safetensorsArtifact({ config: CONFIG_70B, index: { metadata: { total_size: 141_107_412_992 } }, contextSize: CONTEXT })];

const cpuNode = (name: string, memoryGiB: number, freeGiB = memoryGiB): PoolNode => ({
  name,
  cores: 8,
  memoryBytes: memoryGiB * GiB,
  memoryFreeBytes: freeGiB * GiB,
  gpus: [],
});
const gpuNode = (name: string, gpuClass: string, count: number, gpuBytes: number, memoryGiB = 256): PoolNode => ({
  name,
  cores: 64,
  memoryBytes: memoryGiB * GiB,
  gpus: Array.from({ length: count }, (_, index) => ({ index, class: gpuClass, memoryBytes: gpuBytes })),
});
// What nvidia-smi reports for an H200 ("141 GB") and an RTX 4090 ("24 GB").
const H200 = 143_771 * MiB;
const RTX4090 = 24_564 * MiB;

describe("planModel", () => {
  test("CPU-only 16 GB node: Q8_0 on the CPU, because F16 does not fit", () => {
    const plan = planModel({ artifacts: repo8b(), contextSize: CONTEXT, pool: { nodes: [cpuNode("laptop", 16, 12)] } });
    const rec = plan.recommendation;
    assert.ok(rec);
    assert.equal(rec.artifact.label, "Q8_0");
    assert.deepEqual(rec.placement, { kind: "cpu" });
    assert.equal(rec.engine, "llamacpp");
    assert.equal(rec.per, "node");
    assert.equal(rec.availableBytes, 14 * GiB, "16 GiB less the 2 GiB reserve");
    assert.equal(rec.hostsNow, 1);
    const f16 = plan.options.find((o) => o.artifact.label === "F16" && o.placement.kind === "cpu");
    assert.ok(f16 && !f16.fits);
    assert.match(f16.why ?? "", /the largest node, laptop, offers 14\.0 GiB/);
    const st = plan.options.find((o) => o.artifact.format === "safetensors");
    assert.ok(st && !st.fits);
    assert.match(st.why ?? "", /GPUs only; no node in the pool has a GPU/);
    assert.match(plan.explanation, /^Recommended: Q8_0 on the CPU with llama\.cpp/);
    assert.match(plan.explanation, /Better quality that does not fit: safetensors BF16, F16/);
  });

  test("one 24 GB GPU: the original BF16 weights on that GPU with vLLM", () => {
    const pool: Pool = { nodes: [gpuNode("workstation", "RTX 4090", 1, RTX4090, 64)] };
    const plan = planModel({ artifacts: repo8b(), contextSize: CONTEXT, pool });
    const rec = plan.recommendation;
    assert.ok(rec);
    assert.equal(rec.artifact.label, "safetensors BF16");
    assert.equal(rec.engine, "vllm");
    assert.deepEqual(rec.placement, { kind: "gpu", gpuClass: "RTX 4090", gpusPerNode: 1, nodes: 1 });
    assert.equal(rec.per, "gpu");
    assert.equal(rec.availableBytes, Math.floor(RTX4090 * 0.9));
    // F16 GGUF fits the same GPU too, ranked just below the original weights.
    const f16gpu = plan.options.find((o) => o.artifact.label === "F16" && o.placement.kind === "gpu");
    assert.ok(f16gpu?.fits);
  });

  test("among GPUs that fit, the smallest: the 8B model goes on the 24 GB card, not the H200", () => {
    const pool: Pool = { nodes: [gpuNode("hgx", "H200", 8, H200, 2048), gpuNode("workstation", "RTX 4090", 1, RTX4090, 64)] };
    const plan = planModel({ artifacts: repo8b(), contextSize: CONTEXT, pool });
    assert.equal(plan.recommendation?.artifact.label, "safetensors BF16");
    assert.deepEqual(plan.recommendation?.placement, { kind: "gpu", gpuClass: "RTX 4090", gpusPerNode: 1, nodes: 1 });
    // With the card busy, a free H200 is used rather than waiting for room.
    const busyCard = {
      ...gpuNode("workstation", "RTX 4090", 1, RTX4090, 64),
      gpus: [{ index: 0, class: "RTX 4090", memoryBytes: RTX4090, memoryFreeBytes: 2 * GiB }],
    };
    const busy = planModel({ artifacts: repo8b(), contextSize: CONTEXT, pool: { nodes: [gpuNode("hgx", "H200", 8, H200, 2048), busyCard] } });
    assert.deepEqual(busy.recommendation?.placement, { kind: "gpu", gpuClass: "H200", gpusPerNode: 1, nodes: 1 });
  });

  test("at equal quality, a GPU before the CPU: without vLLM the F16 GGUF goes on the GPU", () => {
    const node = { ...gpuNode("workstation", "RTX 4090", 1, RTX4090, 64), engines: { llamacpp: { version: "v0.4.0", gpu: true } } };
    const plan = planModel({ artifacts: repo8b(), contextSize: CONTEXT, pool: { nodes: [node] } });
    const rec = plan.recommendation;
    assert.ok(rec);
    assert.equal(rec.artifact.label, "F16");
    assert.equal(rec.placement.kind, "gpu");
    assert.ok(
      plan.options.some((o) => o.artifact.label === "F16" && o.placement.kind === "cpu" && o.fits),
      "the CPU would also do",
    );
    assert.match(plan.options.find((o) => o.engine === "vllm")?.why ?? "", /no GPU node reports vLLM/);
  });

  test("eight 141 GB GPUs and a 70B BF16 repository: tensor parallel on 2 H200", () => {
    const plan = planModel({ artifacts: repo70b(), contextSize: CONTEXT, pool: { nodes: [gpuNode("hgx-1", "H200", 8, H200, 2048)] } });
    const rec = plan.recommendation;
    assert.ok(rec);
    assert.equal(rec.engine, "vllm");
    assert.deepEqual(rec.placement, { kind: "gpu", gpuClass: "H200", gpusPerNode: 2, nodes: 1 });
    // weights 131.4 GiB / 2 × 1.2 + 2 GiB per GPU, against 0.9 × 140.4 GiB.
    assert.equal(rec.neededBytes, Math.ceil((141_107_412_992 / 2) * 1.2) + 2 * GiB);
    assert.ok(rec.neededBytes < rec.availableBytes);
    assert.equal(rec.hostsNow, 1);
    assert.match(renderPlanTable(plan), /2× H200 \(TP 2\)/);
  });

  test("a model bigger than any node goes across nodes with pipeline parallel", () => {
    const pool: Pool = { nodes: [gpuNode("a", "L40S", 2, 48 * GiB), gpuNode("b", "L40S", 2, 48 * GiB), gpuNode("c", "L40S", 1, 48 * GiB)] };
    const plan = planModel({ artifacts: repo70b(), contextSize: CONTEXT, pool });
    const rec = plan.recommendation;
    assert.ok(rec);
    assert.deepEqual(rec.placement, { kind: "gpu", gpuClass: "L40S", gpusPerNode: 2, nodes: 2 });
    assert.equal(rec.hostsNow, 1, "one group of two nodes");
    assert.match(renderPlanTable(plan), /2 nodes × 2× L40S \(TP 2, PP 2\)/);
  });

  test("tensor parallel sizes must divide the attention heads", () => {
    const artifact = safetensorsArtifact({
      config: { ...CONFIG_70B, num_attention_heads: 12, num_key_value_heads: 4 },
      totalBytes: 100 * GiB,
      contextSize: 4096,
    });
    const plan = planModel({ artifacts: [artifact], contextSize: 4096, pool: { nodes: [gpuNode("box", "RTX 4090", 8, RTX4090)] } });
    assert.equal(plan.recommendation, null);
    const option = plan.options[0];
    assert.ok(option?.placement.kind === "gpu");
    assert.equal(option.placement.gpusPerNode, 4, "8 does not divide 12 heads");
    assert.match(option.why ?? "", /on 4 RTX 4090/);
  });

  test("nothing fits: each artifact's need and the largest node's offer", () => {
    const artifacts = [...repo70b(), gguf(LLAMA3_70B, "Q4_K_M", 42_520_000_000)];
    const plan = planModel({ artifacts, contextSize: CONTEXT, pool: { nodes: [cpuNode("small", 8), cpuNode("laptop", 16)] } });
    assert.equal(plan.recommendation, null);
    assert.ok(plan.options.every((o) => !o.fits));
    assert.match(plan.explanation, /^Nothing fits this pool for a 8192-token context\./);
    assert.match(plan.explanation, /safetensors BF16 needs 159\.\d GiB on one GPU/);
    assert.match(plan.explanation, /Q4_K_M needs 4\d\.\d GiB of memory on one node for the CPU/);
    assert.match(plan.explanation, /The largest node: laptop offers 14\.0 GiB \(16\.0 GiB less a 2\.0 GiB reserve\) for the CPU and no GPUs\./);
    const table = renderPlanTable(plan);
    assert.match(table, /Does not fit:/);
    assert.match(table, /Nothing fits/);
  });

  test("fit is judged on the hardware; hosts counts who has room now", () => {
    const plan = planModel({ artifacts: repo8b(), contextSize: CONTEXT, pool: { nodes: [cpuNode("busy", 16, 4)] } });
    assert.equal(plan.recommendation?.artifact.label, "Q8_0");
    assert.equal(plan.recommendation?.hostsNow, 0);
    assert.match(plan.explanation, /0 hosts can run it now/);
  });

  test("an architecture the nodes' llama.cpp cannot load never fits, and says why", () => {
    const support = checkArchitectureSupport({ architecture: "frobnicator", engine: { name: "llamacpp", version: "3.21.1" } });
    const artifact = ggufArtifact({
      header: { ...LLAMA3_8B, architecture: "frobnicator", tensorBytes: 1e9, quantisation: "Q4_K_M" },
      contextSize: 4096,
      support,
    });
    const plan = planModel({ artifacts: [artifact], contextSize: 4096, pool: { nodes: [cpuNode("big", 256)] } });
    assert.equal(plan.recommendation, null);
    assert.match(plan.options[0]?.why ?? "", /cannot load architecture 'frobnicator'/);
    assert.match(plan.explanation, /Q4_K_M: cannot run/);
  });

  test("an empty pool or repository is explained", () => {
    assert.match(planModel({ artifacts: repo8b(), contextSize: CONTEXT, pool: { nodes: [] } }).explanation, /the pool has no nodes/);
    assert.match(planModel({ artifacts: [], contextSize: CONTEXT, pool: localPool() }).explanation, /nothing to plan/);
  });
});

describe("cores of a CPU replica", () => {
  // A tiny model (the size of `up --demo`'s), a 135M one with 100 MB of weights at Q4, and Llama-3-8B.
  const at16k = (shape: GgufModelShape, quantisation: string, bytes: number) =>
    ggufArtifact({ header: { ...shape, tensorBytes: bytes, quantisation }, bytes, contextSize: 16384 });

  test("follow the replica's memory: a core per 2 GiB in quarters from 0.25 to 1, shown in the table with the rule", () => {
    const artifacts = [at16k(TINY_LLAMA, "F16", 200_000), at16k(SMOL_135M, "Q4_K_M", 100 * MiB), at16k(LLAMA3_8B, "Q4_K_M", 4_920_000_000)];
    const plan = planModel({ artifacts, contextSize: 16384, pool: { nodes: [{ ...cpuNode("two-cores", 16), cores: 2 }] } });
    assert.deepEqual(
      plan.options
        .filter((o) => o.placement.kind === "cpu")
        .map((o) => o.cores)
        .sort(),
      [0.25, 0.5, 1],
    );
    const tiny = plan.options.find((o) => o.artifact.bytes === 200_000)!;
    const smol = plan.options.find((o) => o.artifact.bytes === 100 * MiB)!;
    assert.equal(tiny.cores, 0.25);
    assert.equal(smol.cores, 0.5, `100 MB of weights and the 16k pool's KV cache (${(smol.neededBytes / MiB).toFixed(0)} MiB) take half a core`);
    // A 2-core node holds the tiny model and three of the 100 MB ones.
    assert.ok(tiny.cores + 3 * smol.cores <= 2);
    const table = renderPlanTable(plan);
    assert.match(table, /^F16\s+gguf\s+llama\.cpp\s+CPU\s+30 MiB\/node\s+0\.25\/node\s/m);
    assert.match(
      table,
      /^A CPU replica reserves one core per 2 GiB of its memory, rounded up to a quarter, from 0\.25 to 1 core, unless its profile sets hardware\.cpu\.cores/m,
    );
  });

  test("a GPU replica's host process takes one core", () => {
    const plan = planModel({ artifacts: repo8b(), contextSize: CONTEXT, pool: { nodes: [gpuNode("gpu", "H200", 1, H200)] } });
    assert.ok(plan.options.filter((o) => o.placement.kind === "gpu").every((o) => o.cores === 1));
  });
});

describe("artifacts", () => {
  test("quality ranks follow F16/BF16 > Q8_0 > Q6_K > Q5_K_M > Q4_K_M > Q2_K, original weights above all", () => {
    const order = ["F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K"].map(ggufQualityRank);
    assert.deepEqual(
      [...order].sort((a, b) => b - a),
      order,
    );
    assert.equal(ggufQualityRank("BF16"), ggufQualityRank("F16"));
    assert.ok(ORIGINAL_WEIGHTS_RANK > ggufQualityRank("F32"));
    assert.equal(ggufQualityRank("Q4_K"), ggufQualityRank("Q4_K_M"), "a tensor-type label ranks as its usual file type");
    assert.equal(ggufQualityRank("nonsense"), 0);
    const awq = safetensorsArtifact({
      config: { ...CONFIG_8B, quantization_config: { quant_method: "awq", bits: 4 } },
      totalBytes: 5.7e9,
      contextSize: CONTEXT,
    });
    assert.equal(awq.label, "safetensors AWQ 4-bit");
    assert.equal(awq.qualityRank, ggufQualityRank("Q4_K_M"));
  });

  describe("from a GGUF file", () => {
    let dir: string;
    before(async () => {
      dir = await mkdtemp(join(tmpdir(), "llmgw-plan-"));
    });
    after(async () => {
      await rm(dir, { recursive: true, force: true });
    });

    test("header → artifact → plan on this machine", async () => {
      const shape = { layers: 4, embedding: 512, heads: 8, kvHeads: 2, feedForward: 1536, vocab: 32000, weightType: 14 };
      const path = join(dir, "model-Q6_K.gguf");
      const info = await writeGgufFixture({ path, metadata: llamaMetadata({ ...shape, contextLength: 4096, fileType: 18 }), tensors: llamaTensors(shape) });
      const header = await readGgufHeader({ file: path });
      const artifact = ggufArtifact({ header, contextSize: 4096, files: ["model-Q6_K.gguf"] });
      assert.equal(artifact.label, "Q6_K");
      assert.equal(artifact.bytes, info.fileBytes);
      assert.equal(artifact.memory.weightsBytes, info.tensorBytes);
      const plan = planModel({
        artifacts: [artifact],
        contextSize: 4096,
        pool: localPool({ hostname: "here", cores: 2, totalMemoryBytes: 8 * GiB, freeMemoryBytes: 6 * GiB }),
      });
      assert.equal(plan.recommendation?.placement.kind, "cpu");
      assert.equal(plan.recommendation?.hostsNow, 1);
    });
  });
});

describe("localPool and renderPlanTable", () => {
  test("localPool is this machine, without GPUs", () => {
    const pool = localPool();
    assert.equal(pool.nodes.length, 1);
    const node = pool.nodes[0];
    assert.ok(node && node.cores >= 1 && node.memoryBytes > 0);
    assert.deepEqual(node.gpus, []);
  });

  test("the table has the columns, one row per option, and the recommendation", () => {
    const plan = planModel({ artifacts: repo8b(), contextSize: CONTEXT, pool: { nodes: [cpuNode("laptop", 16, 12)] } });
    const table = renderPlanTable(plan);
    const lines = table.split("\n");
    assert.match(lines[0] ?? "", /8192-token context/);
    assert.match(table, /^artifact\s+format\s+engine\s+where\s+needs\s+cores\s+available\s+hosts\s+fits$/m);
    assert.match(table, /^Q8_0\s+gguf\s+llama\.cpp\s+CPU\s+9\.\d GiB\/node\s+1\/node\s+14\.0 GiB\/node\s+1\s+yes$/m);
    assert.match(table, /^safetensors BF16\s+safetensors\s+vLLM\s+GPU \(none\)\s+/m);
    assert.match(table, /^Recommended: Q8_0/m);
  });
});
