import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { profileSchema } from "../catalog/model-schema.ts";
import { DEFAULT_ADAPTER_CONTEXTS } from "../engines/llamacpp/adapter-lanes.ts";
import { estimateGgufMemory, type GgufModelShape } from "../gguf/memory-estimate.ts";
import type { EngineName, NodeState, PlacementNode, PlacementOption, PlacementRequest, PlacementResult, ReplicaNeeds } from "./fleet-types.ts";
import { normalizeGpuClass } from "./gpu-class.ts";
import { NO_NODES_EXPLANATION, placeReplicas, waitsForRoom } from "./placement.ts";
import { replicaNeeds } from "./replica-needs.ts";
import { LLAMA3_8B } from "../../test/support/model-shapes.ts";

const MiB = 1024 ** 2;
const GiB = 1024 ** 3;

interface NodeSpec {
  state?: NodeState;
  cores?: number;
  memoryGiB?: number;
  /** [driver name, memory in bytes] per GPU, indexes in order. */
  gpus?: Array<[string, number]>;
  engines?: EngineName[];
  used?: { memoryGiB?: number; cores?: number; gpus?: number[] };
  models?: string[];
  cached?: string[];
  features?: string[];
}

function node(name: string, spec: NodeSpec = {}): PlacementNode {
  return {
    id: `id-${name}`,
    name,
    state: spec.state ?? "ready",
    inventory: {
      cores: spec.cores ?? 8,
      memoryBytes: (spec.memoryGiB ?? 16) * GiB,
      gpus: (spec.gpus ?? []).map(([gpuName, memoryBytes], index) => ({ index, name: gpuName, class: normalizeGpuClass(gpuName), memoryBytes })),
      engines: (spec.engines ?? ["llamacpp"]).map((engine) => ({ engine, version: "test" })),
      ...(spec.features === undefined ? {} : { features: spec.features }),
    },
    labels: {},
    used: { memoryBytes: (spec.used?.memoryGiB ?? 0) * GiB, cores: spec.used?.cores ?? 0, gpus: spec.used?.gpus ?? [] },
    models: new Set(spec.models ?? []),
    cachedWeights: new Set(spec.cached ?? []),
  };
}

const H100 = "NVIDIA H100 80GB HBM3";
const H100_BYTES = 81559 * MiB; // memory.total as nvidia-smi reports an H100 80GB
const RTX4090 = "NVIDIA GeForce RTX 4090";
const RTX4090_BYTES = 24564 * MiB;

const cpu = (memoryGiB: number, cores = 1, engine: "llamacpp" | "vllm" = "llamacpp"): ReplicaNeeds => ({ engine, memoryBytes: memoryGiB * GiB, cores });
const gpu = (gpuClass: string, perGpuGiB: number, shape: { perNode?: number; nodes?: number; engine?: "llamacpp" | "vllm" } = {}): ReplicaNeeds => ({
  engine: shape.engine ?? "vllm",
  memoryBytes: GiB,
  cores: 1,
  gpu: { class: gpuClass, perNode: shape.perNode ?? 1, nodes: shape.nodes ?? 1, memoryBytesPerGpu: perGpuGiB * GiB },
});

function request(key: string, options: ReplicaNeeds | PlacementOption[], extra: { modelId?: string; weightsKey?: string } = {}): PlacementRequest {
  const modelId = extra.modelId ?? key;
  return {
    key,
    modelId,
    modelName: `model-${modelId}`,
    options: Array.isArray(options) ? options : [{ profile: "default", needs: options }],
    weightsKey: extra.weightsKey ?? null,
  };
}

/** key → node names joined with "+" (head first), from the ids "id-NAME". */
function where(result: PlacementResult): Record<string, string> {
  return Object.fromEntries(result.placed.map((p) => [p.key, p.nodeIds.map((id) => id.replace(/^id-/, "")).join("+")]));
}

function explanationOf(result: PlacementResult, key: string): string[] {
  const entry = result.unplaceable.find((u) => u.key === key);
  assert.ok(entry, `${key} should be unplaceable; placed: ${JSON.stringify(where(result))}`);
  return entry.explanation;
}

describe("CPU replicas", () => {
  // big: 64 GiB less a 6.4 GiB reserve = 57.6 GiB free; small: 32 GiB less 3.2 GiB = 28.8 GiB.
  const pool = () => [node("big", { memoryGiB: 64 }), node("small", { memoryGiB: 32 })];

  test("bin-pack: each replica goes where the least memory is left, until it is full", () => {
    const result = placeReplicas({ nodes: pool(), requests: [request("m1", cpu(10)), request("m2", cpu(10)), request("m3", cpu(10))] });
    // small: 28.8 → 18.8 → 8.8 GiB, too little for the third.
    assert.deepEqual(where(result), { m1: "small", m2: "small", m3: "big" });
    assert.deepEqual(result.unplaceable, []);
  });

  test("replicas of one model spread over nodes before bin-packing", () => {
    const result = placeReplicas({
      nodes: pool(),
      requests: [request("r1", cpu(10), { modelId: "m" }), request("r2", cpu(10), { modelId: "m" }), request("r3", cpu(10), { modelId: "m" })],
    });
    // The third finds the model on both nodes and bin-packs again.
    assert.deepEqual(where(result), { r1: "small", r2: "big", r3: "small" });
  });

  test("a node that already runs the model (the caller's models set) is avoided", () => {
    const nodes = [node("big", { memoryGiB: 64 }), node("small", { memoryGiB: 32, models: ["m"] })];
    assert.deepEqual(where(placeReplicas({ nodes, requests: [request("r1", cpu(10), { modelId: "m" })] })), { r1: "big" });
  });

  test("memory and cores the node's replicas use are not offered again", () => {
    const nodes = [node("a", { memoryGiB: 16, cores: 4, used: { memoryGiB: 6.2, cores: 2 } })];
    const result = placeReplicas({ nodes, requests: [request("mem", cpu(12.1)), request("cores", cpu(1, 3)), request("fits", cpu(7, 2))] });
    assert.deepEqual(where(result), { fits: "a" });
    // 16 GiB less the 2 GiB reserve less 6.2 GiB used.
    assert.deepEqual(explanationOf(result, "mem"), ["a: 7.8 GiB free, needs 12.1 GiB"]);
    assert.deepEqual(explanationOf(result, "cores"), ["a: 2 of 4 cores free, needs 3"]);
  });

  test("a node short even when empty says what it has in all; only room its replicas use says free, and only that waits", () => {
    // A 2-core, 4 GiB node (2 GiB after the reserve), as a small machine reports itself.
    const small = node("a", { cores: 2, memoryGiB: 4 });
    const impossible = placeReplicas({ nodes: [small], requests: [request("cores", cpu(1, 4)), request("mem", cpu(8, 1))] });
    assert.deepEqual(explanationOf(impossible, "cores"), ["a: has 2 cores in all, needs 4"]);
    assert.deepEqual(explanationOf(impossible, "mem"), ["a: has 2.0 GiB in all (4.0 GiB less 2.0 GiB kept for the system), needs 8.0 GiB"]);
    assert.equal(waitsForRoom(explanationOf(impossible, "cores")), false, "no replica stopping gives the node more cores");
    assert.equal(waitsForRoom(explanationOf(impossible, "mem")), false, "no replica stopping gives the node more memory");

    // The same node with its cores taken: a stop there makes room.
    const busy = placeReplicas({ nodes: [node("a", { cores: 2, memoryGiB: 4, used: { memoryGiB: 0.5, cores: 2 } })], requests: [request("m", cpu(1, 2))] });
    assert.deepEqual(explanationOf(busy, "m"), ["a: 0 of 2 cores free, needs 2"]);
    assert.equal(waitsForRoom(explanationOf(busy, "m")), true);

    // Memory taken, but too few cores in all: what no wait cures comes first.
    const both = placeReplicas({ nodes: [node("a", { cores: 2, memoryGiB: 16, used: { memoryGiB: 13 } })], requests: [request("m", cpu(4, 4))] });
    assert.deepEqual(explanationOf(both, "m"), ["a: has 2 cores in all, needs 4"]);
    assert.equal(waitsForRoom(explanationOf(both, "m")), false);

    // One node that could free room is enough to wait for; a node named like the word is not.
    const fleet = placeReplicas({
      nodes: [node("free", { cores: 2, memoryGiB: 4 }), node("b", { cores: 8, used: { cores: 6 } })],
      requests: [request("m", cpu(1, 4))],
    });
    assert.deepEqual(explanationOf(fleet, "m"), ["b: 2 of 8 cores free, needs 4", "free: has 2 cores in all, needs 4"]);
    assert.equal(waitsForRoom(explanationOf(fleet, "m")), true);
    assert.equal(waitsForRoom(["free: has 2 cores in all, needs 4"]), false);
  });

  test("fractional cores: small replicas share a node's cores while their sum stays within them, and explanations print the fractions", () => {
    // A 2-core node, as `up` reports on a small machine, already running a quarter-core replica.
    const nodes = [node("small", { memoryGiB: 16, cores: 2, used: { memoryGiB: 0.1, cores: 0.25 } })];
    const requests = [
      request("a", cpu(0.5, 0.5)),
      request("b", cpu(0.5, 0.5)),
      request("c", cpu(0.3, 0.25)),
      request("d", cpu(0.3, 0.75)),
      request("e", cpu(0.3, 0.25)),
    ];
    const result = placeReplicas({ nodes, requests });
    // 0.25 used + 0.5 + 0.5 + 0.25 = 1.5; d's 0.75 does not fit in the 0.5 left; e's 0.25 does.
    assert.deepEqual(where(result), { a: "small", b: "small", c: "small", e: "small" });
    assert.deepEqual(explanationOf(result, "d"), ["small: 0.5 of 2 cores free, needs 0.75"]);
    // Full to the last quarter: nothing more fits, and no float tail shows.
    const full = placeReplicas({ nodes, requests: [...requests.filter((r) => r.key !== "d"), request("f", cpu(0.3, 0.25)), request("g", cpu(0.3, 0.25))] });
    assert.deepEqual(Object.keys(where(full)).sort(), ["a", "b", "c", "e", "f"]);
    assert.deepEqual(explanationOf(full, "g"), ["small: 0 of 2 cores free, needs 0.25"]);
  });

  test("the weights already in a node's cache win over bin-packing, but not over spreading", () => {
    const nodes = [node("big", { memoryGiB: 64, cached: ["w1"] }), node("small", { memoryGiB: 32 })];
    const result = placeReplicas({
      nodes,
      requests: [
        request("r1", cpu(4), { modelId: "m", weightsKey: "w1" }),
        request("r2", cpu(4), { modelId: "m", weightsKey: "w1" }),
        request("other", cpu(4), { weightsKey: "w2" }),
      ],
    });
    assert.deepEqual(where(result), { r1: "big", r2: "small", other: "small" });
  });
});

describe("options in order of preference", () => {
  const options: PlacementOption[] = [
    { profile: "gpu", needs: gpu("H100", 40) },
    { profile: "cpu", needs: cpu(20) },
  ];
  const nodes = () => [node("cpu-node", { memoryGiB: 64 }), node("gpu-node", { memoryGiB: 256, gpus: [[H100, H100_BYTES]], engines: ["llamacpp", "vllm"] })];

  test("the first option is used while any node has room for it; the next only when none has", () => {
    const result = placeReplicas({ nodes: nodes(), requests: [request("m1", options), request("m2", options)] });
    assert.deepEqual(
      result.placed.map((p) => [p.key, p.profile, p.nodeIds, p.gpus]),
      [
        ["m1", "gpu", ["id-gpu-node"], { "id-gpu-node": [0] }],
        ["m2", "cpu", ["id-cpu-node"], { "id-cpu-node": [] }],
      ],
    );
  });

  test("a GPU the caller says is held counts as taken", () => {
    const held = [node("gpu-node", { memoryGiB: 256, gpus: [[H100, H100_BYTES]], engines: ["llamacpp", "vllm"], used: { gpus: [0] } })];
    const result = placeReplicas({ nodes: held, requests: [request("m1", options)] });
    assert.deepEqual(
      result.placed.map((p) => p.profile),
      ["cpu"],
    );
  });

  test("an unplaceable request explains each option on each node", () => {
    const small = [
      node("a", { memoryGiB: 16, engines: ["llamacpp", "vllm"] }),
      node("b", {
        memoryGiB: 256,
        gpus: [
          ["NVIDIA A100-SXM4-80GB", 80 * GiB],
          ["NVIDIA A100-SXM4-80GB", 80 * GiB],
        ],
        engines: ["vllm"],
      }),
    ];
    const result = placeReplicas({ nodes: small, requests: [request("m1", options)] });
    assert.deepEqual(explanationOf(result, "m1"), [
      "a: gpu: no H100 GPU (has no GPUs); cpu: has 14.0 GiB in all (16.0 GiB less 2.0 GiB kept for the system), needs 20.0 GiB",
      "b: gpu: no H100 GPU (has 2× A100); cpu: no llama.cpp engine",
    ]);
  });
});

describe("GPU replicas", () => {
  const twoH100 = (name: string, spec: NodeSpec = {}) =>
    node(name, {
      memoryGiB: 256,
      cores: 32,
      gpus: [
        [H100, H100_BYTES],
        [H100, H100_BYTES],
      ],
      engines: ["vllm", "llama-server"],
      ...spec,
    });

  test("a GPU is never given to two replicas", () => {
    const result = placeReplicas({
      nodes: [twoH100("h")],
      requests: [request("m1", gpu("H100", 40)), request("m2", gpu("H100", 40)), request("m3", gpu("H100", 40))],
    });
    assert.deepEqual(
      result.placed.map((p) => p.gpus),
      [{ "id-h": [0] }, { "id-h": [1] }],
    );
    assert.deepEqual(explanationOf(result, "m3"), ["h: 0 of 2 H100 GPUs free, needs 1"]);
  });

  test("GPUs held by the node's replicas are passed over, and a partly free node is explained", () => {
    const result = placeReplicas({
      nodes: [twoH100("h", { used: { gpus: [0] } })],
      requests: [request("two", gpu("H100", 40, { perNode: 2 })), request("one", gpu("H100", 40))],
    });
    assert.deepEqual(
      result.placed.map((p) => [p.key, p.gpus]),
      [["one", { "id-h": [1] }]],
    );
    assert.deepEqual(explanationOf(result, "two"), ["h: 1 of 2 H100 GPUs free, needs 2"]);
  });

  test("bin-pack GPUs: the node left with the fewest free GPUs of the class", () => {
    const result = placeReplicas({ nodes: [twoH100("a"), twoH100("b", { used: { gpus: [1] } })], requests: [request("m1", gpu("H100", 40))] });
    assert.deepEqual(
      result.placed.map((p) => [p.nodeIds, p.gpus]),
      [[["id-b"], { "id-b": [0] }]],
    );
  });

  test("the smallest GPU that fits is taken, leaving the large one for what needs it", () => {
    const mixed = node("m", {
      memoryGiB: 256,
      gpus: [
        [H100, H100_BYTES],
        ["NVIDIA H100 PCIe", 40 * GiB],
      ],
      engines: ["vllm"],
    });
    const result = placeReplicas({
      nodes: [mixed],
      requests: [request("small", gpu("H100", 30)), request("large", gpu("H100", 60)), request("again", gpu("H100", 60))],
    });
    assert.deepEqual(
      result.placed.map((p) => [p.key, p.gpus]),
      [
        ["small", { "id-m": [1] }],
        ["large", { "id-m": [0] }],
      ],
    );
    assert.deepEqual(explanationOf(result, "again"), ["m: 0 of 1 H100 GPU free, needs 1"]);
  });

  test("vLLM gets 90% of each GPU and llama.cpp loses 512 MiB to CUDA", () => {
    const nodes = [
      node("a", {
        memoryGiB: 64,
        gpus: [
          ["NVIDIA A100-PCIE-40GB", 40 * GiB],
          ["NVIDIA A100-PCIE-40GB", 40 * GiB],
        ],
        engines: ["vllm", "llama-server"],
      }),
    ];
    const result = placeReplicas({
      nodes,
      requests: [
        request("vllm", gpu("A100", 37)),
        request("llama", gpu("A100", 39.6, { engine: "llamacpp" })),
        request("fits", gpu("A100", 39.5, { engine: "llamacpp" })),
      ],
    });
    assert.deepEqual(where(result), { fits: "a" });
    assert.deepEqual(explanationOf(result, "vllm"), ["a: its A100 GPUs offer 36.0 GiB each to vLLM (90% of 40.0 GiB), needs 37.0 GiB per GPU"]);
    assert.deepEqual(explanationOf(result, "llama"), [
      "a: its A100 GPUs offer 39.5 GiB each to llama.cpp (40.0 GiB less 0.5 GiB for CUDA), needs 39.6 GiB per GPU",
    ]);
  });

  test("GPU shortfalls: too few GPUs of the class, too few large enough", () => {
    const nodes = [
      twoH100("a"),
      node("b", {
        memoryGiB: 256,
        gpus: [
          [H100, H100_BYTES],
          ["NVIDIA H100 PCIe", 40 * GiB],
        ],
        engines: ["vllm"],
      }),
    ];
    const result = placeReplicas({ nodes, requests: [request("four", gpu("H100", 40, { perNode: 4 })), request("big", gpu("H100", 50, { perNode: 2 }))] });
    assert.deepEqual(where(result), { big: "a" });
    assert.deepEqual(explanationOf(result, "four"), ["a: has 2 H100 GPUs, needs 4", "b: has 2 H100 GPUs, needs 4"]);
  });

  test("only 1 of 2 large enough is named", () => {
    const nodes = [
      node("b", {
        memoryGiB: 256,
        gpus: [
          [H100, H100_BYTES],
          ["NVIDIA H100 PCIe", 40 * GiB],
        ],
        engines: ["vllm"],
      }),
    ];
    const result = placeReplicas({ nodes, requests: [request("big", gpu("H100", 50, { perNode: 2 }))] });
    assert.deepEqual(explanationOf(result, "big"), ["b: only 1 of 2 H100 GPUs offers 50.0 GiB, needs 2"]);
  });

  test("a GPU replica needs host memory and cores too", () => {
    const result = placeReplicas({ nodes: [twoH100("a", { memoryGiB: 4 })], requests: [request("m1", gpu("H100", 40))] });
    // 4 GiB less the 2 GiB reserve leaves 2 GiB; ask for 3.
    const hungry = placeReplicas({ nodes: [twoH100("a", { memoryGiB: 4 })], requests: [request("m2", { ...gpu("H100", 40), memoryBytes: 3 * GiB })] });
    assert.deepEqual(where(result), { m1: "a" });
    assert.deepEqual(explanationOf(hungry, "m2"), ["a: has 2.0 GiB in all (4.0 GiB less 2.0 GiB kept for the system), needs 3.0 GiB"]);
  });

  test("GPUs taken on a node whose host memory is short even when empty: the memory is named, not the GPUs", () => {
    const nodes = [twoH100("a", { memoryGiB: 4, used: { gpus: [0, 1] } })];
    const result = placeReplicas({ nodes, requests: [request("m", { ...gpu("H100", 40), memoryBytes: 3 * GiB })] });
    assert.deepEqual(explanationOf(result, "m"), ["a: has 2.0 GiB in all (4.0 GiB less 2.0 GiB kept for the system), needs 3.0 GiB"]);
    assert.equal(waitsForRoom(explanationOf(result, "m")), false);
    const busy = placeReplicas({ nodes: [twoH100("a", { used: { gpus: [0, 1] } })], requests: [request("m", gpu("H100", 40))] });
    assert.deepEqual(explanationOf(busy, "m"), ["a: 0 of 2 H100 GPUs free, needs 1"]);
    assert.equal(waitsForRoom(explanationOf(busy, "m")), true);
  });

  test("pipeline parallel takes distinct nodes, the head first, preferring those with the weights", () => {
    const nodes = [twoH100("p1"), twoH100("p2"), twoH100("p3", { cached: ["w"] })];
    const shape = gpu("H100", 60, { perNode: 2, nodes: 2 });
    const result = placeReplicas({ nodes, requests: [request("m1", shape, { weightsKey: "w" }), request("m2", shape)] });
    assert.deepEqual(result.placed, [{ key: "m1", profile: "default", nodeIds: ["id-p3", "id-p1"], gpus: { "id-p3": [0, 1], "id-p1": [0, 1] } }]);
    assert.deepEqual(explanationOf(result, "m2"), [
      "p1: 0 of 2 H100 GPUs free, needs 2",
      "p2: has room, but the replica spans 2 nodes and only this one has room",
      "p3: 0 of 2 H100 GPUs free, needs 2",
    ]);
  });
});

describe("engines and node states", () => {
  test("llama.cpp on the CPU runs on the bundled engine or llama-server; on a GPU only on llama-server", () => {
    const nodes = [
      node("vllm-only", { memoryGiB: 64, engines: ["vllm"] }),
      node("server", { memoryGiB: 64, engines: ["llama-server"] }),
      node("bundled", { memoryGiB: 32, gpus: [[RTX4090, RTX4090_BYTES]], engines: ["llamacpp"] }),
    ];
    const result = placeReplicas({
      nodes,
      requests: [
        request("cpu-a", cpu(4)),
        request("cpu-b", cpu(4), { modelId: "cpu-a" }),
        request("gpu", gpu("RTX4090", 8, { engine: "llamacpp" })),
        request("vllm-cpu", cpu(70, 1, "vllm")),
      ],
    });
    assert.deepEqual(where(result), { "cpu-a": "bundled", "cpu-b": "server" });
    assert.deepEqual(explanationOf(result, "gpu"), [
      "bundled: no llama-server engine (the bundled llama.cpp runs on the CPU only)",
      "server: no RTX4090 GPU (has no GPUs)",
      "vllm-only: no llama-server engine (the bundled llama.cpp runs on the CPU only)",
    ]);
    assert.deepEqual(explanationOf(result, "vllm-cpu"), [
      "bundled: no vllm engine",
      "server: no vllm engine",
      "vllm-only: has 57.6 GiB in all (64.0 GiB less 6.4 GiB kept for the system), needs 70.0 GiB",
    ]);
  });

  test("a CPU profile with engine_args (llama-server options) skips nodes without llama-server, saying why, and lands on one with it", () => {
    const needs = (engineArgs: string[]) =>
      replicaNeeds({ profile: profileSchema.parse({ name: "cpu", engine: "llamacpp", engine_args: engineArgs }), weightsBytes: 2 * GiB });
    assert.equal(needs(["--mlock"]).llamaServerArgs, true);
    assert.equal(needs([]).llamaServerArgs, undefined, "a profile without engine_args runs on either engine");
    // The bundled-only node has the most room and is first by name: without the rule it would take both.
    const nodes = [node("a-bundled", { memoryGiB: 64, engines: ["llamacpp"] }), node("b-server", { memoryGiB: 16, engines: ["llama-server"] })];
    const result = placeReplicas({ nodes, requests: [request("args", needs(["--mlock", "-t", "4"])), request("plain", needs([]), { modelId: "args" })] });
    assert.deepEqual(where(result), { args: "b-server", plain: "a-bundled" });

    const alone = placeReplicas({
      nodes: [node("a-bundled", { memoryGiB: 64 }), node("c-vllm", { memoryGiB: 64, engines: ["vllm"] })],
      requests: [request("args", needs(["--mlock"]))],
    });
    assert.deepEqual(explanationOf(alone, "args"), [
      "a-bundled: no llama-server engine (the profile's engine_args are llama-server options)",
      "c-vllm: no llama-server engine (the profile's engine_args are llama-server options)",
    ]);
    assert.equal(waitsForRoom(explanationOf(alone, "args")), false, "no room frees to cure a missing engine");
  });

  test("a model with a vision projector runs only where llama-server loads it, and counts the projector's memory", () => {
    const profile = profileSchema.parse({ name: "cpu", engine: "llamacpp" });
    const plain = replicaNeeds({ profile, weightsBytes: 2 * GiB });
    const eye = replicaNeeds({ profile, weightsBytes: 2 * GiB, projectorBytes: GiB });
    assert.equal(eye.projector, true);
    assert.equal(plain.projector, undefined);
    assert.equal(eye.memoryBytes - plain.memoryBytes, GiB);
    const result = placeReplicas({
      nodes: [node("a-bundled", { memoryGiB: 64, engines: ["llamacpp"] }), node("b-server", { memoryGiB: 16, engines: ["llama-server"] })],
      requests: [request("eye", eye)],
    });
    assert.deepEqual(where(result), { eye: "b-server" });
    const nowhere = placeReplicas({ nodes: [node("a-bundled", { memoryGiB: 64, engines: ["llamacpp"] })], requests: [request("eye", eye)] });
    assert.deepEqual(explanationOf(nowhere, "eye"), ["a-bundled: no llama-server engine (the model's vision projector loads only there, with --mmproj)"]);
  });

  test("a model with adapters counts them, and the bundled engine's adapter contexts where it may run there", () => {
    const profile = profileSchema.parse({ name: "cpu", engine: "llamacpp", ctx_size: 4096, parallel: 1 });
    const shape = { profile, weightsBytes: 2 * GiB, header: LLAMA3_8B };
    const plain = replicaNeeds(shape);
    const styled = replicaNeeds({ ...shape, adapterBytes: 100 * 1024 * 1024 });
    const base = estimateGgufMemory({ header: LLAMA3_8B, contextSize: 4096, parallel: 1, weightsBytes: 2 * GiB });
    const context = base.kvCacheBytes + base.overhead.computeBytes;
    assert.ok(context > 0);
    assert.equal(styled.memoryBytes - plain.memoryBytes, 100 * 1024 * 1024 + DEFAULT_ADAPTER_CONTEXTS * context);
    // Only llama-server can run it (a projector, engine_args): adapters share its one context.
    const eye = replicaNeeds({ ...shape, projectorBytes: GiB });
    const styledEye = replicaNeeds({ ...shape, projectorBytes: GiB, adapterBytes: 100 * 1024 * 1024 });
    assert.equal(styledEye.memoryBytes - eye.memoryBytes, 100 * 1024 * 1024);
  });

  test("a model with adapters goes only to agents that load them; an older agent is named", () => {
    const profile = profileSchema.parse({ name: "cpu", engine: "llamacpp" });
    const styled = replicaNeeds({ profile, weightsBytes: 2 * GiB, adapterBytes: 1024 });
    assert.equal(styled.adapters, true);
    const older = node("a-older", { memoryGiB: 64 });
    const current = node("b-current", { memoryGiB: 16, features: ["adapters"] });
    assert.deepEqual(where(placeReplicas({ nodes: [older, current], requests: [request("styled", styled)] })), { styled: "b-current" });
    const nowhere = placeReplicas({ nodes: [node("a-older", { memoryGiB: 64 })], requests: [request("styled", styled)] });
    assert.deepEqual(explanationOf(nowhere, "styled"), ["a-older: its agent does not load LoRA adapters (an older llmgw): upgrade llmgw on the node"]);
    // A model without adapters still goes anywhere.
    const plain = replicaNeeds({ profile, weightsBytes: 2 * GiB });
    assert.deepEqual(where(placeReplicas({ nodes: [node("a-older", { memoryGiB: 64 })], requests: [request("plain", plain)] })), { plain: "a-older" });
  });

  test("lost and draining nodes take nothing and are named; lines are sorted by node name", () => {
    const nodes = [node("c"), node("b", { state: "draining", memoryGiB: 512 }), node("a", { state: "lost", memoryGiB: 512 })];
    const result = placeReplicas({ nodes, requests: [request("small", cpu(4)), request("large", cpu(12))] });
    assert.deepEqual(where(result), { small: "c" });
    // c: 14 GiB free less the 4 GiB the first request took.
    assert.deepEqual(explanationOf(result, "large"), ["a: lost", "b: draining", "c: 10.0 GiB free, needs 12.0 GiB"]);
  });

  test("with no nodes at all, one line says how to start one", () => {
    const result = placeReplicas({ nodes: [], requests: [request("m1", cpu(1))] });
    assert.deepEqual(result.unplaceable, [{ key: "m1", modelId: "m1", modelName: "model-m1", explanation: [NO_NODES_EXPLANATION] }]);
    assert.equal(NO_NODES_EXPLANATION, "no nodes have joined; start one with 'llmgw agent --server URL --join-token TOKEN'");
  });
});

describe("the issue's three nodes (CPU only; one 24 GB GPU; two 80 GB GPUs)", () => {
  const pool = () => [
    node("cpu-16", { memoryGiB: 16, cores: 8, engines: ["llamacpp"] }),
    node("gpu-24", { memoryGiB: 64, cores: 16, gpus: [[RTX4090, RTX4090_BYTES]], engines: ["llamacpp", "llama-server"] }),
    node("gpu-80x2", {
      memoryGiB: 256,
      cores: 32,
      gpus: [
        [H100, H100_BYTES],
        [H100, H100_BYTES],
      ],
      engines: ["llamacpp", "llama-server", "vllm"],
    }),
  ];
  const option = (profile: Record<string, unknown>, weightsBytes: number, header?: GgufModelShape): PlacementOption => {
    const parsed = profileSchema.parse(profile);
    return { profile: parsed.name, needs: replicaNeeds(header === undefined ? { profile: parsed, weightsBytes } : { profile: parsed, weightsBytes, header }) };
  };
  const tiny = [option({ name: "cpu", engine: "llamacpp" }, 500_000_000)];
  const llama8b = [
    option({ name: "rtx", engine: "llamacpp", priority: 10, hardware: { gpu: { class: "RTX4090" } } }, LLAMA3_8B.tensorBytes, LLAMA3_8B),
    option({ name: "cpu", engine: "llamacpp" }, LLAMA3_8B.tensorBytes, LLAMA3_8B),
  ];
  const llama70bFp8 = [option({ name: "h100x2", engine: "vllm", hardware: { gpu: { class: "H100", gpus_per_node: 2 } } }, 72_000_000_000)];
  const llama70bBf16 = [option({ name: "h100x2", engine: "vllm", hardware: { gpu: { class: "H100", gpus_per_node: 2 } } }, 141_107_412_992)];
  const mixtral = [option({ name: "cpu", engine: "llamacpp" }, 26_000_000_000)];
  const requests = () => [
    request("tiny-1", tiny, { modelId: "tiny" }),
    request("llama8b-1", llama8b, { modelId: "llama8b" }),
    request("llama8b-2", llama8b, { modelId: "llama8b" }),
    request("70b-fp8-1", llama70bFp8, { modelId: "70b-fp8" }),
    request("mixtral-1", mixtral, { modelId: "mixtral" }),
    request("70b-bf16-1", llama70bBf16, { modelId: "70b-bf16" }),
  ];

  test("each model lands where its profiles and the free hardware say", () => {
    const result = placeReplicas({ nodes: pool(), requests: requests() });
    assert.deepEqual(
      result.placed.map((p) => [p.key, p.profile, where({ placed: [p], unplaceable: [] })[p.key], p.gpus]),
      [
        // 0.8 GiB (0.5 GB × 1.2 + 256 MiB): the smallest node that has room.
        ["tiny-1", "cpu", "cpu-16", { "id-cpu-16": [] }],
        // The RTX 4090 takes the first replica; the second falls back to the CPU, on a node without the model.
        ["llama8b-1", "rtx", "gpu-24", { "id-gpu-24": [0] }],
        ["llama8b-2", "cpu", "cpu-16", { "id-cpu-16": [] }],
        // 72 GB × 1.2 / 2 + 2 GiB = 42.2 GiB per GPU.
        ["70b-fp8-1", "h100x2", "gpu-80x2", { "id-gpu-80x2": [0, 1] }],
        // 29.3 GiB: too much for what the CPU node has left; the GPU node with less host memory free.
        ["mixtral-1", "cpu", "gpu-24", { "id-gpu-24": [] }],
      ],
    );
    assert.deepEqual(explanationOf(result, "70b-bf16-1"), [
      "cpu-16: no vllm engine",
      "gpu-24: no vllm engine",
      "gpu-80x2: its H100 GPUs offer 71.7 GiB each to vLLM (90% of 79.6 GiB), needs 80.8 GiB per GPU",
    ]);
  });

  test("the same input in another order gives the same answer", () => {
    const first = placeReplicas({ nodes: pool(), requests: requests() });
    const again = placeReplicas({ nodes: pool().reverse(), requests: requests() });
    assert.deepEqual(again, first);
  });

  test("the caller's nodes are not changed", () => {
    const nodes = pool();
    const before = JSON.stringify(nodes, (_key, value: unknown) => (value instanceof Set ? [...value] : value));
    placeReplicas({ nodes, requests: requests() });
    assert.equal(
      JSON.stringify(nodes, (_key, value: unknown) => (value instanceof Set ? [...value] : value)),
      before,
    );
  });
});

test("1,000 requests onto 1,000 nodes: every one placed, no GPU given twice, no node over its memory", () => {
  const nodes: PlacementNode[] = [];
  for (let i = 0; i < 1000; i++) {
    const name = `node-${String(i).padStart(4, "0")}`;
    nodes.push(
      i % 4 === 0
        ? node(name, {
            memoryGiB: 256,
            cores: 32,
            gpus: [
              [H100, H100_BYTES],
              [H100, H100_BYTES],
            ],
            engines: ["llamacpp", "vllm"],
          })
        : node(name, { memoryGiB: 64, cores: 16 }),
    );
  }
  const requests: PlacementRequest[] = [];
  for (let i = 0; i < 1000; i++) {
    const fallback: PlacementOption = { profile: "cpu", needs: cpu(8 + (i % 7), 2) };
    requests.push(request(`m${i}`, i % 3 === 0 ? [{ profile: "gpu", needs: gpu("H100", 40) }, fallback] : [fallback], { modelId: `model-${i % 500}` }));
  }
  // No node has 600 GiB: each of these explains itself on all 1,000 nodes.
  for (let i = 0; i < 5; i++) requests.push(request(`huge${i}`, cpu(600)));

  const result = placeReplicas({ nodes, requests });
  assert.equal(result.placed.length, 1000);
  assert.deepEqual(
    result.unplaceable.map((u) => [u.key, u.explanation.length]),
    [0, 1, 2, 3, 4].map((i) => [`huge${i}`, 1000]),
  );
  const gpusTaken = result.placed.flatMap((p) => Object.entries(p.gpus).flatMap(([id, indexes]) => indexes.map((index) => `${id}/${index}`)));
  assert.equal(gpusTaken.length, 334);
  assert.equal(new Set(gpusTaken).size, gpusTaken.length);
  const memory = new Map<string, number>();
  for (const p of result.placed) {
    const i = Number(p.key.slice(1));
    const needs = p.profile === "gpu" ? GiB : (8 + (i % 7)) * GiB;
    for (const id of p.nodeIds) memory.set(id, (memory.get(id) ?? 0) + needs);
  }
  for (const n of nodes) {
    const reserve = Math.max(2 * GiB, Math.ceil(n.inventory.memoryBytes * 0.1));
    assert.ok((memory.get(n.id) ?? 0) <= n.inventory.memoryBytes - reserve, `${n.name} is over-committed`);
  }
});
