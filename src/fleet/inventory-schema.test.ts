// The door check on what a node claims: a believable inventory passes unchanged; each
// impossible one is refused with code invalid_inventory and the field named, as the server
// answers a join or heartbeat that carries it.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError } from "../core/errors.ts";
import type { NodeInventory } from "./fleet-types.ts";
import { checkInventory, checkLabels } from "./inventory-schema.ts";

const GiB = 1024 ** 3;
const TiB = 1024 ** 4;

const h100 = { index: 0, name: "NVIDIA H100 80GB HBM3", class: "H100", memoryBytes: 81559 * 1024 ** 2 };
const valid: NodeInventory = {
  cores: 64,
  memoryBytes: 512 * GiB,
  gpus: [h100, { ...h100, index: 1 }],
  engines: [
    { engine: "llamacpp", version: "3.21.1" },
    { engine: "vllm", version: "0.6.3.post1" },
  ],
};

function refusal(param: string, ...mentions: RegExp[]) {
  return (error: unknown): boolean => {
    assert.ok(error instanceof BadRequestError, `expected a 400, got ${String(error)}`);
    assert.equal(error.code, "invalid_inventory", error.message);
    assert.equal(error.param, param, error.message);
    assert.match(error.message, new RegExp(`field '${param.replace(/\./g, "\\.")}'`));
    for (const mention of mentions) assert.match(error.message, mention);
    return true;
  };
}

describe("checkInventory", () => {
  test("a believable inventory passes as it is; fields this server does not know are dropped", () => {
    assert.deepEqual(checkInventory(valid), valid);
    const fromNewerAgent = { ...valid, numaNodes: 2, gpus: valid.gpus.map((gpu) => ({ ...gpu, uuid: "GPU-1" })) };
    assert.deepEqual(checkInventory(fromNewerAgent), valid);
    const cpuOnly = { cores: 1, memoryBytes: 64 * 1024 ** 2, gpus: [], engines: [{ engine: "llamacpp", version: "3.21.1" }] };
    assert.deepEqual(checkInventory(cpuOnly), cpuOnly);
  });

  test("impossible numbers of cores and bytes of memory are refused, naming the field and the value", () => {
    assert.throws(() => checkInventory({ ...valid, cores: 0 }), refusal("cores", /from 1 to 4096, got 0/));
    assert.throws(() => checkInventory({ ...valid, cores: 5000 }), refusal("cores", /got 5000/));
    assert.throws(() => checkInventory({ ...valid, cores: 2.5 }), refusal("cores", /whole number, got 2.5/));
    assert.throws(() => checkInventory({ ...valid, cores: "8" }), refusal("cores", /must be a number/));
    assert.throws(() => checkInventory({ ...valid, memoryBytes: 1000 }), refusal("memoryBytes", /64 MiB/, /got 1000 bytes/));
    assert.throws(() => checkInventory({ ...valid, memoryBytes: 65 * TiB }), refusal("memoryBytes", /to 64 TiB, got/));
  });

  test("a GPU without memory, with more than 1 TiB, or listed twice is refused", () => {
    assert.throws(() => checkInventory({ ...valid, gpus: [{ ...h100, memoryBytes: 0 }] }), refusal("gpus.0.memoryBytes", /more than 0/, /got 0 bytes/));
    assert.throws(
      () => checkInventory({ ...valid, gpus: [h100, { ...h100, index: 1, memoryBytes: 2 * TiB }] }),
      refusal("gpus.1.memoryBytes", /at most 1 TiB/),
    );
    assert.throws(() => checkInventory({ ...valid, gpus: [h100, { ...h100 }] }), refusal("gpus.1.index", /GPU index 0 is listed twice/));
    assert.throws(() => checkInventory({ ...valid, gpus: [{ ...h100, index: -1 }] }), refusal("gpus.0.index", /got -1/));
  });

  test("more than 64 GPUs are refused", () => {
    const gpus = Array.from({ length: 65 }, (_, index) => ({ ...h100, index: index % 64 }));
    assert.throws(() => checkInventory({ ...valid, gpus }), refusal("gpus", /lists 65 GPUs; a node has at most 64/));
  });

  test("an empty GPU name or class is refused", () => {
    assert.throws(() => checkInventory({ ...valid, gpus: [{ ...h100, class: "" }] }), refusal("gpus.0.class", /must not be empty/));
    assert.throws(() => checkInventory({ ...valid, gpus: [{ ...h100, name: "   " }] }), refusal("gpus.0.name", /must not be empty/));
    assert.throws(() => checkInventory({ ...valid, gpus: [{ ...h100, class: "X".repeat(65) }] }), refusal("gpus.0.class", /at most 64 characters/));
  });

  test("engines: unknown names, empty versions, the same engine twice and none at all are refused", () => {
    assert.throws(
      () => checkInventory({ ...valid, engines: [{ engine: "ollama", version: "0.5" }] }),
      refusal("engines.0.engine", /llamacpp, llama-server, vllm, got 'ollama'/),
    );
    assert.throws(() => checkInventory({ ...valid, engines: [{ engine: "vllm", version: "" }] }), refusal("engines.0.version", /must not be empty/));
    assert.throws(
      () => checkInventory({ ...valid, engines: [valid.engines[0], { engine: "llamacpp", version: "3.20.0" }] }),
      refusal("engines.1.engine", /llamacpp is listed twice/),
    );
    assert.throws(() => checkInventory({ ...valid, engines: [] }), refusal("engines", /at least one engine/));
  });

  test("a missing field or a report that is not an object is refused", () => {
    const { gpus: _gpus, ...withoutGpus } = valid;
    assert.throws(() => checkInventory(withoutGpus), refusal("gpus", /list of GPUs/));
    assert.throws(
      () => checkInventory("cores=8"),
      (error: unknown) =>
        error instanceof BadRequestError && error.code === "invalid_inventory" && error.param === null && /Invalid node inventory/.test(error.message),
    );
  });

  test("the message names where the inventory came from", () => {
    assert.throws(
      () => checkInventory({ ...valid, cores: 0 }, "inventory file /etc/llmgw/node.json"),
      /^BadRequestError: Invalid inventory file \/etc\/llmgw\/node\.json: field 'cores'/,
    );
  });
});

describe("checkLabels", () => {
  test("Kubernetes-style keys with short values pass; a bad key, a bad value or too many labels are refused", () => {
    assert.deepEqual(checkLabels({ zone: "eu-1", "example.com/rack": "r12" }), { zone: "eu-1", "example.com/rack": "r12" });
    const refused = (param: string) => (error: unknown) => error instanceof BadRequestError && error.code === "invalid_labels" && error.param === param;
    assert.throws(() => checkLabels({ "bad key": "x" }), refused("bad key"));
    assert.throws(() => checkLabels({ zone: "x".repeat(64) }), refused("zone"));
    assert.throws(() => checkLabels({ zone: "" }), refused("zone"));
    const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`k${i}`, "v"]));
    assert.throws(() => checkLabels(many), /at most 64 labels/);
  });
});
