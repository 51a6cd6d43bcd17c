// A fleet on one machine, as an operator runs it: `llmgw server` and three `llmgw agent`
// processes on loopback, each with its own data dir and an `--inventory` that says what
// it offers (a CPU-only node, one with a 24 GB GPU, one with two 80 GB GPUs). GPU engines
// cannot run here: the GPU nodes run the stand-in llama-server and vLLM executables
// (test/support/stand-in-*.mjs, each following the health behaviour of reference/engines.md);
// every model that answers a chat request is the bundled llama.cpp on a generated GGUF.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { execFile } from "node:child_process";
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import OpenAI from "openai";
import { findFreePort } from "../src/agent/free-port.ts";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { eventually } from "./support/eventually.ts";
import { spawnLlmgw, type LlmgwProcess } from "./support/cluster-processes.ts";
import { writeStandInExecutable } from "./support/stand-in-executables.ts";
import { UNLOADABLE_GGUF_COMPLAINT, writeUnloadableGguf } from "./support/unloadable-gguf.ts";
import type { RenderedError } from "../src/core/errors.ts";
import type { StoredEvent } from "../src/events/event-log.ts";
import type { modelHealthView, NodeView } from "../src/fleet/fleet-views.ts";
import { adminCaller } from "./support/admin-call.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);
const GiB = 1024 ** 3;

/** A model's health as GET /api/v1/models/:name/health shows it. */
type HealthView = ReturnType<typeof modelHealthView>;
/** The OpenAI-shaped error body every refusal carries. */
type ErrorBody = RenderedError["body"];

type Running = LlmgwProcess;
const llmgw = spawnLlmgw;

describe("a fleet of agents", { timeout: 600_000 }, () => {
  // Short: vLLM's Unix sockets go below each run folder, and a socket path has at most 107 bytes.
  const root = mkdtempSync(path.join(tmpdir(), "lf"));
  const serverDir = path.join(root, "server");
  const running: Running[] = [];
  const agents = new Map<string, Running>();
  let url = "";
  let adminKey = "";
  let modelFile = "";
  let tinyBytes = 0;
  let standIns: { llamaServer: string; vllm: string; vllmRecord: string; ray: string; rayRecord: string };
  // Short backoff, so an engine that crashes at start parks after its 5 tries in seconds.
  const timings = JSON.stringify({ backoffMs: [100, 400] });

  const admin = adminCaller(() => ({ url, key: adminKey }));
  const ctl = (args: string[]) =>
    run(process.execPath, [BIN, "ctl", "--server", url, "--key", adminKey, ...args], { env: { ...process.env, LLMGW_LOG_LEVEL: "silent" } });
  const health = async (model: string): Promise<HealthView> => (await admin("GET", `/api/v1/models/${model}/health`)).body;
  const nodes = async () => (await admin("GET", "/api/v1/nodes")).body.data as NodeView[];
  /** The events of one kind about one subject, once there is one (they are recorded without being awaited). */
  const eventsAbout = (kind: string, subject: string) =>
    eventually(`a ${kind} event about ${subject}`, async () => {
      const found = ((await admin("GET", `/api/v1/events?kind=${kind}`)).body.data as StoredEvent[]).filter((e) => e.subject === subject);
      return found.length > 0 ? found : undefined;
    });

  const startAgent = (name: string, inventory: object, extra: string[] = []) => {
    const dir = path.join(root, `agent-${name}`);
    mkdirSync(dir, { recursive: true });
    const inventoryFile = path.join(dir, "inventory.json");
    writeFileSync(inventoryFile, JSON.stringify(inventory));
    const joinToken = readFileSync(path.join(serverDir, "join.token"), "utf8").trim();
    const agent = llmgw(["agent", "--server", url, "--join-token", joinToken, "--name", name, "--data-dir", dir, "--inventory", inventoryFile, ...extra], {
      LLMGW_AGENT_TIMINGS: timings,
    });
    running.push(agent);
    agents.set(name, agent);
    return agent;
  };

  before(async () => {
    modelFile = path.join(root, "tiny.gguf");
    tinyBytes = (await writeTinyLlamaGguf({ path: modelFile, seed: 11 })).bytes;
    const vllm = await writeStandInExecutable({ dir: path.join(root, "bin-vllm"), engine: "vllm" });
    const ray = await writeStandInExecutable({ dir: path.join(root, "bin-ray"), engine: "ray" });
    standIns = {
      llamaServer: (await writeStandInExecutable({ dir: path.join(root, "bin-llama-server"), engine: "llama-server" })).executable,
      vllm: vllm.executable,
      vllmRecord: vllm.recordFile,
      ray: ray.executable,
      rayRecord: ray.recordFile,
    };
    const port = await findFreePort("127.0.0.1");
    url = `http://127.0.0.1:${port}`;
    const server = llmgw(["server", "--data-dir", serverDir, "--listen", `127.0.0.1:${port}`, "--node-timeout", "6s", "--heartbeat-interval", "1s"]);
    running.push(server);
    await eventually("the server to listen", () => server.output().includes("listening on"));
    adminKey = readFileSync(path.join(serverDir, "admin.key"), "utf8").trim();

    // Memory is chosen so that CPU replicas of `tiny` (3 GiB each) fit on cpu-a and gpu-80
    // but not on gpu-24, whose only engine is its llama-server (a stand-in here).
    startAgent("cpu-a", { cores: 4, memory: "8g", engines: [{ engine: "llamacpp", version: "3.21.1" }] });
    startAgent(
      "gpu-24",
      { cores: 4, memory: "4g", gpus: [{ name: "NVIDIA GeForce RTX 4090", memory: "24g" }], engines: [{ engine: "llama-server", version: "4567 (abc1234)" }] },
      ["--llama-server", standIns.llamaServer],
    );
    startAgent(
      "gpu-80",
      {
        cores: 16,
        memory: "64g",
        gpus: [
          { name: "NVIDIA H100 80GB HBM3", memory: "80g" },
          { name: "NVIDIA H100 80GB HBM3", memory: "80g" },
        ],
        engines: [
          { engine: "llamacpp", version: "3.21.1" },
          { engine: "vllm", version: "0.11.0" },
        ],
      },
      ["--vllm", standIns.vllm],
    );
    // Two nodes with one A100 each, for a vLLM replica that spans both (pipeline parallel over Ray).
    for (const name of ["pp-1", "pp-2"]) {
      startAgent(
        name,
        { cores: 8, memory: "32g", gpus: [{ name: "NVIDIA A100-SXM4-80GB", memory: "80g" }], engines: [{ engine: "vllm", version: "0.11.0" }] },
        ["--vllm", standIns.vllm, "--ray", standIns.ray],
      );
    }
    await eventually("five ready nodes", async () => (await nodes()).filter((n) => n.state === "ready").length === 5);
  });

  after(async () => {
    for (const process of running) process.child.kill("SIGTERM");
    await Promise.all(running.map((process) => process.exited));
    rmSync(root, { recursive: true, force: true });
  });

  test("places replicas where they fit: CPU models on CPU room, GPU models on their GPU class, never a GPU twice; the rest says what each node lacks", async () => {
    const listed = await ctl(["node", "list"]);
    assert.match(listed.stdout, /^cpu-a +ready +\d+s ago +0\/4 +0 B \/ 8\.0 GiB +- +0$/m);
    assert.match(listed.stdout, /^gpu-80 +ready +.* 0\/2 H100 +0$/m);
    assert.match(listed.stdout, /^gpu-24 +ready +.* 0\/1 RTX4090 +0$/m);

    const gpuSmall = path.join(root, "gpu-small.gguf");
    cpSync(modelFile, gpuSmall);
    const vllmDir = path.join(root, "big");
    mkdirSync(vllmDir);
    writeFileSync(path.join(vllmDir, "config.json"), JSON.stringify({ architectures: ["LlamaForCausalLM"] }));
    const created = [
      {
        name: "tiny",
        source: { kind: "file", path: modelFile },
        scaling: { min: 2, max: 2 },
        profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 2, hardware: { cpu: { min_memory_gb: 3 } } }],
      },
      {
        name: "gpu-small",
        source: { kind: "file", path: gpuSmall },
        profiles: [{ name: "rtx", engine: "llamacpp", hardware: { gpu: { class: "RTX4090", gpus_per_node: 1 } } }],
      },
      {
        name: "big",
        source: { kind: "file", path: path.join(vllmDir, "config.json") },
        profiles: [{ name: "h100x2", engine: "vllm", hardware: { gpu: { class: "H100", gpus_per_node: 2 } } }],
      },
    ];
    for (const body of created) assert.equal((await admin("POST", "/api/v1/models", body)).status, 201, body.name);

    const tiny = await eventually("both replicas of tiny ready", async () => {
      const h = await health("tiny");
      return h.ready === 2 ? h : undefined;
    });
    assert.deepEqual(tiny.replicas.map((r) => r.nodes.join(",")).sort(), ["cpu-a", "gpu-80"], "the two replicas of one model go to different nodes");
    const small = await eventually("gpu-small ready", async () => ((await health("gpu-small")).ready === 1 ? health("gpu-small") : undefined));
    assert.deepEqual(small.replicas[0]!.nodes, ["gpu-24"]);
    const big = await eventually("big ready", async () => ((await health("big")).ready === 1 ? health("big") : undefined));
    assert.deepEqual(big.replicas[0]!.nodes, ["gpu-80"]);
    const gpu80: NodeView = (await admin("GET", "/api/v1/nodes/gpu-80")).body;
    assert.deepEqual(
      gpu80.gpus.map((g) => g.replica),
      [big.replicas[0]!.id, big.replicas[0]!.id],
      "both H100s belong to big",
    );

    // One more H100 model finds both GPUs taken; a 4-GPU one fits nowhere.
    for (const [name, gpus] of [
      ["big2", 1],
      ["huge", 4],
    ] as const) {
      assert.equal(
        (
          await admin("POST", "/api/v1/models", {
            name,
            source: { kind: "file", path: path.join(vllmDir, "config.json") },
            profiles: [{ name: "h100", engine: "vllm", hardware: { gpu: { class: "H100", gpus_per_node: gpus } } }],
          })
        ).status,
        201,
      );
    }
    const big2 = await eventually("big2 unplaceable", async () => ((await health("big2")).state === "unplaceable" ? health("big2") : undefined));
    assert.deepEqual(
      big2.placement!.filter((line: string) => !line.startsWith("pp-")),
      ["cpu-a: no vllm engine", "gpu-24: no vllm engine", "gpu-80: 0 of 2 H100 GPUs free, needs 1"],
    );
    assert.match(big2.placement!.find((line: string) => line.startsWith("pp-1"))!, /no H100 GPU/);
    const huge = await eventually("huge unplaceable", async () => ((await health("huge")).state === "unplaceable" ? health("huge") : undefined));
    assert.match(huge.placement!.find((line: string) => line.startsWith("gpu-80"))!, /2 H100 GPUs?.*needs 4/);
    const shown = await ctl(["model", "show", "huge"]);
    assert.match(shown.stdout, /placement: no node can take a replica:\n {2}cpu-a: no vllm engine/);

    // The stand-in vLLM on gpu-80 was started as vLLM is: two GPUs, the key not on its command line.
    const client = new OpenAI({ apiKey: adminKey, baseURL: `${url}/v1`, maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 3 });
    assert.equal(answer.usage?.completion_tokens, 3);
    for (const name of ["big2", "huge"]) await admin("DELETE", `/api/v1/models/${name}`);
  });

  test("a vLLM replica over two nodes: a Ray head on one, a worker joining it on the other, then vLLM on the head through Ray", async () => {
    const vllmDir = path.join(root, "big");
    assert.equal(
      (
        await admin("POST", "/api/v1/models", {
          name: "spanning",
          source: { kind: "file", path: path.join(vllmDir, "config.json") },
          profiles: [{ name: "a100x2", engine: "vllm", hardware: { gpu: { class: "A100", gpus_per_node: 1, nodes: 2 } } }],
        })
      ).status,
      201,
    );
    const spanning = await eventually("spanning ready", async () => ((await health("spanning")).ready === 1 ? health("spanning") : undefined));
    assert.deepEqual([...spanning.replicas[0]!.nodes].sort(), ["pp-1", "pp-2"]);
    const [head, worker] = spanning.replicas[0]!.nodes as string[];

    const rayStarts = (await readFile(standIns.rayRecord, "utf8"))
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { argv: string[]; env: Record<string, string> });
    const headStart = rayStarts.find((start) => start.argv.includes("--head"))!;
    const workerStart = rayStarts.find((start) => start.argv.includes("--address"))!;
    const gcs = `127.0.0.1:${headStart.argv[headStart.argv.indexOf("--port") + 1]}`;
    assert.equal(workerStart.argv[workerStart.argv.indexOf("--address") + 1], gcs, "the worker joined the head's GCS");
    const vllmStart = (await readFile(standIns.vllmRecord, "utf8"))
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as { argv: string[]; env: Record<string, string> })
      .find((start) => start.argv.includes("--distributed-executor-backend"))!;
    assert.equal(vllmStart.argv[vllmStart.argv.indexOf("--pipeline-parallel-size") + 1], "2");
    assert.equal(vllmStart.argv[vllmStart.argv.indexOf("--distributed-executor-backend") + 1], "ray");
    assert.equal(vllmStart.env.RAY_ADDRESS, gcs, "vLLM runs on that Ray cluster");
    assert.ok(head !== worker);
    const pp = (await nodes()).filter((n) => n.name.startsWith("pp-"));
    assert.ok(
      pp.every((n) => n.gpus[0]!.replica === spanning.replicas[0]!.id),
      "each node's A100 belongs to the replica",
    );
    await admin("DELETE", "/api/v1/models/spanning");
    await eventually("the spanning replica gone from both nodes", async () =>
      (await nodes()).filter((n) => n.name.startsWith("pp-")).every((n) => n.replicas.length === 0),
    );
  });

  test("kill -9 of an agent: its node is lost, its replica runs elsewhere, and the model answers throughout", async () => {
    const before = await health("tiny");
    const onA = before.replicas.find((r) => r.nodes[0] === "cpu-a");
    assert.ok(onA, "a replica of tiny runs on cpu-a");
    const client = new OpenAI({ apiKey: adminKey, baseURL: `${url}/v1`, maxRetries: 0 });
    agents.get("cpu-a")!.child.kill("SIGKILL");

    // Requests keep being answered by the replica on gpu-80 while cpu-a is being declared lost.
    let answered = 0;
    const lost = await eventually(
      "cpu-a lost",
      async () => {
        const answer = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 });
        if (answer.usage?.completion_tokens === 2) answered += 1;
        return (await nodes()).find((n) => n.name === "cpu-a" && n.state === "lost");
      },
      { timeoutMs: 20_000 },
    );
    assert.ok(lost);
    assert.ok(answered >= 1, "the model answered while its other node was being lost");
    const events = await eventsAbout("node_lost", "node:cpu-a");
    assert.match(events[0]!.message, /Node 'cpu-a' sent no heartbeat/);
    assert.equal(events[0]!.data.node, "cpu-a");

    const replaced = await eventually(
      "tiny back to two ready replicas without cpu-a",
      async () => {
        const h = await health("tiny");
        return h.ready === 2 && h.replicas.every((r) => r.nodes[0] !== "cpu-a") ? h : undefined;
      },
      { timeoutMs: 60_000 },
    );
    assert.ok(!replaced.replicas.some((r) => r.id === onA.id), "the replica on the lost node was replaced, not kept");

    // The agent comes back with the same data dir: the node is ready again, with nothing to run.
    const again = startAgent("cpu-a", { cores: 4, memory: "8g", engines: [{ engine: "llamacpp", version: "3.21.1" }] });
    await eventually("cpu-a back", async () => (await nodes()).find((n) => n.name === "cpu-a" && n.state === "ready"));
    assert.doesNotMatch(again.output(), /joined the fleet/, "it used its node credential, not the join token");
    assert.deepEqual(
      (await eventsAbout("node_back", "node:cpu-a")).map((e) => e.data),
      [{ node: "cpu-a" }],
    );

    // Both replicas of tiny share gpu-80 now: once cpu-a has stayed back for two heartbeat
    // intervals, one moves there (started first; one on gpu-80 stops once it is ready).
    const spread = await eventually(
      "tiny spread over cpu-a and gpu-80 again",
      async () => {
        const h = await health("tiny");
        return h.ready === 2 && h.replicas.length === 2 && new Set(h.replicas.map((r) => r.nodes[0])).size === 2 ? h : undefined;
      },
      { timeoutMs: 60_000 },
    );
    assert.equal(spread.spread, null);
    const [moved] = await eventsAbout("replica_moved", "model:tiny");
    assert.deepEqual([moved!.data.from, moved!.data.to], ["gpu-80", "cpu-a"]);
  });

  test("a mirrored model runs on a node that fetches its weights from the server's mirror with its node credential", async () => {
    const fetched = await ctl(["mirror", "fetch", modelFile, "--model", "mirrored"]);
    const serveLine = /llmgw ctl model add NAME --mirror (\S+)/.exec(fetched.stdout);
    assert.ok(serveLine, fetched.stdout);
    const [, version, ...file] = serveLine[1]!.split("/");
    assert.equal(
      (
        await admin("POST", "/api/v1/models", {
          name: "mirrored",
          source: { kind: "mirror", model: "mirrored", version, file: file.join("/") },
          // 3 GiB keeps it off gpu-24, whose llama.cpp is the stand-in llama-server.
          profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1, hardware: { cpu: { min_memory_gb: 3 } } }],
        })
      ).status,
      201,
    );
    const ready = await eventually("mirrored ready", async () => ((await health("mirrored")).ready === 1 ? health("mirrored") : undefined), {
      timeoutMs: 90_000,
    });
    assert.equal(ready.replicas[0]!.weights_verified, true, "the node verified the mirror's sha256 before the start");
    const node = ready.replicas[0]!.nodes[0] as string;
    const cached = path.join(root, `agent-${node}`, "weights", "mirrored", version!, ...file);
    assert.equal(
      createHash("sha256").update(readFileSync(cached)).digest("hex"),
      createHash("sha256").update(readFileSync(modelFile)).digest("hex"),
      "the node's cache holds the mirrored bytes",
    );
    const client = new OpenAI({ apiKey: adminKey, baseURL: `${url}/v1`, maxRetries: 0 });
    assert.equal(
      (await client.chat.completions.create({ model: "mirrored", messages: [{ role: "user", content: "Hi" }], max_tokens: 2 })).usage?.completion_tokens,
      2,
    );
    await admin("DELETE", "/api/v1/models/mirrored");
  });

  test("an engine that crashes at every start is parked with the reason after 5 tries", async () => {
    // `llmgw engine` exits at once on weights llama.cpp refuses to load: a crash at every start.
    const unloadable = path.join(root, "unloadable.gguf");
    await writeUnloadableGguf({ path: unloadable });
    assert.equal(
      (
        await admin("POST", "/api/v1/models", {
          name: "crashy",
          source: { kind: "file", path: unloadable },
          profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1, hardware: { cpu: { min_memory_gb: 3 } } }],
        })
      ).status,
      201,
    );
    const parked = await eventually("crashy parked", async () => ((await health("crashy")).state === "parked" ? health("crashy") : undefined), {
      timeoutMs: 120_000,
    });
    assert.equal(parked.replicas[0]!.failures, 5);
    assert.match(parked.parked!.reason, /Parked after 5 failures/);
    assert.match(parked.parked!.reason, UNLOADABLE_GGUF_COMPLAINT);
    const shown = await ctl(["model", "show", "crashy"]);
    assert.match(shown.stdout, /unpark with 'llmgw ctl model unpark crashy'/);
    await admin("DELETE", "/api/v1/models/crashy");
  });

  test("weights altered on a node are refused before start: reported, never started", async () => {
    const guarded = path.join(root, "guarded", "tiny.gguf");
    mkdirSync(path.dirname(guarded));
    cpSync(modelFile, guarded);
    const sha256 = createHash("sha256").update(readFileSync(guarded)).digest("hex");
    // Same size, other bytes: as a bad disk or a stray copy would leave it.
    const bytes = readFileSync(guarded);
    bytes[bytes.length - 10] = (bytes[bytes.length - 10] ?? 0) ^ 0xff;
    writeFileSync(guarded, bytes);
    assert.equal(statSync(guarded).size, tinyBytes);
    const created = await admin("POST", "/api/v1/models", {
      name: "guarded",
      source: { kind: "file", path: guarded },
      origin: { repo: "local/tiny", revision: "1", files: [{ path: "tiny.gguf", sha256, bytes: tinyBytes }] },
      // 3 GiB keeps it off gpu-24, whose llama.cpp is the stand-in llama-server.
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1, hardware: { cpu: { min_memory_gb: 3 } } }],
    });
    assert.equal(created.status, 201);
    const refused = await eventually("guarded refused", async () => {
      const h = await health("guarded");
      return h.replicas[0]?.last_error?.includes("sha256") ? h : undefined;
    });
    assert.match(refused.replicas[0]!.last_error!, new RegExp(sha256));
    assert.equal(refused.replicas[0]!.weights_verified, false);
    assert.equal(refused.ready, 0);
    const runsDir = path.join(root, `agent-${refused.replicas[0]!.nodes[0]}`, "runs");
    const logs = run("sh", ["-c", `ls ${runsDir}/${refused.replicas[0]!.id}-*/ 2>/dev/null || true`]);
    assert.doesNotMatch((await logs).stdout, /attempt-1\.log/, "no engine was started on the altered weights");
    await admin("DELETE", "/api/v1/models/guarded");
  });

  test("bad input: a wrong join token, a credential copied to another node, a removed node's credential", async () => {
    const wrong = llmgw([
      "agent",
      "--server",
      url,
      "--join-token",
      "ljt_wrong",
      "--name",
      "intruder",
      "--data-dir",
      path.join(root, "intruder"),
      "--inventory",
      path.join(root, "agent-cpu-a", "inventory.json"),
    ]);
    assert.equal(await wrong.exited, 1);
    assert.match(wrong.output(), /The join token is not this server's/);

    const nodeJson = readFileSync(path.join(root, "agent-gpu-24", "node.json"), "utf8");
    const credential = (JSON.parse(nodeJson) as { credential: string }).credential;
    const copied = await fetch(`${url}/agent/v1/heartbeat`, {
      method: "POST",
      headers: { authorization: `Bearer ${credential}`, "content-type": "application/json" },
      body: JSON.stringify({
        name: "impostor",
        address: "127.0.0.1",
        inventory: { cores: 1, memoryBytes: GiB, gpus: [], engines: [{ engine: "llamacpp", version: "1" }] },
        replicas: [],
      }),
    });
    assert.equal(copied.status, 403);
    assert.match(((await copied.json()) as ErrorBody).error.message, /belongs to node 'gpu-24', not 'impostor'/);

    const impossible = await fetch(`${url}/agent/v1/heartbeat`, {
      method: "POST",
      headers: { authorization: `Bearer ${credential}`, "content-type": "application/json" },
      body: JSON.stringify({
        name: "gpu-24",
        address: "127.0.0.1",
        inventory: { cores: 0, memoryBytes: GiB, gpus: [], engines: [{ engine: "llamacpp", version: "1" }] },
        replicas: [],
      }),
    });
    assert.equal(impossible.status, 400);
    assert.equal(((await impossible.json()) as ErrorBody).error.code, "invalid_inventory");

    const gpu24 = agents.get("gpu-24")!;
    await ctl(["node", "remove", "gpu-24"]);
    await eventually("the removed node's agent to be refused", () => /was removed from the fleet/.test(gpu24.output()));
    const afterRemove = await fetch(`${url}/agent/v1/assignments?wait_ms=0`, { headers: { authorization: `Bearer ${credential}` } });
    assert.equal(afterRemove.status, 401);
    assert.equal(((await afterRemove.json()) as ErrorBody).error.code, "node_removed");
    // The removed node's engine stops: it is no longer among any node's assignments, and gpu-small is unplaceable.
    await eventually("gpu-small unplaceable without gpu-24", async () => (await health("gpu-small")).state === "unplaceable");
    const unplaceable = (await eventsAbout("replica_unplaceable", "model:gpu-small"))[0]!;
    assert.equal(unplaceable.data.model, "gpu-small");
    assert.ok(Array.isArray(unplaceable.data.explanation) && unplaceable.data.explanation.length > 0, JSON.stringify(unplaceable.data));
  });
  test("drain: replicas move to another node and stop there only once their successors are ready; one with nowhere to go keeps serving", async () => {
    const before = await health("tiny");
    const onGpu80 = before.replicas.find((r) => r.nodes[0] === "gpu-80");
    assert.ok(onGpu80, "a replica of tiny runs on gpu-80 (the other on cpu-a)");
    const drained = await ctl(["node", "drain", "gpu-80"]);
    assert.match(drained.stdout, /Node 'gpu-80' is draining/);
    const moved = await eventually(
      "tiny ready on cpu-a only",
      async () => {
        const h = await health("tiny");
        return h.ready === 2 && h.replicas.length === 2 && h.replicas.every((r) => r.nodes[0] === "cpu-a") ? h : undefined;
      },
      { timeoutMs: 90_000 },
    );
    assert.ok(!moved.replicas.some((r) => r.id === onGpu80.id), "the replica on gpu-80 was replaced");
    assert.match(moved.spread ?? "", /^2 replicas on cpu-a: gpu-80 is draining/);
    // big needs two H100s, and only gpu-80 has them: it stays where it is rather than stop.
    const big = await health("big");
    assert.equal(big.ready, 1);
    assert.deepEqual(big.replicas[0]!.nodes, ["gpu-80"]);
    assert.equal((await nodes()).find((n) => n.name === "gpu-80")!.state, "draining");
    // gpu-small stayed unplaceable through every pass of the drain: it was announced once, when it started.
    assert.equal((await health("gpu-small")).state, "unplaceable");
    assert.equal((await eventsAbout("replica_unplaceable", "model:gpu-small")).length, 1);
  });
});
