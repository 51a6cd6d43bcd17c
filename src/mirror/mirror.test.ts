// The mirror against the stand-in hub (test/support/stand-in-hub.ts) over real HTTP on
// loopback, with real files in temp dirs and both databases. The stand-in stands for
// huggingface.co: resolve URLs answer LFS files with a 302 to a CDN on another host name,
// the CDN serves bytes with Range, and its faults stand for what a real registry does
// (a connection dropped mid-body, a reset, an answer that never comes, corrupted bytes).
import { after, before, describe } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { createWriteStream, existsSync, utimesSync } from "node:fs";
import { mkdtemp, readFile, rm, stat, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import { BadRequestError, ConflictError, LlmgwError } from "../core/errors.ts";
import { createLogger } from "../core/log.ts";
import { HubClient } from "../registry/hub-client.ts";
import { listLocalSource } from "../registry/local-source.ts";
import type { RepoFile, RepoInfo } from "../registry/types.ts";
import type { Store } from "../store/store.ts";
import { startStandInHub, type StandInHub } from "../../test/support/stand-in-hub.ts";
import { GGUF_REPO, SAFETENSORS_REPO, buildStandInRepos, makeUnreadableFile } from "../../test/support/stand-in-repos.ts";
import { eventually } from "../../test/support/eventually.ts";
import { testBothDatabases, testBothStores } from "../../test/support/stores.ts";
import { Mirror, type MirrorFetchFile, type MirrorIo, type MirrorOptions } from "./mirror.ts";
import { defaultMirrorModelName, planLocalMirrorFetch, planMirrorFetch } from "./mirror-plan.ts";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const TOKEN = "hf_mirror_test_token";
const MODEL = "llmgw-test--tiny-llama-GGUF";

let hub: StandInHub;
let registry: HubClient;
let ggufInfo: RepoInfo;
const roots: string[] = [];

before(async () => {
  const repos = await buildStandInRepos();
  hub = await startStandInHub({ repos: repos.all });
  // With a token, so the tests can see that it reaches the registry and never the CDN.
  registry = new HubClient({ endpoint: hub.url, token: TOKEN, retries: 0 });
  ggufInfo = await registry.repoInfo({ repo: GGUF_REPO });
});

after(async () => {
  await registry.close();
  await hub.close();
  await Promise.all(roots.map((root) => rm(root, { recursive: true, force: true })));
});

async function tempRoot(): Promise<string> {
  const root = await mkdtemp(path.join(tmpdir(), "llmgw-mirror-"));
  roots.push(root);
  return root;
}

function mirrorFor(store: Store, root: string, options: Partial<MirrorOptions> = {}): Mirror {
  return new Mirror({
    ...(process.env.MIRROR_TEST_LOG === "1" ? { logger: createLogger({ level: "debug" }) } : {}),
    store,
    root,
    retries: 0,
    retryDelayMs: 5,
    headersTimeoutMs: 5000,
    bodyTimeoutMs: 5000,
    ...options,
  });
}

function repoFile(pathInRepo: string, info: RepoInfo = ggufInfo): RepoFile {
  const file = info.files.find((f) => f.path === pathInRepo);
  assert.ok(file, `no ${pathInRepo} in ${info.repo}`);
  return file;
}

/** The fetchVersion arguments for some files of the stand-in GGUF repository. */
function plan(paths: string[], info: RepoInfo = ggufInfo) {
  const made = planMirrorFetch({ registry, repoInfo: info, chosen: { files: paths.map((p) => repoFile(p, info)) } });
  return {
    model: info === ggufInfo ? MODEL : defaultMirrorModelName(info.repo),
    version: made.version,
    repo: made.repo,
    revision: made.revision,
    files: made.files,
  };
}

const Q4 = "tiny-llama-Q4_K_M.gguf";
const Q8 = "tiny-llama-Q8_0.gguf";
const LFS_FILES = [
  "Q2_K/tiny-llama-Q2_K-00001-of-00002.gguf",
  "Q2_K/tiny-llama-Q2_K-00002-of-00002.gguf",
  "imatrix_unsloth.gguf",
  "mmproj-tiny-llama-F16.gguf",
  "tiny-llama-F16.gguf",
  Q4,
  Q8,
];

function cdnRequests(since: number) {
  return hub.requests.slice(since).filter((r) => r.path.startsWith("/cdn/"));
}

async function sha256Of(file: string): Promise<string> {
  return createHash("sha256")
    .update(await readFile(file))
    .digest("hex");
}

async function sizeOf(file: string): Promise<number | null> {
  try {
    return (await stat(file)).size;
  } catch {
    return null;
  }
}

/**
 * Stands for a filesystem that fills up mid-download: the writer takes `budget` bytes,
 * writes the part of the next chunk that still fits, then fails that write with ENOSPC
 * exactly as write(2) reports it through Node's fs (code, errno, syscall).
 */
function fillingDisk(budget: number): Partial<MirrorIo> {
  return {
    createWriteStream(file, options) {
      const real = createWriteStream(file, options);
      let left = budget;
      const writer = new Writable({
        highWaterMark: options.highWaterMark,
        write(chunk: Buffer, _encoding, callback) {
          if (chunk.length <= left) {
            left -= chunk.length;
            real.write(chunk, callback);
            return;
          }
          const fits = chunk.subarray(0, left);
          left = 0;
          real.write(fits, () => {
            const error = Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", errno: -28, syscall: "write" });
            callback(error);
          });
        },
        final(callback) {
          real.end(callback);
        },
        destroy(error, callback) {
          real.destroy();
          callback(error);
        },
      });
      return writer;
    },
  };
}

describe("fetch and verify", () => {
  testBothStores("a full fetch verifies sha256, lands complete, and the token never reaches the CDN", async (store) => {
    const root = await tempRoot();
    const mirror = mirrorFor(store, root);
    try {
      const since = hub.requests.length;
      const events: string[] = [];
      const args = plan([Q4, "README.md"]);
      const summary = await mirror.fetchVersion({ ...args, onProgress: (e) => events.push(`${e.file}:${e.state}`) });
      assert.equal(summary.complete, true, JSON.stringify(summary));
      assert.equal(summary.fetched, 2);
      assert.equal(summary.version, ggufInfo.shortSha);

      const q4Path = await mirror.pathFor(MODEL, ggufInfo.shortSha, Q4);
      assert.equal(q4Path, path.join(root, MODEL, ggufInfo.shortSha, Q4));
      assert.equal(await sha256Of(q4Path), repoFile(Q4).sha256);
      assert.equal(existsSync(`${q4Path}.partial`), false);
      // README.md has no LFS sha256; its git blob id was checked and its sha256 recorded.
      const readme = await mirror.pathFor(MODEL, ggufInfo.shortSha, "README.md");
      assert.ok(readme !== null);

      const rows = await mirror.list({ model: MODEL });
      assert.deepEqual(
        rows.map((r) => [r.file, r.state, r.bytesDone, r.bytesTotal, r.percent]),
        [
          ["README.md", "complete", 69, 69, 100],
          [Q4, "complete", repoFile(Q4).size, repoFile(Q4).size, 100],
        ],
      );
      assert.equal(rows[1]?.actualSha256, repoFile(Q4).sha256);
      assert.equal(rows[1]?.sha256, repoFile(Q4).sha256);
      assert.ok(events.includes(`${Q4}:fetching`) && events.includes(`${Q4}:complete`), events.join(" "));

      // Authorization went to the registry's resolve URL, and was dropped on the redirect to the CDN host.
      const resolve = hub.requests.slice(since).filter((r) => r.path.includes("/resolve/"));
      assert.ok(resolve.length === 2 && resolve.every((r) => r.authorization === `Bearer ${TOKEN}`));
      const cdn = cdnRequests(since);
      assert.equal(cdn.length, 1);
      assert.equal(cdn[0]?.authorization, undefined);

      const usage = await mirror.diskUsage();
      assert.equal(usage.bytes, repoFile(Q4).size + 69);
      assert.equal(usage.partialBytes, 0);
      assert.deepEqual(
        usage.versions.map((v) => [v.model, v.version, v.files, v.tracked]),
        [[MODEL, ggufInfo.shortSha, 2, true]],
      );
    } finally {
      await mirror.close();
    }
  });

  testBothStores("a second fetch of the same commit downloads nothing", async (store) => {
    const mirror = mirrorFor(store, await tempRoot());
    try {
      const args = plan([Q4, Q8, "README.md"]);
      assert.equal((await mirror.fetchVersion(args)).complete, true);
      const since = hub.requests.length;
      const again = await mirror.fetchVersion(args);
      assert.equal(again.complete, true);
      assert.equal(again.skipped, 3);
      assert.equal(again.fetched, 0);
      assert.equal(hub.requests.length, since, "no request at all reached the hub");
    } finally {
      await mirror.close();
    }
  });

  testBothStores("a file whose bytes do not match the published sha256 fails with both hashes; a retry starts clean and succeeds", async (store) => {
    const mirror = mirrorFor(store, await tempRoot());
    try {
      hub.setFault({ kind: "corrupt", match: "/cdn/" });
      const args = plan([Q4]);
      const first = await mirror.fetchVersion(args);
      assert.equal(first.complete, false);
      const failure = first.files[0];
      assert.equal(failure?.state, "failed");
      assert.equal(failure?.error?.code, "mirror_checksum_mismatch");
      const published = repoFile(Q4).sha256 as string;
      assert.ok(failure?.error?.message.includes(published), failure?.error?.message);
      assert.ok(failure?.sha256 !== null && failure?.sha256 !== published && failure?.error?.message.includes(failure.sha256 as string));

      const [row] = await mirror.list({ model: MODEL });
      assert.equal(row?.state, "failed");
      assert.equal(row?.actualSha256, failure?.sha256);
      assert.match(row?.error ?? "", /Checksum mismatch/);
      assert.equal(await mirror.pathFor(MODEL, args.version, Q4), null);
      const final = path.join(mirror.root, MODEL, args.version, Q4);
      assert.equal(existsSync(final), false);
      assert.equal(existsSync(`${final}.partial`), false, "the bad bytes were removed");

      hub.setFault(null);
      const since = hub.requests.length;
      const retry = await mirror.fetchVersion(args);
      assert.equal(retry.complete, true);
      assert.equal(cdnRequests(since)[0]?.range, undefined, "the retry downloads from the first byte");
      assert.equal(await sha256Of(final), published);
    } finally {
      hub.setFault(null);
      await mirror.close();
    }
  });

  testBothStores("safetensors companions without an LFS sha256 are checked by their git blob id", async (store) => {
    const mirror = mirrorFor(store, await tempRoot());
    try {
      const info = await registry.repoInfo({ repo: SAFETENSORS_REPO });
      const args = plan(["config.json", "model-00001-of-00002.safetensors"], info);
      assert.equal(args.files[0]?.sha256, null);
      assert.match(args.files[0]?.gitBlobId ?? "", /^[0-9a-f]{40}$/);
      assert.equal((await mirror.fetchVersion(args)).complete, true);

      // A wrong blob id is a mismatch like a wrong sha256.
      const wrong = { ...args, version: "wrongblob", files: [{ ...(args.files[0] as MirrorFetchFile), gitBlobId: "0".repeat(40) }] };
      const failed = await mirror.fetchVersion(wrong);
      assert.equal(failed.files[0]?.error?.code, "mirror_checksum_mismatch");
      assert.match(failed.files[0]?.error?.message ?? "", /git blob id 0{40}/);
    } finally {
      await mirror.close();
    }
  });
});

describe("resume", () => {
  testBothStores("a connection dropped mid-file is resumed with a Range request and verified", async (store) => {
    const mirror = mirrorFor(store, await tempRoot(), { retries: 2 });
    try {
      hub.setFault({ kind: "drop", afterBytes: 100_000, match: "/cdn/", times: 1 });
      const since = hub.requests.length;
      const summary = await mirror.fetchVersion(plan([Q4]));
      assert.equal(summary.complete, true, JSON.stringify(summary.files[0]?.error));
      assert.deepEqual(
        cdnRequests(since).map((r) => r.range),
        [undefined, "bytes=100000-"],
      );
      const file = await mirror.pathFor(MODEL, ggufInfo.shortSha, Q4);
      assert.ok(file !== null);
      assert.equal(await sha256Of(file), repoFile(Q4).sha256);
    } finally {
      hub.setFault(null);
      await mirror.close();
    }
  });

  testBothStores("a dropped connection with no retries left fails retryably, keeps the partial, and the next fetch resumes it", async (store) => {
    const mirror = mirrorFor(store, await tempRoot(), { retries: 0 });
    try {
      hub.setFault({ kind: "drop", afterBytes: 200_000, match: "/cdn/", times: 1 });
      const args = plan([Q4]);
      const first = await mirror.fetchVersion(args);
      assert.equal(first.files[0]?.state, "failed");
      assert.equal(first.files[0]?.error?.code, "mirror_source_unreachable");
      assert.equal(first.files[0]?.error?.retryable, true);
      assert.match(first.files[0]?.error?.message ?? "", /dropped the connection.*retryable/);
      const [row] = await mirror.list({ model: MODEL });
      assert.deepEqual([row?.state, row?.bytesDone], ["failed", 200_000]);
      assert.equal(await mirror.pathFor(MODEL, args.version, Q4), null);

      const since = hub.requests.length;
      const second = await mirror.fetchVersion(args);
      assert.equal(second.complete, true);
      assert.equal(second.files[0]?.resumedFrom, 200_000);
      assert.equal(second.files[0]?.bytesFetched, repoFile(Q4).size - 200_000);
      assert.deepEqual(
        cdnRequests(since).map((r) => r.range),
        ["bytes=200000-"],
      );
    } finally {
      hub.setFault(null);
      await mirror.close();
    }
  });

  testBothStores("a registry that never answers is a clear retryable timeout; the retry works", async (store) => {
    const mirror = mirrorFor(store, await tempRoot(), { headersTimeoutMs: 300, retries: 0 });
    try {
      hub.setFault({ kind: "hang", match: "/cdn/", times: 1 });
      const args = plan([Q8]);
      const first = await mirror.fetchVersion(args);
      const error = first.files[0]?.error;
      assert.equal(error?.code, "mirror_source_timeout");
      assert.equal(error?.retryable, true);
      assert.match(error?.message ?? "", /got no response headers within 300 ms while downloading 'tiny-llama-Q8_0\.gguf'.*retryable/);
      assert.ok(!(error?.message ?? "").includes("Signature"), "the signed CDN URL's query stays out of messages");
      assert.equal((await mirror.fetchVersion(args)).complete, true);
    } finally {
      hub.setFault(null);
      await mirror.close();
    }
  });

  testBothStores("transient failures are retried with backoff inside one fetch: reset, 503, drop", async (store) => {
    const mirror = mirrorFor(store, await tempRoot(), { retries: 3 });
    try {
      hub.setFault([
        { kind: "reset", match: "/cdn/", times: 1 },
        { kind: "status", status: 503, match: /^\/cdn\//, times: 1 },
      ]);
      const since = hub.requests.length;
      const summary = await mirror.fetchVersion(plan([Q8]));
      assert.equal(summary.complete, true, JSON.stringify(summary.files[0]?.error));
      assert.equal(cdnRequests(since).length, 3);
    } finally {
      hub.setFault(null);
      await mirror.close();
    }
  });

  testBothStores("a 404 from the registry fails without retrying and says what to do", async (store) => {
    const mirror = mirrorFor(store, await tempRoot(), { retries: 3 });
    try {
      const args = plan([Q8]);
      const missing = {
        ...args,
        files: [{ ...(args.files[0] as MirrorFetchFile), path: "gone.gguf", url: registry.downloadUrl(GGUF_REPO, ggufInfo.sha, "gone.gguf") }],
      };
      const since = hub.requests.length;
      const summary = await mirror.fetchVersion(missing);
      assert.equal(summary.files[0]?.error?.code, "mirror_source_not_found");
      assert.match(summary.files[0]?.error?.message ?? "", /has no 'gone\.gguf' \(404\)/);
      assert.equal(hub.requests.length - since, 1);
    } finally {
      await mirror.close();
    }
  });
});

describe("concurrency", () => {
  testBothStores("never more than `concurrency` downloads at once, and the limit is used", async (store) => {
    const mirror = mirrorFor(store, await tempRoot(), { concurrency: 2 });
    // Each CDN answer waits 150 ms, so downloads overlap long enough to be counted.
    hub.setFault({ kind: "delay", ms: 150, match: "/cdn/" });
    const since = hub.requests.length;
    let most = 0;
    const sampler = setInterval(() => {
      const inFlight = cdnRequests(since).filter((r) => r.status === undefined).length;
      most = Math.max(most, inFlight);
    }, 5);
    try {
      const summary = await mirror.fetchVersion(plan(LFS_FILES));
      assert.equal(summary.complete, true);
      assert.equal(cdnRequests(since).length, LFS_FILES.length);
      assert.equal(most, 2);
    } finally {
      clearInterval(sampler);
      hub.setFault(null);
      await mirror.close();
    }
  });
});

describe("disk full", () => {
  testBothStores("ENOSPC mid-file fails with a message naming the bytes needed and where; nothing is presented; the retry resumes", async (store) => {
    const root = await tempRoot();
    const full = mirrorFor(store, root, { io: fillingDisk(300_000) });
    const args = plan([Q4]);
    try {
      const summary = await full.fetchVersion(args);
      const error = summary.files[0]?.error;
      assert.equal(error?.code, "mirror_disk_full");
      assert.equal(error?.retryable, false);
      const size = repoFile(Q4).size;
      const partialDir = path.join(root, MODEL, args.version);
      assert.match(error?.message ?? "", /The disk holding the mirror is full/);
      assert.ok(error?.message.includes(`needs ${size - 300_000} more bytes`), error?.message);
      assert.ok(error?.message.includes(partialDir), error?.message);
      const [row] = await full.list({ model: MODEL });
      assert.equal(row?.state, "failed");
      assert.equal(await full.pathFor(MODEL, args.version, Q4), null);
      assert.equal(existsSync(path.join(partialDir, Q4)), false);
      assert.equal(await sizeOf(path.join(partialDir, `${Q4}.partial`)), 300_000);
    } finally {
      await full.close();
    }
    // Space was freed: the same fetch continues from the kept bytes.
    const mirror = mirrorFor(store, root);
    try {
      const since = hub.requests.length;
      const summary = await mirror.fetchVersion(args);
      assert.equal(summary.complete, true);
      assert.deepEqual(
        cdnRequests(since).map((r) => r.range),
        ["bytes=300000-"],
      );
      assert.equal(await sha256Of(path.join(root, MODEL, args.version, Q4)), repoFile(Q4).sha256);
    } finally {
      await mirror.close();
    }
  });

  testBothStores("too little free space is refused before downloading", async (store) => {
    const mirror = mirrorFor(store, await tempRoot(), { io: { freeBytes: async () => 1000 } });
    try {
      const since = hub.requests.length;
      const summary = await mirror.fetchVersion(plan([Q4]));
      assert.equal(summary.files[0]?.error?.code, "mirror_disk_full");
      assert.match(summary.files[0]?.error?.message ?? "", /needs 655360 more bytes.*\(1000 bytes free there\)/);
      assert.equal(cdnRequests(since).length, 0);
    } finally {
      await mirror.close();
    }
  });
});

describe("names", () => {
  testBothStores("model, version and file names are checked segment by segment", async (store) => {
    const mirror = mirrorFor(store, await tempRoot());
    try {
      const args = plan([Q4]);
      const file = args.files[0] as MirrorFetchFile;
      const cases: [Partial<typeof args>, RegExp][] = [
        [{ model: ".." }, /Invalid mirror model '\.\.': it is '\.\.'/],
        [{ model: "a/b" }, /Invalid mirror model 'a\/b': it contains '\/'/],
        [{ version: "" }, /Invalid mirror version '': it is empty/],
        [{ version: "x\\y" }, /contains a backslash/],
        [{ files: [{ ...file, path: "../escape.gguf" }] }, /segment 1 \('\.\.'\) is not allowed/],
        [{ files: [{ ...file, path: "Q2_K/../../x.gguf" }] }, /segment 2 \('\.\.'\) is not allowed/],
        [{ files: [{ ...file, path: "/etc/passwd" }] }, /it is absolute/],
        [{ files: [{ ...file, path: "a\\b.gguf" }] }, /segment 1 \('a\\b\.gguf'\) is not allowed: it contains a backslash/],
        [{ files: [{ ...file, path: "a//b.gguf" }] }, /segment 2 \(''\) is not allowed: it is empty/],
        [{ files: [{ ...file, path: "./a.gguf" }] }, /segment 1 \('\.'\)/],
        [{ files: [{ ...file, path: "a\nb.gguf" }] }, /control characters/],
        [{ files: [{ ...file, path: "x.gguf.partial" }] }, /reserves for downloads in progress/],
      ];
      for (const [change, message] of cases) {
        await assert.rejects(mirror.fetchVersion({ ...args, ...change }), (error: unknown) => {
          assert.ok(error instanceof BadRequestError, String(error));
          assert.equal(error.status, 400);
          assert.match(error.message, message);
          return true;
        });
      }
      await assert.rejects(mirror.pathFor(MODEL, "..", Q4), BadRequestError);
      await assert.rejects(mirror.deleteVersion("..", "x"), BadRequestError);
      assert.equal((await mirror.list()).length, 0, "nothing was recorded for refused names");
    } finally {
      await mirror.close();
    }
  });
});

describe("delete and disk use", () => {
  testBothStores("deleting a version removes its files and rows; it is refused while the version is fetching", async (store) => {
    const root = await tempRoot();
    const mirror = mirrorFor(store, root);
    try {
      const args = plan([Q4, "README.md"]);
      await mirror.fetchVersion(args);
      const other = { ...args, version: "othervers" };
      await mirror.fetchVersion({ ...other, files: [args.files[1] as MirrorFetchFile] });

      hub.setFault({ kind: "delay", ms: 400, match: "/cdn/" });
      const slow = mirror.fetchVersion({ ...args, version: "slowversion" });
      await assert.rejects(
        mirror.deleteVersion(MODEL, "slowversion"),
        (error: unknown) => error instanceof ConflictError && /is being fetched/.test(error.message),
      );
      await slow;
      hub.setFault(null);

      const before = await mirror.diskUsage();
      const deleted = await mirror.deleteVersion(MODEL, args.version);
      assert.deepEqual(deleted, { model: MODEL, version: args.version, files: 2, bytes: repoFile(Q4).size + 69 });
      assert.equal(existsSync(path.join(root, MODEL, args.version)), false);
      assert.equal(await mirror.pathFor(MODEL, args.version, Q4), null);
      const afterUsage = await mirror.diskUsage();
      assert.equal(afterUsage.bytes, before.bytes - deleted.bytes);
      assert.deepEqual(afterUsage.versions.map((v) => v.version).sort(), ["othervers", "slowversion"]);
      assert.equal((await mirror.list()).filter((r) => r.version === args.version).length, 0);
      await assert.rejects(mirror.deleteVersion(MODEL, args.version), (error: unknown) => error instanceof LlmgwError && error.status === 404);
    } finally {
      hub.setFault(null);
      await mirror.close();
    }
  });
});

describe("local sources", () => {
  testBothStores("a local folder is copied with the same checks, and an interrupted copy resumes", async (store) => {
    const dir = await tempRoot();
    const content = randomBytes(300_000);
    await writeFile(path.join(dir, "model-Q4_K_M.gguf"), content);
    const listing = await listLocalSource({ source: dir });
    const made = planLocalMirrorFetch({ listing, chosen: { files: listing.files } });
    assert.ok(made.files[0]?.url.startsWith("file:"));
    const root = await tempRoot();
    const model = defaultMirrorModelName(listing.repo);
    const args = { model, version: made.version, repo: made.repo, revision: made.revision, files: made.files };
    const final = path.join(root, model, made.version, "model-Q4_K_M.gguf");
    const full = mirrorFor(store, root, { io: fillingDisk(123_456) });
    try {
      assert.equal((await full.fetchVersion(args)).files[0]?.error?.code, "mirror_disk_full");
    } finally {
      await full.close();
    }
    const mirror = mirrorFor(store, root);
    try {
      const summary = await mirror.fetchVersion(args);
      assert.equal(summary.complete, true, JSON.stringify(summary.files[0]?.error));
      assert.equal(summary.files[0]?.resumedFrom, 123_456);
      assert.deepEqual(await readFile(final), content);
    } finally {
      await mirror.close();
    }
  });
});

describe("local sources, hashed while copied", () => {
  testBothStores(
    "a local file is hashed while it is copied; the same files again copy nothing; a file touched since it was listed is not copied",
    async (store) => {
      const dir = await tempRoot();
      const content = randomBytes(200_000);
      const file = path.join(dir, "model-Q4_K_M.gguf");
      await writeFile(file, content);
      const mirror = mirrorFor(store, await tempRoot());
      try {
        const listing = await listLocalSource({ source: dir });
        const made = planLocalMirrorFetch({ listing, chosen: { files: listing.files } });
        assert.equal(made.files[0]?.sha256, null, "nothing was hashed before the copy");
        const args = { model: "local", version: made.version, repo: made.repo, revision: made.revision, files: made.files };
        const first = await mirror.fetchVersion(args);
        assert.equal(first.complete, true, JSON.stringify(first.files[0]?.error));
        const sha = createHash("sha256").update(content).digest("hex");
        assert.equal(first.files[0]?.sha256, sha);
        assert.equal((await mirror.list())[0]?.actualSha256, sha, "the row records the hash of the bytes copied");

        // Listed again, untouched: the same version, and nothing is copied.
        const unchanged = await listLocalSource({ source: dir });
        const again = planLocalMirrorFetch({ listing: unchanged, chosen: { files: unchanged.files } });
        assert.equal(again.version, made.version);
        const second = await mirror.fetchVersion(args);
        assert.deepEqual([second.skipped, second.bytesFetched], [1, 0]);

        // Touched after it was listed: the old listing's version is not filled with these bytes.
        const stale = planLocalMirrorFetch({ listing, chosen: { files: listing.files } });
        const later = new Date(Date.now() + 60_000);
        await utimes(file, later, later);
        const refused = await mirror.fetchVersion({ ...args, model: "local-stale", files: stale.files });
        assert.equal(refused.files[0]?.state, "failed");
        assert.equal(refused.files[0]?.error?.code, "mirror_local_source_changed");
        assert.ok(refused.files[0]?.error?.message.includes(file), refused.files[0]?.error?.message);
        assert.equal(await mirror.pathFor("local-stale", made.version, "model-Q4_K_M.gguf"), null);
        const relisted = await listLocalSource({ source: dir });
        const fresh = planLocalMirrorFetch({ listing: relisted, chosen: { files: relisted.files } });
        assert.notEqual(fresh.version, made.version, "a touched file is a new version");
      } finally {
        await mirror.close();
      }
    },
  );

  testBothStores("a local file that changes while it is copied is not presented", async (store) => {
    const dir = await tempRoot();
    const file = path.join(dir, "model-Q4_K_M.gguf");
    await writeFile(file, randomBytes(300_000));
    const listing = await listLocalSource({ source: dir });
    const made = planLocalMirrorFetch({ listing, chosen: { files: listing.files } });
    let touched = false;
    // Stands for another program writing the source while the mirror copies it: the first
    // chunk the mirror writes touches the source.
    const io: Partial<MirrorIo> = {
      createWriteStream(target, options) {
        const real = createWriteStream(target, options);
        return new Writable({
          highWaterMark: options.highWaterMark,
          write(chunk: Buffer, _encoding, callback) {
            if (!touched) {
              touched = true;
              const later = new Date(Date.now() + 60_000);
              utimesSync(file, later, later);
            }
            real.write(chunk, callback);
          },
          final(callback) {
            real.end(callback);
          },
        });
      },
    };
    const root = await tempRoot();
    const mirror = mirrorFor(store, root, { io });
    try {
      const summary = await mirror.fetchVersion({ model: "local", version: made.version, repo: made.repo, revision: made.revision, files: made.files });
      assert.equal(touched, true);
      assert.equal(summary.files[0]?.state, "failed");
      assert.equal(summary.files[0]?.error?.code, "mirror_local_source_changed");
      assert.match(summary.files[0]?.error?.message ?? "", /while it was being copied/);
      assert.equal(await mirror.pathFor("local", made.version, "model-Q4_K_M.gguf"), null);
      assert.equal(
        existsSync(path.join(root, "local", made.version, "model-Q4_K_M.gguf.partial")),
        false,
        "the bytes of another file are not kept to resume from",
      );
    } finally {
      await mirror.close();
    }
  });

  testBothStores("a local file this process may not read fails at once with a 403 naming it, not as a flaky source", async (store, t) => {
    const dir = await tempRoot();
    const file = path.join(dir, "model-Q4_K_M.gguf");
    if (!(await makeUnreadableFile(file))) {
      t.skip("no way to make a file this process cannot read here");
      return;
    }
    const listing = await listLocalSource({ source: dir });
    if (listing.files[0]?.size === 0) {
      t.skip("the only unreadable file here is empty, and an empty file is never opened");
      return;
    }
    const made = planLocalMirrorFetch({ listing, chosen: { files: listing.files } });
    // Retries with a long delay: a failure taken for a flaky source would wait here.
    const mirror = mirrorFor(store, await tempRoot(), { retries: 3, retryDelayMs: 60_000 });
    try {
      const summary = await mirror.fetchVersion({ model: "local", version: made.version, repo: made.repo, revision: made.revision, files: made.files });
      const outcome = summary.files[0];
      assert.equal(outcome?.state, "failed");
      assert.equal(outcome?.error?.code, "local_source_unreadable");
      assert.equal(outcome?.error?.retryable, false);
      assert.ok(outcome?.error?.message.includes(file), outcome?.error?.message);
      assert.match((await mirror.list())[0]?.error ?? "", /permission denied/);
    } finally {
      await mirror.close();
    }
  });
});

describe("following a fetch", () => {
  testBothStores("a fetch lists its files as active from the moment it is called, over rows an earlier run left pending", async (store) => {
    const root = await tempRoot();
    const args = plan([Q4, Q8]);
    // An earlier run stopped mid-fetch: its rows are pending, and nothing works on them.
    const earlier = mirrorFor(store, root);
    hub.setFault({ kind: "hang", match: "/cdn/" });
    try {
      const running = earlier.fetchVersion(args);
      running.catch(() => undefined);
      await eventually("the first downloads", async () => (await earlier.list()).filter((row) => row.state === "fetching").length === 2);
      await earlier.close();
      const left = await mirrorFor(store, root).list();
      assert.deepEqual(
        left.map((row) => [row.state, row.active]),
        [
          ["pending", false],
          ["pending", false],
        ],
      );

      hub.setFault({ kind: "delay", ms: 300, match: "/cdn/" });
      const mirror = mirrorFor(store, root);
      try {
        const fetching = mirror.fetchVersion(args);
        const rows = await mirror.list();
        assert.deepEqual(
          rows.map((row) => [row.file, row.state, row.active]),
          [
            [Q4, "pending", true],
            [Q8, "pending", true],
          ],
          "a poller must not take the earlier run's rows for this fetch having stopped",
        );
        assert.equal((await fetching).complete, true);
        assert.deepEqual(
          (await mirror.list()).map((row) => [row.state, row.active]),
          [
            ["complete", false],
            ["complete", false],
          ],
        );
      } finally {
        await mirror.close();
      }
    } finally {
      hub.setFault(null);
    }
  });

  testBothStores("checkFetch refuses what fetchVersion would refuse, without recording anything", async (store) => {
    const mirror = mirrorFor(store, await tempRoot());
    try {
      const args = plan([Q4]);
      const file = args.files[0] as MirrorFetchFile;
      assert.equal(mirror.checkFetch(args).length, 1);
      assert.throws(
        () => mirror.checkFetch({ ...args, files: [{ ...file, sha256: "NOT-A-SHA" }] }),
        (error: unknown) => error instanceof BadRequestError && error.param === "files.0.sha256",
      );
      assert.throws(
        () => mirror.checkFetch({ ...args, files: [{ ...file, path: `${"d".repeat(256)}/x.gguf` }] }),
        (error: unknown) => error instanceof BadRequestError && /longer than 255 bytes/.test(error.message),
      );
      await mirror.close();
      assert.throws(
        () => mirror.checkFetch(args),
        (error: unknown) => error instanceof ConflictError && error.code === "mirror_closed",
      );
      assert.equal((await mirror.list()).length, 0);
    } finally {
      await mirror.close();
    }
  });
});

// ---------------------------------------------------------------------------------------
// Restarts. These need a database the test can open twice (and a child process can open):
// `testBothDatabases` makes a SQLite file or PostgreSQL schema per case.

describe("restart", () => {
  // The first attempt drops after DROP_AT bytes and the mirror then waits a minute before
  // resuming: a fetch that is certainly in flight, with a partial of a known size, when
  // the server stops.
  const DROP_AT = 250_000;

  testBothDatabases("a server stopped mid-fetch lists the file as incomplete after restart, and the next fetch resumes it", async (database) => {
    const root = await tempRoot();
    const args = plan([Q4]);
    const partial = path.join(root, MODEL, args.version, `${Q4}.partial`);
    let store = await database.open();
    hub.setFault({ kind: "drop", afterBytes: DROP_AT, match: "/cdn/", times: 1 });
    try {
      let mirror = mirrorFor(store, root, { retries: 3, retryDelayMs: 60_000 });
      const running = mirror.fetchVersion(args);
      running.catch(() => undefined);
      await eventually("the partial download", async () => (await sizeOf(partial)) === DROP_AT);
      await mirror.close();
      await assert.rejects(running, (error: unknown) => error instanceof ConflictError && error.code === "mirror_closed");
      await store.close();
      hub.setFault(null);

      store = await database.open();
      mirror = mirrorFor(store, root);
      await mirror.recover();
      const [row] = await mirror.list({ model: MODEL });
      assert.equal(row?.state, "pending");
      assert.equal(row?.bytesDone, DROP_AT);
      assert.ok((row?.percent ?? 100) < 100);
      assert.match(row?.error ?? "", /Interrupted at 250000 of 655360 bytes/);
      assert.equal(await mirror.pathFor(MODEL, args.version, Q4), null);

      const since = hub.requests.length;
      const summary = await mirror.fetchVersion(args);
      assert.equal(summary.complete, true);
      assert.deepEqual(
        cdnRequests(since).map((r) => r.range),
        [`bytes=${DROP_AT}-`],
      );
      assert.equal(await sha256Of(path.join(root, MODEL, args.version, Q4)), repoFile(Q4).sha256);
      await mirror.close();
    } finally {
      hub.setFault(null);
      await store.close();
    }
  });

  testBothDatabases("a server killed mid-fetch (SIGKILL) leaves a row that recover() turns into a resumable one", async (database) => {
    const root = await tempRoot();
    const args = plan([Q4]);
    const partial = path.join(root, MODEL, args.version, `${Q4}.partial`);
    // Migrations first, so the child and this process do not race to apply them.
    await (await database.open()).close();
    hub.setFault({ kind: "drop", afterBytes: DROP_AT, match: "/cdn/", times: 1 });
    const child = spawn(process.execPath, ["--import", "tsx", path.join(HERE, "../../test/support/mirror-fetch-child.ts")], {
      stdio: ["pipe", "inherit", "inherit"],
    });
    const exited = new Promise((resolve) => child.once("exit", resolve));
    try {
      child.stdin.end(JSON.stringify({ ...database.spec, root, fetch: args, retryDelayMs: 60_000 }));
      await eventually("the child's partial download", async () => (await sizeOf(partial)) === DROP_AT);
      child.kill("SIGKILL");
      await exited;
    } finally {
      child.kill("SIGKILL");
      hub.setFault(null);
    }

    const store = await database.open();
    try {
      const before = await store.db.selectFrom("mirror_files").selectAll().execute();
      assert.deepEqual(
        before.map((r) => r.state),
        ["fetching"],
        "the killed process left its row fetching",
      );
      const mirror = mirrorFor(store, root);
      assert.equal(await mirror.pathFor(MODEL, args.version, Q4), null);
      assert.deepEqual(await mirror.recover(), { interrupted: 1, missing: 0, unconfirmed: 0 });
      const [row] = await mirror.list();
      assert.deepEqual([row?.state, row?.bytesDone], ["pending", DROP_AT]);

      const since = hub.requests.length;
      const summary = await mirror.fetchVersion(args);
      assert.equal(summary.complete, true);
      assert.deepEqual(
        cdnRequests(since).map((r) => r.range),
        [`bytes=${DROP_AT}-`],
      );
      await mirror.close();
    } finally {
      await store.close();
    }
  });

  testBothStores("recover() demotes complete rows whose file is gone and hides final files without a complete row", async (store) => {
    const root = await tempRoot();
    const mirror = mirrorFor(store, root);
    try {
      const args = plan([Q4, Q8]);
      const first = await mirror.fetchVersion(args);
      assert.equal(first.complete, true, JSON.stringify(first.files.map((f) => f.error)));
      const dir = path.join(root, MODEL, args.version);
      await rm(path.join(dir, Q8));
      // A crash between the rename and the row update: the file is under its final name, the row still says fetching.
      await store.db.updateTable("mirror_files").set({ state: "fetching" }).where("file", "=", Q4).execute();
      assert.equal(await mirror.pathFor(MODEL, args.version, Q4), null);

      assert.deepEqual(await mirror.recover(), { interrupted: 1, missing: 1, unconfirmed: 1 });
      const rows = await mirror.list();
      assert.deepEqual(
        rows.map((r) => [r.file, r.state]),
        [
          [Q4, "pending"],
          [Q8, "failed"],
        ],
      );
      assert.match(rows[1]?.error ?? "", /missing on disk/);
      assert.equal(existsSync(path.join(dir, Q4)), false);
      assert.equal(await sizeOf(path.join(dir, `${Q4}.partial`)), repoFile(Q4).size);

      // The unconfirmed bytes are verified, not downloaded again; the missing file is fetched.
      const since = hub.requests.length;
      const summary = await mirror.fetchVersion(args);
      assert.equal(summary.complete, true);
      assert.deepEqual(
        summary.files.map((f) => [f.file, f.bytesFetched]),
        [
          [Q4, 0],
          [Q8, repoFile(Q8).size],
        ],
      );
      assert.equal(cdnRequests(since).length, 1);
    } finally {
      await mirror.close();
    }
  });
});
