// Two servers of a cluster sharing one store, each with its own mirror folder and file
// server on loopback: which server holds which file (holder rows), the file server's 307
// to a running holder with a grant (the second hop without the node's key, as our agents
// send it), copying a version from a holder (replicate), what recover() leaves alone, and
// the admin route that asks another server to copy. Weights come from a local folder, as
// in the other mirror tests. "Live" is a set the test changes: it stands for the cluster's
// heartbeat rows (src/cluster/cluster-members.ts), whose liveness the server passes in.
import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { getRequestListener } from "@hono/node-server";
import { Hono } from "hono";
import { AuthenticationError, renderError } from "../core/errors.ts";
import { SecretBox } from "../core/secret-box.ts";
import type { Principal } from "../keys/key-service.ts";
import { listLocalSource } from "../registry/local-source.ts";
import type { Registry } from "../registry/types.ts";
import type { Store } from "../store/store.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { eventually } from "../../test/support/eventually.ts";
import { errorOf, nodeRequest as get, serveMirrorFiles, twoMirrorServers, type OtherRequests } from "../../test/support/mirror-servers.ts";
import { locateWeights } from "../catalog/weights-check.ts";
import { diskStamp } from "./disk-files.ts";
import { MirrorGrants } from "./grants.ts";
import { defaultMirrorModelName, planLocalMirrorFetch } from "./mirror-plan.ts";
import { mountMirrorRoutes, type MirrorRoutesEnv } from "./mirror-routes.ts";
import { Mirror } from "./mirror.ts";

const ADMIN_KEY = "admin-key-for-tests";
const dirs: string[] = [];

after(async () => {
  await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "llmgw-mirror-cluster-"));
  dirs.push(dir);
  return dir;
}

/**
 * Two servers, `a` and `b`, on one store: each a Mirror with its own root and the cluster
 * option, and an HTTP server with the mirror's file server and admin routes (behind a
 * stand-in for the admin-key middleware).
 */
function twoServers(store: Store) {
  return twoMirrorServers(store, { otherRequests: adminRoutes });
}

/** The mirror's admin routes as a server mounts them, behind a stand-in for the admin-key middleware. */
function adminRoutes(mirror: Mirror): OtherRequests {
  const app = new Hono<MirrorRoutesEnv>();
  app.onError((error, c) => {
    const rendered = renderError(error);
    return c.json(rendered.body, rendered.status as 400, rendered.headers);
  });
  // The key must reach every server that acts.
  app.use("/api/v1/*", async (c, next) => {
    if (c.req.header("authorization") !== `Bearer ${ADMIN_KEY}`) throw new AuthenticationError("Not the admin key.");
    const principal: Principal = { keyId: "k1", name: "admin", role: "admin", allowedModels: null, expiresAt: null };
    c.set("principal", principal);
    await next();
  });
  mountMirrorRoutes(app, { mirror, registry: {} as Registry });
  return getRequestListener(app.fetch);
}

/** A local folder with one file, planned as a fetch. */
async function localVersion(name: string, size = 200_000) {
  const dir = await tempDir();
  const content = randomBytes(size);
  await writeFile(path.join(dir, name), content);
  const listing = await listLocalSource({ source: dir });
  const made = planLocalMirrorFetch({ listing, chosen: { files: listing.files } });
  const model = defaultMirrorModelName(listing.repo);
  return {
    content,
    sha256: createHash("sha256").update(content).digest("hex"),
    file: name,
    args: { model, version: made.version, repo: made.repo, revision: made.revision, files: made.files },
  };
}

function holderRows(store: Store, model: string, version: string) {
  return store.db.selectFrom("mirror_holders").selectAll().where("model", "=", model).where("version", "=", version).orderBy("server").execute();
}

describe("mirror in a cluster", () => {
  testBothStores(
    "a file fetched by one server is served by it; the other redirects there with a grant, and answers 503 when it is not running",
    async (store) => {
      const cluster = await twoServers(store);
      const { a, b } = cluster;
      try {
        const v = await localVersion("model-Q4_K_M.gguf");
        const { model, version } = v.args;
        assert.equal((await a.mirror.fetchVersion(v.args)).complete, true);
        const row = await store.db.selectFrom("mirror_files").selectAll().where("model", "=", model).executeTakeFirstOrThrow();
        assert.equal(row.fetched_by, "a");
        const holders = await holderRows(store, model, version);
        assert.deepEqual(
          holders.map((h) => [h.server, h.sha256, Number(h.size)]),
          [["a", v.sha256, v.content.length]],
        );

        assert.equal((await a.mirror.check(model, version, v.file)).kind, "ok");
        const elsewhere = await b.mirror.check(model, version, v.file);
        assert.equal(elsewhere.kind, "elsewhere");
        assert.ok(elsewhere.kind === "elsewhere");
        assert.deepEqual(
          elsewhere.holders.map((h) => [h.name, h.url, h.live]),
          [["a", a.url, true]],
        );
        assert.equal(elsewhere.sha256, v.sha256);
        assert.equal(await b.mirror.lookup(model, version, v.file), null);
        // The listing of either server shows the file complete, held by a.
        for (const server of [a, b])
          assert.deepEqual(
            (await server.mirror.list()).map((f) => [f.state, f.holders]),
            [["complete", ["a"]]],
          );
        // A catalog model on b cannot use weights only a holds: the refusal says how to copy them.
        await assert.rejects(
          locateWeights({ source: { kind: "mirror", model, version, file: v.file }, modelName: "m", mirror: b.mirror }),
          (error: Error & { code?: string }) => {
            assert.equal(error.code, "weights_on_other_server");
            assert.match(error.message, new RegExp(`llmgw ctl mirror replicate ${model} ${version} --to b`));
            return true;
          },
        );

        const filePath = `/mirror/${model}/${version}/${v.file}`;
        assert.equal((await get(`${b.url}${filePath}`, { key: null })).status, 401, "the first hop still needs the node's key");
        const redirect = await get(`${b.url}${filePath}`);
        assert.equal(redirect.status, 307);
        const location = redirect.headers.location as string;
        assert.ok(location.startsWith(`${a.url}${filePath}?grant=`), location);
        assert.equal(redirect.headers.etag, `"${v.sha256}"`);
        assert.equal((await get(`${b.url}${filePath}`, { headers: { "if-none-match": `"${v.sha256}"` } })).status, 304);

        // The second hop, without the key (the client drops it across origins): the grant is enough.
        const whole = await get(location, { key: null });
        assert.equal(whole.status, 200);
        assert.ok(whole.body.equals(v.content));
        const part = await get(location, { key: null, headers: { range: "bytes=100-199" } });
        assert.equal(part.status, 206);
        assert.ok(part.body.equals(v.content.subarray(100, 200)));

        const grant = new URL(location).searchParams.get("grant") as string;
        const tampered = `${grant.slice(0, -1)}${grant.endsWith("0") ? "1" : "0"}`;
        const bad = await get(`${a.url}${filePath}?grant=${tampered}`, { key: null });
        assert.equal(bad.status, 403);
        assert.equal(errorOf(bad).code, "mirror_grant_invalid");
        // A grant names one file: it opens no other.
        await writeFile(path.join(path.dirname(path.join(a.root, model, version, v.file)), "other.bin"), "x");
        assert.equal((await get(`${a.url}/mirror/${model}/${version}/other.bin?grant=${grant}`, { key: null })).status, 403);
        const stale = new MirrorGrants(
          (text) => cluster.box.mac(text),
          () => Date.now() - 3_600_000,
        ).sign(model, version, v.file);
        const expired = await get(`${a.url}${filePath}?grant=${stale}`, { key: null });
        assert.equal(expired.status, 403);
        assert.equal(errorOf(expired).code, "mirror_grant_expired");
        // A grant signed under another cluster secret is refused.
        const foreign = new MirrorGrants((text) => SecretBox.fromKey(randomBytes(32)).mac(text)).sign(model, version, v.file);
        assert.equal((await get(`${a.url}${filePath}?grant=${foreign}`, { key: null })).status, 403);

        // a stops: b cannot send anyone there, and says so.
        await store.db
          .insertInto("cluster_members")
          .values({
            name: "a",
            instance: "i",
            data_dir_id: "d",
            url: a.url,
            version: "test",
            secret_check: "s",
            started_at: "2025-01-01T00:00:00.000Z",
            last_seen: "2025-01-02T03:04:05.000Z",
            stopped_at: null,
          })
          .execute();
        cluster.live.delete("a");
        const down = await get(`${b.url}${filePath}`);
        assert.equal(down.status, 503);
        assert.equal(down.headers["retry-after"], "5");
        assert.equal(errorOf(down).code, "mirror_holders_down");
        assert.match(errorOf(down).message, /'a' \(not running, last seen 2025-01-02T03:04:05.000Z\)/);
      } finally {
        await cluster.close();
      }
    },
  );

  testBothStores("replicate copies a version from its holder, verified; a corrupted source copy is refused with a sha256 mismatch", async (store) => {
    const cluster = await twoServers(store);
    const { a, b } = cluster;
    try {
      const v = await localVersion("model-Q8_0.gguf", 300_000);
      const { model, version } = v.args;
      await a.mirror.fetchVersion(v.args);
      const events: string[] = [];
      const summary = await b.mirror.replicate(model, version, { onProgress: (event) => events.push(event.state) });
      assert.deepEqual(
        [summary.server, summary.complete, summary.copied, summary.alreadyHeld, summary.failed, summary.bytesCopied],
        ["b", true, 1, 0, 0, v.content.length],
      );
      assert.equal(summary.files[0]?.from, "a");
      assert.ok(events.includes("complete"), events.join(","));
      assert.deepEqual(
        (await holderRows(store, model, version)).map((h) => [h.server, h.sha256]),
        [
          ["a", v.sha256],
          ["b", v.sha256],
        ],
      );
      const found = await b.mirror.check(model, version, v.file);
      assert.equal(found.kind, "ok");
      assert.ok(found.kind === "ok" && found.path.startsWith(b.root + path.sep));
      assert.ok((await readFile(path.join(b.root, model, version, v.file))).equals(v.content));
      // The shared row still describes a's fetch.
      assert.equal((await store.db.selectFrom("mirror_files").select("fetched_by").where("model", "=", model).executeTakeFirstOrThrow()).fetched_by, "a");
      // b serves it itself now.
      const served = await get(`${b.url}/mirror/${model}/${version}/${v.file}`);
      assert.equal(served.status, 200);
      assert.ok(served.body.equals(v.content));
      // A fetch of the version on b finds it held there: nothing is fetched, and the row stays a's.
      const fetchedOnB = await b.mirror.fetchVersion(v.args);
      assert.deepEqual([fetchedOnB.complete, fetchedOnB.skipped, fetchedOnB.fetched], [true, 1, 0]);
      assert.equal((await store.db.selectFrom("mirror_files").select("fetched_by").where("model", "=", model).executeTakeFirstOrThrow()).fetched_by, "a");
      const again = await b.mirror.replicate(model, version);
      assert.deepEqual([again.copied, again.alreadyHeld], [0, 1]);
      // A verification on b checks b's copy against its holder row and leaves the row alone.
      const verified = await b.mirror.verify({ model, version });
      assert.deepEqual([verified.ok, verified.failed], [1, 0]);

      // a's copy goes bad: a's verification drops only a's holder row; the row stays complete for b, and a sends nodes to b.
      await writeFile(path.join(a.root, model, version, v.file), randomBytes(v.content.length));
      const verifiedOnA = await a.mirror.verify({ model, version });
      assert.deepEqual([verifiedOnA.ok, verifiedOnA.failed], [0, 1]);
      assert.match(verifiedOnA.files[0]?.message ?? "", /'b' holds verified copies/);
      assert.equal((await store.db.selectFrom("mirror_files").select("state").where("model", "=", model).executeTakeFirstOrThrow()).state, "complete");
      assert.deepEqual(
        (await holderRows(store, model, version)).map((h) => h.server),
        ["b"],
      );
      const toB = await get(`${a.url}/mirror/${model}/${version}/${v.file}`);
      assert.equal(toB.status, 307);
      assert.ok((toB.headers.location as string).startsWith(`${b.url}/`));
      // A fetch of the version on a copies it back from b instead of going to the source again.
      const refetched = await a.mirror.fetchVersion(v.args);
      assert.deepEqual([refetched.complete, refetched.fetched], [true, 1]);
      assert.deepEqual(
        (await holderRows(store, model, version)).map((h) => h.server),
        ["a", "b"],
      );
      assert.ok((await readFile(path.join(a.root, model, version, v.file))).equals(v.content));
      assert.equal((await a.mirror.check(model, version, v.file)).kind, "ok");
      assert.equal((await b.mirror.check(model, version, v.file)).kind, "ok");

      // A delete on a removes every holder row and a's files; b's files go at b's next start.
      await a.mirror.deleteVersion(model, version);
      assert.deepEqual(await holderRows(store, model, version), []);
      assert.equal(existsSync(path.join(a.root, model, version)), false);
      assert.equal(existsSync(path.join(b.root, model, version)), true);
      assert.equal((await b.mirror.recover()).orphans, 1);
      assert.equal(existsSync(path.join(b.root, model, version)), false);

      // Bit rot on a's disk: other bytes, the same size and stat, so a still vouches for them.
      const w = await localVersion("model-F16.gguf", 250_000);
      await a.mirror.fetchVersion(w.args);
      const onA = path.join(a.root, w.args.model, w.args.version, w.file);
      await writeFile(onA, randomBytes(250_000));
      const stamp = await diskStamp(onA);
      await store.db
        .updateTable("mirror_files")
        .set({ verified_mtime_ns: stamp?.mtimeNs ?? null })
        .where("model", "=", w.args.model)
        .execute();
      const refused = await b.mirror.replicate(w.args.model, w.args.version);
      assert.deepEqual([refused.complete, refused.copied, refused.failed], [false, 0, 1]);
      assert.equal(refused.files[0]?.error?.code, "mirror_checksum_mismatch");
      assert.match(refused.files[0]?.error?.message ?? "", /Checksum mismatch/);
      assert.deepEqual(
        (await holderRows(store, w.args.model, w.args.version)).map((h) => h.server),
        ["a"],
      );
      assert.equal(existsSync(path.join(b.root, w.args.model, w.args.version, w.file)), false);
      assert.equal((await b.mirror.check(w.args.model, w.args.version, w.file)).kind, "elsewhere");

      // No running holder: refused before anything is copied.
      cluster.live.delete("a");
      await assert.rejects(b.mirror.replicate(w.args.model, w.args.version), (error: Error & { code?: string; status?: number }) => {
        assert.equal(error.code, "mirror_holders_down");
        assert.equal(error.status, 503);
        return true;
      });
    } finally {
      await cluster.close();
    }
  });

  testBothStores(
    "recover() leaves other servers' rows alone, claims its own rows from before holders, and removes folders of deleted versions",
    async (store) => {
      const cluster = await twoServers(store);
      const { a, b } = cluster;
      try {
        // a fetches right now (as far as the rows say): b's start must not touch it.
        const now = new Date().toISOString();
        const fetching = { model: "owner--busy", version: "0123456789ab", file: "big.gguf" };
        await store.db
          .insertInto("mirror_files")
          .values({
            ...fetching,
            repo: "owner/busy",
            revision: "0123456789abcdef",
            state: "fetching",
            sha256: null,
            actual_sha256: null,
            bytes_done: 1000,
            bytes_total: 5000,
            error: null,
            source_url: "https://example.invalid/big.gguf",
            verified_size: null,
            verified_mtime_ns: null,
            verified_at: null,
            created_at: now,
            updated_at: now,
            fetched_by: "a",
          })
          .execute();
        // A version deleted by a while b was down: b's folder of it has no rows.
        const orphan = path.join(b.root, "owner--gone", "fedcba987654");
        await mkdir(orphan, { recursive: true });
        await writeFile(path.join(orphan, "w.gguf"), "old bytes");
        const recovered = await b.mirror.recover();
        assert.equal(recovered.interrupted, 0);
        assert.equal(recovered.orphans, 1);
        assert.equal(existsSync(orphan), false);
        const row = await store.db.selectFrom("mirror_files").selectAll().where("model", "=", fetching.model).executeTakeFirstOrThrow();
        assert.deepEqual([row.state, row.bytes_done, row.fetched_by, row.error], ["fetching", 1000, "a", null]);
        // a's own start does repair it.
        assert.equal((await a.mirror.recover()).interrupted, 1);
        assert.equal(
          (await store.db.selectFrom("mirror_files").select("state").where("model", "=", fetching.model).executeTakeFirstOrThrow()).state,
          "pending",
        );

        // A file fetched before holders existed (a single server, no cluster option) on a's disk: a's start claims it.
        const v = await localVersion("model-Q2_K.gguf");
        const single = new Mirror({ store, root: a.root, retries: 0 });
        try {
          await single.fetchVersion(v.args);
        } finally {
          await single.close();
        }
        assert.deepEqual(await holderRows(store, v.args.model, v.args.version), []);
        const claimedByB = await b.mirror.recover();
        assert.equal(claimedByB.claimed, 0, "b does not have the file: the row is not b's");
        assert.equal(claimedByB.missing, 0, "nor does b call it missing: it is a's");
        const claimed = await a.mirror.recover();
        assert.equal(claimed.claimed, 1);
        assert.deepEqual(
          (await holderRows(store, v.args.model, v.args.version)).map((h) => h.server),
          ["a"],
        );
        assert.equal((await b.mirror.check(v.args.model, v.args.version, v.file)).kind, "elsewhere");
      } finally {
        await cluster.close();
      }
    },
  );

  testBothStores("POST /api/v1/mirror/replicate on one server makes another copy; unknown servers are named", async (store) => {
    const cluster = await twoServers(store);
    const { a, b } = cluster;
    try {
      const v = await localVersion("model-Q5_K_M.gguf");
      const { model, version } = v.args;
      await a.mirror.fetchVersion(v.args);
      const admin = { key: ADMIN_KEY };
      // Asked on a to copy to b: a passes it to b with the caller's key, and b copies.
      const started = await get(`${a.url}/api/v1/mirror/replicate`, { ...admin, method: "POST", body: { model, version, to: "b" } });
      assert.equal(started.status, 202, started.body.toString());
      const run = (JSON.parse(started.body.toString()) as { runs: Array<{ server: string; state: string }> }).runs[0];
      assert.equal(run?.server, "b");
      const progress = `${a.url}/api/v1/mirror/replicate/${model}/${version}?server=b`;
      const state = await eventually("the copy to b to finish", async () => {
        const shown = (JSON.parse((await get(progress, admin)).body.toString()) as { state: string }).state;
        return shown === "running" ? undefined : shown;
      });
      assert.equal(state, "done");
      assert.deepEqual(
        (await holderRows(store, model, version)).map((h) => h.server),
        ["a", "b"],
      );
      const audit = await store.db.selectFrom("audit_log").selectAll().where("action", "=", "mirror.replicate").execute();
      assert.equal(audit.length, 1);
      assert.equal(JSON.parse(audit[0]?.detail ?? "{}").server, "b");
      // Everyone holds it: "all" has nothing to do.
      const all = await get(`${b.url}/api/v1/mirror/replicate`, { ...admin, method: "POST", body: { model, version, to: "all" } });
      assert.equal(all.status, 200);
      assert.deepEqual((JSON.parse(all.body.toString()) as { runs: unknown[] }).runs, []);
      const unknown = await get(`${a.url}/api/v1/mirror/replicate`, { ...admin, method: "POST", body: { model, version, to: "nobody" } });
      assert.equal(unknown.status, 404);
      assert.match(errorOf(unknown).message, /llmgw ctl cluster status/);
    } finally {
      await cluster.close();
    }
  });
});

describe("mirror on a single server", () => {
  testBothStores("without the cluster option nothing about holders is written, grants mean nothing, and replicate is refused", async (store) => {
    const root = path.join(await tempDir(), "mirror");
    const mirror = new Mirror({ store, root, retries: 0 });
    const files = await serveMirrorFiles(mirror);
    try {
      const v = await localVersion("model-Q4_0.gguf");
      const { model, version } = v.args;
      assert.equal((await mirror.fetchVersion(v.args)).complete, true);
      assert.equal(mirror.cluster, null);
      assert.equal((await store.db.selectFrom("mirror_files").select("fetched_by").executeTakeFirstOrThrow()).fetched_by, null);
      assert.deepEqual(await holderRows(store, model, version), []);
      assert.equal((await mirror.check(model, version, v.file)).kind, "ok");
      assert.deepEqual(
        (await mirror.list()).map((f) => [f.state, f.holders]),
        [["complete", []]],
      );
      assert.deepEqual(await mirror.recover(), { interrupted: 0, missing: 0, unconfirmed: 0 });
      await assert.rejects(mirror.replicate(model, version), { code: "mirror_not_clustered" });
      const url = `${files.url}/mirror/${model}/${version}/${v.file}`;
      assert.equal((await get(`${url}?grant=1.${"0".repeat(64)}`, { key: null })).status, 401);
      const served = await get(url);
      assert.equal(served.status, 200);
      assert.ok(served.body.equals(v.content));
    } finally {
      await mirror.close();
      await files.close();
    }
  });
});

test("grants: the MAC covers the path and the expiry", () => {
  const box = SecretBox.fromKey(randomBytes(32));
  let now = 1_700_000_000_000;
  const grants = new MirrorGrants(
    (text) => box.mac(text),
    () => now,
  );
  const grant = grants.sign("m", "v", "f.gguf");
  assert.match(grant, /^1700000600\.[0-9a-f]{64}$/);
  grants.check(grant, "m", "v", "f.gguf");
  assert.throws(() => grants.check(grant, "m", "v", "g.gguf"), { code: "mirror_grant_invalid" });
  assert.throws(() => grants.check(grant.replace(/^\d+/, "1700009999"), "m", "v", "f.gguf"), { code: "mirror_grant_invalid" });
  now += 601_000;
  assert.throws(() => grants.check(grant, "m", "v", "f.gguf"), { code: "mirror_grant_expired" });
});
