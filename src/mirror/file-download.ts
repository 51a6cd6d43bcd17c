// One file's download, from its partial bytes to a verified file under its final name:
// resume from what is on disk (`Range: bytes=<partial size>-`), retry transient failures
// with backoff while the download makes progress, hash while the bytes stream in, record
// progress in the row, then fsync, compare with the published size and sha256, rename into
// place and record the row complete with the file's size and mtime as verified.
//
// A file is only ever written as `<final>.partial`; it gets its final name only after it
// was fsynced and matched, and the row says `complete` only after that rename.
import { mkdir, rename, rm, truncate } from "node:fs/promises";
import path from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Agent, type Dispatcher } from "undici";
import { backoffDelay } from "../core/backoff.ts";
import { LlmgwError, UpstreamError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { ContentHasher, blobHeaderSize, checksumProblem, hashFileInto } from "./content-hash.ts";
import { diskStamp, fileSize, fsyncPath } from "./disk-files.ts";
import { emitProgress, outcome, type ActiveFile, type FetchContext } from "./fetch-input.ts";
import { openHttpSource, type HttpSourceSettings, type Source } from "./http-source.ts";
import { isLocalUrl, localSourceChange, localSourceChangedError, openLocalSource, statLocalSource } from "./local-file-source.ts";
import { MirrorTransientError, SourceError, WriteError, classifyTransferError, diskFullError, localFailure } from "./mirror-errors.ts";
import { PARTIAL_SUFFIX } from "./mirror-paths.ts";
import type { MirrorRows } from "./mirror-rows.ts";
import type { MirrorFetchFile, MirrorFileOutcome, MirrorIo } from "./mirror-types.ts";
import { pump } from "./pump.ts";

/**
 * Where a download records its state. The mirror keeps rows in the store; a node's weight
 * cache (src/agent/weight-cache.ts) keeps none, since the file on disk is its only record.
 */
export type DownloadRows = Pick<MirrorRows, "upsert" | "recordProgress">;

export interface DownloaderSettings {
  rows: DownloadRows;
  io: MirrorIo;
  logger: Logger;
  clock: () => number;
  http: HttpSourceSettings;
  retries: number;
  retryDelayMs: number;
  maxRetryDelayMs: number;
  persistIntervalMs: number;
  persistBytes: number;
  progressIntervalMs: number;
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

// Large enough that a fast source rarely waits on the writer (fs.WriteStream joins queued
// chunks into one writev), small enough to bound memory per download.
const WRITE_HIGH_WATER_MARK = 8 * 1024 * 1024;

/** How downloads talk HTTP and retry: what the mirror and a node's weight cache both configure. */
export interface TransferOptions {
  /** HTTP dispatcher; by default one of its own with the timeouts below, closed with its owner. */
  dispatcher?: Dispatcher;
  /** TCP/TLS connect timeout of that own dispatcher. Default 10 s. */
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
  /** How often progress is written to the rows (and the partial file synced) while a file streams: every this many ms ... Default 1 s. */
  persistIntervalMs?: number;
  /** ... or every this many bytes, whichever comes first. Default 64 MiB. */
  persistBytes?: number;
  /** Least time between two progress reports for one file. Default 250 ms. */
  progressIntervalMs?: number;
}

/**
 * A downloader with the defaults both users share (30 s to headers, 60 s between body
 * bytes, 4 retries from 1 s up to 30 s apart), and the dispatcher it made when it was
 * given none (its owner closes that one).
 */
export function createDownloader(
  options: TransferOptions,
  parts: Pick<DownloaderSettings, "rows" | "io" | "logger" | "clock"> & { http: Pick<HttpSourceSettings, "headersForRedirect" | "statusError"> },
): { downloader: FileDownloader; dispatcher: Dispatcher; ownsDispatcher: boolean } {
  const headersTimeoutMs = options.headersTimeoutMs ?? 30_000;
  const bodyTimeoutMs = options.bodyTimeoutMs ?? 60_000;
  const ownsDispatcher = options.dispatcher === undefined;
  const dispatcher =
    options.dispatcher ?? new Agent({ connect: { timeout: options.connectTimeoutMs ?? 10_000 }, headersTimeout: headersTimeoutMs, bodyTimeout: bodyTimeoutMs });
  const retryDelayMs = Math.max(0, options.retryDelayMs ?? 1000);
  const downloader = new FileDownloader({
    ...parts,
    http: { ...parts.http, dispatcher, headersTimeoutMs, bodyTimeoutMs },
    retries: Math.max(0, options.retries ?? 4),
    retryDelayMs,
    maxRetryDelayMs: Math.max(retryDelayMs, options.maxRetryDelayMs ?? 30_000),
    persistIntervalMs: options.persistIntervalMs ?? 1000,
    persistBytes: options.persistBytes ?? 64 * 1024 * 1024,
    progressIntervalMs: options.progressIntervalMs ?? 250,
  });
  return { downloader, dispatcher, ownsDispatcher };
}

export class FileDownloader {
  readonly #settings: DownloaderSettings;
  /**
   * Hash state of partial files left by an earlier call in this process, so a retry after
   * a failed call continues hashing where it stopped instead of re-reading the prefix.
   */
  readonly #liveHashes = new Map<string, ContentHasher>();

  constructor(settings: DownloaderSettings) {
    this.#settings = settings;
  }

  /**
   * Downloads `spec` to `final`. `reuseFinal`: a final-named file left by a crash between
   * the rename and the row update holds bytes of this same source, to be verified rather
   * than fetched again. Resolves with the outcome (failures recorded in the row); rejects
   * with the abort reason when the fetch is stopped.
   */
  async download(context: FetchContext, spec: MirrorFetchFile, where: { final: string; active: ActiveFile; reuseFinal: boolean }): Promise<MirrorFileOutcome> {
    const { rows, logger, clock } = this.#settings;
    const { final, active } = where;
    const partial = final + PARTIAL_SUFFIX;
    const log = logger.child({ model: context.model, version: context.version, file: spec.path });
    const started = clock();
    await mkdir(path.dirname(final), { recursive: true });
    if ((await fileSize(final)) !== null) {
      // A final-named file without a current complete row: either bytes a crash left
      // between rename and row update (same source: resume from them, verified at the end),
      // or something else (another revision, a complete file that changed on disk): start over.
      if (where.reuseFinal && (await fileSize(partial)) === null) await rename(final, partial);
      else await rm(final, { force: true });
    }
    let written = (await fileSize(partial)) ?? 0;
    if (spec.size !== null && written > spec.size) {
      await this.discard(partial);
      written = 0;
    }
    const transfer: Transfer = {
      partial,
      written,
      hasher: await this.#resumeHasher(partial, written, spec),
      fetched: 0,
      resumedFrom: written,
      announcedSize: null,
      lastPersistAt: clock(),
      lastPersistBytes: written,
      persisting: Promise.resolve(),
      syncing: null,
      lastEventAt: 0,
    };
    active.state = "fetching";
    active.bytesDone = written;
    await rows.upsert(context, spec, { state: "fetching", bytes_done: written, error: null, actual_sha256: null });
    emitProgress(context, spec, active, logger);
    log.info({ resumeFrom: written, size: spec.size }, written > 0 ? "mirror fetch resuming" : "mirror fetch starting");

    try {
      await this.#transferWithRetries(context, spec, transfer, active);
      await transfer.persisting;
      await transfer.syncing;
      const result = await this.#finish(context, spec, transfer, final);
      if (result.state === "complete") log.info({ bytes: result.bytesTotal, fetched: transfer.fetched, ms: clock() - started }, "mirror file complete");
      return result;
    } catch (error) {
      await transfer.persisting;
      await transfer.syncing;
      // Keep the hash of what is on disk when it is exact, so a retry in this process resumes without re-reading.
      if (transfer.hasher.bytes === transfer.written && (await fileSize(partial)) === transfer.written) this.#liveHashes.set(partial, transfer.hasher);
      else this.#liveHashes.delete(partial);
      if (context.signal.aborted) {
        await rows
          .upsert(context, spec, {
            state: "pending",
            bytes_done: transfer.written,
            error: `Interrupted at ${transfer.written} of ${spec.size ?? "?"} bytes (${describeError(context.signal.reason)}); fetching the version again resumes from there.`,
            actual_sha256: null,
          })
          .catch((storeError: unknown) => log.warn({ err: describeError(storeError) }, "could not record an interrupted mirror fetch"));
        throw context.signal.reason ?? error;
      }
      const failure = error instanceof LlmgwError ? error : localFailure(error, { target: context, spec, partial, written: transfer.written });
      await rows.upsert(context, spec, { state: "failed", bytes_done: (await fileSize(partial)) ?? 0, error: failure.message, actual_sha256: null });
      emitProgress(context, spec, { state: "failed", bytesDone: active.bytesDone, bytesTotal: active.bytesTotal }, logger);
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

  /** Removes a partial file and forgets its hash state. */
  async discard(partial: string): Promise<void> {
    this.#liveHashes.delete(partial);
    await rm(partial, { force: true });
  }

  /** Forgets the hash state of partials below `folder` (a version being deleted). */
  forgetUnder(folder: string): void {
    for (const key of [...this.#liveHashes.keys()]) if (key.startsWith(folder + path.sep)) this.#liveHashes.delete(key);
  }

  /** The checks after the last byte: still the listed local file, the size, the hash; then rename and the complete row. */
  async #finish(context: FetchContext, spec: MirrorFetchFile, transfer: Transfer, final: string): Promise<MirrorFileOutcome> {
    const { rows, logger } = this.#settings;
    const { partial } = transfer;
    if (isLocalUrl(spec.url)) {
      // The copy came from the file as listed only if it is still that file now.
      const problem = localSourceChange(spec, await statLocalSource(spec));
      if (problem !== null) {
        await this.discard(partial);
        throw localSourceChangedError(spec, problem, "while it was being copied");
      }
    }
    const total = transfer.written;
    const expected = spec.size ?? transfer.announcedSize;
    if (expected !== null && total !== expected) {
      await this.discard(partial);
      throw new UpstreamError(
        `'${spec.path}' of ${context.model}/${context.version} is ${total} bytes, but ${spec.size !== null ? "the registry published" : "the source announced"} ${expected}. ` +
          `The partial download was removed; fetch again, and check the registry if it happens again.`,
        { code: "mirror_size_mismatch", retryable: true },
      );
    }
    await fsyncPath(partial, "r+");
    const digest = transfer.hasher.digest();
    const sums = { resumedFrom: transfer.resumedFrom, bytesFetched: transfer.fetched, bytesTotal: total, sha256: digest.sha256 };
    const mismatch = checksumProblem(spec, digest);
    if (mismatch !== null) {
      // Bytes that do not match cannot be resumed from: remove them so a retry starts clean.
      await this.discard(partial);
      const message =
        `Checksum mismatch for '${spec.path}' of ${context.model}/${context.version}: ${mismatch}. ` +
        `The downloaded bytes were removed and the file marked failed; fetch again to retry, and if it fails again the source's copy is bad.`;
      await rows.upsert(context, spec, { state: "failed", bytes_done: 0, error: message, actual_sha256: digest.sha256, bytes_total: total });
      logger.warn(
        { model: context.model, version: context.version, file: spec.path, expected: spec.sha256, actual: digest.sha256 },
        "mirror checksum mismatch",
      );
      return outcome(spec, { state: "failed", ...sums, error: { code: "mirror_checksum_mismatch", message, retryable: true } });
    }
    await rename(partial, final);
    await fsyncPath(path.dirname(final), "r");
    // What the file looks like now that its bytes matched: a later stat that differs means hash again.
    const stamp = await diskStamp(final);
    await rows.upsert(context, spec, { state: "complete", bytes_done: total, bytes_total: total, error: null, actual_sha256: digest.sha256, verified: stamp });
    emitProgress(context, spec, { state: "complete", bytesDone: total, bytesTotal: total }, logger);
    return outcome(spec, { state: "complete", ...sums });
  }

  /**
   * The hash state for a partial of `bytes` bytes: the one kept from an earlier call in
   * this process when it covers exactly those bytes, else computed by reading the prefix
   * once. That single read on resume after a restart is the only time a download reads
   * back what it wrote: a sha256 state cannot be saved across processes.
   */
  async #resumeHasher(partial: string, bytes: number, spec: MirrorFetchFile): Promise<ContentHasher> {
    const kept = this.#liveHashes.get(partial);
    this.#liveHashes.delete(partial);
    if (kept !== undefined && kept.bytes === bytes && kept.blobHeaderSize === blobHeaderSize(spec)) return kept;
    const hasher = new ContentHasher(blobHeaderSize(spec));
    await hashFileInto(partial, hasher, { bytes });
    return hasher;
  }

  async #transferWithRetries(context: FetchContext, spec: MirrorFetchFile, transfer: Transfer, active: ActiveFile): Promise<void> {
    const { retries, retryDelayMs, maxRetryDelayMs, logger, http } = this.#settings;
    for (let failures = 0; ; ) {
      const before = transfer.written;
      try {
        await this.#transferOnce(context, spec, transfer, active);
        return;
      } catch (error) {
        if (context.signal.aborted) throw context.signal.reason ?? error;
        const classified = classifyTransferError(error, { target: context, spec, headersTimeoutMs: http.headersTimeoutMs, bodyTimeoutMs: http.bodyTimeoutMs });
        // Attempts that moved the download forward do not use up the retry budget: a long
        // download over a flaky link keeps resuming as long as it makes progress.
        failures = transfer.written > before ? 1 : failures + 1;
        if (!(classified instanceof MirrorTransientError) || failures > retries) throw classified;
        const delay = backoffDelay(failures, { baseMs: retryDelayMs, maxMs: maxRetryDelayMs });
        logger.info(
          { model: context.model, version: context.version, file: spec.path, at: transfer.written, attempt: failures, delayMs: delay, err: classified.message },
          "mirror fetch interrupted; resuming",
        );
        if (classified.restartFromZero) {
          await this.discard(transfer.partial);
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
    const { io, logger } = this.#settings;
    const expected = spec.size;
    if (expected !== null && transfer.written === expected) return; // Everything is on disk; only verification is left.
    const offset = transfer.written;
    if (expected !== null) {
      // Checked before the request: nothing may be awaited between a response's headers
      // and reading its body, or a body that fails early would be lost unobserved.
      const free = await io.freeBytes(path.dirname(transfer.partial));
      if (free !== null && free < expected - offset) {
        throw diskFullError({ target: context, spec, partial: transfer.partial, written: offset, total: expected, free, cause: undefined });
      }
    }
    const source: Source = isLocalUrl(spec.url)
      ? await openLocalSource(spec, offset, context.signal)
      : await openHttpSource(spec, offset, context.signal, this.#settings.http);
    let append = offset > 0;
    if (source.start === 0 && offset > 0) {
      // The source ignored the Range (200): start over from its first byte.
      logger.info({ file: spec.path, offset }, "mirror source ignored the range; starting the file over");
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
    const sink = io.createWriteStream(transfer.partial, { flags: append ? "a" : "w", highWaterMark: WRITE_HIGH_WATER_MARK });
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
        throw localFailure(error.cause, { target: context, spec, partial: transfer.partial, written: onDisk, total: expected ?? source.total });
      }
      throw error instanceof LlmgwError || context.signal.aborted ? error : new SourceError(error, source.url);
    });
  }

  #progressed(context: FetchContext, spec: MirrorFetchFile, transfer: Transfer, active: ActiveFile): void {
    const { clock, persistIntervalMs, persistBytes, progressIntervalMs, rows, logger } = this.#settings;
    const now = clock();
    if (now - transfer.lastPersistAt >= persistIntervalMs || transfer.written - transfer.lastPersistBytes >= persistBytes) {
      transfer.lastPersistAt = now;
      transfer.lastPersistBytes = transfer.written;
      const bytes = transfer.written;
      // Start writing the file's dirty pages to disk now, in the background, so the fsync
      // before the rename has only the last few MiB left to flush (on the benchmark's disk
      // a cold fsync of 1 GiB takes ~0.75 s, a fifth of the whole download).
      if (transfer.syncing === null) {
        const done = (): void => {
          transfer.syncing = null;
        };
        transfer.syncing = fsyncPath(transfer.partial, "r+", true).then(done, done);
      }
      // One update at a time per file.
      transfer.persisting = transfer.persisting.then(() =>
        rows
          .recordProgress(context, spec.path, bytes)
          .catch((error: unknown) => logger.warn({ err: describeError(error), file: spec.path }, "could not record mirror progress")),
      );
    }
    if (context.onProgress !== undefined && now - transfer.lastEventAt >= progressIntervalMs) {
      transfer.lastEventAt = now;
      emitProgress(context, spec, active, logger);
    }
  }
}
