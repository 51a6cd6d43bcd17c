// Notifications from real triggers, end to end (issue 10's "Done when"): one server in this
// process with its local node (real `llmgw engine` processes on a generated GGUF), the
// stand-in Hub, a fake OpenAI-compatible upstream for a priced model, an `llmgw agent`
// child process, and two loopback receivers: a Standard Webhooks receiver that verifies
// signatures with the `standardwebhooks` package (not llmgw's signing code) and a Slack
// incoming-webhook stand-in. Nothing here calls events.record(): each event comes from
// what causes it in production.
//
// - model_parked: an engine that exits at every start until the supervisor gives up;
// - node_lost: an agent killed with SIGKILL, so its heartbeats stop;
// - budget_threshold, then budget_exhausted: a key with a small budget used through /v1
//   until the gateway answers 429 insufficient_quota;
// - new_weights: a newer commit at the Hub for a model served from it, found by the update check;
// - job_failed: a serve job for a repository the Hub does not have.
//
// Each must reach both receivers within 30 s of its trigger; each test says how long it took.
import { after, before, describe, test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { eventually } from "./support/eventually.ts";
import { startFakeUpstream, type FakeUpstream } from "./support/fake-upstream.ts";
import { startHarnessWithAgent, type Harness } from "./support/server-harness.ts";
import { fakeCommitSha, startStandInHub, type StandInHub, type StandInRepo } from "./support/stand-in-hub.ts";
import { buildStandInRepos, GGUF_REPO, tinyGgufBytes } from "./support/stand-in-repos.ts";
import { startReceiver, type ReceivedWebhook, type Receiver } from "./support/webhook-receiver.ts";
import { UNLOADABLE_GGUF_COMPLAINT, writeUnloadableGguf } from "./support/unloadable-gguf.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
/** The Done-when's bound: trigger to both receivers. */
const WITHIN_MS = 30_000;
const Q8 = "tiny-llama-Q8_0.gguf";

describe("notifications from real triggers", { timeout: 300_000 }, () => {
  const root = mkdtempSync(path.join(tmpdir(), "llmgw-notify-e2e-"));
  let harness: Harness;
  let hub: StandInHub;
  let repo: StandInRepo;
  let upstream: FakeUpstream;
  let webhook: Receiver;
  let slack: Receiver;
  let modelFile: string;
  const children: ChildProcess[] = [];

  before(async () => {
    modelFile = path.join(root, "tiny.gguf");
    await writeTinyLlamaGguf({ path: modelFile, seed: 5 });
    repo = (await buildStandInRepos()).gguf;
    hub = await startStandInHub({ repos: [repo] });
    upstream = await startFakeUpstream({ reply: "five words of reply here" });
    webhook = await startReceiver();
    slack = await startReceiver("/services/T000/B000/slack");
    ({ harness } = await startHarnessWithAgent({
      registryEndpoint: hub.url,
      replicaTimeoutMs: 120_000,
      // Short, so a killed agent is lost in seconds; the local node heartbeats in this process at the same pace.
      nodeTimeoutMs: 4_000,
      heartbeatIntervalMs: 1_000,
      // An engine that fails at every start parks after 3 quick tries instead of minutes of backoff.
      supervisor: { backoff: { initialMs: 50, maxMs: 200 }, parkAfter: { failures: 3, windowMs: 60_000 }, stopGraceMs: 3000 },
      // Retries and polls fast; budgets are read often, so the 80% line is seen between two requests.
      notify: { notify: { backoffMs: 50, maxBackoffMs: 200, pollMs: 50 }, budgetCheckIntervalMs: 100 },
    }));
    const hook = await harness.admin("POST", "/api/v1/notify", { name: "ops-hook", webhook: webhook.url });
    assert.equal(hook.status, 201, JSON.stringify(hook.body));
    webhook.secret = hook.body.secret;
    const team = await harness.admin("POST", "/api/v1/notify", { name: "team-slack", slack: slack.url });
    assert.equal(team.status, 201, JSON.stringify(team.body));
  });

  after(async () => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await harness?.close();
    await hub?.close();
    await upstream?.close();
    await webhook?.close();
    await slack?.close();
    rmSync(root, { recursive: true, force: true });
  });

  /**
   * Waits (at most 30 s from the trigger) until the event about `subject` reached both the
   * webhook and Slack; checks the signature, the type and that Slack's text names `name`.
   * Returns the webhook's body.
   */
  async function delivered(t: TestContext, kind: string, subject: string, name: string, triggeredAt: number): Promise<ReceivedWebhook["body"]> {
    const remaining = Math.max(1, WITHIN_MS - (Date.now() - triggeredAt));
    const [hook, message] = await eventually(
      `${kind} about ${subject} at the webhook and at Slack`,
      () => {
        const hook = webhook.webhooks().find((h) => h.body.type === kind && h.body.data.subject === subject);
        const message = slack.messages().find((m) => m.text.startsWith(`${titleOf(kind)}: `) && m.blocks.some((block) => block.text?.text.includes(subject)));
        return hook !== undefined && message !== undefined && ([hook, message] as const);
      },
      { timeoutMs: remaining },
    );
    t.diagnostic(`${kind} reached the webhook and Slack ${Date.now() - triggeredAt} ms after its trigger`);
    assert.equal(hook.verified, true, `the signature verifies with the channel's secret: ${hook.verifyError}`);
    assert.ok(!Number.isNaN(Date.parse(hook.body.timestamp)));
    assert.ok(message.text.includes(name), `Slack's text names ${name}: ${message.text}`);
    return hook.body;
  }

  test("a model whose engine crashes at every start is parked: model_parked names the model, node and reason", async (t) => {
    // `llmgw engine` exits at once on weights llama.cpp refuses to load: a crash at every start.
    const unloadable = path.join(root, "unloadable.gguf");
    await writeUnloadableGguf({ path: unloadable });
    const triggeredAt = Date.now();
    await harness.addModel({
      name: "crashing",
      source: { kind: "file", path: unloadable },
      profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 512, parallel: 1 }],
    });
    const body = await delivered(t, "model_parked", "model:crashing", "'crashing'", triggeredAt);
    assert.equal(body.data.model, "crashing");
    assert.equal(body.data.node, "local");
    assert.equal(body.data.severity, "critical");
    assert.match(String(body.data.reason), /Parked after 3 failures/);
    assert.match(String(body.data.reason), UNLOADABLE_GGUF_COMPLAINT, "the engine's own complaint reaches the operator");
    // Stop the crashing replicas from taking the local node's time in the tests that follow.
    assert.equal((await harness.admin("DELETE", "/api/v1/models/crashing")).status, 200);
  });

  test("an agent killed with SIGKILL: node_lost names the node", async (t) => {
    const dir = path.join(root, "agent-edge");
    mkdirSync(dir);
    // A node that offers only vLLM and no GPU: nothing in this file is placed on it.
    const inventory = path.join(dir, "inventory.json");
    writeFileSync(inventory, JSON.stringify({ cores: 2, memory: "2g", engines: [{ engine: "vllm", version: "0.11.0" }] }));
    const agent = spawn(
      process.execPath,
      [BIN, "agent", "--server", harness.url, "--join-token", harness.server.joinToken(), "--name", "edge-1", "--data-dir", dir, "--inventory", inventory],
      {
        stdio: ["ignore", "pipe", "pipe"],
        env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
      },
    );
    children.push(agent);
    let output = "";
    agent.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()));
    agent.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise((resolve) => agent.once("exit", resolve));
    await eventually("edge-1 ready", async () => {
      if (agent.exitCode !== null) throw new Error(`the agent exited with ${agent.exitCode}: ${output}`);
      const nodes = (await harness.admin("GET", "/api/v1/nodes")).body.data as Array<{ name: string; state: string }>;
      return nodes.some((node) => node.name === "edge-1" && node.state === "ready");
    });
    const triggeredAt = Date.now();
    agent.kill("SIGKILL");
    await exited;
    const body = await delivered(t, "node_lost", "node:edge-1", "'edge-1'", triggeredAt);
    assert.equal(body.data.node, "edge-1");
    assert.equal(body.data.severity, "warning");
    assert.equal(typeof body.data.last_heartbeat, "string");
    const local = ((await harness.admin("GET", "/api/v1/nodes")).body.data as Array<{ name: string; state: string }>).find((node) => node.name === "local");
    assert.equal(local?.state, "ready", "only the killed node was lost");
  });

  test("a key used through /v1 past 80% of its budget, then refused with 429 insufficient_quota: budget_threshold, then budget_exhausted", async (t) => {
    // Output is what costs here: 5 completion tokens at $100,000 per million is $0.50 a
    // request (7 prompt tokens add $0.000007), and the worst case reserved for max_tokens 5 is
    // barely more. A budget of $2.20 takes four requests ($2.000028, 90%) and refuses the fifth.
    await harness.addModel({
      name: "metered",
      prices: { input_per_million: 1, output_per_million: 100_000 },
      profiles: [{ name: "up", engine: "external", url: `${upstream.url}/v1` }],
    });
    const client = new OpenAI({ apiKey: await harness.clientKey({ name: "spender", budget_usd: 2.2 }), baseURL: `${harness.url}/v1`, maxRetries: 0 });
    const ask = () => client.chat.completions.create({ model: "metered", messages: [{ role: "user", content: "hi" }], max_tokens: 5 });
    for (let i = 0; i < 3; i++) assert.equal((await ask()).usage?.completion_tokens, 5);
    const crossedAt = Date.now();
    await ask();
    const threshold = await delivered(t, "budget_threshold", "key:spender", "'spender'", crossedAt);
    assert.equal(threshold.data.key, "spender");
    assert.ok(Math.abs((threshold.data.spent_usd as number) - 2.000028) < 1e-9, `spent ${threshold.data.spent_usd}`);
    assert.equal(threshold.data.limit_usd, 2.2);

    const refusedAt = Date.now();
    await assert.rejects(ask(), (error: unknown) => error instanceof OpenAI.APIError && error.status === 429 && error.code === "insufficient_quota");
    const exhausted = await delivered(t, "budget_exhausted", "key:spender", "'spender'", refusedAt);
    assert.equal(exhausted.data.key, "spender");
    assert.equal(exhausted.data.severity, "critical");
    assert.equal(exhausted.data.limit_usd, 2.2);
    assert.equal(typeof exhausted.data.key_prefix, "string");
  });

  test("a serve job for a repository the Hub does not have fails: job_failed carries the job id", async (t) => {
    const triggeredAt = Date.now();
    const submitted = await harness.admin("POST", "/api/v1/jobs/serve", { repo: "llmgw-test/no-such-repo-GGUF", name: "ghost" });
    assert.equal(submitted.status, 202, JSON.stringify(submitted.body));
    const jobId = submitted.body.id as string;
    const body = await delivered(t, "job_failed", `job:${jobId}`, jobId, triggeredAt);
    assert.equal(body.data.job, jobId);
    assert.equal(body.data.job_kind, "serve");
    assert.equal(body.data.model, "ghost");
    assert.equal(body.data.step, "registry");
    assert.match(String(body.data.error), /no-such-repo/);
  });

  test("a newer commit at the Hub for a served model: the update check's new_weights names the model and both revisions", async (t) => {
    const served = await harness.admin("POST", "/api/v1/jobs/serve", { repo: GGUF_REPO, quant: "Q8_0", name: "tiny", ctx_pool: 1024, context: 512 });
    assert.equal(served.status, 202, JSON.stringify(served.body));
    const job = await eventually(
      "the serve job to finish",
      async () => {
        const body = (await harness.admin("GET", `/api/v1/jobs/${served.body.id}`)).body;
        return body.state !== "queued" && body.state !== "running" && body;
      },
      { timeoutMs: 120_000 },
    );
    assert.equal(job.state, "done", JSON.stringify(job.steps));
    const servedRevision = repo.revisions!.main!;

    // Publish: main moves to a commit whose Q8_0 file has other bytes.
    const newRevision = fakeCommitSha(`${GGUF_REPO}@second`);
    const bytes = await tinyGgufBytes({ seed: 21 });
    hub.putRepo({
      ...repo,
      revisions: { ...repo.revisions, main: newRevision },
      filesAt: { ...repo.filesAt, [servedRevision]: repo.files },
      files: repo.files.map((file) => (file.path === Q8 ? { path: Q8, content: bytes } : file)),
    });
    const triggeredAt = Date.now();
    const check = await harness.admin("POST", "/api/v1/updates/check", {});
    assert.equal(check.status, 200, JSON.stringify(check.body));
    const body = await delivered(t, "new_weights", "model:tiny", "'tiny'", triggeredAt);
    assert.equal(body.data.model, "tiny");
    assert.equal(body.data.repo, GGUF_REPO);
    assert.equal(body.data.old_revision, servedRevision);
    assert.equal(body.data.new_revision, newRevision);
  });
});

function titleOf(kind: string): string {
  const titles: Record<string, string> = {
    model_parked: "Model parked",
    node_lost: "Node lost",
    budget_threshold: "Budget nearly spent",
    budget_exhausted: "Budget spent",
    new_weights: "New weights published",
    job_failed: "Job failed",
  };
  return titles[kind] ?? kind;
}
