// The steps serve and update jobs share: fetch a version into the mirror with live
// progress (bytes, speed, time left), check what was fetched (the GGUF header llama.cpp
// must accept, or config.json for safetensors) and collect the origin's verified files,
// and wait for a ready replica of the model's current definition, ending early with the
// reason when the model parks or cannot be placed. A step that reads mirrored files copies
// those only another server holds here first (mirrored-here.ts).
// A serve job's LoRA adapters ride along: each adapter repository is read with the same
// registry client as the model (its gated and private answers too), its GGUF file pinned
// to the commit read, and fetched into the mirror as that repository's own version, with
// the published sha256 checked like weights.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { BadRequestError, UpstreamError } from "../core/errors.ts";
import { countOf, formatBytes } from "../core/format.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { checkWeightsFile } from "../catalog/weights-check.ts";
import { estimateGgufMemory } from "../gguf/memory-estimate.ts";
import type { FetchVersionSummary, Mirror, MirrorFetchFile } from "../mirror/mirror.ts";
import { defaultMirrorModelName, planMirrorFetch } from "../mirror/mirror-plan.ts";
import type { Registry, RepoFile } from "../registry/types.ts";
import type { FleetStatusOfModel } from "../fleet/model-health.ts";
import { waitsForRoom } from "../fleet/placement.ts";
import type { StepHandle } from "./jobs.ts";
import { bringMirroredHere } from "./mirrored-here.ts";
import type { OriginFile, WeightsFormat } from "./serve-definition.ts";
import type { ServeAdapterRequest } from "./serve-request.ts";
import type { SmokeTarget } from "./smoke-test.ts";

/** What the registry step decided about the files, kept in the job's context (no headers: they may hold the registry token). */
export interface PlannedFetch {
  model: string;
  version: string;
  repo: string;
  revision: string;
  files: Array<Omit<MirrorFetchFile, "headers">>;
  totalBytes: number;
}

/** A replica of a model as the fleet sees it, for the jobs (holds the engine key: server-side only). */
export interface JobReplica extends Omit<SmokeTarget, "endpoint"> {
  profile: string;
  state: string;
  endpoint: SmokeTarget["endpoint"] | null;
  weightsVerified: boolean;
  lastError: string | null;
}

/** What the jobs need of the fleet. */
export interface JobFleet {
  /** The model's running replicas of its current definition, and of earlier ones. */
  replicasByDefinition(modelId: string): { current: JobReplica[]; outdated: JobReplica[] };
  status(modelId: string): FleetStatusOfModel;
  /**
   * Keeps the model's running replicas serving, and new ones out of routing, until the
   * returned release; "rejected" stops the new ones first (their revision failed).
   */
  holdOutdated(modelId: string): (outcome?: "passed" | "rejected") => void;
  /** On-demand models: a request wants a replica / is done with it. */
  requested(model: CatalogModel): void;
  finished(model: CatalogModel): void;
}

export function withoutHeaders(files: readonly MirrorFetchFile[]): PlannedFetch["files"] {
  return files.map(({ headers: _headers, ...file }) => file);
}

/** A LoRA adapter the registry step chose, kept in the job's context: served as MODEL:NAME. */
export interface PlannedAdapter {
  name: string;
  /** As asked; absent: the catalog's default. */
  scale?: number;
  /** The adapter's GGUF file, a version of its own repository in the mirror. */
  planned: PlannedFetch;
  /** The file's path in the repository, and so in the mirror version. */
  file: string;
}

/** How many file names a message lists before it says how many more there are. */
const LISTED_FILES = 12;

/**
 * Reads each adapter's repository and picks its file: the one named, else the repository's
 * only .gguf; a repository without one, or with several and none named, is refused with
 * the .gguf files to choose from. Each is checked as the mirror will take it, before any
 * byte moves.
 */
export async function planAdapters(input: {
  adapters: ReadonlyArray<ServeAdapterRequest & { name: string }>;
  registry: Registry;
  mirror: Pick<Mirror, "checkFetch">;
  signal: AbortSignal;
}): Promise<PlannedAdapter[]> {
  const planned: PlannedAdapter[] = [];
  for (const [index, adapter] of input.adapters.entries()) {
    const info = await input.registry.repoInfo({
      repo: adapter.repo,
      signal: input.signal,
      ...(adapter.revision === undefined ? {} : { revision: adapter.revision }),
    });
    const file = chooseAdapterFile({ adapter, files: info.files, where: `${info.repo} @ ${info.shortSha}`, param: `adapters.${index}.file` });
    const plan = planMirrorFetch({ registry: input.registry, repoInfo: info, chosen: { files: [file] } });
    const model = defaultMirrorModelName(info.repo);
    input.mirror.checkFetch({ model, version: plan.version, revision: plan.revision, files: plan.files });
    planned.push({
      name: adapter.name,
      ...(adapter.scale === undefined ? {} : { scale: adapter.scale }),
      file: file.path,
      planned: { model, version: plan.version, repo: plan.repo, revision: plan.revision, files: withoutHeaders(plan.files), totalBytes: plan.totalBytes },
    });
  }
  return planned;
}

function chooseAdapterFile(input: { adapter: ServeAdapterRequest; files: readonly RepoFile[]; where: string; param: string }): RepoFile {
  const { adapter, where, param } = input;
  const ggufs = input.files.filter((file) => /\.gguf$/i.test(file.path));
  const listed =
    ggufs.length === 0
      ? "it has no .gguf file"
      : `its .gguf files: ${ggufs
          .slice(0, LISTED_FILES)
          .map((file) => file.path)
          .join(", ")}${ggufs.length > LISTED_FILES ? ` and ${ggufs.length - LISTED_FILES} more` : ""}`;
  if (adapter.file !== undefined) {
    const named = input.files.find((file) => file.path === adapter.file);
    if (named !== undefined) return named;
    throw new BadRequestError(`The adapter repository ${where} has no file '${adapter.file}'; ${listed}. Name one of them (--adapter ${adapter.repo}:FILE).`, {
      code: "adapter_file_not_found",
      param,
    });
  }
  const [only, ...others] = ggufs;
  if (only !== undefined && others.length === 0) return only;
  if (only === undefined) {
    throw new BadRequestError(
      `The adapter repository ${where} has no .gguf file: llama.cpp loads LoRA adapters converted to GGUF (llama.cpp's convert_lora_to_gguf.py). Give a repository that holds the adapter as GGUF.`,
      { code: "adapter_file_not_found", param },
    );
  }
  throw new BadRequestError(
    `The adapter repository ${where} has ${ggufs.length} .gguf files; say which is the adapter (--adapter ${adapter.repo}:FILE). ${listed}.`,
    {
      code: "adapter_file_ambiguous",
      param,
    },
  );
}

/** `style (owner/style-lora @ 0123456789ab, 1.2 KiB)`, for step details. */
export function describeAdapters(adapters: readonly PlannedAdapter[]): string {
  const each = adapters.map((a) => `${a.name} (${a.planned.repo} @ ${a.planned.revision.slice(0, 12)}, ${formatBytes(a.planned.totalBytes)})`);
  return `adapter${adapters.length === 1 ? "" : "s"} ${each.join(", ")}`;
}

/**
 * Fetches the planned files into the mirror (and the versions fetched alongside them, such
 * as a serve job's adapters, one after another), reporting progress over all of them;
 * throws naming each file that failed.
 */
export async function mirrorFiles(input: {
  planned: PlannedFetch;
  alongside?: readonly PlannedFetch[];
  mirror: Mirror;
  registry: Registry;
  step: StepHandle;
  signal: AbortSignal;
  clock?: () => number;
}): Promise<string> {
  const { step } = input;
  const versions = [input.planned, ...(input.alongside ?? [])];
  const clock = input.clock ?? Date.now;
  const totalBytes = versions.reduce((sum, planned) => sum + planned.totalBytes, 0);
  const totalFiles = versions.reduce((sum, planned) => sum + planned.files.length, 0);
  const done = new Map<string, number>();
  const complete = new Set<string>();
  const samples: Array<{ at: number; bytes: number }> = [];
  const report = () => {
    const bytes = [...done.values()].reduce((sum, n) => sum + n, 0);
    const now = clock();
    samples.push({ at: now, bytes });
    // Speed over the last five seconds: steady enough to read, recent enough to follow a change.
    while (samples.length > 2 && now - samples[0]!.at > 5000) samples.shift();
    const first = samples[0]!;
    const rate = now - first.at >= 500 ? ((bytes - first.bytes) * 1000) / (now - first.at) : null;
    const left = Math.max(0, totalBytes - bytes);
    step.progress({
      bytes_done: bytes,
      bytes_total: totalBytes,
      bytes_per_second: rate === null ? null : Math.round(rate),
      eta_seconds: rate === null || rate <= 0 ? null : Math.ceil(left / rate),
      files_done: complete.size,
      files_total: totalFiles,
    });
  };
  const summaries: FetchVersionSummary[] = [];
  for (const planned of versions) {
    const key = (file: string) => `${planned.model}/${planned.version}/${file}`;
    const summary = await input.mirror.fetchVersion({
      model: planned.model,
      version: planned.version,
      repo: planned.repo,
      revision: planned.revision,
      // Headers again from the registry: the token is never stored with the job.
      files: planned.files.map(
        (file): MirrorFetchFile => (file.url.startsWith("file:") ? file : { ...file, headers: input.registry.requestHeaders(file.url) }),
      ),
      signal: input.signal,
      onProgress: (event) => {
        done.set(key(event.file), event.bytesDone);
        if (event.state === "complete") complete.add(key(event.file));
        report();
      },
    });
    for (const file of summary.files) done.set(key(file.file), file.bytesTotal ?? done.get(key(file.file)) ?? 0);
    summaries.push(summary);
  }
  const outcomes = summaries.flatMap((summary) => summary.files);
  const failed = outcomes.filter((file) => file.state === "failed");
  if (failed.length > 0) {
    throw new UpstreamError(
      `${failed.length} of ${countOf(outcomes.length, "file")} could not be mirrored: ${failed.map((file) => `${file.file}: ${file.error?.message ?? "failed"}`).join("; ")}. ` +
        "Files that were verified stay in the mirror; run the job again to retry the rest.",
      { code: "mirror_failed" },
    );
  }
  report();
  const bytes = outcomes.reduce((sum, file) => sum + (file.bytesTotal ?? 0), 0);
  const fetched = summaries.reduce((sum, summary) => sum + summary.fetched, 0);
  const skipped = summaries.reduce((sum, summary) => sum + summary.skipped, 0);
  return `${countOf(outcomes.length, "file")} verified (${formatBytes(bytes)}): ${fetched} fetched, ${skipped} already in the mirror`;
}

/**
 * The adapters' mirrored files, here and complete (copied from the server that holds them
 * when only another does): each with the sha256 the mirror verified. Whether each fits the
 * model is the catalog's door check, when the model is added.
 */
export async function checkMirroredAdapters(input: {
  adapters: readonly PlannedAdapter[];
  mirror: Pick<Mirror, "check" | "replicate" | "fromOrigin">;
  signal: AbortSignal;
  step?: StepHandle | undefined;
}): Promise<string> {
  const lines: string[] = [];
  for (const adapter of input.adapters) {
    const { model, version } = adapter.planned;
    const copied = await bringMirroredHere({ mirror: input.mirror, model, version, files: [adapter.file], signal: input.signal, step: input.step });
    const checked = await input.mirror.check(model, version, adapter.file);
    if (checked.kind !== "ok") throw checked.error;
    lines.push(
      `adapter ${adapter.name}: ${model}/${version}/${adapter.file}, ${formatBytes(checked.size)}, sha256 ${checked.sha256.slice(0, 12)}…${copied === null ? "" : ` (${copied})`}`,
    );
  }
  return lines.join("; ");
}

/**
 * Checks the mirrored weights the way an engine will load them and collects the origin:
 * each file with the sha256 the mirror verified it with. Files only another server holds
 * are copied here first (mirrored-here.ts), with the copy's progress in the step's detail.
 */
export async function checkMirrored(input: {
  planned: PlannedFetch;
  entry: string;
  format: WeightsFormat;
  modelName: string;
  contextPool: number;
  parallel: number;
  mirror: Pick<Mirror, "check" | "replicate" | "fromOrigin">;
  signal: AbortSignal;
  step?: StepHandle | undefined;
}): Promise<{ detail: string; origin: OriginFile[] }> {
  const { planned, mirror } = input;
  const files = planned.files.map((file) => file.path);
  const copied = await bringMirroredHere({ mirror, model: planned.model, version: planned.version, files, signal: input.signal, step: input.step });
  const checked = await checkHere({ ...input, mirror });
  return copied === null ? checked : { ...checked, detail: `${checked.detail} (${copied})` };
}

async function checkHere(input: Parameters<typeof checkMirrored>[0]): Promise<{ detail: string; origin: OriginFile[] }> {
  const { planned, mirror } = input;
  const origin: OriginFile[] = [];
  let entryPath = "";
  for (const file of planned.files) {
    const checked = await mirror.check(planned.model, planned.version, file.path);
    if (checked.kind !== "ok") throw checked.error;
    origin.push({ path: file.path, sha256: checked.sha256, bytes: checked.size });
    if (file.path === input.entry) entryPath = checked.path;
  }
  if (input.format === "gguf") {
    const checked = await checkWeightsFile({ file: entryPath, modelName: input.modelName, llamaCpp: true, param: "repo", signal: input.signal });
    const header = checked.header!;
    const estimate = estimateGgufMemory({ header, contextSize: input.contextPool, parallel: input.parallel });
    // The pool is shared by `parallel` requests, so what may outrun the training is one request's share, not the pool.
    const perRequest = Math.floor(input.contextPool / input.parallel);
    const warnings =
      header.contextLength > 0 && perRequest > header.contextLength
        ? `. Note: each request gets ${perRequest} tokens, more than the ${header.contextLength} the model was trained for; answers past that may lose coherence (serve with --context ${header.contextLength})`
        : "";
    return {
      origin,
      detail:
        `${header.architecture}, ${header.blockCount} layers, ${header.quantisation}, trained for ${header.contextLength} tokens; ` +
        `needs about ${formatBytes(estimate.totalBytes)} with a ${input.contextPool}-token pool (weights ${formatBytes(estimate.weightsBytes)}, KV cache ${formatBytes(estimate.kvCacheBytes)})${warnings}`,
    };
  }
  const configPath = path.join(path.dirname(entryPath), "config.json");
  let shape = "no config.json next to the weights";
  try {
    const config = JSON.parse(await readFile(configPath, "utf8")) as {
      model_type?: string;
      architectures?: string[];
      num_hidden_layers?: number;
      torch_dtype?: string;
    };
    shape = `${config.architectures?.[0] ?? config.model_type ?? "unknown architecture"}, ${config.num_hidden_layers ?? "?"} layers, ${config.torch_dtype ?? "dtype not given"}`;
  } catch {
    // Said in the detail: vLLM will refuse the folder itself if it needs the file.
  }
  const bytes = origin.reduce((sum, file) => sum + file.bytes, 0);
  return { origin, detail: `${shape}; ${formatBytes(bytes)} of safetensors for vLLM` };
}

export type ReplicaWait =
  | { kind: "ready"; replica: JobReplica & { endpoint: SmokeTarget["endpoint"] }; waitedMs: number }
  | { kind: "busy"; explanation: string[] };

/**
 * Waits for a ready replica of the model's current definition. Throws when the model
 * parks (with why), when no node could ever take it (with the placement explanation), or
 * at the deadline; resolves `busy` when a node has the hardware but others use it now
 * (fleet/placement.ts `waitsForRoom`): then the model waits for room rather than failing.
 */
export async function waitForReplica(input: {
  fleet: JobFleet;
  model: CatalogModel;
  timeoutMs: number;
  signal: AbortSignal;
  step: StepHandle;
  pollMs?: number;
  /** Whether the model is still in the catalog: a removed one ends the wait at once. */
  exists?: () => boolean;
}): Promise<ReplicaWait> {
  const { fleet, model, step } = input;
  const started = Date.now();
  let lastLine = "";
  for (;;) {
    input.signal.throwIfAborted();
    if (input.exists !== undefined && !input.exists())
      throw new UpstreamError(`The model '${model.name}' was removed from the catalog while the job waited for its replica.`, { code: "model_removed" });
    const replicas = fleet.replicasByDefinition(model.id).current;
    const ready = replicas.find((r) => r.state === "ready" && r.endpoint !== null);
    if (ready !== undefined) return { kind: "ready", replica: { ...ready, endpoint: ready.endpoint! }, waitedMs: Date.now() - started };
    const status = fleet.status(model.id);
    if (status.parked !== null)
      throw new UpstreamError(`The model parked: ${status.parked.reason}. Fix the cause, then 'llmgw ctl model unpark ${model.name}'.`, {
        code: "model_parked",
      });
    if (status.weightsProblem !== null) throw new UpstreamError(status.weightsProblem, { code: "weights_unreadable" });
    if (status.unplaceable !== null && status.unplaceable.length > 0) {
      if (waitsForRoom(status.unplaceable)) return { kind: "busy", explanation: status.unplaceable };
      throw new UpstreamError(`No node can run '${model.name}': ${status.unplaceable.join("; ")}.`, { code: "model_unplaceable" });
    }
    const line =
      replicas.length === 0
        ? "placing a replica"
        : replicas.map((r) => `${r.id} ${r.state} on ${r.nodeNames.join(",") || "?"}${r.lastError ? ` (${r.lastError})` : ""}`).join("; ");
    if (line !== lastLine) {
      step.detail(line);
      lastLine = line;
    }
    if (Date.now() - started > input.timeoutMs) {
      throw new UpstreamError(
        `No replica of '${model.name}' became ready within ${Math.round(input.timeoutMs / 1000)} s (${line}). 'llmgw ctl model show ${model.name}' shows why.`,
        { code: "placement_timeout" },
      );
    }
    await new Promise((resolve) => setTimeout(resolve, input.pollMs ?? 250));
  }
}
