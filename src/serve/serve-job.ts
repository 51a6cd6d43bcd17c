// The serve job (DESIGN.md "The serve job"): from a repository to an answering replica in
// six steps, each with a live state and a detail line:
//   registry  read the repository, pick the artifact, decide the profiles (before any byte moves)
//   mirror    fetch into the mirror, verified against the published sha256, with progress
//   check     read what was fetched as the engine will (GGUF header, memory for the pool)
//   catalog   add the model with its profiles, source and origin
//   placement wait for a ready replica; parked or unplaceable ends the job with why;
//             hardware that exists but is busy finishes the job as `waiting`
//   smoke_test ask that replica for a hello; reply and tokens/s are the job's result
// What a step decided is kept in the job's context, so a job cut by a restart resumes
// where it was. A cancelled job removes the model it added; mirrored files stay.
import { UpstreamError, describeError, errorCode } from "../core/errors.ts";
import { countOf, formatBytes } from "../core/format.ts";
import type { Logger } from "../core/log.ts";
import type { Catalog, CatalogModel } from "../catalog/catalog.ts";
import type { Mirror } from "../mirror/mirror.ts";
import { isLocalSource } from "../registry/local-source.ts";
import type { Registry } from "../registry/types.ts";
import type { MirrorPlanner } from "./artifact-choice.ts";
import { prepareMirrorFetch } from "./fetch-preparation.ts";
import { checkMirrored, mirrorFiles, waitForReplica, withoutHeaders, type JobFleet, type PlannedFetch } from "./job-steps.ts";
import type { JobHandler, RunningJob, StepHandle } from "./jobs.ts";
import { chooseProfiles, contextSettings, describeProfiles, serveModelBody, type OriginFile, type ServeProfile, type WeightsFormat } from "./serve-definition.ts";
import { serveRequestSchema, type ServeRequest } from "./serve-request.ts";
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
  /** The catalog model this job created (its id), so a resumed job does not add it twice and a cancel removes it. */
  createdModelId?: string;
}

export const DEFAULT_REPLICA_TIMEOUT_MS = 30 * 60_000;

export function serveJobHandler(deps: JobDependencies): JobHandler {
  return {
    steps: () => [...SERVE_STEPS],
    async run(job) {
      // The request was checked at the door; parsing again gives the defaults their values.
      const request = { ...serveRequestSchema.parse(job.request), name: job.request.name as string };
      const context = job.context as ServeContext;
      const { pool, parallel } = contextSettings(request);

      await job.step("registry", async () => {
        const prepared = await prepareMirrorFetch({
          request: { repo: request.repo, revision: request.revision, quant: request.quant, file: request.file, format: request.format, projector: request.projector, context: pool },
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
        const profiles = chooseProfiles({ request, format, planOptions: prepared.planned?.plan.options ?? [], artifactId: pick.by === "plan" ? plannedArtifact : null });
        const planned: PlannedFetch = { model: prepared.model, version: plan.version, repo: plan.repo, revision: plan.revision, files: withoutHeaders(plan.files), totalBytes: plan.totalBytes };
        await job.remember({ planned, format, entry, profiles } satisfies ServeContext);
        // Mirrored and kept in the origin, but not yet handed to engines: say so rather than imply image input works.
        const projector = request.projector === undefined ? undefined : typeof request.projector === "string" ? request.projector : plan.files.find((f) => /mmproj/i.test(f.path))?.path;
        const projectorNote = projector === undefined ? "" : `; the vision projector ${projector} is mirrored with it, but engines do not load projectors yet, so the model takes no images`;
        return `${plan.repo} @ ${plan.revision.slice(0, 12)}: ${pick.artifact} (${pick.by === "plan" ? "the plan's pick" : pick.by === "default" ? "the default" : `asked for by ${pick.by}`}), ${countOf(plan.files.length, "file")}, ${formatBytes(plan.totalBytes)}; runs as ${describeProfiles(profiles)}${projectorNote}`;
      });

      await job.step("mirror", (step) => mirrorFiles({ planned: context.planned!, mirror: deps.mirror, registry: deps.registry, step, signal: job.signal }));

      await job.step("check", async () => {
        const checked = await checkMirrored({ planned: context.planned!, entry: context.entry!, format: context.format!, modelName: request.name, contextPool: pool, parallel, mirror: deps.mirror, signal: job.signal });
        await job.remember({ origin: checked.origin } satisfies ServeContext);
        return checked.detail;
      });

      await job.step("catalog", async () => {
        const planned = context.planned!;
        const source = { kind: "mirror" as const, model: planned.model, version: planned.version, file: context.entry! };
        // Added before a restart: by the id remembered, or (killed between adding it and
        // remembering) by its name with this job's source and revision.
        const existing = deps.catalog
          .list()
          .find((m) => m.id === context.createdModelId || (context.createdModelId === undefined && m.name === request.name && m.definition.origin?.revision === planned.revision && JSON.stringify(m.definition.source) === JSON.stringify(source)));
        if (existing !== undefined) {
          await job.remember({ createdModelId: existing.id } satisfies ServeContext);
          return `'${existing.name}' was added before the server restarted`;
        }
        const body = serveModelBody({
          request,
          profiles: context.profiles!,
          source,
          origin: { repo: planned.repo, revision: planned.revision, ...followedRef(request), files: context.origin! },
        });
        const created = await deps.catalog.create(body, job.actor);
        job.setModel(created.name);
        await job.remember({ createdModelId: created.id } satisfies ServeContext);
        const scaling = request.replicas === 0 ? "started on demand" : `${countOf(request.replicas, "replica")}`;
        return `added '${created.name}'${request.aliases.length > 0 ? ` (aliases ${request.aliases.join(", ")})` : ""}: ${describeProfiles(context.profiles!)}, ${scaling}`;
      });

      const model = deps.catalog.list().find((m) => m.id === context.createdModelId);
      if (model === undefined) throw new Error(`The model '${request.name}' this job added is gone from the catalog; it was removed while the job ran.`);
      try {
        return await placeAndTest(job, deps, model);
      } catch (error) {
        if (job.stopReason !== null) throw error;
        // The model stays in the catalog (it may only need room, or an unpark): say what to do with it.
        throw new UpstreamError(
          `${describeError(error)}. The model '${model.name}' stays in the catalog: fix the cause and 'llmgw ctl model unpark ${model.name}', or 'llmgw ctl model remove ${model.name}' before serving it again.`,
          { code: errorCode(error) ?? "serve_failed", cause: error },
        );
      }
    },
    async undo(job: RunningJob) {
      const modelId = (job.context as ServeContext).createdModelId;
      const model = modelId === undefined ? undefined : deps.catalog.list().find((m) => m.id === modelId);
      if (model === undefined) return;
      // Removing the model stops its replicas; the mirrored files stay for a later job.
      await deps.catalog.delete(model.name, job.actor).catch((error: unknown) => {
        deps.logger.warn({ job: job.id, model: model.name, err: describeError(error) }, "a cancelled serve job could not remove its model");
        throw error;
      });
    },
  };
}

/** The placement and smoke test steps of a serve job, for the model its catalog step added. */
async function placeAndTest(job: RunningJob, deps: JobDependencies, model: CatalogModel): Promise<"done" | "waiting"> {
  job.setModel(model.name);
  // An on-demand model gets its replica the way a request would start it.
  const onDemand = model.definition.scaling.min === 0;
  const waitReady = (step: StepHandle) =>
    waitForReplica({ fleet: deps.fleet, model, timeoutMs: deps.replicaTimeoutMs ?? DEFAULT_REPLICA_TIMEOUT_MS, signal: job.signal, step, exists: () => deps.catalog.list().some((m) => m.id === model.id) });
  if (onDemand) deps.fleet.requested(model);
  try {
    let waited: Awaited<ReturnType<typeof waitForReplica>> | undefined;
    await job.step("placement", async (step) => {
      waited = await waitReady(step);
      if (waited.kind === "busy") return `waiting for room: ${waited.explanation.join("; ")}. The model starts when a node has room.`;
      const r = waited.replica;
      return `replica ${r.id} ready on ${r.nodeNames.join(", ")} (${r.profile}) after ${(waited.waitedMs / 1000).toFixed(1)} s${r.weightsVerified ? ", weights verified against the origin" : ""}`;
    });
    if (waited?.kind === "busy") {
      await job.skip("smoke_test", "the model waits for room on a node");
      return "waiting";
    }
    await job.step("smoke_test", async (step) => {
      // A resumed job skipped the placement step: find the replica again.
      const ready = waited?.kind === "ready" ? waited : await waitReady(step);
      if (ready.kind !== "ready") throw new Error("the replica is gone and the nodes are busy");
      const result = await deps.smokeTest(ready.replica, model.name, job.signal);
      job.setResult(result);
      return `"${result.reply}" (${result.completion_tokens} tokens, ${result.tokens_per_second} tokens/s)`;
    });
    return "done";
  } finally {
    if (onDemand) deps.fleet.finished(model);
  }
}

/** The branch or tag updates follow: the one asked for, unless it was a commit (then the default branch). */
function followedRef(request: ServeRequest): { ref?: string } {
  if (isLocalSource(request.repo)) return {};
  const revision = request.revision;
  return { ref: revision === undefined || /^[0-9a-f]{40}$/.test(revision) ? "main" : revision };
}

