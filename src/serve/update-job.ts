// The update job: moves a served model to a newer revision of its origin repository (or,
// as a rollback, back to the previous one while its files are still mirrored) without a
// failed request:
//   registry  read the repository at the revision asked for (default: the branch the model follows)
//   mirror    fetch the new revision's files (a rollback checks the old ones are still there)
//   check     read them as the engine will
//   catalog   point the model at them; its old replicas are held serving meanwhile
//   rollout   wait for a ready replica of the new revision
//   smoke_test ask it for a hello
//   retire    release the old replicas: the gateway drains each before it stops
// The old revision serves until a new replica passes the smoke test. A failure at rollout
// or smoke test points the model back at the old revision, whose replicas never stopped,
// and the job fails saying why.
import { BadRequestError, ConflictError, NotFoundError, UpstreamError, describeError, parseWith } from "../core/errors.ts";
import { countOf, formatBytes } from "../core/format.ts";
import type { Catalog } from "../catalog/catalog.ts";
import type { ModelDefinition } from "../catalog/model-schema.ts";
import { isLocalSource } from "../registry/local-source.ts";
import { z } from "zod";
import { prepareMirrorFetch } from "../mirror/fetch-preparation.ts";
import { checkMirrored, mirrorFiles, waitForReplica, withoutHeaders, type PlannedFetch } from "./job-steps.ts";
import type { JobHandler, RunningJob, StepHandle } from "./jobs.ts";
import { DEFAULT_REPLICA_TIMEOUT_MS, type JobDependencies } from "./serve-job.ts";
import { contextSettings, isServedDescription, servedDescription, type OriginFile } from "./serve-definition.ts";

export const UPDATE_STEPS = ["registry", "mirror", "check", "catalog", "rollout", "smoke_test", "retire"] as const;

/** How long the retire step waits for the old replicas to drain and stop. */
const RETIRE_TIMEOUT_MS = 10 * 60_000;

export interface UpdateRequest extends Record<string, unknown> {
  model: string;
  revision?: string;
  rollback?: boolean;
}

type Origin = NonNullable<ModelDefinition["origin"]>;
type Source = NonNullable<ModelDefinition["source"]>;
type MirrorSource = Extract<Source, { kind: "mirror" }>;

interface UpdateContext {
  planned?: PlannedFetch;
  /** Nothing to do: the model already serves this revision. */
  current?: boolean;
  newSource?: MirrorSource;
  newOrigin?: OriginFile[];
  /** The definition's source and origin before the catalog step, to return to on failure. */
  before?: { source: Source; origin: Origin };
  /** Why the model was pointed back (a resumed run must not carry on). */
  reverted?: string;
}

const updateBodySchema = z.strictObject({ model: z.string().min(1), revision: z.string().min(1).optional() });

/** Checks an update (or rollback) request against the catalog; throws what to do instead. */
export function checkUpdateRequest(body: unknown, catalog: Pick<Catalog, "resolve">, rollback: boolean): UpdateRequest {
  const request = parseWith(updateBodySchema, body, rollback ? "rollback" : "update request");
  const model = catalog.resolve(request.model);
  if (model === undefined || model.name !== request.model) {
    throw new NotFoundError(
      `There is no model named '${request.model}'${model === undefined ? "" : ` ('${request.model}' is an alias of '${model.name}')`}. List them with 'llmgw ctl model list'.`,
      { code: "model_not_found", param: "model" },
    );
  }
  const { origin, source } = model.definition;
  if (origin === undefined || source?.kind !== "mirror") {
    throw new BadRequestError(
      `Model '${model.name}' was not served from a repository through the mirror, so it has no revisions to move between. Serve the repository with 'llmgw ctl model serve', or change its source with 'llmgw ctl model edit'.`,
      { code: "no_origin", param: "model" },
    );
  }
  if (rollback) {
    if (origin.previous === undefined)
      throw new ConflictError(`Model '${model.name}' has no previous revision to return to: it was never updated.`, { code: "no_previous_revision" });
    return { model: model.name, revision: origin.previous.revision, rollback: true };
  }
  if (isLocalSource(origin.repo)) {
    throw new BadRequestError(
      `Model '${model.name}' was served from local files (${origin.repo}), which have no revisions. Serve the changed files with 'llmgw ctl model serve' under another name.`,
      { code: "no_origin", param: "model" },
    );
  }
  return { model: model.name, ...(request.revision === undefined ? {} : { revision: request.revision }) };
}

export function updateJobHandler(deps: JobDependencies): JobHandler {
  type Release = (outcome?: "passed" | "rejected") => void;
  /** Holds taken for unfinished updates when the server started, by job id, until their jobs take their own. */
  const bootHolds = new Map<string, Release>();
  /** Holds a failed revert left, by model name: the model still points at a revision that did not pass. */
  const lingering = new Map<string, Release>();
  return {
    steps: () => [...UPDATE_STEPS],
    async run(job) {
      const request = job.request as UpdateRequest;
      const context = job.context as UpdateContext;
      const model = () => deps.catalog.get(request.model);
      const timeoutMs = deps.replicaTimeoutMs ?? DEFAULT_REPLICA_TIMEOUT_MS;
      job.setModel(request.model);

      await job.step("registry", async () => {
        const { origin, source } = model().definition as { origin: Origin; source: MirrorSource };
        if (request.rollback === true) {
          const previous = origin.previous!;
          if (previous.source.kind !== "mirror")
            throw new BadRequestError("The previous revision was not served from the mirror; there is nothing to return to.", { code: "no_previous_revision" });
          await job.remember({ newSource: previous.source, newOrigin: previous.files } satisfies UpdateContext);
          return `back to ${origin.repo} @ ${previous.revision.slice(0, 12)} from ${origin.revision.slice(0, 12)}`;
        }
        const ref = request.revision ?? origin.ref ?? "main";
        const prepared = await prepareMirrorFetch({
          // The same file the model serves now (with the other parts of its set, and its vision
          // projector: an update must not leave a vision model without one), at the new commit.
          request: {
            repo: origin.repo,
            revision: ref,
            file: source.file,
            model: source.model,
            ...(source.projector === undefined ? {} : { projector: source.projector }),
          },
          registry: deps.registry,
          mirror: deps.mirror,
          signal: job.signal,
        }).catch((error: unknown) => {
          throw new UpstreamError(`Revision '${ref}' of ${origin.repo} cannot replace what '${request.model}' serves: ${describeError(error)}`, {
            code: "update_unavailable",
            cause: error,
          });
        });
        const { plan } = prepared;
        if (plan.revision === origin.revision) {
          await job.remember({ current: true } satisfies UpdateContext);
          return `'${request.model}' already serves ${origin.repo} @ ${plan.revision.slice(0, 12)}, the newest on '${ref}'`;
        }
        const planned: PlannedFetch = {
          model: prepared.model,
          version: plan.version,
          repo: plan.repo,
          revision: plan.revision,
          files: withoutHeaders(plan.files),
          totalBytes: plan.totalBytes,
        };
        const newSource: MirrorSource = {
          kind: "mirror",
          model: prepared.model,
          version: plan.version,
          file: source.file,
          ...(source.projector === undefined ? {} : { projector: source.projector }),
        };
        await job.remember({ planned, newSource } satisfies UpdateContext);
        return `${origin.repo}: ${origin.revision.slice(0, 12)} → ${plan.revision.slice(0, 12)} ('${ref}'), ${countOf(plan.files.length, "file")}, ${formatBytes(plan.totalBytes)}`;
      });
      if (context.current === true) {
        for (const name of UPDATE_STEPS.slice(1)) await job.skip(name, "nothing to update");
        return "done";
      }

      await job.step("mirror", async (step) => {
        if (context.planned !== undefined)
          return mirrorFiles({ planned: context.planned, mirror: deps.mirror, registry: deps.registry, step, signal: job.signal });
        // A rollback fetches nothing: the previous revision's files must still be mirrored and intact.
        const source = context.newSource!;
        for (const file of context.newOrigin!) {
          const checked = await deps.mirror.check(source.model, source.version, file.path);
          // Held by another running server is enough: nodes are sent there, and the leader copies them to read them.
          if (checked.kind === "refused" || (checked.kind === "elsewhere" && !checked.holders.some((holder) => holder.live))) {
            throw new ConflictError(
              `The previous revision's file ${file.path} is no longer usable in the mirror (${describeError(checked.error)}). Fetch that revision again with 'llmgw ctl model update ${request.model} --revision REV'.`,
              { code: "previous_files_gone" },
            );
          }
        }
        return `${countOf(context.newOrigin!.length, "file")} of the previous revision still in the mirror`;
      });

      await job.step("check", async (step) => {
        const current = model();
        const profile = current.definition.profiles.find((p) => p.engine === "llamacpp");
        const source = context.newSource!;
        const planned: PlannedFetch = context.planned ?? {
          model: source.model,
          version: source.version,
          repo: current.definition.origin!.repo,
          revision: current.definition.origin!.previous!.revision,
          files: context.newOrigin!.map((f) => ({ path: f.path, url: "file:///", sha256: f.sha256, size: f.bytes })),
          totalBytes: 0,
        };
        const { pool, parallel } = contextSettings({
          ctx_pool: profile?.ctx_size,
          context: profile?.ctx_size !== undefined && profile.parallel !== undefined ? Math.floor(profile.ctx_size / profile.parallel) : undefined,
        });
        const checked = await checkMirrored({
          planned,
          entry: source.file,
          format: profile === undefined ? "safetensors" : "gguf",
          modelName: request.model,
          contextPool: pool,
          parallel,
          mirror: deps.mirror,
          signal: job.signal,
          step,
        });
        await job.remember({ newOrigin: checked.origin } satisfies UpdateContext);
        return checked.detail;
      });

      // Held from the catalog change until the new revision passed its smoke test. A hold
      // taken when the server started (recover), or one a failed revert left behind, is
      // handed over to this one.
      const hold = deps.fleet.holdOutdated(model().id);
      let held = true;
      const release = (outcome: "passed" | "rejected") => {
        if (held) hold(outcome);
        held = false;
      };
      takeOver(job.id, request.model);
      try {
        let target = model();
        const waitReady = (step: StepHandle) =>
          waitForReplica({
            fleet: deps.fleet,
            model: target,
            timeoutMs,
            signal: job.signal,
            step,
            exists: () => deps.catalog.list().some((m) => m.id === target.id),
          });
        try {
          await job.step("catalog", async () => {
            const current = model();
            const { origin, source } = current.definition as { origin: Origin; source: Source };
            if (context.before === undefined) await job.remember({ before: { source, origin } } satisfies UpdateContext);
            const before = context.before!;
            if (JSON.stringify(source) === JSON.stringify(context.newSource))
              return `'${request.model}' already points at the new revision (the server restarted meanwhile)`;
            const newRevision = request.rollback === true ? before.origin.previous!.revision : context.planned!.revision;
            const newOrigin: Origin = {
              repo: before.origin.repo,
              revision: newRevision,
              ...(before.origin.ref === undefined ? {} : { ref: before.origin.ref }),
              files: context.newOrigin!,
              previous: { revision: before.origin.revision, files: before.origin.files, source: before.source },
            };
            // The description serving wrote names the revision: it follows, unless someone rewrote it.
            const description = isServedDescription(current.definition.description, before.origin.repo) ? { description: servedDescription(newOrigin) } : {};
            await deps.catalog.update(request.model, { source: context.newSource, origin: newOrigin, ...description }, job.actor);
            return `'${request.model}' now points at ${newRevision.slice(0, 12)}; its old replicas keep serving until a new one passes the smoke test`;
          });
          target = model();
          // A run resumed after the server restarted: an earlier run may have pointed the model back already.
          if (context.reverted !== undefined || JSON.stringify(target.definition.source) !== JSON.stringify(context.newSource)) {
            throw new UpstreamError(
              `The update was given up before the server restarted${context.reverted === undefined ? "" : ` (${context.reverted})`}; '${request.model}' points at its earlier revision.`,
              { code: "update_failed" },
            );
          }
          const onDemand = target.definition.scaling.min === 0;
          if (onDemand) deps.fleet.requested(target);
          try {
            let ready: Awaited<ReturnType<typeof waitForReplica>> | undefined;
            await job.step("rollout", async (step) => {
              ready = await waitReady(step);
              if (ready.kind === "busy") {
                throw new UpstreamError(
                  `There is no room to run the new revision beside the old one, which keeps serving until the new one is checked: ${ready.explanation.join("; ")}. Free room (scale another model down) and update again.`,
                  { code: "no_room" },
                );
              }
              return `replica ${ready.replica.id} of the new revision ready on ${ready.replica.nodeNames.join(", ")}${ready.replica.weightsVerified ? ", weights verified against the origin" : ""}`;
            });
            await job.step("smoke_test", async (step) => {
              const found = ready ?? (await waitReady(step));
              if (found.kind !== "ready") throw new UpstreamError("The new revision's replica is gone.", { code: "no_room" });
              const result = await deps.smokeTest(found.replica, target.name, job.signal);
              job.setResult(result);
              return `"${result.reply}" (${result.completion_tokens} tokens, ${result.tokens_per_second} tokens/s)`;
            });
          } finally {
            if (onDemand) deps.fleet.finished(target);
          }
        } catch (error) {
          // A server stop leaves everything as it is (held, pointing at the new revision) for the resumed job.
          if (job.stopReason === "server-stop") throw error;
          // Failed or cancelled before the new revision proved itself: back to the old one
          // while its replicas are still held, so they never stop; then the new ones stop.
          let reverted: string;
          try {
            reverted = await revert(job, deps.catalog, context);
            await job.remember({ reverted: job.stopReason === "cancel" ? "cancelled" : describeError(error) } satisfies UpdateContext);
          } catch (revertError) {
            // Still pointing at the new revision: the hold stays (the old replicas serve) until a
            // later update or rollback of the model takes it over.
            lingering.set(request.model, hold);
            held = false;
            throw new UpstreamError(
              `The new revision did not take over (${describeError(error)}), and '${request.model}' could not be pointed back (${describeError(revertError)}). Its old replicas keep serving; run 'llmgw ctl model rollback ${request.model}'.`,
              { code: "update_failed", cause: error },
            );
          }
          release("rejected");
          if (job.stopReason === "cancel") throw error;
          throw new UpstreamError(
            `The new revision did not take over: ${describeError(error)}. '${request.model}' is back on ${reverted}, whose replicas kept serving.`,
            { code: "update_failed", cause: error },
          );
        }
        // Counted before the release: once it is released the fleet may stop the old replicas
        // at once (no requests in flight to drain), before the retire step first looks.
        const before = deps.fleet.replicasByDefinition(target.id).outdated.length;
        release("passed");
        await job.step("retire", async (step) => {
          const started = Date.now();
          for (;;) {
            job.signal.throwIfAborted();
            const left = deps.fleet.replicasByDefinition(target.id).outdated;
            if (left.length === 0) break;
            step.detail(`draining ${countOf(left.length, "old replica")}: ${left.map((r) => `${r.id} ${r.state}`).join(", ")}`);
            if (Date.now() - started > RETIRE_TIMEOUT_MS)
              throw new UpstreamError(
                `${countOf(left.length, "old replica")} did not stop within ${RETIRE_TIMEOUT_MS / 60_000} min; the new revision serves meanwhile.`,
                { code: "retire_timeout" },
              );
            await new Promise((resolve) => setTimeout(resolve, 250));
          }
          return before === 0 ? "no old replicas were running" : `${countOf(before, "old replica")} drained and stopped`;
        });
      } finally {
        // Kept through a server stop: the hold dies with the process and the next start takes it again.
        if (held && job.stopReason !== "server-stop") release(context.reverted === undefined ? "passed" : "rejected");
      }
      return "done";
    },
    async undo(job) {
      const name = (job.request as UpdateRequest).model;
      try {
        // Once the new revision passed its smoke test there is nothing to undo: it serves.
        if (job.stepState("smoke_test") !== "done") {
          await revert(job, deps.catalog, job.context as UpdateContext);
          lingering.get(name)?.("rejected");
          lingering.delete(name);
        }
      } finally {
        // After the revert: released first, the old replicas would meet the new definition unheld.
        bootHolds.get(job.id)?.("rejected");
        bootHolds.delete(job.id);
      }
    },
    recover(record) {
      // An update cut between its catalog change (begun or done) and the end of its smoke
      // test: its old replicas must keep serving from the new server's first reconciliation.
      const context = record.context as UpdateContext;
      const smokeDone = record.steps.some((step) => step.name === "smoke_test" && step.state === "done");
      if (context.before === undefined || smokeDone || context.reverted !== undefined) return;
      const model = deps.catalog.resolve((record.request as UpdateRequest).model);
      if (model !== undefined) bootHolds.set(record.id, deps.fleet.holdOutdated(model.id));
    },
  };

  /** Lets go of the holds a new run replaces: its own from the server's start, and one a failed revert left for the model. */
  function takeOver(jobId: string, modelName: string): void {
    bootHolds.get(jobId)?.();
    bootHolds.delete(jobId);
    lingering.get(modelName)?.();
    lingering.delete(modelName);
  }
}

/**
 * Points the model back at the source and origin it had before the job changed it, when it
 * still points at the new ones; returns the short revision it is on.
 */
async function revert(job: RunningJob, catalog: Catalog, context: UpdateContext): Promise<string> {
  const name = (job.request as UpdateRequest).model;
  const before = context.before;
  const current = catalog.resolve(name);
  if (before === undefined || current === undefined) return current?.definition.origin?.revision.slice(0, 12) ?? "its earlier revision";
  if (JSON.stringify(current.definition.source) === JSON.stringify(context.newSource)) {
    const { origin, description } = current.definition;
    const revertDescription = origin !== undefined && isServedDescription(description, origin.repo) ? { description: servedDescription(before.origin) } : {};
    await catalog.update(name, { source: before.source, origin: before.origin, ...revertDescription }, job.actor);
  }
  return before.origin.revision.slice(0, 12);
}
