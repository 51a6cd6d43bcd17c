// The check of engine_args at the door: the rules on their own, the list against the flags
// llmgw's own llama-server launches pass, and the admin API over real HTTP on a real
// server, where an engine option nobody knows is a 400 at add and at edit instead of a
// model parked minutes later.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { profileSchema, type Profile } from "../catalog/model-schema.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { engineArgsProblem } from "./engine-args-check.ts";
import { LLAMA_SERVER_OPTIONS } from "./llama-server/llama-server-options.ts";
import { llamaServerLaunch } from "./llama-server/llama-server-launch.ts";

const GPU = { gpu: { class: "H200", gpus_per_node: 1, nodes: 1 } };

const llamaGpu = (engineArgs: string[]) => profileSchema.parse({ name: "gpu", engine: "llamacpp", engine_args: engineArgs, hardware: GPU });
const llamaCpu = (engineArgs: string[]) => profileSchema.parse({ name: "cpu", engine: "llamacpp", engine_args: engineArgs });
const vllm = (engineArgs: string[]) => profileSchema.parse({ name: "vllm", engine: "vllm", engine_args: engineArgs, hardware: GPU });

function problemOf(profile: Profile): { index: number; message: string } {
  const problem = engineArgsProblem(profile);
  assert.ok(problem !== null, `expected ${JSON.stringify(profile.engine_args)} to be refused`);
  return problem;
}

describe("engine_args rules", () => {
  test("a GPU llamacpp profile (llama-server only) takes llama-server's options with their values", () => {
    const args = [
      "--no-mmap",
      "-fa",
      "off",
      "-ngl",
      "20",
      "--metrics",
      "--temp",
      "0.5",
      "-t",
      "8",
      "--ctx_checkpoints",
      "4",
      "--control-vector-layer-range",
      "1",
      "3",
    ];
    assert.equal(engineArgsProblem(llamaGpu(args)), null);
  });

  test("an option llama-server does not know is named, with the closest known one when it is a typo", () => {
    const unknown = problemOf(llamaGpu(["--metrics", "--no-such-option"]));
    assert.equal(unknown.index, 1);
    assert.match(unknown.message, /'--no-such-option' is not an option of llama-server \(llama\.cpp v0\.4\.0, 80fb11a\)/);
    assert.doesNotMatch(unknown.message, /did you mean/, "no far-fetched hint");
    assert.match(problemOf(llamaGpu(["--mlokc"])).message, /did you mean '--mlock'\?/);
    // A typo of an option llmgw sets points at the profile field, not at the flag.
    assert.match(problemOf(llamaGpu(["--ctx-sise", "4096"])).message, /did you mean '--ctx-size'\? .*Set ctx_size in the profile instead/);
  });

  test("a CPU llamacpp profile takes llama-server's options too (it then runs only where llama-server is); unknown ones are refused saying so", () => {
    assert.equal(engineArgsProblem(llamaCpu(["--mlock", "-t", "8", "--cache-type-k", "q8_0", "-fa", "off"])), null);
    assert.equal(engineArgsProblem(llamaCpu([])), null);
    const unknown = problemOf(llamaCpu(["--mlock", "--no-such-option"]));
    assert.equal(unknown.index, 1);
    assert.match(unknown.message, /'--no-such-option' is not an option of llama-server \(llama\.cpp v0\.4\.0, 80fb11a\)/);
    assert.doesNotMatch(unknown.message, /bundled engine \(llmgw engine\)/, "the bundled engine is no longer asked");
    assert.match(unknown.message, /runs only on nodes with llama-server \(llmgw agent --llama-server\)/);
    assert.match(problemOf(llamaCpu(["--mlokc"])).message, /did you mean '--mlock'\?/);
  });

  test("a CPU profile may not offload layers to a GPU, which placement did not give it; a GPU profile may choose its layers", () => {
    for (const flag of ["-ngl", "--n-gpu-layers", "--gpu_layers", "-ngld"]) {
      const { message } = problemOf(llamaCpu([flag, "20"]));
      assert.match(message, /cannot be set in engine_args: a profile without hardware\.gpu is given no GPU/, flag);
      assert.match(message, /Set hardware\.gpu in the profile to run it on GPUs/, flag);
    }
    assert.equal(engineArgsProblem(llamaGpu(["-ngl", "20", "-ngld", "99"])), null);
  });

  test("options llmgw sets are refused with what sets them, on each engine", () => {
    for (const [profile, field] of [
      [llamaGpu(["-c", "8192"]), "ctx_size"],
      [llamaGpu(["--parallel", "4"]), "parallel"],
      [llamaGpu(["--embedding"]), "embeddings"],
      [llamaCpu(["--ctx-size=8192"]), "ctx_size"],
      [llamaCpu(["-np", "2"]), "parallel"],
      [vllm(["--max_model_len", "4096"]), "ctx_size"],
      [vllm(["-tp", "2"]), "hardware.gpu.gpus_per_node"],
    ] as const) {
      const { message } = problemOf(profile);
      assert.match(message, /cannot be set in engine_args/);
      assert.ok(message.includes(`Set ${field}`), message);
    }
    assert.match(problemOf(llamaGpu(["--port", "9000"])).message, /'--port' cannot be set in engine_args: llmgw binds each replica/);
    assert.match(problemOf(llamaGpu(["--api-key", "x"])).message, /its own engine key/);
    assert.match(problemOf(llamaGpu(["-hf", "owner/repo"])).message, /weights from the catalog's source/);
    assert.match(problemOf(llamaGpu(["--version"])).message, /print something and exit/);
    assert.match(problemOf(llamaCpu(["--alias", "x"])).message, /catalog name/);
    assert.match(problemOf(vllm(["--port=9000"])).message, /'--port=9000' cannot be set/);
    assert.match(problemOf(vllm(["--served-model-name", "x"])).message, /catalog name/);
    // llmgw does not set --threads for llama-server runs, so a profile may pass it.
    assert.equal(engineArgsProblem(llamaGpu(["--threads", "4"])), null);
    assert.equal(engineArgsProblem(llamaCpu(["--threads", "4"])), null);
  });

  test("values: present, a whole number where llama-server reads one, never the next option, never --name=value", () => {
    const missing = problemOf(llamaGpu(["--metrics", "-t"]));
    assert.equal(missing.index, 1);
    assert.match(missing.message, /'-t' needs a value \(the next item\) on llama-server, and engine_args end after it/);
    assert.match(problemOf(llamaGpu(["-ngl", "--mlock"])).message, /'-ngl' needs a value .* but the next item is the option '--mlock'/);
    const notNumber = problemOf(llamaGpu(["--threads", "four"]));
    assert.equal(notNumber.index, 1);
    assert.match(notNumber.message, /takes a whole number on llama-server, got 'four'/);
    assert.match(problemOf(llamaGpu(["-fa=on"])).message, /Give '-fa' and 'on' as two items/);
    assert.match(problemOf(llamaGpu(["--metrics=1"])).message, /'--metrics' is a switch on llama-server and takes no value/);
    const stray = problemOf(llamaGpu(["--mlock", "1"]));
    assert.equal(stray.index, 1);
    assert.match(stray.message, /'1' is not an option, and no option before it takes a value/);
  });

  test("vLLM options pass through unchecked (no vLLM here to ask), but not those llmgw sets", () => {
    const args = ["--enable-prefix-caching", "--gpu-memory-utilization=0.8", "-ac.backend", "FLASHINFER", "--runner", "pooling", "--some-future-flag"];
    assert.equal(engineArgsProblem(vllm(args)), null);
    assert.match(problemOf(vllm(["--api_key=x"])).message, /engine key/);
  });

  test("an external profile starts no engine, so it takes no engine_args", () => {
    const external = profileSchema.parse({ name: "ext", engine: "external", url: "http://127.0.0.1:9", engine_args: ["--x"] });
    assert.match(problemOf(external).message, /starts no engine/);
  });
});

describe("the option list against llmgw's launches", () => {
  test("every option llmgw's llama-server launch puts on the command line is one llama-server knows, and engine_args may not set it", () => {
    const base = { modelName: "m", engineKey: "k", host: "127.0.0.1", port: 9000, executable: "llama-server", weightsPath: "/w.gguf", attempt: 1 };
    const serverNames = new Set(LLAMA_SERVER_OPTIONS.flatMap((o) => [...o.names, ...(o.negated ?? [])]));
    // -fa is llmgw's default that a profile may override on purpose (llama-server-launch.ts),
    // and so is -ngl on a GPU profile; a CPU profile keeps its -ngl 0.
    for (const [profile, overridable] of [
      [profileSchema.parse({ name: "gpu", engine: "llamacpp", embeddings: true, hardware: GPU }), new Set(["-ngl", "-fa"])],
      [profileSchema.parse({ name: "cpu", engine: "llamacpp", embeddings: true }), new Set(["-fa"])],
    ] as const) {
      const serverArgs = llamaServerLaunch({ ...base, projectorPath: "/p.gguf", profile }).args;
      for (const flag of serverArgs.filter((a) => a.startsWith("-"))) {
        assert.ok(serverNames.has(flag), `llama-server knows ${flag}`);
        const problem = engineArgsProblem({ ...profile, engine_args: [flag, "1"] });
        if (overridable.has(flag)) assert.equal(problem, null, `${profile.name}: ${flag}`);
        else assert.match(problem?.message ?? "", /cannot be set in engine_args/, `${profile.name}: ${flag}`);
      }
    }
  });
});

describe("engine_args through the admin API", () => {
  let harness: Harness;
  let weights: string;

  before(async () => {
    harness = await startHarness();
    weights = path.join(harness.dataDir, "tiny.gguf");
    await writeTinyLlamaGguf({ path: weights, seed: 3 });
  });

  after(async () => {
    await harness.close();
  });

  const model = (name: string, profile: Record<string, unknown>) => ({
    name,
    scaling: { min: 0, max: 1 },
    source: { kind: "file", path: weights },
    profiles: [profile],
  });

  test("an unknown option is a 400 at add naming the item, the option and the engine; nothing is stored", async () => {
    const refused = await harness.admin(
      "POST",
      "/api/v1/models",
      model("typo", { name: "gpu", engine: "llamacpp", engine_args: ["--metrics", "--no-such-option"], hardware: GPU }),
    );
    assert.equal(refused.status, 400);
    assert.equal(refused.body.error.code, "invalid_engine_args");
    assert.equal(refused.body.error.param, "profiles.0.engine_args.1");
    assert.match(refused.body.error.message, /'--no-such-option' is not an option of llama-server/);
    assert.equal((await harness.admin("GET", "/api/v1/models/typo")).status, 404);
  });

  test("known options are accepted: llama-server's on a GPU or CPU profile, vLLM's as they are", async () => {
    await harness.addModel(model("gpu-args", { name: "gpu", engine: "llamacpp", engine_args: ["--metrics", "-ngl", "20", "--no-mmap"], hardware: GPU }));
    await harness.addModel(
      model("vllm-args", { name: "vllm", engine: "vllm", engine_args: ["--enable-prefix-caching", "--runner", "pooling"], hardware: GPU }),
    );
    await harness.addModel(model("cpu-args", { name: "cpu", engine: "llamacpp", engine_args: ["--mlock", "-t", "4"] }));
    assert.deepEqual((await harness.admin("GET", "/api/v1/models/cpu-args")).body.profiles[0].engine_args, ["--mlock", "-t", "4"]);
    const offload = await harness.admin("POST", "/api/v1/models", model("cpu-offload", { name: "cpu", engine: "llamacpp", engine_args: ["-ngl", "99"] }));
    assert.equal(offload.status, 400);
    assert.equal(offload.body.error.param, "profiles.0.engine_args.0");
    assert.match(offload.body.error.message, /Set hardware\.gpu in the profile/);
    const stored = (await harness.admin("GET", "/api/v1/models/vllm-args")).body;
    assert.deepEqual(stored.profiles[0].engine_args, ["--enable-prefix-caching", "--runner", "pooling"]);
  });

  test("an edit is checked too: an unknown option or one llmgw sets is a 400, and the stored model is unchanged", async () => {
    await harness.addModel(model("edited", { name: "gpu", engine: "llamacpp", engine_args: ["--metrics"], hardware: GPU }));
    const unknown = await harness.admin("PATCH", "/api/v1/models/edited", {
      profiles: [{ name: "gpu", engine: "llamacpp", engine_args: ["--metrics", "--flash-atn", "on"], hardware: GPU }],
    });
    assert.equal(unknown.status, 400);
    assert.equal(unknown.body.error.param, "profiles.0.engine_args.1");
    assert.match(unknown.body.error.message, /did you mean '--flash-attn'\?/);
    const reserved = await harness.admin("PATCH", "/api/v1/models/edited", {
      profiles: [{ name: "gpu", engine: "llamacpp", engine_args: ["--alias", "other"], hardware: GPU }],
    });
    assert.equal(reserved.status, 400);
    assert.match(reserved.body.error.message, /'--alias' cannot be set in engine_args: llmgw serves the model under its catalog name/);
    assert.deepEqual((await harness.admin("GET", "/api/v1/models/edited")).body.profiles[0].engine_args, ["--metrics"]);
    const fixed = await harness.admin("PATCH", "/api/v1/models/edited", {
      profiles: [{ name: "gpu", engine: "llamacpp", engine_args: ["--flash-attn", "on"], hardware: GPU }],
    });
    assert.equal(fixed.status, 200, JSON.stringify(fixed.body));
  });

  test("a model stored before the check still takes changes that leave its profiles alone", async () => {
    await harness.addModel(model("legacy", { name: "gpu", engine: "llamacpp", engine_args: ["--metrics"], hardware: GPU }));
    // As an older llmgw would have stored it.
    const row = await harness.server.store.db.selectFrom("models").select("definition").where("name", "=", "legacy").executeTakeFirstOrThrow();
    const definition = JSON.parse(row.definition);
    definition.profiles[0].engine_args = ["--no-such-option"];
    await harness.server.store.db
      .updateTable("models")
      .set({ definition: JSON.stringify(definition) })
      .where("name", "=", "legacy")
      .execute();
    await harness.server.catalog.refresh();
    assert.deepEqual(harness.server.catalog.get("legacy").definition.profiles[0]?.engine_args, ["--no-such-option"], "it still loads");
    assert.equal((await harness.admin("PATCH", "/api/v1/models/legacy", { description: "kept" })).status, 200);
    const profiles = await harness.admin("PATCH", "/api/v1/models/legacy", { profiles: [{ ...definition.profiles[0], priority: 1 }] });
    assert.equal(profiles.status, 400, "a change to its profiles must fix them");
    assert.equal(profiles.body.error.param, "profiles.0.engine_args.0");
  });
});
