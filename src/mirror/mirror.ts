// The mirror module: llmgw's content store of model weights. It owns
// DATA_DIR/mirror/{model}/{version}/{file} on disk and the `mirror_files` rows that say
// what each file is and how far it got. Weights are fetched once from a registry (or
// copied from a local source), checked against the sha256 the registry published, and then
// served to nodes from here, so a fleet downloads from the Hub once per version instead
// of once per node.
//
// The rules that keep it honest:
// - A file is only ever written as `<final>.partial` and renamed into place after it was
//   fsynced and its sha256 and size matched; a row is `complete` only after that rename.
//   So a crash at any moment leaves nothing half-written under a final name, and
//   `recover()` at startup turns what was in flight back into resumable `pending` rows.
// - Downloads resume with `Range: bytes=<partial size>-` after a dropped connection, a
//   timeout, a failed call or a restart. The sha256 is computed while the bytes stream
//   in, never by reading the file again; only a resume in a new process re-reads the
//   partial prefix once to rebuild the hash state.
// - The registry's Authorization header never follows a redirect to another host (the
//   Hub's CDN gets a signed URL), so redirects are followed by hand (src/registry/redirects.ts).
// - A local source (`file:` URL) is hashed while it is copied, not before; its version is
//   named after the files' paths, sizes and mtimes, and a file whose size or mtime changed
//   since it was listed is refused, before and after the copy.
import { createHash, type Hash } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { mkdir, open, readdir, rename, rm, rmdir, stat, statfs, truncate, unlink, type FileHandle } from "node:fs/promises";
import path from "node:path";
import type { Readable, Writable } from "node:stream";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { Agent, request, type Dispatcher } from "undici";
import { BadRequestError, ConflictError, LlmgwError, NotFoundError, UpstreamError, describeError, errorCode } from "../core/errors.ts";
import { silentLogger, type Logger } from "../core/log.ts";
import { localReadError } from "../registry/local-source.ts";
import { followRedirects, headersForRedirect as registryHeadersForRedirect } from "../registry/redirects.ts";
import type { MirrorFilesTable } from "../store/schema.ts";
import { nowIso, type Store } from "../store/store.ts";
import { PARTIAL_SUFFIX, validateMirrorFile, validateMirrorKey } from "./mirror-paths.ts";

export type MirrorFileState = "pending" | "fetching" | "complete" | "failed";

/** One file to fetch into a version. */
export interface MirrorFetchFile {
  /** Path inside the repository; becomes the path inside the version folder. */
  path: string;
  /** Where the bytes are: an http(s) URL (a registry resolve URL) or a `file:` URL of a local source. */
  url: string;
  /** The sha256 the registry published (lowercase hex), or null when it published none. */
  sha256: string | null;
  /** The size the registry published, or null when unknown. */
  size: number | null;
  /**
   * git's blob id of the content, checked when no sha256 was published (the Hub lists
   * small files kept in git, such as config.json, with only their blob id). Needs `size`.
   */
  gitBlobId?: string | null;
  /** Headers for the first request (the registry's Authorization); dropped on cross-host redirects. */
  headers?: Record<string, string>;
  /**
   * For a `file:` source: the modification time (ms) the file had when it was listed. The
   * copy is refused when the file's size or mtime differ, when it is opened and after it
   * was copied: a local version is named after them (`planLocalMirrorFetch`).
   */
  sourceMtimeMs?: number | null;
}

export interface MirrorProgressEvent {
  model: string;
  version: string;
  file: string;
  state: MirrorFileState;
  bytesDone: number;
  bytesTotal: number | null;
}

export interface FetchVersionOptions {
  /** The slug the caller chose (a catalog model name, or `owner--name`); one path segment. */
  model: string;
  /** The short revision; one path segment. */
  version: string;
  /** Where the files come from (`owner/name`, or a `file:` URL), for the rows and messages. */
  repo: string;
  /** The full commit sha (or local content id) the files belong to. */
  revision: string;
  files: MirrorFetchFile[];
  signal?: AbortSignal;
  onProgress?: (event: MirrorProgressEvent) => void;
}

export interface MirrorFileOutcome {
  file: string;
  state: "complete" | "failed";
  /** True when the file was already complete from the same commit and nothing was fetched. */
  skipped: boolean;
  /** Where the download started (bytes already on disk); 0 for a fresh download. */
  resumedFrom: number;
  /** Bytes received over the network (or copied) by this call. */
  bytesFetched: number;
  bytesTotal: number | null;
  sha256: string | null;
  error: { code: string; message: string; retryable: boolean } | null;
}

export interface FetchVersionSummary {
  model: string;
  version: string;
  repo: string;
  revision: string;
  /** True when every file is complete and verified. */
  complete: boolean;
  files: MirrorFileOutcome[];
  fetched: number;
  skipped: number;
  failed: number;
  bytesFetched: number;
}

export interface MirrorFileView {
  model: string;
  version: string;
  file: string;
  repo: string;
  revision: string;
  state: MirrorFileState;
  /** The sha256 the registry published. */
  sha256: string | null;
  /** The sha256 computed from the bytes (set once complete, or on a mismatch). */
  actualSha256: string | null;
  bytesDone: number;
  bytesTotal: number | null;
  /** bytesDone / bytesTotal in percent with one decimal; null when the size is unknown. */
  percent: number | null;
  error: string | null;
  sourceUrl: string;
  /** True while this process is fetching (or about to fetch) the file. */
  active: boolean;
  createdAt: string;
  updatedAt: string;
}

export interface MirrorDiskUsage {
  root: string;
  /** Every byte under root, partial downloads included. */
  bytes: number;
  /** Bytes in `.partial` files (downloads in progress or interrupted). */
  partialBytes: number;
  /** Space left on the disk that holds root, for an unprivileged writer; null when unknown. */
  freeBytes: number | null;
  versions: { model: string; version: string; bytes: number; partialBytes: number; files: number; tracked: boolean }[];
}

export interface RecoverSummary {
  /** Rows left `fetching` by a process that stopped; now `pending` with their partial size. */
  interrupted: number;
  /** `complete` rows whose file is missing or has the wrong size; now `failed`. */
  missing: number;
  /** Final-named files without a `complete` row, moved back to `.partial` (verified before use). */
  unconfirmed: number;
}

/** The file operations the mirror writes through; tests replace them to simulate a full disk. */
export interface MirrorIo {
  createWriteStream(file: string, options: { flags: "w" | "a"; highWaterMark: number }): Writable;
  /** Bytes an unprivileged process can still write on the filesystem holding `dir`; null when unknown. */
  freeBytes(dir: string): Promise<number | null>;
}

export interface MirrorOptions {
  store: Store;
  /** The content store's folder, DATA_DIR/mirror. */
  root: string;
  logger?: Logger;
  /** HTTP dispatcher; by default the mirror makes its own Agent with the timeouts below. */
  dispatcher?: Dispatcher;
  /** Files downloading at once, across all versions. Default 4. */
  concurrency?: number;
  clock?: () => number;
  /** TCP/TLS connect timeout of the mirror's own Agent. Default 10 s. */
  connectTimeoutMs?: number;
  /** Time to wait for response headers. Default 30 s (undici's own default is 300 s). */
  headersTimeoutMs?: number;
  /** Longest silence while a body streams. Default 60 s. */
  bodyTimeoutMs?: number;
  /** Further attempts after a transient failure (timeout, drop, 408/429/5xx) that made no progress. Default 4. */
  retries?: number;
  /** First delay between attempts; doubles each time up to `maxRetryDelayMs`. Default 1 s. */
  retryDelayMs?: number;
  maxRetryDelayMs?: number;
  /** How often `bytes_done` is written to the store while a file streams: every this many ms ... Default 1 s. */
  persistIntervalMs?: number;
  /** ... or every this many bytes, whichever comes first. Default 64 MiB. */
  persistBytes?: number;
  /** Least time between two `onProgress` calls for one file. Default 250 ms. */
  progressIntervalMs?: number;
  /** Which headers survive a redirect; default the registry's rule (Authorization dropped across hosts). */
  headersForRedirect?: (headers: Record<string, string>, from: string, to: string) => Record<string, string>;
  io?: Partial<MirrorIo>;
}

type Row = MirrorFilesTable;

interface ActiveFile {
  state: "pending" | "fetching";
  bytesDone: number;
  bytesTotal: number | null;
}

interface FetchContext {
  model: string;
  version: string;
  repo: string;
  revision: string;
  signal: AbortSignal;
  onProgress: ((event: MirrorProgressEvent) => void) | undefined;
}

/** What one download has put on disk so far; shared by its attempts. */
interface Transfer {
  partial: string;
  /** Bytes of the partial file confirmed written (and, when `hasher.bytes` equals it, hashed). */
  written: number;
  hasher: ContentHasher;
  /** Bytes received by this call, for the summary. */
  fetched: number;
  resumedFrom: number;
  /** The size the source announced, when the registry published none. */
  announcedSize: number | null;
  lastPersistAt: number;
  lastPersistBytes: number;
  persisting: Promise<void>;
  /** A background fdatasync of the partial, started at progress ticks; null when none runs. */
  syncing: Promise<void> | null;
  lastEventAt: number;
}

const MAX_REDIRECTS = 5;
// Large enough that a fast source rarely waits on the writer (fs.WriteStream joins queued
// chunks into one writev), small enough to bound memory per download.
const WRITE_HIGH_WATER_MARK = 8 * 1024 * 1024;
const READ_HIGH_WATER_MARK = 1024 * 1024;
const SHA256_HEX = /^[0-9a-f]{64}$/;
const BLOB_ID_HEX = /^[0-9a-f]{40}$/;

const defaultIo: MirrorIo = {
  createWriteStream: (file, options) => createWriteStream(file, options),
  freeBytes: async (dir) => {
    try {
      const info = await statfs(dir);
      return info.bavail * info.bsize;
    } catch {
      return null;
    }
  },
};

/**
 * The mirror of one server. One instance per root: it keeps in memory which files are in
 * flight, so two instances must not fetch into the same root at once.
 */
export class Mirror {
  readonly root: string;
  readonly #store: Store;
  readonly #logger: Logger;
  readonly #dispatcher: Dispatcher;
  readonly #ownsDispatcher: boolean;
  readonly #clock: () => number;
  readonly #headersTimeoutMs: number;
  readonly #bodyTimeoutMs: number;
  readonly #retries: number;
  readonly #retryDelayMs: number;
  readonly #maxRetryDelayMs: number;
  readonly #persistIntervalMs: number;
  readonly #persistBytes: number;
  readonly #progressIntervalMs: number;
  readonly #headersForRedirect: (headers: Record<string, string>, from: string, to: string) => Record<string, string>;
  readonly #io: MirrorIo;
  readonly #slots: Semaphore;
  /** Files in flight in this process (queued or downloading), by key. */
  readonly #active = new Map<string, ActiveFile>();
  /**
   * Files a running fetchVersion call will work on, counted per call, from the moment the
   * call is made: its rows list as active at once, even before the file's turn comes, so
   * a client polling after `POST /api/v1/mirror` never mistakes a row left `pending` by an
   * earlier run for an interrupted fetch.
   */
  readonly #claimed = new Map<string, number>();
  /** The running task of each file, so a second call for the same file waits for the first. */
  readonly #fileTasks = new Map<string, Promise<unknown>>();
  /** fetchVersion calls running per version, so a delete can refuse. */
  readonly #busyVersions = new Map<string, number>();
  /**
   * Hash state of partial files left by an earlier call in this process, so a retry after
   * a failed call continues hashing where it stopped instead of re-reading the prefix.
   */
  readonly #liveHashes = new Map<string, ContentHasher>();
  readonly #running = new Set<Promise<unknown>>();
  readonly #closing = new AbortController();
  #closed: Promise<void> | null = null;

  constructor(options: MirrorOptions) {
    this.root = path.resolve(options.root);
    this.#store = options.store;
    this.#logger = options.logger ?? silentLogger();
    this.#clock = options.clock ?? Date.now;
    this.#headersTimeoutMs = options.headersTimeoutMs ?? 30_000;
    this.#bodyTimeoutMs = options.bodyTimeoutMs ?? 60_000;
    this.#retries = Math.max(0, options.retries ?? 4);
    this.#retryDelayMs = Math.max(0, options.retryDelayMs ?? 1000);
    this.#maxRetryDelayMs = Math.max(this.#retryDelayMs, options.maxRetryDelayMs ?? 30_000);
    this.#persistIntervalMs = options.persistIntervalMs ?? 1000;
    this.#persistBytes = options.persistBytes ?? 64 * 1024 * 1024;
    this.#progressIntervalMs = options.progressIntervalMs ?? 250;
    this.#headersForRedirect = options.headersForRedirect ?? registryHeadersForRedirect;
    this.#io = { ...defaultIo, ...(options.io ?? {}) };
    this.#slots = new Semaphore(Math.max(1, Math.floor(options.concurrency ?? 4)));
    if (options.dispatcher !== undefined) {
      this.#dispatcher = options.dispatcher;
      this.#ownsDispatcher = false;
    } else {
      this.#dispatcher = new Agent({
        connect: { timeout: options.connectTimeoutMs ?? 10_000 },
        headersTimeout: this.#headersTimeoutMs,
        bodyTimeout: this.#bodyTimeoutMs,
      });
      this.#ownsDispatcher = true;
    }
  }

  /**
   * Fetches the files of one version, at most `concurrency` at once across the mirror.
   * A file already complete from the same revision and sha256 (and on disk with its size)
   * is skipped without a request; a partial left by an earlier attempt is resumed. Resolves
   * with what happened to each file (failures included, each recorded in its row); rejects
   * only for invalid input, or with the abort reason when `signal` (or `close()`) stops it.
   */
  fetchVersion(options: FetchVersionOptions): Promise<FetchVersionSummary> {
    let files: MirrorFetchFile[];
    try {
      files = this.checkFetch(options);
    } catch (error) {
      return Promise.reject(error);
    }
    const { model, version } = options;
    const signal = options.signal === undefined ? this.#closing.signal : AbortSignal.any([options.signal, this.#closing.signal]);
    const context: FetchContext = { model, version, repo: options.repo, revision: options.revision, signal, onProgress: options.onProgress };
    const versionKey = keyOf(model, version, "");
    this.#busyVersions.set(versionKey, (this.#busyVersions.get(versionKey) ?? 0) + 1);
    const keys = files.map((file) => keyOf(model, version, file.path));
    for (const key of keys) this.#claimed.set(key, (this.#claimed.get(key) ?? 0) + 1);
    const unclaim = (key: string): void => {
      const count = (this.#claimed.get(key) ?? 1) - 1;
      if (count <= 0) this.#claimed.delete(key);
      else this.#claimed.set(key, count);
    };
    const run = (async () => {
      try {
        const settled = await Promise.allSettled(files.map((file, index) => this.#fetchFile(context, file).finally(() => unclaim(keys[index] as string))));
        signal.throwIfAborted();
        const outcomes = settled.map((result) => {
          if (result.status === "fulfilled") return result.value;
          throw result.reason;
        });
        return summarize(context, outcomes);
      } finally {
        const count = (this.#busyVersions.get(versionKey) ?? 1) - 1;
        if (count <= 0) this.#busyVersions.delete(versionKey);
        else this.#busyVersions.set(versionKey, count);
      }
    })();
    this.#running.add(run);
    void run.then(
      () => this.#running.delete(run),
      () => this.#running.delete(run),
    );
    return run;
  }

  /**
   * Checks everything `fetchVersion` checks before it starts (the model and version names,
   * every file's path, URL, sha256, size and blob id, the revision, and that the mirror is
   * not shutting down) and returns the files. Throws the 400 (or 409) fetchVersion would
   * reject with, so a caller that runs the fetch in the background can refuse the request
   * itself instead of accepting a fetch that never starts.
   */
  checkFetch(options: Pick<FetchVersionOptions, "model" | "version" | "revision" | "files">): MirrorFetchFile[] {
    validateMirrorKey("model", options.model);
    validateMirrorKey("version", options.version);
    const files = validateFetchFiles(options.files);
    if (typeof options.revision !== "string" || options.revision === "") {
      throw new BadRequestError("fetchVersion needs the revision (commit sha) the files belong to.", { code: "invalid_field", param: "revision" });
    }
    if (this.#closing.signal.aborted) throw new ConflictError("The mirror is shutting down; fetch again after the server restarts.", { code: "mirror_closed" });
    return files;
  }

  /** Every mirrored file (optionally of one model) with its state and progress. */
  async list(options: { model?: string } = {}): Promise<MirrorFileView[]> {
    let query = this.#store.db.selectFrom("mirror_files").selectAll();
    if (options.model !== undefined) query = query.where("model", "=", validateMirrorKey("model", options.model));
    const rows = await query.orderBy("model").orderBy("version").orderBy("file").execute();
    return rows.map((row) => this.#view(row));
  }

  /**
   * Where a complete file is on disk with its size and sha256, or null when the file is
   * not complete (missing, in flight, failed, or changed on disk since).
   */
  async lookup(model: string, version: string, file: string): Promise<{ path: string; size: number; sha256: string; updatedAt: string } | null> {
    validateMirrorKey("model", model);
    validateMirrorKey("version", version);
    validateMirrorFile(file);
    const row = await this.#row(model, version, file);
    if (row === undefined || row.state !== "complete" || row.actual_sha256 === null) return null;
    const absolute = this.#finalPath(model, version, file);
    const size = await fileSize(absolute);
    if (size === null || size !== row.bytes_total) return null;
    return { path: absolute, size, sha256: row.actual_sha256, updatedAt: row.updated_at };
  }

  /** The absolute path of a complete file, or null. */
  async pathFor(model: string, version: string, file: string): Promise<string | null> {
    return (await this.lookup(model, version, file))?.path ?? null;
  }

  /** Bytes under root, per version (partial downloads counted apart), and the space left on its disk. */
  async diskUsage(): Promise<MirrorDiskUsage> {
    const tracked = new Set(
      (await this.#store.db.selectFrom("mirror_files").select(["model", "version"]).distinct().execute()).map((row) => keyOf(row.model, row.version, "")),
    );
    const versions: MirrorDiskUsage["versions"] = [];
    for (const model of await listDir(this.root)) {
      if (!model.isDirectory()) continue;
      for (const version of await listDir(path.join(this.root, model.name))) {
        if (!version.isDirectory()) continue;
        const usage = await folderUsage(path.join(this.root, model.name, version.name));
        versions.push({ model: model.name, version: version.name, ...usage, tracked: tracked.has(keyOf(model.name, version.name, "")) });
      }
    }
    versions.sort((a, b) => compare(a.model, b.model) || compare(a.version, b.version));
    return {
      root: this.root,
      bytes: versions.reduce((sum, v) => sum + v.bytes, 0),
      partialBytes: versions.reduce((sum, v) => sum + v.partialBytes, 0),
      freeBytes: await this.#io.freeBytes(this.root),
      versions,
    };
  }

  /**
   * Removes a version's files and rows. Refused (409) while a fetch of that version runs
   * in this process. The rows go first, so nothing is presented while files are removed;
   * a version folder left without rows (an interrupted delete) can be deleted again.
   */
  async deleteVersion(model: string, version: string): Promise<{ model: string; version: string; files: number; bytes: number }> {
    validateMirrorKey("model", model);
    validateMirrorKey("version", version);
    if (this.#busyVersions.has(keyOf(model, version, ""))) {
      throw new ConflictError(`Version ${model}/${version} is being fetched; wait for the fetch to finish (GET /api/v1/mirror) and delete it then.`, {
        code: "mirror_version_busy",
      });
    }
    const folder = path.join(this.root, model, version);
    const usage = await folderUsage(folder);
    const deleted = await this.#store.db.deleteFrom("mirror_files").where("model", "=", model).where("version", "=", version).executeTakeFirst();
    const rows = Number(deleted.numDeletedRows);
    const exists = (await fileSize(folder, true)) !== null;
    if (rows === 0 && !exists) {
      throw new NotFoundError(`The mirror has no version ${model}/${version}. GET /api/v1/mirror lists what it holds.`, { code: "mirror_version_not_found" });
    }
    for (const key of [...this.#liveHashes.keys()]) if (key.startsWith(folder + path.sep)) this.#liveHashes.delete(key);
    await rm(folder, { recursive: true, force: true });
    // The model folder goes too once its last version is gone; another version may still be there.
    await rmdir(path.join(this.root, model)).catch(() => undefined);
    this.#logger.info({ model, version, files: rows, bytes: usage.bytes }, "mirror version deleted");
    return { model, version, files: rows, bytes: usage.bytes };
  }

  /**
   * Startup repair, before anything fetches or serves: rows a stopped process left
   * `fetching` become `pending` with `bytes_done` set to the size of their `.partial`
   * (so they list as incomplete and resume from there); `complete` rows whose file is
   * gone or has another size become `failed`; a file under its final name whose row is not
   * `complete` (a crash between the rename and the row update) is moved back to `.partial`,
   * where the next fetch verifies it before presenting it.
   *
   * Only the server that owns this mirror root may run this. On a PostgreSQL shared by
   * several servers the rows are shared but the files and the in-flight map (`#active`)
   * are not: another server's recover() would see this server's live downloads as
   * `fetching` rows with nothing active, turn them back to `pending`, and move its freshly
   * renamed files back to `.partial`. Until the fleet work adds an owner per mirror root
   * (and a lease that says it is alive), run one mirror per database.
   */
  async recover(): Promise<RecoverSummary> {
    const summary: RecoverSummary = { interrupted: 0, missing: 0, unconfirmed: 0 };
    const rows = await this.#store.db.selectFrom("mirror_files").selectAll().execute();
    for (const row of rows) {
      const key = keyOf(row.model, row.version, row.file);
      if (this.#active.has(key)) continue;
      let final: string;
      try {
        final = this.#finalPath(row.model, row.version, row.file);
      } catch {
        continue; // A row with a name that is no longer valid is never served.
      }
      const partial = final + PARTIAL_SUFFIX;
      if (row.state === "complete") {
        const size = await fileSize(final);
        if (size === null || size !== row.bytes_total) {
          summary.missing += 1;
          await this.#update(row, {
            state: "failed",
            error: `The mirrored file is ${size === null ? "missing" : `${size} bytes instead of ${row.bytes_total}`} on disk (${final}); fetch the version again.`,
          });
        }
        continue;
      }
      if ((await fileSize(final)) !== null) {
        summary.unconfirmed += 1;
        if ((await fileSize(partial)) === null) await rename(final, partial);
        else await unlink(final);
      }
      if (row.state === "fetching") {
        summary.interrupted += 1;
        const size = (await fileSize(partial)) ?? 0;
        await this.#update(row, {
          state: "pending",
          bytes_done: size,
          error: `Interrupted at ${size} of ${row.bytes_total ?? "?"} bytes when the server stopped; fetching the version again resumes from there.`,
        });
      }
    }
    if (summary.interrupted + summary.missing + summary.unconfirmed > 0) this.#logger.info(summary, "mirror recovered after restart");
    return summary;
  }

  /** Stops every fetch (their rows go back to `pending`, partials kept) and waits for them. */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#closing.abort(new ConflictError("The mirror was closed while fetching; fetch again to resume.", { code: "mirror_closed" }));
      await Promise.allSettled([...this.#running]);
      if (this.#ownsDispatcher) await this.#dispatcher.close();
    })();
    return this.#closed;
  }

  // ---------------------------------------------------------------------------------------

  async #fetchFile(context: FetchContext, spec: MirrorFetchFile): Promise<MirrorFileOutcome> {
    const key = keyOf(context.model, context.version, spec.path);
    // Two calls for the same file: the second waits, then usually finds it complete.
    for (let running = this.#fileTasks.get(key); running !== undefined; running = this.#fileTasks.get(key)) {
      await running.catch(() => undefined);
    }
    const task = this.#runFile(context, spec, key);
    this.#fileTasks.set(key, task);
    try {
      return await task;
    } finally {
      if (this.#fileTasks.get(key) === task) this.#fileTasks.delete(key);
    }
  }

  async #runFile(context: FetchContext, spec: MirrorFetchFile, key: string): Promise<MirrorFileOutcome> {
    const { model, version } = context;
    const final = this.#finalPath(model, version, spec.path);
    const row = await this.#row(model, version, spec.path);
    if (row !== undefined && (await this.#isCurrent(row, context, spec, final))) {
      return outcome(spec, { state: "complete", skipped: true, bytesTotal: row.bytes_total, sha256: row.actual_sha256 });
    }
    // A row from another revision (or another published hash) describes other bytes: its
    // partial cannot be resumed.
    const sameSource = row !== undefined && row.revision === context.revision && row.sha256 === spec.sha256;
    // A partial without a row is not ours to trust either (a delete that stopped halfway).
    if (!sameSource) await this.#discard(final + PARTIAL_SUFFIX);
    const queued = sameSource && row.state !== "complete" ? row.bytes_done : 0;
    await this.#upsert(context, spec, { state: "pending", bytes_done: queued, error: null, actual_sha256: null });
    const active: ActiveFile = { state: "pending", bytesDone: queued, bytesTotal: spec.size };
    this.#active.set(key, active);
    this.#emit(context, spec, active);
    try {
      const release = await this.#slots.acquire(context.signal);
      try {
        return await this.#download(context, spec, { final, active, reuseFinal: sameSource && row.state !== "complete" });
      } finally {
        release();
      }
    } catch (error) {
      // Stopped while queued (the row stays pending) or while downloading (already recorded).
      if (context.signal.aborted) throw context.signal.reason ?? error;
      // A failure around the download rather than in it (creating folders, re-reading a
      // partial, the store): recorded like any other, so one file cannot sink the version.
      const failure = error instanceof LlmgwError ? error : localFailure(error, { context, spec, partial: final + PARTIAL_SUFFIX, written: active.bytesDone });
      await this.#upsert(context, spec, { state: "failed", bytes_done: active.bytesDone, error: failure.message, actual_sha256: null }).catch((storeError: unknown) =>
        this.#logger.warn({ err: describeError(storeError), file: spec.path }, "could not record a mirror failure"),
      );
      this.#logger.warn({ model, version, file: spec.path, code: failure.code, err: failure.message }, "mirror fetch failed");
      return outcome(spec, { state: "failed", error: { code: failure.code, message: failure.message, retryable: failure.retryable } });
    } finally {
      this.#active.delete(key);
    }
  }

  /** True when the row is complete for this revision and published hash, and the file is on disk with its size. */
  async #isCurrent(row: Row, context: FetchContext, spec: MirrorFetchFile, final: string): Promise<boolean> {
    if (row.state !== "complete" || row.revision !== context.revision || row.sha256 !== spec.sha256) return false;
    if (spec.size !== null && row.bytes_total !== spec.size) return false;
    return (await fileSize(final)) === row.bytes_total;
  }

  async #download(
    context: FetchContext,
    spec: MirrorFetchFile,
    where: { final: string; active: ActiveFile; reuseFinal: boolean },
  ): Promise<MirrorFileOutcome> {
    const { final, active } = where;
    const partial = final + PARTIAL_SUFFIX;
    const log = this.#logger.child({ model: context.model, version: context.version, file: spec.path });
    const started = this.#clock();
    await mkdir(path.dirname(final), { recursive: true });
    if ((await fileSize(final)) !== null) {
      // A final-named file without a current complete row: either bytes a crash left
      // between rename and row update (same source: resume from them, verified at the end),
      // or something else (another revision, a complete file that changed on disk): start over.
      if (where.reuseFinal && (await fileSize(partial)) === null) await rename(final, partial);
      else await unlink(final);
    }
    let written = (await fileSize(partial)) ?? 0;
    if (spec.size !== null && written > spec.size) {
      await this.#discard(partial);
      written = 0;
    }
    const transfer: Transfer = {
      partial,
      written,
      hasher: await this.#resumeHasher(partial, written, spec),
      fetched: 0,
      resumedFrom: written,
      announcedSize: null,
      lastPersistAt: this.#clock(),
      lastPersistBytes: written,
      persisting: Promise.resolve(),
      syncing: null,
      lastEventAt: 0,
    };
    active.state = "fetching";
    active.bytesDone = written;
    await this.#upsert(context, spec, { state: "fetching", bytes_done: written, error: null, actual_sha256: null });
    this.#emit(context, spec, active);
    log.info({ resumeFrom: written, size: spec.size }, written > 0 ? "mirror fetch resuming" : "mirror fetch starting");

    try {
      await this.#transferWithRetries(context, spec, transfer, active);
      await transfer.persisting;
      await transfer.syncing;
      if (isLocalUrl(spec.url)) {
        // The copy came from the file as listed only if it is still that file now.
        const problem = localSourceChange(spec, await statLocalSource(spec));
        if (problem !== null) {
          await this.#discard(partial);
          throw localSourceChangedError(spec, problem, "while it was being copied");
        }
      }
      const total = transfer.written;
      const expected = spec.size ?? transfer.announcedSize;
      if (expected !== null && total !== expected) {
        await this.#discard(partial);
        throw new UpstreamError(
          `'${spec.path}' of ${context.model}/${context.version} is ${total} bytes, but ${spec.size !== null ? "the registry published" : "the source announced"} ${expected}. ` +
            `The partial download was removed; fetch again, and check the registry if it happens again.`,
          { code: "mirror_size_mismatch", retryable: true },
        );
      }
      await fsyncPath(partial, "r+");
      const digest = transfer.hasher.digest();
      const mismatch = checksumProblem(spec, digest);
      if (mismatch !== null) {
        // Bytes that do not match cannot be resumed from: remove them so a retry starts clean.
        await this.#discard(partial);
        const message =
          `Checksum mismatch for '${spec.path}' of ${context.model}/${context.version}: ${mismatch}. ` +
          `The downloaded bytes were removed and the file marked failed; fetch again to retry, and if it fails again the source's copy is bad.`;
        await this.#upsert(context, spec, { state: "failed", bytes_done: 0, error: message, actual_sha256: digest.sha256, bytes_total: total });
        log.warn({ expected: spec.sha256, actual: digest.sha256 }, "mirror checksum mismatch");
        return outcome(spec, {
          state: "failed",
          resumedFrom: transfer.resumedFrom,
          bytesFetched: transfer.fetched,
          bytesTotal: total,
          sha256: digest.sha256,
          error: { code: "mirror_checksum_mismatch", message, retryable: true },
        });
      }
      await rename(partial, final);
      await fsyncPath(path.dirname(final), "r");
      await this.#upsert(context, spec, { state: "complete", bytes_done: total, bytes_total: total, error: null, actual_sha256: digest.sha256 });
      active.bytesDone = total;
      this.#emit(context, spec, { state: "complete", bytesDone: total, bytesTotal: total });
      log.info({ bytes: total, fetched: transfer.fetched, ms: this.#clock() - started }, "mirror file complete");
      return outcome(spec, { state: "complete", resumedFrom: transfer.resumedFrom, bytesFetched: transfer.fetched, bytesTotal: total, sha256: digest.sha256 });
    } catch (error) {
      await transfer.persisting;
      await transfer.syncing;
      // Keep the hash of what is on disk when it is exact, so a retry in this process resumes without re-reading.
      if (transfer.hasher.bytes === transfer.written && (await fileSize(partial)) === transfer.written) this.#liveHashes.set(partial, transfer.hasher);
      else this.#liveHashes.delete(partial);
      if (context.signal.aborted) {
        await this.#upsert(context, spec, {
          state: "pending",
          bytes_done: transfer.written,
          error: `Interrupted at ${transfer.written} of ${spec.size ?? "?"} bytes (${describeError(context.signal.reason)}); fetching the version again resumes from there.`,
          actual_sha256: null,
        }).catch((storeError: unknown) => log.warn({ err: describeError(storeError) }, "could not record an interrupted mirror fetch"));
        throw context.signal.reason ?? error;
      }
      const failure = error instanceof LlmgwError ? error : localFailure(error, { context, spec, partial, written: transfer.written });
      await this.#upsert(context, spec, { state: "failed", bytes_done: (await fileSize(partial)) ?? 0, error: failure.message, actual_sha256: null });
      this.#emit(context, spec, { state: "failed", bytesDone: active.bytesDone, bytesTotal: active.bytesTotal });
      log.warn({ code: failure.code, err: failure.message }, "mirror fetch failed");
      return outcome(spec, {
        state: "failed",
        resumedFrom: transfer.resumedFrom,
        bytesFetched: transfer.fetched,
        bytesTotal: spec.size,
        sha256: null,
        error: { code: failure.code, message: failure.message, retryable: failure.retryable },
      });
    }
  }

  /**
   * The hash state for a partial of `bytes` bytes: the one kept from an earlier call in
   * this process when it covers exactly those bytes, else computed by reading the prefix
   * once. That single read on resume after a restart is the only time the mirror reads
   * back what it wrote: a sha256 state cannot be saved across processes.
   */
  async #resumeHasher(partial: string, bytes: number, spec: MirrorFetchFile): Promise<ContentHasher> {
    const kept = this.#liveHashes.get(partial);
    this.#liveHashes.delete(partial);
    if (kept !== undefined && kept.bytes === bytes && kept.blobHeaderSize === blobHeaderSize(spec)) return kept;
    const hasher = new ContentHasher(blobHeaderSize(spec));
    if (bytes === 0) return hasher;
    const stream = createReadStream(partial, { start: 0, end: bytes - 1, highWaterMark: READ_HIGH_WATER_MARK });
    for await (const chunk of stream) hasher.update(chunk as Buffer);
    return hasher;
  }

  async #transferWithRetries(context: FetchContext, spec: MirrorFetchFile, transfer: Transfer, active: ActiveFile): Promise<void> {
    for (let failures = 0; ; ) {
      const before = transfer.written;
      try {
        await this.#transferOnce(context, spec, transfer, active);
        return;
      } catch (error) {
        if (context.signal.aborted) throw context.signal.reason ?? error;
        const classified = this.#asLlmgwError(error, context, spec);
        // Attempts that moved the download forward do not use up the retry budget: a long
        // download over a flaky link keeps resuming as long as it makes progress.
        failures = transfer.written > before ? 1 : failures + 1;
        if (!(classified instanceof MirrorTransientError) || failures > this.#retries) throw classified;
        const delay = Math.min(this.#maxRetryDelayMs, this.#retryDelayMs * 2 ** (failures - 1));
        this.#logger.info(
          { model: context.model, version: context.version, file: spec.path, at: transfer.written, attempt: failures, delayMs: delay, err: classified.message },
          "mirror fetch interrupted; resuming",
        );
        if (classified.restartFromZero) {
          await this.#discard(transfer.partial);
          transfer.written = 0;
          transfer.hasher = new ContentHasher(blobHeaderSize(spec));
          active.bytesDone = 0;
        } else if (transfer.hasher.bytes !== transfer.written) {
          // The writer failed after the bytes were hashed; rebuild the hash from what is on disk.
          await truncate(transfer.partial, transfer.written);
          transfer.hasher = await this.#resumeHasher(transfer.partial, transfer.written, spec);
        }
        await sleep(delay, undefined, { signal: context.signal });
      }
    }
  }

  /** One request (following redirects) streamed onto the end of the partial file. */
  async #transferOnce(context: FetchContext, spec: MirrorFetchFile, transfer: Transfer, active: ActiveFile): Promise<void> {
    const expected = spec.size;
    if (expected !== null && transfer.written === expected) return; // Everything is on disk; only verification is left.
    const offset = transfer.written;
    if (expected !== null) {
      // Checked before the request: nothing may be awaited between a response's headers
      // and reading its body, or a body that fails early would be lost unobserved.
      const free = await this.#io.freeBytes(path.dirname(transfer.partial));
      if (free !== null && free < expected - offset) {
        throw diskFullError({ context, spec, partial: transfer.partial, written: offset, total: expected, free, cause: undefined });
      }
    }
    const source = await this.#openSource(spec, offset, context.signal);
    let append = offset > 0;
    if (source.start === 0 && offset > 0) {
      // The source ignored the Range (200): start over from its first byte.
      this.#logger.info({ file: spec.path, offset }, "mirror source ignored the range; starting the file over");
      append = false;
      transfer.written = 0;
      transfer.hasher = new ContentHasher(blobHeaderSize(spec));
      active.bytesDone = 0;
    } else if (source.start !== offset) {
      source.body?.destroy();
      // A range we did not ask for: drop the partial and ask again without a range.
      throw new MirrorTransientError(`The source of '${spec.path}' answered bytes from ${source.start} when asked for ${offset}; starting the file over.`, {
        code: "mirror_bad_range",
        restartFromZero: true,
      });
    }
    if (source.total !== null) {
      if (expected !== null && source.total !== expected) {
        source.body?.destroy();
        throw new UpstreamError(
          `The source of '${spec.path}' of ${context.model}/${context.version} announces ${source.total} bytes, but the registry published ${expected}. ` +
            `The repository may have changed under the same revision; check it, then fetch again.`,
          { code: "mirror_size_mismatch" },
        );
      }
      transfer.announcedSize = source.total;
    }
    const body = source.body;
    if (body === null) return;
    const sink = this.#io.createWriteStream(transfer.partial, { flags: append ? "a" : "w", highWaterMark: WRITE_HIGH_WATER_MARK });
    const limit = expected ?? source.total;
    await pump({
      body,
      sink,
      signal: context.signal,
      limit: limit === null ? null : limit - transfer.written,
      onChunk: (chunk) => transfer.hasher.update(chunk),
      onWritten: (bytes) => {
        transfer.written += bytes;
        transfer.fetched += bytes;
        active.bytesDone = transfer.written;
        this.#progressed(context, spec, transfer, active);
      },
    }).catch(async (error: unknown) => {
      if (error instanceof WriteError) {
        // The failing write may have put part of its chunk on disk: report what is there.
        const onDisk = (await fileSize(transfer.partial)) ?? transfer.written;
        throw localFailure(error.cause, { context, spec, partial: transfer.partial, written: onDisk, total: expected ?? source.total });
      }
      throw error instanceof LlmgwError || context.signal.aborted ? error : new SourceError(error, source.url);
    });
  }

  /** Opens the bytes of a file from `offset`: an HTTP request following redirects, or a local file. */
  async #openSource(spec: MirrorFetchFile, offset: number, signal: AbortSignal): Promise<Source> {
    if (isLocalUrl(spec.url)) return openLocalSource(spec, offset, signal);
    const followed = await followRedirects({
      url: spec.url,
      headers: {
        ...(spec.headers ?? {}),
        // Compressed bodies would hash differently from the published sha256.
        "accept-encoding": "identity",
        ...(offset > 0 ? { range: `bytes=${offset}-` } : {}),
      },
      maxRedirects: MAX_REDIRECTS,
      // The registry's token must not reach another host (the CDN gets a signed URL).
      headersForRedirect: this.#headersForRedirect,
      send: async (url, headers) => {
        try {
          return await request(url, {
            dispatcher: this.#dispatcher,
            method: "GET",
            headers,
            headersTimeout: this.#headersTimeoutMs,
            bodyTimeout: this.#bodyTimeoutMs,
            highWaterMark: 1024 * 1024,
            signal,
          });
        } catch (error) {
          throw new SourceError(error, url);
        }
      },
    });
    const { response, url: current } = followed;
    if (followed.redirect !== null) {
      await response.body.dump().catch(() => undefined);
      if (followed.redirect.protocol !== "http:" && followed.redirect.protocol !== "https:") {
        throw new UpstreamError(`The source of '${spec.path}' redirected to a ${followed.redirect.protocol} URL; only http and https are followed.`, { code: "mirror_bad_redirect" });
      }
      throw new UpstreamError(`The source of '${spec.path}' redirected more than ${MAX_REDIRECTS} times (last: ${origin(current)}).`, { code: "mirror_too_many_redirects" });
    }
    const status = response.statusCode;
    if (status === 200) {
      return { start: 0, total: contentLength(response.headers), body: response.body, url: current };
    }
    if (status === 206) {
      const range = parseContentRange(header(response.headers, "content-range"));
      if (range === null) {
        response.body.destroy();
        throw new MirrorTransientError(`The source of '${spec.path}' at ${origin(current)} answered 206 without a usable Content-Range.`, {
          code: "mirror_bad_range",
          restartFromZero: true,
        });
      }
      return { start: range.start, total: range.total, body: response.body, url: current };
    }
    if (status === 416) {
      await response.body.dump().catch(() => undefined);
      const total = parseUnsatisfiedRange(header(response.headers, "content-range"));
      // Asked from exactly the end: the partial already holds the whole file.
      if (total !== null && total === offset) return { start: offset, total, body: null, url: current };
      throw new MirrorTransientError(
        `The source of '${spec.path}' refused the range from byte ${offset}${total === null ? "" : ` (it has ${total} bytes)`}; starting the file over.`,
        { code: "mirror_bad_range", restartFromZero: true },
      );
    }
    const said = await errorText(response.body);
    throw sourceStatusError(status, spec, current, said);
  }

  #progressed(context: FetchContext, spec: MirrorFetchFile, transfer: Transfer, active: ActiveFile): void {
    const now = this.#clock();
    if (now - transfer.lastPersistAt >= this.#persistIntervalMs || transfer.written - transfer.lastPersistBytes >= this.#persistBytes) {
      transfer.lastPersistAt = now;
      transfer.lastPersistBytes = transfer.written;
      const bytes = transfer.written;
      // Start writing the file's dirty pages to disk now, in the background, so the fsync
      // before the rename has only the last few MiB left to flush (on the benchmark's disk
      // a cold fsync of 1 GiB takes ~0.75 s, a fifth of the whole download).
      if (transfer.syncing === null) {
        transfer.syncing = fsyncPath(transfer.partial, "r+", true).then(
          () => {
            transfer.syncing = null;
          },
          () => {
            transfer.syncing = null;
          },
        );
      }
      // One update at a time per file; only while the row is still fetching, so a late
      // progress write can never undo the final state.
      transfer.persisting = transfer.persisting.then(() =>
        this.#store.db
          .updateTable("mirror_files")
          .set({ bytes_done: bytes, updated_at: nowIso(this.#clock) })
          .where("model", "=", context.model)
          .where("version", "=", context.version)
          .where("file", "=", spec.path)
          .where("state", "=", "fetching")
          .execute()
          .then(
            () => undefined,
            (error: unknown) => this.#logger.warn({ err: describeError(error), file: spec.path }, "could not record mirror progress"),
          ),
      );
    }
    if (context.onProgress !== undefined && now - transfer.lastEventAt >= this.#progressIntervalMs) {
      transfer.lastEventAt = now;
      this.#emit(context, spec, active);
    }
  }

  #emit(context: FetchContext, spec: MirrorFetchFile, active: { state: MirrorFileState; bytesDone: number; bytesTotal: number | null }): void {
    if (context.onProgress === undefined) return;
    try {
      context.onProgress({ model: context.model, version: context.version, file: spec.path, state: active.state, bytesDone: active.bytesDone, bytesTotal: active.bytesTotal });
    } catch (error) {
      this.#logger.warn({ err: describeError(error) }, "a mirror progress listener threw");
    }
  }

  #asLlmgwError(error: unknown, context: FetchContext, spec: MirrorFetchFile): LlmgwError {
    if (error instanceof LlmgwError) return error;
    const url = error instanceof SourceError ? error.url : spec.url;
    const cause = error instanceof SourceError ? error.cause : error;
    const code = errorCode(cause);
    const what = `downloading '${spec.path}' of ${context.model}/${context.version} from ${origin(url)}`;
    const timeouts: Record<string, string> = {
      UND_ERR_CONNECT_TIMEOUT: "timed out connecting",
      UND_ERR_HEADERS_TIMEOUT: `got no response headers within ${this.#headersTimeoutMs} ms`,
      UND_ERR_BODY_TIMEOUT: `sent nothing for ${this.#bodyTimeoutMs} ms mid-body`,
    };
    const timeout = code === undefined ? undefined : timeouts[code];
    if (timeout !== undefined) {
      return new MirrorTransientError(`The source ${timeout} while ${what}. It is retryable: fetching again resumes from the bytes already on disk.`, {
        code: "mirror_source_timeout",
        status: 504,
        cause,
      });
    }
    return new MirrorTransientError(
      `The source could not be reached or dropped the connection (${code ?? describeError(cause)}) while ${what}. It is retryable: fetching again resumes from the bytes already on disk.`,
      { code: "mirror_source_unreachable", status: 502, cause },
    );
  }

  #finalPath(model: string, version: string, file: string): string {
    const absolute = path.join(this.root, model, version, ...file.split("/"));
    // The names were validated segment by segment; this is the second line of defence.
    if (!absolute.startsWith(this.root + path.sep)) throw new BadRequestError(`Invalid mirror path '${model}/${version}/${file}'.`, { code: "invalid_path" });
    return absolute;
  }

  async #discard(partial: string): Promise<void> {
    this.#liveHashes.delete(partial);
    await rm(partial, { force: true });
  }

  async #row(model: string, version: string, file: string): Promise<Row | undefined> {
    return this.#store.db
      .selectFrom("mirror_files")
      .selectAll()
      .where("model", "=", model)
      .where("version", "=", version)
      .where("file", "=", file)
      .executeTakeFirst();
  }

  async #upsert(
    context: FetchContext,
    spec: MirrorFetchFile,
    fields: { state: MirrorFileState; bytes_done: number; error: string | null; actual_sha256: string | null; bytes_total?: number | null },
  ): Promise<void> {
    const now = nowIso(this.#clock);
    const values = {
      repo: context.repo,
      revision: context.revision,
      state: fields.state,
      sha256: spec.sha256,
      actual_sha256: fields.actual_sha256,
      bytes_done: fields.bytes_done,
      bytes_total: fields.bytes_total !== undefined ? fields.bytes_total : spec.size,
      error: fields.error,
      source_url: spec.url,
      updated_at: now,
    };
    await this.#store.db
      .insertInto("mirror_files")
      .values({ model: context.model, version: context.version, file: spec.path, created_at: now, ...values })
      .onConflict((conflict) => conflict.columns(["model", "version", "file"]).doUpdateSet(values))
      .execute();
  }

  async #update(row: Row, fields: Partial<Pick<Row, "state" | "bytes_done" | "error">>): Promise<void> {
    await this.#store.db
      .updateTable("mirror_files")
      .set({ ...fields, updated_at: nowIso(this.#clock) })
      .where("model", "=", row.model)
      .where("version", "=", row.version)
      .where("file", "=", row.file)
      .execute();
  }

  #view(row: Row): MirrorFileView {
    const key = keyOf(row.model, row.version, row.file);
    const active = this.#active.get(key);
    // Claimed by a running call but not started yet: queued, whatever an earlier run left.
    const claimed = active === undefined && this.#claimed.has(key);
    const state = (active?.state ?? (claimed && row.state !== "complete" ? "pending" : row.state)) as MirrorFileState;
    const bytesDone = active !== undefined ? active.bytesDone : row.bytes_done;
    const bytesTotal = row.bytes_total;
    return {
      model: row.model,
      version: row.version,
      file: row.file,
      repo: row.repo,
      revision: row.revision,
      state,
      sha256: row.sha256,
      actualSha256: row.actual_sha256,
      bytesDone,
      bytesTotal,
      percent: bytesTotal === null ? null : bytesTotal === 0 ? (state === "complete" ? 100 : 0) : Math.floor((bytesDone / bytesTotal) * 1000) / 10,
      error: row.error,
      sourceUrl: row.source_url,
      active: active !== undefined || claimed,
      createdAt: row.created_at,
      updatedAt: row.updated_at,
    };
  }
}

/** A failure that a later attempt may get past (timeouts, drops, 408/429/5xx): retried with backoff, resuming. */
export class MirrorTransientError extends UpstreamError {
  /** The bytes on disk cannot be continued (the source disagreed about the range): the next attempt starts at byte 0. */
  readonly restartFromZero: boolean;

  constructor(message: string, detail: { code: string; status?: number; cause?: unknown; restartFromZero?: boolean }) {
    const { restartFromZero, ...rest } = detail;
    super(message, { ...rest, retryable: true });
    this.restartFromZero = restartFromZero ?? false;
  }
}

/** A failure of the writer (the disk), as opposed to the source; carries the fs error as its cause. */
class WriteError extends Error {
  constructor(override readonly cause: unknown) {
    super(describeError(cause));
  }
}

/** A transport failure before classification, remembering which URL (after redirects) failed. */
class SourceError extends Error {
  constructor(
    override readonly cause: unknown,
    readonly url: string,
  ) {
    super(describeError(cause));
  }
}

interface Source {
  /** The first byte the body holds. */
  start: number;
  /** The whole file's size as the source announced it, when it did. */
  total: number | null;
  /** Null when there is nothing left to read (the partial already holds the whole file). */
  body: Readable | null;
  /** Where the bytes come from after redirects, for messages. */
  url: string;
}

function isLocalUrl(url: string): boolean {
  return url.startsWith("file:");
}

/** Size and mtime of a local source file now; a failure to look is an llmgw error naming the file. */
async function statLocalSource(spec: MirrorFetchFile, handle?: FileHandle): Promise<{ size: number; mtimeMs: number }> {
  const file = fileURLToPath(spec.url);
  try {
    const info = handle === undefined ? await stat(file) : await handle.stat();
    return { size: info.size, mtimeMs: info.mtimeMs };
  } catch (error) {
    throw localReadError(error, file);
  }
}

/** How a local source differs from what it was listed as, or null when it does not. */
function localSourceChange(spec: MirrorFetchFile, now: { size: number; mtimeMs: number }): string | null {
  if (spec.size !== null && now.size !== spec.size) return `it is ${now.size} bytes, it was listed with ${spec.size}`;
  if (spec.sourceMtimeMs !== undefined && spec.sourceMtimeMs !== null && now.mtimeMs !== spec.sourceMtimeMs) {
    return `it was modified at ${new Date(now.mtimeMs).toISOString()}, after it was listed (${new Date(spec.sourceMtimeMs).toISOString()})`;
  }
  return null;
}

function localSourceChangedError(spec: MirrorFetchFile, problem: string, when: string): ConflictError {
  return new ConflictError(
    `The local source file '${fileURLToPath(spec.url)}' of '${spec.path}' changed ${when} (${problem}). ` +
      `A local version is named after its files' sizes and modification times, so fetch again: the files are listed anew and copied as a new version.`,
    { code: "mirror_local_source_changed" },
  );
}

async function openLocalSource(spec: MirrorFetchFile, offset: number, signal: AbortSignal): Promise<Source> {
  const file = fileURLToPath(spec.url);
  // Opened before anything else, so a file this process may not read is a clear failure
  // naming it, not a stream error classified as a flaky source and retried.
  let handle: FileHandle;
  try {
    handle = await open(file, "r");
  } catch (error) {
    throw localReadError(error, file);
  }
  try {
    const now = await statLocalSource(spec, handle);
    const problem = localSourceChange(spec, now);
    if (problem !== null) throw localSourceChangedError(spec, problem, "since it was listed");
    if (offset === now.size) {
      await handle.close();
      return { start: offset, total: now.size, body: null, url: spec.url };
    }
    if (offset > now.size) {
      throw new MirrorTransientError(`The local source '${file}' is shorter (${now.size} bytes) than the partial copy (${offset}); starting over.`, {
        code: "mirror_bad_range",
        restartFromZero: true,
      });
    }
    // The stream owns the handle from here and closes it when it ends or is destroyed.
    const body = createReadStream(file, { fd: handle, start: offset, highWaterMark: READ_HIGH_WATER_MARK, signal });
    return { start: offset, total: now.size, body, url: spec.url };
  } catch (error) {
    await handle.close().catch(() => undefined);
    throw error;
  }
}

/**
 * Streams `body` into `sink`, giving each chunk to `onChunk` (the hash) right after
 * handing it to the writer, so hashing on this thread overlaps the write in libuv's
 * thread pool. `onWritten` counts bytes the writer confirmed. When the body fails, what
 * was already received is still written out before the promise rejects, so the file and
 * the running hash hold exactly the same bytes and a retry can continue both.
 */
function pump(options: {
  body: Readable;
  sink: Writable;
  signal: AbortSignal;
  limit: number | null;
  onChunk: (chunk: Buffer) => void;
  onWritten: (bytes: number) => void;
}): Promise<void> {
  const { body, sink, signal, limit, onChunk, onWritten } = options;
  return new Promise<void>((resolve, reject) => {
    let received = 0;
    let ended = false;
    let sourceError: unknown;
    let settled = false;
    const settle = (error: unknown): void => {
      if (settled) return;
      settled = true;
      body.off("data", onData);
      body.off("end", onEnd);
      body.off("error", onSourceError);
      body.off("close", onClose);
      sink.off("drain", onDrain);
      sink.off("finish", onFinish);
      signal.removeEventListener("abort", onAbort);
      // A late error from either stream after we settled must not become an uncaught one.
      body.on("error", () => undefined);
      sink.on("error", () => undefined);
      if (error === undefined) resolve();
      else reject(error);
    };
    const onData = (chunk: Buffer): void => {
      if (limit !== null && received + chunk.length > limit) {
        onSourceError(new UpstreamError(`The source sent more bytes than the ${limit} expected.`, { code: "mirror_size_mismatch" }));
        return;
      }
      received += chunk.length;
      const length = chunk.length;
      const more = sink.write(chunk, (error) => {
        if (error === null || error === undefined) onWritten(length);
      });
      onChunk(chunk);
      if (!more) body.pause();
    };
    const onDrain = (): void => {
      if (sourceError === undefined) body.resume();
    };
    const onEnd = (): void => {
      ended = true;
      sink.end();
    };
    const onSourceError = (error: unknown): void => {
      if (sourceError !== undefined || settled) return;
      sourceError = error;
      body.off("data", onData);
      body.destroy();
      // Write out what arrived before the failure (end, not destroy, keeps queued chunks).
      sink.end();
    };
    const onClose = (): void => {
      if (!ended) onSourceError(signal.aborted ? signal.reason : new Error("the source stream closed before its end"));
    };
    const onFinish = (): void => settle(sourceError);
    const onSinkError = (error: unknown): void => {
      body.destroy();
      settle(new WriteError(error));
    };
    const onAbort = (): void => onSourceError(signal.reason);
    body.on("data", onData);
    body.on("end", onEnd);
    body.on("error", onSourceError);
    body.on("close", onClose);
    sink.on("drain", onDrain);
    sink.on("finish", onFinish);
    sink.once("error", onSinkError);
    if (signal.aborted) onAbort();
    else signal.addEventListener("abort", onAbort, { once: true });
    // A body that already failed emits nothing more.
    if (body.destroyed && !body.readableEnded) onSourceError(body.errored ?? new Error("the source stream closed before its end"));
  });
}

/** sha256 of the content, plus git's blob id when one is to be checked. */
class ContentHasher {
  bytes = 0;
  readonly blobHeaderSize: number | null;
  readonly #sha256: Hash;
  readonly #blob: Hash | null;

  constructor(blobHeaderSize: number | null) {
    this.blobHeaderSize = blobHeaderSize;
    this.#sha256 = createHash("sha256");
    // git's blob id is sha1 over `blob <size>\0` and the content.
    this.#blob = blobHeaderSize === null ? null : createHash("sha1").update(`blob ${blobHeaderSize}\0`);
  }

  update(chunk: Buffer): void {
    this.#sha256.update(chunk);
    this.#blob?.update(chunk);
    this.bytes += chunk.length;
  }

  /** The digests so far; the hasher stays usable (copies are digested). */
  digest(): { sha256: string; blobId: string | null } {
    return { sha256: this.#sha256.copy().digest("hex"), blobId: this.#blob === null ? null : this.#blob.copy().digest("hex") };
  }
}

function blobHeaderSize(spec: MirrorFetchFile): number | null {
  return spec.sha256 === null && spec.gitBlobId !== undefined && spec.gitBlobId !== null && spec.size !== null ? spec.size : null;
}

function checksumProblem(spec: MirrorFetchFile, digest: { sha256: string; blobId: string | null }): string | null {
  if (spec.sha256 !== null && digest.sha256 !== spec.sha256) {
    return `the registry published sha256 ${spec.sha256}, the downloaded bytes have sha256 ${digest.sha256}`;
  }
  if (spec.sha256 === null && digest.blobId !== null && spec.gitBlobId !== undefined && spec.gitBlobId !== null && digest.blobId !== spec.gitBlobId) {
    return `the registry published git blob id ${spec.gitBlobId}, the downloaded bytes have ${digest.blobId} (sha256 ${digest.sha256})`;
  }
  return null;
}

/** A counting semaphore whose waiters can give up through an AbortSignal. */
class Semaphore {
  #free: number;
  readonly #waiters: (() => void)[] = [];

  constructor(size: number) {
    this.#free = size;
  }

  async acquire(signal: AbortSignal): Promise<() => void> {
    signal.throwIfAborted();
    if (this.#free > 0) {
      this.#free -= 1;
    } else {
      await new Promise<void>((resolve, reject) => {
        const onAbort = (): void => {
          const index = this.#waiters.indexOf(wake);
          if (index >= 0) this.#waiters.splice(index, 1);
          reject(signal.reason);
        };
        const wake = (): void => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        };
        this.#waiters.push(wake);
        signal.addEventListener("abort", onAbort, { once: true });
      });
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.#waiters.shift();
      if (next !== undefined) next();
      else this.#free += 1;
    };
  }
}

function diskFullError(options: {
  context: FetchContext;
  spec: MirrorFetchFile;
  partial: string;
  written: number;
  total: number | null;
  free: number | null;
  cause: unknown;
}): LlmgwError {
  const { context, spec, partial, written, total, free } = options;
  const needed = total === null ? "an unknown number of" : String(Math.max(0, total - written));
  const freeText = free === null ? "" : ` (${free} bytes free there)`;
  return new LlmgwError({
    message:
      `The disk holding the mirror is full: '${spec.path}' of ${context.model}/${context.version} needs ${needed} more bytes ` +
      `(${written} of ${total ?? "?"} written) in ${path.dirname(partial)}${freeText}. ` +
      `Free space on that disk (DELETE /api/v1/mirror/{model}/{version} removes mirrored versions), then fetch again: ` +
      `the ${written} bytes already written are kept in ${partial} and the download resumes from there.`,
    code: "mirror_disk_full",
    status: 507,
    type: "server_error",
    cause: options.cause,
  });
}

/** A failure on this side (the disk, the file system) as an llmgw error: a full disk says so. */
function localFailure(
  error: unknown,
  where: { context: FetchContext; spec: MirrorFetchFile; partial: string; written: number; total?: number | null },
): LlmgwError {
  const code = errorCode(error);
  if (code === "ENOSPC" || code === "EDQUOT") {
    return diskFullError({ ...where, total: where.total ?? where.spec.size, free: null, cause: error });
  }
  if (typeof error !== "object" || error === null || !("syscall" in error)) {
    return new LlmgwError({
      message: `Mirroring '${where.spec.path}' of ${where.context.model}/${where.context.version} failed: ${describeError(error)}. The server log has details; fetch again.`,
      code: "mirror_failed",
      status: 500,
      type: "server_error",
      cause: error,
    });
  }
  return new LlmgwError({
    message:
      `Writing '${where.spec.path}' of ${where.context.model}/${where.context.version} to ${where.partial} failed (${code ?? "error"}): ${describeError(error)}. ` +
      `Check the mirror folder's disk and permissions, then fetch again.`,
    code: "mirror_write_failed",
    status: 500,
    type: "server_error",
    cause: error,
  });
}

function sourceStatusError(status: number, spec: MirrorFetchFile, url: string, said: string | undefined): LlmgwError {
  const where = `${origin(url)}`;
  const detail = said === undefined ? "" : ` It said: ${said}`;
  if (status === 401 || status === 403) {
    return new UpstreamError(
      `The source at ${where} refused '${spec.path}' (${status}): the repository may be gated or private and the registry token (HF_TOKEN) lacks access.${detail}`,
      { code: "mirror_source_forbidden" },
    );
  }
  if (status === 404) {
    return new UpstreamError(`The source at ${where} has no '${spec.path}' (404); the repository may have changed. Read it again and fetch the new file list.${detail}`, {
      code: "mirror_source_not_found",
    });
  }
  if (status === 408 || status === 429 || status >= 500) {
    return new MirrorTransientError(`The source at ${where} answered ${status} for '${spec.path}'.${detail} It is retryable: fetching again resumes from the bytes already on disk.`, {
      code: "mirror_source_error",
      status: 502,
    });
  }
  return new UpstreamError(`The source at ${where} answered ${status} for '${spec.path}'.${detail}`, { code: "mirror_source_error" });
}

function validateFetchFiles(files: unknown): MirrorFetchFile[] {
  if (!Array.isArray(files) || files.length === 0) throw new BadRequestError("fetchVersion needs at least one file.", { code: "invalid_field", param: "files" });
  const seen = new Set<string>();
  return files.map((file: MirrorFetchFile, index) => {
    const where = `files.${index}`;
    validateMirrorFile(file.path, `${where}.path`);
    if (seen.has(file.path)) throw new BadRequestError(`The file '${file.path}' is listed twice.`, { code: "invalid_field", param: `${where}.path` });
    seen.add(file.path);
    let url: URL;
    try {
      url = new URL(file.url);
    } catch {
      throw new BadRequestError(`The URL of '${file.path}' is not a URL.`, { code: "invalid_field", param: `${where}.url` });
    }
    if (!["http:", "https:", "file:"].includes(url.protocol)) {
      throw new BadRequestError(`The URL of '${file.path}' must be http(s) or file:, not ${url.protocol}.`, { code: "invalid_field", param: `${where}.url` });
    }
    if (file.sha256 !== null && !SHA256_HEX.test(file.sha256)) {
      throw new BadRequestError(`The sha256 of '${file.path}' must be 64 lowercase hex characters or null.`, { code: "invalid_field", param: `${where}.sha256` });
    }
    if (file.size !== null && !(Number.isSafeInteger(file.size) && file.size >= 0)) {
      throw new BadRequestError(`The size of '${file.path}' must be a non-negative integer or null.`, { code: "invalid_field", param: `${where}.size` });
    }
    if (file.gitBlobId !== undefined && file.gitBlobId !== null && !BLOB_ID_HEX.test(file.gitBlobId)) {
      throw new BadRequestError(`The git blob id of '${file.path}' must be 40 lowercase hex characters.`, { code: "invalid_field", param: `${where}.gitBlobId` });
    }
    if (file.sourceMtimeMs !== undefined && file.sourceMtimeMs !== null && !(Number.isFinite(file.sourceMtimeMs) && url.protocol === "file:")) {
      throw new BadRequestError(`The source mtime of '${file.path}' must be a number, and is only for file: URLs.`, { code: "invalid_field", param: `${where}.sourceMtimeMs` });
    }
    return file;
  });
}

function outcome(
  spec: MirrorFetchFile,
  fields: Partial<MirrorFileOutcome> & Pick<MirrorFileOutcome, "state">,
): MirrorFileOutcome {
  return {
    file: spec.path,
    skipped: false,
    resumedFrom: 0,
    bytesFetched: 0,
    bytesTotal: spec.size,
    sha256: null,
    error: null,
    ...fields,
  };
}

function summarize(context: FetchContext, files: MirrorFileOutcome[]): FetchVersionSummary {
  return {
    model: context.model,
    version: context.version,
    repo: context.repo,
    revision: context.revision,
    complete: files.every((file) => file.state === "complete"),
    files,
    fetched: files.filter((file) => file.state === "complete" && !file.skipped).length,
    skipped: files.filter((file) => file.skipped).length,
    failed: files.filter((file) => file.state === "failed").length,
    bytesFetched: files.reduce((sum, file) => sum + file.bytesFetched, 0),
  };
}

function keyOf(model: string, version: string, file: string): string {
  return `${model}\u0000${version}\u0000${file}`;
}

/** Size of a regular file (or, with `anyKind`, of anything) at `file`, or null when there is none. */
async function fileSize(file: string, anyKind = false): Promise<number | null> {
  try {
    const info = await stat(file);
    return info.isFile() || anyKind ? info.size : null;
  } catch {
    return null;
  }
}

async function fsyncPath(file: string, flags: "r" | "r+", dataOnly = false): Promise<void> {
  const handle = await open(file, flags);
  try {
    await (dataOnly ? handle.datasync() : handle.sync());
  } finally {
    await handle.close();
  }
}

async function listDir(dir: string): Promise<import("node:fs").Dirent[]> {
  try {
    return await readdir(dir, { withFileTypes: true });
  } catch {
    return [];
  }
}

async function folderUsage(dir: string): Promise<{ bytes: number; partialBytes: number; files: number }> {
  const usage = { bytes: 0, partialBytes: 0, files: 0 };
  const pending = [dir];
  while (pending.length > 0) {
    const current = pending.pop() as string;
    for (const entry of await listDir(current)) {
      const absolute = path.join(current, entry.name);
      if (entry.isDirectory()) {
        pending.push(absolute);
        continue;
      }
      if (!entry.isFile()) continue;
      const size = (await fileSize(absolute)) ?? 0;
      usage.bytes += size;
      if (entry.name.endsWith(PARTIAL_SUFFIX)) usage.partialBytes += size;
      else usage.files += 1;
    }
  }
  return usage;
}

function header(headers: Record<string, string | string[] | undefined>, name: string): string | undefined {
  const value = headers[name];
  return Array.isArray(value) ? value.join(", ") : value;
}

function contentLength(headers: Record<string, string | string[] | undefined>): number | null {
  const value = header(headers, "content-length");
  return value !== undefined && /^\d+$/.test(value) ? Number(value) : null;
}

/** `bytes a-b/total` (total may be `*`). */
function parseContentRange(value: string | undefined): { start: number; total: number | null } | null {
  const match = /^bytes\s+(\d+)-(\d+)\/(\d+|\*)$/i.exec(value?.trim() ?? "");
  if (match === null) return null;
  return { start: Number(match[1]), total: match[3] === "*" ? null : Number(match[3]) };
}

/** The size in a 416's `bytes * /total`. */
function parseUnsatisfiedRange(value: string | undefined): number | null {
  const match = /^bytes\s+\*\/(\d+)$/i.exec(value?.trim() ?? "");
  return match === null ? null : Number(match[1]);
}

/** The first few hundred characters of an error answer. */
async function errorText(body: Readable): Promise<string | undefined> {
  try {
    const chunks: Buffer[] = [];
    let total = 0;
    for await (const chunk of body) {
      chunks.push(chunk as Buffer);
      total += (chunk as Buffer).length;
      if (total >= 4096) {
        body.destroy();
        break;
      }
    }
    const text = Buffer.concat(chunks).toString("utf8").trim().slice(0, 300);
    return text === "" ? undefined : text.replace(/[\u0000-\u001f\u007f]/g, " ");
  } catch {
    return undefined;
  }
}

/** Scheme, host and port only: a signed CDN URL's query is a credential and stays out of messages. */
function origin(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return "the source";
  }
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
