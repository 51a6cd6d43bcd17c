// A file no running server holds comes from its origin: two servers of a cluster, `a` and
// `b`, on one store, each a real Mirror with its own folder and the real file server on
// loopback (test/support/mirror-servers.ts); the origin is the stand-in Hub
// (test/support/stand-in-hub.ts, the Hugging Face Hub's resolve → CDN protocol) with a
// gated repository. `a` mirrored the file and is then taken for stopped ("live" is a set
// the test changes; it stands for the cluster's heartbeat rows). A node asking `b` is told
// to wait while `b` fetches the file from the Hub with its own token, and is then served
// by `b`, which holds it from then on.
import { after, before, describe } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import type { Store } from "../store/store.ts";
import { eventually } from "../../test/support/eventually.ts";
import { errorOf, nodeRequest as get, twoMirrorServers } from "../../test/support/mirror-servers.ts";
import { fakeCommitSha, startStandInHub, type StandInHub } from "../../test/support/stand-in-hub.ts";
import { testBothStores } from "../../test/support/stores.ts";

const HUB_TOKEN = "hf_token_with_access";
const REPO = "acme/gated-tiny";
const FILE = "tiny-Q4_K_M.gguf";
const CONTENT = randomBytes(300_000);
const SHA256 = createHash("sha256").update(CONTENT).digest("hex");
const REVISION = fakeCommitSha(REPO);
let hub: StandInHub;

before(async () => {
  hub = await startStandInHub({
    repos: [{ name: REPO, gated: "manual", approvedTokens: [HUB_TOKEN], files: [{ path: FILE, content: CONTENT, lfs: true }] }],
  });
});

after(async () => {
  await hub.close();
});

/** The registry's headers for a URL, as HubClient.requestHeaders gives them: the token only on the Hub's own origin. */
function hubHeaders(url: string): Record<string, string> {
  return new URL(url).origin === new URL(hub.url).origin ? { authorization: `Bearer ${HUB_TOKEN}` } : {};
}

/** Servers `a` and `b` on one store: a Mirror each (with the registry's headers for origins) and its file server. */
const twoServers = (store: Store) => twoMirrorServers(store, { originHeaders: hubHeaders });

function holders(store: Store, version: string) {
  return store.db.selectFrom("mirror_holders").select(["server", "sha256"]).where("version", "=", version).orderBy("server").execute();
}

describe("mirror files from their origin", () => {
  testBothStores(
    "a file whose only holder is down: the server asked fetches it from the origin with its token, tells the node to wait meanwhile, then serves it and holds it",
    async (store) => {
      const cluster = await twoServers(store);
      const { a, b } = cluster;
      // Each store of testBothStores is fresh, but the Hub is shared: a version of its own per run.
      const version = `v-${randomBytes(4).toString("hex")}`;
      const resolveUrl = `${hub.url}/${REPO}/resolve/${REVISION}/${FILE}`;
      try {
        const fetched = await a.mirror.fetchVersion({
          model: "gated-tiny",
          version,
          repo: REPO,
          revision: REVISION,
          files: [{ path: FILE, url: resolveUrl, sha256: SHA256, size: CONTENT.length, headers: hubHeaders(resolveUrl) }],
        });
        assert.equal(fetched.complete, true);
        assert.deepEqual(await holders(store, version), [{ server: "a", sha256: SHA256 }]);

        // a stops. The Hub's downloads are slow for a moment, so the node sees the copy under way.
        cluster.live.delete("a");
        hub.setFault({ kind: "delay", ms: 1500, match: "/cdn/", times: 1 });
        const seenBefore = hub.requests.length;
        const filePath = `/mirror/gated-tiny/${version}/${FILE}`;
        const waiting = await get(`${b.url}${filePath}`);
        assert.equal(waiting.status, 503);
        assert.equal(waiting.headers["retry-after"], "2");
        assert.equal(errorOf(waiting).code, "mirror_fetching_from_origin");
        assert.match(errorOf(waiting).message, /no server that holds it is running: 'a' \(not running\)/);
        assert.match(
          errorOf(waiting).message,
          new RegExp(`fetching it from its origin \\(${hub.url.replace(/[.]/g, "\\.")}\\) meanwhile: \\S+ \\S+ of 293 KiB so far`),
        );
        // A second node asking meanwhile waits on the same copy: no second download starts.
        const again = await get(`${b.url}${filePath}`);
        assert.equal(errorOf(again).code, "mirror_fetching_from_origin");

        const served = await eventually("b to serve the file from its own copy", async () => {
          const answer = await get(`${b.url}${filePath}`);
          return answer.status === 200 ? answer : undefined;
        });
        assert.ok(served.body.equals(CONTENT));
        assert.equal(served.headers.etag, `"${SHA256}"`, "the same bytes the first fetch verified");
        assert.equal((await b.mirror.check("gated-tiny", version, FILE)).kind, "ok");
        assert.deepEqual(await holders(store, version), [
          { server: "a", sha256: SHA256 },
          { server: "b", sha256: SHA256 },
        ]);
        // The shared row still describes a's fetch: a copy from the origin is a holder's, like a replication.
        const row = await store.db.selectFrom("mirror_files").selectAll().where("version", "=", version).executeTakeFirstOrThrow();
        assert.deepEqual([row.state, row.fetched_by], ["complete", "a"]);

        // One resolve with b's token (the repository is gated), one CDN download without it.
        const fromB = hub.requests.slice(seenBefore);
        assert.deepEqual(
          fromB.map((r) => [r.path.startsWith("/cdn/") ? "cdn" : r.path, r.authorization ?? null]),
          [
            [`/${REPO}/resolve/${REVISION}/${FILE}`, `Bearer ${HUB_TOKEN}`],
            ["cdn", null],
          ],
        );
      } finally {
        hub.setFault(null);
        await cluster.close();
      }
    },
  );

  testBothStores("when the origin fails too, the node is told why and when the server tries again; a later request tries again", async (store) => {
    const cluster = await twoServers(store);
    const { a, b } = cluster;
    const version = `v-${randomBytes(4).toString("hex")}`;
    const resolveUrl = `${hub.url}/${REPO}/resolve/${REVISION}/${FILE}`;
    try {
      await a.mirror.fetchVersion({
        model: "gated-tiny",
        version,
        repo: REPO,
        revision: REVISION,
        files: [{ path: FILE, url: resolveUrl, sha256: SHA256, size: CONTENT.length, headers: hubHeaders(resolveUrl) }],
      });
      cluster.live.delete("a");
      hub.setFault({ kind: "status", status: 404, match: "/cdn/" });
      const filePath = `/mirror/gated-tiny/${version}/${FILE}`;
      assert.equal(errorOf(await get(`${b.url}${filePath}`)).code, "mirror_fetching_from_origin");
      const failed = await eventually("the copy from the origin to fail", async () => {
        const answer = await get(`${b.url}${filePath}`);
        return errorOf(answer).code === "mirror_holders_down" ? answer : undefined;
      });
      assert.equal(failed.status, 503);
      assert.equal(failed.headers["retry-after"], "5");
      assert.match(
        errorOf(failed).message,
        /Fetching it from its origin \(http:\/\/127\.0\.0\.1:\d+\) failed: .*404.*\. This server tries the origin again on a request in \d+ s\./,
      );
      assert.match(errorOf(failed).message, /Start one of the holders/);
      assert.deepEqual(await holders(store, version), [{ server: "a", sha256: SHA256 }], "b holds nothing it could not verify");
      // A holder back: the node is sent there again at once.
      cluster.live.add("a");
      assert.equal((await get(`${b.url}${filePath}`)).status, 307);
    } finally {
      hub.setFault(null);
      await cluster.close();
    }
  });
});
