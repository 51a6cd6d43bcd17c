// Serve and update jobs end to end: `llmgw ctl model serve` against the stand-in Hub with
// a generated GGUF (every step done, the smoke test's reply and tokens/s printed, then the
// model answering the `openai` client through the gateway, with its provenance shown);
// the update check and its `new_weights` event; an update that swaps revisions while a
// client keeps sending requests (none fails, none is cut); an update whose new file is
// corrupt at the Hub (the old revision keeps serving); a rollback; and a cancel.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { UpstreamError } from "../src/core/errors.ts";
import { smokeTestReplica, type SmokeTest } from "../src/serve/smoke-test.ts";
import { Gate } from "./support/gate.ts";
import { ctlRunner } from "./support/ctl-runner.ts";
import { eventually } from "./support/eventually.ts";
import { startHarnessWithAgent, type Harness } from "./support/server-harness.ts";
import { fakeCommitSha, startStandInHub, type StandInFile, type StandInHub, type StandInRepo } from "./support/stand-in-hub.ts";
import { writeStandInExecutable } from "./support/stand-in-executables.ts";
import { buildStandInRepos, GGUF_REPO, SAFETENSORS_REPO, tinyGgufBytes } from "./support/stand-in-repos.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const Q8 = "tiny-llama-Q8_0.gguf";
const sha256 = (bytes: Buffer) => createHash("sha256").update(bytes).digest("hex");
const open = () => {
  const gate = new Gate();
  gate.open();
  return gate;
};

describe("serve and update jobs", () => {
  let hub: StandInHub;
  let harness: Harness;
  let repo: StandInRepo;
  let client: OpenAI;
  let gpuAgent: ChildProcess | undefined;
  const smoke = { fail: false, gate: open() };
  // Short: vLLM's Unix sockets go below the agent's run folders, and a socket path has at most 107 bytes.
  const agentRoot = mkdtempSync(path.join(tmpdir(), "ls"));

  before(async () => {
    const repos = await buildStandInRepos();
    repo = repos.gguf;
    hub = await startStandInHub({ repos: [repo, repos.safetensors] });
    // The real smoke test, unless a test makes the new revision fail it or holds it.
    const smokeTest: SmokeTest = async (target, name, signal) => {
      await Promise.race([smoke.gate.wait(), new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true }))]);
      if (smoke.fail) throw new UpstreamError("the new revision answered nonsense (this test says so)");
      return smokeTestReplica(target, name, signal);
    };
    ({ harness } = await startHarnessWithAgent({ registryEndpoint: hub.url, replicaTimeoutMs: 120_000, smokeTest }));
    client = new OpenAI({ baseURL: `${harness.url}/v1`, apiKey: await harness.clientKey(), maxRetries: 0 });
  });

  after(async () => {
    if (gpuAgent !== undefined && gpuAgent.exitCode === null) {
      const exited = new Promise((resolve) => gpuAgent!.once("exit", resolve));
      gpuAgent.kill("SIGTERM");
      await exited;
    }
    await harness.close();
    await hub.close();
    rmSync(agentRoot, { recursive: true, force: true });
  });

  const { ctl, ctlFails } = ctlRunner(() => harness, { timeoutMs: 240_000 });
  const job = async (id: string) => (await harness.admin("GET", `/api/v1/jobs/${id}`)).body;
  const lastJob = async (model: string) => (await harness.admin("GET", `/api/v1/jobs?model=${encodeURIComponent(model)}&limit=1`)).body.data[0];
  /** The one event a finished job recorded (events are written after the job ends, without being awaited). */
  const jobEventOf = (id: string) =>
    eventually(`the event of job ${id}`, async () => {
      const recorded = (await harness.server.events.list({ kinds: ["update_done", "job_failed"] })).filter((e) => e.data.job === id);
      return recorded.length > 0 ? recorded : undefined;
    });
  const ask = async () =>
    (await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hello" }], max_tokens: 8 })).choices[0]?.message.content;

  /** Two clients streaming chat requests to `tiny` until stopped; every request that failed or was cut is listed. */
  function keepSending(): { stop(): Promise<{ ok: number; failures: string[] }> } {
    let sending = true;
    let ok = 0;
    const failures: string[] = [];
    const sender = async () => {
      while (sending) {
        try {
          const stream = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Count" }], max_tokens: 12, stream: true });
          let finish: string | null | undefined;
          for await (const chunk of stream) finish = chunk.choices[0]?.finish_reason ?? finish;
          if (finish === undefined || finish === null) failures.push("a stream ended without a finish reason");
          else ok += 1;
        } catch (error) {
          failures.push(String(error));
        }
      }
    };
    const senders = [sender(), sender()];
    return {
      stop: async () => {
        // A few more after the change, so requests cross it.
        const after = ok + 4;
        await eventually("requests after the change", () => ok >= after || failures.length > 0);
        sending = false;
        await Promise.all(senders);
        return { ok, failures };
      },
    };
  }

  /** The id of the one ready replica of `tiny`, and a watch that notes any moment it was not ready. */
  async function watchReadyReplica(): Promise<{ id: string; stop(): Promise<string[]> }> {
    const ready = async () =>
      ((await harness.admin("GET", "/api/v1/models/tiny/health")).body.replicas as Array<{ id: string; state: string }>).filter((r) => r.state === "ready");
    const [first] = await ready();
    assert.ok(first !== undefined, "tiny has a ready replica");
    const seen: string[] = [];
    let watching = true;
    const watch = (async () => {
      while (watching) {
        const replica = ((await harness.admin("GET", "/api/v1/models/tiny/health")).body.replicas as Array<{ id: string; state: string }>).find(
          (r) => r.id === first.id,
        );
        if (replica?.state !== "ready") seen.push(replica?.state ?? "gone");
        await new Promise((resolve) => setTimeout(resolve, 25));
      }
    })();
    return {
      id: first.id,
      stop: async () => {
        watching = false;
        await watch;
        return seen;
      },
    };
  }

  /** Publishes a new commit on main whose Q8_0 file has other bytes; returns its sha and the file's sha256. */
  async function publish(seed: number, label: string): Promise<{ sha: string; fileSha: string }> {
    const bytes = await tinyGgufBytes({ seed });
    const previousMain = repo.revisions!.main!;
    const files: StandInFile[] = repo.files.map((file) => (file.path === Q8 ? { path: Q8, content: bytes } : file));
    const sha = fakeCommitSha(`${GGUF_REPO}@${label}`);
    repo = { ...repo, revisions: { ...repo.revisions, main: sha }, filesAt: { ...repo.filesAt, [previousMain]: repo.files }, files };
    hub.putRepo(repo);
    return { sha, fileSha: sha256(bytes) };
  }

  test("ctl model serve: every step done, the reply and tokens/s printed, then the model answers through the gateway with its provenance", {
    timeout: 240_000,
  }, async () => {
    const served = await ctl([
      "model",
      "serve",
      GGUF_REPO,
      "--quant",
      "Q8_0",
      "--name",
      "tiny",
      "--alias",
      "tiny-chat",
      "--ctx-pool",
      "2048",
      "--context",
      "1024",
    ]);
    assert.match(served.stdout, /registry/);
    assert.match(served.stdout, /tokens\/s/, served.stdout);
    const finished = await lastJob("tiny");
    assert.equal(finished.state, "done", JSON.stringify(finished.steps));
    assert.deepEqual(
      finished.steps.map((s: { name: string; state: string }) => `${s.name}:${s.state}`),
      ["registry:done", "mirror:done", "check:done", "catalog:done", "placement:done", "smoke_test:done"],
    );
    assert.ok(finished.result.reply.length > 0);
    assert.ok(finished.result.tokens_per_second > 0);
    assert.ok(finished.result.completion_tokens > 0);
    assert.match(finished.steps[0].detail, new RegExp(`${GGUF_REPO} @ [0-9a-f]{12}: Q8_0`));
    assert.match(finished.steps[2].detail, /llama, \d+ layers/);

    assert.ok((await ask())!.length > 0, "the served model answers the openai client through the gateway");
    const viaAlias = await client.chat.completions.create({ model: "tiny-chat", messages: [{ role: "user", content: "Hi" }], max_tokens: 4 });
    assert.equal(viaAlias.choices.length, 1);

    // Provenance: the origin names the commit and each file with the sha256 the Hub published.
    const model = (await harness.admin("GET", "/api/v1/models/tiny")).body;
    const published = repo.files.find((f) => f.path === Q8)!.content as Buffer;
    assert.equal(model.origin.repo, GGUF_REPO);
    assert.equal(model.origin.revision, repo.revisions!.main);
    assert.deepEqual(model.origin.files, [{ path: Q8, sha256: sha256(published), bytes: published.length }]);
    assert.ok(
      model.replicas.some((r: { state: string; weights_verified: boolean }) => r.state === "ready" && r.weights_verified),
      "the model shows, per replica, that its node verified the hashes",
    );
    const health = (await harness.admin("GET", "/api/v1/models/tiny/health")).body;
    assert.ok(
      health.replicas.some((r: { state: string; weights_verified: boolean }) => r.state === "ready" && r.weights_verified),
      JSON.stringify(health.replicas),
    );
    const shown = await ctl(["model", "show", "tiny"]);
    assert.match(shown.stdout, new RegExp(`origin: ${GGUF_REPO} @ ${repo.revisions!.main}`));
    assert.match(shown.stdout, new RegExp(sha256(published)));
    assert.match(shown.stdout, /verified/);
  });

  test("refusals at the door say what to do: a name in use, a job already at work on the model", async () => {
    const taken = await harness.admin("POST", "/api/v1/jobs/serve", { repo: GGUF_REPO, name: "tiny" });
    assert.equal(taken.status, 409);
    assert.match(taken.body.error.message, /already used by model 'tiny'/);
    const cli = await ctlFails(["model", "serve", GGUF_REPO, "--name", "tiny-chat"]);
    assert.equal(cli.code, 1);
    assert.match(cli.stderr, /^error: The name 'tiny-chat' is already used/m);
    const noOrigin = await harness.admin("POST", "/api/v1/jobs/update", { model: "nothing-here" });
    assert.equal(noOrigin.status, 404);
  });

  test("the update check finds a newer revision once and records new_weights", async () => {
    const none = await harness.admin("POST", "/api/v1/updates/check", { model: "tiny" });
    assert.equal(none.body.data[0].update_available, false);
    const { sha } = await publish(21, "second");
    const found = (await harness.admin("POST", "/api/v1/updates/check", {})).body.data.find((u: { model: string }) => u.model === "tiny");
    assert.equal(found.update_available, true);
    assert.equal(found.latest_revision, sha);
    await harness.admin("POST", "/api/v1/updates/check", {});
    const events = (
      (await harness.admin("GET", "/api/v1/events?kind=new_weights")).body.data as Array<{ subject: string; message: string; data: Record<string, unknown> }>
    ).filter((e) => e.subject === "model:tiny");
    assert.equal(events.length, 1, "one event per newly published revision");
    assert.match(events[0]!.message, /llmgw ctl model update tiny/);
    assert.equal(events[0]!.data.new_revision, sha, "the event's data names the new revision");
    assert.equal((await harness.admin("GET", "/api/v1/updates")).body.data[0].update_available, true);
  });

  test("an update swaps revisions while a client keeps sending requests: none fails, none is cut", { timeout: 240_000 }, async () => {
    const before = (await harness.admin("GET", "/api/v1/models/tiny")).body.origin;
    const target = repo.revisions!.main!;
    const traffic = keepSending();
    const updated = await ctl(["model", "update", "tiny"]);
    const { ok, failures } = await traffic.stop();
    assert.deepEqual(failures, []);
    assert.ok(ok > 0);
    assert.match(updated.stdout, /tokens\/s/);
    const done = await lastJob("tiny");
    assert.equal(done.kind, "update");
    assert.equal(done.state, "done", JSON.stringify(done.steps));
    assert.match(done.steps.find((s: { name: string }) => s.name === "retire").detail, /drained and stopped/);
    const after = (await harness.admin("GET", "/api/v1/models/tiny")).body.origin;
    assert.equal(after.revision, target);
    assert.equal(after.previous.revision, before.revision);
    assert.match(
      (await harness.admin("GET", "/api/v1/models/tiny")).body.description,
      new RegExp(`^Served from ${GGUF_REPO} at ${target.slice(0, 12)} `),
      "the description serving wrote names the new revision",
    );
    const moved = (await jobEventOf(done.id)).map((e) => [e.kind, e.data]);
    assert.deepEqual(moved, [
      ["update_done", { job: done.id, model: "tiny", repo: GGUF_REPO, old_revision: before.revision, new_revision: target, rollback: false }],
    ]);
    const health = (await harness.admin("GET", "/api/v1/models/tiny/health")).body;
    assert.equal(health.replicas.filter((r: { state: string }) => r.state === "ready").length, 1, "the old replica stopped");
    assert.equal((await harness.admin("GET", "/api/v1/updates")).body.data[0].update_available, false);
  });

  test("an update whose new file is corrupt at the Hub fails and leaves the old revision serving", { timeout: 240_000 }, async () => {
    const before = (await harness.admin("GET", "/api/v1/models/tiny")).body.origin;
    await publish(31, "third");
    hub.setFault({ kind: "corrupt", match: "/cdn/" });
    try {
      const failed = await ctlFails(["model", "update", "tiny"]);
      assert.equal(failed.code, 1);
      assert.match(failed.stderr, /could not be mirrored|sha256/);
    } finally {
      hub.setFault(null);
    }
    const job = await lastJob("tiny");
    assert.equal(job.state, "failed");
    assert.equal(job.steps.find((s: { name: string }) => s.name === "mirror").state, "failed");
    assert.deepEqual(
      (await jobEventOf(job.id)).map((e) => [e.kind, e.data.step]),
      [["job_failed", "mirror"]],
      "a failed update is no update_done",
    );
    assert.equal((await harness.admin("GET", "/api/v1/models/tiny")).body.origin.revision, before.revision);
    assert.ok((await ask())!.length > 0, "the old revision still answers");
  });

  test("rollback returns to the previous revision while its files are still mirrored", { timeout: 240_000 }, async () => {
    const current = (await harness.admin("GET", "/api/v1/models/tiny")).body.origin;
    const rolled = await ctl(["model", "rollback", "tiny"]);
    assert.match(rolled.stdout, /tokens\/s/);
    const after = (await harness.admin("GET", "/api/v1/models/tiny")).body.origin;
    assert.equal(after.revision, current.previous.revision);
    assert.equal(after.previous.revision, current.revision);
    const job = await lastJob("tiny");
    assert.equal(job.steps.find((s: { name: string }) => s.name === "mirror").detail, "1 file of the previous revision still in the mirror");
    const rolledBack = (await jobEventOf(job.id)).map((e) => [e.kind, e.data]);
    assert.deepEqual(rolledBack, [
      ["update_done", { job: job.id, model: "tiny", repo: GGUF_REPO, old_revision: current.revision, new_revision: current.previous.revision, rollback: true }],
    ]);
    assert.ok((await ask())!.length > 0);
  });

  test("an update whose new replica fails the smoke test points the model back; the old replica served throughout", { timeout: 240_000 }, async () => {
    const before = (await harness.admin("GET", "/api/v1/models/tiny")).body.origin;
    const old = await watchReadyReplica();
    const traffic = keepSending();
    smoke.fail = true;
    try {
      const failed = await ctlFails(["model", "update", "tiny"]);
      assert.match(failed.stderr, /did not take over: the new revision answered nonsense.*back on [0-9a-f]{12}, whose replicas kept serving/);
    } finally {
      smoke.fail = false;
    }
    const { failures } = await traffic.stop();
    assert.deepEqual(failures, [], "no request failed while the new revision was tried and given up");
    assert.deepEqual(await old.stop(), [], "the old replica stayed ready the whole time");
    const job = await lastJob("tiny");
    assert.deepEqual(
      job.steps.map((s: { name: string; state: string }) => `${s.name}:${s.state}`),
      ["registry:done", "mirror:done", "check:done", "catalog:done", "rollout:done", "smoke_test:failed", "retire:skipped"],
    );
    const after = (await harness.admin("GET", "/api/v1/models/tiny")).body.origin;
    assert.equal(after.revision, before.revision, "back on the old revision");
    assert.equal(after.previous?.revision, before.previous?.revision);
    assert.deepEqual(
      (await jobEventOf(job.id)).map((e) => [e.kind, e.data.step]),
      [["job_failed", "smoke_test"]],
      "an update given up is no update_done",
    );
    await eventually("the failed revision's replica gone", async () => {
      const replicas = (await harness.admin("GET", "/api/v1/models/tiny/health")).body.replicas as Array<{ id: string }>;
      return replicas.length === 1 && replicas[0]!.id === old.id;
    });
  });

  test("an update cancelled during its smoke test leaves the old revision serving", { timeout: 240_000 }, async () => {
    const before = (await harness.admin("GET", "/api/v1/models/tiny")).body.origin;
    const old = await watchReadyReplica();
    smoke.gate = new Gate();
    try {
      const started = await harness.admin("POST", "/api/v1/jobs/update", { model: "tiny" });
      assert.equal(started.status, 202);
      await eventually("the smoke test running", async () => (await job(started.body.id)).steps[5].state === "running");
      // The new replica is ready but unproven: clients still reach only the old one.
      const health = (await harness.admin("GET", "/api/v1/models/tiny")).body.replicas as Array<{ id: string; state: string; endpoint: unknown }>;
      assert.deepEqual(
        health.filter((r) => r.endpoint !== null).map((r) => r.id),
        [old.id],
      );
      const cancelled = (await harness.admin("POST", `/api/v1/jobs/${started.body.id}/cancel`)).body;
      assert.equal(cancelled.state, "cancelled");
    } finally {
      smoke.gate.open();
    }
    assert.deepEqual(await old.stop(), [], "the old replica stayed ready the whole time");
    assert.equal((await harness.admin("GET", "/api/v1/models/tiny")).body.origin.revision, before.revision);
    assert.ok((await ask())!.length > 0);
  });

  test("cancel stops a serve job and removes what it started; verified files stay", { timeout: 120_000 }, async () => {
    // The projector's download hangs; the weights file completes and is verified meanwhile.
    const projector = repo.files.find((f) => f.path.startsWith("mmproj-"))!;
    const weights = repo.files.find((f) => f.path === "tiny-llama-Q4_K_M.gguf")!;
    hub.setFault({ kind: "hang", match: new RegExp(`/cdn/repos/${sha256(projector.content as Buffer)}`) });
    const mirrored = async () =>
      (await harness.admin("GET", "/api/v1/mirror?model=llmgw-test--tiny-llama-GGUF")).body.data as Array<{
        file: string;
        state: string;
        actualSha256: string | null;
      }>;
    try {
      const started = await harness.admin("POST", "/api/v1/jobs/serve", { repo: GGUF_REPO, quant: "Q4_K_M", projector: true, name: "doomed" });
      assert.equal(started.status, 202);
      await eventually(
        "the weights verified while the projector hangs",
        async () =>
          (await job(started.body.id)).steps[1].state === "running" && (await mirrored()).some((f) => f.file === weights.path && f.state === "complete"),
      );
      const cancelled = await ctl(["job", "cancel", started.body.id, "--json"]);
      const view = JSON.parse(cancelled.stdout);
      assert.equal(view.state, "cancelled");
      assert.deepEqual(
        view.steps.map((s: { state: string }) => s.state),
        ["done", "cancelled", "cancelled", "cancelled", "cancelled", "cancelled"],
      );
      assert.equal((await harness.admin("GET", "/api/v1/models/doomed")).status, 404);
    } finally {
      hub.setFault(null);
    }
    const kept = (await mirrored()).find((f) => f.file === weights.path);
    assert.equal(kept?.state, "complete", "the verified file stays in the mirror");
    assert.equal(kept?.actualSha256, sha256(weights.content as Buffer));
    const listed = JSON.parse((await ctl(["job", "list", "--json"])).stdout);
    assert.ok(listed.some((j: { state: string }) => j.state === "cancelled"));
  });

  test("original weights: a safetensors repository is planned onto the fleet's GPU node and served on vLLM there, which gets the whole mirrored folder", {
    timeout: 240_000,
  }, async () => {
    const vllm = await writeStandInExecutable({ dir: path.join(agentRoot, "bin"), engine: "vllm" });
    const dir = path.join(agentRoot, "gpu");
    mkdirSync(dir, { recursive: true });
    const inventory = path.join(dir, "inventory.json");
    writeFileSync(
      inventory,
      JSON.stringify({ cores: 8, memory: "32g", gpus: [{ name: "NVIDIA H100 80GB HBM3", memory: "80g" }], engines: [{ engine: "vllm", version: "0.11.0" }] }),
    );
    const joinToken = readFileSync(path.join(harness.dataDir, "join.token"), "utf8").trim();
    gpuAgent = spawn(
      process.execPath,
      [
        BIN,
        "agent",
        "--server",
        harness.url,
        "--join-token",
        joinToken,
        "--name",
        "gpu",
        "--data-dir",
        dir,
        "--inventory",
        inventory,
        "--vllm",
        vllm.executable,
      ],
      {
        stdio: "ignore",
        env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
      },
    );
    await eventually("the GPU node joined", async () =>
      (await harness.admin("GET", "/api/v1/nodes")).body.data.some((n: { name: string; state: string }) => n.name === "gpu" && n.state === "ready"),
    );

    const cpu = await ctlFails(["model", "serve", SAFETENSORS_REPO, "--cpu", "--name", "orig"]);
    assert.match(cpu.stderr, /never on the CPU/);
    // No hardware given: the plan is made against the fleet's nodes, and picks the GPU node's H100.
    const served = await ctl(["model", "serve", SAFETENSORS_REPO, "--name", "orig"]);
    assert.match(served.stdout, /Hello from the stand-in vLLM\./);
    const job = await lastJob("orig");
    assert.equal(job.state, "done", JSON.stringify(job.steps));
    assert.match(job.steps[0].detail, /vllm on 1× H100/);
    const model = (await harness.admin("GET", "/api/v1/models/orig")).body;
    assert.equal(model.profiles[0].engine, "vllm");
    // The stand-in refuses a folder that misses config.json or a shard: every file of the version went to the node.
    const files = model.origin.files.map((f: { path: string }) => f.path).sort();
    assert.ok(files.includes("config.json") && files.filter((f: string) => f.endsWith(".safetensors")).length === 2, files.join(","));
    const answer = await client.chat.completions.create({ model: "orig", messages: [{ role: "user", content: "Hi" }], max_tokens: 8 });
    assert.equal(answer.choices[0]?.message.content, "Hello from the stand-in vLLM.");
  });
});
