// The admin API over real HTTP on a real server: who may call it, and what bad input gets.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { statSync } from "node:fs";
import { truncate } from "node:fs/promises";
import path from "node:path";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import type { AuditEntry } from "../store/audit.ts";
import type { RenderedError } from "../core/errors.ts";

describe("admin API", () => {
  let harness: Harness;

  before(async () => {
    harness = await startHarness();
  });

  after(async () => {
    await harness.close();
  });

  test("needs an admin key: none is 401, a client key is 403", async () => {
    const none = await fetch(`${harness.url}/api/v1/models`);
    assert.equal(none.status, 401);
    const client = await harness.clientKey();
    const withClient = await fetch(`${harness.url}/api/v1/models`, { headers: { authorization: `Bearer ${client}` } });
    assert.equal(withClient.status, 403);
    assert.equal(((await withClient.json()) as RenderedError["body"]).error.code, "admin_required");
    assert.equal((await fetch(`${harness.url}/healthz`)).status, 200, "health needs no key");
  });

  test("bad query values are 400s that name the field", async () => {
    const audit = await harness.admin("GET", "/api/v1/audit?limit=abc");
    assert.equal(audit.status, 400);
    assert.equal(audit.body.error.param, "limit");
    assert.equal((await harness.admin("GET", "/api/v1/audit?limit=0")).status, 400);
    assert.equal((await harness.admin("GET", "/api/v1/audit?limit=5")).status, 200);
    const plan = await harness.admin("GET", "/api/v1/plan");
    assert.equal(plan.status, 400);
    assert.equal(plan.body.error.param, "repo");
  });

  test("a model is changed by its name, not an alias; keys are never shown again", async () => {
    const created = await harness.admin("POST", "/api/v1/models", {
      name: "ext",
      aliases: ["nick"],
      profiles: [{ name: "p", engine: "external", url: "http://127.0.0.1:9", api_key: "upstream-secret" }],
    });
    assert.equal(created.status, 201);
    assert.doesNotMatch(JSON.stringify(created.body), /upstream-secret/);
    const viaAlias = await harness.admin("DELETE", "/api/v1/models/nick");
    assert.equal(viaAlias.status, 404);
    assert.equal(viaAlias.body.error.code, "model_is_alias");
    const listed = await harness.admin("GET", "/api/v1/models");
    assert.doesNotMatch(JSON.stringify(listed.body), /upstream-secret/);
    const key = await harness.admin("POST", "/api/v1/keys", { name: "app" });
    const keys = await harness.admin("GET", "/api/v1/keys");
    assert.doesNotMatch(JSON.stringify(keys.body), new RegExp(key.body.key));
  });

  test("POST and PATCH of a model refuse weights that cannot run with a 400 naming the field and what to do", async () => {
    const cut = path.join(harness.dataDir, "cut.gguf");
    // Cut inside the tensor data, as an interrupted copy leaves it: the header is whole.
    const { bytes } = await writeTinyLlamaGguf({ path: cut, seed: 1 });
    await truncate(cut, Math.floor(bytes / 2));
    const model = (source: unknown, extra: Record<string, unknown> = {}) => ({
      name: "door",
      scaling: { min: 0, max: 1 },
      source,
      profiles: [{ name: "cpu", engine: "llamacpp" }],
      ...extra,
    });
    const refused = async (body: unknown, param: string, code: string, mention: RegExp, method = "POST", pathname = "/api/v1/models") => {
      const answer = await harness.admin(method, pathname, body);
      assert.equal(answer.status, 400, JSON.stringify(answer.body));
      assert.equal(answer.body.error.param, param);
      assert.equal(answer.body.error.code, code);
      assert.match(answer.body.error.message, mention);
    };
    await refused(
      model({ kind: "file", path: path.join(harness.dataDir, "absent.gguf") }),
      "source.path",
      "weights_missing",
      /absent\.gguf does not exist\. Put the file there/,
    );
    await refused(
      model({ kind: "file", path: cut }),
      "source.path",
      "gguf_truncated",
      /cut\.gguf is truncated: its tensor data ends at byte \d+.*fetch the file again/,
    );
    // The server's own mirror: nothing has been fetched into it.
    await refused(
      model({ kind: "mirror", model: "owner--x", version: "0123456789ab", file: "x.gguf" }),
      "source",
      "weights_not_mirrored",
      /llmgw ctl mirror fetch/,
    );
    assert.equal((await harness.admin("GET", "/api/v1/models/door")).status, 404);

    const good = path.join(harness.dataDir, "good.gguf");
    await writeTinyLlamaGguf({ path: good, seed: 2 });
    assert.equal((await harness.admin("POST", "/api/v1/models", model({ kind: "file", path: good }))).status, 201);
    await refused(
      { profiles: [{ name: "cpu", engine: "llamacpp", parallel: 65 }] },
      "profiles.0.parallel",
      "invalid_field",
      /at most 64/,
      "PATCH",
      "/api/v1/models/door",
    );
    await refused({ source: { kind: "file", path: cut } }, "source.path", "gguf_truncated", /truncated/, "PATCH", "/api/v1/models/door");
    assert.equal((await harness.admin("GET", "/api/v1/models/door")).body.source.path, good);
  });

  test("the audit lists every action with its actor, filtered by action (exact or prefix) and target", async () => {
    const key = await harness.admin("POST", "/api/v1/keys", { name: "audited-key" });
    assert.equal((await harness.admin("DELETE", "/api/v1/keys/audited-key")).status, 200);
    assert.equal(
      (await harness.admin("POST", "/api/v1/models", { name: "audited", profiles: [{ name: "p", engine: "external", url: "http://127.0.0.1:9" }] })).status,
      201,
    );
    assert.equal((await harness.admin("PATCH", "/api/v1/models/audited", { description: "changed" })).status, 200);
    assert.deepEqual((await harness.admin("POST", "/api/v1/models/audited/unpark")).body, { model: "audited", unparked: 0 });

    const all = await harness.admin("GET", "/api/v1/audit?limit=1000");
    const seen = all.body.data.map((e: AuditEntry) => `${e.action} ${e.target} ${e.actor}`);
    for (const expected of [
      `key.create ${key.body.prefix} admin:admin`,
      `key.revoke ${key.body.prefix} admin:admin`,
      "model.create audited admin:admin",
      "model.update audited admin:admin",
      "model.unpark audited admin:admin",
    ]) {
      assert.ok(seen.includes(expected), `${expected} in ${seen.join(", ")}`);
    }
    const keyActions = await harness.admin("GET", "/api/v1/audit?action=key.");
    assert.ok(keyActions.body.data.length >= 2);
    assert.ok(
      keyActions.body.data.every((e: AuditEntry) => e.action.startsWith("key.")),
      "a prefix ending in '.' selects a domain",
    );
    const revokes = await harness.admin("GET", "/api/v1/audit?action=key.revoke");
    assert.deepEqual(
      revokes.body.data.map((e: AuditEntry) => e.target),
      [key.body.prefix],
      "an action without '.' at the end is exact",
    );
    const ofModel = await harness.admin("GET", "/api/v1/audit?target=audited");
    assert.deepEqual(
      ofModel.body.data.map((e: AuditEntry) => e.action),
      ["model.unpark", "model.update", "model.create"],
    );
    assert.deepEqual(ofModel.body.data[0].detail, { replicas: 0 });
    assert.deepEqual((await harness.admin("GET", "/api/v1/audit?action=key")).body.data, [], "no partial word matches");
    assert.deepEqual((await harness.admin("GET", "/api/v1/audit?action=k_y.")).body.data, [], "'_' is no wildcard");
    assert.equal((await harness.admin("GET", "/api/v1/audit?actor=x")).status, 400, "unknown filters are refused");
  });

  test("the last admin key cannot be revoked: 409 saying what to do first", async () => {
    const refused = await harness.admin("DELETE", "/api/v1/keys/admin");
    assert.equal(refused.status, 409);
    assert.equal(refused.body.error.code, "last_admin_key");
    assert.match(refused.body.error.message, /last active admin key.*Create another admin key first \('llmgw ctl key create --name NAME --admin'\)/);
    assert.equal((await harness.admin("GET", "/api/v1/keys")).status, 200, "the admin key still works");
  });

  test("/readyz says ready, with the count of dropped usage rows", async () => {
    const ready = await fetch(`${harness.url}/readyz`);
    assert.equal(ready.status, 200);
    assert.deepEqual(await ready.json(), { status: "ready", usage_rows_dropped: 0 });
  });

  test("the SQLite file and the admin key file are readable by their owner only", () => {
    assert.equal(statSync(path.join(harness.dataDir, "llmgw.db")).mode & 0o777, 0o600);
    assert.equal(statSync(path.join(harness.dataDir, "admin.key")).mode & 0o777, 0o600);
  });
});
