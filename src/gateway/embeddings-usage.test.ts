// Embeddings through the gateway to the bundled engine: a real llmgw server in this
// process routes an `external` model to a real `llmgw engine` child process serving a
// generated tiny model (the engine key as the profile's api_key). The official openai
// client asks for base64 and decodes it, so the engine's vectors come through the proxy
// byte for byte; the usage row holds the engine's prompt_tokens, no completion tokens,
// and the cost at the model's input price.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { startEngine, waitForReady, type EngineProcess } from "../../test/support/engine-process.ts";
import { eventually } from "../../test/support/eventually.ts";

const ENGINE_KEY = "engine-key-for-tests";
const PRICES = { input_per_million: 2, output_per_million: 10 };

describe("embeddings through the gateway to the bundled engine", () => {
  let dir: string;
  let engine: EngineProcess;
  let harness: Harness;
  let client: OpenAI;

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "llmgw-gateway-embeddings-"));
    const model = await writeTinyLlamaGguf({ path: join(dir, "tiny.gguf"), seed: 5 });
    engine = await startEngine({
      args: ["--model", model.path, "--key", ENGINE_KEY, "--threads", "1", "--ctx-size", "512", "--parallel", "1", "--model-name", "tiny"],
    });
    await waitForReady(engine);
    harness = await startHarness();
    await harness.addModel({
      name: "embedder",
      prices: PRICES,
      profiles: [{ name: "engine", engine: "external", url: `${engine.url}/v1`, api_key: ENGINE_KEY, upstream_model: "tiny" }],
    });
    client = new OpenAI({ apiKey: await harness.clientKey(), baseURL: `${harness.url}/v1`, maxRetries: 0, timeout: 30_000 });
  });

  after(async () => {
    await harness?.close();
    await engine?.kill();
    await rm(dir, { recursive: true, force: true });
  });

  test("the vectors arrive unit-length and unchanged, and the usage row records the engine's prompt tokens and their cost", async () => {
    const answer = await client.embeddings.create({ model: "embedder", input: ["first text", "second text"] });
    assert.equal(answer.data.length, 2);
    for (const item of answer.data) {
      const norm = Math.sqrt(item.embedding.reduce((sum, value) => sum + value * value, 0));
      assert.ok(Math.abs(norm - 1) < 1e-5, `norm ${norm}`);
    }
    const direct = await new OpenAI({ apiKey: ENGINE_KEY, baseURL: `${engine.url}/v1`, maxRetries: 0 }).embeddings.create({
      model: "tiny",
      input: ["first text", "second text"],
    });
    assert.deepEqual(answer.data, direct.data, "the gateway passes the engine's vectors through unchanged");
    assert.ok(answer.usage.prompt_tokens > 2);

    const row = await eventually(
      "the embeddings request's usage row",
      async () => (await harness.server.store.db.selectFrom("usage").selectAll().where("model", "=", "embedder").execute())[0],
    );
    assert.equal(row.prompt_tokens, answer.usage.prompt_tokens);
    assert.equal(row.completion_tokens, 0);
    assert.ok(Math.abs(row.cost_usd! - (answer.usage.prompt_tokens * PRICES.input_per_million) / 1_000_000) < 1e-12, `cost ${row.cost_usd}`);
  });

  test("the engine's refusal of a too-long input reaches the client as its 400", async () => {
    await assert.rejects(
      client.embeddings.create({ model: "embedder", input: "hello ".repeat(600) }),
      (error: unknown) =>
        error instanceof OpenAI.BadRequestError && error.code === "context_length_exceeded" && /at most 511 tokens per input/.test(error.message),
    );
  });
});
