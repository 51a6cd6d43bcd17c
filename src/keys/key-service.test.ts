import assert from "node:assert/strict";
import { test } from "node:test";
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { AuthenticationError, BadRequestError, ConflictError, PermissionDeniedError } from "../core/errors.ts";
import { readAudit } from "../store/audit.ts";
import { hashKey, KeyService } from "./key-service.ts";
import { resetAdminKey } from "./admin-key-reset.ts";
import { testBothDatabases, testBothStores } from "../../test/support/stores.ts";
import { postgresViaProxy } from "../../test/support/postgres-via-proxy.ts";
import { eventually } from "../../test/support/eventually.ts";
import { StorageUnavailableError } from "../store/storage-fault.ts";

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
  await assert.rejects(
    keys.verify(key),
    (e: unknown) => e instanceof AuthenticationError && e.code === "revoked_api_key",
    "revocation applies to the very next request",
  );

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
  await assert.rejects(
    keys.create({ name: "x", expires_at: "2020-01-01T00:00:00Z" }, "t"),
    (e: unknown) => e instanceof BadRequestError && /in the past/.test(e.message),
  );
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

testBothStores("the last active admin key cannot be revoked; with another admin key first it can", async (store) => {
  let now = Date.parse("2026-11-30T10:00:00Z");
  const keys = new KeyService({ store, clock: () => now });
  const first = await keys.create({ name: "root", role: "admin" }, "system:first-start");
  await assert.rejects(
    keys.revoke("root", "admin:root"),
    (e: unknown) =>
      e instanceof ConflictError && e.status === 409 && e.code === "last_admin_key" && /last active admin key.*Create another admin key first/.test(e.message),
  );
  assert.equal((await keys.verifyAdmin(first.key)).name, "root", "the refused revocation changed nothing");

  // An expired admin key opens nothing, so it does not count.
  await keys.create({ name: "temp", role: "admin", expires_at: "2026-11-30T11:00:00Z" }, "admin:root");
  now = Date.parse("2026-11-30T12:00:00Z");
  await assert.rejects(keys.revoke("root", "admin:root"), (e: unknown) => e instanceof ConflictError && e.code === "last_admin_key");

  await keys.create({ name: "second", role: "admin" }, "admin:root");
  await keys.revoke("root", "admin:second");
  await assert.rejects(keys.verify(first.key), AuthenticationError);
  const revocations = await readAudit(store.db, { action: "key.revoke" });
  assert.deepEqual(
    revocations.map((e) => [e.actor, e.target]),
    [["admin:second", first.info.prefix]],
    "only the revocation that happened is audited, with its actor",
  );
});

testBothDatabases("two revocations of the last two admin keys at once leave one admin key", async (database) => {
  // Two servers (two connection pools) on PostgreSQL; on SQLite, one process's store.
  const storeA = await database.open();
  const storeB = storeA.dialect === "postgres" ? await database.open() : storeA;
  try {
    const serverA = new KeyService({ store: storeA });
    const serverB = new KeyService({ store: storeB });
    const one = await serverA.create({ name: "one", role: "admin" }, "t");
    const two = await serverA.create({ name: "two", role: "admin" }, "t");
    const outcomes = await Promise.allSettled([serverA.revoke(one.info.id, "admin:two"), serverB.revoke(two.info.id, "admin:one")]);
    assert.equal(outcomes.filter((o) => o.status === "fulfilled").length, 1, JSON.stringify(outcomes));
    const refused = outcomes.find((o) => o.status === "rejected") as PromiseRejectedResult;
    assert.ok(refused.reason instanceof ConflictError && refused.reason.code === "last_admin_key", String(refused.reason));
    assert.equal(await serverA.hasActiveAdminKey(), true);
  } finally {
    if (storeB !== storeA) await storeB.close();
    await storeA.close();
  }
});

testBothStores("an admin key reset adds a working admin key, rewrites admin.key and is audited", async (store) => {
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-reset-"));
  try {
    const keys = new KeyService({ store });
    const lost = await keys.create({ name: "admin", role: "admin" }, "system:first-start");
    const { key, info, file } = await resetAdminKey({ store, dataDir, clock: () => Date.parse("2026-11-30T10:00:00.123Z") });
    assert.equal(info.name, "admin-reset-2026-11-30T10:00:00Z");
    assert.equal((await keys.verifyAdmin(key)).role, "admin");
    assert.equal(file, path.join(dataDir, "admin.key"));
    assert.equal(readFileSync(file, "utf8"), `${key}\n`);
    assert.equal(statSync(file).mode & 0o777, 0o600);
    const [entry] = await readAudit(store.db, { action: "key.create", target: info.prefix });
    assert.equal(entry?.actor, "system:admin-key-reset");
    assert.doesNotMatch(JSON.stringify(await readAudit(store.db)), new RegExp(key), "the key itself is not audited");
    assert.equal((await keys.verifyAdmin(lost.key)).name, "admin", "the old key stays valid until revoked");
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
});

testBothStores("a key's guards are checked by the given checker, stored, shown, carried on the principal, patched side by side and removed", async (store) => {
  let now = Date.parse("2026-11-30T10:00:00Z");
  const guardModels = new Set(["lg", "jg"]);
  const keys = new KeyService({
    store,
    clock: () => now,
    guardChecker: (guards) => {
      for (const side of ["input", "output"] as const) {
        (guards[side] ?? []).forEach((name, index) => {
          if (!guardModels.has(name)) throw new BadRequestError(`'${name}' is not a guard model`, { code: "invalid_field", param: `guards.${side}.${index}` });
        });
      }
    },
  });
  await assert.rejects(
    keys.create({ name: "bad", guards: { input: ["lg", "chat"] } }, "t"),
    (e: unknown) => e instanceof BadRequestError && e.param === "guards.input.1",
  );
  await assert.rejects(
    keys.create({ name: "bad", guards: { input: ["lg"], extra: [] } }, "t"),
    (e: unknown) => e instanceof BadRequestError && /guards/.test(e.message),
  );
  await assert.rejects(
    keys.create({ name: "bad", guards: { input: ["bad name!"] } }, "t"),
    (e: unknown) => e instanceof BadRequestError && e.param === "guards.input.0",
  );
  assert.deepEqual(await keys.list(), [], "a refused key is not stored");

  const { key, info } = await keys.create({ name: "kiosk", guards: { input: ["lg", "lg"] } }, "admin:root");
  assert.deepEqual(info.guards, { input: ["lg"], output: [] }, "duplicates dropped, the missing side empty");
  const [row] = await store.db.selectFrom("api_keys").select("guards").where("id", "=", info.id).execute();
  assert.deepEqual(JSON.parse(row!.guards!), { input: ["lg"], output: [] });
  assert.deepEqual((await keys.verify(key)).guards, { input: ["lg"], output: [] });
  assert.deepEqual((await keys.get("kiosk")).guards, { input: ["lg"], output: [] });
  const plain = await keys.create({ name: "plain" }, "admin:root");
  assert.equal(plain.info.guards, null);
  assert.equal((await keys.verify(plain.key)).guards, undefined, "a key without guards carries none");
  assert.deepEqual(
    (await keys.guardReferences()).map((reference) => reference.name),
    ["kiosk"],
  );

  // A side given replaces that side; the other stays. The change applies to the very next request.
  await assert.rejects(
    keys.update("kiosk", { guards: { output: ["nope"] } }, "admin:root"),
    (e: unknown) => e instanceof BadRequestError && e.param === "guards.output.0",
  );
  const patched = await keys.update("kiosk", { guards: { output: ["jg"] } }, "admin:root");
  assert.deepEqual(patched.guards, { input: ["lg"], output: ["jg"] });
  assert.deepEqual((await keys.verify(key)).guards, { input: ["lg"], output: ["jg"] });
  const limitsOnly = await keys.update("kiosk", { rpm: 10 }, "admin:root");
  assert.deepEqual(limitsOnly.guards, { input: ["lg"], output: ["jg"] }, "a PATCH without guards keeps them");
  assert.equal(limitsOnly.rpm, 10);
  assert.deepEqual(
    (await readAudit(store.db, { action: "key.update" })).map((entry) => entry.detail),
    [
      { id: info.id, name: "kiosk", rpm: 10 },
      { id: info.id, name: "kiosk", guards: { input: ["lg"], output: ["jg"] } },
    ],
    "newest first: each change audited with what it set",
  );

  // Emptying both sides, or null, removes the guards.
  assert.equal((await keys.update("kiosk", { guards: { input: [], output: [] } }, "admin:root")).guards, null);
  await keys.update("kiosk", { guards: { input: ["jg"] } }, "admin:root");
  assert.deepEqual((await keys.verify(key)).guards, { input: ["jg"], output: [] });
  const removed = await keys.update("kiosk", { guards: null }, "admin:root");
  assert.equal(removed.guards, null);
  assert.equal((await keys.verify(key)).guards, undefined);
  const [cleared] = await store.db.selectFrom("api_keys").select("guards").where("id", "=", info.id).execute();
  assert.equal(cleared!.guards, null);
  assert.deepEqual(await keys.guardReferences(), []);

  // Revoked and expired keys keep no guard in use.
  await keys.update("kiosk", { guards: { input: ["lg"] } }, "admin:root");
  await keys.create({ name: "brief", expires_at: "2026-11-30T11:00:00Z", guards: { output: ["jg"] } }, "admin:root");
  assert.deepEqual(
    (await keys.guardReferences()).map((reference) => [reference.name, reference.guards]),
    [
      ["brief", { input: [], output: ["jg"] }],
      ["kiosk", { input: ["lg"], output: [] }],
    ],
  );
  now = Date.parse("2026-11-30T12:00:00Z");
  await keys.revoke("kiosk", "admin:root");
  assert.deepEqual(await keys.guardReferences(), []);
});

test("while PostgreSQL is cut, keys read within the grace keep working from memory; others get 503 at once; revocations hold", async (t) => {
  const pg = await postgresViaProxy(t);
  if (pg === null) return;
  const other = await pg.direct();
  try {
    let now = Date.parse("2026-11-30T10:00:00Z");
    const keys = new KeyService({ store: pg.store, clock: () => now, keyGraceMs: 60_000 });
    const elsewhere = new KeyService({ store: other, clock: () => now });
    const graced = await keys.create({ name: "graced" }, "t");
    const old = await keys.create({ name: "old" }, "t");
    const revokedHere = await keys.create({ name: "revoked-here" }, "t");
    const revokedElsewhere = await keys.create({ name: "revoked-elsewhere" }, "t");
    const revokedDuring = await keys.create({ name: "revoked-during" }, "t");
    const neverSeen = await keys.create({ name: "never-seen" }, "t");
    for (const { key } of [old, revokedElsewhere]) await keys.verify(key);
    await elsewhere.revoke("revoked-elsewhere", "t");
    // Another server's change reaches this one: the entries stay, marked stale, and are read again in the background.
    keys.forgetCached();
    await eventually("the background re-check after forgetCached", () => !keys.rechecksPending());
    now += 61_000; // `old` was read from the database longer ago than the grace.
    for (const { key } of [graced, revokedHere, revokedDuring]) await keys.verify(key);
    await keys.revoke("revoked-here", "t");

    await pg.cut();
    now += 6000; // Past the cache's 5 s: each key would be read again.
    assert.equal((await keys.verify(graced.key)).name, "graced", "a key read within the grace works while the database is cut");
    const isStorageUnavailable = (e: unknown) => e instanceof StorageUnavailableError && e.status === 503 && e.headers["retry-after"] !== undefined;
    await assert.rejects(keys.verify(old.key), isStorageUnavailable, "a key read longer ago than the grace gets 503");
    await assert.rejects(keys.verify(revokedHere.key), isStorageUnavailable, "a key revoked on this server before the outage stays refused");
    await assert.rejects(keys.verify(revokedElsewhere.key), isStorageUnavailable, "a key revoked elsewhere before the outage stays refused");
    // A database that stops answering altogether: the outage is known, so nothing waits on it.
    await pg.proxy.set("forward");
    await pg.proxy.set("blackhole");
    await assert.rejects(keys.verify(neverSeen.key), isStorageUnavailable, "a key never seen gets 503 without waiting on the database");
    for (let request = 0; request < 20; request += 1) assert.equal((await keys.verify(graced.key)).name, "graced");
    // Revoked on a server that still reaches the database: it applies once this one does too.
    await elsewhere.revoke("revoked-during", "t");
    assert.equal((await keys.verify(revokedDuring.key)).name, "revoked-during", "served from memory until the database answers again");

    await pg.proxy.set("forward");
    await eventually("the never-seen key to work once the database answers", () => keys.verify(neverSeen.key).then((p) => p.name === "never-seen"));
    await eventually("the revocation made during the outage to apply", () =>
      keys.verify(revokedDuring.key).then(
        () => false,
        (e: unknown) => e instanceof AuthenticationError && e.code === "revoked_api_key",
      ),
    );
    assert.equal((await keys.verify(graced.key)).name, "graced");
  } finally {
    await other.close();
    await pg.cleanup();
  }
});

test("with --key-grace 0 a cut database refuses every key that is not fresh in the cache", async (t) => {
  const pg = await postgresViaProxy(t);
  if (pg === null) return;
  try {
    let now = Date.parse("2026-11-30T10:00:00Z");
    const keys = new KeyService({ store: pg.store, clock: () => now, keyGraceMs: 0 });
    const { key } = await keys.create({ name: "app" }, "t");
    await keys.verify(key);
    await pg.cut();
    assert.equal((await keys.verify(key)).name, "app", "within the cache's 5 s nothing is read");
    now += 6000;
    await assert.rejects(keys.verify(key), StorageUnavailableError);
  } finally {
    await pg.cleanup();
  }
});

const isStorageUnavailable = (e: unknown) => e instanceof StorageUnavailableError && e.status === 503;

test("a change another server notified just before the outage leaves the cached keys without grace until they are read again; a resync keeps it", async (t) => {
  const pg = await postgresViaProxy(t);
  if (pg === null) return;
  const other = await pg.direct();
  try {
    let now = Date.parse("2026-11-30T10:00:00Z");
    const keys = new KeyService({ store: pg.store, clock: () => now, keyGraceMs: 60_000 });
    const elsewhere = new KeyService({ store: other, clock: () => now });
    const revoked = await keys.create({ name: "revoked-elsewhere" }, "t");
    const kept = await keys.create({ name: "kept" }, "t");
    for (const { key } of [revoked, kept]) await keys.verify(key);

    await elsewhere.revoke("revoked-elsewhere", "t");
    // Its notification arrives, and the database goes away before the re-check it asks for can read anything.
    await pg.cut();
    keys.forgetCached("notified");
    now += 6000;
    await assert.rejects(keys.verify(revoked.key), isStorageUnavailable, "the revocation seen before the outage holds");
    await assert.rejects(keys.verify(kept.key), isStorageUnavailable, "any key cached then: the change may have been its own revocation");

    await pg.proxy.set("forward");
    await eventually("the re-check to confirm the key that was not revoked", () =>
      keys.verify(kept.key).then(
        (p) => p.name === "kept",
        () => false,
      ),
    );
    await assert.rejects(keys.verify(revoked.key), (e: unknown) => e instanceof AuthenticationError && e.code === "revoked_api_key");

    // The feed's periodic resync says nothing changed: the grace still serves what was read.
    await pg.cut();
    keys.forgetCached("resync");
    now += 6000;
    assert.equal((await keys.verify(kept.key)).name, "kept", "served from memory through the outage");
  } finally {
    await other.close();
    await pg.cleanup();
  }
});

test("re-checks do not keep an unused key in the grace: it leaves the cache once unused for longer than the grace", async (t) => {
  const pg = await postgresViaProxy(t);
  if (pg === null) return;
  try {
    let now = Date.parse("2026-11-30T10:00:00Z");
    const keys = new KeyService({ store: pg.store, clock: () => now, keyGraceMs: 60_000 });
    const unused = await keys.create({ name: "unused" }, "t");
    const busy = await keys.create({ name: "busy" }, "t");
    for (const { key } of [unused, busy]) await keys.verify(key);
    now += 40_000;
    await keys.verify(busy.key);
    keys.forgetCached("resync");
    await eventually("the background re-check", () => !keys.rechecksPending());
    now += 30_000; // `unused`: 70 s without a request, read from the database 30 s ago only if re-checked.
    await keys.verify(busy.key);
    keys.forgetCached("resync");
    assert.equal(keys.cachedKeys(), 1, "the unused key left the cache");
    await eventually("the background re-check", () => !keys.rechecksPending());

    await pg.cut();
    now += 6000;
    assert.equal((await keys.verify(busy.key)).name, "busy", "a key used within the grace works while the database is cut");
    await assert.rejects(keys.verify(unused.key), isStorageUnavailable, "a key unused for longer than the grace gets 503");
  } finally {
    await pg.cleanup();
  }
});

testBothStores("without a change feed, verification drops the keys unused for longer than the grace", async (store) => {
  let now = Date.parse("2026-11-30T10:00:00Z");
  const keys = new KeyService({ store, clock: () => now, keyGraceMs: 60_000 });
  const created = [];
  for (let i = 0; i < 5; i += 1) created.push(await keys.create({ name: `k${i}` }, "t"));
  for (const { key } of created) await keys.verify(key);
  assert.equal(keys.cachedKeys(), 5);
  now += 50_000;
  await keys.verify(created[0]!.key);
  now += 20_000;
  await keys.verify(created[0]!.key);
  assert.equal(keys.cachedKeys(), 1, "the four unused for 70 s are gone; the one in use stays");
});
