// The mirror module: llmgw's content store of model weights. It owns
// DATA_DIR/mirror/{model}/{version}/{file} on disk and the `mirror_files` rows that say
// what each file is and how far it got. Weights are fetched once from a registry (or
// copied from a local source), checked against the sha256 the registry published, and then
// served to nodes from here, so a fleet downloads from the Hub once per version instead
// of once per node.
//
// `Mirror` is the one interface consumers use (the admin routes, the file server, the
// local agent, the server's start and stop). It keeps what is in flight in this process
// and hands the work to the parts, each in its own file:
//   mirror-rows.ts       the rows (store access) and the audit entries of mirror actions
//   file-download.ts     one file's download with resume and retries, verified and renamed
//   http-source.ts       the bytes over HTTP (ranges, redirects, status errors)
//   local-file-source.ts the bytes of a local source (`file:` URLs)
//   pump.ts              source → partial file with backpressure, hashing as it goes
//   semaphore.ts         the limit on downloads at once
//   content-hash.ts      sha256 / git blob id, and hashing a file on disk
//   verification.ts      the stat check of complete files and the re-hash (verify)
//   recovery.ts          startup repair after a stop or a crash
//   disk-usage.ts        bytes per version and free space
//   disk-files.ts        stats, sizes, fsync, free space (the small file-system calls)
//   file-view.ts         how a row is shown in listings
//   fetch-input.ts       the checks of a fetch's input, outcomes and summaries
//   mirror-errors.ts     how fetch failures are named and classified
//
// Several servers may share one PostgreSQL (a cluster, given by the `cluster` option):
// the rows are shared, each server has its own folder, and `mirror_holders` says which
// server holds which file's verified bytes. Those parts:
//   mirror-holders.ts    the holder rows, and the stat check of a copy against its holder row
//   copy-verdict.ts      whether this server can serve a file, or which servers hold it instead
//   mirror-cluster.ts    this server's name, the live servers, the grants it signs and checks
//   grants.ts            the signed, expiring grants of the file server's redirects
//   replicate.ts         copying files from a holder (ctl mirror replicate)
//   origin-copies.ts     copying a file no running server holds from its origin, for nodes
// Without the option nothing of that is written and the mirror is the single server's.
import path from "node:path";
import { rm, rmdir } from "node:fs/promises";
import type { Dispatcher } from "undici";
import { BadRequestError, ConflictError, LlmgwError, NotFoundError, describeError } from "../core/errors.ts";
import { silentLogger, type Logger } from "../core/log.ts";
import { headersForRedirect as registryHeadersForRedirect } from "../registry/redirects.ts";
import { elsewhereError, judgeCopy, stillFetchingError } from "./copy-verdict.ts";
import { defaultIo, diskStamp, fileSize } from "./disk-files.ts";
import { folderUsage, measureDiskUsage } from "./disk-usage.ts";
import { createDownloader, type FileDownloader } from "./file-download.ts";
import { emitProgress, outcome, summarize, validateFetchFiles, type ActiveFile, type FetchContext } from "./fetch-input.ts";
import { localFailure } from "./mirror-errors.ts";
import { MirrorCluster } from "./mirror-cluster.ts";
import { PARTIAL_SUFFIX, fileKey, validateMirrorFile, validateMirrorKey } from "./mirror-paths.ts";
import { MirrorRows, type MirrorAuditEntry, type MirrorRow } from "./mirror-rows.ts";
import type {
  FetchVersionOptions,
  FetchVersionSummary,
  MirrorDiskUsage,
  MirrorFetchFile,
  MirrorFileCheck,
  MirrorFileFound,
  MirrorFileOutcome,
  MirrorFileView,
  MirrorIo,
  MirrorOptions,
  RecoverSummary,
  ReplicateOptions,
  ReplicateSummary,
  VerifyOptions,
  VerifySummary,
} from "./mirror-types.ts";
import { recoverRows } from "./recovery.ts";
import { OriginCopies, type OriginCopyState } from "./origin-copies.ts";
import { clusterDownloaders, replicateVersion, skipOrCopyFromHolder } from "./replicate.ts";
import { Semaphore } from "./semaphore.ts";
import { keepIfStillVerified, verifiedSha256, verifyRows } from "./verification.ts";
import { isOwnRow, type HolderRow } from "./mirror-holders.ts";
import { viewRow } from "./file-view.ts";

export type * from "./mirror-types.ts";
export type { MirrorAuditEntry } from "./mirror-rows.ts";
export { MirrorTransientError } from "./mirror-errors.ts";
export type { MirrorCluster } from "./mirror-cluster.ts";
export type { OriginCopyState } from "./origin-copies.ts";

/**
 * The mirror of one server. One instance per root: it keeps in memory which files are in
 * flight, so two instances must not fetch into the same root at once.
 */
export class Mirror {
  readonly root: string;
  readonly #rows: MirrorRows;
  readonly #logger: Logger;
  readonly #dispatcher: Dispatcher;
  readonly #ownsDispatcher: boolean;
  readonly #io: MirrorIo;
  readonly #downloader: FileDownloader;
  /** Copies from other servers (replicate.ts): the same machinery, writing holder rows instead of the row's progress. */
  readonly #copier: FileDownloader | null;
  /** Copies from a file's origin when no running server holds it (origin-copies.ts); null on a single server. */
  readonly #origins: OriginCopies | null;
  readonly #cluster: MirrorCluster | null;
  readonly #slots: Semaphore;
  /** Files in flight in this process (queued or downloading), by key. */
  readonly #active = new Map<string, ActiveFile>();
  /** Files being copied from another server in this process, by key (a verification skips them). */
  readonly #copying = new Set<string>();
  /**
   * Files a running fetchVersion call will work on, counted per call, from the moment the
   * call is made: its rows list as active at once, even before the file's turn comes, so
   * a client polling after `POST /api/v1/mirror` never mistakes a row left `pending` by an
   * earlier run for an interrupted fetch.
   */
  readonly #claimed = new Map<string, number>();
  /** The running task of each file (a download or a verification), so the next one for that file waits. */
  readonly #fileTasks = new Map<string, Promise<unknown>>();
  /** fetchVersion and verify calls running per version, so a delete can refuse. */
  readonly #busyVersions = { fetching: new Map<string, number>(), verifying: new Map<string, number>() };
  readonly #running = new Set<Promise<unknown>>();
  readonly #closing = new AbortController();
  #closed: Promise<void> | null = null;

  constructor(options: MirrorOptions) {
    this.root = path.resolve(options.root);
    const clock = options.clock ?? Date.now;
    this.#logger = options.logger ?? silentLogger();
    this.#cluster = options.cluster === undefined ? null : new MirrorCluster(options.cluster, options.store, clock);
    this.#rows = new MirrorRows(options.store, clock, this.#cluster?.self ?? null);
    this.#io = { ...defaultIo, ...(options.io ?? {}) };
    this.#slots = new Semaphore(Math.max(1, Math.floor(options.concurrency ?? 4)));
    const made = createDownloader(options, {
      rows: this.#rows,
      io: this.#io,
      logger: this.#logger,
      clock,
      http: { headersForRedirect: options.headersForRedirect ?? registryHeadersForRedirect },
    });
    this.#downloader = made.downloader;
    this.#dispatcher = made.dispatcher;
    this.#ownsDispatcher = made.ownsDispatcher;
    const copies =
      this.#cluster === null
        ? null
        : clusterDownloaders({ ...options, dispatcher: made.dispatcher }, { rows: this.#rows, io: this.#io, logger: this.#logger, clock });
    this.#copier = copies?.copier ?? null;
    this.#origins =
      copies === null
        ? null
        : new OriginCopies({
            downloader: copies.originCopier,
            finalPath: (m, v, f) => this.#finalPath(m, v, f),
            check: (m, v, f) => this.check(m, v, f),
            run: (key, task) => this.#exclusive(key, () => this.#copySlot(key, this.#closing.signal, task)),
            originHeaders: options.originHeaders,
            closing: this.#closing.signal,
            track: (work) => {
              this.#running.add(work);
              void work.finally(() => this.#running.delete(work));
            },
            logger: this.#logger,
            clock,
          });
  }

  /** The cluster this server is part of (its name, the live servers, grants); null on a single server. */
  get cluster(): MirrorCluster | null {
    return this.#cluster;
  }

  /**
   * Fetches the files of one version, at most `concurrency` at once across the mirror.
   * A file already complete from the same revision and sha256, on disk as it was verified,
   * is skipped without a request; one modified since (same size, another mtime) is hashed
   * again first and fetched anew only when it no longer matches; one gone or resized is
   * fetched anew; a partial left by an earlier attempt is resumed. Resolves with what happened to each file (failures included, each
   * recorded in its row); rejects only for invalid input, or with the abort reason when
   * `signal` (or `close()`) stops it.
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
    const keys = files.map((file) => fileKey(model, version, file.path));
    for (const key of keys) count(this.#claimed, key, +1);
    return this.#track(this.#busyVersions.fetching, fileKey(model, version, ""), async () => {
      const settled = await Promise.allSettled(
        files.map((file, index) => this.#fetchFile(context, file).finally(() => count(this.#claimed, keys[index] as string, -1))),
      );
      signal.throwIfAborted();
      const outcomes = settled.map((result) => {
        if (result.status === "fulfilled") return result.value;
        throw result.reason;
      });
      return summarize(context, outcomes);
    });
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

  /** Every mirrored file (optionally of one model) with its state and progress; a complete file is checked on disk (a stat). */
  async list(options: { model?: string } = {}): Promise<MirrorFileView[]> {
    const scope = options.model === undefined ? {} : { model: validateMirrorKey("model", options.model) };
    const [rows, holders] = await Promise.all([this.#rows.list(scope), this.#rows.holdersByFile(scope)]);
    return Promise.all(rows.map((row) => this.#view(row, holdersFor(row, holders.get(fileKey(row.model, row.version, row.file))))));
  }

  /**
   * Whether a file can be served now: where it is with its size and verified sha256, or
   * the error to answer (not there, failed, missing or changed on disk since it was verified),
   * or, in a cluster, `elsewhere`: complete and verified, but held by other servers, not this one.
   */
  async check(model: string, version: string, file: string): Promise<MirrorFileCheck> {
    validateMirrorKey("model", model);
    validateMirrorKey("version", version);
    validateMirrorFile(file);
    const row = await this.#rows.get(model, version, file);
    const sha256 = row === undefined ? null : verifiedSha256(row);
    // Still being fetched (maybe by a server that died, until its job resumes elsewhere): a wait, not a 404.
    if (row?.state === "pending" || row?.state === "fetching")
      return { kind: "refused", error: stillFetchingError(row, row.fetched_by === null ? undefined : (await this.#cluster?.describe([row.fetched_by]))?.[0]) };
    if (row === undefined || row.state !== "complete" || sha256 === null) {
      const why =
        row?.state === "failed" && row.error !== null ? `: ${row.error}` : `. It may still be fetching or have failed: GET /api/v1/mirror shows its state.`;
      return {
        kind: "refused",
        error: new NotFoundError(`The mirror has no complete file '${file}' in ${model}/${version}${why}`, {
          code: row?.state === "failed" ? "mirror_file_failed" : "mirror_file_not_found",
        }),
      };
    }
    const final = this.#finalPath(model, version, file);
    const stamp = await diskStamp(final);
    const self = this.#cluster?.self ?? null;
    const holders = self === null ? [] : holdersFor(row, await this.#rows.holders(row));
    const verdict = judgeCopy({ row, final, stamp, self, holders });
    if (verdict.kind === "ok") return { kind: "ok", path: final, size: verdict.size, sha256, updatedAt: row.updated_at };
    if (verdict.kind === "refused" || this.#cluster === null)
      return { kind: "refused", error: verdict.kind === "refused" ? verdict.error : new NotFoundError(`'${file}' is missing.`) };
    const described = await this.#cluster.describe(verdict.others.map((holder) => holder.server));
    const size = row.bytes_total ?? Number(verdict.others[0]?.size ?? 0);
    return {
      kind: "elsewhere",
      size,
      sha256,
      updatedAt: row.updated_at,
      holders: described,
      server: this.#cluster.self,
      error: elsewhereError(row, this.#cluster.self, described),
    };
  }

  /**
   * In a cluster, where the copy from its origin stands of a complete file that no running
   * server holds (origin-copies.ts): started when none runs, never waited for. `none` on a
   * single server, or when the file has no complete row.
   */
  async fromOrigin(model: string, version: string, file: string): Promise<OriginCopyState> {
    const row = await this.#rows.get(model, version, file);
    if (this.#origins === null || row?.state !== "complete") return { state: "none", why: "the mirror has no complete copy of it anywhere" };
    return this.#origins.request(row);
  }

  /** Where a complete file is on disk with its size and sha256, or null when it cannot be served (see `check`). */
  async lookup(model: string, version: string, file: string): Promise<MirrorFileFound | null> {
    const checked = await this.check(model, version, file);
    return checked.kind === "ok" ? { path: checked.path, size: checked.size, sha256: checked.sha256, updatedAt: checked.updatedAt } : null;
  }

  /** The absolute path of a complete file, or null. */
  async pathFor(model: string, version: string, file: string): Promise<string | null> {
    return (await this.lookup(model, version, file))?.path ?? null;
  }

  /** Bytes under root, per version (partial downloads counted apart), and the space left on its disk. */
  async diskUsage(): Promise<MirrorDiskUsage> {
    const tracked = await this.#rows.versionKeys();
    return measureDiskUsage({ root: this.root, io: this.#io, isTracked: (model, version) => tracked.has(fileKey(model, version, "")) });
  }

  /**
   * Removes a version's files and rows. Refused (409) while a fetch or a verification of
   * that version runs in this process. The rows go first, so nothing is presented while
   * files are removed; a version folder left without rows (an interrupted delete) can be
   * deleted again. With an `actor`, a `mirror.delete` audit entry is recorded with the rows.
   *
   * In a cluster every server's holder rows of the version go with the rows, but only this
   * server's files are removed here: the other servers' folders of a version without rows
   * are removed by their recover() at their next start.
   */
  async deleteVersion(
    model: string,
    version: string,
    options: { actor?: string; force?: boolean; usedBy?: string[] } = {},
  ): Promise<{ model: string; version: string; files: number; bytes: number }> {
    validateMirrorKey("model", model);
    validateMirrorKey("version", version);
    const versionKey = fileKey(model, version, "");
    for (const [doing, busy] of [
      ["fetched", this.#busyVersions.fetching],
      ["verified", this.#busyVersions.verifying],
    ] as const) {
      if (busy.has(versionKey)) {
        throw new ConflictError(`Version ${model}/${version} is being ${doing}; wait for that to finish (GET /api/v1/mirror) and delete it then.`, {
          code: "mirror_version_busy",
        });
      }
    }
    const folder = path.join(this.root, model, version);
    const usage = await folderUsage(folder);
    const exists = (await fileSize(folder, true)) !== null;
    const forced = options.force === true && (options.usedBy ?? []).length > 0 ? { force: true, used_by: options.usedBy } : {};
    const rows = await this.#rows.deleteVersion(model, version, {
      check: (deleted) => {
        if (deleted === 0 && !exists) {
          throw new NotFoundError(`The mirror has no version ${model}/${version}. GET /api/v1/mirror lists what it holds.`, {
            code: "mirror_version_not_found",
          });
        }
      },
      ...(options.actor === undefined
        ? {}
        : { audit: { actor: options.actor, action: "mirror.delete", target: `${model}/${version}`, detail: { bytes: usage.bytes, ...forced } } }),
    });
    this.#downloader.forgetUnder(folder);
    await rm(folder, { recursive: true, force: true });
    // The model folder goes too once its last version is gone; another version may still be there.
    await rmdir(path.join(this.root, model)).catch(() => undefined);
    this.#logger.info({ model, version, files: rows, bytes: usage.bytes, ...forced }, "mirror version deleted");
    return { model, version, files: rows, bytes: usage.bytes };
  }

  /**
   * Hashes mirrored files again (all, one model's, or one version's) and compares them with
   * the sha256 they were verified with: a match records the file's current size and mtime,
   * a mismatch (or a file gone) marks the row failed with both hashes, so it is no longer
   * served. Files being fetched are skipped.
   */
  async verify(options: VerifyOptions = {}): Promise<VerifySummary> {
    const { model, version } = options;
    if (version !== undefined && model === undefined)
      throw new BadRequestError("Verifying a version needs its model too.", { code: "invalid_field", param: "model" });
    if (model !== undefined) validateMirrorKey("model", model);
    if (version !== undefined) validateMirrorKey("version", version);
    if (this.#closing.signal.aborted)
      throw new ConflictError("The mirror is shutting down; verify again after the server restarts.", { code: "mirror_closed" });
    const rows = await this.#rows.list({ ...(model === undefined ? {} : { model }), ...(version === undefined ? {} : { version }) });
    if (model !== undefined && rows.length === 0) {
      const what = version === undefined ? `model ${model}` : `version ${model}/${version}`;
      throw new NotFoundError(`The mirror has no ${what}. GET /api/v1/mirror lists what it holds.`, { code: "mirror_version_not_found" });
    }
    options.onStart?.(rows.map((row) => ({ model: row.model, version: row.version, file: row.file, bytesTotal: row.bytes_total })));
    const signal = options.signal === undefined ? this.#closing.signal : AbortSignal.any([options.signal, this.#closing.signal]);
    const versions = [...new Set(rows.map((row) => fileKey(row.model, row.version, "")))];
    for (const key of versions) count(this.#busyVersions.verifying, key, +1);
    const run = verifyRows(
      {
        rows: this.#rows,
        logger: this.#logger,
        finalPath: (m, v, f) => this.#finalPath(m, v, f),
        isFetching: (key) => this.#active.has(key) || this.#claimed.has(key) || this.#copying.has(key),
        exclusive: (key, task) => this.#exclusive(key, task),
      },
      rows,
      { ...options, signal },
    );
    this.#running.add(run);
    try {
      const summary = await run;
      this.#logger.info({ model, version, ok: summary.ok, failed: summary.failed, skipped: summary.skipped }, "mirror verified");
      return summary;
    } finally {
      this.#running.delete(run);
      for (const key of versions) count(this.#busyVersions.verifying, key, -1);
    }
  }

  /** Records a mirror action (`mirror.fetch`, `mirror.verify`) in the audit trail; deletes record theirs with the rows. */
  audit(entry: MirrorAuditEntry): Promise<void> {
    return this.#rows.audit(entry);
  }

  /** Startup repair, before anything fetches or serves; see recovery.ts. */
  recover(): Promise<RecoverSummary> {
    return recoverRows({
      rows: this.#rows,
      logger: this.#logger,
      finalPath: (m, v, f) => this.#finalPath(m, v, f),
      isActive: (key) => this.#active.has(key),
      root: this.root,
    });
  }

  /**
   * Copies every complete file of a version that this server does not hold from a live
   * server that does (replicate.ts), verifying each against its sha256, and records this
   * server as a holder. Needs the cluster option. Refused (before anything is copied) when
   * the version is not complete or a file has no running holder; a file that fails to copy
   * is reported in the summary. Counts as a fetch of the version (a delete waits for it).
   */
  replicate(model: string, version: string, options: ReplicateOptions = {}): Promise<ReplicateSummary> {
    try {
      validateMirrorKey("model", model);
      validateMirrorKey("version", version);
      if (this.#cluster === null || this.#copier === null) {
        throw new ConflictError("This server is not part of a cluster: there is no other server to copy mirror files from.", { code: "mirror_not_clustered" });
      }
      if (this.#closing.signal.aborted)
        throw new ConflictError("The mirror is shutting down; replicate again after the server restarts.", { code: "mirror_closed" });
    } catch (error) {
      return Promise.reject(error);
    }
    const cluster = this.#cluster;
    const copier = this.#copier;
    const signal = options.signal === undefined ? this.#closing.signal : AbortSignal.any([options.signal, this.#closing.signal]);
    return this.#track(this.#busyVersions.fetching, fileKey(model, version, ""), () =>
      replicateVersion(
        {
          cluster,
          downloader: copier,
          rows: this.#rows,
          logger: this.#logger,
          finalPath: (m, v, f) => this.#finalPath(m, v, f),
          check: (m, v, f) => this.check(m, v, f),
          run: (key, task) => this.#exclusive(key, () => this.#copySlot(key, signal, task)),
        },
        model,
        version,
        { ...options, signal },
      ),
    );
  }

  /** Stops every fetch (their rows go back to `pending`, partials kept) and verification, and waits for them. */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#closing.abort(new ConflictError("The mirror was closed while fetching; fetch again to resume.", { code: "mirror_closed" }));
      await Promise.allSettled([...this.#running]);
      if (this.#ownsDispatcher) await this.#dispatcher.close();
    })();
    return this.#closed;
  }

  // ---------------------------------------------------------------------------------------

  /** Runs `body` counted as busy on `key` in `busy`, and as running (close() waits for it). */
  #track<T>(busy: Map<string, number>, key: string, body: () => Promise<T>): Promise<T> {
    count(busy, key, +1);
    const run = body().finally(() => count(busy, key, -1));
    this.#running.add(run);
    void run.then(
      () => this.#running.delete(run),
      () => this.#running.delete(run),
    );
    return run;
  }

  /** Runs `task` after any running task of the same file, registered so the next one waits for it. */
  async #exclusive<T>(key: string, task: () => Promise<T>): Promise<T> {
    for (let running = this.#fileTasks.get(key); running !== undefined; running = this.#fileTasks.get(key)) {
      await running.catch(() => undefined);
    }
    const started = task();
    this.#fileTasks.set(key, started);
    try {
      return await started;
    } finally {
      if (this.#fileTasks.get(key) === started) this.#fileTasks.delete(key);
    }
  }

  #fetchFile(context: FetchContext, spec: MirrorFetchFile): Promise<MirrorFileOutcome> {
    const key = fileKey(context.model, context.version, spec.path);
    // Two calls for the same file: the second waits, then usually finds it complete.
    return this.#exclusive(key, () => this.#runFile(context, spec, key));
  }

  async #runFile(context: FetchContext, spec: MirrorFetchFile, key: string): Promise<MirrorFileOutcome> {
    const { model, version } = context;
    const final = this.#finalPath(model, version, spec.path);
    const row = await this.#rows.get(model, version, spec.path);
    // A row that describes another server's disk says nothing about this one's copy: the cluster check below does.
    const own = row !== undefined && isOwnRow(row, this.#rows.self);
    const kept = own ? await keepIfStillVerified({ rows: this.#rows, logger: this.#logger }, row, { context, spec, final }) : null;
    if (kept !== null) return kept;
    const fromCluster =
      row === undefined || this.#cluster === null || this.#copier === null
        ? null
        : await skipOrCopyFromHolder(
            { cluster: this.#cluster, downloader: this.#copier, finalPath: (m, v, f) => this.#finalPath(m, v, f), logger: this.#logger },
            { context, spec, row, check: (m, v, f) => this.check(m, v, f), slot: (task) => this.#copySlot(key, context.signal, task) },
          );
    if (fromCluster !== null) return fromCluster;
    // A row from another revision (or another published hash) describes other bytes: its
    // partial cannot be resumed.
    const sameSource = row !== undefined && row.revision === context.revision && row.sha256 === spec.sha256;
    // A partial without a row is not ours to trust either (a delete that stopped halfway).
    if (!sameSource) await this.#downloader.discard(final + PARTIAL_SUFFIX);
    // Only a download in flight leaves bytes to go on from: a complete file that changed, or
    // one a verification failed, is replaced from the first byte.
    const inFlight = sameSource && (row.state === "pending" || row.state === "fetching");
    const queued = inFlight ? row.bytes_done : 0;
    await this.#rows.upsert(context, spec, { state: "pending", bytes_done: queued, error: null, actual_sha256: null });
    const active: ActiveFile = { state: "pending", bytesDone: queued, bytesTotal: spec.size };
    this.#active.set(key, active);
    emitProgress(context, spec, active, this.#logger);
    try {
      const release = await this.#slots.acquire(context.signal);
      try {
        return await this.#downloader.download(context, spec, { final, active, reuseFinal: inFlight });
      } finally {
        release();
      }
    } catch (error) {
      // Stopped while queued (the row stays pending) or while downloading (already recorded).
      if (context.signal.aborted) throw context.signal.reason ?? error;
      // A failure around the download rather than in it (creating folders, re-reading a
      // partial, the store): recorded like any other, so one file cannot sink the version.
      const failure =
        error instanceof LlmgwError ? error : localFailure(error, { target: context, spec, partial: final + PARTIAL_SUFFIX, written: active.bytesDone });
      await this.#rows
        .upsert(context, spec, { state: "failed", bytes_done: active.bytesDone, error: failure.message, actual_sha256: null })
        .catch((storeError: unknown) => this.#logger.warn({ err: describeError(storeError), file: spec.path }, "could not record a mirror failure"));
      this.#logger.warn({ model, version, file: spec.path, code: failure.code, err: failure.message }, "mirror fetch failed");
      return outcome(spec, { state: "failed", error: { code: failure.code, message: failure.message, retryable: failure.retryable } });
    } finally {
      this.#active.delete(key);
    }
  }

  /** Runs a copy with a download slot, counted as copying (a verification skips the file meanwhile). */
  async #copySlot<T>(key: string, signal: AbortSignal, task: () => Promise<T>): Promise<T> {
    const release = await this.#slots.acquire(signal);
    this.#copying.add(key);
    try {
      return await task();
    } finally {
      this.#copying.delete(key);
      release();
    }
  }

  #finalPath(model: string, version: string, file: string): string {
    const absolute = path.join(this.root, model, version, ...file.split("/"));
    // The names were validated segment by segment; this is the second line of defence.
    if (!absolute.startsWith(this.root + path.sep)) throw new BadRequestError(`Invalid mirror path '${model}/${version}/${file}'.`, { code: "invalid_path" });
    return absolute;
  }

  async #view(row: MirrorRow, holders: HolderRow[]): Promise<MirrorFileView> {
    const key = fileKey(row.model, row.version, row.file);
    const final = this.#finalPath(row.model, row.version, row.file);
    const self = this.#cluster?.self ?? null;
    // A file another server holds is complete for the cluster even when it is not on this disk.
    const onDisk = async () => {
      const verdict = judgeCopy({ row, final, stamp: await diskStamp(final), self, holders });
      return verdict.kind === "refused" ? verdict.error : null;
    };
    return viewRow(row, { active: this.#active.get(key), claimed: this.#claimed.has(key), onDisk, holders: holders.map((holder) => holder.server) });
  }
}

/** The holder rows that count for a row: those of the sha256 it must have now. */
function holdersFor(row: MirrorRow, holders: HolderRow[] | undefined): HolderRow[] {
  const sha256 = verifiedSha256(row);
  return (holders ?? []).filter((holder) => holder.sha256 === sha256);
}

function count(map: Map<string, number>, key: string, delta: number): void {
  const next = (map.get(key) ?? 0) + delta;
  if (next <= 0) map.delete(key);
  else map.set(key, next);
}
