// The mirror's HTTP surface: the admin routes (mounted on a Hono app the way the admin API
// mounts them, behind a middleware that sets the principal) and the file server for nodes
// over real HTTP on loopback. Weights come from the stand-in hub (test/support/stand-in-hub.ts,
// standing for huggingface.co and its CDN) or from a local folder.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { Hono } from "hono";
import { renderError, type RenderedError } from "../core/errors.ts";
import type { Principal } from "../keys/key-service.ts";
import { HubClient } from "../registry/hub-client.ts";
import type { Registry, RepoInfo } from "../registry/types.ts";
import type { Store } from "../store/store.ts";
import { startStandInHub, type StandInHub } from "../../test/support/stand-in-hub.ts";
import { GGUF_REPO, buildStandInRepos, makeUnreadableFile } from "../../test/support/stand-in-repos.ts";
import { openSqliteTestStore, testBothStores } from "../../test/support/stores.ts";
import { Catalog } from "../catalog/catalog.ts";
import { SecretBox } from "../core/secret-box.ts";
import { planRepository } from "../plan/plan-repository.ts";
import { localPool } from "../plan/local-pool.ts";
import { readAudit } from "../store/audit.ts";
import { Mirror } from "./mirror.ts";
import type { MirrorDiskUsage, MirrorFileView } from "./mirror-types.ts";
import type { VerifyRunView } from "./verify-runs.ts";
import { DiskWeightsChecker } from "../catalog/weights-check.ts";
import { catalogModelsUsing } from "./mirror-users.ts";
import { planMirrorFetch } from "./mirror-plan.ts";
import { mountMirrorRoutes, parseRange, type MirrorPlanner, type MirrorRoutesEnv, type MirrorRoutesOptions } from "./mirror-routes.ts";
import { eventually } from "../../test/support/eventually.ts";
import { nodeRequest, serveMirrorFiles, type Answer, type NodeRequestOptions } from "../../test/support/mirror-servers.ts";

const MODEL = "llmgw-test--tiny-llama-GGUF";
const Q4 = "tiny-llama-Q4_K_M.gguf";
const Q8 = "tiny-llama-Q8_0.gguf";

let hub: StandInHub;
let registry: HubClient;
let info: RepoInfo;
const dirs: string[] = [];

before(async () => {
  hub = await startStandInHub({ repos: (await buildStandInRepos()).all });
  registry = new HubClient({ endpoint: hub.url, retries: 0 });
  info = await registry.repoInfo({ repo: GGUF_REPO });
});

after(async () => {
  await registry.close();
  await hub.close();
  await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "llmgw-mirror-routes-"));
  dirs.push(dir);
  return dir;
}

function adminApp(mirror: Mirror, reader: Registry = registry, extra: Partial<MirrorRoutesOptions> = {}): Hono<MirrorRoutesEnv> {
  const app = new Hono<MirrorRoutesEnv>();
  app.onError((error, c) => {
    const rendered = renderError(error);
    return c.json(rendered.body, rendered.status as 400, rendered.headers);
  });
  // Stands for the admin API's admin-key middleware.
  app.use("/api/v1/*", async (c, next) => {
    const principal: Principal = { keyId: "k1", name: "admin", role: "admin", allowedModels: null, expiresAt: null };
    c.set("principal", principal);
    await next();
  });
  mountMirrorRoutes(app, { mirror, registry: reader, ...extra });
  return app;
}

/** An error answer, in OpenAI's shape. */
type ErrorAnswer = RenderedError["body"];

/** GET /api/v1/mirror: the files, a summary per version, and the disk use. */
interface Listing {
  data: MirrorFileView[];
  versions: Array<{ model: string; version: string; state: string }>;
  disk: MirrorDiskUsage;
}

/** POST /api/v1/mirror: the fetch the route started. */
interface StartedFetch {
  model: string;
  version: string;
  revision: string;
  set: string;
  picked: { by: string; artifact: string; reason: string };
  files: Array<{ path: string; size: number; sha256: string | null }>;
  progress: string;
}

/** DELETE /api/v1/mirror/:model/:version; `forced` and `usedBy` when catalog models used it. */
interface Deleted {
  deleted: { model: string; version: string; files: number; bytes: number; forced?: true; usedBy?: string[] };
}

/** POST /api/v1/mirror/verify: the run, and where to follow it. */
type VerifyAnswer = VerifyRunView & { progress: string };

/** The parsed JSON body of an answer, of the shape the test expects. */
async function json<T>(response: Response): Promise<T> {
  return (await response.json()) as T;
}

/** The listing once the model's first version is in `state`. */
function versionIn(app: Hono<MirrorRoutesEnv>, model: string, state: string): Promise<Listing> {
  return eventually(`the version of ${model} to be ${state}`, async () => {
    const body = await json<Listing>(await app.request(`/api/v1/mirror?model=${encodeURIComponent(model)}`));
    return body.versions?.[0]?.state === state ? body : false;
  });
}

describe("admin routes", () => {
  testBothStores("POST mirrors the chosen artifact in the background; GET shows progress and disk use; DELETE removes it", async (store) => {
    const dataDir = await tempDir();
    const mirror = new Mirror({ store, root: path.join(dataDir, "mirror"), retries: 0 });
    const app = adminApp(mirror);
    try {
      hub.setFault({ kind: "delay", ms: 300, match: "/cdn/" });
      const started = await app.request("/api/v1/mirror", { method: "POST", body: JSON.stringify({ repo: GGUF_REPO, quant: "Q2_K" }) });
      assert.equal(started.status, 202);
      const plan = await json<StartedFetch>(started);
      assert.equal(plan.model, MODEL);
      assert.equal(plan.version, info.shortSha);
      assert.equal(plan.revision, info.sha);
      assert.deepEqual(
        plan.files.map((f) => f.path),
        ["Q2_K/tiny-llama-Q2_K-00001-of-00002.gguf", "Q2_K/tiny-llama-Q2_K-00002-of-00002.gguf"],
      );
      assert.equal(plan.progress, `/api/v1/mirror?model=${MODEL}`);

      // Deleting while it fetches is refused.
      const busy = await app.request(`/api/v1/mirror/${MODEL}/${info.shortSha}`, { method: "DELETE" });
      assert.equal(busy.status, 409);
      assert.equal((await json<ErrorAnswer>(busy)).error.code, "mirror_version_busy");

      const listing = await versionIn(app, MODEL, "complete");
      hub.setFault(null);
      assert.equal(listing.data.length, 2);
      for (const file of listing.data) {
        assert.equal(file.state, "complete");
        assert.equal(file.percent, 100);
        assert.equal(file.bytesDone, file.bytesTotal);
      }
      assert.deepEqual(
        { ...listing.versions[0], bytesDone: undefined, bytesTotal: undefined },
        {
          model: MODEL,
          version: info.shortSha,
          repo: GGUF_REPO,
          revision: info.sha,
          files: 2,
          complete: 2,
          failed: 0,
          state: "complete",
          bytesDone: undefined,
          bytesTotal: undefined,
        },
      );
      assert.equal(listing.disk.bytes, 655392 * 2);
      assert.equal(listing.disk.root, path.join(dataDir, "mirror"));

      const deleted = await app.request(`/api/v1/mirror/${MODEL}/${info.shortSha}`, { method: "DELETE" });
      assert.equal(deleted.status, 200);
      assert.deepEqual((await json<Deleted>(deleted)).deleted, { model: MODEL, version: info.shortSha, files: 2, bytes: 655392 * 2 });
      const again = await app.request(`/api/v1/mirror/${MODEL}/${info.shortSha}`, { method: "DELETE" });
      assert.equal(again.status, 404);
      assert.equal((await json<Listing>(await app.request("/api/v1/mirror"))).data.length, 0);
    } finally {
      hub.setFault(null);
      await mirror.close();
    }
  });

  testBothStores("POST takes a local folder as the repository", async (store) => {
    const dataDir = await tempDir();
    const source = await tempDir();
    const content = randomBytes(100_000);
    await writeFile(path.join(source, "my-model-Q4_K_M.gguf"), content);
    const mirror = new Mirror({ store, root: path.join(dataDir, "mirror") });
    const app = adminApp(mirror);
    try {
      const started = await app.request("/api/v1/mirror", { method: "POST", body: JSON.stringify({ repo: source, model: "my-model" }) });
      assert.equal(started.status, 202, JSON.stringify(await started.clone().json()));
      const plan = await json<StartedFetch>(started);
      assert.equal(plan.model, "my-model");
      await versionIn(app, "my-model", "complete");
      const file = await mirror.pathFor("my-model", plan.version, "my-model-Q4_K_M.gguf");
      assert.ok(file !== null);
      assert.deepEqual(await readFile(file), content);
    } finally {
      await mirror.close();
    }
  });

  testBothStores(
    "POST lists a local folder without hashing it: another quantisation it cannot read does not matter, and the same files are the same version",
    async (store, t) => {
      const dataDir = await tempDir();
      const source = await tempDir();
      const content = randomBytes(100_000);
      await writeFile(path.join(source, "my-model-Q4_K_M.gguf"), content);
      if (!(await makeUnreadableFile(path.join(source, "my-model-Q8_0.gguf")))) {
        t.skip("no way to make a file this process cannot read here");
        return;
      }
      const mirror = new Mirror({ store, root: path.join(dataDir, "mirror") });
      const app = adminApp(mirror);
      try {
        const post = () => app.request("/api/v1/mirror", { method: "POST", body: JSON.stringify({ repo: source, model: "my-model", quant: "Q4_K_M" }) });
        const started = await post();
        assert.equal(started.status, 202, JSON.stringify(await started.clone().json()));
        const plan = await json<StartedFetch>(started);
        assert.deepEqual(
          plan.files.map((f) => [f.path, f.sha256]),
          [["my-model-Q4_K_M.gguf", null]],
        );
        const listing = await versionIn(app, "my-model", "complete");
        assert.equal(listing.data[0]?.actualSha256, createHash("sha256").update(content).digest("hex"), "the mirror hashed the copy");
        assert.equal(existsSync(path.join(dataDir, "registry", "local-hashes.json")), false, "nothing was hashed before the copy");

        const again = await post();
        assert.equal(again.status, 202);
        assert.equal((await json<StartedFetch>(again)).version, plan.version);
        await versionIn(app, "my-model", "complete");
      } finally {
        await mirror.close();
      }
    },
  );

  testBothStores("POST of a local file this server may not read is a 403 naming it, and records nothing", async (store, t) => {
    const dataDir = await tempDir();
    const source = await tempDir();
    const file = path.join(source, "my-model-Q4_K_M.gguf");
    if (!(await makeUnreadableFile(file))) {
      t.skip("no way to make a file this process cannot read here");
      return;
    }
    const mirror = new Mirror({ store, root: path.join(dataDir, "mirror") });
    const app = adminApp(mirror);
    try {
      const refused = await app.request("/api/v1/mirror", { method: "POST", body: JSON.stringify({ repo: source }) });
      assert.equal(refused.status, 403);
      const { error } = await json<ErrorAnswer>(refused);
      assert.equal(error.code, "local_source_unreadable");
      assert.ok(error.message.includes(file), error.message);
      assert.equal((await mirror.list()).length, 0);
    } finally {
      await mirror.close();
    }
  });

  testBothStores("POST refuses, before its 202, a plan the mirror could not store, and records nothing", async (store) => {
    const dataDir = await tempDir();
    const mirror = new Mirror({ store, root: path.join(dataDir, "mirror") });
    // Stands for a registry whose answers llmgw's HubClient would not produce: the route
    // must not rely on the registry's checks to accept only what the mirror takes.
    const changed = (change: (files: RepoInfo["files"]) => RepoInfo["files"]): Registry => ({
      repoInfo: async (options) => {
        const read = await registry.repoInfo(options);
        return { ...read, files: change(read.files) };
      },
      downloadUrl: (repo, sha, file) => `${hub.url}/${repo}/resolve/${sha}/${file.split("/").map(encodeURIComponent).join("/")}`,
      requestHeaders: (url) => registry.requestHeaders(url),
      readSmallFile: (options) => registry.readSmallFile(options),
    });
    const post = async (reader: Registry) => {
      const response = await adminApp(mirror, reader).request("/api/v1/mirror", {
        method: "POST",
        body: JSON.stringify({ repo: GGUF_REPO, quant: "Q4_K_M" }),
      });
      return { status: response.status, error: (await json<ErrorAnswer>(response)).error };
    };
    try {
      const badHash = await post(changed((files) => files.map((f) => (f.path === Q4 ? { ...f, sha256: "NOT-A-SHA256" } : f))));
      assert.deepEqual([badHash.status, badHash.error.code, badHash.error.param], [400, "invalid_field", "files.0.sha256"]);
      const longName = await post(changed((files) => files.map((f) => (f.path === Q4 ? { ...f, path: `${"d".repeat(256)}/${Q4}` } : f))));
      assert.deepEqual([longName.status, longName.error.code], [400, "invalid_path"]);
      assert.match(longName.error.message, /longer than 255 bytes/);
      assert.equal((await mirror.list()).length, 0);
    } finally {
      await mirror.close();
    }
  });

  testBothStores("bad requests are 400s naming the field; unknown repositories and quantisations are 404s", async (store) => {
    const dataDir = await tempDir();
    const mirror = new Mirror({ store, root: path.join(dataDir, "mirror") });
    const app = adminApp(mirror);
    try {
      const post = async (body: unknown) => {
        const response = await app.request("/api/v1/mirror", { method: "POST", body: typeof body === "string" ? body : JSON.stringify(body) });
        return { status: response.status, error: (await json<ErrorAnswer>(response)).error };
      };
      const noRepo = await post({});
      assert.deepEqual([noRepo.status, noRepo.error.param], [400, "repo"]);
      const extra = await post({ repo: GGUF_REPO, colour: "blue" });
      assert.equal(extra.status, 400);
      assert.equal((await post("{not json")).error.code, "invalid_json");
      const badName = await post({ repo: "not a repo" });
      assert.deepEqual([badName.status, badName.error.code], [400, "invalid_repo_name"]);
      const badModel = await post({ repo: GGUF_REPO, model: "../escape" });
      assert.deepEqual([badModel.status, badModel.error.code, badModel.error.param], [400, "invalid_path", "model"]);
      const missing = await post({ repo: "llmgw-test/no-such-repo" });
      assert.equal(missing.status, 404);
      const noQuant = await post({ repo: GGUF_REPO, quant: "IQ1_S" });
      assert.equal(noQuant.status, 404);
      assert.match(noQuant.error.message, /Q4_K_M/);
      const badDelete = await app.request("/api/v1/mirror/..%2F/x", { method: "DELETE" });
      assert.equal(badDelete.status, 400);
      assert.equal((await mirror.list()).length, 0);
    } finally {
      await mirror.close();
    }
  });
});

test("POST stops reading the repository when its client goes away", { timeout: 60_000 }, async () => {
  const { store, cleanup } = await openSqliteTestStore();
  const dataDir = await tempDir();
  const mirror = new Mirror({ store, root: path.join(dataDir, "mirror") });
  // A registry that never answers, read by a client that would wait an hour for headers:
  // only the request's signal can end the read before the test's deadline.
  hub.setFault({ kind: "hang", match: "/api/" });
  const patient = new HubClient({ endpoint: hub.url, retries: 0, headersTimeoutMs: 3_600_000 });
  try {
    const since = hub.requests.length;
    const controller = new AbortController();
    const pending = Promise.resolve(
      adminApp(mirror, patient).request("/api/v1/mirror", { method: "POST", body: JSON.stringify({ repo: GGUF_REPO }), signal: controller.signal }),
    );
    await eventually("the route to ask the registry", () => hub.requests.slice(since).some((r) => r.path.startsWith("/api/")));
    controller.abort();
    await pending.then(
      () => undefined,
      () => undefined,
    );
    assert.equal((await mirror.list()).length, 0);
  } finally {
    hub.setFault(null);
    await patient.close();
    await mirror.close();
    await cleanup();
  }
});

// ---------------------------------------------------------------------------------------

/** A raw request: node:http sends the path exactly as given (fetch and undici would normalise `..`). */
function raw(base: string, requestPath: string, options: NodeRequestOptions = {}): Promise<Answer> {
  const url = new URL(base);
  return nodeRequest({ host: url.hostname, port: url.port, path: requestPath }, options);
}

async function withFileServer(mirror: Mirror, body: (base: string) => Promise<void>): Promise<void> {
  const files = await serveMirrorFiles(mirror);
  try {
    await body(files.url);
  } finally {
    await files.close();
  }
}

describe("file server", () => {
  testBothStores(
    "serves complete files with Range, ETag and conditional requests; refuses bad paths, missing keys and incomplete files",
    async (store: Store) => {
      const dataDir = await tempDir();
      const mirror = new Mirror({ store, root: path.join(dataDir, "mirror"), retries: 0 });
      try {
        const made = planMirrorFetch({ registry, repoInfo: info, chosen: { files: info.files.filter((f) => f.path === Q4 || f.path === Q8) } });
        const args = { model: MODEL, version: made.version, repo: made.repo, revision: made.revision, files: made.files };
        // Q4 lands complete; Q8's connection drops, leaving a partial that must never be served.
        hub.setFault({ kind: "drop", afterBytes: 1000, match: /^\/cdn\/repos\/a8c0/ });
        const summary = await mirror.fetchVersion(args);
        hub.setFault(null);
        assert.deepEqual(
          summary.files.map((f) => [f.file, f.state]),
          [
            [Q4, "complete"],
            [Q8, "failed"],
          ],
        );
        const q4 = await readFile((await mirror.pathFor(MODEL, made.version, Q4)) as string);
        const sha = createHash("sha256").update(q4).digest("hex");
        const base = `/mirror/${MODEL}/${made.version}`;

        await withFileServer(mirror, async (url) => {
          const whole = await raw(url, `${base}/${Q4}`);
          assert.equal(whole.status, 200);
          assert.equal(whole.headers.etag, `"${sha}"`);
          assert.equal(whole.headers["content-length"], String(q4.length));
          assert.equal(whole.headers["accept-ranges"], "bytes");
          assert.ok(whole.body.equals(q4));

          const part = await raw(url, `${base}/${Q4}`, { headers: { range: "bytes=1000-1999" } });
          assert.equal(part.status, 206);
          assert.equal(part.headers["content-range"], `bytes 1000-1999/${q4.length}`);
          assert.equal(part.headers["content-length"], "1000");
          assert.ok(part.body.equals(q4.subarray(1000, 2000)));

          const open = await raw(url, `${base}/${Q4}`, { headers: { range: `bytes=${q4.length - 10}-` } });
          assert.equal(open.status, 206);
          assert.ok(open.body.equals(q4.subarray(q4.length - 10)));
          const suffix = await raw(url, `${base}/${Q4}`, { headers: { range: "bytes=-5" } });
          assert.ok(suffix.body.equals(q4.subarray(q4.length - 5)));

          const outside = await raw(url, `${base}/${Q4}`, { headers: { range: `bytes=${q4.length}-` } });
          assert.equal(outside.status, 416);
          assert.equal(outside.headers["content-range"], `bytes */${q4.length}`);
          assert.equal(JSON.parse(outside.body.toString()).error.code, "range_not_satisfiable");

          // If-Range with another entity tag: the range is ignored and the whole (current) file is sent.
          const stale = await raw(url, `${base}/${Q4}`, { headers: { range: "bytes=0-9", "if-range": '"something-older"' } });
          assert.equal(stale.status, 200);
          assert.equal(stale.body.length, q4.length);

          const cached = await raw(url, `${base}/${Q4}`, { headers: { "if-none-match": `"${sha}"` } });
          assert.equal(cached.status, 304);
          assert.equal(cached.body.length, 0);
          assert.equal(cached.headers.etag, `"${sha}"`);
          const changed = await raw(url, `${base}/${Q4}`, { headers: { "if-none-match": '"other"' } });
          assert.equal(changed.status, 200);

          const head = await raw(url, `${base}/${Q4}`, { method: "HEAD" });
          assert.equal(head.status, 200);
          assert.equal(head.headers["content-length"], String(q4.length));
          assert.equal(head.body.length, 0);

          const noKey = await raw(url, `${base}/${Q4}`, { headers: { authorization: "" } });
          assert.equal(noKey.status, 401);
          assert.equal(noKey.headers["www-authenticate"], "Bearer");
          assert.equal(JSON.parse(noKey.body.toString()).error.type, "authentication_error");
          // Auth comes first: a caller without a key learns nothing about paths.
          assert.equal((await raw(url, "/mirror/../etc/passwd", { headers: { authorization: "Bearer wrong" } })).status, 401);

          const incomplete = await raw(url, `${base}/${Q8}`);
          assert.equal(incomplete.status, 404);
          assert.match(JSON.parse(incomplete.body.toString()).error.message, /no complete file 'tiny-llama-Q8_0\.gguf'/);
          assert.equal((await raw(url, `${base}/nothing.gguf`)).status, 404);
          assert.equal((await raw(url, `${base}/`)).status, 404);
          assert.equal((await raw(url, `${base}/${Q4}`, { method: "POST" })).status, 405);

          const refused: [string, RegExp][] = [
            [`${base}/../${made.version}/${Q4}`, /file segment 1 '\.\.' is not allowed \(it is '\.\.'/],
            [`/mirror/${MODEL}/../x/${Q4}`, /the version '\.\.' is not allowed/],
            [`/mirror/%2e%2e/${made.version}/${Q4}`, /the model '\.\.' is not allowed/],
            [`/mirror/..%2F..%2Fetc/${made.version}/passwd`, /the model '\.\.\/\.\.\/etc' is not allowed \(it contains '\/'\)/],
            [`${base}/Q2_K%2F..%2F..%2Fx.gguf`, /contains '\/'/],
            [`${base}/%2Fetc%2Fpasswd`, /contains '\/'/],
            [`${base}/a%5Cb.gguf`, /contains a backslash/],
            [`${base}//${Q4}`, /file segment 1 '' is not allowed \(it is empty\)/],
            [`${base}/${Q8}.partial`, /reserves for downloads in progress/],
            [`${base}/%0Aevil`, /control characters/],
            [`${base}/%E0%A4%A`, /not valid percent-encoding/],
          ];
          for (const [requestPath, message] of refused) {
            const answer = await raw(url, requestPath);
            assert.equal(answer.status, 400, `${requestPath}: ${answer.body.toString()}`);
            const error = JSON.parse(answer.body.toString()).error;
            assert.equal(error.code, "invalid_path");
            assert.match(error.message, message, requestPath);
          }
        });
      } finally {
        hub.setFault(null);
        await mirror.close();
      }
    },
  );
});

test("parseRange reads one range and ignores what it does not serve", () => {
  assert.deepEqual(parseRange("bytes=0-0", 10), { start: 0, end: 0 });
  assert.deepEqual(parseRange("bytes=5-100", 10), { start: 5, end: 9 });
  assert.deepEqual(parseRange("bytes=-3", 10), { start: 7, end: 9 });
  assert.deepEqual(parseRange("bytes=-30", 10), { start: 0, end: 9 });
  assert.equal(parseRange("bytes=10-", 10), "unsatisfiable");
  assert.equal(parseRange("bytes=-0", 10), "unsatisfiable");
  assert.equal(parseRange("bytes=0-1,3-4", 10), null);
  assert.equal(parseRange("bytes=5-2", 10), null);
  assert.equal(parseRange("items=0-1", 10), null);
});

// ---------------------------------------------------------------------------------------

describe("what a fetch picks", () => {
  const GiB = 1024 ** 3;
  const planner =
    (memoryBytes: number): MirrorPlanner =>
    (query, signal) =>
      planRepository({
        ...query,
        registry,
        pool: localPool({ hostname: "stand-in-node", cores: 8, totalMemoryBytes: memoryBytes, freeMemoryBytes: memoryBytes }),
        signal,
      });

  testBothStores(
    "without quant or file a fetch takes the plan's recommendation, says so, and agrees with the plan; with nothing fitting it takes the default and says why",
    async (store) => {
      const dataDir = await tempDir();
      const mirror = new Mirror({ store, root: path.join(dataDir, "mirror") });
      try {
        // The stand-in repository's quantisations are all tiny: on a 16 GiB node every one fits,
        // and the plan recommends the best quality (F16), not the default Q4_K_M.
        const roomy = planner(16 * GiB);
        const planned = await roomy({ repo: GGUF_REPO, contextSize: 2048 }, new AbortController().signal);
        const recommended = planned.plan.artifacts.find((a) => a.id === planned.plan.recommendation?.artifact.id);
        assert.equal(recommended?.label, "F16");
        const started = await adminApp(mirror, registry, { planner: roomy }).request("/api/v1/mirror", {
          method: "POST",
          body: JSON.stringify({ repo: GGUF_REPO, model: "planned", context: 2048 }),
        });
        assert.equal(started.status, 202, JSON.stringify(await started.clone().json()));
        const answer = await json<StartedFetch>(started);
        assert.deepEqual(
          answer.files.map((f) => f.path),
          recommended?.files,
          "the fetch and the plan pick the same file",
        );
        assert.deepEqual([answer.picked.by, answer.picked.artifact, answer.set], ["plan", "F16", "F16"]);
        assert.match(answer.picked.reason, /what 'llmgw ctl model plan' recommends for this server for a 2048-token context\. Recommended: F16 on the CPU/);
        await versionIn(adminApp(mirror), "planned", "complete");

        // A 1 GiB node offers nothing once the OS reserve is kept: nothing fits, so the default.
        const cramped = await adminApp(mirror, registry, { planner: planner(1 * GiB) }).request("/api/v1/mirror", {
          method: "POST",
          body: JSON.stringify({ repo: GGUF_REPO, model: "cramped" }),
        });
        assert.equal(cramped.status, 202);
        const fallback = await json<StartedFetch>(cramped);
        assert.deepEqual([fallback.picked.by, fallback.set], ["default", "Q4_K_M"]);
        assert.match(fallback.picked.reason, /nothing in the plan fits this server for a 16384-token context\. Nothing fits this pool/);

        // Asked for a quantisation: that one, said as such; the planner is not consulted.
        const asked = await json<StartedFetch>(
          await adminApp(mirror, registry, { planner: roomy }).request("/api/v1/mirror", {
            method: "POST",
            body: JSON.stringify({ repo: GGUF_REPO, quant: "Q8_0", model: "asked" }),
          }),
        );
        assert.deepEqual(asked.picked, { by: "quant", artifact: "Q8_0", reason: "asked for with quant Q8_0" });
        await versionIn(adminApp(mirror), "cramped", "complete");
        await versionIn(adminApp(mirror), "asked", "complete");

        const fetches = await readAudit(store.db, { action: "mirror.fetch" });
        assert.deepEqual(fetches.map((e) => [e.actor, e.target, e.detail.set, e.detail.picked_by]).reverse(), [
          ["admin:admin", `planned/${info.shortSha}`, "F16", "plan"],
          ["admin:admin", `cramped/${info.shortSha}`, "Q4_K_M", "default"],
          ["admin:admin", `asked/${info.shortSha}`, "Q8_0", "quant"],
        ]);
      } finally {
        await mirror.close();
      }
    },
  );
});

describe("deleting a version the catalog uses", () => {
  testBothStores("DELETE is refused naming the catalog models that use the version, unless forced; both are audited", async (store) => {
    const dataDir = await tempDir();
    const mirror = new Mirror({ store, root: path.join(dataDir, "mirror") });
    // The real door check: the catalog models below must name complete mirrored files.
    const catalog = new Catalog({ store, box: SecretBox.fromKey(randomBytes(32)), weights: new DiskWeightsChecker({ mirror }) });
    await catalog.refresh();
    const app = adminApp(mirror, registry, { modelsUsing: catalogModelsUsing(catalog) });
    try {
      const made = planMirrorFetch({ registry, repoInfo: info, chosen: { files: info.files.filter((f) => f.path === Q8) } });
      assert.equal(
        (await mirror.fetchVersion({ model: MODEL, version: made.version, repo: made.repo, revision: made.revision, files: made.files })).complete,
        true,
      );
      const other = await mirror.fetchVersion({ model: MODEL, version: "otherversion", repo: made.repo, revision: made.revision, files: made.files });
      assert.equal(other.complete, true);
      const source = { kind: "mirror", model: MODEL, version: made.version, file: Q8 };
      for (const name of ["tiny-b", "tiny-a"]) {
        await catalog.create({ name, source, profiles: [{ name: "cpu", engine: "llamacpp" }], scaling: { min: 0, max: 1 } }, "admin:root");
      }

      const refused = await app.request(`/api/v1/mirror/${MODEL}/${made.version}`, { method: "DELETE" });
      assert.equal(refused.status, 409);
      const { error } = await json<ErrorAnswer>(refused);
      assert.equal(error.code, "mirror_version_in_use");
      assert.match(error.message, /in use by the catalog models 'tiny-a', 'tiny-b'.*--force \(DELETE \/api\/v1\/mirror\/.*\?force=true\)/);
      assert.ok((await mirror.pathFor(MODEL, made.version, Q8)) !== null, "nothing was deleted");

      const badForce = await app.request(`/api/v1/mirror/${MODEL}/${made.version}?force=maybe`, { method: "DELETE" });
      assert.deepEqual([badForce.status, (await json<ErrorAnswer>(badForce)).error.param], [400, "force"]);

      // A version nobody uses goes without force.
      const unused = await app.request(`/api/v1/mirror/${MODEL}/otherversion`, { method: "DELETE" });
      assert.equal(unused.status, 200);
      assert.equal((await json<Deleted>(unused)).deleted.forced, undefined);

      const forced = await app.request(`/api/v1/mirror/${MODEL}/${made.version}?force=true`, { method: "DELETE" });
      assert.equal(forced.status, 200);
      assert.deepEqual((await json<Deleted>(forced)).deleted, {
        model: MODEL,
        version: made.version,
        files: 1,
        bytes: 655360,
        forced: true,
        usedBy: ["tiny-a", "tiny-b"],
      });
      assert.equal(await mirror.pathFor(MODEL, made.version, Q8), null);

      const deletes = await readAudit(store.db, { action: "mirror.delete" });
      assert.deepEqual(deletes.map((e) => [e.actor, e.target, e.detail]).reverse(), [
        ["admin:admin", `${MODEL}/otherversion`, { bytes: 655360, files: 1 }],
        ["admin:admin", `${MODEL}/${made.version}`, { bytes: 655360, force: true, used_by: ["tiny-a", "tiny-b"], files: 1 }],
      ]);
    } finally {
      await mirror.close();
    }
  });
});

describe("verification over the API", () => {
  testBothStores(
    "POST /api/v1/mirror/verify hashes in the background and GET shows each file; a changed file is refused by the file server with the reason; runs are audited",
    async (store) => {
      const dataDir = await tempDir();
      const mirror = new Mirror({ store, root: path.join(dataDir, "mirror") });
      const app = adminApp(mirror);
      const verify = async (body: unknown) => {
        const started = await app.request("/api/v1/mirror/verify", { method: "POST", body: JSON.stringify(body) });
        assert.equal(started.status, 202, JSON.stringify(await started.clone().json()));
        const run = await json<VerifyAnswer>(started);
        assert.equal(run.progress, `/api/v1/mirror/verify/${run.id}`);
        return eventually("the verification to end", async () => {
          const now = await json<VerifyRunView>(await app.request(run.progress));
          return now.state === "running" ? false : now;
        });
      };
      try {
        assert.equal((await app.request("/api/v1/mirror", { method: "POST", body: JSON.stringify({ repo: GGUF_REPO, quant: "Q4_K_M" }) })).status, 202);
        await versionIn(app, MODEL, "complete");
        const file = path.join(dataDir, "mirror", MODEL, info.shortSha, Q4);
        const published = createHash("sha256")
          .update(await readFile(file))
          .digest("hex");

        const clean = await verify({ model: MODEL, version: info.shortSha });
        assert.deepEqual([clean.state, clean.ok, clean.failed, clean.skipped], ["done", 1, 0, 0]);
        assert.deepEqual(
          clean.files.map((f) => [f.file, f.result, f.bytesDone, f.actualSha256]),
          [[Q4, "ok", 655360, published]],
        );

        // Same size, other bytes: served with the old sha256 as ETag before this change.
        const bytes = await readFile(file);
        bytes[1000] = (bytes[1000] ?? 0) ^ 0xff;
        await writeFile(file, bytes);
        const later = new Date(Date.now() + 120_000);
        await utimes(file, later, later);
        await withFileServer(mirror, async (url) => {
          const changed = await raw(url, `/mirror/${MODEL}/${info.shortSha}/${Q4}`);
          assert.equal(changed.status, 409);
          assert.equal(changed.headers.etag, undefined);
          assert.equal(JSON.parse(changed.body.toString()).error.code, "mirror_file_changed");

          const failed = await verify({ model: MODEL });
          assert.deepEqual([failed.ok, failed.failed], [0, 1]);
          const tampered = createHash("sha256").update(bytes).digest("hex");
          const message = failed.files[0]?.message ?? "";
          assert.ok(message.includes(published) && message.includes(tampered), message);
          const refused = await raw(url, `/mirror/${MODEL}/${info.shortSha}/${Q4}`);
          assert.equal(refused.status, 404);
          const error = JSON.parse(refused.body.toString()).error;
          assert.equal(error.code, "mirror_file_failed");
          assert.ok(error.message.includes(tampered), error.message);
        });

        const everything = await verify({});
        assert.deepEqual([everything.model, everything.files.length], [null, 1]);

        const bad = async (body: unknown, status: number) => {
          const response = await app.request("/api/v1/mirror/verify", { method: "POST", body: JSON.stringify(body) });
          assert.equal(response.status, status, JSON.stringify(body));
          return (await json<ErrorAnswer>(response)).error;
        };
        assert.equal((await bad({ version: info.shortSha }, 400)).param, "model");
        assert.equal((await bad({ colour: "blue" }, 400)).code, "invalid_field");
        assert.equal((await bad({ model: "nobody" }, 404)).code, "mirror_version_not_found");
        assert.equal((await app.request("/api/v1/mirror/verify/no-such-run")).status, 404);

        const audited = await readAudit(store.db, { action: "mirror.verify" });
        assert.deepEqual(audited.map((e) => [e.actor, e.target, e.detail.ok, e.detail.failed]).reverse(), [
          ["admin:admin", `${MODEL}/${info.shortSha}`, 1, 0],
          ["admin:admin", MODEL, 0, 1],
          ["admin:admin", "mirror", 0, 1],
        ]);
      } finally {
        await mirror.close();
      }
    },
  );
});
