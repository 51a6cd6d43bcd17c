// Copies of mirror files from their origin (the registry they were first fetched from), for
// a server of a cluster asked for a file that no running server holds: the holders were
// killed or lost, and a node that waits for them would wait for as long as they stay
// away, although the origin still has the bytes. The server the node asked fetches the
// file itself, from the row's `source_url` with the registry's headers (a gated
// repository's token stays on the server: the node never talks to the origin), checks it
// against the sha256 the row says it must have, exactly as the first fetch did, and
// becomes a holder of it (the shared row is not touched, as for a copy from another
// holder: replicate.ts), so every later request is served from its disk.
//
// A node is never kept on the line meanwhile: the file server answers 503 with the copy's
// progress and asks again a moment later (mirror-file-server.ts). A copy that failed is not
// tried again for RETRY_AFTER_FAILURE_MS, so many nodes asking at once do not hammer an
// origin that is down. A file whose source is a local path (`file:`) has no origin another
// server can read: nodes wait for a holder.
import { UnavailableError, describeError, type LlmgwError } from "../core/errors.ts";
import { clause, formatBytes } from "../core/format.ts";
import type { Logger } from "../core/log.ts";
import type { FileDownloader } from "./file-download.ts";
import type { ActiveFile, FetchContext } from "./fetch-input.ts";
import { origin } from "./mirror-errors.ts";
import { fileKey } from "./mirror-paths.ts";
import type { MirrorRow } from "./mirror-rows.ts";
import type { MirrorFetchFile, MirrorFileCheck } from "./mirror-types.ts";
import { verifiedSha256 } from "./verification.ts";

/** How long a failed copy from the origin keeps its failure before a request starts another. */
export const RETRY_AFTER_FAILURE_MS = 10_000;

/** Where a file's copy from its origin stands, as the file server tells a node. */
export type OriginCopyState =
  /** Under way: bytes so far of the file's size, from where. */
  | { state: "fetching"; from: string; bytesDone: number; bytesTotal: number | null }
  /** The last copy failed, and the next one may start from `retryAt` (epoch ms). */
  | { state: "failed"; from: string; error: LlmgwError; retryAt: number }
  /** No origin another server can read: why. */
  | { state: "none"; why: string };

export interface OriginCopiesDeps {
  /** A downloader whose rows are `holderRows` (replicate.ts): it never writes the shared row's progress. */
  downloader: FileDownloader;
  finalPath: (model: string, version: string, file: string) => string;
  /** Whether this server can serve the file now (Mirror.check): a copy that finds it served already does nothing. */
  check: (model: string, version: string, file: string) => Promise<MirrorFileCheck>;
  /** Runs one file's copy in that file's lane, with a download slot. */
  run: <T>(key: string, task: () => Promise<T>) => Promise<T>;
  /** The registry's headers for a request to a URL (its token only on its own origin); none when absent. */
  originHeaders?: ((url: string) => Record<string, string>) | undefined;
  /** Aborted when the mirror closes. */
  closing: AbortSignal;
  /** The copy in the background, so the mirror's close() waits for it. */
  track: (work: Promise<unknown>) => void;
  logger: Logger;
  clock: () => number;
}

interface Failure {
  from: string;
  error: LlmgwError;
  at: number;
}

export class OriginCopies {
  readonly #deps: OriginCopiesDeps;
  readonly #active = new Map<string, { from: string; file: ActiveFile }>();
  readonly #failed = new Map<string, Failure>();

  constructor(deps: OriginCopiesDeps) {
    this.#deps = deps;
  }

  /**
   * Where the copy of a complete row's file from its origin stands; starts one when none
   * runs (and the last failure is older than RETRY_AFTER_FAILURE_MS). Never waits for the
   * bytes.
   */
  request(row: MirrorRow): OriginCopyState {
    const key = fileKey(row.model, row.version, row.file);
    const from = origin(row.source_url);
    if (!/^https?:/i.test(row.source_url)) {
      return {
        state: "none",
        why: `its source is a local file on the server that fetched it${row.fetched_by === null ? "" : ` ('${row.fetched_by}')`}, which no other server can read`,
      };
    }
    const active = this.#active.get(key);
    if (active !== undefined) return { state: "fetching", from, bytesDone: active.file.bytesDone, bytesTotal: active.file.bytesTotal };
    const failed = this.#failed.get(key);
    const now = this.#deps.clock();
    if (failed !== undefined && now - failed.at < RETRY_AFTER_FAILURE_MS)
      return { state: "failed", from: failed.from, error: failed.error, retryAt: failed.at + RETRY_AFTER_FAILURE_MS };
    if (this.#deps.closing.aborted) return { state: "none", why: "this server is shutting down" };
    const file: ActiveFile = { state: "pending", bytesDone: 0, bytesTotal: row.bytes_total };
    this.#active.set(key, { from, file });
    const work = this.#copy(row, file)
      .then(
        (error) => {
          if (error === null) this.#failed.delete(key);
          else this.#failed.set(key, { from, error, at: this.#deps.clock() });
        },
        (error: unknown) => {
          // Only the mirror's close ends a copy this way; the next request after a restart starts over.
          this.#deps.logger.info({ model: row.model, version: row.version, file: row.file, err: describeError(error) }, "mirror copy from the origin stopped");
        },
      )
      .finally(() => this.#active.delete(key));
    this.#deps.track(work);
    return { state: "fetching", from, bytesDone: 0, bytesTotal: row.bytes_total };
  }

  /** Copies the file in its lane; resolves with the failure, or null when this server holds it now. */
  async #copy(row: MirrorRow, active: ActiveFile): Promise<LlmgwError | null> {
    const { model, version, file } = row;
    const key = fileKey(model, version, file);
    const sha256 = verifiedSha256(row);
    const log = this.#deps.logger.child({ model, version, file, from: origin(row.source_url) });
    return this.#deps.run(key, async () => {
      // Another request's copy (or a holder's return) may have made the file servable while this one queued.
      if ((await this.#deps.check(model, version, file)).kind === "ok") return null;
      const spec: MirrorFetchFile = {
        path: file,
        url: row.source_url,
        sha256,
        size: row.bytes_total,
        headers: this.#deps.originHeaders?.(row.source_url) ?? {},
      };
      const context: FetchContext = { model, version, repo: row.repo, revision: row.revision, signal: this.#deps.closing, onProgress: undefined };
      log.warn({ bytes: row.bytes_total }, "no running server holds this mirror file; fetching it from its origin");
      const outcome = await this.#deps.downloader.download(context, spec, { final: this.#deps.finalPath(model, version, file), active, reuseFinal: false });
      if (outcome.state === "complete") {
        log.info({ bytes: outcome.bytesTotal, fetched: outcome.bytesFetched }, "mirror file copied from its origin; this server holds it now");
        return null;
      }
      const message = outcome.error?.message ?? "no reason was given";
      log.warn({ code: outcome.error?.code, err: message }, "could not copy a mirror file from its origin");
      return new UnavailableError(message, { code: outcome.error?.code ?? "mirror_origin_failed" });
    });
  }
}

/** The copy's state as the sentence a node's 503 ends with. */
export function describeOriginCopy(state: OriginCopyState, clock: () => number = Date.now): string {
  if (state.state === "fetching") {
    const total = state.bytesTotal === null ? "" : ` of ${formatBytes(state.bytesTotal)}`;
    return `This server is fetching it from its origin (${state.from}) meanwhile: ${formatBytes(state.bytesDone)}${total} so far. Ask again in a few seconds.`;
  }
  if (state.state === "failed") {
    const seconds = Math.max(1, Math.ceil((state.retryAt - clock()) / 1000));
    return `Fetching it from its origin (${state.from}) failed: ${clause(state.error.message)}. This server tries the origin again on a request in ${seconds} s.`;
  }
  return `It cannot be fetched from elsewhere: ${state.why}.`;
}
