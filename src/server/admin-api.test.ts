// The admin API over real HTTP on a real server: who may call it, and what bad input gets.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { statSync } from "node:fs";
import path from "node:path";
import { startHarness, type Harness } from "../../test/support/server-harness.ts";

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
    assert.equal(((await withClient.json()) as any).error.code, "admin_required");
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
    const created = await harness.admin("POST", "/api/v1/models", { name: "ext", aliases: ["nick"], profiles: [{ name: "p", engine: "external", url: "http://127.0.0.1:9", api_key: "upstream-secret" }] });
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

  test("the SQLite file and the admin key file are readable by their owner only", () => {
    assert.equal(statSync(path.join(harness.dataDir, "llmgw.db")).mode & 0o777, 0o600);
    assert.equal(statSync(path.join(harness.dataDir, "admin.key")).mode & 0o777, 0o600);
  });
});
