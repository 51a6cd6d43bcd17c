// Local sources: weights that are already on disk, for machines without a hub. A file or
// folder (`./models/x.gguf`, `/srv/models/llama`, `file:///srv/models/llama`) is listed
// into the same path-and-size file list a Hub repository gives, so file sets, the plan and
// the mirror treat it the same way.
//
// Listing and hashing are separate steps. `listLocalSource` reads only directory entries
// and `stat`s (path, size, mtime): planning a folder of twenty quantisations, or picking
// one of them to mirror, must not read every byte of every one of them. `hashLocalFiles`
// hashes the files a caller names (sha256, and git's blob id), each once: the result is
// remembered in `{dataDir}/registry/local-hashes.json` keyed by real path, size and mtime,
// so hashing the same files again does not re-read gigabytes.
//
// Until its files are hashed, a local source is identified by its files' paths, sizes and
// mtimes (`localSourceId`): the stand-in for a commit sha. The mirror names a local
// version after the chosen files' id and refuses to copy a file whose size or mtime no
// longer match it (src/mirror/mirror.ts), so the id always describes the bytes copied.
import { createHash } from "node:crypto";
import { createReadStream, type Stats } from "node:fs";
import { mkdir, open, readdir, readFile, realpath, rename, stat, writeFile } from "node:fs/promises";
import { homedir } from "node:os";
import { basename, dirname, join, relative, resolve, sep } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { BadRequestError, LlmgwError, NotFoundError, PermissionDeniedError, describeError, errorCode } from "../core/errors.ts";
import { pathProblem } from "./repo-path.ts";
import { SHORT_SHA_LENGTH, type RepoFile } from "./types.ts";

export interface ListLocalSourceOptions {
  /** `./models/x.gguf`, `../x`, `/abs/path`, `~/x` or `file:///abs/path`. */
  source: string;
  /** Base for relative paths. Default: the process's working directory. */
  cwd?: string;
  signal?: AbortSignal;
}

/** One file of a local source, as listed: no content has been read. */
export interface LocalFile {
  /** Path relative to the listing's root, with `/` separators, already sanitised. */
  path: string;
  size: number;
  /** Modification time in ms (of the file a link points at), as `stat` gave it. */
  mtimeMs: number;
  /** Where the file is: the listing's root joined with `path` (links not resolved). */
  absolute: string;
}

export interface LocalListing {
  /** A `file://` URL of the folder, or of the file when a single file was named. */
  repo: string;
  revision: "local";
  /** `localSourceId` of every listed file: changes when any file is added, removed, resized or touched. */
  sha: string;
  /** The first 12 hex characters of `sha`. */
  shortSha: string;
  /** The absolute folder that `files[].path` are relative to. */
  root: string;
  /** Every file below root (a single file: it and its split siblings), sorted by path. */
  files: LocalFile[];
}

export interface HashLocalFilesOptions {
  /** Files from a listing; each is checked to still have the size and mtime it was listed with. */
  files: readonly LocalFile[];
  /** llmgw's data dir; the remembered hashes live in `registry/local-hashes.json` below it. */
  dataDir: string;
  signal?: AbortSignal;
  /** Called while a file is hashed (not for remembered ones). */
  onProgress?: (event: { path: string; bytesDone: number; bytesTotal: number }) => void;
}

export interface HashedLocalFiles {
  /** The files in the order given, with their sha256 and git blob id. */
  files: RepoFile[];
  /** Files read and hashed by this call, and files whose hash was remembered from an earlier one. */
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
// directory, `/`), and listing it would take long enough to look like a hang.
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
      throw new BadRequestError(`Invalid file URL '${source}': expected file:///absolute/path.`, {
        code: "invalid_local_source",
        param: "source",
        cause: error,
      });
    }
  }
  if (source === "~" || source.startsWith("~/")) return join(homedir(), source.slice(1));
  return resolve(cwd, source);
}

/**
 * The id of a set of local files as listed: sha256 over each file's path, size and mtime,
 * sorted by path. The same files, untouched, give the same id; touching, resizing, adding
 * or removing one gives another.
 */
export function localSourceId(files: readonly Pick<LocalFile, "path" | "size" | "mtimeMs">[]): string {
  const lines = [...files]
    .sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0))
    .map((file) => `${file.path}\u0000${file.size}\u0000${file.mtimeMs}\n`)
    .join("");
  return createHash("sha256").update(lines).digest("hex");
}

/** Lists a local file or folder: paths, sizes and mtimes only; no file is opened. */
export async function listLocalSource(options: ListLocalSourceOptions): Promise<LocalListing> {
  const target = localSourcePath(options.source, options.cwd);
  options.signal?.throwIfAborted();
  let top: Stats;
  try {
    top = await stat(target);
  } catch (error) {
    if (errorCode(error) === "ENOENT" || errorCode(error) === "ENOTDIR") {
      throw new NotFoundError(
        `No file or folder at '${target}' (from '${options.source}'). Check the path; relative paths start from ${options.cwd ?? process.cwd()}.`,
        {
          code: "local_source_not_found",
          param: "source",
          cause: error,
        },
      );
    }
    throw localReadError(error, target);
  }

  let root: string;
  let relatives: string[];
  if (top.isDirectory()) {
    root = target;
    relatives = await walk(root, options.source, options.signal);
  } else if (top.isFile()) {
    root = dirname(target);
    relatives = await withSplitSiblings(root, basename(target));
  } else {
    throw new BadRequestError(`'${target}' is neither a regular file nor a folder.`, { code: "invalid_local_source", param: "source" });
  }
  if (relatives.length === 0) {
    throw new NotFoundError(`The folder '${root}' (from '${options.source}') has no files.`, { code: "local_source_empty", param: "source" });
  }

  const files: LocalFile[] = [];
  for (const path of relatives.sort()) {
    options.signal?.throwIfAborted();
    const absolute = join(root, ...path.split("/"));
    // stat follows links: a Hugging Face cache snapshot is a folder of links into ../../blobs.
    const info = await stat(absolute).catch((error: unknown) => {
      throw localReadError(error, absolute);
    });
    files.push({ path, size: info.size, mtimeMs: info.mtimeMs, absolute });
  }
  const sha = localSourceId(files);
  return {
    repo: pathToFileURL(top.isDirectory() ? root : target).href,
    revision: "local",
    sha,
    shortSha: sha.slice(0, SHORT_SHA_LENGTH),
    root,
    files,
  };
}

/**
 * Checks that this process may read each file by opening it (reading nothing), so a
 * request that will copy or hash them fails now with the file's name rather than later in
 * the background. open(2), not access(2): access answers for the real user id and lets
 * root pass where open still refuses.
 */
export async function assertLocalFilesReadable(files: readonly Pick<LocalFile, "absolute">[], signal?: AbortSignal): Promise<void> {
  for (const file of files) {
    signal?.throwIfAborted();
    try {
      await (await open(file.absolute, "r")).close();
    } catch (error) {
      throw localReadError(error, file.absolute);
    }
  }
}

/**
 * Hashes the given files (sha256 and git's blob id), each at most once per real path,
 * size and mtime: remembered hashes are used without reading the file. A file whose size
 * or mtime differ from its listing is refused (it changed since it was listed).
 */
export async function hashLocalFiles(options: HashLocalFilesOptions): Promise<HashedLocalFiles> {
  const cachePath = join(options.dataDir, "registry", "local-hashes.json");
  const cache = await loadCache(cachePath);
  const updates: Record<string, CacheEntry> = {};
  const files: RepoFile[] = [];
  let hashed = 0;
  let fromCache = 0;
  for (const file of options.files) {
    options.signal?.throwIfAborted();
    // The remembered hash is keyed by the real file, so each blob behind several links is hashed once.
    let real: string;
    let info: Stats;
    try {
      real = await realpath(file.absolute);
      info = await stat(real);
    } catch (error) {
      throw localReadError(error, file.absolute);
    }
    if (info.size !== file.size || info.mtimeMs !== file.mtimeMs) throw changedError(file.absolute, "since it was listed");
    const known = updates[real] ?? cache.files[real];
    if (known !== undefined && known.size === info.size && known.mtimeMs === info.mtimeMs) {
      files.push({ path: file.path, size: info.size, sha256: known.sha256, blobId: known.blobId });
      fromCache += 1;
      continue;
    }
    let digest: { sha256: string; blobId: string };
    try {
      digest = await hashFile({ path: real, size: info.size, display: file.path, signal: options.signal, onProgress: options.onProgress });
    } catch (error) {
      if (options.signal?.aborted === true) throw options.signal.reason ?? error;
      throw localReadError(error, file.absolute);
    }
    const after = await stat(real).catch((error: unknown) => {
      throw localReadError(error, file.absolute);
    });
    if (after.size !== info.size || after.mtimeMs !== info.mtimeMs) throw changedError(file.absolute, "while it was being hashed");
    updates[real] = { size: info.size, mtimeMs: info.mtimeMs, ...digest, hashedAt: new Date().toISOString() };
    files.push({ path: file.path, size: info.size, ...digest });
    hashed += 1;
  }
  if (hashed > 0) await saveCache(cachePath, updates);
  return { files, hashed, fromCache };
}

/**
 * A failure to read a local file or folder as an llmgw error naming it: permission
 * problems are 403s that say what to change, a file that vanished is a 404, anything else
 * a 400. Errors that already are llmgw errors pass through.
 */
export function localReadError(error: unknown, file: string): LlmgwError {
  if (error instanceof LlmgwError) return error;
  const code = errorCode(error);
  if (code === "EACCES" || code === "EPERM") {
    return new PermissionDeniedError(
      `llmgw cannot read '${file}': permission denied (${code}). Make it readable by the user the llmgw server runs as (for example 'chmod a+r'), or point at another copy.`,
      { code: "local_source_unreadable", param: "source", cause: error },
    );
  }
  if (code === "ENOENT" || code === "ENOTDIR") {
    return new NotFoundError(`'${file}' is no longer there (it was removed or renamed after it was found); check the folder and try again.`, {
      code: "local_source_not_found",
      param: "source",
      cause: error,
    });
  }
  return new BadRequestError(`Cannot read '${file}': ${describeError(error)}.`, { code: "local_source_unreadable", param: "source", cause: error });
}

function changedError(file: string, when: string): BadRequestError {
  return new BadRequestError(`'${file}' changed ${when}; try again once nothing writes to it.`, { code: "local_source_changed", param: "source" });
}

/** Every regular file below `root` (following links to files), as `/`-separated relative paths. Dot entries are skipped. */
async function walk(root: string, source: string, signal: AbortSignal | undefined): Promise<string[]> {
  const found: string[] = [];
  const pending = [root];
  while (pending.length > 0) {
    signal?.throwIfAborted();
    const dir = pending.pop() as string;
    const entries = await readdir(dir, { withFileTypes: true }).catch((error: unknown) => {
      throw localReadError(error, dir);
    });
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
        let target: Stats;
        try {
          target = await stat(absolute);
        } catch (error) {
          if (errorCode(error) !== "ENOENT" && errorCode(error) !== "ENOTDIR") throw localReadError(error, absolute);
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
  if (problem !== null)
    throw new BadRequestError(`The file '${join(dir, name)}' has a name llmgw cannot serve (${problem}); rename it.`, {
      code: "invalid_path",
      param: "source",
    });
  const split = GGUF_SPLIT.exec(name);
  if (split?.groups === undefined) return [name];
  const { prefix, total } = split.groups;
  const names = await readdir(dir).catch((error: unknown) => {
    throw localReadError(error, dir);
  });
  const siblings = names.filter((other) => {
    const match = GGUF_SPLIT.exec(other);
    return match?.groups !== undefined && match.groups.prefix === prefix && match.groups.total === total;
  });
  return siblings.includes(name) ? siblings : [name, ...siblings];
}

async function hashFile(options: {
  path: string;
  size: number;
  display: string;
  signal: AbortSignal | undefined;
  onProgress: HashLocalFilesOptions["onProgress"];
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
    if (
      typeof parsed === "object" &&
      parsed !== null &&
      "version" in parsed &&
      parsed.version === 1 &&
      "files" in parsed &&
      typeof parsed.files === "object" &&
      parsed.files !== null
    ) {
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
