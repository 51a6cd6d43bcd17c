// The mirror's vocabulary: what callers hand to `Mirror` (files to fetch, options) and what
// they get back (outcomes, file views, disk use, recovery and verification summaries).
// Types only, so every part of the mirror and its consumers share one definition.
import type { Writable } from "node:stream";
import type { TransferOptions } from "./file-download.ts";
import type { LlmgwError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Store } from "../store/store.ts";

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
  /** True when a complete file had changed on disk (size or mtime) and was hashed again before it was skipped. */
  reverified?: boolean;
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
  /**
   * The row's state, except that a `complete` file found missing, resized or modified on
   * disk (a stat, not a hash) is shown `failed` with the reason in `error`.
   */
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
  /** When the bytes on disk were last hashed and matched (at the end of the download, or by a verification). */
  verifiedAt: string | null;
  createdAt: string;
  updatedAt: string;
  /**
   * The servers that hold verified bytes of this file (their `mirror_holders` rows for the
   * sha256 it must have), by name. Empty on a server without the cluster option, which
   * keeps no holder rows.
   */
  holders: string[];
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
  /** With the cluster option only: complete files on this disk from before holder rows, now held by this server. */
  claimed?: number;
  /** With the cluster option only: this server's holder rows whose file is gone or resized, removed. */
  dropped?: number;
  /** With the cluster option only: version folders without rows (deleted by another server), removed. */
  orphans?: number;
}

/** What a complete file is, for a reader: where it is, its size and the sha256 it was verified with. */
export interface MirrorFileFound {
  path: string;
  size: number;
  sha256: string;
  updatedAt: string;
}

/** A server that holds a file's verified bytes, as a reader of `check` sees it. */
export interface MirrorHolder {
  name: string;
  /** Where the others reach it (its cluster row); "" when it has none. */
  url: string;
  /** It runs now (the cluster's word): redirects and copies go only to a live holder. */
  live: boolean;
  /** When it was last seen (its cluster row), for messages; null when unknown. */
  lastSeen: string | null;
}

/**
 * Whether a file can be served now: `ok` with where it is; `refused` with the error a
 * reader answers (404 when it is not there or failed, 409 when it changed on disk since it
 * was verified), whose message says why and what to do; or, with the cluster option only,
 * `elsewhere`: the file is complete and verified but this server does not hold its bytes
 * and other servers do (`holders`, sorted by name). `error` is what a reader that cannot
 * follow it there answers (409 `mirror_file_elsewhere`, naming the holders and the
 * `ctl mirror replicate` that copies the file here).
 */
export type MirrorFileCheck =
  | ({ kind: "ok" } & MirrorFileFound)
  | { kind: "refused"; error: LlmgwError }
  | ({ kind: "elsewhere"; holders: MirrorHolder[]; server: string; error: LlmgwError } & Omit<MirrorFileFound, "path">);

export interface VerifyOptions {
  /** Only this model (and, with `version`, only that version); every complete file when absent. */
  model?: string;
  version?: string;
  signal?: AbortSignal;
  /** Called once the files in scope are known, before any is read. */
  onStart?: (files: { model: string; version: string; file: string; bytesTotal: number | null }[]) => void;
  /** Called as files are hashed: which file, and bytes hashed of its size. */
  onProgress?: (event: { model: string; version: string; file: string; bytesDone: number; bytesTotal: number }) => void;
  /** Called once per file with its result, in the order files finish. */
  onFile?: (result: VerifyFileResult) => void;
}

export interface VerifyFileResult {
  model: string;
  version: string;
  file: string;
  /** `ok`: the bytes match; `failed`: they do not (or the file is gone), and the row is now failed; `skipped`: not checked now. */
  result: "ok" | "failed" | "skipped";
  /** The sha256 the file was verified with before (published by the registry, or computed at its download). */
  expectedSha256: string | null;
  /** The sha256 of the bytes on disk now; null when they were not read. */
  actualSha256: string | null;
  bytes: number | null;
  /** Why it failed or was skipped. */
  message: string | null;
}

export interface VerifySummary {
  files: VerifyFileResult[];
  ok: number;
  failed: number;
  skipped: number;
  /** Bytes read and hashed. */
  bytesHashed: number;
}

/** The file operations the mirror writes through; tests replace them to simulate a full disk. */
export interface MirrorIo {
  createWriteStream(file: string, options: { flags: "w" | "a"; highWaterMark: number }): Writable;
  /** Bytes an unprivileged process can still write on the filesystem holding `dir`; null when unknown. */
  freeBytes(dir: string): Promise<number | null>;
}

/**
 * The servers sharing this database (a cluster on PostgreSQL), as the mirror needs them.
 * Without it the mirror is the only one: it writes no `fetched_by` and no holder rows,
 * and every row is its own (the single-server behaviour).
 */
export interface MirrorClusterOptions {
  /** This server's name. */
  self: string;
  /** The servers running now (live), with the URL others reach each at (includes this one). */
  liveServers(): Promise<Array<{ name: string; url: string }>>;
  /** Signs and checks redirect grants: an HMAC (hex) of a text under the cluster secret. */
  mac(text: string): string;
}

export interface ReplicateOptions {
  signal?: AbortSignal;
  /** Called as files are copied (state `fetching` with bytes, then `complete` or `failed`). */
  onProgress?: (event: MirrorProgressEvent) => void;
  /** Called once the files and where each comes from are known, before any is copied. */
  onStart?: (files: ReplicateFilePlan[]) => void;
}

export interface ReplicateFilePlan {
  file: string;
  bytesTotal: number | null;
  /** The live server it is copied from; null when this server holds it already. */
  from: string | null;
}

export interface ReplicateFileOutcome {
  file: string;
  /** `held`: it was here already; `copied`: copied and verified now; `failed`: see `error`. */
  state: "held" | "copied" | "failed";
  from: string | null;
  /** Bytes received by this call. */
  bytesCopied: number;
  bytesTotal: number | null;
  error: { code: string; message: string; retryable: boolean } | null;
}

export interface ReplicateSummary {
  model: string;
  version: string;
  /** The server that copied (this one). */
  server: string;
  /** True when this server now holds every complete file of the version. */
  complete: boolean;
  files: ReplicateFileOutcome[];
  copied: number;
  alreadyHeld: number;
  failed: number;
  bytesCopied: number;
}

export interface MirrorOptions extends TransferOptions {
  store: Store;
  /** The content store's folder, DATA_DIR/mirror. */
  root: string;
  logger?: Logger;
  /** Files downloading at once, across all versions. Default 4. */
  concurrency?: number;
  clock?: () => number;
  /** Which headers survive a redirect; default the registry's rule (Authorization dropped across hosts). */
  headersForRedirect?: (headers: Record<string, string>, from: string, to: string) => Record<string, string>;
  io?: Partial<MirrorIo>;
  /** The cluster this server is part of; absent on a single server (SQLite). */
  cluster?: MirrorClusterOptions;
  /**
   * The registry's headers for a request to a file's origin URL (its token only on its own
   * origin), for a copy from the origin of a file no running server holds (origin-copies.ts).
   */
  originHeaders?: (url: string) => Record<string, string>;
}
