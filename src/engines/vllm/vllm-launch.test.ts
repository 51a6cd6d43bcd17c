// The vLLM adapter under the REAL engine supervisor, against a stand-in `vllm` run as a
// real child process (test/support/stand-in-vllm.mjs): it stands for vLLM's readiness
// (connection refused while loading, then /health 200), its key on /v1 only, /v1/models
// listing the served name, and an engine that dies at start with the default attention
// backend (FlashAttention on a GPU older than Ampere). The Ray launches are checked by
// their arguments only: Ray cannot run here, and no stand-in would say more than the args.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { request } from "undici";
import { LlmgwError } from "../../core/errors.ts";
import { profileSchema, type Profile } from "../../catalog/model-schema.ts";
import { EngineSupervisor, stopAllSupervisors, type SupervisorOptions } from "../../agent/engine-supervisor.ts";
import { attemptRecords, inState, untilSnapshot } from "../../../test/support/stand-in-engine.ts";
import { argAfter, standInStarts, writeStandInExecutable } from "../../../test/support/stand-in-executables.ts";
import { vllmLaunch, type VllmLaunchOptions } from "./vllm-launch.ts";
import { rayHeadLaunch, rayWorkerLaunch } from "./ray-launch.ts";

const ENGINE_KEY = "sk-engine-vllm-fedcba9876543210";
const MODEL = "llama-70b";

let dir = "";
let modelDir = "";
let counter = 0;

const profile: Profile = profileSchema.parse({
  name: "h200x2",
  engine: "vllm",
  engine_args: ["--enable-prefix-caching"],
  hardware: { gpu: { class: "H200", gpus_per_node: 2 } },
});

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-vllm-"));
  modelDir = join(dir, "model");
  await mkdir(modelDir);
  await writeFile(join(modelDir, "config.json"), JSON.stringify({ architectures: ["LlamaForCausalLM"] }));
});

after(async () => {
  await stopAllSupervisors();
  await rm(dir, { recursive: true, force: true });
});

async function vllmSupervisor(
  controls: Record<string, string>,
  { launch, ...overrides }: Partial<SupervisorOptions> & { launch?: Partial<VllmLaunchOptions> } = {},
) {
  counter += 1;
  const { executable, recordFile } = await writeStandInExecutable({ dir: join(dir, `bin-${counter}`), engine: "vllm", controls });
  const supervisor = new EngineSupervisor({
    replicaId: `vllm-${counter}`,
    stateRoot: join(dir, `root-${counter}`),
    prepare: ({ attempt, host, port, stateDir }) =>
      vllmLaunch({
        executable,
        modelDir,
        modelName: MODEL,
        profile,
        engineKey: ENGINE_KEY,
        host,
        port,
        attempt,
        stateDir,
        tensorParallel: 2,
        pipelineParallel: 1,
        ...launch,
      }),
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

test("vllm serve becomes ready with the served name, the parallel sizes and the context length; the key is in VLLM_API_KEY, not argv; offline, with every cache below the run's folder", async () => {
  const { supervisor, recordFile } = await vllmSupervisor({ STAND_IN_LOAD_MS: "300" }, { launch: { maxModelLen: 8192, gpus: [0, 1] } });
  try {
    supervisor.start();
    const ready = await untilSnapshot(supervisor, inState("ready"));
    assert.equal(ready.attempt, 1);
    const stateDir = ready.stateDir as string;

    const [start] = await standInStarts(recordFile);
    assert.ok(start);
    const { argv, env } = start;
    assert.deepEqual(argv.slice(0, 2), ["serve", modelDir]);
    assert.equal(argAfter(argv, "--host"), "127.0.0.1");
    assert.equal(argAfter(argv, "--port"), String(ready.endpoint?.port));
    assert.equal(argAfter(argv, "--served-model-name"), MODEL);
    assert.equal(argAfter(argv, "--tensor-parallel-size"), "2");
    assert.equal(argAfter(argv, "--pipeline-parallel-size"), "1");
    assert.equal(argAfter(argv, "--max-model-len"), "8192");
    assert.ok(!argv.includes("--distributed-executor-backend"), "one node needs no Ray");
    assert.ok(!argv.includes("--attention-backend"), "attempt 1 leaves the backend to vLLM");
    assert.equal(argv.at(-1), "--enable-prefix-caching", "the profile's engine_args come last");
    assert.ok(!argv.some((arg) => arg.includes(ENGINE_KEY)), "the key is not on the command line");
    assert.ok(!argv.includes("--api-key"));
    assert.equal(env.VLLM_API_KEY, ENGINE_KEY);
    assert.equal(env.CUDA_VISIBLE_DEVICES, "0,1");
    for (const flag of ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"]) assert.equal(env[flag], "1", flag);
    for (const root of ["HOME", "TMPDIR", "XDG_CACHE_HOME", "HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH"]) {
      assert.ok(env[root]?.startsWith(`${stateDir}/`), `${root}=${env[root]} is below the run's folder`);
    }

    // As the real vLLM: the key guards /v1, /health stays open.
    const base = `http://127.0.0.1:${ready.endpoint?.port}`;
    const refused = await request(`${base}/v1/models`);
    assert.equal(refused.statusCode, 401);
    await refused.body.dump();
    const models = await request(`${base}/v1/models`, { headers: { authorization: `Bearer ${ENGINE_KEY}` } });
    assert.deepEqual(
      ((await models.body.json()) as { data: { id: string }[] }).data.map((model) => model.id),
      [MODEL],
    );

    const records = await attemptRecords(supervisor, stateDir);
    assert.deepEqual(
      records.map((record) => [record.attempt, record.result]),
      [[1, "ready"]],
    );
    assert.deepEqual(records[0]?.settings, {
      engine: "vllm",
      attentionBackend: "default",
      tensorParallel: 2,
      pipelineParallel: 1,
      maxModelLen: 8192,
      gpus: [0, 1],
    });
    assert.ok(!(await readFile(join(stateDir, "attempts.jsonl"), "utf8")).includes(ENGINE_KEY));
  } finally {
    await supervisor.stop();
  }
});

test("an engine that dies at start with the default attention backend is retried with the fallback backend: attempt 2 is ready, and attempts.jsonl records both", async () => {
  const { supervisor, recordFile } = await vllmSupervisor({ STAND_IN_CRASH: "default-attention", STAND_IN_LOAD_MS: "100" });
  try {
    supervisor.start();
    const failed = await untilSnapshot(supervisor, inState("failed"));
    assert.equal(failed.lastErrorCode, "engine_exited");
    assert.match(failed.lastError ?? "", /FlashAttention only supports Ampere GPUs or newer/);
    const ready = await untilSnapshot(supervisor, inState("ready"));
    assert.equal(ready.attempt, 2);

    const starts = await standInStarts(recordFile);
    assert.deepEqual(
      starts.map((start) => argAfter(start.argv, "--attention-backend")),
      [undefined, "TRITON_ATTN"],
    );
    const records = await attemptRecords(supervisor, ready.stateDir as string);
    assert.deepEqual(
      records.map((record) => [record.attempt, record.result, (record.settings as { attentionBackend: unknown }).attentionBackend]),
      [
        [1, "engine_exited", "default"],
        [2, "ready", "TRITON_ATTN"],
      ],
    );
  } finally {
    await supervisor.stop();
  }
});

test("a vLLM that never finishes loading (never listens) hits the readiness deadline; its process is killed and its log kept", async () => {
  const { supervisor } = await vllmSupervisor({ STAND_IN_NEVER_READY: "1" }, { readyTimeoutMs: 1_500, backoff: { initialMs: 60_000, maxMs: 60_000 } });
  try {
    supervisor.start();
    const failed = await untilSnapshot(supervisor, inState("failed"));
    assert.equal(failed.lastErrorCode, "not_ready");
    assert.match(failed.lastError ?? "", /not ready within 1\.5 s on attempt 1 \(last health check of .*\/health: connection refused\)/);
    assert.equal(failed.pid, null);
    const stateDir = failed.stateDir as string;
    const log = join(stateDir, "attempt-1.log");
    assert.ok(existsSync(log));
    assert.match(await readFile(log, "utf8"), /vLLM API server version/);
    const records = await attemptRecords(supervisor, stateDir);
    assert.deepEqual(
      records.map((record) => [record.attempt, record.result, record.log]),
      [[1, "not_ready", "attempt-1.log"]],
    );
  } finally {
    await supervisor.stop();
  }
});

/** The options every launch-argument test shares: one replica on 10.0.0.5:8000. */
function launchBase() {
  return {
    executable: "vllm",
    modelDir: "/m",
    modelName: MODEL,
    profile,
    engineKey: ENGINE_KEY,
    host: "10.0.0.5",
    port: 8000,
    attempt: 1,
    stateDir: "/var/lib/llmgw/runs/r-1",
  };
}

test("launch arguments: a replica over two nodes runs through Ray at the head's address; without one, or in a state folder too deep for vLLM's sockets, it is refused", () => {
  const common = { ...launchBase(), tensorParallel: 8 };
  const multi = vllmLaunch({ ...common, pipelineParallel: 2, rayAddress: "10.0.0.5:6379" });
  assert.equal(argAfter(multi.args, "--pipeline-parallel-size"), "2");
  assert.equal(argAfter(multi.args, "--distributed-executor-backend"), "ray");
  assert.equal(multi.env.RAY_ADDRESS, "10.0.0.5:6379");
  assert.ok(!multi.args.includes("--max-model-len"), "vLLM takes the model's own length when none is given");

  assert.throws(
    () => vllmLaunch({ ...common, pipelineParallel: 2 }),
    (error: unknown) => error instanceof LlmgwError && error.code === "invalid_request" && /Ray head address/.test(error.message),
  );
  assert.throws(() => vllmLaunch({ ...common, pipelineParallel: 0 }), /pipelineParallel must be a whole number of at least 1, got 0/);
  const deep = `/${"d".repeat(70)}`;
  assert.throws(
    () => vllmLaunch({ ...common, pipelineParallel: 1, stateDir: deep }),
    (error: unknown) => error instanceof LlmgwError && error.code === "state_path_too_long" && /would need 112 bytes, more than the 107/.test(error.message),
  );
  assert.equal(
    argAfter(vllmLaunch({ ...common, pipelineParallel: 1, attempt: 2, fallbackAttentionBackend: "FLEX_ATTENTION" }).args, "--attention-backend"),
    "FLEX_ATTENTION",
  );
  const chosen = vllmLaunch({
    ...common,
    pipelineParallel: 1,
    attempt: 2,
    profile: profileSchema.parse({ ...profile, engine_args: ["-ac.backend", "FLASHINFER"] }),
  });
  assert.ok(!chosen.args.includes("--attention-backend"), "the profile's own backend is kept on fallback attempts");
  assert.equal(chosen.settings?.attentionBackend, "engine_args");
});

test("Ray launches: the head on port 6379 with its dashboard as health port, a worker joining HEAD:6379 with its agent as health port, sockets short and inside the state folder", () => {
  const stateDir = "/var/lib/llmgw/runs/ray-1";
  const head = rayHeadLaunch({ executable: "ray", host: "10.0.0.5", port: 8265, stateDir, gpus: [0, 1] });
  assert.equal(head.command, "ray");
  assert.deepEqual(head.args.slice(0, 2), ["start", "--head"]);
  assert.equal(argAfter(head.args, "--port"), "6379");
  assert.equal(argAfter(head.args, "--dashboard-port"), "8265");
  assert.equal(argAfter(head.args, "--dashboard-host"), "10.0.0.5");
  assert.equal(argAfter(head.args, "--node-ip-address"), "10.0.0.5");
  assert.equal(argAfter(head.args, "--raylet-socket-name"), `${stateDir}/tmp/raylet`);
  assert.equal(argAfter(head.args, "--plasma-store-socket-name"), `${stateDir}/tmp/plasma`);
  assert.equal(argAfter(head.args, "--num-gpus"), "2");
  assert.ok(head.args.includes("--block"), "in the foreground, where the supervisor can watch it");
  assert.deepEqual([head.host, head.port, head.healthPath], ["10.0.0.5", 8265, "/api/gcs_healthz"]);
  assert.deepEqual(head.env, { RAY_USAGE_STATS_ENABLED: "0", CUDA_VISIBLE_DEVICES: "0,1" });

  const worker = rayWorkerLaunch({ executable: "/opt/ray/bin/ray", host: "10.0.0.6", port: 52365, stateDir, headAddress: "10.0.0.5:6379" });
  assert.deepEqual(worker.args.slice(0, 3), ["start", "--address", "10.0.0.5:6379"]);
  assert.ok(!worker.args.includes("--head"));
  assert.equal(argAfter(worker.args, "--dashboard-agent-listen-port"), "52365");
  assert.equal(argAfter(worker.args, "--node-ip-address"), "10.0.0.6");
  assert.ok(worker.args.includes("--block"));
  assert.ok(!worker.args.includes("--num-gpus"), "Ray counts the GPUs it sees when placement names none");
  assert.deepEqual([worker.port, worker.healthPath], [52365, "/api/local_raylet_healthz"]);
  assert.throws(
    () => rayWorkerLaunch({ executable: "ray", host: "h", port: 1, stateDir: `/${"d".repeat(100)}`, headAddress: "h:6379" }),
    /Ray's sockets .* more than the 107/,
  );
});

test("adapters: vLLM serves each PEFT folder under its served name (--enable-lora --lora-modules NAME=PATH); none, no flags", () => {
  const common = { ...launchBase(), tensorParallel: 1, pipelineParallel: 1 };
  const launch = vllmLaunch({
    ...common,
    adapters: [
      { servedName: `${MODEL}:style`, path: "/adapters/style" },
      { servedName: "terse", path: "/adapters/terse" },
    ],
  });
  const at = launch.args.indexOf("--lora-modules");
  assert.ok(launch.args.includes("--enable-lora"));
  assert.deepEqual(launch.args.slice(at + 1, at + 3), [`${MODEL}:style=/adapters/style`, "terse=/adapters/terse"]);
  assert.ok(!vllmLaunch(common).args.includes("--enable-lora"));
});
