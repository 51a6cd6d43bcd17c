// The llama-server adapter under the REAL engine supervisor, against a stand-in
// llama-server run as a real child process (test/support/stand-in-llama-server.mjs): it
// stands for llama-server's readiness (/health 503 "Loading model", then 200), its public
// /v1/models listing the alias, its key on every other route, and a load that fails when
// flash attention does not work on the device.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { request } from "undici";
import { profileSchema, type Profile } from "../../catalog/model-schema.ts";
import { EngineSupervisor, stopAllSupervisors, type SupervisorOptions } from "../../agent/engine-supervisor.ts";
import { attemptRecords, inState, untilSnapshot } from "../../../test/support/stand-in-engine.ts";
import { argAfter, standInStarts, writeStandInExecutable } from "../../../test/support/stand-in-executables.ts";
import { llamaServerLaunch, type LlamaServerLaunchOptions } from "./llama-server-launch.ts";

const ENGINE_KEY = "sk-engine-llama-0123456789abcdef";
const MODEL = "qwen-gpu";

let dir = "";
let weights = "";
let projector = "";
let counter = 0;

const gpuProfile: Profile = profileSchema.parse({
  name: "h200",
  engine: "llamacpp",
  ctx_size: 8192,
  parallel: 2,
  engine_args: ["--metrics"],
  hardware: { gpu: { class: "H200" } },
});

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-lls-"));
  weights = join(dir, "model.gguf");
  projector = join(dir, "mmproj.gguf");
  await writeFile(weights, "GGUF stand-in weights");
  await writeFile(projector, "GGUF stand-in projector");
});

after(async () => {
  await stopAllSupervisors();
  await rm(dir, { recursive: true, force: true });
});

/** A supervisor running llama-server (the stand-in with `controls`) through the adapter, with short timings. */
async function llamaServerSupervisor(
  controls: Record<string, string>,
  { launch, ...overrides }: Partial<SupervisorOptions> & { launch?: Partial<LlamaServerLaunchOptions> } = {},
) {
  counter += 1;
  const { executable, recordFile } = await writeStandInExecutable({ dir: join(dir, `bin-${counter}`), engine: "llama-server", controls });
  const supervisor = new EngineSupervisor({
    replicaId: `lls-${counter}`,
    stateRoot: join(dir, `root-${counter}`),
    prepare: ({ attempt, host, port }) =>
      llamaServerLaunch({ executable, weightsPath: weights, modelName: MODEL, profile: gpuProfile, engineKey: ENGINE_KEY, host, port, attempt, ...launch }),
    readyTimeoutMs: 30_000,
    healthIntervalMs: 20,
    livenessIntervalMs: 50,
    stopGraceMs: 300,
    backoff: { initialMs: 20, maxMs: 100 },
    parkAfter: { failures: 3, windowMs: 60_000 },
    ...overrides,
  });
  return { supervisor, recordFile };
}

test("llama-server becomes ready with the catalog name as alias, the profile's slots, all layers on the GPU and flash attention on; the key is in its environment, never in argv", async () => {
  const { supervisor, recordFile } = await llamaServerSupervisor({ STAND_IN_LOAD_MS: "300" }, { launch: { projectorPath: projector, gpus: [1, 3] } });
  try {
    supervisor.start();
    const ready = await untilSnapshot(supervisor, inState("ready"));
    assert.equal(ready.attempt, 1);
    const stateDir = ready.stateDir as string;

    const [start] = await standInStarts(recordFile);
    assert.ok(start);
    const { argv, env } = start;
    assert.equal(argAfter(argv, "-m"), weights);
    assert.equal(argAfter(argv, "--host"), "127.0.0.1");
    assert.equal(argAfter(argv, "--port"), String(ready.endpoint?.port));
    assert.equal(argAfter(argv, "--alias"), MODEL);
    assert.equal(argAfter(argv, "--ctx-size"), "8192");
    assert.equal(argAfter(argv, "--parallel"), "2");
    assert.equal(argAfter(argv, "-ngl"), "999");
    assert.equal(argAfter(argv, "--mmproj"), projector);
    assert.equal(argAfter(argv, "-fa"), "on");
    assert.equal(argv.at(-1), "--metrics", "the profile's engine_args come last");
    assert.ok(!argv.some((arg) => arg.includes(ENGINE_KEY)), "the key is not on the command line");
    assert.ok(!argv.includes("--api-key"));
    assert.equal(env.LLAMA_API_KEY, ENGINE_KEY);
    assert.equal(env.CUDA_VISIBLE_DEVICES, "1,3", "only the GPUs placement gave the replica");
    assert.equal(env.HOME, join(stateDir, "home"));
    for (const flag of ["HF_HUB_OFFLINE", "DO_NOT_TRACK"]) assert.equal(env[flag], "1", flag);

    // As the real llama-server: /v1/models is public and lists the alias; /props needs the key.
    const base = `http://127.0.0.1:${ready.endpoint?.port}`;
    const models = await request(`${base}/v1/models`);
    assert.equal(models.statusCode, 200);
    assert.deepEqual(
      ((await models.body.json()) as { data: { id: string }[] }).data.map((model) => model.id),
      [MODEL],
    );
    const props = await request(`${base}/props`);
    assert.equal(props.statusCode, 401);
    await props.body.dump();

    const records = await attemptRecords(supervisor, stateDir);
    assert.deepEqual(
      records.map((record) => [record.attempt, record.result]),
      [[1, "ready"]],
    );
    assert.deepEqual(records[0]?.settings, { engine: "llama-server", flashAttention: true, gpuLayers: "999", contextPool: 8192, parallel: 2, gpus: [1, 3] });
    assert.ok(!(await readFile(join(stateDir, "attempts.jsonl"), "utf8")).includes(ENGINE_KEY), "attempts.jsonl never holds the key");
  } finally {
    await supervisor.stop();
  }
});

test("a load that fails with flash attention on is retried without it: attempt 2 runs -fa off and is ready, and attempts.jsonl records both settings", async () => {
  const { supervisor, recordFile } = await llamaServerSupervisor({ STAND_IN_CRASH: "flash-attn", STAND_IN_LOAD_MS: "100" });
  try {
    supervisor.start();
    const failed = await untilSnapshot(supervisor, inState("failed"));
    assert.equal(failed.lastErrorCode, "engine_exited");
    assert.match(failed.lastError ?? "", /flash attention is not supported on this device/);
    const ready = await untilSnapshot(supervisor, (snapshot) => snapshot.state === "ready");
    assert.equal(ready.attempt, 2);
    assert.equal(ready.failures, 1);

    const starts = await standInStarts(recordFile);
    assert.deepEqual(
      starts.map((start) => argAfter(start.argv, "-fa")),
      ["on", "off"],
    );
    const records = await attemptRecords(supervisor, ready.stateDir as string);
    assert.deepEqual(
      records.map((record) => [record.attempt, record.result, (record.settings as { flashAttention: unknown }).flashAttention, record.log]),
      [
        [1, "engine_exited", true, "attempt-1.log"],
        [2, "ready", false, "attempt-2.log"],
      ],
    );
  } finally {
    await supervisor.stop();
  }
});

test("a llama-server that never finishes loading hits the readiness deadline; its process is killed and its log kept", async () => {
  const { supervisor } = await llamaServerSupervisor({ STAND_IN_NEVER_READY: "1" }, { readyTimeoutMs: 1_500, backoff: { initialMs: 60_000, maxMs: 60_000 } });
  try {
    supervisor.start();
    const failed = await untilSnapshot(supervisor, inState("failed"));
    assert.equal(failed.lastErrorCode, "not_ready");
    assert.match(failed.lastError ?? "", /not ready within 1\.5 s on attempt 1 \(last health check of .*\/health: HTTP 503\)/);
    assert.equal(failed.pid, null);
    const stateDir = failed.stateDir as string;
    const log = join(stateDir, "attempt-1.log");
    assert.ok(existsSync(log));
    assert.match(await readFile(log, "utf8"), new RegExp(`loading model from ${weights.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}`));
    const records = await attemptRecords(supervisor, stateDir);
    assert.deepEqual(
      records.map((record) => [record.attempt, record.result, record.log]),
      [[1, "not_ready", "attempt-1.log"]],
    );
  } finally {
    await supervisor.stop();
  }
});

test("a llama-server that ignores LLAMA_API_KEY (and so serves without a key) fails validation instead of becoming ready", async () => {
  const { supervisor } = await llamaServerSupervisor(
    { STAND_IN_IGNORE_KEY_ENV: "1", STAND_IN_LOAD_MS: "50" },
    { backoff: { initialMs: 60_000, maxMs: 60_000 } },
  );
  try {
    supervisor.start();
    const failed = await untilSnapshot(supervisor, inState("failed"));
    assert.equal(failed.lastErrorCode, "validation_failed");
    assert.match(failed.lastError ?? "", /\/props without a key answered HTTP 200 instead of 401: the engine does not enforce the key/);
    assert.ok(!(failed.lastError ?? "").includes(ENGINE_KEY));
  } finally {
    await supervisor.stop();
  }
});

test("launch arguments: a CPU profile offloads no layers; a profile that sets -fa itself keeps it on every attempt; an explicit layer count is passed as given", () => {
  const cpuProfile = profileSchema.parse({ name: "cpu", engine: "llamacpp", engine_args: ["--flash-attn", "off"] });
  const common = {
    executable: "llama-server",
    weightsPath: "/w/m.gguf",
    modelName: "m",
    profile: cpuProfile,
    engineKey: ENGINE_KEY,
    host: "10.0.0.2",
    port: 9000,
  };
  for (const attempt of [1, 2]) {
    const launch = llamaServerLaunch({ ...common, attempt });
    assert.equal(argAfter(launch.args, "-ngl"), "0");
    assert.ok(!launch.args.includes("-fa"), "the adapter adds no -fa of its own");
    assert.deepEqual(launch.args.slice(-2), ["--flash-attn", "off"]);
    assert.equal(launch.settings?.flashAttention, "engine_args: off");
    assert.equal(launch.env.CUDA_VISIBLE_DEVICES, undefined);
    assert.equal(argAfter(launch.args, "--ctx-size"), "16384", "the default pool");
    assert.equal(argAfter(launch.args, "--parallel"), "4", "4k per request");
  }
  assert.equal(argAfter(llamaServerLaunch({ ...common, profile: gpuProfile, attempt: 1, gpuLayers: 20 }).args, "-ngl"), "20");
  assert.equal(llamaServerLaunch({ ...common, profile: gpuProfile, attempt: 3 }).settings?.flashAttention, false);
});

test("an embedding profile pools by mean when the model does not say how, and leaves a declared pooling or the operator's --pooling alone", () => {
  const embeddingProfile = (engineArgs: string[] = []) =>
    profileSchema.parse({ name: "cpu", engine: "llamacpp", embeddings: true, engine_args: engineArgs, hardware: {} });
  const launchArgs = (profile: Profile, modelDeclaresPooling?: boolean) =>
    llamaServerLaunch({
      executable: "llama-server",
      weightsPath: weights,
      modelName: "embed",
      profile,
      engineKey: ENGINE_KEY,
      host: "127.0.0.1",
      port: 1,
      attempt: 1,
      ...(modelDeclaresPooling === undefined ? {} : { modelDeclaresPooling }),
    }).args.join(" ");
  assert.match(launchArgs(embeddingProfile(), false), / --embedding --pooling mean /);
  assert.doesNotMatch(launchArgs(embeddingProfile(), true), /--pooling/);
  assert.doesNotMatch(launchArgs(embeddingProfile()), /--pooling/, "unknown: nothing added");
  // The operator's choice comes last and is the only one.
  assert.equal(launchArgs(embeddingProfile(["--pooling", "cls"]), false).match(/--pooling/g)?.length, 1);
  assert.doesNotMatch(launchArgs(gpuProfile, false), /--embedding|--pooling/, "generation profiles get neither");
});

test("adapters load at scale 0 (--lora-scaled PATH:0, in the model's order), so a request without one is the base; a path llama-server would split is refused", () => {
  const launch = (adapterPaths: string[]) =>
    llamaServerLaunch({
      executable: "llama-server",
      weightsPath: weights,
      modelName: MODEL,
      profile: gpuProfile,
      engineKey: ENGINE_KEY,
      host: "127.0.0.1",
      port: 1,
      attempt: 1,
      adapterPaths,
    }).args;
  const args = launch(["/cache/style.gguf", "/cache/terse.gguf"]);
  const scaled = args.flatMap((arg, index) => (arg === "--lora-scaled" ? [args[index + 1]] : []));
  assert.deepEqual(scaled, ["/cache/style.gguf:0", "/cache/terse.gguf:0"]);
  assert.ok(!launch([]).includes("--lora-scaled"));
  assert.throws(() => launch(["/cache/a,b.gguf"]), /',' or ':'/);
});
