// Local sources: weights that are already on disk, for machines without a hub. A file or
// folder (`./models/x.gguf`, `/srv/models/llama`, `file:///srv/models/llama`) is read into
// the same RepoInfo a Hub repository gives, so file sets, the mirror and the catalog treat
// it the same way. Every file is hashed (sha256, and git's blob id) once; the result is
// remembered in `{dataDir}/registry/local-hashes.json` keyed by real path, size and mtime,
// so reading the same folder again does not re-read gigabytes.
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir, readdir, readFile, realpath, rename, stat, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { basename, dirname, join, relative, resolve, sep } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { BadRequestError, NotFoundError } from "../core/errors.ts";
import { pathProblem } from "./repo-path.ts";
import { SHORT_SHA_LENGTH, type RepoFile, type RepoInfo } from "./types.ts";

export interface LocalSourceOptions {
  /** `./models/x.gguf`, `../x`, `/abs/path`, `~/x` or `file:///abs/path`. */
  source: string;
  /** llmgw's data dir; the remembered hashes live in `registry/local-hashes.json` below it. */
  dataDir: string;
  /** Base for relative paths. Default: the process's working directory. */
  cwd?: string;
  signal?: AbortSignal;
  /** Called while a file is hashed (not for remembered ones). */
  onProgress?: (event: { path: string; bytesDone: number; bytesTotal: number }) => void;
}

export interface LocalRepoInfo extends RepoInfo {
  /** The absolute folder that `files[].path` are relative to. */
  root: string;
  /** Files hashed by this call, and files whose hash was remembered from an earlier one. */
  hashed: number;
  fromCache: number;
}

interface CacheEntry {
  size: number;
  mtimeMs: number;
  sha256: string;
  blobId: string;
  hashedAt: string;
}

interface CacheFile {
  version: 1;
  files: Record<string, CacheEntry>;
}

// Walking a folder with more files than this is almost certainly the wrong folder (a home
// directory, `/`), and hashing it would take hours.
const MAX_FILES = 10_000;
const GGUF_SPLIT = /^(?<prefix>.*)-(?<shard>\d{5})-of-(?<total>\d{5})\.gguf$/i;

/**
 * True when `value` names a local source rather than a Hub repository: a `file:` URL or a
 * path starting with `/`, `./`, `../` or `~/`. A bare `models/x` is a repository id.
 */
export function isLocalSource(value: string): boolean {
  return /^(file:|\/|\.\.?\/|~\/)/.test(value) || value === "." || value === "..";
}

/** The absolute path a local source names. */
export function localSourcePath(source: string, cwd: string = process.cwd()): string {
  if (source.startsWith("file:")) {
    try {
      return fileURLToPath(source);
    } catch (error) {
      throw new BadRequestError(`Invalid file URL '${source}': expected file:///absolute/path.`, { code: "invalid_local_source", param: "source", cause: error });
    }
  }
  if (source === "~" || source.startsWith("~/")) return join(homedir(), source.slice(1));
  return resolve(cwd, source);
}

/** Reads a local file or folder into a RepoInfo, hashing each file at most once per size and mtime. */
export async function readLocalSource(options: LocalSourceOptions): Promise<LocalRepoInfo> {
  const target = localSourcePath(options.source, options.cwd);
  let top;
  try {
    top = await stat(target);
  } catch (error) {
    if (isCode(error, "ENOENT") || isCode(error, "ENOTDIR")) {
      throw new NotFoundError(`No file or folder at '${target}' (from '${options.source}'). Check the path; relative paths start from ${options.cwd ?? process.cwd()}.`, {
        code: "local_source_not_found",
        param: "source",
        cause: error,
      });
    }
    throw new BadRequestError(`Cannot read '${target}' (from '${options.source}'): ${describe(error)}.`, { code: "local_source_unreadable", param: "source", cause: error });
  }

  let root: string;
  let relatives: string[];
  if (top.isDirectory()) {
    root = target;
    relatives = await walk(root, options.source);
  } else if (top.isFile()) {
    root = dirname(target);
    relatives = await withSplitSiblings(root, basename(target));
  } else {
    throw new BadRequestError(`'${target}' is neither a regular file nor a folder.`, { code: "invalid_local_source", param: "source" });
  }
  if (relatives.length === 0) {
    throw new NotFoundError(`The folder '${root}' (from '${options.source}') has no files.`, { code: "local_source_empty", param: "source" });
  }

  const cachePath = join(options.dataDir, "registry", "local-hashes.json");
  const cache = await loadCache(cachePath);
  const updates: Record<string, CacheEntry> = {};
  const files: RepoFile[] = [];
  let hashed = 0;
  let fromCache = 0;
  for (const path of relatives.sort()) {
    options.signal?.throwIfAborted();
    const absolute = join(root, ...path.split("/"));
    // Symlinks are followed (a Hugging Face cache snapshot is a folder of links into
    // ../../blobs); the remembered hash is keyed by the real file, so each blob is hashed once.
    const real = await realpath(absolute);
    const info = await stat(real);
    const known = updates[real] ?? cache.files[real];
    if (known !== undefined && known.size === info.size && known.mtimeMs === info.mtimeMs) {
      files.push({ path, size: info.size, sha256: known.sha256, blobId: known.blobId });
      fromCache += 1;
      continue;
    }
    const digest = await hashFile({ path: real, size: info.size, display: path, ...pick(options) });
    const after = await stat(real);
    if (after.size !== info.size || after.mtimeMs !== info.mtimeMs) {
      throw new BadRequestError(`'${absolute}' changed while it was being hashed; try again once nothing writes to it.`, { code: "local_source_changed", param: "source" });
    }
    updates[real] = { size: info.size, mtimeMs: info.mtimeMs, ...digest, hashedAt: new Date().toISOString() };
    files.push({ path, size: info.size, ...digest });
    hashed += 1;
  }
  if (hashed > 0) await saveCache(cachePath, updates);

  // A content id standing in for a commit sha: the same files with the same bytes give the same id.
  const listing = files.map((file) => `${file.path}\u0000${file.size}\u0000${file.sha256}\n`).join("");
  const sha = createHash("sha256").update(listing).digest("hex");
  return {
    repo: pathToFileURL(top.isDirectory() ? root : target).href,
    revision: "local",
    sha,
    shortSha: sha.slice(0, SHORT_SHA_LENGTH),
    gated: false,
    private: false,
    files,
    root,
    hashed,
    fromCache,
  };
}

/** Every regular file below `root` (following links to files), as `/`-separated relative paths. Dot entries are skipped. */
async function walk(root: string, source: string): Promise<string[]> {
  const found: string[] = [];
  const pending = [root];
  while (pending.length > 0) {
    const dir = pending.pop() as string;
    const entries = await readdir(dir, { withFileTypes: true });
    for (const entry of entries) {
      // .git, .cache (huggingface_hub's download metadata), editor files: never weights.
      if (entry.name.startsWith(".")) continue;
      const absolute = join(dir, entry.name);
      const path = relative(root, absolute).split(sep).join("/");
      if (entry.isDirectory()) {
        pending.push(absolute);
        continue;
      }
      if (entry.isSymbolicLink()) {
        let target;
        try {
          target = await stat(absolute);
        } catch (error) {
          throw new BadRequestError(`'${absolute}' is a symbolic link to something that does not exist; fix or remove it.`, {
            code: "local_source_broken_link",
            param: "source",
            cause: error,
          });
        }
        // Links to folders are not followed: they can loop, and a model folder does not need them.
        if (!target.isFile()) continue;
      } else if (!entry.isFile()) {
        continue;
      }
      const problem = pathProblem(path);
      if (problem !== null) {
        throw new BadRequestError(`The file '${absolute}' has a name llmgw cannot serve (${problem}); rename it.`, { code: "invalid_path", param: "source" });
      }
      found.push(path);
      if (found.length > MAX_FILES) {
        throw new BadRequestError(`'${root}' (from '${source}') holds more than ${MAX_FILES} files; point at the model's own folder.`, {
          code: "local_source_too_large",
          param: "source",
        });
      }
    }
  }
  return found;
}

/** A single file, plus the other parts of its split series when it is one (`x-00001-of-00003.gguf`). */
async function withSplitSiblings(dir: string, name: string): Promise<string[]> {
  const problem = pathProblem(name);
  if (problem !== null) throw new BadRequestError(`The file '${join(dir, name)}' has a name llmgw cannot serve (${problem}); rename it.`, { code: "invalid_path", param: "source" });
  const split = GGUF_SPLIT.exec(name);
  if (split?.groups === undefined) return [name];
  const { prefix, total } = split.groups;
  const siblings = (await readdir(dir)).filter((other) => {
    const match = GGUF_SPLIT.exec(other);
    return match?.groups !== undefined && match.groups.prefix === prefix && match.groups.total === total;
  });
  return siblings.includes(name) ? siblings : [name, ...siblings];
}

async function hashFile(options: {
  path: string;
  size: number;
  display: string;
  signal?: AbortSignal;
  onProgress?: LocalSourceOptions["onProgress"];
}): Promise<{ sha256: string; blobId: string }> {
  const sha256 = createHash("sha256");
  // git's blob id, which the Hub lists as `oid`: sha1 over a `blob <size>\0` header and the bytes.
  const sha1 = createHash("sha1").update(`blob ${options.size}\0`);
  let done = 0;
  let lastReport = 0;
  const stream = createReadStream(options.path, { highWaterMark: 1024 * 1024, ...(options.signal === undefined ? {} : { signal: options.signal }) });
  for await (const chunk of stream) {
    const buffer = chunk as Buffer;
    sha256.update(buffer);
    sha1.update(buffer);
    done += buffer.length;
    if (options.onProgress !== undefined && (done - lastReport >= 64 * 1024 * 1024 || done === options.size)) {
      lastReport = done;
      options.onProgress({ path: options.display, bytesDone: done, bytesTotal: options.size });
    }
  }
  return { sha256: sha256.digest("hex"), blobId: sha1.digest("hex") };
}

async function loadCache(path: string): Promise<CacheFile> {
  try {
    const parsed = JSON.parse(await readFile(path, "utf8")) as unknown;
    if (typeof parsed === "object" && parsed !== null && "version" in parsed && parsed.version === 1 && "files" in parsed && typeof parsed.files === "object" && parsed.files !== null) {
      return parsed as CacheFile;
    }
  } catch {
    // Missing or unreadable: the hashes are only a cache, so start over.
  }
  return { version: 1, files: {} };
}

/** Merges new entries into the cache file (re-read first, so two readers do not lose each other's work) and replaces it atomically. */
async function saveCache(path: string, updates: Record<string, CacheEntry>): Promise<void> {
  const current = await loadCache(path);
  const next: CacheFile = { version: 1, files: { ...current.files, ...updates } };
  await mkdir(dirname(path), { recursive: true });
  const temporary = `${path}.${process.pid}.${Date.now()}.tmp`;
  await writeFile(temporary, `${JSON.stringify(next, null, 1)}\n`, { mode: 0o600 });
  await rename(temporary, path);
}

function pick(options: LocalSourceOptions): { signal?: AbortSignal; onProgress?: LocalSourceOptions["onProgress"] } {
  return {
    ...(options.signal === undefined ? {} : { signal: options.signal }),
    ...(options.onProgress === undefined ? {} : { onProgress: options.onProgress }),
  };
}

function isCode(error: unknown, code: string): boolean {
  return typeof error === "object" && error !== null && "code" in error && error.code === code;
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
