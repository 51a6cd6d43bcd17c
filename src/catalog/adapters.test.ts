// LoRA adapters in the catalog, on both stores: served names resolved to the base model and
// reserved against every other model's names; the door check over real files (a generated
// tiny model and tiny adapters, src/gguf/tiny-lora.ts) refusing what llama.cpp would only
// fail on at load, with both values; the rules of the definition; and how the gateway tells
// each engine which adapter a request asked for.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { BadRequestError, ConflictError } from "../core/errors.ts";
import { SecretBox } from "../core/secret-box.ts";
import type { Replica } from "../fleet/replica-table.ts";
import { adapterChoice, upstreamOf } from "../gateway/adapter-route.ts";
import { writeTinyLora } from "../gguf/tiny-lora.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { readModelWeights } from "../fleet/model-weights.ts";
import { Catalog, type CatalogModel } from "./catalog.ts";
import { modelDefinitionSchema, newModelSchema } from "./model-schema.ts";
import { DiskWeightsChecker, type MirrorLocator } from "./weights-check.ts";
import type { Store } from "../store/store.ts";

let dir: string;
let base: string;
let style: string;
let terse: string;

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "llmgw-adapters-"));
  base = path.join(dir, "base.gguf");
  await writeTinyLlamaGguf({ path: base, seed: 1 });
  style = path.join(dir, "style.gguf");
  await writeTinyLora({ path: style, seed: 2 });
  terse = path.join(dir, "terse.gguf");
  await writeTinyLora({ path: terse, seed: 3, rank: 2 });
});

after(() => rm(dir, { recursive: true, force: true }));

const box = SecretBox.fromKey(randomBytes(32));
const newCatalog = (store: Store) => new Catalog({ store, box, weights: new DiskWeightsChecker() });

const withAdapters = (name: string, adapters: unknown[]) => ({
  name,
  source: { kind: "file", path: base },
  profiles: [{ name: "cpu", engine: "llamacpp" }],
  adapters,
});
const file = (at: string) => ({ kind: "file", path: at });

function refused(code: string, param: string, ...mentions: RegExp[]) {
  return (error: unknown): boolean => {
    assert.ok(error instanceof BadRequestError, `expected a 400, got ${String(error)}`);
    assert.equal(error.code, code, error.message);
    assert.equal(error.param, param, error.message);
    for (const mention of mentions) assert.match(error.message, mention);
    return true;
  };
}

testBothStores("an adapter is served under MODEL:NAME (or its own name), resolved to its model, reserved against other models", async (store) => {
  const catalog = newCatalog(store);
  await catalog.create(
    withAdapters("tiny", [
      { name: "style", source: file(style) },
      { name: "terse", served_name: "tiny-terse", scale: 0.5, source: file(terse) },
    ]),
    "t",
  );
  assert.equal(catalog.resolve("tiny:style")?.name, "tiny");
  assert.equal(catalog.resolve("tiny-terse")?.name, "tiny");
  assert.deepEqual({ index: catalog.adapterOf("tiny-terse")?.index, scale: catalog.adapterOf("tiny-terse")?.adapter.scale }, { index: 1, scale: 0.5 });
  assert.equal(catalog.adapterOf("tiny"), undefined, "the model's own name is not an adapter");
  // Another model may not take an adapter's served name, as a name or an alias.
  await assert.rejects(catalog.create({ ...withAdapters("tiny:style", []) }, "t"), ConflictError);
  await assert.rejects(catalog.create({ ...withAdapters("other", []), aliases: ["tiny-terse"] }, "t"), ConflictError);
  // An adapter may not take its own model's name (every base request would run with it), nor the model be renamed to an adapter's.
  await assert.rejects(
    catalog.update("tiny", { adapters: [{ name: "style", served_name: "tiny", source: file(style) }] }, "t"),
    refused("invalid_field", "adapters.0.served_name", /already the model's name/),
  );
  await assert.rejects(catalog.update("tiny", { name: "tiny-terse" }, "t"), refused("invalid_field", "adapters.1.served_name"));
  // Removing the adapter frees its name.
  await catalog.update("tiny", { adapters: [{ name: "style", source: file(style) }] }, "t");
  assert.equal(catalog.resolve("tiny-terse"), undefined);
  await catalog.create({ ...withAdapters("other", []), aliases: ["tiny-terse"] }, "t");
});

testBothStores("the door refuses an adapter llama.cpp would fail on, naming both values", async (store) => {
  const catalog = newCatalog(store);
  const wide = path.join(dir, "wide.gguf");
  await writeTinyLora({ path: wide, seed: 4, embeddingLength: 128 });
  await assert.rejects(
    catalog.create(withAdapters("w", [{ name: "wide", source: file(wide) }]), "t"),
    refused("adapter_mismatch", "adapters.0.source", /embedding size 128 .*the model's is 64/),
  );
  const qwen = path.join(dir, "qwen.gguf");
  await writeTinyLora({ path: qwen, seed: 5, architecture: "qwen2" });
  await assert.rejects(
    catalog.create(withAdapters("q", [{ name: "q", source: file(qwen) }]), "t"),
    refused("adapter_mismatch", "adapters.0.source", /qwen2, the model is llama/),
  );
  // A model file given as an adapter, and a missing one.
  await assert.rejects(
    catalog.create(withAdapters("m", [{ name: "m", source: file(base) }]), "t"),
    refused("adapter_invalid", "adapters.0.source", /not a LoRA adapter/),
  );
  await assert.rejects(
    catalog.create(withAdapters("n", [{ name: "n", source: file(path.join(dir, "none.gguf")) }]), "t"),
    refused("weights_missing", "adapters.0.source"),
  );
  assert.equal(catalog.list().length, 0, "nothing refused was stored");
});

test("the definition's rules: unique names, served names apart from the model's, no external or embedding models, absolute paths, vLLM folders", () => {
  const issues = (body: unknown) => JSON.stringify(newModelSchema.safeParse(body).error?.issues ?? []);
  assert.match(
    issues(
      withAdapters("t", [
        { name: "a", source: file(style) },
        { name: "a", source: file(terse) },
      ]),
    ),
    /'a' names two adapters/,
  );
  assert.match(
    issues({ ...withAdapters("t", [{ name: "a", served_name: "small", source: file(style) }]), aliases: ["small"] }),
    /already the model's name, an alias/,
  );
  assert.match(
    issues({ name: "x", profiles: [{ name: "e", engine: "external", url: "http://10.0.0.5:8000/v1" }], adapters: [{ name: "a", source: file(style) }] }),
    /an external server serves its own adapters/,
  );
  assert.match(
    issues({ ...withAdapters("t", [{ name: "a", source: file(style) }]), profiles: [{ name: "cpu", engine: "llamacpp", embeddings: true }] }),
    /an embedding model .* takes none/,
  );
  assert.match(issues(withAdapters("t", [{ name: "a", source: file("style.gguf") }])), /must be an absolute path on the nodes/);
  assert.match(
    issues({ ...withAdapters("g", [{ name: "a", source: file(style) }]), role: "guard", guard_format: "json" }),
    /a guard model \(role guard\) takes none/,
  );
  assert.match(
    issues({
      ...withAdapters("t", [{ name: "a", source: { kind: "mirror", model: "m", version: "v", file: "a.gguf" } }]),
      profiles: [{ name: "gpu", engine: "vllm", hardware: { gpu: { class: "H100" } } }],
    }),
    /vLLM loads a PEFT adapter folder/,
  );
  assert.match(issues(withAdapters("t", [{ name: "a", scale: 0, source: file(style) }])), /scale/);
  const gpu = { hardware: { gpu: { class: "H100" } } };
  assert.match(
    issues({
      ...withAdapters("t", [{ name: "a", source: file("/adapters/a") }]),
      profiles: [
        { name: "cpu", engine: "llamacpp" },
        { name: "gpu", engine: "vllm", ...gpu },
      ],
    }),
    /a model with both llamacpp and vllm profiles takes no adapters/,
  );
  assert.match(
    issues({ ...withAdapters("t", [{ name: "a", scale: 0.5, source: file("/adapters/a") }]), profiles: [{ name: "gpu", engine: "vllm", ...gpu }] }),
    /leave scale at 1 for vllm profiles/,
  );
  assert.equal(newModelSchema.safeParse(withAdapters("t", [{ name: "a", source: file(style) }])).success, true);
});

test("each engine is told the adapter in its own terms; a base request to a model with adapters says so", () => {
  const catalog = {
    adapterOf: (name: string) => (name === "tiny:style" ? { adapter: { scale: 0.5 }, index: 1 } : undefined),
  };
  const withSome = { definition: { adapters: [{}, {}] } };
  const without = { definition: { adapters: [] } };
  const replica = (engine: Replica["engine"], adapters: string[] = ["tiny:terse", "tiny:style"]) =>
    ({ engine, upstreamModel: "tiny", adapters }) as unknown as Replica;
  const styled = adapterChoice(catalog, "tiny:style", withSome);
  assert.deepEqual(upstreamOf(replica("llamacpp"), styled), { model: "tiny", fields: { lora: [{ id: 1, scale: 0.5 }] } });
  // The id is the position in the replica's own list: an older replica that loaded them in another order.
  assert.deepEqual(upstreamOf(replica("llamacpp", ["tiny:style"]), styled), { model: "tiny", fields: { lora: [{ id: 0, scale: 0.5 }] } });
  assert.deepEqual(upstreamOf(replica("vllm"), styled), { model: "tiny:style", fields: {} });
  // The base of a model with adapters: every adapter at 0, said explicitly (llama-server keeps a
  // prompt cached under an adapter for a request without the field).
  const plain = adapterChoice(catalog, "tiny", withSome);
  assert.deepEqual(upstreamOf(replica("llamacpp"), plain), { model: "tiny", fields: { lora: [{ id: 0, scale: 0 }] } });
  assert.deepEqual(upstreamOf(replica("llamacpp", []), plain), { model: "tiny", fields: {} }, "a replica that loaded none gets no field");
  assert.deepEqual(upstreamOf(replica("vllm"), plain), { model: "tiny", fields: {} });
  assert.equal(adapterChoice(catalog, "tiny", without), null, "a model without adapters: nothing added");
});

test("weights held only by another running server: the adapters here are still checked at the door", async () => {
  const mirrored = { kind: "mirror", model: "o--m", version: "0123456789ab", file: "m.gguf" };
  const elsewhere: MirrorLocator = {
    root: dir,
    check: async () => ({
      kind: "elsewhere" as const,
      holders: [{ name: "b", live: true, lastSeen: null }],
      server: "a",
      size: 1000,
      sha256: "a".repeat(64),
      error: new ConflictError("held by server b only", { code: "mirror_file_elsewhere" }),
    }),
  } as unknown as MirrorLocator;
  const checker = new DiskWeightsChecker({ mirror: elsewhere });
  const model = (adapter: string) => ({
    name: "m",
    definition: newModelSchema.parse({ ...withAdapters("m", [{ name: "a", source: file(adapter) }]), source: mirrored }),
  });
  await assert.rejects(checker.check(model(base)), refused("adapter_invalid", "adapters.0.source", /not a LoRA adapter/));
  await checker.check(model(style));
});

test("the leader checks each adapter against the model when it reads the weights, and names the adapter in the model's health", async () => {
  const wide = path.join(dir, "wide-leader.gguf");
  await writeTinyLora({ path: wide, seed: 6, embeddingLength: 128 });
  // As a definition added through a server that could not read the weights would be stored.
  const model: CatalogModel = {
    id: "m-id",
    name: "m",
    definition: modelDefinitionSchema.parse({
      source: file(base),
      profiles: [{ name: "cpu", engine: "llamacpp" }],
      adapters: [{ name: "wide", source: file(wide) }],
    }),
    created_by: "t",
    created_at: "2026-12-02T00:00:00.000Z",
    updated_by: "t",
    updated_at: "2026-12-02T00:00:00.000Z",
  };
  const noMirror = { check: () => Promise.reject(new Error("no mirror in this test")) };
  await assert.rejects(readModelWeights(model, noMirror), /Adapter 'wide' of model 'm' cannot be used: .*embedding size 128/);
  const fitting = {
    ...model,
    definition: { ...model.definition, adapters: [{ ...model.definition.adapters[0]!, source: { kind: "file" as const, path: style } }] },
  };
  assert.equal((await readModelWeights(fitting, noMirror)).adapters[0]?.sha256?.length, 64);
});
