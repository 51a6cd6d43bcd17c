// /v1/embeddings on the bundled engine, end to end: real `llmgw engine` child processes
// serving a generated tiny llama model (a generating engine, whose embedding context is
// created on the first request, and one started with --embeddings), driven by the
// official `openai` client and by plain fetch where the raw wire shape matters. The wire
// helpers (normalisation, base64, dimensions) are checked in isolation first.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import OpenAI from "openai";
import { writeTinyLlamaGguf } from "../../gguf/tiny-model.ts";
import { startEngine, waitForReady, type EngineProcess } from "../../../test/support/engine-process.ts";
import { silentLogger } from "../../core/log.ts";
import { checkDimensions, encodeBase64, l2Normalize, toEmbeddingJob } from "./embeddings-wire.ts";
import { LlamaEmbedder } from "./llama-embedder.ts";
import { openModel } from "./llama-load.ts";

const KEY = "engine-key-for-tests";
const MODEL_NAME = "tiny-embed";
/** The tiny model's n_embd (writeTinyLlamaGguf's default). */
const EMBEDDING_SIZE = 64;
const CTX_SIZE = 512;
const PARALLEL = 2;

function norm(vector: ArrayLike<number>): number {
  let sum = 0;
  for (let i = 0; i < vector.length; i++) sum += (vector[i] as number) ** 2;
  return Math.sqrt(sum);
}

/** What the tests read of an /v1/embeddings answer: the embeddings (floats, or base64) and usage, or the error of a refusal. */
interface EmbeddingsAnswer {
  data: Array<{ embedding: number[] | string }>;
  usage: { prompt_tokens: number };
  error: { message: string; code: string | null; param: string | null };
}

function decodeBase64(text: string): number[] {
  const bytes = Buffer.from(text, "base64");
  return Array.from({ length: bytes.length / 4 }, (_, i) => bytes.readFloatLE(i * 4));
}

describe("embeddings wire helpers", () => {
  test("l2Normalize gives unit length and keeps direction; a zero vector stays zero", () => {
    const unit = l2Normalize([3, 4]);
    assert.deepEqual(Array.from(unit), [Math.fround(0.6), Math.fround(0.8)]);
    assert.deepEqual(Array.from(l2Normalize([0, 0])), [0, 0]);
  });

  test("base64 is the little-endian float32 bytes, as OpenAI sends", () => {
    const vector = new Float32Array([1, -0.5]);
    // 1.0f = 00 00 80 3f, -0.5f = 00 00 00 bf, little-endian.
    assert.equal(encodeBase64(vector), Buffer.from([0, 0, 0x80, 0x3f, 0, 0, 0, 0xbf]).toString("base64"));
  });

  test("inputs of every shape become a list; empty text and other dimensions are refused by name", () => {
    assert.deepEqual(toEmbeddingJob({ input: "a" }).inputs, ["a"]);
    assert.deepEqual(toEmbeddingJob({ input: ["a", "b"] }).inputs, ["a", "b"]);
    assert.deepEqual(toEmbeddingJob({ input: [1, 2] }).inputs, [[1, 2]]);
    assert.deepEqual(toEmbeddingJob({ input: [[1], [2, 3]] }).inputs, [[1], [2, 3]]);
    assert.throws(() => toEmbeddingJob({ input: ["a", ""] }), /input\[1\]/);
    const job = toEmbeddingJob({ input: "a", dimensions: 32 });
    assert.throws(() => checkDimensions(job, 64), /'dimensions'.*64 dimensions/);
    assert.doesNotThrow(() => checkDimensions(toEmbeddingJob({ input: "a", dimensions: 64 }), 64));
  });
});

describe("embeddings on the bundled engine", () => {
  let dir: string;
  let engine: EngineProcess;
  let embeddingOnly: EngineProcess;
  let client: OpenAI;
  let embedClient: OpenAI;

  const post = async (url: string, body: unknown) => {
    const response = await fetch(`${url}/v1/embeddings`, {
      method: "POST",
      headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
      body: JSON.stringify(body),
    });
    return { status: response.status, body: (await response.json()) as EmbeddingsAnswer };
  };

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), "llmgw-embeddings-"));
    const model = await writeTinyLlamaGguf({ path: join(dir, "tiny.gguf"), seed: 5 });
    const common = ["--model", model.path, "--key", KEY, "--threads", "1", "--ctx-size", String(CTX_SIZE), "--model-name", MODEL_NAME];
    engine = await startEngine({ args: [...common, "--parallel", String(PARALLEL)] });
    embeddingOnly = await startEngine({ args: [...common, "--embeddings"] });
    await Promise.all([waitForReady(engine), waitForReady(embeddingOnly)]);
    client = new OpenAI({ baseURL: `${engine.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 30_000 });
    embedClient = new OpenAI({ baseURL: `${embeddingOnly.url}/v1`, apiKey: KEY, maxRetries: 0, timeout: 30_000 });
  });

  after(async () => {
    await engine?.kill();
    await embeddingOnly?.kill();
    await rm(dir, { recursive: true, force: true });
  });

  test("OpenAI's shape: one unit vector per input, in order, with usage; the same input gives the same vector", async () => {
    const texts = ["hello world again", "a different sentence", "hello world again"];
    // Without encoding_format the openai client asks for base64 and decodes it itself.
    const answer = await client.embeddings.create({ model: MODEL_NAME, input: texts });
    assert.equal(answer.object, "list");
    assert.equal(answer.model, MODEL_NAME);
    assert.equal(answer.data.length, 3);
    answer.data.forEach((item, index) => {
      assert.equal(item.object, "embedding");
      assert.equal(item.index, index);
      assert.equal(item.embedding.length, EMBEDDING_SIZE);
      assert.ok(Math.abs(norm(item.embedding) - 1) < 1e-5, `input ${index} has norm ${norm(item.embedding)}`);
    });
    const [first, second, third] = answer.data.map((item) => item.embedding);
    assert.deepEqual(third, first, "the same text gives the same vector");
    assert.notDeepEqual(second, first);
    // Each text is BOS + its tokens; three texts of a few tokens each.
    assert.ok(answer.usage.prompt_tokens > 3 && answer.usage.prompt_tokens < 60, `prompt_tokens ${answer.usage.prompt_tokens}`);
    assert.equal(answer.usage.total_tokens, answer.usage.prompt_tokens);

    const again = await client.embeddings.create({ model: MODEL_NAME, input: "hello world again", encoding_format: "float" });
    assert.deepEqual(again.data[0]?.embedding, first, "determinism across requests, float and base64 alike");
  });

  test("base64 decodes to the float answer's values", async () => {
    const float = await post(engine.url, { input: "round trip", encoding_format: "float" });
    const base64 = await post(engine.url, { input: "round trip", encoding_format: "base64" });
    assert.equal(float.status, 200);
    assert.equal(typeof base64.body.data[0]?.embedding, "string");
    assert.deepEqual(decodeBase64(String(base64.body.data[0]?.embedding)), float.body.data[0]?.embedding);
    assert.deepEqual(base64.body.usage, float.body.usage);
  });

  test("token arrays: one array or several, counted with BOS, and the same vector as the text they spell", async () => {
    // The tiny vocabulary spells "hello world again" as these six tokens (BOS is added).
    const tokens = [297, 302, 265, 486, 480, 392];
    const one = await post(engine.url, { input: tokens, encoding_format: "float" });
    assert.equal(one.status, 200, JSON.stringify(one.body));
    assert.equal(one.body.usage.prompt_tokens, tokens.length + 1);
    const text = await post(engine.url, { input: "hello world again", encoding_format: "float" });
    assert.deepEqual(one.body.data[0]?.embedding, text.body.data[0]?.embedding);

    const several = await post(engine.url, { input: [tokens, [5, 6, 7]], encoding_format: "float" });
    assert.equal(several.body.data.length, 2);
    assert.deepEqual(several.body.data[0]?.embedding, one.body.data[0]?.embedding);
    assert.equal(several.body.usage.prompt_tokens, tokens.length + 1 + 4);

    const outside = await post(engine.url, { input: [1, 10_000_000] });
    assert.equal(outside.status, 400);
    assert.match(outside.body.error.message, /token id 10000000 is outside the vocabulary/);
  });

  test("an input longer than the context is refused with how many tokens fit; dimensions only as the model's", async () => {
    // --ctx-size is shared by the --parallel sequences; one input gets CTX_SIZE / PARALLEL less one.
    const fits = CTX_SIZE / PARALLEL - 1;
    const long = await post(engine.url, { input: ["short", "hello ".repeat(CTX_SIZE)] });
    assert.equal(long.status, 400);
    assert.equal(long.body.error.code, "context_length_exceeded");
    assert.match(long.body.error.message, new RegExp(`'input\\[1\\]' has \\d+ tokens but this engine embeds at most ${fits} tokens per input`));

    const wrong = await post(engine.url, { input: "x", dimensions: 32 });
    assert.equal(wrong.status, 400);
    assert.equal(wrong.body.error.param, "dimensions");
    assert.equal((await post(engine.url, { input: "x", dimensions: EMBEDDING_SIZE })).status, 200);

    const empty = await post(engine.url, { input: "" });
    assert.equal(empty.status, 400);
    assert.equal(empty.body.error.param, "input");
    assert.equal((await post(engine.url, { input: 42 })).status, 400);
  });

  test("a generating engine still generates after embedding", async () => {
    const reply = await client.chat.completions.create({ model: MODEL_NAME, messages: [{ role: "user", content: "hi" }], max_tokens: 3, temperature: 0 });
    assert.equal(reply.usage?.completion_tokens, 3);
  });

  test("an engine started with --embeddings embeds like the generating one and refuses chat and completions", async () => {
    const texts = ["hello world again", "a different sentence"];
    const [dedicated, generating] = await Promise.all([
      embedClient.embeddings.create({ model: MODEL_NAME, input: texts, encoding_format: "float" }),
      client.embeddings.create({ model: MODEL_NAME, input: texts, encoding_format: "float" }),
    ]);
    // The same weights and pooling give the same vectors (to float rounding between contexts of different sizes).
    dedicated.data.forEach((item, index) => {
      const other = generating.data[index]?.embedding ?? [];
      const cosine = item.embedding.reduce((sum, value, i) => sum + value * (other[i] ?? 0), 0);
      assert.ok(cosine > 0.9999, `input ${index}: cosine ${cosine}`);
    });
    assert.equal(dedicated.usage.prompt_tokens, generating.usage.prompt_tokens);

    await assert.rejects(
      embedClient.chat.completions.create({ model: MODEL_NAME, messages: [{ role: "user", content: "hi" }], max_tokens: 2 }),
      (error: unknown) => error instanceof OpenAI.BadRequestError && error.code === "model_not_generative" && /embedding model/.test(error.message),
    );
    await assert.rejects(
      embedClient.chat.completions.create({ model: MODEL_NAME, messages: [{ role: "user", content: "hi" }], max_tokens: 2, stream: true }),
      (error: unknown) => error instanceof OpenAI.BadRequestError && error.code === "model_not_generative",
    );
    await assert.rejects(
      embedClient.completions.create({ model: MODEL_NAME, prompt: "hi", max_tokens: 2 }),
      (error: unknown) => error instanceof OpenAI.BadRequestError && error.code === "model_not_generative",
    );
    // Its one input may use the whole --ctx-size (no parallel sequences share it).
    const long = await post(embeddingOnly.url, { input: "hello ".repeat(CTX_SIZE) });
    assert.match(long.body.error.message, new RegExp(`at most ${CTX_SIZE - 1} tokens per input`));
  });
});

describe("pooling of a model without pooling metadata", () => {
  test("the vector is the mean of the token vectors (not the last token's), normalised", async () => {
    const dir = await mkdtemp(join(tmpdir(), "llmgw-pooling-"));
    const info = await writeTinyLlamaGguf({ path: join(dir, "tiny.gguf"), seed: 5 });
    const opened = await openModel({ modelPath: info.path, threads: 1, logger: silentLogger() });
    try {
      const tokens = [297, 302, 265, 486, 480, 392];
      const embedder = new LlamaEmbedder({ model: opened.model, contextSize: 256, threads: 1, logger: silentLogger() });
      const [pooled] = (await embedder.embed([tokens], new AbortController().signal)).vectors;
      // Without the override llama.cpp pools nothing and gives the last token's vector, so
      // the vector of each prefix (BOS included) is that token's own; their mean is the
      // mean pooling of the whole input (causal attention: a token sees only its prefix).
      const plain = await opened.llama.loadModel({ modelPath: info.path });
      const unpooled = await plain.createEmbeddingContext({ contextSize: 256, threads: 1 });
      const withBos = [info.tokens.bos, ...tokens];
      const perToken: number[][] = [];
      for (let i = 1; i <= withBos.length; i++) perToken.push([...(await unpooled.getEmbeddingFor(withBos.slice(0, i) as never)).vector]);
      const mean = l2Normalize(perToken[0]!.map((_, j) => perToken.reduce((sum, vector) => sum + vector[j]!, 0) / perToken.length));
      const last = l2Normalize(perToken.at(-1)!);
      assert.ok(pooled);
      const cosine = (a: Float32Array, b: Float32Array) => a.reduce((sum, value, i) => sum + value * b[i]!, 0);
      assert.ok(cosine(pooled, mean) > 0.99999, `cosine with the mean ${cosine(pooled, mean)}`);
      assert.ok(cosine(pooled, last) < 0.999, `not the last token's vector (cosine ${cosine(pooled, last)})`);
    } finally {
      await opened.llama.dispose();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
