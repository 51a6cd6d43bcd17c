// How catalog models look to Ollama's clients: quantization from GGUF file names, the
// weights' digest and size from the origin, the format by engine, and capabilities.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { CatalogModel } from "../../catalog/catalog.ts";
import { modelDefinitionSchema } from "../../catalog/model-schema.ts";
import { capabilitiesOf, modelEntry, quantizationOf, showAnswer } from "./ollama-models.ts";

const SHA_A = "a".repeat(64);
const SHA_B = "b".repeat(64);

function model(name: string, definition: Record<string, unknown>): CatalogModel {
  return {
    id: `id-${name}`,
    name,
    definition: modelDefinitionSchema.parse(definition),
    created_by: "admin",
    created_at: "2026-01-01T00:00:00.000Z",
    updated_by: "admin",
    updated_at: "2026-02-01T00:00:00.000Z",
  };
}

const GGUF = {
  profiles: [{ name: "cpu", engine: "llamacpp" }],
  source: { kind: "mirror", model: "org--repo", version: "abc", file: "Llama-3-8B-Instruct-Q4_K_M.gguf" },
  origin: {
    repo: "org/repo",
    revision: "abc",
    files: [
      { path: "README.md", sha256: SHA_B, bytes: 100 },
      { path: "Llama-3-8B-Instruct-Q4_K_M.gguf", sha256: SHA_A, bytes: 4_000 },
    ],
  },
  context_length: 8192,
};

test("the quantization is read from a GGUF file name", () => {
  assert.equal(quantizationOf("Llama-3-8B-Instruct-Q4_K_M.gguf"), "Q4_K_M");
  assert.equal(quantizationOf("/models/qwen2.5-0.5b-instruct-q8_0.gguf"), "Q8_0");
  assert.equal(quantizationOf("model-IQ4_XS.gguf"), "IQ4_XS");
  assert.equal(quantizationOf("tiny-f16.gguf"), "F16");
  assert.equal(quantizationOf("Qwen2-7B.BF16.gguf"), "BF16");
  assert.equal(quantizationOf("Qwen2-7B-Instruct.gguf"), "");
  assert.equal(quantizationOf(undefined), "");
});

test("an entry: the weights' sha256 as digest, the files' size, gguf details", () => {
  const entry = modelEntry("llama", model("llama", GGUF));
  assert.deepEqual(entry, {
    name: "llama",
    model: "llama",
    modified_at: "2026-02-01T00:00:00.000Z",
    size: 4_100,
    digest: SHA_A,
    details: { parent_model: "", format: "gguf", family: "", families: [], parameter_size: "", quantization_level: "Q4_K_M" },
  });
});

test("an external model has no weights: a stable digest of its id, size 0, no format", () => {
  const external = model("ext", { profiles: [{ name: "up", engine: "external", url: "http://127.0.0.1:9/v1" }] });
  const entry = modelEntry("ext", external);
  assert.match(entry.digest, /^[0-9a-f]{64}$/);
  assert.equal(entry.digest, modelEntry("ext", external).digest);
  assert.equal(entry.size, 0);
  assert.equal(entry.details.format, "");
  assert.equal(entry.details.quantization_level, "");
});

test("capabilities: completion and tools, vision when marked; a dedicated embedding model embeds only", () => {
  assert.deepEqual(capabilitiesOf(model("llama", { ...GGUF, capabilities: { vision: true } })), ["completion", "tools", "vision"]);
  assert.deepEqual(capabilitiesOf(model("emb", { ...GGUF, profiles: [{ name: "cpu", engine: "llamacpp", embeddings: true }] })), ["embedding"]);
  assert.deepEqual(capabilitiesOf(model("both", { ...GGUF, capabilities: { embeddings: true } })), ["completion", "tools", "embedding"]);
});

test("show gives the context length where clients look for it", () => {
  const shown = showAnswer(model("llama", GGUF));
  const info = shown.model_info as Record<string, unknown>;
  const architecture = info["general.architecture"] as string;
  assert.equal(info[`${architecture}.context_length`], 8192);
  assert.equal(shown.details.format, "gguf");
  assert.equal(shown.modified_at, "2026-02-01T00:00:00.000Z");
});
