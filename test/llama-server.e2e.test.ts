// The real llama-server, end to end: `llmgw server` and `llmgw agent --llama-server auto`
// as processes, the agent running the llama-server that `llmgw engine build` made from the
// llama.cpp source node-llama-cpp ships (test/support/real-llama-server.ts; provisioning
// builds it once). A serve job takes a generated model from the stand-in Hub through its
// smoke test; then chat (stream and not), completions and embeddings through the gateway
// with the official `openai` client; the engine key enforced by llama-server itself; a
// `kill -9` of llama-server restarted; and a model llama-server cannot load parked with
// llama.cpp's own words.
//
// The generated model is `textOnly` (src/gguf/tiny-model.ts): llama-server's chat parser
// refuses replies that are not valid UTF-8, which a random model's byte tokens produce.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import OpenAI, { type APIError } from "openai";
import { findFreePort } from "../src/agent/free-port.ts";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { writeTinyProjector } from "../src/gguf/tiny-projector.ts";
import { writeTinyLora } from "../src/gguf/tiny-lora.ts";
import { adminCaller } from "./support/admin-call.ts";
import { spawnLlmgw, stopAll, type LlmgwProcess } from "./support/cluster-processes.ts";
import { eventually } from "./support/eventually.ts";
import { realLlamaServer } from "./support/real-llama-server.ts";
import { fakeCommitSha, startStandInHub, type StandInFile, type StandInHub } from "./support/stand-in-hub.ts";
import { BLACK, WHITE, encodeTinyPng, pngDataUrl } from "./support/tiny-png.ts";
import { writeUnloadableGguf } from "./support/unloadable-gguf.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);
const REPO = "llmgw-test/tiny-text-GGUF";
const FILE = "tiny-text-F32.gguf";
const PROJECTOR = "mmproj-tiny-F32.gguf";

interface ReplicaView {
  id: string;
  state: string;
  engine: string;
  endpoint: string | null;
  attempt: number;
  failures: number;
  last_error: string | null;
}
interface HealthView {
  state: string;
  parked: { reason: string } | null;
  replicas: ReplicaView[];
}

/** The llama-server processes running now whose `--alias` is `model`: pid and arguments. */
async function llamaServerProcesses(binary: string, model: string): Promise<{ pid: number; args: string }[]> {
  const { stdout } = await run("ps", ["-eo", "pid=,args="]);
  return stdout
    .split("\n")
    .map((line) => /^\s*(\d+)\s+(.*)$/.exec(line))
    .filter((match): match is RegExpExecArray => match !== null && match[2]!.startsWith(binary) && match[2]!.includes(` --alias ${model} `))
    .map((match) => ({ pid: Number(match[1]), args: match[2]! }));
}

describe("the real llama-server under an agent", { timeout: 900_000 }, () => {
  // Short: engine run folders go below it.
  const root = mkdtempSync(path.join(tmpdir(), "lsv"));
  const serverDir = path.join(root, "server");
  const running: LlmgwProcess[] = [];
  let llamaServer = "";
  let hub: StandInHub;
  let repoFiles: StandInFile[] = [];
  let url = "";
  let adminKey = "";
  let client: OpenAI;
  const admin = adminCaller(() => ({ url, key: adminKey }));
  const health = async (model: string): Promise<HealthView> => (await admin("GET", `/api/v1/models/${model}/health`)).body;
  const ctl = (args: string[]) =>
    run(process.execPath, [BIN, "ctl", "--server", url, "--key", adminKey, ...args], {
      env: { ...process.env, LLMGW_LOG_LEVEL: "silent" },
      timeout: 300_000,
    });
  const readyReplica = (model: string) =>
    eventually(
      `a ready replica of ${model}`,
      async () => {
        const view = await health(model);
        return view.replicas.find((replica) => replica.state === "ready");
      },
      { timeoutMs: 240_000 },
    );

  before(async () => {
    // First, so a machine without the build fails here with the sentence that says how to make it.
    llamaServer = await realLlamaServer();
    const weights = path.join(root, FILE);
    // Seeds where no image, a black one and a white one give three different greedy answers (checked once; greedy is deterministic).
    await writeTinyLlamaGguf({ path: weights, seed: 7, textOnly: true });
    const projector = path.join(root, PROJECTOR);
    await writeTinyProjector({ path: projector, textEmbeddingLength: 64, seed: 1 });
    repoFiles = [
      { path: ".gitattributes", content: Buffer.from("*.gguf filter=lfs diff=lfs merge=lfs -text\n") },
      { path: "README.md", content: Buffer.from("# tiny-text\n\nA tiny llama that writes only text, for llmgw tests.\n") },
      { path: FILE, content: await readFile(weights) },
      { path: PROJECTOR, content: await readFile(projector) },
    ];
    hub = await startStandInHub({ repos: [{ name: REPO, files: repoFiles }] });
    const port = await findFreePort("127.0.0.1");
    url = `http://127.0.0.1:${port}`;
    const server = spawnLlmgw(["server", "--data-dir", serverDir, "--listen", `127.0.0.1:${port}`, "--registry", hub.url, "--heartbeat-interval", "1s"]);
    running.push(server);
    await eventually("the server to listen", () => server.output().includes("listening on"), { timeoutMs: 120_000 });
    adminKey = readFileSync(path.join(serverDir, "admin.key"), "utf8").trim();
    client = new OpenAI({ baseURL: `${url}/v1`, apiKey: adminKey, maxRetries: 0 });

    const agentDir = path.join(root, "agent");
    mkdirSync(agentDir, { recursive: true });
    const joinToken = readFileSync(path.join(serverDir, "join.token"), "utf8").trim();
    // `auto`: the build in the default cache, found the way an operator's agent finds it.
    const agent = spawnLlmgw(
      ["agent", "--server", url, "--join-token", joinToken, "--name", "ls-node", "--data-dir", agentDir, "--llama-server", "auto"],
      // Short backoff and parking after 3 failures, so the parking test takes seconds.
      { LLMGW_AGENT_TIMINGS: JSON.stringify({ backoffMs: [100, 400], parkAfter: [3, 600_000] }) },
    );
    running.push(agent);
    const node = await eventually(
      "the node to be ready",
      async () => {
        if (agent.child.exitCode !== null) throw new Error(`the agent exited (${agent.child.exitCode}):\n${agent.output()}`);
        const nodes = (await admin("GET", "/api/v1/nodes")).body.data as Array<{
          name: string;
          state: string;
          engines: Array<{ engine: string; version: string }>;
        }>;
        return nodes.find((n) => n.name === "ls-node" && n.state === "ready");
      },
      { timeoutMs: 120_000 },
    );
    // The node reports the built llama-server with the version line it prints.
    const reported = node.engines.find((engine) => engine.engine === "llama-server");
    assert.match(reported?.version ?? "", /^0\.4\.0-dev \(build 1, commit [0-9a-f]{7}\)$/, JSON.stringify(node.engines));
  });

  after(async () => {
    await stopAll(running);
    await hub?.close();
    rmSync(root, { recursive: true, force: true });
  });

  test("a serve job places the model on llama-server and passes its smoke test", async () => {
    const { stdout } = await ctl(["model", "serve", REPO, "--file", FILE, "--name", "tiny", "--cpu", "--ctx-pool", "2048", "--context", "1024", "--json"]);
    const job = JSON.parse(stdout) as {
      state: string;
      result: { reply: string; tokens_per_second: number | null } | null;
      steps: Array<{ name: string; state: string }>;
    };
    assert.equal(job.state, "done", stdout);
    assert.deepEqual(
      job.steps.map((step) => `${step.name}:${step.state}`),
      ["registry:done", "mirror:done", "check:done", "catalog:done", "placement:done", "smoke_test:done"],
    );
    assert.ok((job.result?.reply ?? "").length > 0, `the smoke test's reply: ${stdout}`);
    await readyReplica("tiny");
    const [process_] = await llamaServerProcesses(llamaServer, "tiny");
    assert.ok(process_ !== undefined, "a llama-server process serves tiny");
    // The launch the adapter builds: the mirrored weights, CPU only, the slots llmgw set.
    assert.match(process_.args, /-m \S+tiny-text-F32\.gguf .*--parallel \d+ -ngl 0 -fa on/);
  });

  test("chat (whole and streamed) and completions answer through the gateway, with usage", async () => {
    await readyReplica("tiny");
    const whole = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Say hello" }], max_tokens: 12, temperature: 0 });
    assert.equal(whole.model, "tiny");
    assert.ok((whole.choices[0]?.message.content ?? "").length > 0);
    assert.ok(["stop", "length"].includes(whole.choices[0]?.finish_reason ?? ""));
    assert.ok((whole.usage?.completion_tokens ?? 0) > 0 && (whole.usage?.prompt_tokens ?? 0) > 0, JSON.stringify(whole.usage));

    const stream = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Say hello" }],
      max_tokens: 12,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let streamed = "";
    let finish: string | null = null;
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      streamed += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    // Greedy both times: the stream is the same answer, piece by piece.
    assert.equal(streamed, whole.choices[0]?.message.content);
    assert.ok(finish !== null);
    assert.equal(usage?.completion_tokens, whole.usage?.completion_tokens);

    const completion = await client.completions.create({ model: "tiny", prompt: "hello world", max_tokens: 6, temperature: 0 });
    assert.ok((completion.choices[0]?.text ?? "").length > 0);
    assert.ok((completion.usage?.completion_tokens ?? 0) > 0);
  });

  test("llama-server itself refuses requests without the replica's engine key", async () => {
    const replica = await readyReplica("tiny");
    assert.ok(replica.endpoint !== null);
    // /health is public in llama-server (reference/engines.md); the rest needs the key.
    assert.equal((await fetch(`${replica.endpoint}/health`)).status, 200);
    for (const route of ["/v1/models", "/props"]) {
      assert.equal((await fetch(`${replica.endpoint}${route}`)).status, 401, `${route} without a key`);
      assert.equal((await fetch(`${replica.endpoint}${route}`, { headers: { authorization: "Bearer not-the-key" } })).status, 401, `${route} with a wrong key`);
    }
    const chat = await fetch(`${replica.endpoint}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 2 }),
    });
    assert.equal(chat.status, 401);
  });

  test("embeddings from a llama-server replica started with --embedding", async () => {
    const weights = path.join(root, "embed.gguf");
    await writeTinyLlamaGguf({ path: weights, seed: 22 });
    const definition = path.join(root, "embed.json");
    writeFileSync(
      definition,
      JSON.stringify({
        name: "embed",
        capabilities: { vision: false, embeddings: true },
        source: { kind: "file", path: weights },
        profiles: [{ name: "cpu", engine: "llamacpp", embeddings: true, ctx_size: 1024, parallel: 1, hardware: {} }],
      }),
    );
    await ctl(["model", "add", "embed", "--definition", definition]);
    await readyReplica("embed");
    const [embedProcess] = await llamaServerProcesses(llamaServer, "embed");
    assert.match(embedProcess?.args ?? "", / --embedding /);
    const answer = await client.embeddings.create({ model: "embed", input: ["hello world", "good day"] });
    assert.equal(answer.data.length, 2);
    for (const item of answer.data) {
      assert.equal(item.embedding.length, 64, "the tiny model's embedding size");
      assert.ok(item.embedding.every(Number.isFinite));
    }
    assert.notDeepEqual(answer.data[0]?.embedding, answer.data[1]?.embedding);
    assert.ok((answer.usage?.prompt_tokens ?? 0) > 0);
  });

  test("kill -9 of llama-server: the replica is restarted and answers again", async () => {
    const before = await readyReplica("tiny");
    const [victim] = await llamaServerProcesses(llamaServer, "tiny");
    assert.ok(victim !== undefined);
    process.kill(victim.pid, "SIGKILL");
    const restarted = await eventually(
      "tiny restarted on a new llama-server",
      async () => {
        const [now] = await llamaServerProcesses(llamaServer, "tiny");
        const view = await health("tiny");
        const replica = view.replicas.find((r) => r.state === "ready");
        return now !== undefined && now.pid !== victim.pid && replica !== undefined && replica.failures > before.failures ? replica : undefined;
      },
      { timeoutMs: 240_000 },
    );
    assert.ok(restarted.failures >= 1);
    assert.match(restarted.last_error ?? "", /signal SIGKILL|exited|killed/i);
    const answer = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "again" }], max_tokens: 4 });
    assert.ok((answer.choices[0]?.message.content ?? "").length > 0);
  });

  test("a model llama-server cannot load is parked after its tries, with llama.cpp's own words", async () => {
    const weights = path.join(root, "broken.gguf");
    await writeUnloadableGguf({ path: weights, seed: 23 });
    await ctl(["model", "add", "broken", "--gguf", weights, "--ctx-size", "1024", "--parallel", "1"]);
    const parked = await eventually("broken parked", async () => ((await health("broken")).state === "parked" ? health("broken") : undefined), {
      timeoutMs: 240_000,
    });
    assert.equal(parked.replicas[0]?.failures, 3);
    assert.match(parked.parked?.reason ?? "", /Parked after 3 failures/);
    // llama-server's own complaint about the file, from its log.
    assert.match(parked.parked?.reason ?? "", /no-such-tokenizer|failed to load model|unknown tokenizer/i);
    assert.deepEqual(await llamaServerProcesses(llamaServer, "broken"), [], "no llama-server is left running for it");
  });

  test("vision: served with its projector, an image part reaches llama-server (--mmproj) and changes the answer", async () => {
    const { stdout } = await ctl([
      "model",
      "serve",
      REPO,
      "--file",
      FILE,
      "--projector",
      PROJECTOR,
      "--name",
      "eye",
      "--cpu",
      "--ctx-pool",
      "2048",
      "--context",
      "1024",
      "--json",
    ]);
    const job = JSON.parse(stdout) as { state: string; steps: Array<{ name: string; detail: string }> };
    assert.equal(job.state, "done", stdout);
    assert.match(job.steps.find((step) => step.name === "registry")?.detail ?? "", /with the vision projector mmproj-tiny-F32\.gguf, so it takes images/);
    const model = (await admin("GET", "/api/v1/models/eye")).body as { capabilities: { vision: boolean }; source: { projector?: string } };
    assert.equal(model.capabilities.vision, true);
    assert.equal(model.source.projector, PROJECTOR);
    await readyReplica("eye");
    const [eyeProcess] = await llamaServerProcesses(llamaServer, "eye");
    assert.match(eyeProcess?.args ?? "", /--mmproj \S+mmproj-tiny-F32\.gguf/, "llama-server loads the mirrored, verified projector");

    const ask = async (image?: Buffer) => {
      const content: OpenAI.ChatCompletionContentPart[] = [{ type: "text", text: "What is in this picture?" }];
      if (image !== undefined) content.push({ type: "image_url", image_url: { url: pngDataUrl(image) } });
      const answer = await client.chat.completions.create({ model: "eye", messages: [{ role: "user", content }], max_tokens: 8, temperature: 0 });
      return { text: answer.choices[0]?.message.content ?? "", promptTokens: answer.usage?.prompt_tokens ?? 0 };
    };
    const black = encodeTinyPng({ width: 32, height: 32, color: BLACK });
    const white = encodeTinyPng({ width: 32, height: 32, color: WHITE });
    const none = await ask();
    const onBlack = await ask(black);
    const onWhite = await ask(white);
    // The image becomes tokens of the prompt, and its pixels decide the answer.
    assert.ok(onBlack.promptTokens > none.promptTokens, `${onBlack.promptTokens} prompt tokens with an image, ${none.promptTokens} without`);
    assert.notEqual(onBlack.text, none.text);
    assert.notEqual(onBlack.text, onWhite.text);
    assert.equal((await ask(black)).text, onBlack.text, "the same image gives the same greedy answer");

    // A new revision of the repository: the update moves the model to it with its projector.
    const before = (await admin("GET", "/api/v1/models/eye")).body as { source: { version: string } };
    hub.putRepo({ name: REPO, revisions: { main: fakeCommitSha(`${REPO}@v2`) }, files: [...repoFiles, { path: "NOTES.md", content: Buffer.from("v2\n") }] });
    const { stdout: updated } = await ctl(["model", "update", "eye", "--json"]);
    assert.equal((JSON.parse(updated) as { state: string }).state, "done", updated);
    const after = (await admin("GET", "/api/v1/models/eye")).body as { source: { version: string; projector?: string } };
    assert.notEqual(after.source.version, before.source.version);
    assert.equal(after.source.projector, PROJECTOR, "the update keeps the vision projector");
    await readyReplica("eye");
    assert.equal((await ask(black)).text, onBlack.text, "images still reach the new revision's llama-server");

    // The model without a projector refuses image parts at the gateway, before any engine.
    await assert.rejects(
      client.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: pngDataUrl(black) } }] }],
        max_tokens: 2,
      }),
      (error: APIError) => error.status === 400 && error.code === "model_has_no_vision",
    );
  });

  test("LoRA adapters: tiny:style on tiny's replicas, chosen per request; a misfit refused at the door; a changed file refused before start", async () => {
    const adapterPath = path.join(root, "style.gguf");
    await writeTinyLora({ path: adapterPath, seed: 105 });
    const wide = path.join(root, "wide.gguf");
    await writeTinyLora({ path: wide, seed: 106, embeddingLength: 128 });
    const misfit = await admin("PATCH", "/api/v1/models/tiny", { adapters: [{ name: "wide", source: { kind: "file", path: wide } }] });
    assert.equal(misfit.status, 400, JSON.stringify(misfit.body));
    assert.equal(misfit.body.error.code, "adapter_mismatch");
    assert.match(misfit.body.error.message, /embedding size 128 .*the model's is 64/);

    const { stdout: shown } = await ctl([
      "model",
      "edit",
      "tiny",
      "--patch",
      JSON.stringify({ adapters: [{ name: "style", source: { kind: "file", path: adapterPath } }] }),
    ]);
    assert.match(shown, /tiny/);
    // The definition changed: the replica is replaced by one whose llama-server loads the adapter, off by default.
    const withAdapter = await eventually(
      "tiny on a llama-server with the adapter",
      async () => {
        const [running] = await llamaServerProcesses(llamaServer, "tiny");
        const ready = (await health("tiny")).replicas.find((replica) => replica.state === "ready");
        return running?.args.includes(`--lora-scaled ${adapterPath}:0`) && ready !== undefined ? running : undefined;
      },
      { timeoutMs: 240_000 },
    );
    const listed = await client.models.list();
    assert.ok(
      listed.data.some((m) => m.id === "tiny:style"),
      "GET /v1/models lists the adapter",
    );
    const greedy = async (model: string) =>
      (await client.completions.create({ model, prompt: "hello world", max_tokens: 8, temperature: 0 })).choices[0]?.text ?? "";
    const base = await greedy("tiny");
    const styled = await greedy("tiny:style");
    assert.notEqual(styled, base, "the adapter changes the greedy answer");
    assert.equal(await greedy("tiny"), base, "a request without the adapter is the base model, on the same replica");
    assert.equal(await greedy("tiny:style"), styled);
    const { stdout: show } = await ctl(["model", "show", "tiny"]);
    assert.match(show, /tiny:style\s+style\s+1\s+\S*style\.gguf/);

    // The file changes under the node (same size, other bytes): the next start is refused before llama-server runs.
    const size = (await readFile(adapterPath)).length;
    await writeTinyLora({ path: adapterPath, seed: 107 });
    assert.equal((await readFile(adapterPath)).length, size);
    process.kill(withAdapter.pid, "SIGKILL");
    const refused = await eventually(
      "the restart refused for the changed adapter",
      async () => (await health("tiny")).replicas.find((replica) => /sha256/.test(replica.last_error ?? "")),
      { timeoutMs: 240_000 },
    );
    assert.match(refused.last_error ?? "", /style\.gguf/);
    assert.deepEqual(await llamaServerProcesses(llamaServer, "tiny"), [], "no llama-server runs on the changed file");
    // Put back, it starts again.
    await writeTinyLora({ path: adapterPath, seed: 105 });
    await readyReplica("tiny");
    assert.equal(await greedy("tiny:style"), styled);
  });
});
