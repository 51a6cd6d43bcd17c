// Integrity of the mirror's complete files against the stand-in hub (test/support/stand-in-hub.ts,
// standing for huggingface.co and its CDN), with real files in temp dirs and both
// databases: a complete file stays what was verified, or stops being presented as
// complete (listings, lookups), is hashed again by the next fetch or by `verify`, and
// a mismatch fails it with both hashes. Deletes are audited.
import { after, before, describe } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { BadRequestError, ConflictError, LlmgwError } from "../core/errors.ts";
import { HubClient } from "../registry/hub-client.ts";
import type { RepoInfo } from "../registry/types.ts";
import { readAudit } from "../store/audit.ts";
import type { Store } from "../store/store.ts";
import { eventually } from "../../test/support/eventually.ts";
import { startStandInHub, type StandInHub } from "../../test/support/stand-in-hub.ts";
import { GGUF_REPO, buildStandInRepos } from "../../test/support/stand-in-repos.ts";
import { testBothDatabases, testBothStores } from "../../test/support/stores.ts";
import { Mirror, type MirrorOptions } from "./mirror.ts";
import { planMirrorFetch } from "./mirror-plan.ts";

const MODEL = "llmgw-test--tiny-llama-GGUF";
const Q4 = "tiny-llama-Q4_K_M.gguf";

let hub: StandInHub;
let registry: HubClient;
let ggufInfo: RepoInfo;
const roots: string[] = [];

before(async () => {
  hub = await startStandInHub({ repos: (await buildStandInRepos()).all });
  registry = new HubClient({ endpoint: hub.url, retries: 0 });
  ggufInfo = await registry.repoInfo({ repo: GGUF_REPO });
});

after(async () => {
  await registry.close();
  await hub.close();
  await Promise.all(roots.map((root) => rm(root, { recursive: true, force: true })));
});

async function tempRoot(): Promise<string> {
  const root = await mkdtemp(path.join(tmpdir(), "llmgw-mirror-integrity-"));
  roots.push(root);
  return root;
}

function mirrorFor(store: Store, root: string, options: Partial<MirrorOptions> = {}): Mirror {
  return new Mirror({ store, root, retries: 0, headersTimeoutMs: 5000, bodyTimeoutMs: 5000, ...options });
}

function repoFile(pathInRepo: string) {
  const file = ggufInfo.files.find((f) => f.path === pathInRepo);
  assert.ok(file, `no ${pathInRepo} in ${ggufInfo.repo}`);
  return file;
}

/** The fetchVersion arguments for some files of the stand-in GGUF repository. */
function plan(paths: string[]) {
  const made = planMirrorFetch({ registry, repoInfo: ggufInfo, chosen: { files: paths.map(repoFile) } });
  return { model: MODEL, version: made.version, repo: made.repo, revision: made.revision, files: made.files };
}

function cdnRequests(since: number) {
  return hub.requests.slice(since).filter((r) => r.path.startsWith("/cdn/"));
}

async function sha256Of(file: string): Promise<string> {
  return createHash("sha256")
    .update(await readFile(file))
    .digest("hex");
}

/** Changes one byte of a file in place (same size) and gives it a distinct mtime, as an editor or a bad disk would. */
async function tamper(file: string): Promise<void> {
  const bytes = await readFile(file);
  bytes[bytes.length >> 1] = (bytes[bytes.length >> 1] ?? 0) ^ 0xff;
  await writeFile(file, bytes);
  const later = new Date(Date.now() + 120_000);
  await utimes(file, later, later);
}

describe("integrity", () => {
  testBothStores(
    "a same-size change on disk is not served under the old sha256; verify marks it failed with both hashes; restored bytes verify again",
    async (store) => {
      const mirror = mirrorFor(store, await tempRoot());
      try {
        const args = plan([Q4, "README.md"]);
        assert.equal((await mirror.fetchVersion(args)).complete, true);
        const final = path.join(mirror.root, MODEL, args.version, Q4);
        const good = await readFile(final);
        const published = repoFile(Q4).sha256 as string;

        const clean = await mirror.verify({ model: MODEL, version: args.version });
        assert.deepEqual([clean.ok, clean.failed, clean.skipped], [2, 0, 0]);
        assert.deepEqual(clean.files.find((f) => f.file === Q4)?.actualSha256, published);

        await tamper(final);
        const tampered = await sha256Of(final);
        // A stat is enough to stop presenting it: the lookup the file server and the agent use refuses it.
        assert.equal(await mirror.lookup(MODEL, args.version, Q4), null);
        const refused = await mirror.check(MODEL, args.version, Q4);
        assert.equal(refused.kind, "refused");
        assert.equal(refused.kind === "refused" && refused.error.status, 409);
        assert.match(
          refused.kind === "refused" ? refused.error.message : "",
          /modified on disk .* after its bytes were verified .*ctl mirror verify llmgw-test--tiny-llama-GGUF/,
        );
        const listed = (await mirror.list()).find((r) => r.file === Q4);
        assert.equal(listed?.state, "failed", "a changed file is not listed complete");

        const events: string[] = [];
        const checked = await mirror.verify({ model: MODEL, onProgress: (e) => events.push(e.file) });
        assert.deepEqual([checked.ok, checked.failed], [1, 1]);
        assert.ok(events.includes(Q4), "hashing reports progress");
        const failed = checked.files.find((f) => f.file === Q4);
        assert.deepEqual([failed?.result, failed?.expectedSha256, failed?.actualSha256], ["failed", published, tampered]);
        const [row] = (await mirror.list()).filter((r) => r.file === Q4);
        assert.equal(row?.state, "failed");
        assert.ok(row?.error?.includes(published) && row.error.includes(tampered), row?.error ?? "");
        const afterVerify = await mirror.check(MODEL, args.version, Q4);
        assert.equal(afterVerify.kind === "refused" && afterVerify.error.code, "mirror_file_failed");
        assert.ok(afterVerify.kind === "refused" && afterVerify.error.message.includes(tampered));

        // The operator puts the right bytes back: verifying again makes it complete and served.
        await writeFile(final, good);
        const restored = await mirror.verify({ model: MODEL, version: args.version });
        assert.deepEqual([restored.ok, restored.failed], [2, 0]);
        assert.equal((await mirror.lookup(MODEL, args.version, Q4))?.sha256, published);
      } finally {
        await mirror.close();
      }
    },
  );

  testBothStores("a file whose refetch failed (no digest recorded) verifies against the published sha256 and is served again", async (store) => {
    const mirror = mirrorFor(store, await tempRoot());
    try {
      const args = plan([Q4]);
      assert.equal((await mirror.fetchVersion(args)).complete, true);
      // As a refetch that failed on the network leaves the row: failed, its digest cleared,
      // the good bytes still on disk under the final name.
      await store.db
        .updateTable("mirror_files")
        .set({ state: "failed", actual_sha256: null, error: "The source dropped the connection." })
        .where("model", "=", MODEL)
        .where("file", "=", Q4)
        .execute();
      assert.equal(await mirror.lookup(MODEL, args.version, Q4), null);
      const verified = await mirror.verify({ model: MODEL, version: args.version });
      assert.deepEqual([verified.ok, verified.failed, verified.skipped], [1, 0, 0]);
      assert.equal((await mirror.lookup(MODEL, args.version, Q4))?.sha256, repoFile(Q4).sha256, "reported ok and served again, not ok and still refused");
    } finally {
      await mirror.close();
    }
  });

  testBothStores(
    "a fetch of a complete version hashes a touched file again: unchanged bytes are kept without a download, changed bytes are fetched anew",
    async (store) => {
      const mirror = mirrorFor(store, await tempRoot());
      try {
        const args = plan([Q4]);
        assert.equal((await mirror.fetchVersion(args)).complete, true);
        const final = path.join(mirror.root, MODEL, args.version, Q4);

        const later = new Date(Date.now() + 60_000);
        await utimes(final, later, later);
        assert.equal(await mirror.lookup(MODEL, args.version, Q4), null, "not served until hashed again");
        let since = hub.requests.length;
        const touched = await mirror.fetchVersion(args);
        assert.deepEqual([touched.complete, touched.files[0]?.skipped, touched.files[0]?.reverified], [true, true, true]);
        assert.equal(hub.requests.length, since, "the bytes still matched: nothing was downloaded");
        assert.equal((await mirror.lookup(MODEL, args.version, Q4))?.path, final, "served again once hashed");

        await tamper(final);
        since = hub.requests.length;
        const changed = await mirror.fetchVersion(args);
        assert.equal(changed.complete, true, JSON.stringify(changed.files[0]?.error));
        assert.deepEqual([changed.files[0]?.skipped, changed.files[0]?.bytesFetched], [false, repoFile(Q4).size]);
        assert.deepEqual(
          cdnRequests(since).map((r) => r.range),
          [undefined],
          "the changed bytes were replaced from the first byte",
        );
        assert.equal(await sha256Of(final), repoFile(Q4).sha256);
      } finally {
        await mirror.close();
      }
    },
  );

  testBothStores("a file gone from disk is not listed complete, is not served, and fails verification", async (store) => {
    const mirror = mirrorFor(store, await tempRoot());
    try {
      const args = plan([Q4, "README.md"]);
      assert.equal((await mirror.fetchVersion(args)).complete, true);
      await rm(path.join(mirror.root, MODEL, args.version, Q4));
      const rows = await mirror.list();
      assert.deepEqual(
        rows.map((r) => [r.file, r.state]),
        [
          ["README.md", "complete"],
          [Q4, "failed"],
        ],
      );
      assert.match(rows[1]?.error ?? "", /missing on disk/);
      const check = await mirror.check(MODEL, args.version, Q4);
      assert.deepEqual(check.kind === "refused" && [check.error.status, check.error.code], [404, "mirror_file_missing"]);
      const verified = await mirror.verify();
      assert.deepEqual([verified.ok, verified.failed], [1, 1]);
      assert.match(verified.files.find((f) => f.file === Q4)?.message ?? "", /missing on disk/);
    } finally {
      await mirror.close();
    }
  });

  testBothStores("verify skips files being fetched, and refuses a scope it has nothing for", async (store) => {
    const mirror = mirrorFor(store, await tempRoot());
    hub.setFault({ kind: "hang", match: "/cdn/" });
    try {
      const args = plan([Q4]);
      const fetching = mirror.fetchVersion(args);
      fetching.catch(() => undefined);
      await eventually("the download to start", async () => (await mirror.list())[0]?.state === "fetching");
      const during = await mirror.verify({ model: MODEL });
      assert.deepEqual(
        during.files.map((f) => [f.file, f.result]),
        [[Q4, "skipped"]],
      );
      assert.match(during.files[0]?.message ?? "", /being fetched/);
      await assert.rejects(
        mirror.deleteVersion(MODEL, args.version),
        (error: unknown) => error instanceof ConflictError && error.code === "mirror_version_busy",
      );
      await assert.rejects(mirror.verify({ model: "nobody" }), (error: unknown) => error instanceof LlmgwError && error.status === 404);
      await assert.rejects(mirror.verify({ version: args.version }), (error: unknown) => error instanceof BadRequestError && error.param === "model");
    } finally {
      hub.setFault(null);
      await mirror.close();
    }
  });

  testBothDatabases("recover() stamps complete rows verified before stamps existed, so a later change is noticed", async (database) => {
    const root = await tempRoot();
    const store = await database.open();
    try {
      const args = plan([Q4]);
      let mirror = mirrorFor(store, root);
      assert.equal((await mirror.fetchVersion(args)).complete, true);
      await mirror.close();
      // Stands for a row written before migration 0003: complete, with no stamp.
      await store.db.updateTable("mirror_files").set({ verified_size: null, verified_mtime_ns: null, verified_at: null }).execute();
      mirror = mirrorFor(store, root);
      assert.ok((await mirror.lookup(MODEL, args.version, Q4)) !== null, "an unstamped row is served on its size, as before");
      await mirror.recover();
      assert.notEqual((await mirror.list())[0]?.verifiedAt, null);
      const later = new Date(Date.now() + 60_000);
      await utimes(path.join(root, MODEL, args.version, Q4), later, later);
      assert.equal(await mirror.lookup(MODEL, args.version, Q4), null);
      await mirror.close();
    } finally {
      await store.close();
    }
  });

  testBothStores("a delete with an actor is audited with the rows it removed; a delete of nothing records nothing", async (store) => {
    const mirror = mirrorFor(store, await tempRoot());
    try {
      const args = plan([Q4, "README.md"]);
      await mirror.fetchVersion(args);
      await mirror.deleteVersion(MODEL, args.version, { actor: "admin:ops", force: true, usedBy: ["tiny"] });
      await assert.rejects(
        mirror.deleteVersion(MODEL, args.version, { actor: "admin:ops" }),
        (error: unknown) => error instanceof LlmgwError && error.status === 404,
      );
      const entries = await readAudit(store.db, { action: "mirror." });
      assert.deepEqual(
        entries.map((e) => [e.actor, e.action, e.target, e.detail]),
        [["admin:ops", "mirror.delete", `${MODEL}/${args.version}`, { bytes: repoFile(Q4).size + 69, force: true, used_by: ["tiny"], files: 2 }]],
      );
    } finally {
      await mirror.close();
    }
  });
});
