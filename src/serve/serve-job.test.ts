// The serve job's wait for room, with the real job runner on both stores and a stand-in
// for the fleet whose nodes are busy until the test frees one: the job ends its run
// `waiting` (unfinished, its placement step waiting with the placement explanation), keeps
// waiting through a server restart, and once room frees goes on by itself to a ready
// replica, the smoke test and done. An on-demand model keeps its replica asked for while
// the job waits, asks the new server's fleet again after a restart, and lets go at the end.
import assert from "node:assert/strict";
import type { CatalogModel } from "../catalog/catalog.ts";
import { silentLogger } from "../core/log.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { eventually } from "../../test/support/eventually.ts";
import type { FleetStatusOfModel } from "../fleet/model-health.ts";
import { placeReplicas } from "../fleet/placement.ts";
import { currentStep } from "../cli/ctl-job.ts";
import { JobRows, type JobRecord } from "./job-rows.ts";
import type { JobFleet, JobReplica } from "./job-steps.ts";
import { JobRunner } from "./jobs.ts";
import { SERVE_STEPS, serveJobHandler, type JobDependencies } from "./serve-job.ts";

const BUSY = ["local: 0.25 of 2 cores free, needs 0.5"];

/** A fleet whose only node is busy until `free()`; then a replica of the model comes up ready. */
class BusyFleet implements JobFleet {
  room = false;
  /** Requests for a replica minus their ends: what the Fleet's demand counts. */
  asked = 0;
  private readonly replica: JobReplica = {
    id: "r-1",
    profile: "cpu",
    state: "ready",
    nodeNames: ["local"],
    endpoint: { origin: "http://127.0.0.1:1", basePath: "" },
    engineKey: "k",
    weightsVerified: true,
    lastError: null,
  } as JobReplica;

  replicasByDefinition(): { current: JobReplica[]; outdated: JobReplica[] } {
    return { current: this.room ? [this.replica] : [], outdated: [] };
  }
  status(): FleetStatusOfModel {
    return { parked: null, unplaceable: this.room ? null : BUSY, weightsProblem: null };
  }
  holdOutdated(): () => void {
    return () => undefined;
  }
  requested(): void {
    this.asked += 1;
  }
  finished(): void {
    this.asked -= 1;
  }
}

function model(min: number): CatalogModel {
  return {
    id: "model-1",
    name: "small",
    definition: { scaling: { min, max: 1, idle_seconds: 60 }, profiles: [{ name: "cpu", engine: "llamacpp" }] },
  } as unknown as CatalogModel;
}

function dependencies(options: { fleet: () => JobFleet; served: CatalogModel; smokeTests: string[] }): JobDependencies {
  return {
    catalog: { list: () => [options.served], get: () => options.served, resolve: () => options.served },
    mirror: {},
    registry: {},
    get fleet() {
      return options.fleet();
    },
    smokeTest: async (replica: JobReplica) => {
      options.smokeTests.push(replica.id);
      return { reply: "Hello!", tokens_per_second: 12, completion_tokens: 3, replica: replica.id, node: "local" };
    },
    logger: silentLogger(),
    replicaTimeoutMs: 60_000,
  } as unknown as JobDependencies;
}

/** A serve job as a server left it after its catalog step: the model is added, placement is next. */
function afterCatalog(id: string): JobRecord {
  const now = "2026-11-30T10:00:00.000Z";
  const catalogIndex = SERVE_STEPS.indexOf("catalog");
  return {
    id,
    kind: "serve",
    state: "queued",
    request: { repo: "owner/small", name: "small" },
    model: "small",
    steps: SERVE_STEPS.map((name, index) => ({ name, state: index <= catalogIndex ? "done" : "pending", detail: null, started_at: null, finished_at: null })),
    context: { createdModelId: "model-1" },
    error: null,
    result: null,
    resumed: 0,
    created_by: "admin:root",
    created_at: now,
    updated_at: now,
    finished_at: null,
  };
}

const stepOf = (job: { steps: Array<{ name: string; state: string; detail: string | null }> }, name: string) => job.steps.find((step) => step.name === name)!;

testBothStores("a serve job waiting for room goes on by itself once room frees, through a restart, to its smoke test", async (store) => {
  await new JobRows(store).insert(afterCatalog("job-wait"));
  const fleet = new BusyFleet();
  const smokeTests: string[] = [];
  const deps = dependencies({ fleet: () => fleet, served: model(1), smokeTests });
  const runner = (handler = serveJobHandler(deps)) =>
    new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler }, waitingCheckMs: 10 });

  const first = runner();
  await first.start();
  const waiting = await eventually("the job to wait", async () => {
    const job = await first.get("job-wait");
    return job.state === "waiting" ? job : undefined;
  });
  assert.equal(waiting.finished_at, null, "a waiting job is not finished");
  assert.equal(stepOf(waiting, "placement").state, "waiting");
  assert.equal(stepOf(waiting, "placement").detail, `waiting for room: ${BUSY[0]}. The job goes on by itself once a node has room.`);
  assert.equal(stepOf(waiting, "smoke_test").state, "pending");
  assert.deepEqual(
    (await first.list({ state: "waiting" })).map((job) => job.id),
    ["job-wait"],
  );

  // The server restarts while the job waits: the new one watches it; no resume is counted.
  await first.close();
  const second = runner();
  await second.recover();
  await second.start();
  assert.equal((await second.get("job-wait")).state, "waiting");
  assert.deepEqual(smokeTests, [], "nothing is smoke-tested while there is no room");

  fleet.room = true;
  const done = await eventually("the job to go on and finish", async () => {
    const job = await second.get("job-wait");
    return job.state === "done" ? job : undefined;
  });
  assert.deepEqual(smokeTests, ["r-1"]);
  assert.equal(done.resumed, waiting.resumed, "a restart while the job waited counts no resume");
  assert.match(stepOf(done, "placement").detail ?? "", /^replica r-1 ready on local \(cpu\)/);
  assert.equal(stepOf(done, "smoke_test").state, "done");
  assert.deepEqual(done.result, { reply: "Hello!", tokens_per_second: 12, completion_tokens: 3, replica: "r-1", node: "local" });
  assert.ok(done.finished_at !== null);
  await second.close();
});

testBothStores(
  "an on-demand model's replica stays asked for while its serve job waits, is asked of the next leader's fleet, and is let go at the end",
  async (store) => {
    await new JobRows(store).insert(afterCatalog("job-demand"));
    const firstFleet = new BusyFleet();
    let fleet = firstFleet;
    const deps = dependencies({ fleet: () => fleet, served: model(0), smokeTests: [] });
    const runner = () => {
      const handler = serveJobHandler(deps);
      return new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler }, waitingCheckMs: 10 });
    };
    const first = runner();
    await first.start();
    await eventually("the job to wait", async () => (await first.get("job-demand")).state === "waiting");
    assert.equal(firstFleet.asked, 1, "the waiting job keeps its request, or the model would want no replica");
    await first.close();

    // The next leader has a fleet of its own, which knows nothing of that request.
    const secondFleet = new BusyFleet();
    fleet = secondFleet;
    const second = runner();
    await second.start();
    await eventually("the new fleet to be asked", () => secondFleet.asked === 1);
    secondFleet.room = true;
    await eventually("the job done", async () => (await second.get("job-demand")).state === "done");
    assert.equal(secondFleet.asked, 0, "the request ends with the job");
    await second.close();
  },
);

testBothStores("a waiting serve job can be cancelled: the model it added is removed and it never goes on", async (store) => {
  // Two jobs wait; one is cancelled. When room frees the other goes on, and by then the
  // runner has looked at every job it watches, so the cancelled one would have gone on too.
  await new JobRows(store).insert(afterCatalog("job-cancel"));
  await new JobRows(store).insert(afterCatalog("job-other"));
  const fleet = new BusyFleet();
  const removed: string[] = [];
  const smokeTests: string[] = [];
  const deps = dependencies({ fleet: () => fleet, served: model(0), smokeTests });
  (deps.catalog as unknown as { delete: (name: string) => Promise<void> }).delete = async (name) => void removed.push(name);
  const handler = serveJobHandler(deps);
  const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler }, waitingCheckMs: 10 });
  await jobs.start();
  for (const id of ["job-cancel", "job-other"]) await eventually(`${id} to wait`, async () => (await jobs.get(id)).state === "waiting");
  assert.equal(fleet.asked, 2);
  const cancelled = await jobs.cancel("job-cancel");
  assert.equal(cancelled.state, "cancelled");
  // Where it stopped: its placement step is cancelled, not left waiting, and ctl's STEP names it.
  assert.deepEqual(
    cancelled.steps.map((step) => [step.name, step.state]),
    [...SERVE_STEPS.slice(0, 4).map((name) => [name, "done"]), ["placement", "cancelled"], ["smoke_test", "cancelled"]],
  );
  assert.ok(cancelled.steps.find((step) => step.name === "placement")?.finished_at, "the placement step it waited at ended with the job");
  assert.equal(currentStep(cancelled)?.name, "placement");
  assert.deepEqual(removed, ["small"]);
  assert.equal(fleet.asked, 1, "the cancelled job's on-demand request ends with it");
  fleet.room = true;
  await eventually("the other job done", async () => (await jobs.get("job-other")).state === "done");
  assert.equal((await jobs.get("job-cancel")).state, "cancelled");
  assert.deepEqual(smokeTests, ["r-1"], "only the job that was not cancelled ran its smoke test");
  assert.equal(fleet.asked, 0);
  await jobs.close();
});

testBothStores("a serve job asking for more cores than any node has fails with the placement explanation rather than waiting for ever", async (store) => {
  await new JobRows(store).insert(afterCatalog("job-too-big"));
  // The real placement's words for a 2-core, 4 GiB node and a replica that wants 4 cores.
  const { unplaceable } = placeReplicas({
    nodes: [
      {
        id: "n-local",
        name: "local",
        state: "ready",
        inventory: { cores: 2, memoryBytes: 4 * 1024 ** 3, gpus: [], engines: [{ engine: "llamacpp", version: "test" }] },
        labels: {},
        used: { memoryBytes: 0, cores: 0, gpus: [] },
        models: new Set(),
        cachedWeights: new Set(),
      },
    ],
    requests: [
      {
        key: "r",
        modelId: "model-1",
        modelName: "small",
        options: [{ profile: "cpu", needs: { engine: "llamacpp", memoryBytes: 1024 ** 3, cores: 4 } }],
        weightsKey: null,
      },
    ],
  });
  const explanation = unplaceable[0]!.explanation;
  assert.deepEqual(explanation, ["local: has 2 cores in all, needs 4"]);
  const fleet = new BusyFleet();
  fleet.status = () => ({ parked: null, unplaceable: explanation, weightsProblem: null });
  const deps = dependencies({ fleet: () => fleet, served: model(1), smokeTests: [] });
  const handler = serveJobHandler(deps);
  const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler }, waitingCheckMs: 10 });
  await jobs.start();
  const failed = await eventually("the job to end", async () => {
    const job = await jobs.get("job-too-big");
    return job.state === "failed" || job.state === "waiting" ? job : undefined;
  });
  assert.equal(failed.state, "failed", "no room can ever free for it");
  assert.match(failed.error ?? "", /^No node can run 'small': local: has 2 cores in all, needs 4\./);
  assert.equal(stepOf(failed, "placement").state, "failed");
  assert.equal(stepOf(failed, "smoke_test").state, "skipped");
  await jobs.close();
});

testBothStores("a serve job whose model is removed while it waits fails at its placement step, saying so", async (store) => {
  await new JobRows(store).insert(afterCatalog("job-removed"));
  const fleet = new BusyFleet();
  const deps = dependencies({ fleet: () => fleet, served: model(1), smokeTests: [] });
  const handler = serveJobHandler(deps);
  const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler }, waitingCheckMs: 10 });
  await jobs.start();
  await eventually("the job to wait", async () => (await jobs.get("job-removed")).state === "waiting");
  (deps.catalog as unknown as { list: () => CatalogModel[] }).list = () => [];
  const failed = await eventually("the job to fail", async () => {
    const job = await jobs.get("job-removed");
    return job.state === "failed" ? job : undefined;
  });
  assert.match(failed.error ?? "", /^The model 'small' this job added was removed from the catalog while the job ran/);
  assert.equal(stepOf(failed, "placement").state, "failed");
  assert.equal(stepOf(failed, "placement").detail, failed.error);
  assert.equal(stepOf(failed, "smoke_test").state, "skipped");
  assert.equal(currentStep(failed)?.name, "placement");
  await jobs.close();
});

/** A serve job with an adapter as a killed server left it: registry, mirror and check done, the catalog step running. */
function cutAtCatalog(id: string): JobRecord {
  const job = afterCatalog(id);
  const catalogIndex = SERVE_STEPS.indexOf("catalog");
  const planned = (model: string, file: string, bytes: number) => ({
    model,
    version: "0123456789ab",
    repo: model.replace("--", "/"),
    revision: "0123456789ab".padEnd(40, "0"),
    files: [{ path: file, url: `https://hub.test/${file}`, sha256: "e".repeat(64), size: bytes }],
    totalBytes: bytes,
  });
  return {
    ...job,
    state: "running",
    request: { repo: "owner/small", name: "small", adapters: [{ repo: "owner/style-lora", name: "style" }] },
    steps: job.steps.map((step, index) => ({ ...step, state: index < catalogIndex ? "done" : index === catalogIndex ? "running" : "pending" })),
    context: {
      planned: planned("owner--small", "small.gguf", 1000),
      format: "gguf",
      entry: "small.gguf",
      profiles: [{ name: "cpu", engine: "llamacpp", priority: 0, ctx_size: 16384, parallel: 4, hardware: { cpu: {} } }],
      origin: [{ path: "small.gguf", sha256: "e".repeat(64), bytes: 1000 }],
      adapters: [{ name: "style", file: "style.gguf", planned: planned("owner--style-lora", "style.gguf", 24) }],
    },
  };
}

testBothStores(
  "a serve job with an adapter resumed at its catalog step adds the model once, with the adapter's mirror source, and reads and fetches nothing again",
  async (store) => {
    const fleet = new BusyFleet();
    fleet.room = true;
    const created: Array<Record<string, unknown>> = [];
    let catalogModels: CatalogModel[] = [];
    const deps = dependencies({ fleet: () => fleet, served: model(1), smokeTests: [] });
    // The registry and the mirror are empty objects: a step that read or fetched again would throw.
    Object.assign(deps.catalog, {
      list: () => catalogModels,
      create: async (body: Record<string, unknown>) => {
        created.push(body);
        const added = { id: `model-${created.length}`, name: body.name, definition: { ...model(1).definition, ...body } } as unknown as CatalogModel;
        catalogModels = [added];
        return added;
      },
    });
    const run = async (id: string) => {
      await new JobRows(store).insert(cutAtCatalog(id));
      const handler = serveJobHandler(deps);
      const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler }, waitingCheckMs: 10 });
      await jobs.recover();
      await jobs.start();
      const done = await eventually(`${id} to end`, async () => {
        const job = await jobs.get(id);
        return job.state === "done" || job.state === "failed" ? job : undefined;
      });
      await jobs.close();
      return done;
    };

    // Cut before the model was added: added now, once, with the adapter.
    const first = await run("job-adapter-1");
    assert.equal(first.state, "done", first.error ?? "");
    assert.equal(created.length, 1);
    assert.deepEqual(created[0]!.adapters, [
      { name: "style", source: { kind: "mirror", model: "owner--style-lora", version: "0123456789ab", file: "style.gguf" } },
    ]);
    assert.match(
      stepOf(first, "catalog").detail ?? "",
      /^added 'small' with adapter style \(owner\/style-lora @ 0123456789ab, 24 B\): .*, serving small:style$/,
    );

    // Cut between adding it and remembering so: found by name, revision and source, not added again.
    const second = await run("job-adapter-2");
    assert.equal(second.state, "done", second.error ?? "");
    assert.equal(created.length, 1, "the model was not added twice");
    assert.equal(stepOf(second, "catalog").detail, "'small' was added before the server restarted");
  },
);
