// The engine as a process the agent supervises: readiness on /health, the key from the
// environment, cancellation of abandoned streams, SIGTERM, and the failures the
// supervisor must be able to record (exit code and one stderr line naming the file).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../../gguf/tiny-model.ts";
import { writeTinyLora } from "../../gguf/tiny-lora.ts";
import { LlmgwError } from "../../core/errors.ts";
import { ENGINE_EXIT, parseEngineOptions } from "./engine-command.ts";
import { openAiModelsValidator } from "../openai-models-validator.ts";
import { freePort, startEngine, startEngineUnderAgent, waitForReady, type EngineProcess } from "../../../test/support/engine-process.ts";

const KEY = "key-from-the-environment";
// A long context so an abandoned generation would run for a long time if it were not stopped.
const CONTEXT = 32768;

let dir: string;
let modelPath: string;
let engine: EngineProcess;
let client: OpenAI;
const others: Array<{ kill(): Promise<void> }> = [];

const withDeadline = <T>(promise: Promise<T>, ms: number, what: string): Promise<T> =>
  Promise.race([promise, new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`${what} did not happen within ${ms} ms`)), ms).unref())]);

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-engine-cmd-"));
  // Endless: greedy decoding never picks an end token, so only an abort stops a generation.
  modelPath = (await writeTinyLlamaGguf({ path: join(dir, "long.gguf"), seed: 5, contextLength: CONTEXT, endless: true })).path;
});

after(async () => {
  await engine?.kill();
  for (const other of others) await other.kill();
  await rm(dir, { recursive: true, force: true });
});

async function expectStartFailure(args: string[], env: Record<string, string> = {}) {
  const failed = await startEngine({ args, env });
  others.push(failed);
  const exit = await withDeadline(failed.exited, 60_000, "exit of the failing engine");
  return { exit, stderr: failed.stderr() };
}

test("health answers 503 'Loading model' while loading, then 200; the key comes from LLMGW_ENGINE_KEY", async () => {
  engine = await startEngine({
    args: ["--model", modelPath, "--threads", "1", "--parallel", "1", "--ctx-size", String(CONTEXT)],
    env: { LLMGW_ENGINE_KEY: KEY },
  });
  const health = await waitForReady(engine);
  const answered = health.statuses.filter((s) => s !== 0);
  assert.deepEqual(answered, [503, 200], `statuses seen: ${health.statuses.join(", ")}`);
  assert.deepEqual(JSON.parse(health.bodies.get(503) ?? "null"), { error: { code: 503, message: "Loading model", type: "unavailable_error" } });
  assert.deepEqual(JSON.parse(health.bodies.get(200) ?? "null"), { status: "ok" });

  client = new OpenAI({ baseURL: `${engine.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 30_000 });
  const models = await client.models.list();
  assert.deepEqual(
    models.data.map((m) => m.id),
    ["long.gguf"],
    "without --model-name the model is named after the file",
  );
});

test("openAiModelsValidator accepts this engine with its key and model, and says what is wrong otherwise", async () => {
  const context = { host: "127.0.0.1", port: engine.port, signal: new AbortController().signal };
  await openAiModelsValidator({ key: KEY, expectedModel: "long.gguf" })(context);
  await assert.rejects(openAiModelsValidator({ key: "a-stale-engine-key", expectedModel: "long.gguf" })(context), (error: unknown) => {
    assert.ok(error instanceof LlmgwError);
    assert.equal(error.code, "validation_failed");
    assert.match(error.message, new RegExp(`GET http://127\\.0\\.0\\.1:${engine.port}/v1/models refused this attempt's engine key \\(HTTP 401\\)`));
    assert.ok(!error.message.includes("a-stale-engine-key"), "the key is never printed");
    return true;
  });
  await assert.rejects(openAiModelsValidator({ key: KEY, expectedModel: "tiny-chat" })(context), /lists 'long\.gguf', not the expected 'tiny-chat'/);
});

test("a client that abandons a stream frees the only sequence for the next request", async () => {
  const controller = new AbortController();
  const stream = await client.chat.completions.create(
    { model: "long", messages: [{ role: "user", content: "hello" }], max_tokens: CONTEXT - 100, temperature: 0, stream: true },
    { signal: controller.signal },
  );
  let contentChunks = 0;
  let finished = false;
  // Aborting ends the SDK's stream iteration quietly and closes the connection.
  for await (const chunk of stream) {
    if (chunk.choices[0]?.finish_reason) finished = true;
    if (chunk.choices[0]?.delta.content) contentChunks += 1;
    if (contentChunks === 3) {
      controller.abort();
      // Chunks that arrived in the same read are still queued in the SDK; stop reading them.
      break;
    }
  }
  assert.equal(contentChunks, 3);
  assert.equal(finished, false);

  // With --parallel 1 this waits for the sequence, which the abandoned generation (tens
  // of thousands of tokens) would hold far longer than the deadline.
  const next = await withDeadline(
    client.chat.completions.create({ model: "long", messages: [{ role: "user", content: "hi" }], max_tokens: 4, temperature: 0 }),
    15_000,
    "the request after the abandoned stream",
  );
  assert.equal(next.choices[0]?.finish_reason, "length");
  assert.equal(next.usage?.completion_tokens, 4);
});

test("SIGTERM aborts the running generation, tells its client, and exits 0", async () => {
  const stream = await client.chat.completions.create({
    model: "long",
    messages: [{ role: "user", content: "hello" }],
    max_tokens: CONTEXT - 100,
    temperature: 0,
    stream: true,
  });
  let contentChunks = 0;
  const reading = (async () => {
    for await (const chunk of stream) {
      if (chunk.choices[0]?.delta.content) contentChunks += 1;
      if (contentChunks === 3) engine.child.kill("SIGTERM");
    }
  })();
  // The stream ends with the engine's error event, not a dropped connection: the
  // generation was aborted by the shutdown rather than cut off after the grace period.
  // (APIConnectionError is an APIError too: a reset would surface as one.)
  await assert.rejects(
    reading,
    (error: unknown) => error instanceof OpenAI.APIError && !(error instanceof OpenAI.APIConnectionError) && /shutting down/.test(error.message),
  );
  const exit = await withDeadline(engine.exited, 10_000, "engine exit after SIGTERM");
  assert.deepEqual(exit, { code: 0, signal: null });
});

test("SIGTERM mid-stream: the raw SSE bytes end with the one failure event and hold no [DONE]", async () => {
  const stopping = await startEngine({ args: ["--model", modelPath, "--key", KEY, "--threads", "1", "--parallel", "1", "--ctx-size", "4096"] });
  others.push(stopping);
  await waitForReady(stopping);
  const response = await fetch(`${stopping.url}/v1/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ prompt: "hello", max_tokens: 4000, temperature: 0, stream: true }),
  });
  assert.equal(response.status, 200);
  assert.ok(response.body);
  const decoder = new TextDecoder();
  let raw = "";
  let signalled = false;
  // Read to the end: the loop finishes only when the engine ends the body.
  for await (const bytes of response.body) {
    raw += decoder.decode(bytes, { stream: true });
    if (!signalled && (raw.match(/"text":"[^"]/g) ?? []).length >= 3) {
      signalled = true;
      stopping.child.kill("SIGTERM");
    }
  }
  assert.ok(signalled, `the stream had text before it ended: ${raw}`);
  const events = raw.split("\n\n").filter((event) => event !== "");
  const last = events.at(-1) ?? "";
  assert.match(last, /^data: \{"error":/);
  const failure = JSON.parse(last.slice("data: ".length)) as { error: { type: string; code: string; message: string } };
  assert.equal(failure.error.type, "server_error");
  assert.match(failure.error.message, /shutting down/);
  assert.ok(!raw.includes("[DONE]"), "no [DONE] anywhere in a stream that failed");
  assert.ok(
    events.slice(0, -1).every((event) => event.startsWith('data: {"id":"cmpl-')),
    "only completion chunks before the failure event",
  );
  assert.deepEqual(await withDeadline(stopping.exited, 10_000, "engine exit after SIGTERM"), { code: 0, signal: null });
});

test("a missing model file: exit code 1 and one stderr line naming the file", async () => {
  const missing = join(dir, "no-such-model.gguf");
  const { exit, stderr } = await expectStartFailure(["--model", missing, "--key", "k"]);
  assert.equal(exit.code, 1);
  const lines = stderr.trim().split("\n");
  assert.equal(lines.length, 1, stderr);
  assert.match(lines[0] ?? "", new RegExp(`'${missing.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}': no such file`));
});

test("a file that is not GGUF, or a truncated GGUF, is refused with the reason", async () => {
  const text = join(dir, "notes.gguf");
  await writeFile(text, "this is not a model\n");
  const notGguf = await expectStartFailure(["--model", text, "--key", "k"]);
  assert.equal(notGguf.exit.code, 1);
  assert.match(notGguf.stderr, /notes\.gguf': not a GGUF file/);

  // Right magic, cut off in the middle of the tensor data: only llama.cpp notices.
  const truncated = join(dir, "truncated.gguf");
  const whole = await readFile(modelPath);
  await writeFile(truncated, whole.subarray(0, whole.length - 4096));
  const broken = await expectStartFailure(["--model", truncated, "--key", "k", "--threads", "1"]);
  assert.equal(broken.exit.code, 1);
  assert.match(broken.stderr, /llmgw engine: cannot serve model file '.*truncated\.gguf': llama\.cpp could not load it: .*(corrupted|incomplete|bounds)/);
});

test("a LoRA adapter that is missing or that llama.cpp refuses: exit code 1 and one stderr line naming the adapter", async () => {
  const literal = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
  const good = (await writeTinyLora({ path: join(dir, "good-lora.gguf") })).path;
  const missing = join(dir, "no-such-lora.gguf");
  const absent = await expectStartFailure(["--model", modelPath, "--key", "k", "--lora", good, "--lora", missing]);
  assert.equal(absent.exit.code, 1);
  assert.equal(absent.stderr.trim().split("\n").length, 1, absent.stderr);
  assert.match(absent.stderr, new RegExp(`^llmgw engine: cannot load LoRA adapter '${literal(missing)}': no such file`));

  // Made for another architecture: only llama.cpp's loader notices, after the model loaded.
  const otherArch = (await writeTinyLora({ path: join(dir, "qwen-lora.gguf"), architecture: "qwen2" })).path;
  const refused = await expectStartFailure(["--model", modelPath, "--key", "k", "--threads", "1", "--ctx-size", "512", "--lora", good, "--lora", otherArch]);
  assert.equal(refused.exit.code, 1);
  assert.match(
    refused.stderr,
    new RegExp(
      `llmgw engine: cannot load LoRA adapter '${literal(otherArch)}': llama\\.cpp could not load it as a LoRA adapter of this model: model arch and LoRA arch mismatch`,
    ),
  );
});

test("no engine key or a bad flag: exit code 2 before anything is loaded", async () => {
  const noKey = await expectStartFailure(["--model", modelPath], { LLMGW_ENGINE_KEY: "" });
  assert.equal(noKey.exit.code, 2);
  assert.match(noKey.stderr, /LLMGW_ENGINE_KEY/);

  const badParallel = await expectStartFailure(["--model", modelPath, "--key", "k", "--parallel", "0"]);
  assert.equal(badParallel.exit.code, 2);
  assert.match(badParallel.stderr, /--parallel must be an integer/);

  const loraEmbeddings = await expectStartFailure(["--model", modelPath, "--key", "k", "--embeddings", "--lora", modelPath]);
  assert.equal(loraEmbeddings.exit.code, 2);
  assert.match(loraEmbeddings.stderr, /--lora cannot be combined with --embeddings/);

  const badContexts = await expectStartFailure(["--model", modelPath, "--key", "k", "--lora-contexts", "0"]);
  assert.equal(badContexts.exit.code, 2);
  assert.match(badContexts.stderr, /--lora-contexts must be an integer from 1 to 64/);
});

test("a port in use: exit code 3 naming the address", async () => {
  const port = await freePort();
  const blocker = createServer();
  await new Promise<void>((resolve) => blocker.listen(port, "127.0.0.1", resolve));
  try {
    const busy = await startEngine({ args: ["--model", modelPath, "--key", "k"], port });
    others.push(busy);
    const exit = await withDeadline(busy.exited, 30_000, "exit of the engine on a busy port");
    assert.equal(exit.code, 3);
    assert.match(busy.stderr(), new RegExp(`cannot listen on 127\\.0\\.0\\.1:${port}`));
  } finally {
    blocker.close();
  }
});

test("SIGHUP stops the engine cleanly, like SIGTERM", async () => {
  const hup = await startEngine({ args: ["--model", modelPath, "--key", "k", "--threads", "1", "--parallel", "1", "--ctx-size", "512"] });
  others.push(hup);
  await waitForReady(hup);
  hup.child.kill("SIGHUP");
  // Without a handler SIGHUP's default action ends the process: { code: null, signal: "SIGHUP" }.
  assert.deepEqual(await withDeadline(hup.exited, 10_000, "engine exit after SIGHUP"), { code: 0, signal: null });
});

test("an engine whose agent is SIGKILLed notices within seconds and shuts down", async () => {
  const logPath = join(dir, "orphan.log");
  const orphan = await startEngineUnderAgent({
    args: ["--model", modelPath, "--key", "k", "--threads", "1", "--parallel", "1", "--ctx-size", "512"],
    logPath,
  });
  others.push(orphan);
  await waitForReady(orphan);
  // Like an OOM kill: the agent's exit hook never runs, and the engine runs in its own
  // session and process group, so no signal reaches it.
  orphan.agent.kill("SIGKILL");
  await orphan.agentExited;
  await withDeadline(orphan.exited, 10_000, `exit of engine ${orphan.enginePid} after its agent was killed`);
  assert.match(orphan.stderr(), /the agent that started this engine is gone; stopping the engine/);
  assert.match(orphan.stderr(), /"reason":"parent-exited"/);
});

test("--model and --port are required by the engine itself (commander does not check them, so `engine build` needs neither)", () => {
  const usage = (options: Parameters<typeof parseEngineOptions>[0]) =>
    assert.throws(
      () => parseEngineOptions(options, { LLMGW_ENGINE_KEY: "k" }),
      (error: Error & { exitCode?: number }) => {
        assert.equal(error.exitCode, ENGINE_EXIT.usage);
        return true;
      },
    );
  usage({ port: "8000" });
  usage({ model: "/tmp/model.gguf" });
  assert.equal(parseEngineOptions({ model: "/tmp/model.gguf", port: "8000" }, { LLMGW_ENGINE_KEY: "k" }).port, 8000);
});

test("--lora is repeatable, in order, as absolute paths; without it the engine has no adapters", () => {
  const env = { LLMGW_ENGINE_KEY: "k" };
  const settings = parseEngineOptions({ model: "/tmp/model.gguf", port: "8000", lora: ["/tmp/a.gguf", "b.gguf"], loraContexts: "3" }, env);
  assert.deepEqual(settings.adapterPaths, ["/tmp/a.gguf", join(process.cwd(), "b.gguf")]);
  assert.equal(settings.maxAdapterContexts, 3);
  const plain = parseEngineOptions({ model: "/tmp/model.gguf", port: "8000" }, env);
  assert.deepEqual(plain.adapterPaths, []);
  assert.equal(plain.maxAdapterContexts, 2);
});
