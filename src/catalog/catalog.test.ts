// The catalog on both stores, with the real weights check over real tiny GGUF files
// (src/gguf/tiny-model.ts) and a mirror folder (test/support/folder-mirror.ts).
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, symlink, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { randomBytes } from "node:crypto";
import { SecretBox } from "../core/secret-box.ts";
import { Catalog } from "./catalog.ts";
import { BadRequestError, ConflictError, NotFoundError } from "../core/errors.ts";
import { redactDefinition } from "./model-schema.ts";
import { DiskWeightsChecker } from "./weights-check.ts";
import { GGUFValueType, writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { readAudit } from "../store/audit.ts";
import { folderMirror } from "../../test/support/folder-mirror.ts";
import type { Store } from "../store/store.ts";

let dir: string;
let tinyGguf: string;
let mirrorRoot: string;

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "llmgw-catalog-"));
  tinyGguf = path.join(dir, "tiny.gguf");
  await writeTinyLlamaGguf({ path: tinyGguf, seed: 1 });
  mirrorRoot = path.join(dir, "mirror");
  await mkdir(path.join(mirrorRoot, "owner--tiny", "0123456789ab"), { recursive: true });
  await writeTinyLlamaGguf({ path: path.join(mirrorRoot, "owner--tiny", "0123456789ab", "tiny-Q4_K_M.gguf"), seed: 2 });
});

after(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** One server secret for every catalog of this file, as the servers sharing a database have. */
const box = SecretBox.fromKey(randomBytes(32));

const newCatalog = (store: Store, extra: { clock?: () => number } = {}) =>
  new Catalog({ store, box, weights: new DiskWeightsChecker({ mirror: folderMirror(mirrorRoot) }), ...extra });

const fileModel = (name: string, extra: Record<string, unknown> = {}) => ({
  name,
  source: { kind: "file", path: tinyGguf },
  profiles: [{ name: "cpu", engine: "llamacpp" }],
  ...extra,
});

/** A 400 for `param` whose message says what to do. */
function refusedFor(param: string, code?: string, mention?: RegExp) {
  return (error: unknown): boolean => {
    assert.ok(error instanceof BadRequestError, `expected a 400 for ${param}, got ${String(error)}`);
    assert.equal(error.param, param, error.message);
    if (code !== undefined) assert.equal(error.code, code, error.message);
    if (mention !== undefined) assert.match(error.message, mention);
    return true;
  };
}

testBothStores("models are created with defaults, resolved by name and alias, and audited", async (store) => {
  const catalog = newCatalog(store, { clock: () => Date.parse("2026-11-30T10:00:00Z") });
  await catalog.refresh();
  const created = await catalog.create(fileModel("tiny", { aliases: ["tiny-latest"], prices: { input_per_million: 0.5 } }), "admin:root");
  assert.equal(created.name, "tiny");
  assert.equal(created.created_by, "admin:root");
  assert.equal(created.created_at, "2026-11-30T10:00:00.000Z");
  assert.deepEqual(created.definition.scaling, { min: 1, max: 1, idle_seconds: 900 });
  assert.deepEqual(created.definition.prices, { input_per_million: 0.5, output_per_million: 0 });
  assert.equal(created.definition.profiles[0]?.priority, 0);
  assert.equal(catalog.resolve("tiny-latest")?.name, "tiny");

  const fresh = newCatalog(store);
  await fresh.refresh();
  assert.equal(fresh.resolve("tiny-latest")?.id, created.id, "a second server sees the same catalog from the store");

  const log = await readAudit(store.db, { action: "model." });
  assert.equal(log[0]?.action, "model.create");
  assert.equal(log[0]?.actor, "admin:root");
  assert.equal(log[0]?.target, "tiny");
});

testBothStores("names and aliases are unique across models", async (store) => {
  const catalog = newCatalog(store);
  await catalog.refresh();
  await catalog.create(fileModel("a", { aliases: ["shared"] }), "t");
  await assert.rejects(catalog.create(fileModel("shared"), "t"), ConflictError);
  await assert.rejects(catalog.create(fileModel("b", { aliases: ["a"] }), "t"), ConflictError);
  await assert.rejects(catalog.create(fileModel("a"), "t"), (e: unknown) => e instanceof ConflictError && /'a' is already used/.test(e.message));
  assert.equal(catalog.list().length, 1);
});

testBothStores("updates merge nested fields, rename, keep external keys and record what changed", async (store) => {
  const catalog = newCatalog(store);
  await catalog.refresh();
  await catalog.create(
    { name: "ext", profiles: [{ name: "up", engine: "external", url: "http://127.0.0.1:9/", api_key: "upstream-secret" }], scaling: { min: 1, max: 3 } },
    "t",
  );
  const updated = await catalog.update(
    "ext",
    { name: "ext2", scaling: { max: 4 }, profiles: [{ name: "up", engine: "external", url: "http://127.0.0.1:10/" }] },
    "admin:ops",
  );
  assert.equal(updated.name, "ext2");
  assert.deepEqual(updated.definition.scaling, { min: 1, max: 4, idle_seconds: 900 });
  assert.equal(catalog.apiKeyOf(updated.definition.profiles[0]!), "upstream-secret", "the stored key survives a PATCH that cannot know it");
  assert.equal(catalog.resolve("ext"), undefined);
  const log = await readAudit(store.db, { action: "model.", target: "ext2" });
  assert.deepEqual(log[0]?.detail, { renamed_from: "ext", changed: ["profiles", "scaling"] });
  assert.doesNotMatch(JSON.stringify(await readAudit(store.db, { action: "model." })), /upstream-secret/);

  const shown = redactDefinition(updated.definition);
  assert.doesNotMatch(JSON.stringify(shown), /upstream-secret/);
  assert.equal((shown.profiles as { api_key_set: boolean }[])[0]?.api_key_set, true);

  await catalog.delete("ext2", "admin:ops");
  assert.throws(
    () => catalog.get("ext2"),
    (e: unknown) => e instanceof NotFoundError && e.code === "model_not_found",
  );
  assert.equal((await readAudit(store.db, { action: "model." }))[0]?.action, "model.delete");
});

test("malformed models are refused with the field named", async () => {
  const { openSqliteTestStore } = await import("../../test/support/stores.ts");
  const { store, cleanup } = await openSqliteTestStore();
  try {
    const catalog = newCatalog(store);
    await catalog.refresh();
    const cases: [unknown, string][] = [
      [{ name: "../x", profiles: [{ name: "p", engine: "external", url: "http://h" }] }, "name"],
      [{ name: "m", profiles: [] }, "profiles"],
      [{ name: "m", profiles: [{ name: "p", engine: "llamacpp" }] }, "source"],
      [{ name: "m", profiles: [{ name: "p", engine: "external" }] }, "profiles.0.url"],
      [{ name: "m", profiles: [{ name: "p", engine: "warp" }] }, "profiles.0.engine"],
      [fileModel("m", { scaling: { min: 2, max: 1 } }), "scaling.max"],
      [fileModel("m", { role: "guard" }), "guard_format"],
      [fileModel("m", { colour: "red" }), ""],
      [{ name: "m", profiles: [{ name: "p", engine: "external", url: "https://user:secret@h/v1" }] }, "profiles.0.url"],
      [{ name: "m", profiles: [{ name: "p", engine: "external", url: "https://h/v1?api-version=2" }] }, "profiles.0.url"],
    ];
    for (const [body, field] of cases) {
      await assert.rejects(catalog.create(body, "t"), (e: unknown) => {
        assert.ok(e instanceof BadRequestError, `expected a 400 for ${JSON.stringify(body)}`);
        if (field !== "") assert.equal(e.param, field, e.message);
        return true;
      });
    }
    await catalog.create(fileModel("ok"), "t");
    await assert.rejects(catalog.update("ok", { scaling: { min: -1 } }, "t"), (e: unknown) => e instanceof BadRequestError && e.param === "scaling.min");
    assert.equal(catalog.get("ok").definition.scaling.min, 1, "a refused change leaves the model as it was");
  } finally {
    await cleanup();
  }
});

testBothStores("changes through an alias are refused, and an unreadable stored row does not take the catalog down", async (store) => {
  const catalog = newCatalog(store);
  await catalog.refresh();
  await catalog.create(fileModel("real", { aliases: ["nick"] }), "t");
  await assert.rejects(
    catalog.delete("nick", "t"),
    (e: unknown) => e instanceof NotFoundError && e.code === "model_is_alias" && /alias of model 'real'/.test(e.message),
  );
  await assert.rejects(catalog.update("nick", { description: "x" }, "t"), (e: unknown) => e instanceof NotFoundError && e.code === "model_is_alias");
  assert.equal(catalog.get("real").definition.description, "");

  await store.db
    .insertInto("models")
    .values({
      id: "future",
      name: "from-a-newer-llmgw",
      definition: JSON.stringify({ profiles: [{ name: "p", engine: "quantum" }] }),
      created_by: "t",
      created_at: "t",
      updated_by: "t",
      updated_at: "t",
    })
    .execute();
  const other = newCatalog(store);
  await other.refresh();
  assert.deepEqual(
    other.list().map((m) => m.name),
    ["real"],
  );
  assert.match(other.unreadableModels()[0] ?? "", /^from-a-newer-llmgw: profiles\.0\.engine/);
});

testBothStores("weights that cannot run are refused at the door with the field named, and nothing is stored", async (store) => {
  const catalog = newCatalog(store);
  await catalog.refresh();
  const cut = path.join(dir, `cut-${store.dialect}.gguf`);
  const { bytes } = await writeTinyLlamaGguf({ path: cut, seed: 3 });
  await truncate(cut, Math.floor(bytes / 2));
  const notGguf = path.join(dir, `notes-${store.dialect}.gguf`);
  await writeFile(notGguf, "not weights at all");
  const gptj = path.join(dir, `gptj-${store.dialect}.gguf`);
  await writeTinyLlamaGguf({ path: gptj, seed: 4, extraMetadata: { "general.architecture": { value: "gptj", type: GGUFValueType.STRING } } });
  const link = path.join(dir, `link-${store.dialect}.gguf`);
  await symlink(tinyGguf, link);
  const mirrored = (extra: Record<string, string>) => ({
    source: { kind: "mirror", model: "owner--tiny", version: "0123456789ab", file: "tiny-Q4_K_M.gguf", ...extra },
  });

  const cases: [Record<string, unknown>, ReturnType<typeof refusedFor>][] = [
    [{ source: { kind: "file", path: path.join(dir, "absent.gguf") } }, refusedFor("source.path", "weights_missing", /absent\.gguf does not exist/)],
    [{ source: { kind: "file", path: "models/tiny.gguf" } }, refusedFor("source.path", "invalid_field", /absolute path/)],
    [{ source: { kind: "file", path: dir } }, refusedFor("source.path", "weights_not_file")],
    [{ source: { kind: "file", path: link } }, refusedFor("source.path", "weights_symlink", new RegExp(`real path \\(${tinyGguf}\\)`))],
    [{ source: { kind: "file", path: cut } }, refusedFor("source.path", "gguf_truncated", /is truncated: its tensor data ends/)],
    [{ source: { kind: "file", path: notGguf } }, refusedFor("source.path", "not_gguf")],
    [{ source: { kind: "file", path: gptj } }, refusedFor("source.path", "architecture_unsupported", /'gptj'/)],
    [mirrored({ version: "fedcba987654" }), refusedFor("source", "weights_not_mirrored", /llmgw ctl mirror fetch/)],
    [mirrored({ version: ".." }), refusedFor("source.version", "invalid_field", /'\.\.'/)],
    [mirrored({ file: "../../tiny.gguf" }), refusedFor("source.file", "invalid_field")],
    [{ profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 100 }] }, refusedFor("profiles.0.ctx_size", "invalid_field", /from 256 to 16777216/)],
    [{ profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 20_000_000 }] }, refusedFor("profiles.0.ctx_size")],
    [{ profiles: [{ name: "cpu", engine: "llamacpp", parallel: 65 }] }, refusedFor("profiles.0.parallel", "invalid_field", /at most 64/)],
    [
      { profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 256, parallel: 64 }] },
      refusedFor("profiles.0.parallel", "invalid_field", /leaves each request 4 tokens of the 256-token context.*lower parallel or raise ctx_size/),
    ],
    [{ scaling: { min: 1, max: 65 } }, refusedFor("scaling.max", "invalid_field", /at most 64/)],
    [{ scaling: { min: 3, max: 2 } }, refusedFor("scaling.max")],
  ];
  for (const [extra, refused] of cases) await assert.rejects(catalog.create(fileModel("m", extra), "t"), refused);
  assert.deepEqual(catalog.list(), []);
  assert.deepEqual(await store.db.selectFrom("models").select("name").execute(), []);

  // What runs is accepted: a file source, a complete mirrored file, the bounds themselves.
  await catalog.create(
    fileModel("from-file", { scaling: { min: 1, max: 64 }, profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 256 * 64, parallel: 64 }] }),
    "t",
  );
  await catalog.create(fileModel("from-mirror", mirrored({})), "t");
  assert.deepEqual(
    catalog.list().map((m) => m.name),
    ["from-file", "from-mirror"],
  );
});

testBothStores("a change is checked too, but a model whose file went bad still takes changes that do not touch its weights", async (store) => {
  const catalog = newCatalog(store);
  await catalog.refresh();
  const file = path.join(dir, `later-${store.dialect}.gguf`);
  await writeTinyLlamaGguf({ path: file, seed: 5 });
  await catalog.create(fileModel("m", { source: { kind: "file", path: file } }), "t");

  await assert.rejects(
    catalog.update("m", { source: { kind: "file", path: path.join(dir, "absent.gguf") } }, "t"),
    refusedFor("source.path", "weights_missing"),
  );
  await assert.rejects(catalog.update("m", { profiles: [{ name: "cpu", engine: "llamacpp", parallel: 100 }] }, "t"), refusedFor("profiles.0.parallel"));
  assert.deepEqual(catalog.get("m").definition.source, { kind: "file", path: file }, "a refused change leaves the model as it was");

  // The file is cut short after it was accepted: the operator can still stop the model or
  // describe it (its replicas park with the reason meanwhile), but not point it at bad weights.
  await truncate(file, 4096);
  const stopped = await catalog.update("m", { scaling: { min: 0 }, description: "weights being copied again" }, "t");
  assert.equal(stopped.definition.scaling.min, 0);
  await assert.rejects(
    catalog.update("m", { profiles: [{ name: "cpu", engine: "llamacpp", ctx_size: 2048 }] }, "t"),
    refusedFor("source.path", "gguf_truncated"),
  );
  const fixed = await catalog.update("m", { source: { kind: "file", path: tinyGguf }, scaling: { min: 1 } }, "t");
  assert.deepEqual(fixed.definition.source, { kind: "file", path: tinyGguf });
});

testBothStores("a stored row beyond today's bounds still loads; its next change must come within them", async (store) => {
  const definition = { source: { kind: "file", path: tinyGguf }, profiles: [{ name: "cpu", engine: "llamacpp", parallel: 100 }] };
  await store.db
    .insertInto("models")
    .values({ id: "old", name: "old", definition: JSON.stringify(definition), created_by: "t", created_at: "t", updated_by: "t", updated_at: "t" })
    .execute();
  const catalog = newCatalog(store);
  await catalog.refresh();
  assert.equal(catalog.get("old").definition.profiles[0]?.parallel, 100);
  assert.deepEqual(catalog.unreadableModels(), []);
  await assert.rejects(catalog.update("old", { description: "x" }, "t"), refusedFor("profiles.0.parallel"));
  assert.equal(
    (await catalog.update("old", { description: "x", profiles: [{ name: "cpu", engine: "llamacpp", parallel: 8 }] }, "t")).definition.profiles[0]?.parallel,
    8,
  );
});
