// The node's weight cache: the files a replica's engine loads, fetched from the server's
// mirror (`GET {server}/mirror/{model}/{version}/{file}`, src/mirror/mirror-file-server.ts)
// with this node's credential, into `root/{model}/{version}/{file}`, the mirror's own
// layout, so the parts of a split GGUF sit side by side as llama.cpp expects.
//
// The download itself is the mirror's (src/mirror/file-download.ts): the bytes go to
// `<file>.partial`, a dropped connection resumes with `Range`, the sha256 is computed
// while the bytes stream in, and the file gets its final name only after an fsync and a
// match with the published size and sha256. The cache keeps no rows: a file under its
// final name is one that matched, and the identity check (src/agent/weights-identity.ts)
// says whether it still does.
//
// A file already there that passes the identity check is not fetched again. One that
// fails it (changed on this node, replaced by a link, truncated) is removed and fetched
// again automatically: the cache owns these files, the server's mirror holds the good
// copy, and nobody but the agent should write here. Replicas of one model share the
// files: concurrent `ensure` calls for one file share one download, which stops only when
// every caller waiting on it has given up.
//
// A file that cannot be had right now (the server cannot be reached, drops the link, or
// answers 503 because no running server holds it yet) fails its `ensure` with a
// `WeightsUnavailableError` (weights-wait.ts): the agent waits and asks again, and the
// partial file is resumed from.
//
// One agent per cache folder: two processes fetching into the same root would write the
// same partial files.
import type { Dirent } from "node:fs";
import { lstat, mkdir, readdir, realpath, rm } from "node:fs/promises";
import path from "node:path";
import type { Dispatcher } from "undici";
import { ConflictError, LlmgwError, UpstreamError, describeError } from "../core/errors.ts";
import { silentLogger, type Logger } from "../core/log.ts";
import { defaultIo } from "../mirror/disk-files.ts";
import type { ActiveFile, FetchContext } from "../mirror/fetch-input.ts";
import { createDownloader, type FileDownloader, type DownloadRows, type TransferOptions } from "../mirror/file-download.ts";
import type { SourceStatus } from "../mirror/http-source.ts";
import { origin } from "../mirror/mirror-errors.ts";
import { PARTIAL_SUFFIX, validateMirrorFile, validateMirrorKey } from "../mirror/mirror-paths.ts";
import type { MirrorFetchFile, MirrorFileOutcome, MirrorIo } from "../mirror/mirror-types.ts";
import { headersForRedirect } from "../registry/redirects.ts";
import { encodeRepoPath } from "../registry/repo-path.ts";
import { WeightsIdentityError, type WeightsIdentity } from "./weights-identity.ts";
import { WeightsUnavailableError } from "./weights-wait.ts";

/** One file a replica needs, as the server published it in the mirror. */
export interface CacheFileSpec {
  model: string;
  version: string;
  /** Path inside the version, `/` between folders (for example `Q2_K/x-00001-of-00002.gguf`). */
  file: string;
  bytes: number;
  /** Lowercase hex. */
  sha256: string;
}

export interface CacheProgress {
  model: string;
  version: string;
  file: string;
  done: number;
  total: number;
}

export interface EnsureOptions {
  signal?: AbortSignal;
  onProgress?: (progress: CacheProgress) => void;
}

/** A file under its final name in the cache. */
export interface CachedFile {
  model: string;
  version: string;
  file: string;
  bytes: number;
}

/** Downloads as the mirror's (file-download.ts); the persist settings only pace the background fsync here. */
export interface WeightCacheOptions extends Omit<TransferOptions, "persistIntervalMs" | "persistBytes"> {
  /** The cache folder, for example DATA_DIR/weights. */
  root: string;
  /**
   * The llmgw server's base URL, for example http://10.0.0.1:8080, or a function read at
   * each download: the server the agent talks to now, when it fails over between the
   * servers of a cluster (each serves the mirror).
   */
  serverUrl: string | (() => string);
  /** This node's credential, read at each download (it may be replaced by a re-join). */
  credential: () => string;
  identity: WeightsIdentity;
  logger?: Logger;
  io?: Partial<MirrorIo>;
}

/** One download in flight, shared by every `ensure` call that needs the file. */
interface Flight {
  sha256: string;
  bytes: number;
  done: Promise<void>;
  controller: AbortController;
  waiters: number;
  listeners: Set<(progress: CacheProgress) => void>;
}

// The cache records nothing but the files: the mirror's row updates have nowhere to go.
const NO_ROWS: DownloadRows = {
  upsert: async () => undefined,
  recordProgress: async () => undefined,
};

// The codes under which the server's answers are named for a node (see #statusError); their messages are kept as they are.
const NODE_CODES = new Set(["node_credential_refused", "weights_not_on_server"]);

// Failures a later try can get past without anyone acting: the server (or the holder it
// sent the node to) cannot be reached, timed out or dropped the link (the partial is kept
// and resumed), answered 408/429/5xx, mixed up a range, or will not serve the file until
// its copy is verified again. The agent waits these out (weights-wait.ts). A sha256 or
// size mismatch, a full disk, a refused credential and a file the server no longer has
// are not among them: they are failures.
const WAIT_CODES = new Set([
  "mirror_source_unreachable",
  "mirror_source_timeout",
  "mirror_source_error",
  "mirror_bad_range",
  "weights_unavailable_on_server",
  "weights_not_served_now",
]);

export class WeightCache {
  readonly root: string;
  readonly #serverUrl: () => string;
  readonly #credential: () => string;
  readonly #identity: WeightsIdentity;
  readonly #logger: Logger;
  readonly #dispatcher: Dispatcher;
  readonly #ownsDispatcher: boolean;
  readonly #downloader: FileDownloader;
  readonly #flights = new Map<string, Flight>();
  /** What each download's spec stands for, for the server's refusals (the source hook sees only the spec). */
  readonly #named = new WeakMap<MirrorFetchFile, string>();
  readonly #closing = new AbortController();
  #closed: Promise<void> | null = null;

  constructor(options: WeightCacheOptions) {
    this.root = path.resolve(options.root);
    const { serverUrl } = options;
    const read = typeof serverUrl === "string" ? () => serverUrl : serverUrl;
    this.#serverUrl = () => read().replace(/\/+$/, "");
    this.#credential = options.credential;
    this.#identity = options.identity;
    this.#logger = options.logger ?? silentLogger();
    // The persist settings (default) only pace the background fsync: the cache has no rows to update.
    const made = createDownloader(options, {
      rows: NO_ROWS,
      io: { ...defaultIo, ...(options.io ?? {}) },
      logger: this.#logger,
      clock: Date.now,
      http: { headersForRedirect, statusError: (answer) => this.#statusError(answer) },
    });
    this.#downloader = made.downloader;
    this.#dispatcher = made.dispatcher;
    this.#ownsDispatcher = made.ownsDispatcher;
  }

  /** Where a file of the cache is (or will be): `root/{model}/{version}/{file}`. Throws a 400 for a name that is not one plain path. */
  pathFor(model: string, version: string, file: string): string {
    validateMirrorKey("model", model);
    validateMirrorKey("version", version);
    validateMirrorFile(file);
    const final = path.join(this.root, model, version, ...file.split("/"));
    // The names were checked segment by segment; this is the last word on containment.
    if (!final.startsWith(this.root + path.sep))
      throw new ConflictError(`The cache path of ${model}/${version}/${file} would be ${final}, outside the cache ${this.root}.`, { code: "invalid_path" });
    return final;
  }

  /**
   * Makes every file present and verified in the cache and resolves with their absolute
   * paths, in the order given. Files are fetched one after the other (they share the
   * node's link to the server). Rejects with the first failure, or with the abort reason.
   */
  async ensure(files: readonly CacheFileSpec[], options: EnsureOptions = {}): Promise<string[]> {
    const finals = files.map((file) => this.pathFor(file.model, file.version, file.file));
    const paths: string[] = [];
    for (const [index, file] of files.entries()) {
      options.signal?.throwIfAborted();
      paths.push(await this.#ensureOne(file, finals[index] as string, options));
    }
    return paths;
  }

  /** Every file under its final name in the cache (downloads in progress are not listed). */
  async list(): Promise<CachedFile[]> {
    const found: CachedFile[] = [];
    for (const model of await folders(this.root)) {
      for (const version of await folders(path.join(this.root, model))) {
        const base = path.join(this.root, model, version);
        for (const file of await filesBelow(base)) {
          if (file.relative.endsWith(PARTIAL_SUFFIX)) continue;
          found.push({ model, version, file: file.relative, bytes: file.bytes });
        }
      }
    }
    return found;
  }

  /** Removes a cached version (its partial downloads too). Refused while one of its files is being fetched. */
  async remove(model: string, version: string): Promise<void> {
    validateMirrorKey("model", model);
    validateMirrorKey("version", version);
    const folder = path.join(this.root, model, version);
    const busy = [...this.#flights.keys()].find((key) => key.startsWith(folder + path.sep));
    if (busy !== undefined) {
      throw new ConflictError(`${model}/${version} is being fetched into this node's cache (${busy}); remove it once the replicas that need it have stopped.`, {
        code: "weights_fetching",
      });
    }
    this.#downloader.forgetUnder(folder);
    await rm(folder, { recursive: true, force: true });
    await this.#identity.forget(folder);
  }

  /** Stops the downloads in flight and releases the HTTP connections. */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#closing.abort(new ConflictError("The weight cache is closing (the agent is shutting down).", { code: "weights_cache_closed" }));
      await Promise.allSettled([...this.#flights.values()].map((flight) => flight.done));
      if (this.#ownsDispatcher) await this.#dispatcher.close();
    })();
    return this.#closed;
  }

  async #ensureOne(file: CacheFileSpec, final: string, options: EnsureOptions): Promise<string> {
    for (;;) {
      const current = this.#flights.get(final);
      if (current !== undefined && (current.sha256 !== file.sha256 || current.bytes !== file.bytes || current.controller.signal.aborted)) {
        // Another publication of the same path (not expected: versions are immutable), or a
        // download its callers gave up on and that is still winding down: let it end, then look again.
        await current.done.catch(() => undefined);
        continue;
      }
      const flight = current ?? this.#start(file, final);
      await this.#join(flight, options);
      return final;
    }
  }

  #start(file: CacheFileSpec, final: string): Flight {
    const controller = new AbortController();
    const listeners = new Set<(progress: CacheProgress) => void>();
    const signal = AbortSignal.any([controller.signal, this.#closing.signal]);
    const emit = (progress: CacheProgress): void => {
      for (const listener of listeners) {
        try {
          listener(progress);
        } catch (error) {
          this.#logger.warn({ err: describeError(error) }, "a weight cache progress listener threw");
        }
      }
    };
    const flight: Flight = {
      sha256: file.sha256,
      bytes: file.bytes,
      controller,
      waiters: 0,
      listeners,
      done: this.#obtain(file, final, signal, emit).finally(() => this.#flights.delete(final)),
    };
    // A flight nobody waits on any more (all callers gave up) must not surface as unhandled.
    flight.done.catch(() => undefined);
    this.#flights.set(final, flight);
    return flight;
  }

  /** Waits for a shared download; a caller that gives up leaves it running for the others, and the last one stops it. */
  async #join(flight: Flight, options: EnsureOptions): Promise<void> {
    const { signal, onProgress } = options;
    signal?.throwIfAborted();
    flight.waiters += 1;
    if (onProgress !== undefined) flight.listeners.add(onProgress);
    let onAbort: (() => void) | undefined;
    try {
      const gaveUp = new Promise<never>((_, reject) => {
        if (signal === undefined) return;
        onAbort = () => reject(signal.reason);
        signal.addEventListener("abort", onAbort, { once: true });
      });
      await Promise.race([flight.done, gaveUp]);
    } finally {
      if (onAbort !== undefined) signal?.removeEventListener("abort", onAbort);
      if (onProgress !== undefined) flight.listeners.delete(onProgress);
      flight.waiters -= 1;
      if (flight.waiters === 0 && signal?.aborted === true) flight.controller.abort(signal.reason);
    }
  }

  /** The file verified in place, or fetched: a file that fails the identity check is removed and fetched again. */
  async #obtain(file: CacheFileSpec, final: string, signal: AbortSignal, emit: (progress: CacheProgress) => void): Promise<void> {
    const named = `${file.model}/${file.version}/${file.file}`;
    const expected = { path: final, bytes: file.bytes, sha256: file.sha256 };
    await mkdir(path.dirname(final), { recursive: true });
    await this.#checkInside(final, named);
    const there = await lstat(final).catch(() => null);
    if (there !== null) {
      try {
        await this.#identity.verify([expected], signal);
        return;
      } catch (error) {
        if (!(error instanceof WeightsIdentityError)) throw error;
        if (there.isDirectory()) {
          throw new ConflictError(
            `${final} in this node's weight cache is a folder, where ${named} belongs; remove it by hand, then the agent fetches the file.`,
            {
              code: "weights_not_file",
              cause: error,
            },
          );
        }
        this.#logger.warn({ file: final, code: error.code, err: error.message }, "cached weights failed the identity check; fetching them again");
        await rm(final, { force: true });
      }
    }
    await this.#download(file, final, signal, emit);
    await this.#identity.remember(expected);
  }

  /** A link above the file (a version folder pointing elsewhere) must not take the cache's writes out of it. */
  async #checkInside(final: string, named: string): Promise<void> {
    const [folder, root] = await Promise.all([realpath(path.dirname(final)), realpath(this.root)]);
    if (folder !== root && !folder.startsWith(root + path.sep)) {
      throw new ConflictError(
        `The cache folder of ${named} resolves to ${folder}, outside this node's weight cache (${root}): a folder in the cache is a link. Remove ${path.dirname(final)} and the agent fetches the file again.`,
        { code: "weights_outside_cache" },
      );
    }
  }

  async #download(file: CacheFileSpec, final: string, signal: AbortSignal, emit: (progress: CacheProgress) => void): Promise<void> {
    const named = `${file.model}/${file.version}/${file.file}`;
    const server = this.#serverUrl();
    const url = `${server}/mirror/${encodeURIComponent(file.model)}/${encodeURIComponent(file.version)}/${encodeRepoPath(file.file)}`;
    const spec: MirrorFetchFile = {
      path: file.file,
      url,
      sha256: file.sha256,
      size: file.bytes,
      headers: { authorization: `Bearer ${this.#credential()}` },
    };
    this.#named.set(spec, named);
    const context: FetchContext = {
      model: file.model,
      version: file.version,
      repo: server,
      revision: file.version,
      signal,
      onProgress: (event) => emit({ model: file.model, version: file.version, file: file.file, done: event.bytesDone, total: event.bytesTotal ?? file.bytes }),
    };
    const active: ActiveFile = { state: "pending", bytesDone: 0, bytesTotal: file.bytes };
    this.#logger.info({ model: file.model, version: file.version, file: file.file, bytes: file.bytes }, "fetching weights from the server's mirror");
    const result = await this.#downloader.download(context, spec, { final, active, reuseFinal: false });
    if (result.state === "complete") return;
    throw this.#fetchFailure(file, result, url);
  }

  #fetchFailure(file: CacheFileSpec, result: MirrorFileOutcome, url: string): LlmgwError {
    const named = `${file.model}/${file.version}/${file.file}`;
    const failure = result.error ?? { code: "weights_fetch_failed", message: "no reason was given", retryable: true };
    if (failure.code === "mirror_checksum_mismatch") {
      return new UpstreamError(
        `${named} from the server's mirror at ${origin(url)} has sha256 ${result.sha256 ?? "?"}, but the server published ${file.sha256} for it (${file.bytes} bytes). ` +
          `The downloaded bytes were removed and nothing was put in the cache. The server's copy may be damaged: run 'llmgw ctl mirror verify' on the server; the replica is retried with backoff.`,
        { code: "weights_download_mismatch", retryable: true },
      );
    }
    if (failure.code === "mirror_disk_full") {
      return new LlmgwError({
        message:
          `This node's disk is full: ${named} (${file.bytes} bytes) does not fit in its weight cache (${this.root}). ` +
          `Free space on that disk (cached versions no replica uses can be removed); the replica is retried with backoff, and bytes already fetched are kept and resumed from.`,
        code: "weights_disk_full",
        status: 507,
        type: "server_error",
        retryable: true,
      });
    }
    if (NODE_CODES.has(failure.code)) return new UpstreamError(failure.message, { code: failure.code, retryable: failure.retryable });
    if (WAIT_CODES.has(failure.code)) {
      const kept = result.bytesTotal !== null && result.resumedFrom + result.bytesFetched > 0 ? "; the bytes fetched so far are kept and resumed from" : "";
      const message = failure.code.startsWith("weights_") ? failure.message : `fetching ${named} from the server's mirror failed: ${failure.message}`;
      return new WeightsUnavailableError(`${message}${kept}`, { code: failure.code });
    }
    return new UpstreamError(`Fetching ${named} from the server's mirror into this node's cache (${this.root}) failed: ${failure.message}`, {
      code: failure.code,
      retryable: failure.retryable,
    });
  }

  /** The server's refusals, in a node's words. */
  #statusError(answer: SourceStatus): LlmgwError | null {
    const named = this.#named.get(answer.spec) ?? answer.spec.path;
    const where = origin(answer.url);
    const said = serverSaid(answer.said);
    if (answer.status === 401 || answer.status === 403) {
      return new UpstreamError(
        `The server at ${where} refused this node's credential (${answer.status}) when fetching ${named}${said}. ` +
          `The node may have been removed ('llmgw ctl node remove') or its credential replaced: re-join it with 'llmgw agent --server URL --join-token TOKEN' ` +
          `(the token is in the server's DATA_DIR/join.token and from 'llmgw ctl node join-token').`,
        { code: "node_credential_refused" },
      );
    }
    if (answer.status === 404) {
      return new UpstreamError(
        `The server's mirror at ${where} no longer has ${named} (404)${said}. The mirrored version may have been deleted or have failed; ` +
          `fetch it again on the server ('llmgw ctl mirror') or change the model's source.`,
        { code: "weights_not_on_server" },
      );
    }
    if (answer.status === 409) {
      return new UpstreamError(
        `The server's mirror at ${where} will not serve ${named} now (409)${said}. Once the server's copy is verified again, the replica is retried.`,
        {
          code: "weights_unavailable_on_server",
          retryable: true,
        },
      );
    }
    if (answer.status === 503) {
      // No running server holds the file: the server is fetching it from its origin, or says why it cannot.
      return new UpstreamError(`The server at ${where} cannot send ${named} now (503)${said}`, { code: "weights_not_served_now", retryable: true });
    }
    return null;
  }
}

/** What the server said, from its JSON error (src/core/errors.ts renderError) when it parses. */
function serverSaid(text: string | undefined): string {
  if (text === undefined) return "";
  try {
    const parsed = JSON.parse(text) as { error?: { message?: unknown } };
    if (typeof parsed.error?.message === "string") return `: ${parsed.error.message}`;
  } catch {
    // Not JSON (or cut short): quote it as it came.
  }
  return `: ${text}`;
}

async function folders(dir: string): Promise<string[]> {
  try {
    return (await readdir(dir, { withFileTypes: true }))
      .filter((entry) => entry.isDirectory())
      .map((entry) => entry.name)
      .sort();
  } catch {
    return [];
  }
}

/** Regular files below `base`, with their paths relative to it (`/` between folders). */
async function filesBelow(base: string): Promise<Array<{ relative: string; bytes: number }>> {
  const found: Array<{ relative: string; bytes: number }> = [];
  const walk = async (dir: string, prefix: string): Promise<void> => {
    let entries: Dirent[];
    try {
      entries = await readdir(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const entry of entries.sort((a, b) => a.name.localeCompare(b.name))) {
      const relative = prefix === "" ? entry.name : `${prefix}/${entry.name}`;
      if (entry.isDirectory()) await walk(path.join(dir, entry.name), relative);
      else if (entry.isFile()) {
        const info = await lstat(path.join(dir, entry.name)).catch(() => null);
        if (info !== null) found.push({ relative, bytes: info.size });
      }
    }
  };
  await walk(base, "");
  return found;
}
