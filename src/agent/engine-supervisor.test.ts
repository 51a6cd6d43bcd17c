// Drives the supervisor with REAL child processes: a tiny node HTTP server stands in for
// an engine (test/support/stand-in-engine.ts says which real behaviour each of its modes
// reproduces).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { request } from "undici";
import { ConflictError } from "../core/errors.ts";
import { openAiModelsValidator } from "../engines/openai-models-validator.ts";
import type { EngineLaunch, EngineValidationContext, SupervisorOptions } from "./engine-supervisor.ts";
import { assertPortFree, findFreePort } from "./free-port.ts";
import { liveEngineGroups, stopAllSupervisors } from "./process-groups.ts";
import { pruneRunFolders } from "./run-folders.ts";
import { eventually } from "../../test/support/eventually.ts";
import { processIsGone } from "../../test/support/engine-process.ts";
import {
  attemptRecords,
  inState,
  settled,
  supervisorHarness,
  untilSnapshot,
  writeStandInEngine,
  type SupervisorHarness,
} from "../../test/support/stand-in-engine.ts";

let dir = "";
let fakeEngine = "";

before(async () => {
  dir = await mkdtemp(join(tmpdir(), "llmgw-sup-"));
  fakeEngine = await writeStandInEngine(dir);
});

after(async () => {
  await stopAllSupervisors();
  await rm(dir, { recursive: true, force: true });
});

let rootCounter = 0;

/** A supervisor over the stand-in engine, in its own state root; `env` gives FAKE_* per attempt. */
function harness(
  env: (attempt: number) => Record<string, string>,
  { validate, ...overrides }: Partial<SupervisorOptions> & Pick<EngineLaunch, "validate"> = {},
): SupervisorHarness {
  rootCounter += 1;
  return supervisorHarness({ script: fakeEngine, replicaId: `replica-${rootCounter}`, root: join(dir, `root-${rootCounter}`), env, validate, overrides });
}

/** Cleanup after a failed assertion, so a broken supervisor does not leave processes behind. */
function killQuietly(pid: number): void {
  try {
    process.kill(pid, "SIGKILL");
  } catch {
    // Already gone: the expected case.
  }
}

function listenOn(host: string, port: number): Promise<Server> {
  return new Promise((resolveListen, rejectListen) => {
    const server = createServer();
    server.once("error", rejectListen);
    server.listen(port, host, () => resolveListen(server));
  });
}

test("findFreePort gives a bindable port and assertPortFree names host:port when it is taken", async () => {
  const port = await findFreePort("127.0.0.1");
  assert.ok(port > 0 && port < 65536);
  await assertPortFree("127.0.0.1", port);
  const holder = await listenOn("127.0.0.1", port);
  try {
    await assert.rejects(assertPortFree("127.0.0.1", port), (error: unknown) => {
      assert.ok(error instanceof ConflictError);
      assert.equal(error.code, "port_in_use");
      assert.match(error.message, new RegExp(`127\\.0\\.0\\.1:${port} is already in use`));
      return true;
    });
  } finally {
    holder.close();
  }
});

test("becomes ready with an endpoint, in an offline environment below a fresh state folder, and stops with SIGTERM", async () => {
  // A proxy in the agent's environment must neither reach the engine nor carry the health checks.
  const saved = { proxy: process.env.HTTP_PROXY, secret: process.env.LLMGW_TEST_PARENT_SECRET };
  process.env.HTTP_PROXY = "http://127.0.0.1:9";
  process.env.LLMGW_TEST_PARENT_SECRET = "must-not-leak";
  const { supervisor, events, root } = harness(() => ({ FAKE_MODE: "ok", FAKE_READY_AFTER_MS: "300" }));
  try {
    supervisor.start();
    const ready = await untilSnapshot(supervisor, inState("ready"));
    assert.equal(ready.attempt, 1);
    assert.equal(ready.failures, 0);
    assert.ok(ready.endpoint && ready.endpoint.host === "127.0.0.1" && ready.endpoint.port > 0);
    assert.ok(ready.pid !== null && ready.startedAt !== null && ready.readyAt !== null && ready.readyAt >= ready.startedAt);
    assert.ok(ready.readyAt - ready.startedAt >= 250, "ready only after the engine stopped answering 503");
    assert.deepEqual([...new Set(events.map((event) => event.state))], ["starting", "ready"]);

    const health = await request(`http://127.0.0.1:${ready.endpoint.port}/health`);
    assert.equal(health.statusCode, 200);
    await health.body.dump();

    const stateDir = ready.stateDir as string;
    assert.ok(stateDir.startsWith(resolve(root)));
    const env = JSON.parse(await readFile(join(stateDir, `env-${ready.pid}.json`), "utf8")) as Record<string, string>;
    assert.equal(env.HOME, join(stateDir, "home"));
    assert.equal(env.TMPDIR, join(stateDir, "tmp"));
    assert.equal(env.XDG_CACHE_HOME, join(stateDir, "cache"));
    assert.ok(env.HF_HOME?.startsWith(stateDir));
    for (const flag of ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "DO_NOT_TRACK", "VLLM_NO_USAGE_STATS"]) assert.equal(env[flag], "1", flag);
    assert.equal(env.FAKE_MODE, "ok", "the launch's own variables reach the engine");
    assert.equal(env.PATH, process.env.PATH);
    assert.equal(env.LLMGW_TEST_PARENT_SECRET, undefined, "the parent's environment is not passed blindly");
    assert.equal(env.HTTP_PROXY, undefined);

    const records = await attemptRecords(supervisor, stateDir);
    assert.equal(records.length, 1);
    const [record] = records;
    assert.equal(record?.attempt, 1);
    assert.equal(record?.result, "ready");
    assert.equal(record?.log, "attempt-1.log");
    assert.equal((record?.settings as { command?: string } | undefined)?.command, process.execPath);
    assert.match(await readFile(join(stateDir, "attempt-1.log"), "utf8"), /fake engine listening/);

    const pid = ready.pid;
    await supervisor.stop();
    const stopped = supervisor.snapshot();
    assert.equal(stopped.state, "stopped");
    assert.equal(stopped.pid, null);
    assert.equal(stopped.endpoint, null);
    assert.deepEqual(stopped.lastExit, { code: null, signal: "SIGTERM" });
    assert.ok(processIsGone(pid));
    assert.ok(!liveEngineGroups().includes(pid));
    assert.deepEqual(
      events.slice(-2).map((event) => event.state),
      ["stopping", "stopped"],
    );
  } finally {
    if (saved.proxy === undefined) delete process.env.HTTP_PROXY;
    else process.env.HTTP_PROXY = saved.proxy;
    if (saved.secret === undefined) delete process.env.LLMGW_TEST_PARENT_SECRET;
    else process.env.LLMGW_TEST_PARENT_SECRET = saved.secret;
    await supervisor.stop();
  }
});

test("an engine that exits before ready is a failure with its exit code and the last lines of its log; stop() cancels the backoff", async () => {
  const { supervisor } = harness(() => ({ FAKE_MODE: "exit", FAKE_MESSAGE: "error: model file not found: /models/missing.gguf" }), {
    backoff: { initialMs: 30_000, maxMs: 60_000 },
  });
  supervisor.start();
  const failed = await untilSnapshot(supervisor, inState("failed"));
  assert.equal(failed.lastErrorCode, "engine_exited");
  assert.match(failed.lastError ?? "", /exited before it was ready \(exit code 3\) on attempt 1/);
  assert.match(failed.lastError ?? "", /model file not found: \/models\/missing\.gguf/);
  assert.deepEqual(failed.lastExit, { code: 3, signal: null });
  assert.equal(failed.failures, 1);
  assert.equal(failed.pid, null);
  assert.equal(failed.endpoint, null);
  assert.ok(failed.retryAt !== null && failed.retryAt - Date.now() > 20_000, "the retry waits for the backoff");

  const records = await attemptRecords(supervisor, failed.stateDir as string);
  assert.deepEqual(
    records.map((record) => record.result),
    ["engine_exited"],
  );
  assert.match(String(records[0]?.error), /model file not found/);

  await supervisor.stop();
  // The retry was due 30 s after the failure: resolving before then means stop() did not wait for it.
  assert.ok(Date.now() < failed.retryAt, "stop() does not wait for the backoff");
  assert.equal(supervisor.snapshot().state, "stopped");
  await settled(supervisor);
  assert.equal(supervisor.snapshot().attempt, 1, "no attempt after stop()");
});

test("restarts after a crash while serving and becomes ready again on attempt 2", async () => {
  const { supervisor, events } = harness(
    (attempt): Record<string, string> => (attempt === 1 ? { FAKE_MODE: "die-after-ready", FAKE_FAIL_AFTER_MS: "150" } : { FAKE_MODE: "ok" }),
  );
  supervisor.start();
  const ready = await untilSnapshot(supervisor, (snapshot) => snapshot.state === "ready" && snapshot.attempt === 2);
  assert.equal(ready.failures, 1);
  const firstPid = events.find((event) => event.attempt === 1 && event.pid !== null)?.pid;
  assert.ok(firstPid !== undefined && firstPid !== null && firstPid !== ready.pid);
  const failed = events.find((event) => event.state === "failed");
  assert.equal(failed?.lastErrorCode, "engine_exited");
  assert.match(failed?.lastError ?? "", /exited while serving \(exit code 1\) on attempt 1/);
  assert.match(failed?.lastError ?? "", /crashed while serving/);
  assert.deepEqual(
    events.map((event) => `${event.state}:${event.attempt}`).filter((step, i, all) => step !== all[i - 1]),
    ["starting:1", "ready:1", "failed:1", "starting:2", "ready:2"],
  );
  const records = await attemptRecords(supervisor, ready.stateDir as string);
  assert.deepEqual(
    records.map((record) => [record.attempt, record.result, record.log]),
    [
      [1, "ready", "attempt-1.log"],
      [2, "ready", "attempt-2.log"],
    ],
  );
  // The hosting process's shutdown path: stopAllSupervisors stops every started supervisor.
  await stopAllSupervisors();
  assert.equal(supervisor.snapshot().state, "stopped");
  assert.ok(ready.pid !== null && processIsGone(ready.pid));
});

test("parks after N failures in the window, spawns nothing more, and unpark() starts a new run in a new folder", async () => {
  let mode = "exit";
  const { supervisor, prepared } = harness(() => ({ FAKE_MODE: mode, FAKE_MESSAGE: "fake engine: unsupported architecture" }), {
    parkAfter: { failures: 3, windowMs: 60_000 },
    backoff: { initialMs: 10, maxMs: 40 },
  });
  supervisor.start();
  const parked = await untilSnapshot(supervisor, inState("parked"));
  assert.equal(parked.attempt, 3);
  assert.equal(parked.failures, 3);
  assert.equal(parked.lastErrorCode, "engine_exited");
  assert.match(parked.lastError ?? "", /Parked after 3 failures within 60 s/);
  assert.match(parked.lastError ?? "", /unsupported architecture/);
  assert.equal(parked.retryAt, null);

  // settled(): the run loop has returned, so nothing is scheduled that could make a 4th attempt.
  await settled(supervisor);
  assert.equal(prepared(), 3, "no attempt after parking");
  assert.equal(supervisor.snapshot().state, "parked");
  const parkedDir = parked.stateDir as string;
  assert.ok(!existsSync(join(parkedDir, "attempt-4.log")));
  assert.equal((await attemptRecords(supervisor, parkedDir)).length, 3);

  // A new run would report "starting" at once, within start().
  supervisor.start();
  assert.equal(supervisor.snapshot().state, "parked", "start() does not leave the parked state; only unpark() does");
  await settled(supervisor);
  assert.equal(prepared(), 3);

  mode = "ok";
  assert.equal(supervisor.unpark(), true);
  const ready = await untilSnapshot(supervisor, inState("ready"));
  assert.equal(ready.attempt, 1);
  assert.equal(ready.failures, 0);
  assert.notEqual(ready.stateDir, parkedDir);
  assert.equal(supervisor.unpark(), false, "unpark() of a replica that is not parked does nothing");
  await supervisor.stop();
});

test("the readiness deadline kills the whole process group, including a forked helper that ignores SIGTERM", async () => {
  const pidFile = (attempt: number): string => join(dir, `grandchild-${attempt}.pid`);
  const { supervisor, events } = harness((attempt) => ({ FAKE_MODE: "never", FAKE_GRANDCHILD_PID_FILE: pidFile(attempt) }), {
    readyTimeoutMs: 1_500,
    stopGraceMs: 200,
    // A loaded machine may boot an engine so slowly that its deadline passes before it
    // listens; the next attempt then tries again, soon, until one sees the engine answer.
    backoff: { initialMs: 20, maxMs: 20 },
    parkAfter: { failures: 100, windowMs: 60_000 },
  });
  supervisor.start();
  // The engine forks its helper before it listens, so an attempt whose last health check
  // saw HTTP 503 had the helper in its group when the deadline passed.
  const failed = await untilSnapshot(supervisor, (snapshot) => snapshot.state === "failed" && /HTTP 503/.test(snapshot.lastError ?? ""));
  const enginePid = events.find((event) => event.attempt === failed.attempt && event.pid !== null)?.pid;
  const grandchildPid = Number(await readFile(pidFile(failed.attempt), "utf8"));
  try {
    await supervisor.stop();
    assert.equal(failed.lastErrorCode, "not_ready");
    assert.match(
      failed.lastError ?? "",
      /not ready within 1\.5 s on attempt \d+ \(last health check of http:\/\/127\.0\.0\.1:\d+\/health: HTTP 503\); its process group was killed/,
    );
    assert.equal(failed.pid, null);
    assert.ok(typeof enginePid === "number");
    assert.ok(grandchildPid > 0);
    // stop() ended a later attempt's group at most; this one was ended by its deadline.
    assert.ok(processIsGone(enginePid), "the engine is gone");
    assert.ok(processIsGone(grandchildPid), "the helper it forked is gone too: the whole group was killed");
  } finally {
    killQuietly(grandchildPid);
    await supervisor.stop();
  }
});

test("stop() escalates to SIGKILL when the engine ignores SIGTERM", async () => {
  const { supervisor } = harness(() => ({ FAKE_MODE: "ignore-term" }), { stopGraceMs: 400 });
  supervisor.start();
  const ready = await untilSnapshot(supervisor, inState("ready"));
  const startedStop = Date.now();
  await supervisor.stop();
  const tookMs = Date.now() - startedStop;
  assert.ok(tookMs >= 350, `stop() waited the grace before SIGKILL (took ${tookMs} ms)`);
  assert.deepEqual(supervisor.snapshot().lastExit, { code: null, signal: "SIGKILL" });
  assert.ok(ready.pid !== null && processIsGone(ready.pid));
  assert.match(await readFile(join(ready.stateDir as string, "attempt-1.log"), "utf8"), /ignoring SIGTERM/);
});

test("stop() while starting cancels cleanly: no process, no timer, the attempt recorded as stopped", async () => {
  const timers = (): number => process.getActiveResourcesInfo().filter((resource) => resource === "Timeout").length;
  const timersBefore = timers();
  const { supervisor } = harness(() => ({ FAKE_MODE: "never" }), { readyTimeoutMs: 60_000 });
  supervisor.start();
  const starting = await untilSnapshot(supervisor, (snapshot) => snapshot.state === "starting" && snapshot.pid !== null);
  // Stop once the engine listens and answers 503, so the readiness poll and its timers are running.
  const log = join(starting.stateDir as string, "attempt-1.log");
  await eventually("the engine to listen", async () => (await readFile(log, "utf8")).includes("fake engine listening"));
  await supervisor.stop();
  assert.equal(supervisor.snapshot().state, "stopped");
  assert.ok(starting.pid !== null && processIsGone(starting.pid));
  const records = await attemptRecords(supervisor, starting.stateDir as string);
  assert.deepEqual(
    records.map((record) => record.result),
    ["stopped"],
  );
  await new Promise((r) => setImmediate(r));
  assert.equal(timers(), timersBefore, "the deadline, poll and backoff timers are all cleared");
  assert.ok(!process.getActiveResourcesInfo().includes("ProcessWrap"), "no child process handle left");
});

test("a taken port is refused with a clear message and nothing is spawned", async () => {
  const port = await findFreePort("127.0.0.1");
  const holder = await listenOn("127.0.0.1", port);
  const { supervisor } = harness(() => ({ FAKE_MODE: "ok" }), {
    prepare: ({ host }) => ({ command: process.execPath, args: [fakeEngine, "--port", String(port)], env: {}, host, port, healthPath: "/health" }),
    backoff: { initialMs: 30_000, maxMs: 60_000 },
  });
  try {
    supervisor.start();
    const failed = await untilSnapshot(supervisor, inState("failed"));
    assert.equal(failed.lastErrorCode, "port_in_use");
    assert.match(failed.lastError ?? "", new RegExp(`127\\.0\\.0\\.1:${port} is already in use`));
    const stateDir = failed.stateDir as string;
    assert.ok(!existsSync(join(stateDir, "attempt-1.log")), "no engine was spawned");
    const records = await attemptRecords(supervisor, stateDir);
    assert.deepEqual(
      records.map((record) => record.result),
      ["port_in_use"],
    );
  } finally {
    holder.close();
    await supervisor.stop();
  }
});

test("a preflight throw and a cache path outside the state folder fail the attempt without a spawn", async () => {
  const preflightHarness = harness(() => ({}), {
    preflight: async () => {
      throw new Error("weights /models/x.gguf are missing or unreadable");
    },
    backoff: { initialMs: 30_000, maxMs: 60_000 },
  });
  preflightHarness.supervisor.start();
  const preflightFailed = await untilSnapshot(preflightHarness.supervisor, inState("failed"));
  assert.equal(preflightFailed.lastErrorCode, "preflight_failed");
  assert.match(preflightFailed.lastError ?? "", /weights \/models\/x\.gguf are missing or unreadable/);
  assert.equal(preflightHarness.prepared(), 0, "prepare (and the spawn) never ran");
  await preflightHarness.supervisor.stop();

  const outside = harness(() => ({ FAKE_MODE: "ok", XDG_CACHE_HOME: "/root/.cache" }), { backoff: { initialMs: 30_000, maxMs: 60_000 } });
  outside.supervisor.start();
  const refused = await untilSnapshot(outside.supervisor, inState("failed"));
  assert.equal(refused.lastErrorCode, "cache_path_outside_state");
  assert.match(refused.lastError ?? "", /XDG_CACHE_HOME=\/root\/\.cache points outside/);
  assert.ok(!existsSync(join(refused.stateDir as string, "attempt-1.log")), "no engine was spawned");
  await outside.supervisor.stop();
});

test("each run claims a new state folder, and an unwritable attempts.jsonl never blocks start or stop", async () => {
  const { supervisor } = harness(() => ({ FAKE_MODE: "ok" }), {
    prepare: async ({ port, host, stateDir }) => {
      // A folder where the record file should be: every append fails.
      await mkdir(join(stateDir, "attempts.jsonl"), { recursive: true });
      return { command: process.execPath, args: [fakeEngine, "--port", String(port), "--host", host], env: {}, host, port, healthPath: "/health" };
    },
  });
  supervisor.start();
  const first = await untilSnapshot(supervisor, inState("ready"));
  await supervisor.stop();
  supervisor.start();
  const second = await untilSnapshot(supervisor, inState("ready"));
  assert.equal(second.attempt, 1, "the attempt count starts again in a new run");
  assert.ok(first.stateDir && second.stateDir && first.stateDir !== second.stateDir);
  assert.ok(existsSync(join(first.stateDir, "attempt-1.log")), "the first run's folder is kept, not reused");
  assert.ok(existsSync(join(second.stateDir, "attempt-1.log")));
  await supervisor.stop();
  assert.equal(supervisor.snapshot().state, "stopped");
});

test("an engine that keeps failing its health check after ready is killed and restarted", async () => {
  const { supervisor, events } = harness(
    (attempt): Record<string, string> => (attempt === 1 ? { FAKE_MODE: "unhealthy-after-ready", FAKE_FAIL_AFTER_MS: "100" } : { FAKE_MODE: "ok" }),
    { livenessFailures: 2 },
  );
  supervisor.start();
  const ready = await untilSnapshot(supervisor, (snapshot) => snapshot.state === "ready" && snapshot.attempt === 2);
  const failed = events.find((event) => event.state === "failed");
  assert.equal(failed?.lastErrorCode, "unhealthy");
  assert.match(failed?.lastError ?? "", /2 checks of http:\/\/127\.0\.0\.1:\d+\/health failed in a row \(last: HTTP 500\)/);
  const firstPid = events.find((event) => event.attempt === 1 && event.pid !== null)?.pid;
  assert.ok(typeof firstPid === "number" && processIsGone(firstPid), "the unhealthy engine (still running by itself) was killed");
  assert.notEqual(ready.pid, firstPid);
  await supervisor.stop();
});

test("an agent process that exits leaves no engine behind", async () => {
  const repoRoot = resolve(fileURLToPath(new URL("../..", import.meta.url)));
  const host = join(dir, "host.mts");
  const supervisorModule = fileURLToPath(new URL("./engine-supervisor.ts", import.meta.url));
  await writeFile(
    host,
    `import { EngineSupervisor } from ${JSON.stringify(supervisorModule)};
const supervisor = new EngineSupervisor({
  replicaId: "host",
  stateRoot: ${JSON.stringify(join(dir, "host-root"))},
  healthIntervalMs: 20,
  prepare: ({ port, host }) => ({ command: process.execPath, args: [${JSON.stringify(fakeEngine)}, "--port", String(port), "--host", host], env: {}, host, port, healthPath: "/health" }),
});
supervisor.onChange((snapshot) => {
  if (snapshot.state !== "ready") return;
  process.stdout.write(JSON.stringify({ pid: snapshot.pid }) + "\\n");
  // Exit without stop(): the module's exit hook must still kill the engine.
  process.exit(0);
});
supervisor.start();
`,
  );
  const child = spawn(process.execPath, ["--import", "tsx", host], { cwd: repoRoot, stdio: ["ignore", "pipe", "inherit"] });
  let stdout = "";
  child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
  const code = await new Promise<number | null>((resolveExit) => child.once("exit", (exitCode) => resolveExit(exitCode)));
  assert.equal(code, 0);
  const { pid } = JSON.parse(stdout.trim()) as { pid: number };
  assert.ok(pid > 0);
  try {
    await eventually(`engine ${pid} gone after its agent exited`, () => processIsGone(pid));
  } finally {
    killQuietly(-pid);
  }
});

test("readiness validates what the engine reports: the attempt's key and model make it ready; another key, another model or a foreign server fail the attempt, which parks like any failure", async () => {
  const key = "engine-key-of-this-attempt";
  const validate = openAiModelsValidator({ key, expectedModel: "tiny-chat", timeoutMs: 2_000 });

  const good = harness(() => ({ FAKE_MODE: "ok", FAKE_KEY: key, FAKE_MODEL: "tiny-chat" }), { validate });
  good.supervisor.start();
  const ready = await untilSnapshot(good.supervisor, inState("ready"));
  assert.equal(ready.attempt, 1);
  assert.equal(ready.lastErrorCode, null);
  await good.supervisor.stop();

  // An engine started with another key answers /health with 200 but would refuse every request.
  const otherKey = harness(() => ({ FAKE_MODE: "ok", FAKE_KEY: "someone-elses-key", FAKE_MODEL: "tiny-chat" }), {
    validate,
    parkAfter: { failures: 2, windowMs: 60_000 },
  });
  otherKey.supervisor.start();
  const parked = await untilSnapshot(otherKey.supervisor, inState("parked"));
  try {
    assert.equal(parked.lastErrorCode, "validation_failed");
    assert.equal(otherKey.prepared(), 2, "each failed validation counts as a failure");
    assert.ok(!otherKey.events.some((event) => event.state === "ready"), "never ready, not even for a moment");
    assert.match(parked.lastError ?? "", /Parked after 2 failures/);
    assert.match(parked.lastError ?? "", /failed validation: GET http:\/\/127\.0\.0\.1:\d+\/v1\/models refused this attempt's engine key \(HTTP 401\)/);
    assert.ok(!(parked.lastError ?? "").includes(key), "the engine key is never printed");
    const records = await attemptRecords(otherKey.supervisor, parked.stateDir as string);
    assert.deepEqual(
      records.map((record) => record.result),
      ["validation_failed", "validation_failed"],
    );
    const pids = [...new Set(otherKey.events.flatMap((event) => (event.pid === null ? [] : [event.pid])))];
    assert.equal(pids.length, 2);
    for (const pid of pids) assert.ok(processIsGone(pid), `engine ${pid} that failed validation was stopped`);
  } finally {
    await otherKey.supervisor.stop();
  }

  const otherModel = harness(() => ({ FAKE_MODE: "ok", FAKE_KEY: key, FAKE_MODEL: "other-model" }), {
    validate,
    backoff: { initialMs: 30_000, maxMs: 60_000 },
  });
  otherModel.supervisor.start();
  const wrongModel = await untilSnapshot(otherModel.supervisor, inState("failed"));
  await otherModel.supervisor.stop();
  assert.equal(wrongModel.lastErrorCode, "validation_failed");
  assert.match(wrongModel.lastError ?? "", /lists 'other-model', not the expected 'tiny-chat'/);

  // Some other HTTP service on the port: /health says 200, there is no model list.
  const foreign = harness(() => ({ FAKE_MODE: "foreign" }), { validate, backoff: { initialMs: 30_000, maxMs: 60_000 } });
  foreign.supervisor.start();
  const notOurs = await untilSnapshot(foreign.supervisor, inState("failed"));
  await foreign.supervisor.stop();
  assert.equal(notOurs.lastErrorCode, "validation_failed");
  assert.match(notOurs.lastError ?? "", /answered HTTP 404 instead of a model list \(Not Found\)/);
});

test("a launch's own validator runs after the first health 200, on the engine's endpoint; its message becomes lastError", async () => {
  const seen: Array<EngineValidationContext & { health: number }> = [];
  const { supervisor, events } = harness(() => ({ FAKE_MODE: "ok", FAKE_READY_AFTER_MS: "200" }), {
    validate: async (context) => {
      const health = await request(`http://${context.host}:${context.port}/health`);
      await health.body.dump();
      seen.push({ ...context, health: health.statusCode });
      throw new Error("the engine reports a context of 512 tokens, expected 4096");
    },
    backoff: { initialMs: 30_000, maxMs: 60_000 },
  });
  supervisor.start();
  const failed = await untilSnapshot(supervisor, inState("failed"));
  await supervisor.stop();
  assert.equal(failed.lastErrorCode, "validation_failed");
  assert.match(
    failed.lastError ?? "",
    /with 200 on attempt 1 but failed validation: the engine reports a context of 512 tokens, expected 4096\. Its process group was stopped/,
  );
  const endpoint = events.find((event) => event.endpoint !== null)?.endpoint;
  assert.equal(seen.length, 1);
  assert.equal(seen[0]?.health, 200, "validation starts only once the engine is healthy");
  assert.deepEqual({ host: seen[0]?.host, port: seen[0]?.port }, endpoint);
  assert.equal(seen[0]?.signal.aborted, true, "the signal is aborted once the attempt is over");
});

test("pruneRunFolders deletes the oldest run folders beyond keep, never an active run's folder, a protected one or anything else", async () => {
  const root = join(dir, "prune-root");
  await mkdir(root, { recursive: true });
  const now = Date.now();
  // Run folders from 1 to 5 minutes ago, named as claimStateDir names them.
  const old = [1, 2, 3, 4, 5].map((minutes) => join(root, `r-0a1b2c3d4e5f-${(now - minutes * 60_000).toString(36)}-abcde${minutes}`));
  for (const folder of old) {
    await mkdir(join(folder, "home"), { recursive: true });
    await writeFile(join(folder, "attempt-1.log"), "engine output\n");
  }
  // Not run folders, whatever their age: left alone, and a symlink's target never followed.
  await writeFile(join(root, "notes.txt"), "not a run\n");
  await mkdir(join(root, "models"));
  const target = join(dir, "prune-link-target");
  await mkdir(target);
  await writeFile(join(target, "precious"), "x");
  const link = join(root, `r-link-${(now - 3_600_000).toString(36)}-ffffff`);
  await symlink(target, link);

  const { supervisor } = harness(() => ({ FAKE_MODE: "ok" }), { stateRoot: root });
  supervisor.start();
  const live = (await untilSnapshot(supervisor, inState("ready"))).stateDir as string;
  try {
    const first = await pruneRunFolders({ stateRoot: root, keep: 3, protect: new Set([`${old[3]?.slice(root.length + 1)}`]) });
    // Newest first: live, 1 and 2 minutes are the 3 kept; 4 minutes is protected by name.
    assert.deepEqual(first.removed.sort(), [old[2], old[4]].sort());
    assert.equal(first.kept, 4);
    assert.deepEqual(first.failed, []);

    const second = await pruneRunFolders({ stateRoot: root, keep: 0, protect: new Set([old[3] as string]) });
    assert.deepEqual(second.removed.sort(), [old[0], old[1]].sort());
    assert.ok(existsSync(join(live, "attempt-1.log")), "the folder of the running replica is never deleted");
    assert.ok(existsSync(old[3] as string), "a protected folder is kept");
  } finally {
    await supervisor.stop();
  }
  // Once stopped, the run no longer holds its folder.
  const third = await pruneRunFolders({ stateRoot: root, keep: 0 });
  assert.deepEqual(third.removed.sort(), [live, old[3]].sort());
  assert.deepEqual((await readdir(root)).sort(), ["models", "notes.txt", link.slice(root.length + 1)].sort());
  assert.ok(existsSync(join(target, "precious")));

  assert.deepEqual(await pruneRunFolders({ stateRoot: join(dir, "no-such-root") }), { removed: [], kept: 0, failed: [] });
});
