// The job runner: starts serve and update jobs, runs their steps with live state, keeps
// every change in the `jobs` table, cancels on request, and picks up after a restart.
//
// - A job runs in the background; the request that made it returns at once with its id.
// - Each step is marked running, then done, failed or cancelled, with a detail line and
//   its times. Progress writes are throttled (one row write a second at most); state
//   changes are written at once.
// - A step found done when a job resumes is not run again: its result is in the job's
//   context. A step cut midway runs again, which is safe because each one is idempotent
//   (the mirror resumes its files, the catalog step recognises the model it created).
// - A server that stops leaves its jobs `running`; the next start resumes them. A job cut
//   this way more than MAX_RESUMES times fails with that reason, so none stays running
//   forever.
// - Cancel aborts the job's signal (stopping the mirror fetch, the waits) and then asks
//   its handler to undo what it started; files already verified stay in the mirror.
// - Only the newest KEPT_FINISHED_JOBS finished jobs are kept.
//
// Waiting jobs. A serve job whose model fits the hardware but finds every such node busy
// ends its run `waiting`, with its placement step marked waiting. It is kept unfinished
// rather than done: the model is in the catalog, and the job still owes its smoke test.
// It holds no slot and no signal; the runner asks its handler every WAITING_CHECK_MS
// (`readyToContinue`, an in-memory look at the fleet) and, once room frees, runs it again
// from the waiting step (placement, smoke test, done), as it resumes a job after a
// restart. Polling rather than a fleet event, because the job must see every cause of room
// (a replica stopped, a node joined or undrained, a model removed) and a missed event would
// leave it waiting for ever; the check reads memory only, so it costs nothing. The state
// lives in the row, so it survives a restart, and only the leader's runner watches
// (`start` and `close` follow the lead, cluster/server-role.ts); a waiting job can be
// cancelled like a running one.
import { randomBytes } from "node:crypto";
import type { Fence } from "../cluster/leadership.ts";
import { ConflictError, NotFoundError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { nowIso, type Store } from "../store/store.ts";
import {
  FINAL_STATES,
  JobRows,
  KEPT_FINISHED_JOBS,
  viewJob,
  type JobKind,
  type JobRecord,
  type JobResult,
  type JobState,
  type JobStep,
  type JobView,
  type StepProgress,
} from "./job-rows.ts";

/** How often a job may be resumed after server restarts before it fails. */
export const MAX_RESUMES = 3;
/** Jobs that run at once; more wait as `queued`. */
const CONCURRENT_JOBS = 4;
/** A progress change is written at most this often. */
const PROGRESS_WRITE_MS = 1000;
/**
 * How often waiting jobs are asked whether they can go on: a few seconds adds little to a
 * replica start that takes longer, and the check reads only memory.
 */
export const WAITING_CHECK_MS = 2000;

export interface JobHandler {
  /** The steps a job of this kind shows, in order. */
  steps(request: Record<string, unknown>): string[];
  /**
   * Runs the steps; resolves with how the job finished, or throws why it failed.
   * "waiting": a step waits for room (see "Waiting jobs"); the handler must then have `readyToContinue`.
   */
  run(job: RunningJob): Promise<"done" | "waiting">;
  /**
   * For a waiting job, on the leader, every WAITING_CHECK_MS: whether running it again may
   * get further now (room freed, or its wait ended some other way that the run reports).
   * It may take again what the wait holds only in memory (lost with a restart or a lead).
   */
  readyToContinue?(job: JobRecord): boolean;
  /** After a cancel, or when a job is given up: stop and remove what the job started (its context says what). */
  undo?(job: RunningJob): Promise<void>;
  /**
   * Before the fleet's first reconciliation after a restart, for each unfinished job of
   * this kind: take again what only lived in memory (an update's hold on its old replicas).
   */
  recover?(job: JobRecord): void;
}

export interface JobRunnerOptions {
  store: Store;
  logger: Logger;
  handlers: Record<JobKind, JobHandler>;
  clock?: () => number;
  /** Told of every job that ends (done, waiting, failed, cancelled), after its row is saved: job events. */
  onFinished?: (job: JobRecord) => void;
  /** Several servers: jobs run on the leader, and a job's row is written only while it leads. */
  fence?: Fence;
  /** How often waiting jobs are looked at. Default WAITING_CHECK_MS. */
  waitingCheckMs?: number;
}

/** Why a running job's signal was aborted. */
class JobStop extends Error {
  constructor(readonly why: "cancel" | "server-stop") {
    super(why === "cancel" ? "The job was cancelled." : "The server is stopping; the job resumes on the next start.");
  }
}

/** What a handler sees of its job while it runs. */
export class RunningJob {
  private pendingWrite: NodeJS.Timeout | undefined;
  private writing: Promise<void> = Promise.resolve();

  constructor(
    readonly record: JobRecord,
    readonly signal: AbortSignal,
    private readonly rows: JobRows,
    private readonly clock: () => number,
    private readonly logger: Logger,
  ) {}

  get id(): string {
    return this.record.id;
  }
  get request(): Record<string, unknown> {
    return this.record.request;
  }
  get context(): Record<string, unknown> {
    return this.record.context;
  }
  get actor(): string {
    return this.record.created_by;
  }

  /** Why the job's signal was aborted: a cancel (undo what it started) or a server stop (leave it to resume); null while it runs. */
  get stopReason(): "cancel" | "server-stop" | null {
    return this.signal.reason instanceof JobStop ? this.signal.reason.why : null;
  }

  /**
   * Runs one step: marks it running, runs `body`, marks it done with the detail `body`
   * returns (or failed with the error's message). A step already done (a resumed job) is
   * skipped: what it decided is in the context. A body that resolves `{ waiting }` leaves
   * the step waiting with that detail (the job then ends its run "waiting") and the step
   * runs again when the job goes on.
   */
  async step(name: string, body: (step: StepHandle) => Promise<string | StepWait>): Promise<void> {
    const step = this.stepNamed(name);
    if (step.state === "done") return;
    this.signal.throwIfAborted();
    Object.assign(step, { state: "running", started_at: nowIso(this.clock), finished_at: null });
    await this.save();
    const handle: StepHandle = {
      detail: (text) => {
        step.detail = text;
        this.saveSoon();
      },
      progress: (progress) => {
        step.progress = progress;
        this.saveSoon();
      },
    };
    try {
      const outcome = await body(handle);
      if (typeof outcome === "string") Object.assign(step, { state: "done", detail: outcome, finished_at: nowIso(this.clock) });
      else Object.assign(step, { state: "waiting", detail: outcome.waiting, finished_at: null });
    } catch (error) {
      const stop = this.signal.reason instanceof JobStop ? this.signal.reason : null;
      if (stop?.why === "server-stop") {
        // Left running: the next start resumes the job at this step.
        throw error;
      }
      const cancelled = stop?.why === "cancel";
      // A failed step's line is the reason; a cancelled one keeps where it had got to.
      Object.assign(step, {
        state: cancelled ? "cancelled" : "failed",
        detail: cancelled ? step.detail : describeError(error),
        finished_at: nowIso(this.clock),
      });
      throw error;
    } finally {
      await this.save();
    }
  }

  /** Marks a step skipped with why (nothing to do for this request). */
  async skip(name: string, why: string): Promise<void> {
    const step = this.stepNamed(name);
    if (step.state === "done" || step.state === "skipped") return;
    Object.assign(step, { state: "skipped", detail: why, finished_at: nowIso(this.clock) });
    await this.save();
  }

  stepState(name: string): JobStep["state"] {
    return this.stepNamed(name).state;
  }

  setModel(name: string): void {
    this.record.model = name;
  }

  setResult(result: JobResult): void {
    this.record.result = result;
  }

  /** Merges into the context and writes it, so a resumed run knows it. */
  async remember(values: Record<string, unknown>): Promise<void> {
    Object.assign(this.record.context, values);
    await this.save();
  }

  /** Writes the record now (after any write in progress). */
  save(): Promise<void> {
    if (this.pendingWrite !== undefined) {
      clearTimeout(this.pendingWrite);
      this.pendingWrite = undefined;
    }
    this.record.updated_at = nowIso(this.clock);
    const snapshot = structuredClone(this.record);
    this.writing = this.writing
      .then(() => this.rows.save(snapshot))
      .catch((error: unknown) => this.logger.warn({ job: this.id, err: describeError(error) }, "could not record a job's progress"));
    return this.writing;
  }

  private saveSoon(): void {
    if (this.pendingWrite !== undefined) return;
    this.pendingWrite = setTimeout(() => {
      this.pendingWrite = undefined;
      void this.save();
    }, PROGRESS_WRITE_MS);
    this.pendingWrite.unref();
  }

  private stepNamed(name: string): JobStep {
    const step = this.record.steps.find((s) => s.name === name);
    if (step === undefined) throw new Error(`job ${this.id} has no step '${name}'`);
    return step;
  }
}

/** What a step body resolves with when it must wait for room: why, as its detail line. */
export interface StepWait {
  waiting: string;
}

export interface StepHandle {
  /** Replaces the step's detail line while it runs. */
  detail(text: string): void;
  progress(progress: StepProgress): void;
}

export class JobRunner {
  private readonly rows: JobRows;
  private readonly clock: () => number;
  private readonly running = new Map<string, { controller: AbortController; done: Promise<void> }>();
  /** Waiting jobs this runner watches (the leader's), by id. */
  private readonly waiting = new Map<string, JobRecord>();
  private waitingTimer: NodeJS.Timeout | undefined;
  /** A look at the waiting jobs is in progress (they are written before they go on). */
  private checkingWaiting = false;
  private readonly queue: Array<() => void> = [];
  private active = 0;
  private closed = false;
  /** The unfinished jobs `recover` read, for `start`. */
  private unfinished: JobRecord[] | undefined;

  constructor(private readonly options: JobRunnerOptions) {
    this.rows = new JobRows(options.store, options.fence);
    this.clock = options.clock ?? Date.now;
  }

  /**
   * Lets each unfinished job take again what lived only in memory; call it before the
   * fleet's first reconciliation, then `start` once the server takes traffic.
   */
  async recover(): Promise<void> {
    // A server that leads again after standing by runs jobs again.
    this.closed = false;
    this.unfinished = await this.rows.unfinished();
    for (const record of this.unfinished) {
      try {
        this.options.handlers[record.kind].recover?.(record);
      } catch (error) {
        this.options.logger.warn({ job: record.id, err: describeError(error) }, "could not recover a job's holds");
      }
    }
  }

  /** Resumes the jobs an earlier run of the server left unfinished. */
  async start(): Promise<void> {
    for (const listed of this.unfinished ?? (await this.rows.unfinished())) {
      // Read again: it may have been cancelled since `recover` listed it.
      const record = await this.rows.get(listed.id);
      if (record === null || FINAL_STATES.has(record.state)) continue;
      if (record.state === "waiting") {
        // Not cut by the stop: it waited, and goes on waiting here (no resume counted).
        this.watch(record);
        continue;
      }
      if (record.resumed >= MAX_RESUMES) {
        // Given up: undone like a cancel, so the model is as it was and its name is free to try again.
        const aborted = new AbortController();
        aborted.abort(new JobStop("cancel"));
        await this.options.handlers[record.kind]
          .undo?.(new RunningJob(record, aborted.signal, this.rows, this.clock, this.options.logger))
          .catch((error: unknown) => this.options.logger.warn({ job: record.id, err: describeError(error) }, "could not undo all a given-up job started"));
        this.markRemaining(record, "skipped");
        await this.finish(record, "failed", `The job was cut by ${MAX_RESUMES + 1} server restarts and is given up; what it started was undone. Run it again.`);
        continue;
      }
      record.resumed += 1;
      for (const step of record.steps) if (step.state === "running") step.state = "pending";
      this.options.logger.info({ job: record.id, kind: record.kind, resumed: record.resumed }, "resuming a job cut by a server stop");
      await this.rows.save(record);
      this.launch(record);
    }
    this.unfinished = undefined;
  }

  /** Creates a job and starts it in the background; resolves once it is recorded. */
  async submit(kind: JobKind, request: Record<string, unknown>, actor: string, model: string | null): Promise<JobView> {
    if (this.closed) throw new ConflictError("The server is stopping; submit the job again once it is back.", { code: "server_stopping" });
    const now = nowIso(this.clock);
    const record: JobRecord = {
      id: `job-${randomBytes(6).toString("hex")}`,
      kind,
      state: "queued",
      request,
      model,
      steps: this.options.handlers[kind].steps(request).map((name) => ({ name, state: "pending", detail: null, started_at: null, finished_at: null })),
      error: null,
      result: null,
      resumed: 0,
      context: {},
      created_by: actor,
      created_at: now,
      updated_at: now,
      finished_at: null,
    };
    await this.rows.insert(record);
    const accepted = viewJob(structuredClone(record));
    this.launch(record);
    return accepted;
  }

  async get(id: string): Promise<JobView> {
    const record = await this.rows.get(id);
    if (record === null) throw jobNotFound(id);
    return viewJob(record);
  }

  async list(query: { state?: string; kind?: string; model?: string; limit?: number }): Promise<JobView[]> {
    return (await this.rows.list(query)).map(viewJob);
  }

  /** The unfinished job about this model (by the name it serves), if any: one job at a time per model. */
  async unfinishedFor(model: string): Promise<JobView | undefined> {
    const found = (await this.rows.unfinished()).find((job) => job.model === model || job.request.name === model || job.request.model === model);
    return found === undefined ? undefined : viewJob(found);
  }

  /** Stops a job and undoes what it started; resolves with the job once it has stopped. */
  async cancel(id: string): Promise<JobView> {
    const record = await this.rows.get(id);
    if (record === null) throw jobNotFound(id);
    // A finished_at with another state: a `waiting` row from before waiting jobs went on
    // by themselves, which ended then (job-rows.ts); undoing it now would remove a model
    // that may have been served since.
    if (FINAL_STATES.has(record.state) || record.finished_at !== null) {
      throw new ConflictError(`Job ${id} already finished (${record.state}); there is nothing to cancel.`, { code: "job_finished" });
    }
    const run = this.running.get(id);
    if (run === undefined) {
      // Unfinished but not running here (waiting for room, or cut by a restart and not
      // resumed yet): undo what it started, and keep it from going on.
      this.unfinished = this.unfinished?.filter((job) => job.id !== id);
      this.waiting.delete(id);
      await this.undoCancelled(record);
    } else {
      run.controller.abort(new JobStop("cancel"));
      await run.done;
    }
    return this.get(id);
  }

  /** Stops running jobs without finishing them (they resume on the next start, or on the next leader). */
  async close(): Promise<void> {
    this.closed = true;
    // Waiting jobs stay waiting in their rows; the next leader (or start) watches them.
    this.stopWatching();
    this.waiting.clear();
    const runs = [...this.running.values()];
    for (const run of runs) run.controller.abort(new JobStop("server-stop"));
    await Promise.all(runs.map((run) => run.done));
  }

  private launch(record: JobRecord): void {
    const controller = new AbortController();
    // A store that fails the last write must not take the server down: the row stays
    // unfinished and the next start resumes the job.
    const done = this.run(record, controller)
      .catch((error: unknown) => this.options.logger.error({ job: record.id, err: describeError(error) }, "could not record a job's outcome"))
      .finally(() => {
        // A waiting job may already run again under the same id: remove only this run.
        if (this.running.get(record.id)?.controller === controller) this.running.delete(record.id);
      });
    this.running.set(record.id, { controller, done });
  }

  /** Watches a waiting job until its handler says it can go on (see "Waiting jobs"). */
  private watch(record: JobRecord): void {
    if (this.closed) return;
    this.waiting.set(record.id, record);
    if (this.waitingTimer !== undefined) return;
    this.waitingTimer = setInterval(() => void this.checkWaiting(), this.options.waitingCheckMs ?? WAITING_CHECK_MS);
    this.waitingTimer.unref();
  }

  private stopWatching(): void {
    if (this.waitingTimer !== undefined) clearInterval(this.waitingTimer);
    this.waitingTimer = undefined;
  }

  /** Runs again each waiting job that can go on now. */
  private async checkWaiting(): Promise<void> {
    if (this.checkingWaiting) return;
    this.checkingWaiting = true;
    try {
      for (const record of [...this.waiting.values()]) {
        if (this.closed || !this.waiting.has(record.id)) continue;
        let ready = false;
        try {
          ready = this.options.handlers[record.kind].readyToContinue?.(record) ?? false;
        } catch (error) {
          this.options.logger.warn({ job: record.id, err: describeError(error) }, "could not check a waiting job");
        }
        if (!ready) continue;
        record.state = "queued";
        this.options.logger.info({ job: record.id, kind: record.kind, model: record.model }, "a job waiting for room goes on");
        try {
          await this.rows.save(record);
        } catch (error) {
          // Written again at its next step; the job goes on all the same.
          this.options.logger.warn({ job: record.id, err: describeError(error) }, "could not record that a waiting job goes on");
        }
        // Cancelled (which takes it out of `waiting`) or stopped while the row was written: it is not run.
        if (this.closed || this.waiting.get(record.id) !== record) continue;
        this.waiting.delete(record.id);
        this.launch(record);
      }
    } finally {
      this.checkingWaiting = false;
      if (this.waiting.size === 0) this.stopWatching();
    }
  }

  private async run(record: JobRecord, controller: AbortController): Promise<void> {
    // A slot is claimed when it is handed over, so a job submitted meanwhile cannot take it too.
    let claimed = this.active < CONCURRENT_JOBS;
    if (claimed) {
      this.active += 1;
    } else {
      // Waits for a free slot, or for a cancel or a stop, which must not wait behind other jobs.
      claimed = await new Promise<boolean>((resolve) => {
        const handOver = () => {
          this.active += 1;
          resolve(true);
        };
        this.queue.push(handOver);
        controller.signal.addEventListener(
          "abort",
          () => {
            const index = this.queue.indexOf(handOver);
            if (index >= 0) this.queue.splice(index, 1);
            resolve(false);
          },
          { once: true },
        );
      });
    }
    if (this.closed || controller.signal.aborted) {
      if (claimed) this.releaseSlot();
      // Cancelled while queued: a resumed job may have started things before the restart.
      if (controller.signal.reason instanceof JobStop && controller.signal.reason.why === "cancel") await this.undoCancelled(record);
      return;
    }
    const handler = this.options.handlers[record.kind];
    const job = new RunningJob(record, controller.signal, this.rows, this.clock, this.options.logger);
    try {
      record.state = "running";
      await job.save();
      const outcome = await handler.run(job);
      if (outcome === "waiting") {
        record.state = "waiting";
        await job.save();
        this.watch(record);
        this.options.logger.info({ job: record.id, kind: record.kind, model: record.model }, "job waits for room");
      } else {
        await this.finish(record, outcome, null);
        this.options.logger.info({ job: record.id, kind: record.kind, model: record.model, outcome }, "job finished");
      }
    } catch (error) {
      const stop = controller.signal.reason instanceof JobStop ? controller.signal.reason : null;
      if (stop?.why === "server-stop") {
        await job.save();
      } else if (stop?.why === "cancel") {
        await handler
          .undo?.(job)
          .catch((undoError: unknown) =>
            this.options.logger.warn({ job: record.id, err: describeError(undoError) }, "could not undo all a cancelled job started"),
          );
        this.markRemaining(record, "cancelled");
        await this.finish(record, "cancelled", "The job was cancelled.");
        this.options.logger.info({ job: record.id, kind: record.kind }, "job cancelled");
      } else {
        this.markRemaining(record, "skipped");
        await this.finish(record, "failed", describeError(error));
        this.options.logger.warn({ job: record.id, kind: record.kind, model: record.model, err: describeError(error) }, "job failed");
      }
    } finally {
      this.releaseSlot();
    }
  }

  private releaseSlot(): void {
    this.active -= 1;
    this.queue.shift()?.();
  }

  /** Ends a job that is not running here as cancelled, after its handler undid what it had started. */
  private async undoCancelled(record: JobRecord): Promise<void> {
    const aborted = new AbortController();
    aborted.abort(new JobStop("cancel"));
    await this.options.handlers[record.kind]
      .undo?.(new RunningJob(record, aborted.signal, this.rows, this.clock, this.options.logger))
      .catch((error: unknown) => this.options.logger.warn({ job: record.id, err: describeError(error) }, "could not undo all a cancelled job started"));
    this.markRemaining(record, "cancelled");
    await this.finish(record, "cancelled", "The job was cancelled.");
  }

  /**
   * Steps that never ended: skipped after a failure, cancelled after a cancel. A step
   * waiting for room is one of them, like a running one: it is where the job stopped.
   */
  private markRemaining(record: JobRecord, state: "skipped" | "cancelled"): void {
    for (const step of record.steps) {
      if (step.state === "pending" || step.state === "running" || step.state === "waiting")
        Object.assign(step, { state, finished_at: step.started_at === null ? null : nowIso(this.clock) });
    }
  }

  private async finish(record: JobRecord, state: JobState, error: string | null): Promise<void> {
    const now = nowIso(this.clock);
    Object.assign(record, { state, error, updated_at: now, finished_at: now });
    await this.rows.save(record);
    this.options.onFinished?.(record);
    await this.rows.prune().catch((pruneError: unknown) => this.options.logger.warn({ err: describeError(pruneError) }, "could not delete old jobs"));
  }
}

function jobNotFound(id: string): NotFoundError {
  return new NotFoundError(`There is no job '${id}'. List jobs with 'llmgw ctl job list' (the newest ${KEPT_FINISHED_JOBS} finished ones are kept).`, {
    code: "job_not_found",
  });
}
