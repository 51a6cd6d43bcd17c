import { test } from "node:test";
import assert from "node:assert/strict";
import { Catalog } from "./catalog.ts";
import { BadRequestError, ConflictError, NotFoundError } from "../core/errors.ts";
import { redactDefinition } from "./model-schema.ts";
import { testBothStores } from "../../test/support/stores.ts";

const fileModel = (name: string, extra: Record<string, unknown> = {}) => ({
  name,
  source: { kind: "file", path: "/models/tiny.gguf" },
  profiles: [{ name: "cpu", engine: "llamacpp" }],
  ...extra,
});

testBothStores("models are created with defaults, resolved by name and alias, and audited", async (store) => {
  const catalog = new Catalog({ store, clock: () => Date.parse("2026-11-30T10:00:00Z") });
  await catalog.refresh();
  const created = await catalog.create(fileModel("tiny", { aliases: ["tiny-latest"], prices: { input_per_million: 0.5 } }), "admin:root");
  assert.equal(created.name, "tiny");
  assert.equal(created.created_by, "admin:root");
  assert.equal(created.created_at, "2026-11-30T10:00:00.000Z");
  assert.deepEqual(created.definition.scaling, { min: 1, max: 1, idle_seconds: 0 });
  assert.deepEqual(created.definition.prices, { input_per_million: 0.5, output_per_million: 0 });
  assert.equal(created.definition.profiles[0]?.priority, 0);
  assert.equal(catalog.resolve("tiny-latest")?.name, "tiny");

  const fresh = new Catalog({ store });
  await fresh.refresh();
  assert.equal(fresh.resolve("tiny-latest")?.id, created.id, "a second server sees the same catalog from the store");

  const log = await catalog.auditLog();
  assert.equal(log[0]?.action, "model.create");
  assert.equal(log[0]?.actor, "admin:root");
  assert.equal(log[0]?.target, "tiny");
});

testBothStores("names and aliases are unique across models", async (store) => {
  const catalog = new Catalog({ store });
  await catalog.refresh();
  await catalog.create(fileModel("a", { aliases: ["shared"] }), "t");
  await assert.rejects(catalog.create(fileModel("shared"), "t"), ConflictError);
  await assert.rejects(catalog.create(fileModel("b", { aliases: ["a"] }), "t"), ConflictError);
  await assert.rejects(catalog.create(fileModel("a"), "t"), (e: unknown) => e instanceof ConflictError && /'a' is already used/.test(e.message));
  assert.equal(catalog.list().length, 1);
});

testBothStores("updates merge nested fields, rename, keep external keys and record what changed", async (store) => {
  const catalog = new Catalog({ store });
  await catalog.refresh();
  await catalog.create({ name: "ext", profiles: [{ name: "up", engine: "external", url: "http://127.0.0.1:9/", api_key: "upstream-secret" }], scaling: { min: 1, max: 3 } }, "t");
  const updated = await catalog.update("ext", { name: "ext2", scaling: { max: 4 }, profiles: [{ name: "up", engine: "external", url: "http://127.0.0.1:10/" }] }, "admin:ops");
  assert.equal(updated.name, "ext2");
  assert.deepEqual(updated.definition.scaling, { min: 1, max: 4, idle_seconds: 0 });
  assert.equal(updated.definition.profiles[0]?.api_key, "upstream-secret", "the stored key survives a PATCH that cannot know it");
  assert.equal(catalog.resolve("ext"), undefined);
  const log = await catalog.auditLog({ target: "ext2" });
  assert.deepEqual(log[0]?.detail, { renamed_from: "ext", changed: ["profiles", "scaling"] });
  assert.doesNotMatch(JSON.stringify(await catalog.auditLog()), /upstream-secret/);

  const shown = redactDefinition(updated.definition);
  assert.doesNotMatch(JSON.stringify(shown), /upstream-secret/);
  assert.equal((shown.profiles as { api_key_set: boolean }[])[0]?.api_key_set, true);

  await catalog.delete("ext2", "admin:ops");
  assert.throws(() => catalog.get("ext2"), (e: unknown) => e instanceof NotFoundError && e.code === "model_not_found");
  assert.equal((await catalog.auditLog())[0]?.action, "model.delete");
});

test("malformed models are refused with the field named", async () => {
  const { openSqliteTestStore } = await import("../../test/support/stores.ts");
  const { store, cleanup } = await openSqliteTestStore();
  try {
    const catalog = new Catalog({ store });
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
  const catalog = new Catalog({ store });
  await catalog.refresh();
  await catalog.create(fileModel("real", { aliases: ["nick"] }), "t");
  await assert.rejects(catalog.delete("nick", "t"), (e: unknown) => e instanceof NotFoundError && e.code === "model_is_alias" && /alias of model 'real'/.test(e.message));
  await assert.rejects(catalog.update("nick", { description: "x" }, "t"), (e: unknown) => e instanceof NotFoundError && e.code === "model_is_alias");
  assert.equal(catalog.get("real").definition.description, "");

  await store.db.insertInto("models").values({ id: "future", name: "from-a-newer-llmgw", definition: JSON.stringify({ profiles: [{ name: "p", engine: "quantum" }] }), created_by: "t", created_at: "t", updated_by: "t", updated_at: "t" }).execute();
  const other = new Catalog({ store });
  await other.refresh();
  assert.deepEqual(other.list().map((m) => m.name), ["real"]);
  assert.match(other.unreadableModels()[0] ?? "", /^from-a-newer-llmgw: profiles\.0\.engine/);
});
