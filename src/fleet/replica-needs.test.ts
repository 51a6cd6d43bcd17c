import { test } from "node:test";
import assert from "node:assert/strict";
import { profileSchema } from "../catalog/model-schema.ts";
import { LlmgwError } from "../core/errors.ts";
import { estimateGgufMemory, llamaCppPerGpuBytes } from "../gguf/memory-estimate.ts";
import { replicaNeeds } from "./replica-needs.ts";
import { LLAMA3_8B, SMOL_135M, TINY_LLAMA } from "../../test/support/model-shapes.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

const WEIGHTS = LLAMA3_8B.tensorBytes;

const profile = (fields: Record<string, unknown>) => profileSchema.parse({ name: "p", ...fields });

test("llama.cpp on the CPU with a header: the estimate for the context pool and slots the engine starts with", () => {
  const needs = replicaNeeds({ profile: profile({ engine: "llamacpp", ctx_size: 8192, parallel: 2 }), weightsBytes: WEIGHTS, header: LLAMA3_8B });
  const expected = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 8192, parallel: 2, weightsBytes: WEIGHTS }).totalBytes;
  assert.deepEqual(needs, { engine: "llamacpp", memoryBytes: expected, cores: 1 });
  // The default pool (16384 tokens, 4 slots) holds twice the KV cache: 1 GiB more for this model.
  const defaults = replicaNeeds({ profile: profile({ engine: "llamacpp" }), weightsBytes: WEIGHTS, header: LLAMA3_8B });
  assert.equal(defaults.memoryBytes, estimateGgufMemory({ header: LLAMA3_8B, contextSize: 16384, parallel: 4, weightsBytes: WEIGHTS }).totalBytes);
  assert.ok(defaults.memoryBytes - needs.memoryBytes >= GiB);
});

test("llama.cpp without a header: weights × 1.2 + 256 MiB; cores from the profile", () => {
  const needs = replicaNeeds({ profile: profile({ engine: "llamacpp", hardware: { cpu: { cores: 6 } } }), weightsBytes: 10 * GiB });
  assert.deepEqual(needs, { engine: "llamacpp", memoryBytes: Math.ceil(12 * GiB) + 256 * MiB, cores: 6 });
});

test("a CPU replica's cores follow its memory: a core per 2 GiB in quarters, from 0.25 to 1, unless the profile asks", () => {
  const cores = (memoryBytes: number, cpu: Record<string, unknown> = {}) =>
    replicaNeeds({ profile: profile({ engine: "llamacpp", hardware: { cpu: { min_memory_gb: memoryBytes / GiB, ...cpu } } }), weightsBytes: 1 }).cores;
  assert.deepEqual(
    [30 * MiB, 512 * MiB, 513 * MiB, GiB, 1.2 * GiB, 1.5 * GiB, 1.6 * GiB, 40 * GiB].map((bytes) => cores(bytes)),
    [0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 1, 1],
  );
  assert.equal(cores(30 * MiB, { cores: 2 }), 2, "hardware.cpu.cores is an exact request");
  assert.equal(cores(40 * GiB, { cores: 1 }), 1);
  // From the estimate: the tiny model `up --demo` serves takes a quarter; a 135M model at Q4
  // (100 MB of weights) with the default 16k pool's KV cache takes a half; an 8B one a whole core.
  const fromHeader = (header: typeof LLAMA3_8B) => replicaNeeds({ profile: profile({ engine: "llamacpp" }), weightsBytes: header.tensorBytes, header }).cores;
  assert.deepEqual([fromHeader(TINY_LLAMA), fromHeader(SMOL_135M), fromHeader(LLAMA3_8B)], [0.25, 0.5, 1]);
  // A 2-core node holds the demo and three such 100 MB models with room to spare.
  assert.ok(fromHeader(TINY_LLAMA) + 3 * fromHeader(SMOL_135M) <= 2);
  // A GPU replica's host process keeps its whole core.
  assert.equal(replicaNeeds({ profile: profile({ engine: "llamacpp", hardware: { gpu: { class: "RTX4090" } } }), weightsBytes: 1e6 }).cores, 1);
});

test("min_memory_gb replaces the estimate, in GiB", () => {
  const needs = replicaNeeds({ profile: profile({ engine: "llamacpp", hardware: { cpu: { min_memory_gb: 2.5 } } }), weightsBytes: WEIGHTS, header: LLAMA3_8B });
  assert.equal(needs.memoryBytes, 2.5 * GiB);
});

test("llama.cpp on GPUs: the estimate split over the node's GPUs, 1 GiB and 1 core on the host", () => {
  const needs = replicaNeeds({
    profile: profile({ engine: "llamacpp", hardware: { gpu: { class: "RTX4090", gpus_per_node: 2 } } }),
    weightsBytes: WEIGHTS,
    header: LLAMA3_8B,
  });
  const estimate = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 16384, parallel: 4, weightsBytes: WEIGHTS });
  assert.deepEqual(needs, {
    engine: "llamacpp",
    memoryBytes: GiB,
    cores: 1,
    gpu: { class: "RTX4090", perNode: 2, nodes: 1, memoryBytesPerGpu: llamaCppPerGpuBytes(estimate, 2) },
  });
  const headerless = replicaNeeds({
    profile: profile({ engine: "llamacpp", hardware: { gpu: { class: "RTX4090", gpus_per_node: 2 } } }),
    weightsBytes: 10 * GiB,
  });
  assert.equal(headerless.gpu?.memoryBytesPerGpu, Math.ceil((12 * GiB + 256 * MiB) / 2));
});

test("vLLM: weights × 1.2 over tensor × pipeline parallel GPUs, plus 2 GiB on each", () => {
  const needs = replicaNeeds({
    profile: profile({ engine: "vllm", hardware: { gpu: { class: "H100", gpus_per_node: 2, nodes: 2 } } }),
    weightsBytes: 100 * GiB,
  });
  assert.deepEqual(needs, { engine: "vllm", memoryBytes: GiB, cores: 1, gpu: { class: "H100", perNode: 2, nodes: 2, memoryBytesPerGpu: 30 * GiB + 2 * GiB } });
  const single = replicaNeeds({ profile: profile({ engine: "vllm", hardware: { gpu: { class: "H100" } } }), weightsBytes: 10 * GiB });
  assert.equal(single.gpu?.memoryBytesPerGpu, 14 * GiB);
});

test("profiles that no node can run are refused with a code", () => {
  const external = profile({ engine: "external", url: "http://example.test" });
  assert.throws(
    () => replicaNeeds({ profile: external, weightsBytes: 0 }),
    (error: unknown) => error instanceof LlmgwError && error.code === "profile_not_placeable" && /external/.test(error.message),
  );
  const spanning = profile({ engine: "llamacpp", hardware: { gpu: { class: "H100", nodes: 2 } } });
  assert.throws(
    () => replicaNeeds({ profile: spanning, weightsBytes: WEIGHTS }),
    (error: unknown) => error instanceof LlmgwError && error.code === "profile_not_placeable" && /hardware\.gpu\.nodes to 1/.test(error.message),
  );
});
