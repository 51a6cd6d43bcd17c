// LoRA adapters on both llama.cpp engines, end to end: `llmgw engine --lora ADAPTER` as a
// process and the REAL llama-server (test/support/real-llama-server.ts; provisioning builds
// it once) started with `--lora-scaled ADAPTER:0`, the contract the gateway relies on. Both
// serve the same generated base model (`textOnly`: llama-server refuses to return text that
// is not valid UTF-8) and the same two generated adapters (ids 0 and 1, by position); greedy
// completions of 8 tokens must be the same on both engines for the base and for base +
// adapters (one at two scales, the other, both at once), and an adapter's tokens must differ
// from the base's on each engine.
//
// Facts this test is built on (llama.cpp at 80fb11ac, node-llama-cpp 3.21.1):
// - The prompt is token ids, taken from llama-server's /tokenize. A string prompt does not
//   tokenise alike: llama-server adds SentencePiece's space prefix ("hello" becomes
//   "▁hello"), node-llama-cpp's LlamaCompletion trims it. With ids, the bundled engine
//   prepends BOS itself (as LlamaCompletion does) and llama-server takes them as given, so
//   llama-server gets the BOS in front.
// - The bundled engine's text starts without the space of a first "▁" token (node-llama-cpp
//   detokenises the reply without the prompt before it), where llama-server keeps it, so
//   texts are compared after that one leading space.
// - llama-server is sent `cache_prompt: false`: at this commit a request without `lora`
//   that follows one with an adapter on the same slot reuses the prompt prefix the adapter
//   evaluated (the slot's cache is cleared only when a request's own list differs from the
//   slot's), and answers with the adapter's influence. Recomputing the prompt each time
//   keeps the comparison about the adapters, not llama-server's cache.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import OpenAI from "openai";
import { findFreePort } from "../src/agent/free-port.ts";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";
import { writeTinyLora } from "../src/gguf/tiny-lora.ts";
import { startEngine, waitForReady, type EngineProcess } from "./support/engine-process.ts";
import { realLlamaServer } from "./support/real-llama-server.ts";

const KEY = "lora-engines-key";
const MAX_TOKENS = 8;

interface Greedy {
  text: string;
  completionTokens: number;
}

describe("LoRA adapters: the bundled engine and the real llama-server give the same greedy tokens", { timeout: 300_000 }, () => {
  const root = mkdtempSync(path.join(tmpdir(), "llmgw-lora-"));
  let bundled: EngineProcess;
  let llamaServer: ChildProcess | undefined;
  let llamaServerUrl = "";
  let llamaServerLog = "";
  let bundledClient: OpenAI;
  let serverClient: OpenAI;
  /** The prompt's token ids without BOS, and the BOS id, as llama-server tokenises "hello world". */
  let prompt: number[] = [];
  let bos = 0;

  before(async () => {
    // First, so a machine without the build fails here with the sentence that says how to make it.
    const binary = await realLlamaServer();
    const base = (await writeTinyLlamaGguf({ path: path.join(root, "base.gguf"), seed: 7, textOnly: true })).path;
    const adapter = (await writeTinyLora({ path: path.join(root, "adapter.gguf"), seed: 1 })).path;
    const second = (await writeTinyLora({ path: path.join(root, "second.gguf"), seed: 2 })).path;

    bundled = await startEngine({
      args: [
        "--model",
        base,
        "--key",
        KEY,
        "--threads",
        "1",
        "--parallel",
        "1",
        "--ctx-size",
        "512",
        "--model-name",
        "tiny",
        "--lora",
        adapter,
        "--lora",
        second,
      ],
    });
    await waitForReady(bundled);
    bundledClient = new OpenAI({ baseURL: `${bundled.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60_000 });

    const port = await findFreePort("127.0.0.1");
    llamaServerUrl = `http://127.0.0.1:${port}`;
    const child = spawn(
      binary,
      ["-m", base, "--lora-scaled", `${adapter}:0,${second}:0`, "--host", "127.0.0.1", "--port", String(port), "-c", "512", "-np", "1", "-t", "1"],
      // The key through the environment, as the agent gives it (llama-server reads LLAMA_API_KEY).
      { env: { ...process.env, LLAMA_API_KEY: KEY }, stdio: ["ignore", "pipe", "pipe"] },
    );
    llamaServer = child;
    const keep = (chunk: Buffer) => {
      llamaServerLog = (llamaServerLog + chunk.toString("utf8")).slice(-20_000);
    };
    child.stdout?.on("data", keep);
    child.stderr?.on("data", keep);
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    await waitForReady({ url: llamaServerUrl, stderr: () => llamaServerLog, exited });
    serverClient = new OpenAI({ baseURL: `${llamaServerUrl}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60_000 });

    const tokenize = async (addSpecial: boolean): Promise<number[]> => {
      const response = await fetch(`${llamaServerUrl}/tokenize`, {
        method: "POST",
        headers: { "content-type": "application/json", authorization: `Bearer ${KEY}` },
        body: JSON.stringify({ content: "hello world", add_special: addSpecial }),
      });
      assert.equal(response.status, 200, await response.clone().text());
      return ((await response.json()) as { tokens: number[] }).tokens;
    };
    prompt = await tokenize(false);
    const withBos = await tokenize(true);
    assert.equal(withBos.length, prompt.length + 1, `the tiny vocabulary adds BOS: ${JSON.stringify(withBos)}`);
    bos = withBos[0] as number;
  });

  after(async () => {
    await bundled?.kill();
    if (llamaServer && llamaServer.exitCode === null && llamaServer.signalCode === null) {
      const gone = new Promise<void>((resolve) => llamaServer?.once("exit", () => resolve()));
      llamaServer.kill("SIGKILL");
      await gone;
    }
    rmSync(root, { recursive: true, force: true });
  });

  const ask = async (engine: "bundled" | "llama-server", lora?: { id: number; scale: number }[]): Promise<Greedy> => {
    const body =
      engine === "bundled"
        ? { model: "tiny", prompt, max_tokens: MAX_TOKENS, temperature: 0, ...(lora ? { lora } : {}) }
        : { model: "tiny", prompt: [bos, ...prompt], max_tokens: MAX_TOKENS, temperature: 0, cache_prompt: false, ...(lora ? { lora } : {}) };
    const client = engine === "bundled" ? bundledClient : serverClient;
    const answer = await client.completions.create(body as never);
    const choice = answer.choices[0];
    assert.ok(choice, `${engine} answered with a choice`);
    return { text: choice.text, completionTokens: answer.usage?.completion_tokens ?? -1 };
  };

  /** llama-server's text without the leading space of a first "▁" token, which the bundled engine does not send. */
  const comparable = (text: string): string => text.replace(/^ /, "");

  test("base, and base + adapters (one, at two scales; the other; both): the same 8 greedy tokens on both engines; adapters change them", async () => {
    const cases: Array<{ name: string; lora?: { id: number; scale: number }[] }> = [
      { name: "base (no lora)" },
      { name: "adapter 0 at scale 1", lora: [{ id: 0, scale: 1 }] },
      { name: "adapter 0 at scale 0.5", lora: [{ id: 0, scale: 0.5 }] },
      { name: "adapter 1 at scale 1", lora: [{ id: 1, scale: 1 }] },
      {
        name: "adapters 1 and 0 at once",
        lora: [
          { id: 1, scale: 1 },
          { id: 0, scale: 0.5 },
        ],
      },
      // After the adapter: still the base on both (each engine's own cache handling).
      { name: "base again (lora [])", lora: [] },
      { name: "base (adapter 0 listed at scale 0)", lora: [{ id: 0, scale: 0 }] },
    ];
    const seen = new Map<string, { bundled: Greedy; server: Greedy }>();
    for (const { name, lora } of cases) {
      const onBundled = await ask("bundled", lora);
      const onServer = await ask("llama-server", lora);
      assert.equal(onBundled.completionTokens, MAX_TOKENS, `${name}: bundled engine tokens`);
      assert.equal(onServer.completionTokens, MAX_TOKENS, `${name}: llama-server tokens`);
      assert.equal(
        onBundled.text,
        comparable(onServer.text),
        `${name}: bundled ${JSON.stringify(onBundled.text)}, llama-server ${JSON.stringify(onServer.text)}`,
      );
      seen.set(name, { bundled: onBundled, server: onServer });
    }
    const base = seen.get("base (no lora)");
    const adapted = seen.get("adapter 0 at scale 1");
    const half = seen.get("adapter 0 at scale 0.5");
    const other = seen.get("adapter 1 at scale 1");
    const both = seen.get("adapters 1 and 0 at once");
    assert.ok(base && adapted && half && other && both);
    for (const engine of ["bundled", "server"] as const) {
      assert.notEqual(adapted[engine].text, base[engine].text, `${engine}: the adapter changes the greedy tokens`);
      assert.notEqual(half[engine].text, adapted[engine].text, `${engine}: the scale matters`);
      assert.notEqual(other[engine].text, adapted[engine].text, `${engine}: id 1 is the second adapter`);
      assert.notEqual(both[engine].text, other[engine].text, `${engine}: both adapters apply at once`);
      assert.equal(seen.get("base again (lora [])")?.[engine].text, base[engine].text, `${engine}: lora [] is the base`);
      assert.equal(seen.get("base (adapter 0 listed at scale 0)")?.[engine].text, base[engine].text, `${engine}: scale 0 is the base`);
    }
  });
});
