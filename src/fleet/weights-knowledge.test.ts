// What a new leader uses when a model's mirrored bytes are held only by another server: the
// weights a leader read before (model_weights). The row is keyed by the model's source, so
// it may predate the model's adapters (or adapters altogether): a model without adapters is
// placed from it, one with adapters waits for bytes this server can read. And what is
// copied here from a holder: every mirrored version the model needs, adapters' included.
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm, stat } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import type { CatalogModel } from "../catalog/catalog.ts";
import { modelDefinitionSchema } from "../catalog/model-schema.ts";
import { LlmgwError } from "../core/errors.ts";
import { silentLogger } from "../core/log.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { eventually } from "../../test/support/eventually.ts";
import { testBothStores } from "../../test/support/stores.ts";
import type { MirrorReader } from "./model-weights.ts";
import { WeightsKnowledge } from "./weights-knowledge.ts";

const source = { kind: "mirror" as const, model: "o--m", version: "0123456789ab", file: "m.gguf" };

function model(id: string, adapters: unknown[] = []): CatalogModel {
  return {
    id,
    name: id,
    definition: modelDefinitionSchema.parse({ source, profiles: [{ name: "cpu", engine: "llamacpp" }], adapters }),
    created_by: "t",
    created_at: "2026-12-02T00:00:00.000Z",
    updated_by: "t",
    updated_at: "2026-12-02T00:00:00.000Z",
  };
}

/** A mirror whose every file is held by another server only. */
const elsewhere: MirrorReader = {
  check: async () => ({
    kind: "refused" as const,
    error: new LlmgwError({ status: 409, code: "mirror_file_elsewhere", message: "held by server b only" }),
  }),
} as unknown as MirrorReader;

testBothStores("a kept row from before adapters places a model without them, and never one with them", async (store) => {
  // What an older leader kept: no `adapters` field.
  const oldWeights = { key: "mirror:o--m/0123456789ab", files: [{ file: "m.gguf", bytes: 1000, sha256: "a".repeat(64) }], bytes: 1000 };
  for (const id of ["plain", "styled"]) {
    await store.db
      .insertInto("model_weights")
      .values({ model_id: id, source: JSON.stringify(source), weights: JSON.stringify(oldWeights), updated_at: "2026-12-01T00:00:00.000Z" })
      .execute();
  }
  const knowledge = new WeightsKnowledge({ mirror: elsewhere, logger: silentLogger(), store });
  const plain = model("plain");
  const styled = model("styled", [{ name: "style", source: { kind: "file", path: "/a/style.gguf" } }]);
  const problems: string[] = [];
  await knowledge.refresh([plain, styled], (id) => problems.push(id));
  assert.equal(knowledge.optionsFor(plain)?.length, 1, "placed from the kept row");
  assert.deepEqual(knowledge.adaptersOf(plain.id), []);
  assert.equal(knowledge.optionsFor(styled), null, "a model with adapters is not placed from a row that cannot say which adapters it read");
  assert.deepEqual(problems, ["styled"]);
});

test("weights here, a mirrored adapter held only by another server: the adapter's version is copied too", async () => {
  const dir = await mkdtemp(path.join(tmpdir(), "llmgw-knowledge-"));
  try {
    const weightsFile = path.join(dir, "m.gguf");
    await writeTinyLlamaGguf({ path: weightsFile, seed: 1 });
    const adapterSource = { kind: "mirror" as const, model: "o--style", version: "fedcba987654", file: "style.gguf" };
    const replicated: string[] = [];
    const holders = [{ name: "b", live: true, lastSeen: null }];
    const mirror = {
      check: async (mirrorModel: string) =>
        mirrorModel === source.model
          ? { kind: "ok" as const, path: weightsFile, size: (await stat(weightsFile)).size, sha256: "b".repeat(64) }
          : {
              kind: "elsewhere" as const,
              holders,
              server: "a",
              error: new LlmgwError({ status: 409, code: "mirror_file_elsewhere", message: "held by server b only" }),
            },
      replicate: async (mirrorModel: string, version: string) => {
        replicated.push(`${mirrorModel}/${version}`);
        return { copied: 1, failed: 0 };
      },
    } as unknown as MirrorReader;
    const copied: string[] = [];
    const knowledge = new WeightsKnowledge({ mirror, logger: silentLogger(), onCopied: () => copied.push("copied") });
    const styled = model("styled", [{ name: "style", source: adapterSource }]);
    const problems: string[] = [];
    await knowledge.refresh([styled], (id) => problems.push(id));
    // The weights' version too (a copy of a version held here copies nothing): which of its files is elsewhere is not known here.
    assert.deepEqual(replicated, ["o--m/0123456789ab", "o--style/fedcba987654"]);
    assert.match(knowledge.problem(styled.id) ?? "", /copying them from that server now/);
    await eventually("the copies to end", () => copied.length === 2);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
