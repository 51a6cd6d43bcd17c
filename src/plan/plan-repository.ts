// Plans a whole repository: reads it from the registry (or lists a local file or folder),
// classifies its files into artifacts, reads what each artifact needs for an estimate
// (the GGUF header over HTTP ranges or from disk; config.json and the safetensors index),
// and hands the candidates to `planModel` with the pool of nodes. This is what
// `GET /api/v1/plan` and `llmgw ctl model plan` run; the serve job will use the same.
// Nothing here reads or hashes whole weight files: a plan needs sizes and headers only.
import { readFile } from "node:fs/promises";
import path from "node:path";
import type { Dispatcher } from "undici";
import { BadRequestError, NotFoundError, describeError } from "../core/errors.ts";
import { formatBytes } from "../core/format.ts";
import { readGgufHeader, type GgufHeaderSummary } from "../gguf/header.ts";
import { BUNDLED_LLAMA_CPP, checkArchitectureSupport } from "../gguf/llama-support.ts";
import type { SafetensorsIndex } from "../gguf/memory-estimate.ts";
import { classifyFiles, describeSet, type ArtifactSet, type ListedFile } from "../registry/file-sets.ts";
import { assertLocalFilesReadable, isLocalSource, listLocalSource, localReadError } from "../registry/local-source.ts";
import type { Registry } from "../registry/types.ts";
import { ggufArtifact, safetensorsArtifact } from "./artifacts.ts";
import { planModel, type ModelPlan, type PlanArtifact, type Pool } from "./plan.ts";

export interface PlanRepositoryOptions {
  /** `owner/name` on the registry, or a local file or folder (`./x.gguf`, `/models/x`, `file:///...`). */
  repo: string;
  revision?: string;
  contextSize: number;
  format?: "gguf" | "safetensors";
  registry: Registry;
  pool: Pool;
  /** For GGUF header reads over HTTP; small files go through `registry.readSmallFile`. */
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

/** What a plan needs of a repository: its files' paths and sizes, and where it was read. */
interface Listing {
  repo: string;
  revision: string;
  sha: string;
  files: ListedFile[];
  /** The folder of a local source; null for a registry repository. */
  root: string | null;
}

export async function planRepository(options: PlanRepositoryOptions): Promise<RepositoryPlan> {
  const signal = options.signal;
  // A local source is listed (paths, sizes, mtimes), never hashed: the sha of a local plan
  // is the listing's id, which is all a plan needs to name what it looked at.
  const info: Listing = isLocalSource(options.repo)
    ? await listLocalSource({ source: options.repo, ...(signal ? { signal } : {}) })
    : {
        ...(await options.registry.repoInfo({
          repo: options.repo,
          ...(options.revision ? { revision: options.revision } : {}),
          ...(signal ? { signal } : {}),
        })),
        root: null,
      };
  const sets = classifyFiles(info.files);
  const reader = new ArtifactReader(options, info);

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
        if (signal?.aborted === true) throw signal.reason ?? error;
        entry.note = `could not be read: ${describeError(error)}`;
        return null;
      }
    });
  }
  if (listing.length === 0) {
    throw new NotFoundError(`${info.repo} has no GGUF or safetensors weights (it has ${info.files.length} file${info.files.length === 1 ? "" : "s"}).`, {
      code: "no_weights",
    });
  }
  const artifacts = (await runLimited(jobs, HEADER_CONCURRENCY)).filter((a): a is PlanArtifact => a !== null);
  if (artifacts.length === 0) {
    const notes = listing.map((a) => `${a.description}: ${a.note ?? "not planned"}`).join("; ");
    throw new BadRequestError(`Nothing in ${info.repo} could be planned: ${notes}.`, { code: "nothing_to_plan" });
  }
  return {
    repo: info.repo,
    revision: info.revision,
    sha: info.sha,
    artifacts: listing,
    plan: planModel({ artifacts, contextSize: options.contextSize, pool: options.pool }),
  };
}

/** Reads what an estimate needs from the registry or the local folder. */
class ArtifactReader {
  constructor(
    private readonly options: PlanRepositoryOptions,
    private readonly info: Listing,
  ) {}

  async gguf(set: ArtifactSet<ListedFile>): Promise<PlanArtifact> {
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
      support: checkArchitectureSupport({
        architecture: header.architecture,
        engine: { name: "node-llama-cpp", version: BUNDLED_LLAMA_CPP.nodeLlamaCppVersions[0]! },
      }),
    });
  }

  async safetensors(set: ArtifactSet<ListedFile>, companions: ListedFile[]): Promise<PlanArtifact> {
    const configPath = path.posix.join(set.dir, "config.json");
    const configFile = companions.find((c) => c.path === configPath);
    if (configFile === undefined) {
      throw new NotFoundError(`${configPath} is missing; vLLM needs it next to the weights`, { code: "config_missing" });
    }
    const config = (await this.json(configFile)) as Record<string, unknown>;
    const indexFile = set.files.find((f) => f.path.endsWith(".index.json"));
    const index = indexFile === undefined ? undefined : ((await this.json(indexFile)) as SafetensorsIndex);
    const weights = set.files.filter((f) => f.path.endsWith(".safetensors"));
    return safetensorsArtifact({
      config,
      ...(index === undefined ? {} : { index }),
      totalBytes: weights.reduce((sum, f) => sum + f.size, 0),
      contextSize: this.options.contextSize,
      files: set.files.map((f) => f.path),
    });
  }

  private async header(file: string): Promise<GgufHeaderSummary> {
    const signal = this.options.signal;
    if (this.info.root !== null) {
      const absolute = path.join(this.info.root, file);
      // Opened first so a file the server may not read is named with what to change
      // (the header reader's own message is about GGUF, not permissions).
      await assertLocalFilesReadable([{ absolute }], signal);
      try {
        return await readGgufHeader({ file: absolute, ...(signal ? { signal } : {}) });
      } catch (error) {
        throw signal?.aborted === true ? (signal.reason ?? error) : localReadError(error, absolute);
      }
    }
    const url = this.options.registry.downloadUrl(this.info.repo, this.info.sha, file);
    return readGgufHeader({
      url,
      headers: this.options.registry.requestHeaders(url),
      ...(this.options.dispatcher ? { dispatcher: this.options.dispatcher } : {}),
      ...(signal ? { signal } : {}),
    });
  }

  private async json(file: ListedFile): Promise<unknown> {
    const signal = this.options.signal;
    let text: string;
    if (this.info.root !== null) {
      const absolute = path.join(this.info.root, file.path);
      if (file.size > MAX_JSON_BYTES) {
        throw new BadRequestError(`${file.path} is ${formatBytes(file.size)}; llmgw reads JSON companions up to ${formatBytes(MAX_JSON_BYTES)}`, {
          code: "file_too_large",
        });
      }
      try {
        text = await readFile(absolute, { encoding: "utf8", ...(signal ? { signal } : {}) });
      } catch (error) {
        throw signal?.aborted === true ? (signal.reason ?? error) : localReadError(error, absolute);
      }
    } else {
      const bytes = await this.options.registry.readSmallFile({
        repo: this.info.repo,
        sha: this.info.sha,
        path: file.path,
        maxBytes: MAX_JSON_BYTES,
        ...(signal ? { signal } : {}),
      });
      text = bytes.toString("utf8");
    }
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new BadRequestError(`${file.path} is not valid JSON (${describeError(error)})`, { code: "invalid_json" });
    }
  }
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
