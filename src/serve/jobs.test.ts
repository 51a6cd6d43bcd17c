// The job runner on both stores: steps recorded as they run, a job cut by a server stop
// resumed at the step it was in (steps done before are not run again), given up after too
// many restarts, cancel with undo, a failure with its reason, the finished-jobs limit, and
// jobs waiting for room (no slot held, each goes on when its handler says it can).
import assert from "node:assert/strict";
import { silentLogger } from "../core/log.ts";
import { testBothStores } from "../../test/support/stores.ts";
import { eventually } from "../../test/support/eventually.ts";
import { Gate } from "../../test/support/gate.ts";
import { JobRows, type JobRecord } from "./job-rows.ts";
import { JobRunner, MAX_RESUMES, type JobHandler } from "./jobs.ts";

/** A handler whose second step waits on a gate (or the job's signal), counting how often each step body runs. */
function gatedHandler() {
  const runs = { fetch: 0, wait: 0, undo: 0 };
  let open = new Gate();
  const handler: JobHandler = {
    steps: () => ["fetch", "wait", "finish"],
    async run(job) {
      await job.step("fetch", async () => {
        runs.fetch += 1;
        await job.remember({ fetched: "abc" });
        return "fetched abc";
      });
      await job.step("wait", async (step) => {
        runs.wait += 1;
        step.detail("waiting for the gate");
        await Promise.race([open.wait(), new Promise((_, reject) => job.signal.addEventListener("abort", () => reject(job.signal.reason), { once: true }))]);
        return `used ${String(job.context.fetched)}`;
      });
      if (job.request.fail === true) await job.step("finish", async () => Promise.reject(new Error("the replica answered nothing")));
      else await job.step("finish", async () => "finished");
      return "done";
    },
    async undo() {
      runs.undo += 1;
    },
  };
  return { handler, runs, release: () => open.open(), reset: () => (open = new Gate()) };
}

function runner(store: Parameters<Parameters<typeof testBothStores>[1]>[0], handler: JobHandler) {
  return new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler } });
}

testBothStores("a job records each step, and one cut by a server stop resumes where it was", async (store) => {
  const { handler, runs, release } = gatedHandler();
  const first = runner(store, handler);
  const submitted = await first.submit("serve", { repo: "o/n" }, "admin:root", null);
  assert.equal(submitted.state, "queued");
  assert.deepEqual(
    submitted.steps.map((s) => s.name),
    ["fetch", "wait", "finish"],
  );
  await eventually("the wait step running", async () => (await first.get(submitted.id)).steps[1]?.state === "running");
  const during = await first.get(submitted.id);
  assert.equal(during.state, "running");
  assert.equal(during.steps[0]?.state, "done");
  assert.equal(during.steps[0]?.detail, "fetched abc");

  // The server stops: the job stays running in the store, as a kill would leave it.
  await first.close();
  assert.equal((await first.get(submitted.id)).state, "running");

  const second = runner(store, handler);
  await second.start();
  release();
  const finished = await eventually("the resumed job done", async () => {
    const job = await second.get(submitted.id);
    return job.state === "done" ? job : undefined;
  });
  assert.equal(finished.resumed, 1);
  assert.equal(runs.fetch, 1, "a step done before the stop is not run again");
  assert.equal(runs.wait, 2, "the step cut by the stop runs again");
  assert.equal(finished.steps[1]?.detail, "used abc", "the resumed step reads what the first run remembered");
  assert.deepEqual(
    finished.steps.map((s) => s.state),
    ["done", "done", "done"],
  );
  assert.ok(finished.finished_at !== null);
  await second.close();
});

testBothStores("a job cut by more restarts than MAX_RESUMES fails with that reason", async (store) => {
  const { handler, runs } = gatedHandler();
  let current = runner(store, handler);
  const job = await current.submit("serve", {}, "admin:root", null);
  for (let restart = 0; restart < MAX_RESUMES; restart += 1) {
    await eventually("the wait step running", async () => (await current.get(job.id)).steps[1]?.state === "running");
    await current.close();
    current = runner(store, handler);
    await current.start();
  }
  await eventually("the wait step running again", async () => (await current.get(job.id)).steps[1]?.state === "running");
  await current.close();
  const last = runner(store, handler);
  await last.start();
  const failed = await last.get(job.id);
  assert.equal(failed.state, "failed");
  assert.match(failed.error ?? "", /cut by 4 server restarts and is given up; what it started was undone\. Run it again/);
  assert.equal(runs.undo, 1, "what a given-up job started is undone, as for a cancel");
  await last.close();
});

testBothStores("cancel stops the running step, undoes what the job started, and a finished job cannot be cancelled", async (store) => {
  const { handler, runs } = gatedHandler();
  const jobs = runner(store, handler);
  const job = await jobs.submit("serve", {}, "admin:root", "m");
  await eventually("the wait step running", async () => (await jobs.get(job.id)).steps[1]?.state === "running");
  const cancelled = await jobs.cancel(job.id);
  assert.equal(cancelled.state, "cancelled");
  assert.deepEqual(
    cancelled.steps.map((s) => s.state),
    ["done", "cancelled", "cancelled"],
  );
  assert.equal(cancelled.steps[1]?.detail, "waiting for the gate", "the cancelled step keeps where it had got to");
  assert.equal(runs.undo, 1);
  await assert.rejects(jobs.cancel(job.id), (e: unknown) => (e as { code?: string }).code === "job_finished");
  await assert.rejects(jobs.get("job-nothere"), (e: unknown) => (e as { code?: string }).code === "job_not_found");
  await jobs.close();
});

testBothStores("a failed step names the reason; the steps after it never run", async (store) => {
  const { handler, release } = gatedHandler();
  release();
  const jobs = runner(store, handler);
  const job = await jobs.submit("serve", { fail: true }, "admin:root", null);
  const failed = await eventually("the job failed", async () => {
    const view = await jobs.get(job.id);
    return view.state === "failed" ? view : undefined;
  });
  assert.equal(failed.error, "the replica answered nothing");
  assert.equal(failed.steps[2]?.state, "failed");
  assert.equal(failed.steps[2]?.detail, "the replica answered nothing");
  await jobs.close();
});

testBothStores("only the newest 100 finished jobs are kept", async (store) => {
  const handler: JobHandler = {
    steps: () => ["only"],
    run: async (job) => {
      await job.step("only", async () => "ok");
      return "done";
    },
  };
  let now = Date.parse("2026-11-30T10:00:00Z");
  const jobs = new JobRunner({
    store,
    logger: silentLogger(),
    handlers: { serve: handler, update: handler },
    clock: () => {
      now += 1000;
      return now;
    },
  });
  const ids: string[] = [];
  for (let i = 0; i < 103; i += 1) {
    const job = await jobs.submit("serve", {}, "admin:root", null);
    ids.push(job.id);
    await eventually("job done", async () => (await jobs.get(job.id)).state === "done");
  }
  // Close first: it waits for each job's end, the deletion of old ones included.
  await jobs.close();
  const kept = await new JobRows(store).list({ limit: 1000 });
  assert.equal(kept.length, 100);
  assert.ok(!kept.some((job) => ids.slice(0, 3).includes(job.id)), "the oldest three are gone");
});

testBothStores(
  "waiting jobs hold no slot: more of them than run at once leave room for a job that runs, and each goes on when its handler says",
  async (store) => {
    let room = false;
    const handler: JobHandler = {
      steps: () => ["place", "test"],
      async run(job) {
        let wait = false;
        await job.step("place", async () => {
          wait = job.request.waits === true && !room;
          return wait ? { waiting: "waiting for room: no node has a free core" } : "placed";
        });
        if (wait) return "waiting";
        await job.step("test", async () => "answered");
        return "done";
      },
      readyToContinue: () => room,
    };
    const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler }, waitingCheckMs: 10 });
    // Five waiting jobs: one more than run at once.
    const waiting = await Promise.all(Array.from({ length: 5 }, () => jobs.submit("serve", { waits: true }, "admin:root", null)));
    for (const job of waiting) await eventually("a job to wait", async () => (await jobs.get(job.id)).state === "waiting");
    const view = await jobs.get(waiting[0]!.id);
    assert.deepEqual(
      view.steps.map((s) => [s.state, s.detail]),
      [
        ["waiting", "waiting for room: no node has a free core"],
        ["pending", null],
      ],
    );
    assert.equal(view.finished_at, null);
    const other = await jobs.submit("serve", {}, "admin:root", null);
    await eventually("a job that needs no room to finish beside the waiting ones", async () => (await jobs.get(other.id)).state === "done");
    room = true;
    for (const job of waiting) await eventually("each waiting job done", async () => (await jobs.get(job.id)).state === "done");
    assert.deepEqual(
      (await jobs.get(waiting[0]!.id)).steps.map((s) => s.state),
      ["done", "done"],
    );
    await jobs.close();
  },
);

/** A serve job's row as a test leaves it: one step, in `state`, finished at `finishedAt`. */
function jobRow(id: string, state: JobRecord["state"], finishedAt: string | null, createdAt = "2026-11-30T10:00:00.000Z"): JobRecord {
  return {
    id,
    kind: "serve",
    state,
    request: { name: id },
    model: id,
    steps: [{ name: "place", state: state === "waiting" ? "waiting" : "done", detail: null, started_at: createdAt, finished_at: finishedAt }],
    context: {},
    error: null,
    result: null,
    resumed: 0,
    created_by: "admin:root",
    created_at: createdAt,
    updated_at: createdAt,
    finished_at: finishedAt,
  };
}

testBothStores("a `waiting` row the previous version finished is not picked up again, cancelled or pruned as waiting", async (store) => {
  const rows = new JobRows(store);
  // Before waiting jobs went on by themselves, `waiting` was a final state with a finished_at.
  await rows.insert(jobRow("job-old", "waiting", "2026-11-30T10:05:00.000Z"));
  await rows.insert(jobRow("job-new", "waiting", null));
  const asked: string[] = [];
  let undone = 0;
  const handler: JobHandler = {
    steps: () => ["place"],
    run: async () => "waiting",
    readyToContinue: (record) => {
      asked.push(record.id);
      return false;
    },
    undo: async () => {
      undone += 1;
    },
  };
  assert.deepEqual(
    (await rows.unfinished()).map((job) => job.id),
    ["job-new"],
  );
  const jobs = new JobRunner({ store, logger: silentLogger(), handlers: { serve: handler, update: handler }, waitingCheckMs: 10 });
  await jobs.recover();
  await jobs.start();
  await eventually("the current waiting job to be looked at twice", () => asked.filter((id) => id === "job-new").length >= 2);
  assert.ok(!asked.includes("job-old"), "the old row is not watched");
  assert.equal(await jobs.unfinishedFor("job-old"), undefined, "nor does it hold its model's name");
  await assert.rejects(jobs.cancel("job-old"), (e: unknown) => (e as { code?: string }).code === "job_finished");
  assert.equal(undone, 0, "cancelling it would remove a model that may have been served since");
  assert.equal((await jobs.get("job-old")).state, "waiting");
  await jobs.close();

  // Pruning keeps the newest finished jobs; a waiting job (no finished_at) is never among those deleted.
  for (let i = 0; i < 3; i += 1) await rows.insert(jobRow(`job-done-${i}`, "done", `2026-11-30T11:0${i}:00.000Z`));
  assert.equal(await rows.prune(1), 3, "the two older done jobs and the old waiting row");
  assert.deepEqual((await rows.list()).map((job) => job.id).sort(), ["job-done-2", "job-new"]);
});
