// What a finished job tells operators: `job_failed` for any job that failed (its error is
// the reason), `update_done` for an update or rollback that moved a model to another
// revision. A job that was already current, waits for capacity, or was cancelled by an
// operator is news to nobody.
import type { NewEvent } from "../events/event-log.ts";
import type { JobRecord } from "./job-rows.ts";

interface UpdateContextSeen {
  current?: boolean;
  planned?: { revision?: string; repo?: string };
  before?: { origin?: { revision?: string; repo?: string; previous?: { revision?: string } } };
}

export function jobEvent(job: JobRecord): NewEvent | null {
  const subject = `job:${job.id}`;
  // A serve job learns its model's name at its catalog step; one that fails before it still names the model it was asked to serve.
  const requested = [job.request.name, job.request.model].find((value): value is string => typeof value === "string");
  const model = job.model ?? requested ?? null;
  if (job.state === "failed") {
    const failedStep = job.steps.find((step) => step.state === "failed")?.name ?? null;
    return {
      kind: "job_failed",
      subject,
      data: { job: job.id, job_kind: job.kind, model, step: failedStep, error: job.error },
      message: `The ${job.kind} job ${job.id}${model === null ? "" : ` for '${model}'`} failed${failedStep === null ? "" : ` at its ${failedStep} step`}: ${job.error ?? "no reason recorded"}. See 'llmgw ctl job show ${job.id}'.`,
    };
  }
  if (job.kind === "update" && job.state === "done") {
    const context = job.context as UpdateContextSeen;
    if (context.current === true || context.before?.origin === undefined) return null;
    const rollback = job.request.rollback === true;
    const oldRevision = context.before.origin.revision ?? null;
    const newRevision = (rollback ? context.before.origin.previous?.revision : context.planned?.revision) ?? null;
    const short = (revision: string | null) => (revision === null ? "?" : revision.slice(0, 12));
    return {
      kind: "update_done",
      subject: `model:${model ?? "?"}`,
      data: { job: job.id, model, repo: context.before.origin.repo ?? null, old_revision: oldRevision, new_revision: newRevision, rollback },
      message: `'${model ?? "?"}' ${rollback ? "rolled back" : "updated"} from ${short(oldRevision)} to ${short(newRevision)}; its old replicas are retired.${rollback ? "" : ` Undo with 'llmgw ctl model rollback ${model ?? ""}'.`}`,
    };
  }
  return null;
}
