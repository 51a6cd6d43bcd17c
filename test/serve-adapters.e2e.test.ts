// `llmgw ctl model serve REPO --adapter REPO` end to end, against the stand-in Hub (it
// stands for huggingface.co: the same API shapes, LFS redirects and gated answers) with a
// server and an `llmgw agent --llama-server` process running the REAL llama-server
// (test/support/real-llama-server.ts; provisioning builds it once), which loads adapters
// with --lora-scaled (the fleet places models with adapters only where llama-server runs):
// a text-only tiny GGUF model (llama-server refuses replies that are not valid UTF-8) and a
// tiny LoRA adapter in repositories of their own. The adapter is read from its repository,
// mirrored as that repository's version with the published sha256, and added to the
// model's definition with a mirror source; `ctl model show` lists it as MODEL:NAME, and the
// gateway answers a request for it. An adapter made for another base (embedding size 128,
// the model's 64) fails the job at the catalog step with both values and leaves nothing in
// the catalog, after the adapter mirrored by the first job was found there and not fetched
// again; a gated adapter repository fails the registry step the way a gated model does.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import OpenAI from "openai";
import { GGUFValueType, writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { writeTinyLora } from "../src/gguf/tiny-lora.ts";
import { spawnLlmgw, stopAll, type LlmgwProcess } from "./support/cluster-processes.ts";
import { ctlRunner } from "./support/ctl-runner.ts";
import { eventually } from "./support/eventually.ts";
import { realLlamaServer } from "./support/real-llama-server.ts";
import { startHarness, type Harness } from "./support/server-harness.ts";
import { fakeCommitSha, startStandInHub, type StandInHub } from "./support/stand-in-hub.ts";

const run = promisify(execFile);
const sha256 = (bytes: Buffer) => createHash("sha256").update(bytes).digest("hex");

const MODEL_REPO = "llmgw-test/tiny-text-GGUF";
const MODEL_FILE = "tiny-text-Q8_0.gguf";
const ADAPTER_REPO = "llmgw-test/style-lora-GGUF";
const ADAPTER_FILE = "style-lora-F32.gguf";
const WIDE_REPO = "llmgw-test/wide-lora-GGUF";
const GATED_REPO = "llmgw-test/gated-lora-GGUF";
const ADAPTER_VERSION = fakeCommitSha(ADAPTER_REPO).slice(0, 12);

describe("ctl model serve --adapter", () => {
  let hub: StandInHub;
  let harness: Harness;
  let agent: LlmgwProcess | undefined;
  let adapterBytes: Buffer;
  // Short: engine run folders go below it.
  let agentDir = "";

  before(async () => {
    // First, so a machine without the build fails here with the sentence that says how to make it.
    const llamaServer = await realLlamaServer();
    const dir = await mkdtemp(path.join(tmpdir(), "llmgw-serve-adapters-"));
    try {
      const file = async (name: string, write: (at: string) => Promise<unknown>) => {
        const at = path.join(dir, name);
        await write(at);
        return readFile(at);
      };
      // llama.cpp's number for Q8_0 in general.file_type, so the repository reads like a quantised one.
      const modelBytes = await file("model.gguf", (at) =>
        writeTinyLlamaGguf({ path: at, seed: 31, textOnly: true, extraMetadata: { "general.file_type": { value: 7, type: GGUFValueType.UINT32 } } }),
      );
      adapterBytes = await file("style.gguf", (at) => writeTinyLora({ path: at, seed: 32 }));
      const wideBytes = await file("wide.gguf", (at) => writeTinyLora({ path: at, seed: 33, embeddingLength: 128 }));
      const readme = { path: "README.md", content: Buffer.from("# a LoRA adapter\n") };
      hub = await startStandInHub({
        repos: [
          { name: MODEL_REPO, files: [{ path: MODEL_FILE, content: modelBytes }] },
          { name: ADAPTER_REPO, files: [readme, { path: ADAPTER_FILE, content: adapterBytes }] },
          { name: WIDE_REPO, files: [readme, { path: "wide-lora-F32.gguf", content: wideBytes }] },
          { name: GATED_REPO, gated: "manual", approvedTokens: ["hf_someone_else"], files: [{ path: "gated-lora.gguf", content: adapterBytes }] },
        ],
      });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
    harness = await startHarness({ registryEndpoint: hub.url, replicaTimeoutMs: 120_000, heartbeatIntervalMs: 1000 });
    agentDir = await mkdtemp(path.join(tmpdir(), "lsa"));
    const joinToken = readFileSync(path.join(harness.dataDir, "join.token"), "utf8").trim();
    const node = spawnLlmgw([
      "agent",
      "--server",
      harness.url,
      "--join-token",
      joinToken,
      "--name",
      "lora-node",
      "--data-dir",
      agentDir,
      "--llama-server",
      llamaServer,
    ]);
    agent = node;
    await eventually(
      "the node with llama-server ready",
      async () => {
        if (node.child.exitCode !== null) throw new Error(`the agent exited (${node.child.exitCode}):\n${node.output()}`);
        const nodes = (await harness.admin("GET", "/api/v1/nodes")).body.data as Array<{ name: string; state: string }>;
        return nodes.some((n) => n.name === "lora-node" && n.state === "ready");
      },
      { timeoutMs: 120_000 },
    );
  });

  after(async () => {
    // The agent stops its llama-server before it exits.
    if (agent !== undefined) await stopAll([agent]);
    await harness?.close();
    await hub?.close();
    if (agentDir !== "") await rm(agentDir, { recursive: true, force: true });
  });

  const { ctl, ctlFails } = ctlRunner(() => harness, { timeoutMs: 240_000 });
  const lastJob = async (model: string) => (await harness.admin("GET", `/api/v1/jobs?model=${encodeURIComponent(model)}&limit=1`)).body.data[0];
  const jobs = async () => (await harness.admin("GET", "/api/v1/jobs?kind=serve")).body.data as unknown[];
  /** The newest serve job: one that failed before its catalog step names no model yet. */
  const newestJob = async () => (await harness.admin("GET", "/api/v1/jobs?kind=serve&limit=1")).body.data[0];
  const stepsOf = (job: { steps: Array<{ name: string; state: string }> }) => job.steps.map((s) => `${s.name}:${s.state}`);
  const detailOf = (job: { steps: Array<{ name: string; detail: string | null }> }, name: string) => job.steps.find((s) => s.name === name)?.detail ?? "";

  test("the adapter is mirrored with its sha256, added with a mirror source, listed by ctl model show and served as MODEL:NAME", {
    timeout: 300_000,
  }, async () => {
    const served = await ctl([
      "model",
      "serve",
      MODEL_REPO,
      "--file",
      MODEL_FILE,
      "--name",
      "tiny",
      "--ctx-pool",
      "2048",
      "--context",
      "1024",
      "--adapter",
      ADAPTER_REPO,
    ]);
    assert.match(served.stdout, /tokens\/s/, served.stdout);
    const job = await lastJob("tiny");
    assert.equal(job.state, "done", JSON.stringify(job.steps));
    assert.deepEqual(stepsOf(job), ["registry:done", "mirror:done", "check:done", "catalog:done", "placement:done", "smoke_test:done"]);
    const named = `adapter style-lora (${ADAPTER_REPO} @ ${ADAPTER_VERSION}, `;
    assert.ok(detailOf(job, "registry").includes(`; with ${named}`), detailOf(job, "registry"));
    assert.match(detailOf(job, "mirror"), /^2 files verified \(.*\): 2 fetched, 0 already in the mirror, with adapter style-lora/);
    assert.match(
      detailOf(job, "check"),
      new RegExp(`adapter style-lora: llmgw-test--style-lora-GGUF/${ADAPTER_VERSION}/${ADAPTER_FILE}, .*sha256 ${sha256(adapterBytes).slice(0, 12)}`),
    );
    assert.match(detailOf(job, "catalog"), /^added 'tiny' with adapter style-lora .*, serving tiny:style-lora$/);

    // The definition: the adapter's own repository version in the mirror, at the catalog's default scale.
    const model = (await harness.admin("GET", "/api/v1/models/tiny")).body;
    assert.deepEqual(model.adapters, [
      { name: "style-lora", scale: 1, source: { kind: "mirror", model: "llmgw-test--style-lora-GGUF", version: ADAPTER_VERSION, file: ADAPTER_FILE } },
    ]);
    // The mirror holds the file, verified against the sha256 the Hub published.
    const mirrored = (await harness.admin("GET", "/api/v1/mirror?model=llmgw-test--style-lora-GGUF")).body.data as Array<Record<string, unknown>>;
    assert.deepEqual(
      mirrored.map((f) => [f.version, f.file, f.state, f.sha256, f.actualSha256, f.bytesTotal]),
      [[ADAPTER_VERSION, ADAPTER_FILE, "complete", sha256(adapterBytes), sha256(adapterBytes), adapterBytes.length]],
    );
    const shown = await ctl(["model", "show", "tiny"]);
    assert.match(
      shown.stdout,
      new RegExp(`tiny:style-lora\\s+style-lora\\s+1\\s+mirror llmgw-test--style-lora-GGUF/${ADAPTER_VERSION}/${ADAPTER_FILE}`),
      shown.stdout,
    );

    // The gateway serves it on the model's replica, whose llama-server loaded it.
    const client = new OpenAI({ baseURL: `${harness.url}/v1`, apiKey: await harness.clientKey(), maxRetries: 0 });
    assert.ok(
      (await client.models.list()).data.some((m) => m.id === "tiny:style-lora"),
      "GET /v1/models lists the adapter",
    );
    const answer = await client.chat.completions.create({ model: "tiny:style-lora", messages: [{ role: "user", content: "Hello" }], max_tokens: 4 });
    assert.equal(answer.choices.length, 1);
    const { stdout: processes } = await run("ps", ["-eo", "args="]);
    const engine = processes.split("\n").find((line) => line.includes(" --alias tiny "));
    assert.match(
      engine ?? "",
      new RegExp(`--lora-scaled \\S+/${ADAPTER_FILE}:0( |$)`),
      "the replica's llama-server loaded the mirrored adapter, at scale 0 until a request names it",
    );
  });

  test("an adapter made for another base fails the job at the catalog step with both values; nothing stays in the catalog", { timeout: 120_000 }, async () => {
    const failed = await ctlFails(["model", "serve", MODEL_REPO, "--file", MODEL_FILE, "--name", "tiny-wide", "--adapter", ADAPTER_REPO, `wide=${WIDE_REPO}`]);
    assert.equal(failed.code, 1);
    assert.match(failed.stderr, /embedding size 128 .*the model's is 64/);
    const job = await newestJob();
    assert.equal(job.request.name, "tiny-wide");
    assert.equal(job.state, "failed");
    assert.deepEqual(stepsOf(job), ["registry:done", "mirror:done", "check:done", "catalog:failed", "placement:skipped", "smoke_test:skipped"]);
    assert.match(
      detailOf(job, "catalog"),
      new RegExp(
        `^Adapter 'wide' \\(${WIDE_REPO} @ [0-9a-f]{12}, wide-lora-F32\\.gguf\\): .*does not fit model tiny-wide: .*embedding size 128 .*the model's is 64`,
      ),
    );
    assert.equal(job.error, detailOf(job, "catalog"));
    // The first job's adapter and the model's file were already in the mirror: only the new adapter was fetched.
    assert.match(detailOf(job, "mirror"), /^3 files verified \(.*\): 1 fetched, 2 already in the mirror/);
    for (const name of ["tiny-wide", "tiny-wide:wide", "tiny-wide:style-lora"]) {
      assert.equal((await harness.admin("GET", `/api/v1/models/${encodeURIComponent(name)}`)).status, 404, `${name} is not in the catalog`);
    }
    const names = ((await harness.admin("GET", "/api/v1/models")).body.data as Array<{ name: string }>).map((m) => m.name);
    assert.deepEqual(names, ["tiny"]);
  });

  test("a gated adapter repository fails the registry step as a gated model does; a safetensors adapter file is refused at the door", {
    timeout: 60_000,
  }, async () => {
    const before = (await jobs()).length;
    const gated = await ctlFails(["model", "serve", MODEL_REPO, "--file", MODEL_FILE, "--name", "tiny-gated", "--adapter", GATED_REPO]);
    assert.match(gated.stderr, new RegExp(`'${GATED_REPO}' is gated.*HF_TOKEN`));
    const job = await newestJob();
    assert.equal(job.request.name, "tiny-gated");
    assert.deepEqual(stepsOf(job).slice(0, 2), ["registry:failed", "mirror:skipped"]);
    assert.equal((await jobs()).length, before + 1);

    const door = await ctlFails(["model", "serve", MODEL_REPO, "--name", "tiny-peft", "--adapter", `${ADAPTER_REPO}:adapter_model.safetensors`]);
    assert.match(door.stderr, /^error: Adapter file 'adapter_model\.safetensors' of llmgw-test\/style-lora-GGUF is not a \.gguf file/m);
    assert.equal((await jobs()).length, before + 1, "refused at the door: no job");
  });
});
