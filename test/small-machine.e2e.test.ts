// A small machine holds several small models: a server with its own node (as `llmgw up`
// runs it, the in-process agent and real engine processes) that reports 2 cores and 4 GiB
// serves the `up --demo` model and three more tiny generated models at once, every one
// ready and answering. Before replicas took a share of a core that follows their size
// (plan/cpu-share.ts), each took a whole core and the third model found "0 of 2 cores
// free, needs 1". The node's cores used add up the quarters the replicas reserve. Then a
// serve job for a model that asks for both cores finds them busy and waits (unfinished,
// its placement step saying why); once the small models are removed it goes on by itself
// to a ready replica and its smoke test, through the real fleet and engine.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { silentLogger } from "../src/core/log.ts";
import { BUNDLED_ENGINE } from "../src/agent/inventory.ts";
import { startLocalNode } from "../src/agent/local-node.ts";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { eventually } from "./support/eventually.ts";
import { startHarness, type Harness } from "./support/server-harness.ts";

const GiB = 1024 ** 3;
const MODELS = ["demo", "small-a", "small-b", "small-c"];

let harness: Harness;
let modelDir: string;

before(async () => {
  modelDir = mkdtempSync(path.join(tmpdir(), "llmgw-small-machine-"));
  harness = await startHarness({
    withAgent: (parts) =>
      startLocalNode(parts, { logger: silentLogger(), name: "small", inventory: { cores: 2, memoryBytes: 4 * GiB, gpus: [], engines: [BUNDLED_ENGINE] } }),
  });
  for (const [index, name] of MODELS.entries()) {
    const file = path.join(modelDir, `${name}.gguf`);
    // The demo's own seed and profile (cli/run-server.ts); the others as a user adds a small model.
    await writeTinyLlamaGguf({ path: file, seed: name === "demo" ? 42 : 100 + index });
    const profile =
      name === "demo" ? { name: "cpu", engine: "llamacpp", ctx_size: 4096, parallel: 2 } : { name: "cpu", engine: "llamacpp", ctx_size: 2048, parallel: 1 };
    await harness.addModel({ name, source: { kind: "file", path: file }, scaling: { min: 1, max: 1 }, profiles: [profile] });
  }
});

after(async () => {
  await harness?.close();
  rmSync(modelDir, { recursive: true, force: true });
});

test("a 2-core node holds the demo model and three more small models at once, all ready and answering", { timeout: 240_000 }, async () => {
  for (const name of MODELS) {
    await eventually(
      `${name} to be ready`,
      async () => {
        const { body } = await harness.admin("GET", `/api/v1/models/${name}`);
        if (body.health.state === "unplaceable" || body.health.state === "parked") throw new Error(`${name} is ${body.health.state}: ${body.health.reason}`);
        return body.health.state === "ready" ? body : undefined;
      },
      { timeoutMs: 180_000 },
    );
  }
  const replicas = harness.server.replicas.all().filter((r) => MODELS.includes(r.modelName));
  assert.deepEqual(replicas.map((r) => r.state).sort(), ["ready", "ready", "ready", "ready"]);

  // Each tiny replica reserves a quarter core: 1 of the node's 2 cores in use, 1 left for more.
  const { body: nodes } = await harness.admin("GET", "/api/v1/nodes");
  const node = nodes.data.find((n: { name: string }) => n.name === "small");
  assert.deepEqual(node.cores, { used: 1, total: 2 });

  const client = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0 });
  for (const name of MODELS) {
    const answer = await client.chat.completions.create({ model: name, messages: [{ role: "user", content: "Hello" }], max_tokens: 3 });
    assert.equal(answer.model, name);
    assert.ok((answer.usage?.completion_tokens ?? 0) > 0, `${name} answered`);
  }
});

test("a serve job that finds the cores busy waits, and goes on by itself to its smoke test once room frees", { timeout: 240_000 }, async () => {
  const file = path.join(modelDir, "needs-two.gguf");
  await writeTinyLlamaGguf({ path: file, seed: 200 });
  const submitted = await harness.admin("POST", "/api/v1/jobs/serve", {
    repo: file,
    name: "needs-two",
    hardware: { cpu: { cores: 2 } },
    ctx_pool: 2048,
    context: 1024,
  });
  assert.equal(submitted.status, 202, JSON.stringify(submitted.body));
  const jobPath = `/api/v1/jobs/${submitted.body.id}`;
  const waiting = await eventually(
    "the job to wait for room",
    async () => {
      const { body } = await harness.admin("GET", jobPath);
      if (body.state === "failed") throw new Error(`the job failed: ${body.error}`);
      return body.state === "waiting" ? body : undefined;
    },
    { timeoutMs: 120_000 },
  );
  const placement = waiting.steps.find((step: { name: string }) => step.name === "placement");
  assert.equal(placement.state, "waiting");
  assert.match(placement.detail, /^waiting for room: small: 1 of 2 cores free, needs 2\. The job goes on by itself once a node has room\.$/);
  assert.equal(waiting.finished_at, null);

  // Room frees as the small models go: their replicas stop, and the job goes on unasked.
  for (const name of MODELS) assert.equal((await harness.admin("DELETE", `/api/v1/models/${name}`)).status, 200, name);
  const done = await eventually(
    "the job to finish",
    async () => {
      const { body } = await harness.admin("GET", jobPath);
      if (body.state === "failed") throw new Error(`the job failed: ${body.error}`);
      return body.state === "done" ? body : undefined;
    },
    { timeoutMs: 180_000 },
  );
  assert.deepEqual(
    done.steps.map((step: { state: string }) => step.state),
    ["done", "done", "done", "done", "done", "done"],
  );
  assert.match(done.steps.find((step: { name: string }) => step.name === "placement").detail, /^replica r-\S+ ready on small \(/);
  assert.equal(typeof done.result.reply, "string");
  assert.ok(done.result.completion_tokens > 0, "the smoke test got an answer");
});
