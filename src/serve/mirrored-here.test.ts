// A job step that reads mirrored bytes on a server that does not hold them gets them: two
// servers of a cluster, `a` and `b`, on one store, each a real Mirror with its own folder
// and the real file server on loopback (test/support/mirror-servers.ts; a's behind the TCP
// fault proxy, so it can stop answering without closing connections); the origin is the
// stand-in Hub. `a` mirrored a real tiny GGUF; `b` runs the check step (a job resumed
// there after `a` died). "live" is a set the test changes; it stands for the cluster's
// heartbeat rows.
import { after, before, describe } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { LlmgwError } from "../core/errors.ts";
import type { Store } from "../store/store.ts";
import type { Mirror, MirrorFetchFile } from "../mirror/mirror.ts";
import { eventually } from "../../test/support/eventually.ts";
import { errorOf, nodeRequest as get, twoMirrorServers } from "../../test/support/mirror-servers.ts";
import { fakeCommitSha, startStandInHub, type StandInHub } from "../../test/support/stand-in-hub.ts";
import { tinyGgufBytes } from "../../test/support/stand-in-repos.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { checkMirrored, type PlannedFetch } from "./job-steps.ts";
import type { StepHandle } from "./jobs.ts";
import { bringMirroredHere } from "./mirrored-here.ts";

const REPO = "acme/tiny";
const FILE = "tiny-Q4_K_M.gguf";
const REVISION = fakeCommitSha(REPO);
const dirs: string[] = [];
let hub: StandInHub;
let content: Buffer;
let sha256: string;

before(async () => {
  content = await tinyGgufBytes({ seed: 7 });
  sha256 = createHash("sha256").update(content).digest("hex");
  hub = await startStandInHub({ repos: [{ name: REPO, files: [{ path: FILE, content, lfs: true }] }] });
});

after(async () => {
  await hub.close();
  await Promise.all(dirs.map((dir) => rm(dir, { recursive: true, force: true })));
});

async function tempDir(): Promise<string> {
  const dir = await mkdtemp(path.join(tmpdir(), "llmgw-mirrored-here-"));
  dirs.push(dir);
  return dir;
}

/** Servers `a` (its file server behind a fault proxy) and `b` on one store. */
const twoServers = (store: Store) => twoMirrorServers(store, { behindFaultProxy: ["a"] });

/** The file of a fresh version (each run its own: the Hub is shared), from the Hub or a local path. */
function planned(version: string, file: Omit<MirrorFetchFile, "headers" | "path">): PlannedFetch {
  return { model: "tiny", version, repo: REPO, revision: REVISION, files: [{ path: FILE, ...file }], totalBytes: content.length };
}

function hubFile(): Omit<MirrorFetchFile, "headers" | "path"> {
  return { url: `${hub.url}/${REPO}/resolve/${REVISION}/${FILE}`, sha256, size: content.length };
}

async function fetchInto(mirror: Mirror, plan: PlannedFetch, signal?: AbortSignal) {
  return mirror.fetchVersion({
    model: plan.model,
    version: plan.version,
    repo: plan.repo,
    revision: plan.revision,
    files: plan.files.map((file) => ({ ...file, headers: {} })),
    ...(signal === undefined ? {} : { signal }),
  });
}

function recordingStep(): StepHandle & { details: string[] } {
  const details: string[] = [];
  return { details, detail: (text) => details.push(text), progress: () => undefined };
}

function holders(store: Store, version: string) {
  return store.db.selectFrom("mirror_holders").select(["server"]).where("version", "=", version).orderBy("server").execute();
}

const check = (plan: PlannedFetch, mirror: Mirror, step: StepHandle) =>
  checkMirrored({
    planned: plan,
    entry: FILE,
    format: "gguf",
    modelName: "tiny",
    contextPool: 512,
    parallel: 1,
    mirror,
    signal: AbortSignal.timeout(60_000),
    step,
  });

describe("a job step reads mirrored bytes this server does not hold", () => {
  testBothStores("held by a running server: the check step copies them from it, reads the header and says so", async (store) => {
    const cluster = await twoServers(store);
    const plan = planned(`v-${randomBytes(4).toString("hex")}`, hubFile());
    try {
      assert.equal((await fetchInto(cluster.a.mirror, plan)).complete, true);
      const fromHubBefore = hub.requests.length;
      const step = recordingStep();
      const checked = await check(plan, cluster.b.mirror, step);
      assert.match(checked.detail, /^llama, .* trained for \d+ tokens; .*\(1 file copied here from server 'a'\)$/);
      assert.deepEqual(checked.origin, [{ path: FILE, sha256, bytes: content.length }]);
      assert.ok(
        step.details.some((line) => /copying the weights here from server 'a'/.test(line)),
        step.details.join("\n"),
      );
      assert.equal((await cluster.b.mirror.check(plan.model, plan.version, FILE)).kind, "ok");
      assert.deepEqual(await holders(store, plan.version), [{ server: "a" }, { server: "b" }]);
      assert.equal(hub.requests.length, fromHubBefore, "nothing was fetched from the Hub again");
    } finally {
      await cluster.close();
    }
  });

  testBothStores("held by a server that counts as running but answers nothing: the origin is used after the stall deadline", async (store) => {
    const cluster = await twoServers(store);
    const plan = planned(`v-${randomBytes(4).toString("hex")}`, hubFile());
    try {
      await fetchInto(cluster.a.mirror, plan);
      // a vanished without closing anything: its connections stay open, and no byte comes back.
      await cluster.proxyOf("a").set("blackhole");
      const fromHubBefore = hub.requests.length;
      const step = recordingStep();
      const note = await bringMirroredHere({
        mirror: cluster.b.mirror,
        model: plan.model,
        version: plan.version,
        files: [FILE],
        signal: AbortSignal.timeout(60_000),
        step,
        holderStallMs: 1000,
      });
      assert.match(note ?? "", /^1 file copied here from the origin \(http:\/\/127\.0\.0\.1:\d+\)$/);
      assert.ok(
        step.details.some((line) =>
          /copying tiny-Q4_K_M\.gguf here: no running server that holds it answered\. This server is fetching it from its origin/.test(line),
        ),
        step.details.join("\n"),
      );
      assert.equal((await cluster.b.mirror.check(plan.model, plan.version, FILE)).kind, "ok");
      assert.ok(
        hub.requests.slice(fromHubBefore).some((request) => request.path.startsWith("/cdn/")),
        "the bytes came from the Hub",
      );
      // The same sha256 check as the first fetch: b's copy is of the bytes a verified.
      assert.equal((await cluster.b.mirror.lookup(plan.model, plan.version, FILE))?.sha256, sha256);
    } finally {
      await cluster.close();
    }
  });

  testBothStores("no running holder and a local-file source: the step fails and says what to do", async (store) => {
    const cluster = await twoServers(store);
    const local = path.join(await tempDir(), FILE);
    await writeFile(local, content);
    const plan = planned(`v-${randomBytes(4).toString("hex")}`, { url: pathToFileURL(local).href, sha256, size: content.length });
    try {
      assert.equal((await fetchInto(cluster.a.mirror, plan)).complete, true);
      cluster.live.delete("a");
      await assert.rejects(check(plan, cluster.b.mirror, recordingStep()), (error: unknown) => {
        assert.ok(error instanceof LlmgwError);
        assert.equal(error.code, "mirror_holders_down");
        assert.match(error.message, /'tiny-Q4_K_M\.gguf' \(held by 'a' \(not running\)\) of tiny\/v-\w+ is not on this server \('b'\)/);
        assert.match(error.message, /its source is a local file on the server that fetched it \('a'\)/);
        assert.match(error.message, /Start a server that holds it, then run the job again\.$/);
        return true;
      });
    } finally {
      await cluster.close();
    }
  });

  testBothStores(
    "a file still being fetched by a server that died: nodes are told to wait (503, Retry-After), and the fetch resumed elsewhere completes",
    async (store) => {
      const cluster = await twoServers(store);
      const plan = planned(`v-${randomBytes(4).toString("hex")}`, hubFile());
      const stopA = new AbortController();
      try {
        // a's download hangs at the CDN, and a is lost meanwhile (its fetch never ends by itself).
        hub.setFault({ kind: "hang", match: "/cdn/" });
        const fetchOfA = fetchInto(cluster.a.mirror, plan, stopA.signal).catch(() => undefined);
        await eventually("a's fetch under way", async () => {
          const row = await store.db.selectFrom("mirror_files").select("state").where("version", "=", plan.version).executeTakeFirst();
          return row?.state === "fetching" || row?.state === "pending" ? true : undefined;
        });
        cluster.live.delete("a");
        const filePath = `${cluster.b.url}/mirror/${plan.model}/${plan.version}/${FILE}`;
        const waiting = await get(filePath);
        assert.equal(waiting.status, 503);
        assert.equal(waiting.headers["retry-after"], "5");
        const said = errorOf(waiting);
        assert.equal(said.code, "mirror_file_fetching");
        assert.match(said.message, /being fetched by server 'a', which is not running now/);

        // The job resumes on b: its mirror step fetches from the source, and nodes are served.
        hub.setFault(null);
        assert.equal((await fetchInto(cluster.b.mirror, plan)).complete, true);
        const served = await get(filePath);
        assert.equal(served.status, 200);
        assert.ok(served.body.equals(content));
        stopA.abort();
        await fetchOfA;
      } finally {
        hub.setFault(null);
        stopA.abort();
        await cluster.close();
      }
    },
  );
});
