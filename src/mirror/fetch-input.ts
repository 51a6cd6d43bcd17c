// What a fetch is given and what it gives back: the checks of its input (names, URLs,
// hashes, sizes), the context the files of one call share, and each file's outcome with
// the summary of the call.
import { BadRequestError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { validateMirrorFile } from "./mirror-paths.ts";
import type { FetchVersionSummary, MirrorFetchFile, MirrorFileOutcome, MirrorFileState, MirrorProgressEvent } from "./mirror-types.ts";

/** What the files of one fetchVersion call share. */
export interface FetchContext {
  model: string;
  version: string;
  repo: string;
  revision: string;
  signal: AbortSignal;
  onProgress: ((event: MirrorProgressEvent) => void) | undefined;
}

/** A file in flight in this process (queued or downloading), as listings show it. */
export interface ActiveFile {
  state: "pending" | "fetching";
  bytesDone: number;
  bytesTotal: number | null;
}

/** Progress of one file, as `emitProgress` reports it. */
export type ProgressState = { state: MirrorFileState; bytesDone: number; bytesTotal: number | null };

const SHA256_HEX = /^[0-9a-f]{64}$/;
const BLOB_ID_HEX = /^[0-9a-f]{40}$/;

export function validateFetchFiles(files: unknown): MirrorFetchFile[] {
  if (!Array.isArray(files) || files.length === 0)
    throw new BadRequestError("fetchVersion needs at least one file.", { code: "invalid_field", param: "files" });
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
      throw new BadRequestError(`The sha256 of '${file.path}' must be 64 lowercase hex characters or null.`, {
        code: "invalid_field",
        param: `${where}.sha256`,
      });
    }
    if (file.size !== null && !(Number.isSafeInteger(file.size) && file.size >= 0)) {
      throw new BadRequestError(`The size of '${file.path}' must be a non-negative integer or null.`, { code: "invalid_field", param: `${where}.size` });
    }
    if (file.gitBlobId !== undefined && file.gitBlobId !== null && !BLOB_ID_HEX.test(file.gitBlobId)) {
      throw new BadRequestError(`The git blob id of '${file.path}' must be 40 lowercase hex characters.`, {
        code: "invalid_field",
        param: `${where}.gitBlobId`,
      });
    }
    if (file.sourceMtimeMs !== undefined && file.sourceMtimeMs !== null && !(Number.isFinite(file.sourceMtimeMs) && url.protocol === "file:")) {
      throw new BadRequestError(`The source mtime of '${file.path}' must be a number, and is only for file: URLs.`, {
        code: "invalid_field",
        param: `${where}.sourceMtimeMs`,
      });
    }
    return file;
  });
}

export function outcome(spec: MirrorFetchFile, fields: Partial<MirrorFileOutcome> & Pick<MirrorFileOutcome, "state">): MirrorFileOutcome {
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

export function summarize(context: FetchContext, files: MirrorFileOutcome[]): FetchVersionSummary {
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

/** Tells the caller's progress listener about a file; a listener that throws is logged, never fatal. */
export function emitProgress(context: FetchContext, spec: MirrorFetchFile, progress: ProgressState, logger: Logger): void {
  if (context.onProgress === undefined) return;
  try {
    context.onProgress({
      model: context.model,
      version: context.version,
      file: spec.path,
      state: progress.state,
      bytesDone: progress.bytesDone,
      bytesTotal: progress.bytesTotal,
    });
  } catch (error) {
    logger.warn({ err: describeError(error) }, "a mirror progress listener threw");
  }
}
