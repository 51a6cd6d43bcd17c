// The `jobs` table: one row per serve or update job with its request, its steps and their
// live state, the context a resumed run continues from, and the outcome. The runner
// (jobs.ts) owns the records in memory while they run and writes them here; readers (the
// API, `ctl job`) read the rows, so a job looks the same before and after a restart.
import type { Fence } from "../cluster/leadership.ts";
import type { JobsTable } from "../store/schema.ts";
import type { Store } from "../store/store.ts";

export type JobKind = "serve" | "update";
/**
 * `waiting`: the model is in the catalog but every node that has the hardware is busy; the
 * job holds no slot and goes on by itself (placement, smoke test) once a node has room
 * (jobs.ts, "Waiting jobs"). It is not finished: it has no finished_at and can be cancelled.
 */
export type JobState = "queued" | "running" | "done" | "waiting" | "failed" | "cancelled";
/** `waiting`: the step the job waits at (a serve job's placement), run again when it goes on. */
export type StepState = "pending" | "running" | "done" | "failed" | "skipped" | "cancelled" | "waiting";

/** Ended for good: finished_at is set, the job cannot be cancelled, and old ones are deleted. */
export const FINAL_STATES: ReadonlySet<JobState> = new Set(["done", "failed", "cancelled"]);
/**
 * Where a job's run has ended for now: a final state, or `waiting` for room (it goes on by
 * itself later). What `ctl` follows a job to: a wait for room may take hours.
 */
export const FINISHED_STATES: ReadonlySet<JobState> = new Set([...FINAL_STATES, "waiting"]);
/**
 * Jobs the leader's runner owns: it runs the queued and running ones and watches the
 * waiting ones. Before waiting jobs went on by themselves, `waiting` was a final state and
 * such rows have a finished_at: those ended then, and are never picked up again.
 */
const RUN_STATES: JobState[] = ["queued", "running"];

/** How far a step that moves bytes (the mirror) has come. */
export interface StepProgress {
  bytes_done: number;
  bytes_total: number;
  /** Over the last few seconds; null until there is a measure. */
  bytes_per_second: number | null;
  eta_seconds: number | null;
  files_done: number;
  files_total: number;
}

export interface JobStep {
  name: string;
  state: StepState;
  detail: string | null;
  started_at: string | null;
  finished_at: string | null;
  progress?: StepProgress;
}

export interface JobResult {
  reply: string;
  tokens_per_second: number;
  completion_tokens: number;
  replica: string;
  node: string;
}

/** A job as the API shows it (the row, parsed). The context stays inside the server. */
export interface JobView {
  id: string;
  kind: JobKind;
  state: JobState;
  request: Record<string, unknown>;
  model: string | null;
  steps: JobStep[];
  error: string | null;
  result: JobResult | null;
  resumed: number;
  created_by: string;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
}

export interface JobRecord extends JobView {
  /** What earlier steps decided (the commit, the files, the model created), for a resumed run. Never a secret. */
  context: Record<string, unknown>;
}

/** Finished jobs kept; older ones are deleted as new ones finish. */
export const KEPT_FINISHED_JOBS = 100;

export class JobRows {
  /** `fence`: with several servers, a job's progress is written only while this server leads (cluster/leadership.ts). */
  constructor(
    private readonly store: Store,
    private readonly fence?: Fence,
  ) {}

  async insert(job: JobRecord): Promise<void> {
    await this.store.db.insertInto("jobs").values(toRow(job)).execute();
  }

  async save(job: JobRecord): Promise<void> {
    const { id, ...row } = toRow(job);
    if (this.fence === undefined) await this.store.db.updateTable("jobs").set(row).where("id", "=", id).execute();
    else await this.fence.write((trx) => trx.updateTable("jobs").set(row).where("id", "=", id).execute());
  }

  async get(id: string): Promise<JobRecord | null> {
    const row = await this.store.db.selectFrom("jobs").selectAll().where("id", "=", id).executeTakeFirst();
    return row === undefined ? null : fromRow(row);
  }

  /** Newest first. */
  async list(
    query: { state?: string | undefined; kind?: string | undefined; model?: string | undefined; limit?: number | undefined } = {},
  ): Promise<JobRecord[]> {
    let select = this.store.db
      .selectFrom("jobs")
      .selectAll()
      .orderBy("created_at", "desc")
      .orderBy("id", "desc")
      .limit(query.limit ?? 100);
    if (query.state !== undefined) select = select.where("state", "=", query.state);
    if (query.kind !== undefined) select = select.where("kind", "=", query.kind);
    if (query.model !== undefined) select = select.where("model", "=", query.model);
    return (await select.execute()).map(fromRow);
  }

  /** Jobs a stopped server (or the last leader) left queued, running or waiting for room. */
  async unfinished(): Promise<JobRecord[]> {
    const rows = await this.store.db
      .selectFrom("jobs")
      .selectAll()
      .where((eb) => eb.or([eb("state", "in", RUN_STATES), eb.and([eb("state", "=", "waiting"), eb("finished_at", "is", null)])]))
      .orderBy("created_at")
      .execute();
    return rows.map(fromRow);
  }

  /** Deletes finished jobs beyond the newest `keep`; a job without a finished_at (a waiting one included) is never deleted. */
  async prune(keep = KEPT_FINISHED_JOBS): Promise<number> {
    const kept = await this.store.db
      .selectFrom("jobs")
      .select("finished_at")
      .where("finished_at", "is not", null)
      .orderBy("finished_at", "desc")
      .offset(keep - 1)
      .limit(1)
      .executeTakeFirst();
    if (kept?.finished_at == null) return 0;
    const result = await this.store.db.deleteFrom("jobs").where("finished_at", "is not", null).where("finished_at", "<", kept.finished_at).executeTakeFirst();
    return Number(result.numDeletedRows);
  }
}

type Row = JobsTable;

function toRow(job: JobRecord): Row {
  return {
    id: job.id,
    kind: job.kind,
    state: job.state,
    request: JSON.stringify(job.request),
    steps: JSON.stringify(job.steps),
    context: JSON.stringify(job.context),
    model: job.model,
    error: job.error,
    result: job.result === null ? null : JSON.stringify(job.result),
    resumed: job.resumed,
    created_by: job.created_by,
    created_at: job.created_at,
    updated_at: job.updated_at,
    finished_at: job.finished_at,
  };
}

function fromRow(row: Row): JobRecord {
  return {
    id: row.id,
    kind: row.kind as JobKind,
    state: row.state as JobState,
    request: JSON.parse(row.request) as Record<string, unknown>,
    steps: JSON.parse(row.steps) as JobStep[],
    context: row.context === null ? {} : (JSON.parse(row.context) as Record<string, unknown>),
    model: row.model,
    error: row.error,
    result: row.result === null ? null : (JSON.parse(row.result) as JobResult),
    resumed: Number(row.resumed),
    created_by: row.created_by,
    created_at: row.created_at,
    updated_at: row.updated_at,
    finished_at: row.finished_at,
  };
}

export function viewJob({ context: _context, ...view }: JobRecord): JobView {
  return view;
}
