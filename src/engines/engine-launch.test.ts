// Which engine runs a profile on a node (engineLaunch, engineFor): a choice made from the
// profile and the node's configured engines alone, so these tests build launches and
// look at them; running each engine is the adapters' own tests.
import { test } from "node:test";
import assert from "node:assert/strict";
import { LlmgwError } from "../core/errors.ts";
import { profileSchema } from "../catalog/model-schema.ts";
import { engineFor, engineLaunch, type ReplicaLaunchOptions } from "./engine-launch.ts";

const attempt = { attempt: 2, host: "10.0.0.7", port: 9100, stateDir: "/var/lib/llmgw/runs/r-1" };
const cpu = profileSchema.parse({ name: "cpu", engine: "llamacpp" });
const gpu = profileSchema.parse({ name: "gpu", engine: "llamacpp", hardware: { gpu: { class: "RTX4090" } } });
const vllm = profileSchema.parse({ name: "vllm", engine: "vllm", hardware: { gpu: { class: "H200", gpus_per_node: 4, nodes: 2 } } });
const external = profileSchema.parse({ name: "ext", engine: "external", url: "http://10.0.0.9:8000" });

function options(overrides: Partial<ReplicaLaunchOptions>): ReplicaLaunchOptions {
  return { profile: cpu, modelName: "m", weightsPath: "/cache/m.gguf", engineKey: "sk-engine-x", attempt, engines: {}, ...overrides };
}

test("a CPU llamacpp profile runs on the bundled engine unless the node configures llama-server, which then runs it with the attempt's fallbacks", () => {
  assert.equal(engineFor(cpu, {}), "llamacpp");
  const bundled = engineLaunch(options({}));
  assert.equal(bundled.command, process.execPath);
  assert.ok(bundled.args.includes("engine") && bundled.args.includes("--model-name"));
  assert.deepEqual([bundled.host, bundled.port], ["10.0.0.7", 9100]);

  assert.equal(engineFor(cpu, { llamaServer: "/opt/llama/llama-server" }), "llama-server");
  const server = engineLaunch(options({ engines: { llamaServer: "/opt/llama/llama-server" }, projectorPath: "/cache/mmproj.gguf", gpus: [0] }));
  assert.equal(server.command, "/opt/llama/llama-server");
  assert.equal(server.args[server.args.indexOf("-fa") + 1], "off", "attempt 2 is the fallback without flash attention");
  assert.equal(server.args[server.args.indexOf("--mmproj") + 1], "/cache/mmproj.gguf");
  assert.equal(server.args[server.args.indexOf("-ngl") + 1], "0");
  assert.equal(server.env.CUDA_VISIBLE_DEVICES, "0");
});

test("a GPU llamacpp profile needs llama-server; without one the node is refused with what to do", () => {
  assert.throws(
    () => engineLaunch(options({ profile: gpu })),
    (error: unknown) => error instanceof LlmgwError && error.code === "engine_unavailable" && /RTX4090 GPUs, which needs llama-server/.test(error.message),
  );
  const launch = engineLaunch(options({ profile: gpu, engines: { llamaServer: "llama-server" } }));
  assert.equal(launch.args[launch.args.indexOf("-ngl") + 1], "999");
});

test("a CPU llamacpp profile with engine_args (llama-server options) runs only on llama-server; a node without one refuses it with what to do", () => {
  const withArgs = profileSchema.parse({ name: "cpu-args", engine: "llamacpp", engine_args: ["--mlock", "-t", "4"] });
  assert.throws(
    () => engineLaunch(options({ profile: withArgs })),
    (error: unknown) =>
      error instanceof LlmgwError &&
      error.code === "engine_unavailable" &&
      error.status === 409 &&
      /Profile 'cpu-args' passes engine_args, which are llama-server options, and this node has no llama-server configured/.test(error.message) &&
      /llmgw agent --llama-server/.test(error.message),
  );
  assert.equal(engineFor(withArgs, { llamaServer: "/opt/llama/llama-server" }), "llama-server");
  const launch = engineLaunch(options({ profile: withArgs, engines: { llamaServer: "/opt/llama/llama-server" } }));
  assert.equal(launch.command, "/opt/llama/llama-server");
  assert.deepEqual(launch.args.slice(-3), ["--mlock", "-t", "4"], "the profile's options come last");
  assert.equal(launch.args[launch.args.indexOf("-ngl") + 1], "0", "a CPU profile offloads nothing");
});

test("a vllm profile runs vllm serve with GPUs per node and nodes from its hardware; a node without vllm, and an external profile, are refused", () => {
  const launch = engineLaunch(
    options({ profile: vllm, weightsPath: "/cache/llama-70b", engines: { vllm: "/opt/vllm/bin/vllm" }, rayAddress: "10.0.0.7:6379", maxModelLen: 32768 }),
  );
  assert.equal(launch.command, "/opt/vllm/bin/vllm");
  assert.deepEqual(launch.args.slice(0, 2), ["serve", "/cache/llama-70b"]);
  assert.equal(launch.args[launch.args.indexOf("--tensor-parallel-size") + 1], "4");
  assert.equal(launch.args[launch.args.indexOf("--pipeline-parallel-size") + 1], "2");
  assert.equal(launch.args[launch.args.indexOf("--max-model-len") + 1], "32768");
  assert.equal(launch.args[launch.args.indexOf("--attention-backend") + 1], "TRITON_ATTN");
  assert.equal(launch.env.RAY_ADDRESS, "10.0.0.7:6379");

  assert.throws(
    () => engineLaunch(options({ profile: vllm })),
    (error: unknown) => error instanceof LlmgwError && error.code === "engine_unavailable" && /no vllm/.test(error.message),
  );
  assert.throws(() => engineLaunch(options({ profile: external, engines: { llamaServer: "x", vllm: "y" } })), /is external: it routes to an existing server/);
});

test("a profile with embeddings: true runs the bundled engine with --embeddings and llama-server with --embedding; other engines refuse it by name", () => {
  const embed = profileSchema.parse({ name: "embed", engine: "llamacpp", embeddings: true });
  const bundled = engineLaunch(options({ profile: embed }));
  assert.ok(bundled.args.includes("--embeddings"));
  assert.ok(!engineLaunch(options({})).args.includes("--embeddings"), "a plain profile generates");
  const server = engineLaunch(options({ profile: embed, engines: { llamaServer: "/opt/llama/llama-server" } }));
  assert.ok(server.args.includes("--embedding"));

  const vllmEmbed = profileSchema.safeParse({ name: "v", engine: "vllm", embeddings: true, hardware: { gpu: { class: "H200" } } });
  assert.equal(vllmEmbed.success, false);
  assert.deepEqual(vllmEmbed.error?.issues[0]?.path, ["embeddings"]);
  assert.match(vllmEmbed.error?.issues[0]?.message ?? "", /--runner pooling/);
  assert.equal(profileSchema.safeParse({ name: "e", engine: "external", url: "http://10.0.0.9:8000", embeddings: true }).success, false);
});

test("a model with a vision projector is refused by a node without llama-server, which alone loads it", () => {
  assert.throws(
    () => engineLaunch(options({ projectorPath: "/cache/mmproj.gguf" })),
    (error: Error & { code?: string }) => error.code === "engine_unavailable" && /vision projector, which only llama-server loads/.test(error.message),
  );
  const server = engineLaunch(options({ engines: { llamaServer: "/opt/llama/llama-server" }, projectorPath: "/cache/mmproj.gguf" }));
  assert.equal(server.args[server.args.indexOf("--mmproj") + 1], "/cache/mmproj.gguf");
});

test("the bundled engine starts with one libuv pool thread, so every decode starts from the same thread (twice the tokens/s on a CPU)", () => {
  const bundled = engineLaunch(options({}));
  assert.equal(bundled.env.UV_THREADPOOL_SIZE, "1");
  assert.equal(bundled.env.LLMGW_ENGINE_KEY, "sk-engine-x");
});
