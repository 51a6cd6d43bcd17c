// The serve job (DESIGN.md "The serve job"): from a repository to an answering replica in
// six steps, each with a live state and a detail line:
//   registry  read the repository, pick the artifact, decide the profiles (before any byte
//             moves); read each LoRA adapter's repository and pick its GGUF file
//   mirror    fetch into the mirror, verified against the published sha256, with progress;
//             each adapter as a version of its own repository
//   check     read what was fetched as the engine will (GGUF header, memory for the pool);
//             bytes only another server holds (a job resumed here) are copied here first
//   catalog   add the model with its profiles, source, origin and adapters; the catalog's
//             door check refuses an adapter made for another base, naming both values
//   placement wait for a ready replica; parked or unplaceable ends the job with why;
//             hardware that exists but is busy leaves the step and the job `waiting`
//   smoke_test ask that replica for a hello; reply and tokens/s are the job's result
// What a step decided is kept in the job's context, so a job cut by a restart resumes
// where it was. A cancelled job removes the model it added; mirrored files stay.
//
// A waiting job goes on by itself (jobs.ts, "Waiting jobs"): `readyToContinue` says so
// once the fleet no longer finds every fitting node busy, and the runner runs the job
// again from its placement step. An on-demand model (scaling.min 0) wants a replica only
// while something asks for one, so the waiting job keeps asking (Fleet.requested) until it
// goes on or is cancelled; that demand lives in the leader's Fleet, so a job that waited
// through a restart or a change of leader asks the new Fleet again at its next check.
import { BadRequestError, LlmgwError, UpstreamError, describeError, errorCode } from "../core/errors.ts";
import { countOf, formatBytes } from "../core/format.ts";
import type { Logger } from "../core/log.ts";
import type { Catalog, CatalogModel } from "../catalog/catalog.ts";
import type { Mirror } from "../mirror/mirror.ts";
import { isLocalSource } from "../registry/local-source.ts";
import type { Registry } from "../registry/types.ts";
import type { MirrorPlanner } from "../mirror/artifact-choice.ts";
import { prepareMirrorFetch } from "../mirror/fetch-preparation.ts";
import { waitsForRoom } from "../fleet/placement.ts";
import type { JobRecord } from "./job-rows.ts";
import {
  checkMirrored,
  checkMirroredAdapters,
  describeAdapters,
  mirrorFiles,
  planAdapters,
  waitForReplica,
  withoutHeaders,
  type JobFleet,
  type PlannedAdapter,
  type PlannedFetch,
} from "./job-steps.ts";
import type { JobHandler, RunningJob, StepHandle } from "./jobs.ts";
import {
  chooseProfiles,
  contextSettings,
  describeProfiles,
  serveModelBody,
  type OriginFile,
  type ServeProfile,
  type WeightsFormat,
} from "./serve-definition.ts";
import { defaultAdapterName, serveRequestSchema, type ServeRequest } from "./serve-request.ts";
import type { SmokeTest } from "./smoke-test.ts";

export const SERVE_STEPS = ["registry", "mirror", "check", "catalog", "placement", "smoke_test"] as const;

export interface JobDependencies {
  catalog: Catalog;
  mirror: Mirror;
  registry: Registry;
  fleet: JobFleet;
  planner?: MirrorPlanner | undefined;
  smokeTest: SmokeTest;
  logger: Logger;
  /** How long a job waits for a ready replica (placement, rollout). Default 30 min: vLLM loads can be long. */
  replicaTimeoutMs?: number;
  cwd?: string;
}

/** What the serve job keeps in its context between steps. */
interface ServeContext {
  planned?: PlannedFetch;
  format?: WeightsFormat;
  entry?: string;
  profiles?: ServeProfile[];
  origin?: OriginFile[];
  /** The vision projector mirrored with GGUF weights (a file of the version), which llama-server loads with --mmproj. */
  projector?: string;
  /** The LoRA adapters, each a file of its own repository's mirror version. */
  adapters?: PlannedAdapter[];
  /** The catalog model this job created (its id), so a resumed job does not add it twice and a cancel removes it. */
  createdModelId?: string;
}

export const DEFAULT_REPLICA_TIMEOUT_MS = 30 * 60_000;

export function serveJobHandler(deps: JobDependencies): JobHandler {
  const demand = new WaitDemand(deps);
  const createdModel = (context: Record<string, unknown>) => {
    const modelId = (context as ServeContext).createdModelId;
    return modelId === undefined ? undefined : deps.catalog.list().find((m) => m.id === modelId);
  };
  return {
    steps: () => [...SERVE_STEPS],
    async run(job) {
      // The request was checked at the door; parsing again gives the defaults their values.
      const request = { ...serveRequestSchema.parse(job.request), name: job.request.name as string };
      const context = job.context as ServeContext;
      const { pool, parallel } = contextSettings(request);

      await job.step("registry", async () => {
        const prepared = await prepareMirrorFetch({
          request: {
            repo: request.repo,
            revision: request.revision,
            quant: request.quant,
            file: request.file,
            format: request.format,
            projector: request.projector,
            context: pool,
          },
          registry: deps.registry,
          mirror: deps.mirror,
          planner: deps.planner,
          cwd: deps.cwd,
          signal: job.signal,
        });
        const { plan, pick } = prepared;
        const entry = plan.files[0]!.path;
        const format: WeightsFormat = entry.endsWith(".gguf") ? "gguf" : "safetensors";
        const plannedArtifact = prepared.planned?.plan.recommendation?.artifact.id ?? null;
        const profiles = chooseProfiles({
          request,
          format,
          planOptions: prepared.planned?.plan.options ?? [],
          artifactId: pick.by === "plan" ? plannedArtifact : null,
        });
        const planned: PlannedFetch = {
          model: prepared.model,
          version: plan.version,
          repo: plan.repo,
          revision: plan.revision,
          files: withoutHeaders(plan.files),
          totalBytes: plan.totalBytes,
        };
        // The projector the fetch plan picked (the request's, or the repository's best) is the one
        // mmproj file among the files to fetch (registry/file-sets.ts names projectors so).
        const projector = request.projector === undefined ? undefined : plan.files.find((f) => /mmproj/i.test(f.path.split("/").at(-1) ?? ""))?.path;
        if (request.adapters.length > 0 && format !== "gguf") {
          throw new BadRequestError(
            `The picked weights (${entry}) are safetensors for vLLM, and serve takes LoRA adapters from a repository only for GGUF weights on llama.cpp. ` +
              "Serve a GGUF quantisation (--format gguf), or serve without adapters and add each to the definition as a PEFT adapter folder on the nodes.",
            { code: "invalid_field", param: "adapters" },
          );
        }
        const adapters = await planAdapters({
          adapters: request.adapters.map((adapter) => ({ ...adapter, name: adapter.name ?? defaultAdapterName(adapter.repo) })),
          registry: deps.registry,
          mirror: deps.mirror,
          signal: job.signal,
        });
        await job.remember({ planned, format, entry, profiles, adapters, ...(projector === undefined ? {} : { projector }) } satisfies ServeContext);
        const projectorNote =
          projector === undefined
            ? ""
            : `; with the vision projector ${projector}, so it takes images (on nodes with llama-server, which loads it with --mmproj)`;
        const adaptersNote = adapters.length === 0 ? "" : `; with ${describeAdapters(adapters)}`;
        return `${plan.repo} @ ${plan.revision.slice(0, 12)}: ${pick.artifact} (${pick.by === "plan" ? "the plan's pick" : pick.by === "default" ? "the default" : `asked for by ${pick.by}`}), ${countOf(plan.files.length, "file")}, ${formatBytes(plan.totalBytes)}; runs as ${describeProfiles(profiles)}${projectorNote}${adaptersNote}`;
      });

      await job.step("mirror", async (step) => {
        const adapters = context.adapters ?? [];
        const detail = await mirrorFiles({
          planned: context.planned!,
          alongside: adapters.map((adapter) => adapter.planned),
          mirror: deps.mirror,
          registry: deps.registry,
          step,
          signal: job.signal,
        });
        return adapters.length === 0 ? detail : `${detail}, with ${describeAdapters(adapters)}`;
      });

      await job.step("check", async (step) => {
        const checked = await checkMirrored({
          planned: context.planned!,
          entry: context.entry!,
          format: context.format!,
          modelName: request.name,
          contextPool: pool,
          parallel,
          mirror: deps.mirror,
          signal: job.signal,
          step,
        });
        await job.remember({ origin: checked.origin } satisfies ServeContext);
        const adapters = context.adapters ?? [];
        if (adapters.length === 0) return checked.detail;
        const adapterLines = await checkMirroredAdapters({ adapters, mirror: deps.mirror, signal: job.signal, step });
        return `${checked.detail}; ${adapterLines} (the catalog checks that each fits the model as it adds it)`;
      });

      await job.step("catalog", async () => {
        const planned = context.planned!;
        const source = {
          kind: "mirror" as const,
          model: planned.model,
          version: planned.version,
          file: context.entry!,
          ...(context.projector === undefined ? {} : { projector: context.projector }),
        };
        // Added before a restart: by the id remembered, or (killed between adding it and
        // remembering) by its name with this job's source and revision.
        const existing = deps.catalog
          .list()
          .find(
            (m) =>
              m.id === context.createdModelId ||
              (context.createdModelId === undefined &&
                m.name === request.name &&
                m.definition.origin?.revision === planned.revision &&
                JSON.stringify(m.definition.source) === JSON.stringify(source)),
          );
        if (existing !== undefined) {
          await job.remember({ createdModelId: existing.id } satisfies ServeContext);
          return `'${existing.name}' was added before the server restarted`;
        }
        const adapters = context.adapters ?? [];
        const body = serveModelBody({
          request,
          profiles: context.profiles!,
          source,
          origin: { repo: planned.repo, revision: planned.revision, ...followedRef(request), files: context.origin! },
          adapters: adapters.map((adapter) => ({
            name: adapter.name,
            ...(adapter.scale === undefined ? {} : { scale: adapter.scale }),
            source: { kind: "mirror", model: adapter.planned.model, version: adapter.planned.version, file: adapter.file },
          })),
        });
        // The catalog's door check reads each adapter's header against the model's and refuses
        // one made for another base with both values: the job fails here, and nothing is added.
        const created = await deps.catalog.create(body, job.actor).catch((error: unknown) => {
          throw withAdapterNamed(error, adapters);
        });
        job.setModel(created.name);
        await job.remember({ createdModelId: created.id } satisfies ServeContext);
        const scaling = request.replicas === 0 ? "started on demand" : `${countOf(request.replicas, "replica")}`;
        const served = adapters.length === 0 ? "" : `, serving ${adapters.map((adapter) => `${created.name}:${adapter.name}`).join(", ")}`;
        return `added '${created.name}'${request.aliases.length > 0 ? ` (aliases ${request.aliases.join(", ")})` : ""}${adapters.length === 0 ? "" : ` with ${describeAdapters(adapters)}`}: ${describeProfiles(context.profiles!)}, ${scaling}${served}`;
      });

      const model = deps.catalog.list().find((m) => m.id === context.createdModelId);
      if (model === undefined) {
        // Removed while the job waited for room (or between its steps): the step the job is
        // at fails with why, so the job names where it stopped.
        const removed = new UpstreamError(
          `The model '${request.name}' this job added was removed from the catalog while the job ran; serve it again if it is still wanted.`,
          { code: "model_removed" },
        );
        await job.step(job.stepState("placement") === "done" ? "smoke_test" : "placement", () => Promise.reject(removed));
        throw removed;
      }
      try {
        return await placeAndTest({ job, deps, model, demand });
      } catch (error) {
        if (job.stopReason !== null) throw error;
        // The model stays in the catalog (it may only need room, or an unpark): say what to do with it.
        throw new UpstreamError(
          `${describeError(error)}. The model '${model.name}' stays in the catalog: fix the cause and 'llmgw ctl model unpark ${model.name}', or 'llmgw ctl model remove ${model.name}' before serving it again.`,
          { code: errorCode(error) ?? "serve_failed", cause: error },
        );
      }
    },
    readyToContinue(job: JobRecord) {
      const model = createdModel(job.context);
      // Removed while it waited: the run ends the job with that reason.
      if (model === undefined) {
        demand.release(job.id);
        return true;
      }
      if (model.definition.scaling.min === 0) demand.hold(job.id, model);
      const { unplaceable } = deps.fleet.status(model.id);
      // Room freed (the replica is placed, or about to be), or the model cannot wait any
      // more (parked, a weights problem, no node with the hardware left): the run says which.
      return unplaceable === null || !waitsForRoom(unplaceable);
    },
    async undo(job: RunningJob) {
      demand.release(job.id);
      const model = createdModel(job.context);
      if (model === undefined) return;
      // Removing the model stops its replicas; the mirrored files stay for a later job.
      await deps.catalog.delete(model.name, job.actor).catch((error: unknown) => {
        deps.logger.warn({ job: job.id, model: model.name, err: describeError(error) }, "a cancelled serve job could not remove its model");
        throw error;
      });
    },
  };
}

/**
 * The on-demand models' replicas that waiting serve jobs ask for: one request each, held
 * from the placement step until the job goes on to its end (done, failed or cancelled), in
 * the Fleet it was asked of (the leader's of this term).
 */
class WaitDemand {
  private readonly held = new Map<string, { fleet: JobFleet; model: CatalogModel }>();

  constructor(private readonly deps: Pick<JobDependencies, "fleet">) {}

  /** Asks for a replica of the model for this job, unless the current Fleet already has its request. */
  hold(jobId: string, model: CatalogModel): void {
    const fleet = this.deps.fleet;
    if (this.held.get(jobId)?.fleet === fleet) return;
    fleet.requested(model);
    this.held.set(jobId, { fleet, model });
  }

  release(jobId: string): void {
    const held = this.held.get(jobId);
    if (held === undefined) return;
    this.held.delete(jobId);
    held.fleet.finished(held.model);
  }
}

/** The placement and smoke test steps of a serve job, for the model its catalog step added. */
async function placeAndTest(options: { job: RunningJob; deps: JobDependencies; model: CatalogModel; demand: WaitDemand }): Promise<"done" | "waiting"> {
  const { job, deps, model, demand } = options;
  job.setModel(model.name);
  // An on-demand model gets its replica the way a request would start it.
  const onDemand = model.definition.scaling.min === 0;
  const waitReady = (step: StepHandle) =>
    waitForReplica({
      fleet: deps.fleet,
      model,
      timeoutMs: deps.replicaTimeoutMs ?? DEFAULT_REPLICA_TIMEOUT_MS,
      signal: job.signal,
      step,
      exists: () => deps.catalog.list().some((m) => m.id === model.id),
    });
  if (onDemand) demand.hold(job.id, model);
  let outcome: "done" | "waiting" | null = null;
  try {
    let waited: Awaited<ReturnType<typeof waitForReplica>> | undefined;
    await job.step("placement", async (step) => {
      waited = await waitReady(step);
      if (waited.kind === "busy") {
        return { waiting: `waiting for room: ${waited.explanation.join("; ")}. The job goes on by itself once a node has room.` };
      }
      const r = waited.replica;
      return `replica ${r.id} ready on ${r.nodeNames.join(", ")} (${r.profile}) after ${(waited.waitedMs / 1000).toFixed(1)} s${r.weightsVerified ? ", weights verified against the origin" : ""}`;
    });
    if (waited?.kind === "busy") {
      // The on-demand request stays held: the replica is still wanted when room frees.
      outcome = "waiting";
      return outcome;
    }
    await job.step("smoke_test", async (step) => {
      // A resumed job skipped the placement step: find the replica again.
      const ready = waited?.kind === "ready" ? waited : await waitReady(step);
      if (ready.kind !== "ready") throw new Error("the replica is gone and the nodes are busy");
      const result = await deps.smokeTest(ready.replica, model.name, job.signal);
      job.setResult(result);
      return `"${result.reply}" (${result.completion_tokens} tokens, ${result.tokens_per_second} tokens/s)`;
    });
    outcome = "done";
    return outcome;
  } finally {
    if (outcome !== "waiting") demand.release(job.id);
  }
}

/**
 * A catalog refusal of one of the adapters (param `adapters.N...`) with that adapter's name
 * and repository first: the catalog names the mirrored file, which is not what was asked for.
 */
function withAdapterNamed(error: unknown, adapters: readonly PlannedAdapter[]): unknown {
  if (!(error instanceof LlmgwError)) return error;
  const index = /^adapters\.(\d+)/.exec(error.param ?? "")?.[1];
  const adapter = index === undefined ? undefined : adapters[Number(index)];
  if (adapter === undefined) return error;
  return new LlmgwError({
    code: error.code,
    status: error.status,
    param: error.param,
    retryable: error.retryable,
    cause: error,
    message: `Adapter '${adapter.name}' (${adapter.planned.repo} @ ${adapter.planned.revision.slice(0, 12)}, ${adapter.file}): ${error.message}`,
  });
}

/** The branch or tag updates follow: the one asked for, unless it was a commit (then the default branch). */
function followedRef(request: ServeRequest): { ref?: string } {
  if (isLocalSource(request.repo)) return {};
  const revision = request.revision;
  return { ref: revision === undefined || /^[0-9a-f]{40}$/.test(revision) ? "main" : revision };
}
