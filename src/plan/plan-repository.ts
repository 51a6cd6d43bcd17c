// Plans a whole repository: reads it from the registry (or a local file or folder),
// classifies its files into artifacts, reads what each artifact needs for an estimate
// (the GGUF header over HTTP ranges or from disk; config.json and the safetensors index),
// and hands the candidates to `planModel` with the pool of nodes. This is what
// `GET /api/v1/plan` and `llmgw ctl model plan` run; the serve job will use the same.
import { readFile } from "node:fs/promises";
import path from "node:path";
import { request, type Dispatcher } from "undici";
import { BadRequestError, NotFoundError, UpstreamError, describeError } from "../core/errors.ts";
import { readGgufHeader, type GgufHeaderSummary } from "../gguf/header.ts";
import { BUNDLED_LLAMA_CPP, checkArchitectureSupport } from "../gguf/llama-support.ts";
import type { SafetensorsIndex } from "../gguf/memory-estimate.ts";
import { classifyFiles, describeSet, type ArtifactSet } from "../registry/file-sets.ts";
import { headersForRedirect } from "../registry/hub-client.ts";
import { isLocalSource, readLocalSource } from "../registry/local-source.ts";
import type { Registry, RepoFile, RepoInfo } from "../registry/types.ts";
import { ggufArtifact, planModel, safetensorsArtifact, type ModelPlan, type PlanArtifact, type Pool } from "./plan.ts";

export interface PlanRepositoryOptions {
  /** `owner/name` on the registry, or a local file or folder (`./x.gguf`, `/models/x`, `file:///...`). */
  repo: string;
  revision?: string;
  contextSize: number;
  format?: "gguf" | "safetensors";
  registry: Registry;
  pool: Pool;
  /** llmgw's data dir (local sources remember their hashes there). */
  dataDir: string;
  dispatcher?: Dispatcher;
  signal?: AbortSignal;
}

export interface RepositoryPlan {
  repo: string;
  revision: string;
  sha: string;
  /** One line per artifact the repository offers, including ones not planned (and why). */
  artifacts: Array<{ name: string; format: string; description: string; planned: boolean; note?: string }>;
  plan: ModelPlan;
}

/** Small JSON files (config.json, the index) are refused above this size. */
const MAX_JSON_BYTES = 16 * 1024 * 1024;
/** Headers are read a few at a time: a repository can hold twenty quantisations. */
const HEADER_CONCURRENCY = 4;

export async function planRepository(options: PlanRepositoryOptions): Promise<RepositoryPlan> {
  const local = isLocalSource(options.repo);
  const info = local
    ? await readLocalSource({ source: options.repo, dataDir: options.dataDir, ...(options.signal ? { signal: options.signal } : {}) })
    : await options.registry.repoInfo({ repo: options.repo, ...(options.revision ? { revision: options.revision } : {}), ...(options.signal ? { signal: options.signal } : {}) });
  const root = local ? (info as RepoInfo & { root: string }).root : null;
  const sets = classifyFiles(info.files);
  const reader = new ArtifactReader(options, info, root);

  const wanted = (format: "gguf" | "safetensors") => options.format === undefined || options.format === format;
  const listing: RepositoryPlan["artifacts"] = [];
  const jobs: Array<() => Promise<PlanArtifact | null>> = [];
  for (const set of [...sets.gguf, ...sets.safetensors]) {
    const entry = { name: set.name, format: set.format, description: describeSet(set), planned: false } as RepositoryPlan["artifacts"][number];
    listing.push(entry);
    if (!wanted(set.format)) {
      entry.note = `left out by --format ${options.format}`;
      continue;
    }
    if (!set.complete) {
      entry.note = "incomplete: parts are missing";
      continue;
    }
    jobs.push(async () => {
      try {
        const artifact = set.format === "gguf" ? await reader.gguf(set) : await reader.safetensors(set, sets.companions);
        entry.planned = true;
        return artifact;
      } catch (error) {
        entry.note = `could not be read: ${describeError(error)}`;
        return null;
      }
    });
  }
  if (listing.length === 0) {
    throw new NotFoundError(`${info.repo} has no GGUF or safetensors weights (it has ${info.files.length} file${info.files.length === 1 ? "" : "s"}).`, { code: "no_weights" });
  }
  const artifacts = (await runLimited(jobs, HEADER_CONCURRENCY)).filter((a): a is PlanArtifact => a !== null);
  if (artifacts.length === 0) {
    const notes = listing.map((a) => `${a.description}: ${a.note ?? "not planned"}`).join("; ");
    throw new BadRequestError(`Nothing in ${info.repo} could be planned: ${notes}.`, { code: "nothing_to_plan" });
  }
  return { repo: info.repo, revision: info.revision, sha: info.sha, artifacts: listing, plan: planModel({ artifacts, contextSize: options.contextSize, pool: options.pool }) };
}

/** Reads what an estimate needs from the registry or the local folder. */
class ArtifactReader {
  constructor(
    private readonly options: PlanRepositoryOptions,
    private readonly info: RepoInfo,
    private readonly root: string | null,
  ) {}

  async gguf(set: ArtifactSet<RepoFile>): Promise<PlanArtifact> {
    const header = await this.header(set.entry);
    // Split files: the first part's header describes the model; the weights are in all parts.
    const weightsBytes = set.files.length > 1 ? set.totalBytes - header.headerBytes : undefined;
    return ggufArtifact({
      header,
      contextSize: this.options.contextSize,
      bytes: set.totalBytes,
      ...(weightsBytes === undefined ? {} : { weightsBytes }),
      files: set.files.map((f) => f.path),
      ...(set.quant === null ? {} : { label: set.quant }),
      support: checkArchitectureSupport({ architecture: header.architecture, engine: { name: "node-llama-cpp", version: BUNDLED_LLAMA_CPP.nodeLlamaCppVersions[0]! } }),
    });
  }

  async safetensors(set: ArtifactSet<RepoFile>, companions: RepoFile[]): Promise<PlanArtifact> {
    const configPath = path.posix.join(set.dir, "config.json");
    if (!companions.some((c) => c.path === configPath)) {
      throw new NotFoundError(`${configPath} is missing; vLLM needs it next to the weights`, { code: "config_missing" });
    }
    const config = (await this.json(configPath)) as Record<string, unknown>;
    const indexFile = set.files.find((f) => f.path.endsWith(".index.json"));
    const index = indexFile === undefined ? undefined : ((await this.json(indexFile.path)) as SafetensorsIndex);
    const weights = set.files.filter((f) => f.path.endsWith(".safetensors"));
    return safetensorsArtifact({
      config,
      ...(index === undefined ? {} : { index }),
      totalBytes: weights.reduce((sum, f) => sum + f.size, 0),
      contextSize: this.options.contextSize,
      files: set.files.map((f) => f.path),
    });
  }

  private download(file: string): Promise<Dispatcher.ResponseData> {
    const url = this.options.registry.downloadUrl(this.info.repo, this.info.sha, file);
    return downloadSmallFile(this.options.registry, url, {
      ...(this.options.dispatcher ? { dispatcher: this.options.dispatcher } : {}),
      ...(this.options.signal ? { signal: this.options.signal } : {}),
    });
  }

  private header(file: string): Promise<GgufHeaderSummary> {
    const signal = this.options.signal;
    if (this.root !== null) return readGgufHeader({ file: path.join(this.root, file), ...(signal ? { signal } : {}) });
    const url = this.options.registry.downloadUrl(this.info.repo, this.info.sha, file);
    return readGgufHeader({
      url,
      headers: this.options.registry.requestHeaders(url),
      ...(this.options.dispatcher ? { dispatcher: this.options.dispatcher } : {}),
      ...(signal ? { signal } : {}),
    });
  }

  private async json(file: string): Promise<unknown> {
    let text: string;
    if (this.root !== null) {
      text = await readFile(path.join(this.root, file), "utf8");
    } else {
      const response = await this.download(file);
      const declared = Number(response.headers["content-length"] ?? 0);
      if (declared > MAX_JSON_BYTES) {
        await response.body.dump();
        throw new BadRequestError(`${file} is ${declared} bytes; llmgw reads JSON companions up to ${MAX_JSON_BYTES} bytes`);
      }
      text = await response.body.text();
    }
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new BadRequestError(`${file} is not valid JSON (${describeError(error)})`, { code: "invalid_json" });
    }
  }
}

/** GET of a small file, following up to three redirects (Authorization kept only on the registry's own origin). */
async function downloadSmallFile(registry: Registry, firstUrl: string, options: { dispatcher?: Dispatcher; signal?: AbortSignal }): Promise<Dispatcher.ResponseData> {
  let url = firstUrl;
  let headers = registry.requestHeaders(url);
  for (let hop = 0; hop <= 3; hop += 1) {
    const response = await request(url, {
      headers,
      headersTimeout: 30_000,
      bodyTimeout: 30_000,
      ...(options.dispatcher ? { dispatcher: options.dispatcher } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
    });
    const location = response.headers.location;
    if (response.statusCode >= 300 && response.statusCode < 400 && typeof location === "string") {
      await response.body.dump();
      const next = new URL(location, url).toString();
      headers = headersForRedirect(headers, url, next);
      url = next;
      continue;
    }
    if (response.statusCode !== 200) {
      await response.body.dump();
      throw new UpstreamError(`${firstUrl} answered HTTP ${response.statusCode}`, { code: "registry_error", retryable: response.statusCode >= 500 || response.statusCode === 429 });
    }
    return response;
  }
  throw new UpstreamError(`${firstUrl} redirected more than three times`, { code: "registry_error" });
}

async function runLimited<T>(jobs: Array<() => Promise<T>>, limit: number): Promise<T[]> {
  const results: T[] = new Array(jobs.length);
  let next = 0;
  const worker = async () => {
    while (next < jobs.length) {
      const index = next++;
      results[index] = await jobs[index]!();
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, jobs.length) }, worker));
  return results;
}
