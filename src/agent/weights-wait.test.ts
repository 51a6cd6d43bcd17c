// Weights that cannot be had right now are waited for, not counted against the engine. A
// real NodeAgent with its real weight cache (NodeWeights → WeightCache) fetches a tiny GGUF
// from the server's real mirror file server (createMirrorFileHandler over a Mirror on
// SQLite) on loopback; the server answers 503 `mirror_fetching_from_origin` to the first
// requests, as a server of a cluster does while it copies a file whose holders are down
// from its origin. The fleet side is an in-process stand-in for the agent protocol that
// hands out one assignment and keeps every heartbeat; the engine is the stand-in engine
// (test/support/stand-in-engine.ts), a real child process.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdir, mkdtemp, readFile, rm } from "node:fs/promises";
import http from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import path from "node:path";
import { pathToFileURL } from "node:url";
import type { Profile } from "../catalog/model-schema.ts";
import { AuthenticationError, UnavailableError, UpstreamError } from "../core/errors.ts";
import { sendError } from "../core/http.ts";
import { silentLogger } from "../core/log.ts";
import type { Assignment, AssignmentSet, Assignments, HeartbeatReply, HeartbeatReport, ReplicaReport } from "../fleet/agent-protocol.ts";
import { writeTinyLlamaGguf } from "../gguf/tiny-model.ts";
import { createMirrorFileHandler, isMirrorFileRequest } from "../mirror/mirror-file-server.ts";
import { Mirror } from "../mirror/mirror.ts";
import { eventually } from "../../test/support/eventually.ts";
import { writeStandInEngine } from "../../test/support/stand-in-engine.ts";
import { openSqliteTestStore } from "../../test/support/stores.ts";
import { abortableDelay } from "./engine-health.ts";
import { NodeAgent } from "./node-agent.ts";
import { NodeWeights } from "./node-weights.ts";
import { stopAllSupervisors } from "./process-groups.ts";
import type { WaitingNote } from "./supervisor-options.ts";
import { WeightCache } from "./weight-cache.ts";
import { WeightsIdentity } from "./weights-identity.ts";
import { prepareWaitingForWeights, WeightsUnavailableError } from "./weights-wait.ts";

const CREDENTIAL = "node-credential-for-tests";
const MODEL = "tiny";
const VERSION = "0123456789ab";
const FILE = "tiny.gguf";

let dir = "";
let cleanupStore: () => Promise<void>;
let mirror: Mirror;
let engineScript = "";
let published: { bytes: number; sha256: string };

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), "llmgw-weights-wait-"));
  engineScript = await writeStandInEngine(dir);
  const source = path.join(dir, "source");
  await mkdir(source);
  await writeTinyLlamaGguf({ path: path.join(source, FILE), seed: 3 });
  const content = await readFile(path.join(source, FILE));
  published = { bytes: content.length, sha256: createHash("sha256").update(content).digest("hex") };
  const opened = await openSqliteTestStore();
  cleanupStore = opened.cleanup;
  mirror = new Mirror({ store: opened.store, root: path.join(dir, "mirror"), retries: 0 });
  const fetched = await mirror.fetchVersion({
    model: MODEL,
    version: VERSION,
    repo: pathToFileURL(source).href,
    revision: "local-revision",
    files: [{ path: FILE, url: pathToFileURL(path.join(source, FILE)).href, sha256: published.sha256, size: published.bytes }],
  });
  assert.equal(fetched.complete, true);
});

after(async () => {
  await stopAllSupervisors();
  await mirror.close();
  await cleanupStore();
  await rm(dir, { recursive: true, force: true });
});

/** The server's mirror file server, answering 503 as a server copying the file from its origin does, to the first `busy` requests. */
async function startServer(busy: number): Promise<{ url: string; answers: number[]; close: () => Promise<void> }> {
  const files = createMirrorFileHandler({
    mirror,
    authorize: async (req) => {
      if (req.headers.authorization !== `Bearer ${CREDENTIAL}`) throw new AuthenticationError("This node credential is not valid.");
    },
  });
  const answers: number[] = [];
  const server = http.createServer((req, res) => {
    res.on("finish", () => answers.push(res.statusCode));
    if (!isMirrorFileRequest(req.url)) return void res.writeHead(404).end();
    if (answers.length < busy) {
      // What mirror-file-server.ts answers while it fetches a file no running server holds from its origin.
      const copying = new UnavailableError(
        `'${FILE}' of ${MODEL}/${VERSION} is not on this server ('b'), and no server that holds it is running: 'a' (not running). ` +
          "This server is fetching it from its origin (http://hub.example) meanwhile: 0 B of 1 MiB so far. Ask again in a few seconds.",
        { code: "mirror_fetching_from_origin", retryAfterSeconds: 2 },
      );
      return sendError(req, res, copying);
    }
    void files(req, res);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    answers,
    close: async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** The fleet's side of the agent protocol, in process: one assignment, every heartbeat kept. */
class OneAssignment implements Assignments {
  readonly reports: HeartbeatReport[] = [];

  constructor(private readonly set: AssignmentSet) {}

  join(): never {
    throw new Error("the node has joined already");
  }

  async heartbeat(_credential: string, report: HeartbeatReport): Promise<HeartbeatReply> {
    this.reports.push(structuredClone(report));
    return { nodeId: "n1", state: "ready", assignmentsVersion: this.set.version, heartbeatIntervalMs: 100 };
  }

  async assignments(_credential: string, options: { knownVersion: string | null; waitMs: number; signal: AbortSignal }): Promise<AssignmentSet> {
    if (options.knownVersion !== this.set.version) return this.set;
    await abortableDelay(options.waitMs, options.signal);
    return this.set;
  }

  replicaReports(): ReplicaReport[] {
    return this.reports.flatMap((report) => report.replicas);
  }
}

describe("waiting for weights", () => {
  test("a server that cannot send the weights yet (503) keeps the replica waiting with the reason; the engine starts once they come, with no failure counted", async () => {
    const server = await startServer(4);
    const nodeDir = await mkdtemp(path.join(dir, "node-"));
    const identity = new WeightsIdentity({ memoFile: path.join(nodeDir, "weights-verified.json"), cacheRoot: path.join(nodeDir, "weights") });
    const cache = new WeightCache({ root: path.join(nodeDir, "weights"), serverUrl: server.url, credential: () => CREDENTIAL, identity, retries: 0 });
    const assignment: Assignment = {
      replicaId: "r-tiny-1",
      modelId: "m1",
      modelName: MODEL,
      profile: { name: "cpu", engine: "llamacpp" } as Profile,
      engineKey: "engine-key",
      fingerprint: "f1",
      source: { kind: "mirror", model: MODEL, version: VERSION, file: FILE },
      files: [{ file: FILE, ...published }],
      gpus: [],
      nodeIds: ["n1"],
    };
    const fleet = new OneAssignment({ version: "1", assignments: [assignment] });
    const agent = new NodeAgent({
      assignments: fleet,
      credential: CREDENTIAL,
      name: "n1",
      address: "127.0.0.1",
      inventory: { cores: 2, memoryBytes: 2 * 1024 ** 3, gpus: [], engines: [] },
      labels: {},
      stateRoot: path.join(nodeDir, "runs"),
      weights: new NodeWeights({ cache, identity }),
      launch: ({ host, port }) => ({
        command: process.execPath,
        args: [engineScript, "--port", String(port), "--host", host],
        env: {},
        host,
        port,
        healthPath: "/health",
      }),
      logger: silentLogger(),
      // Without the wait, 3 failed weight fetches would park the replica before the 4th 503 is answered.
      supervisor: { backoff: { initialMs: 20, maxMs: 100 }, parkAfter: { failures: 3, windowMs: 60_000 }, healthIntervalMs: 20, stopGraceMs: 300 },
      weightsWait: { baseMs: 150, maxMs: 150 },
    });
    agent.start();
    try {
      const ready = await eventually("the replica to be ready", () => fleet.replicaReports().find((r) => r.state === "ready"));
      assert.deepEqual(server.answers, [503, 503, 503, 503, 200]);
      assert.deepEqual([ready.attempt, ready.failures, ready.lastError, ready.lastErrorCode], [1, 0, null, null], "the wait left nothing behind");
      assert.equal(ready.weightsVerified, true);

      const waiting = fleet.replicaReports().filter((r) => r.lastErrorCode === "weights_not_served_now");
      assert.ok(waiting.length > 0, "the wait was reported");
      for (const report of waiting) {
        assert.equal(report.state, "fetching");
        assert.equal(report.failures, 0);
        assert.match(
          report.lastError ?? "",
          /^waiting for weights: The server at http:\/\/127\.0\.0\.1:\d+ cannot send tiny\/0123456789ab\/tiny\.gguf now \(503\): .*This server is fetching it from its origin/,
        );
      }
      assert.ok(
        fleet.replicaReports().every((r) => r.state !== "failed" && r.state !== "parked"),
        "no report counted the wait as a failure",
      );
    } finally {
      await agent.stop();
      await cache.close();
      await server.close();
    }
  });

  test("what a later try cannot change is thrown at once; a wait ends with the note cleared", async () => {
    const notes: Array<WaitingNote | null> = [];
    const base = {
      signal: new AbortController().signal,
      waiting: (note: WaitingNote | null) => notes.push(note),
      logger: silentLogger(),
      backoff: { baseMs: 1, maxMs: 1 },
    };
    const mismatch = new UpstreamError("tiny.gguf has sha256 aaa, but the server published bbb.", { code: "weights_download_mismatch", retryable: true });
    await assert.rejects(prepareWaitingForWeights({ ...base, prepare: () => Promise.reject(mismatch) }), (error) => error === mismatch);
    assert.deepEqual(notes, [], "a sha256 mismatch is a failure, not a wait");

    let tries = 0;
    const prepared = await prepareWaitingForWeights({
      ...base,
      clock: () => 1_000,
      prepare: async () => {
        tries += 1;
        if (tries < 3) throw new WeightsUnavailableError("The server at http://s cannot send it now (503).", { code: "weights_not_served_now" });
        return "path";
      },
    });
    assert.equal(prepared, "path");
    assert.deepEqual(notes, [
      { code: "weights_not_served_now", message: "waiting for weights: The server at http://s cannot send it now (503).", retryAt: 1_001 },
      { code: "weights_not_served_now", message: "waiting for weights: The server at http://s cannot send it now (503).", retryAt: 1_001 },
      null,
    ]);

    const stopped = new AbortController();
    const waiting = prepareWaitingForWeights({
      ...base,
      signal: stopped.signal,
      backoff: { baseMs: 60_000, maxMs: 60_000 },
      waiting: () => stopped.abort(new Error("the replica was stopped")),
      prepare: () => Promise.reject(new WeightsUnavailableError("not now", { code: "weights_not_served_now" })),
    });
    await assert.rejects(waiting, /the replica was stopped/, "a stop ends the wait at once");
  });
});
