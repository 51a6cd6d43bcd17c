// The registry step shared by the serve job and `POST /api/v1/mirror`: read the repository
// (or list the local source), pick the artifact (asked for, or what the plan recommends),
// name the mirror version, and check everything the mirror would refuse before any byte
// moves. One function, so `ctl mirror fetch` and `ctl model serve` always pick alike.
import type { Mirror } from "./mirror.ts";
import { defaultMirrorModelName, type MirrorFetchPlan } from "./mirror-plan.ts";
import { validateMirrorKey } from "./mirror-paths.ts";
import type { RepositoryPlan } from "../plan/plan-repository.ts";
import type { Registry } from "../registry/types.ts";
import { chooseFetch, type FetchPick, type FetchRequest, type MirrorPlanner } from "./artifact-choice.ts";

export interface PreparedFetch {
  /** The mirror's name for the model (`owner--name` unless asked otherwise). */
  model: string;
  plan: MirrorFetchPlan;
  pick: FetchPick;
  /** The planner's view of the repository, when the pick came from the plan. */
  planned?: RepositoryPlan;
}

export interface PrepareFetchOptions {
  request: FetchRequest & { model?: string | undefined };
  registry: Registry;
  mirror: Pick<Mirror, "checkFetch">;
  planner?: MirrorPlanner | undefined;
  /** Base of relative local paths. Default: the server's working directory. */
  cwd?: string | undefined;
  signal: AbortSignal;
}

export async function prepareMirrorFetch(options: PrepareFetchOptions): Promise<PreparedFetch> {
  const { request } = options;
  const { plan, pick, planned } = await chooseFetch({
    request,
    registry: options.registry,
    signal: options.signal,
    ...(options.planner === undefined ? {} : { planner: options.planner }),
    ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
  });
  const model = validateMirrorKey("model", request.model ?? defaultMirrorModelName(plan.repo));
  // Everything fetchVersion would refuse is refused here, before a job or a 202 says the
  // fetch started: an accepted fetch always gets its rows, so it can be followed.
  options.mirror.checkFetch({ model, version: plan.version, revision: plan.revision, files: plan.files });
  return { model, plan, pick, ...(planned === undefined ? {} : { planned }) };
}
