// Which artifact of a repository a serve job (and `POST /api/v1/mirror`, `ctl mirror
// fetch`) takes, and why.
// Asked for a quantisation or a file: that. Asked for neither: what the planner recommends
// for this server's hardware (the same plan `GET /api/v1/plan` and `ctl model plan` show,
// for the same context), so the two always agree; when nothing fits, the registry's
// default choice (Q4_K_M), saying that nothing fits. Either way the answer says which
// artifact was picked and why.
import { DEFAULT_CONTEXT_POOL } from "../catalog/model-schema.ts";
import type { RepositoryPlan } from "../plan/plan-repository.ts";
import { DEFAULT_QUANT, chooseArtifact, classifyFiles, type ChooseArtifactOptions, type ListedFile } from "../registry/file-sets.ts";
import { assertLocalFilesReadable, isLocalSource, listLocalSource } from "../registry/local-source.ts";
import type { Registry } from "../registry/types.ts";
import { planLocalMirrorFetch, planMirrorFetch, type MirrorFetchPlan } from "./mirror-plan.ts";

/** Plans a repository against this server's pool: the planner behind `GET /api/v1/plan`. */
export type MirrorPlanner = (
  query: { repo: string; revision?: string; contextSize: number; format?: "gguf" | "safetensors" },
  signal: AbortSignal,
) => Promise<RepositoryPlan>;

export interface FetchRequest {
  repo: string;
  revision?: string | undefined;
  quant?: string | undefined;
  file?: string | undefined;
  format?: "gguf" | "safetensors" | undefined;
  projector?: boolean | string | undefined;
  /** The context the plan is made for (tokens); default the catalog's context pool. */
  context?: number | undefined;
}

/** How the artifact was picked: asked for (`quant`, `file`), `plan` (the recommendation), or `default`. */
export interface FetchPick {
  by: "quant" | "file" | "plan" | "default";
  /** The artifact set's name, e.g. `Q8_0` or `Q2_K/tiny-llama-Q2_K`. */
  artifact: string;
  reason: string;
}

export interface FetchChoice {
  plan: MirrorFetchPlan;
  pick: FetchPick;
  /** The planner's view of the repository, when it was asked (no quant or file given). */
  planned?: RepositoryPlan;
}

export async function chooseFetch(options: {
  request: FetchRequest;
  registry: Registry;
  planner?: MirrorPlanner;
  cwd?: string;
  signal: AbortSignal;
}): Promise<FetchChoice> {
  const { request, signal } = options;
  const asked = { format: request.format, projector: request.projector };
  if (request.quant !== undefined || request.file !== undefined || options.planner === undefined) {
    const by = request.quant !== undefined ? "quant" : request.file !== undefined ? "file" : "default";
    const { plan, set } = await readAndChoose(options, request.revision, { ...asked, quant: request.quant, file: request.file });
    const reason =
      by === "quant"
        ? `asked for with quant ${request.quant}`
        : by === "file"
          ? `asked for with file ${request.file}`
          : `the default (${DEFAULT_QUANT}); this server has no planner`;
    return { plan, pick: { by, artifact: set, reason } };
  }
  const contextSize = request.context ?? DEFAULT_CONTEXT_POOL;
  const planned = await options.planner(
    {
      repo: request.repo,
      contextSize,
      ...(request.revision === undefined ? {} : { revision: request.revision }),
      ...(request.format === undefined ? {} : { format: request.format }),
    },
    signal,
  );
  const recommended = planned.plan.recommendation;
  // The recommendation names its artifact by value; its files are on the planned artifact.
  const artifact =
    recommended === null
      ? undefined
      : planned.plan.artifacts.find(
          (a) => a.id === recommended.artifact.id && a.format === recommended.artifact.format && a.bytes === recommended.artifact.bytes,
        );
  const entry = artifact?.files?.[0];
  // Read again at the commit the plan looked at, so the files fetched are the ones planned.
  const revision = isLocalSource(request.repo) ? undefined : planned.sha;
  if (recommended === null || entry === undefined) {
    const { plan, set } = await readAndChoose(options, revision, asked);
    return {
      plan,
      planned,
      pick: {
        by: "default",
        artifact: set,
        reason: `the default choice, since nothing in the plan fits this server for a ${contextSize}-token context. ${planned.plan.explanation}`,
      },
    };
  }
  const { plan, set } = await readAndChoose(options, revision, { ...asked, file: entry, format: recommended.artifact.format });
  return {
    plan,
    planned,
    pick: {
      by: "plan",
      artifact: set,
      reason: `what 'llmgw ctl model plan' recommends for this server for a ${contextSize}-token context. ${planned.plan.explanation}`,
    },
  };
}

/** Reads the repository (or lists the local source), picks the artifact and makes the mirror's file list. */
async function readAndChoose(
  options: { request: FetchRequest; registry: Registry; cwd?: string; signal: AbortSignal },
  revision: string | undefined,
  choice: Omit<ChooseArtifactOptions<ListedFile>, "sets">,
): Promise<{ plan: MirrorFetchPlan; set: string }> {
  const { request, registry, signal } = options;
  if (isLocalSource(request.repo)) {
    // Listed, not hashed: the mirror hashes the chosen files while it copies them.
    const listing = await listLocalSource({ source: request.repo, signal, ...(options.cwd === undefined ? {} : { cwd: options.cwd }) });
    const chosen = chooseArtifact({ sets: classifyFiles(listing.files), ...choice });
    await assertLocalFilesReadable(chosen.files, signal);
    return { plan: planLocalMirrorFetch({ listing, chosen }), set: chosen.set.name };
  }
  const info = await registry.repoInfo({ repo: request.repo, signal, ...(revision === undefined ? {} : { revision }) });
  const chosen = chooseArtifact({ sets: classifyFiles(info.files), ...choice });
  return { plan: planMirrorFetch({ registry, repoInfo: info, chosen }), set: chosen.set.name };
}
