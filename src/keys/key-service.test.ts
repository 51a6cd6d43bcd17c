import assert from "node:assert/strict";
import { AuthenticationError, BadRequestError, PermissionDeniedError } from "../core/errors.ts";
import { readAudit } from "../store/audit.ts";
import { hashKey, KeyService } from "./key-service.ts";
import { testBothStores } from "../../test/support/stores.ts";

testBothStores("keys are stored as hashes, verified, limited and revoked at once", async (store) => {
  let now = Date.parse("2026-11-30T10:00:00Z");
  const keys = new KeyService({ store, clock: () => now });
  const { key, info } = await keys.create({ name: "app", allowed_models: ["demo"], expires_at: "2026-12-01T00:00:00Z" }, "admin:root");
  assert.match(key, /^llmgw-[A-Za-z0-9]{40}$/);
  assert.equal(info.prefix, key.slice(0, 12));

  const rows = await store.db.selectFrom("api_keys").selectAll().execute();
  assert.equal(rows[0]?.hash, hashKey(key));
  assert.doesNotMatch(JSON.stringify(rows), new RegExp(key), "the key itself is not stored");
  assert.doesNotMatch(JSON.stringify(await readAudit(store.db)), new RegExp(key), "nor audited");

  const principal = await keys.verify(key);
  assert.equal(principal.role, "client");
  assert.deepEqual([...(principal.allowedModels ?? [])], ["demo"]);
  await assert.rejects(keys.verifyAdmin(key), PermissionDeniedError);
  await assert.rejects(keys.verify(`${key}x`), (e: unknown) => e instanceof AuthenticationError && e.code === "invalid_api_key");
  await assert.rejects(keys.verify(undefined), (e: unknown) => e instanceof AuthenticationError && e.code === "missing_api_key");

  await keys.revoke(info.prefix, "admin:root");
  await assert.rejects(keys.verify(key), (e: unknown) => e instanceof AuthenticationError && e.code === "revoked_api_key", "revocation applies to the very next request");

  const second = await keys.create({ name: "later", expires_at: "2026-11-30T11:00:00Z" }, "admin:root");
  await keys.verify(second.key);
  now = Date.parse("2026-11-30T11:00:01Z");
  await assert.rejects(keys.verify(second.key), (e: unknown) => e instanceof AuthenticationError && e.code === "expired_api_key");
});

testBothStores("a revocation by another server is seen once the cache entry ages out", async (store) => {
  let now = Date.parse("2026-11-30T10:00:00Z");
  const serverA = new KeyService({ store, clock: () => now });
  const serverB = new KeyService({ store, clock: () => now });
  const { key } = await serverA.create({ name: "app" }, "t");
  await serverA.verify(key);
  await serverB.revoke("app", "t");
  now += 6000;
  await assert.rejects(serverA.verify(key), AuthenticationError);
});

testBothStores("bad key requests name the field", async (store) => {
  const keys = new KeyService({ store, clock: () => Date.parse("2026-11-30T10:00:00Z") });
  await assert.rejects(keys.create({ name: "x", role: "root" }, "t"), (e: unknown) => e instanceof BadRequestError && e.param === "role");
  await assert.rejects(keys.create({ name: "x", expires_at: "tomorrow" }, "t"), (e: unknown) => e instanceof BadRequestError && e.param === "expires_at");
  await assert.rejects(keys.create({ name: "x", expires_at: "2020-01-01T00:00:00Z" }, "t"), (e: unknown) => e instanceof BadRequestError && /in the past/.test(e.message));
  await assert.rejects(keys.revoke("nothing", "t"), /No API key matches 'nothing'/);
  assert.equal(await keys.hasActiveAdminKey(), false);
  await keys.create({ name: "root", role: "admin" }, "t");
  assert.equal(await keys.hasActiveAdminKey(), true);
});

testBothStores("an unknown key is remembered briefly, and a key created meanwhile works at once", async (store) => {
  let queries = 0;
  const counted = store.db.withPlugin({
    transformQuery: (args) => {
      if (args.node.kind === "SelectQueryNode") queries += 1;
      return args.node;
    },
    transformResult: async (args) => args.result,
  });
  const keys = new KeyService({ store: { ...store, db: counted } });
  await assert.rejects(keys.verify("llmgw-unknown"), AuthenticationError);
  await assert.rejects(keys.verify("llmgw-unknown"), AuthenticationError);
  assert.equal(queries, 1, "the second try of the same bad key did not query the database");
  const { key } = await keys.create({ name: "fresh" }, "t");
  assert.equal((await keys.verify(key)).name, "fresh");
});
