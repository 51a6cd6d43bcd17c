// The update job after a restart, with a recording stand-in for the fleet: an update cut
// between its catalog change and its smoke test holds the model's old replicas again when
// the server starts (before the fleet's first pass), hands that hold over to the resumed
// run, and releases it only once the new revision passed; one already past its smoke test
// takes no hold. Each hold's life is recorded, so a release too early would show. Also what
// an update says and writes: the old replicas it retired, the description's revision.
import { test } from "node:test";
import assert from "node:assert/strict";
import type { CatalogModel } from "../catalog/catalog.ts";
import { silentLogger } from "../core/log.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { eventually } from "../../test/support/eventually.ts";
import { JobRows, type JobRecord } from "./job-rows.ts";
import { JobRunner } from "./jobs.ts";
import type { JobDependencies } from "./serve-job.ts";
import { UPDATE_STEPS, updateJobHandler } from "./update-job.ts";
import { isServedDescription, servedDescription } from "./serve-definition.ts";

const mirrorSource = (version: string) => ({ kind: "mirror" as const, model: "o--m", version, file: "m.gguf" });
const file = { path: "m.gguf", sha256: "a".repeat(64), bytes: 10 };

function fakes() {
  const events: string[] = [];
  let holds = 0;
  const model = {
    id: "model-1",
    name: "m",
    definition: {
      scaling: { min: 1, max: 1 },
      profiles: [{ name: "cpu", engine: "llamacpp" }],
      source: mirrorSource("new"),
      origin: { repo: "o/m", revision: "n".repeat(40), files: [file], previous: { revision: "o".repeat(40), files: [file], source: mirrorSource("old") } },
    },
  } as unknown as CatalogModel;
  const replica = {
    id: "r-new",
    profile: "cpu",
    state: "ready",
    nodeNames: ["n1"],
    endpoint: { origin: "http://127.0.0.1:1", basePath: "" },
    engineKey: "k",
    weightsVerified: true,
    lastError: null,
  };
  const deps = {
    catalog: { get: () => model, resolve: () => model, list: () => [model], update: async () => model },
    mirror: {},
    registry: {},
    fleet: {
      holdOutdated: (modelId: string) => {
        holds += 1;
        const n = holds;
        events.push(`hold ${n} ${modelId}`);
        return () => events.push(`release ${n}`);
      },
      replicasByDefinition: () => ({ current: [replica], outdated: [] }),
      status: () => ({ parked: null, unplaceable: null, weightsProblem: null }),
      requested: () => undefined,
      finished: () => undefined,
    },
    smokeTest: async () => {
      events.push("smoke test");
      return { reply: "hi", tokens_per_second: 1, completion_tokens: 1, replica: "r-new", node: "n1" };
    },
    logger: silentLogger(),
  } as unknown as JobDependencies;
  return { deps, events };
}

/** An update job as a killed server left it: steps up to `doneUntil` done, the context they wrote. */
function cutUpdate(id: string, doneUntil: string): JobRecord {
  const now = "2026-11-30T10:00:00.000Z";
  const last = UPDATE_STEPS.indexOf(doneUntil as (typeof UPDATE_STEPS)[number]);
  return {
    id,
    kind: "update",
    state: "running",
    request: { model: "m" },
    model: "m",
    steps: UPDATE_STEPS.map((name, index) => ({
      name,
      state: index <= last ? "done" : index === last + 1 ? "running" : "pending",
      detail: null,
      started_at: null,
      finished_at: null,
    })),
    context: {
      newSource: mirrorSource("new"),
      newOrigin: [file],
      before: { source: mirrorSource("old"), origin: { repo: "o/m", revision: "o".repeat(40), files: [file] } },
      planned: { model: "o--m", version: "new", repo: "o/m", revision: "n".repeat(40), files: [], totalBytes: 0 },
    },
    error: null,
    result: null,
    resumed: 0,
    created_by: "admin:root",
    created_at: now,
    updated_at: now,
    finished_at: null,
  };
}

testBothStores(
  "an update cut between its catalog change and its smoke test holds the old replicas from the restart until the new revision passed",
  async (store) => {
    await new JobRows(store).insert(cutUpdate("job-cut", "catalog"));
    const { deps, events } = fakes();
    const handler = updateJobHandler(deps);
    const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler } });

    await jobs.recover();
    assert.deepEqual(events, ["hold 1 model-1"], "held before anything runs (the server's fleet starts after this)");

    await jobs.start();
    await eventually("the resumed job done", async () => (await jobs.get("job-cut")).state === "done");
    // The resumed run takes its own hold before it lets go of the one from the start, and
    // releases its own only after the smoke test passed.
    assert.deepEqual(events, ["hold 1 model-1", "hold 2 model-1", "release 1", "smoke test", "release 2"]);
    await jobs.close();
  },
);

testBothStores("an update that had passed its smoke test takes no hold after a restart", async (store) => {
  await new JobRows(store).insert(cutUpdate("job-passed", "smoke_test"));
  const { deps, events } = fakes();
  const handler = updateJobHandler(deps);
  const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler } });
  await jobs.recover();
  assert.deepEqual(events, []);
  await jobs.close();
});

test("a cancelled update whose new revision passed its smoke test is not pointed back", async () => {
  const { deps } = fakes();
  let updates = 0;
  (deps.catalog as unknown as { update: () => Promise<void> }).update = async () => {
    updates += 1;
  };
  const handler = updateJobHandler(deps);
  const record = cutUpdate("job-retiring", "smoke_test");
  const aborted = new AbortController();
  aborted.abort();
  const { RunningJob } = await import("./jobs.ts");
  await handler.undo!(new RunningJob(record, aborted.signal, {} as JobRows, Date.now, silentLogger()));
  assert.equal(updates, 0);
  await handler.undo!(new RunningJob(cutUpdate("job-rolling", "catalog"), aborted.signal, {} as JobRows, Date.now, silentLogger()));
  assert.equal(updates, 1, "before the smoke test passed, a cancel points the model back");
});

/**
 * A model served at the old revision with the description serving gave it, and a fleet
 * whose old replica keeps running while the update holds it and is stopped the moment the
 * hold is released (no requests in flight to drain), as the real fleet does.
 */
function servedAtOldRevision(description?: string) {
  const oldOrigin = { repo: "o/m", revision: "o".repeat(40), files: [file] };
  const model = {
    id: "model-1",
    name: "m",
    definition: {
      description: description ?? servedDescription(oldOrigin),
      scaling: { min: 1, max: 1 },
      profiles: [{ name: "cpu", engine: "llamacpp" }],
      source: mirrorSource("old"),
      origin: oldOrigin,
    },
  } as unknown as CatalogModel;
  const replica = (id: string) => ({
    id,
    profile: "cpu",
    state: "ready",
    nodeNames: ["n1"],
    endpoint: { origin: "http://127.0.0.1:1", basePath: "" },
    engineKey: "k",
    weightsVerified: true,
    lastError: null,
  });
  let held = false;
  const deps = {
    catalog: {
      get: () => model,
      resolve: () => model,
      list: () => [model],
      update: async (_name: string, patch: Record<string, unknown>) => {
        (model as { definition: unknown }).definition = { ...model.definition, ...patch };
        return model;
      },
    },
    mirror: {},
    registry: {},
    fleet: {
      holdOutdated: () => {
        held = true;
        return () => {
          held = false;
        };
      },
      replicasByDefinition: () => ({ current: [replica("r-new")], outdated: held ? [replica("r-old")] : [] }),
      status: () => ({ parked: null, unplaceable: null, weightsProblem: null }),
      requested: () => undefined,
      finished: () => undefined,
    },
    smokeTest: async () => ({ reply: "hi", tokens_per_second: 1, completion_tokens: 1, replica: "r-new", node: "n1" }),
    logger: silentLogger(),
  } as unknown as JobDependencies;
  return { deps, model };
}

/** An update whose new revision is mirrored and checked: the run goes on from its catalog step. */
function checkedUpdate(id: string): JobRecord {
  const record = cutUpdate(id, "check");
  const { before: _before, ...context } = record.context as Record<string, unknown>;
  return { ...record, context };
}

testBothStores("an update retires the old replica it stopped and says so; the served description names the new revision", async (store) => {
  await new JobRows(store).insert(checkedUpdate("job-words"));
  const { deps, model } = servedAtOldRevision();
  const handler = updateJobHandler(deps);
  const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler } });
  await jobs.start();
  await eventually("the job done", async () => (await jobs.get("job-words")).state === "done");
  const job = await jobs.get("job-words");
  assert.equal(job.steps.find((step) => step.name === "retire")?.detail, "1 old replica drained and stopped");
  assert.equal(model.definition.description, `Served from o/m at ${"n".repeat(12)} (10 B).`);
  await jobs.close();
});

testBothStores("a description someone wrote is kept through an update", async (store) => {
  await new JobRows(store).insert(checkedUpdate("job-kept"));
  const { deps, model } = servedAtOldRevision("Our support bot.");
  const handler = updateJobHandler(deps);
  const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler } });
  await jobs.start();
  await eventually("the job done", async () => (await jobs.get("job-kept")).state === "done");
  assert.equal(model.definition.description, "Our support bot.");
  assert.equal(model.definition.origin?.revision, "n".repeat(40));
  await jobs.close();
});

testBothStores("a served description that names an older revision than its origin follows the update", async (store) => {
  // An older llmgw updated the model without rewriting its description: it still names the
  // first revision served, while the origin names the one the model is on now.
  await new JobRows(store).insert(checkedUpdate("job-stale"));
  const { deps, model } = servedAtOldRevision(`Served from o/m at ${"f".repeat(12)} (4.6 GiB).`);
  const handler = updateJobHandler(deps);
  const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler } });
  await jobs.start();
  await eventually("the job done", async () => (await jobs.get("job-stale")).state === "done");
  assert.equal(model.definition.description, `Served from o/m at ${"n".repeat(12)} (10 B).`);
  await jobs.close();
});

test("only a description serving wrote for the model's repository counts as served", () => {
  assert.equal(isServedDescription(`Served from o/m at ${"f".repeat(12)} (512 MiB).`, "o/m"), true);
  assert.equal(isServedDescription("Served from o/m at abc (10 B).", "o/m"), true);
  assert.equal(isServedDescription("Served from o/m at abc (10 B). Our support bot.", "o/m"), false);
  assert.equal(isServedDescription("Served from other/m at abc (10 B).", "o/m"), false);
  assert.equal(isServedDescription("Our support bot.", "o/m"), false);
  assert.equal(isServedDescription(undefined, "o/m"), false);
});
