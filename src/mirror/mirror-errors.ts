// How the mirror names what went wrong while fetching: a transient source failure (retried,
// resuming), a full disk (with the bytes needed and where), a local write failure, and a
// transport failure classified once, at the boundary, into one of those.
import path from "node:path";
import { LlmgwError, UpstreamError, describeError, errorCode } from "../core/errors.ts";
import type { MirrorFetchFile } from "./mirror-types.ts";

/** Which version a failing file belongs to, for messages. */
export interface FetchTarget {
  model: string;
  version: string;
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
export class WriteError extends Error {
  constructor(override readonly cause: unknown) {
    super(describeError(cause));
  }
}

/** A transport failure before classification, remembering which URL (after redirects) failed. */
export class SourceError extends Error {
  constructor(
    override readonly cause: unknown,
    readonly url: string,
  ) {
    super(describeError(cause));
  }
}

/** Scheme, host and port only: a signed CDN URL's query is a credential and stays out of messages. */
export function origin(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return "the source";
  }
}

export function diskFullError(options: {
  target: FetchTarget;
  spec: MirrorFetchFile;
  partial: string;
  written: number;
  total: number | null;
  free: number | null;
  cause: unknown;
}): LlmgwError {
  const { target, spec, partial, written, total, free } = options;
  const needed = total === null ? "an unknown number of" : String(Math.max(0, total - written));
  const freeText = free === null ? "" : ` (${free} bytes free there)`;
  return new LlmgwError({
    message:
      `The disk holding the mirror is full: '${spec.path}' of ${target.model}/${target.version} needs ${needed} more bytes ` +
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
export function localFailure(
  error: unknown,
  where: { target: FetchTarget; spec: MirrorFetchFile; partial: string; written: number; total?: number | null },
): LlmgwError {
  const code = errorCode(error);
  if (code === "ENOSPC" || code === "EDQUOT") {
    return diskFullError({ ...where, total: where.total ?? where.spec.size, free: null, cause: error });
  }
  const what = `'${where.spec.path}' of ${where.target.model}/${where.target.version}`;
  if (typeof error !== "object" || error === null || !("syscall" in error)) {
    return new LlmgwError({
      message: `Mirroring ${what} failed: ${describeError(error)}. The server log has details; fetch again.`,
      code: "mirror_failed",
      status: 500,
      type: "server_error",
      cause: error,
    });
  }
  return new LlmgwError({
    message: `Writing ${what} to ${where.partial} failed (${code ?? "error"}): ${describeError(error)}. Check the mirror folder's disk and permissions, then fetch again.`,
    code: "mirror_write_failed",
    status: 500,
    type: "server_error",
    cause: error,
  });
}

/**
 * A failure of a transfer attempt as an llmgw error. Transport failures (timeouts, resets,
 * refused connections) become retryable `MirrorTransientError`s that say which timeout.
 */
export function classifyTransferError(
  error: unknown,
  where: { target: FetchTarget; spec: MirrorFetchFile; headersTimeoutMs: number; bodyTimeoutMs: number },
): LlmgwError {
  if (error instanceof LlmgwError) return error;
  const { target, spec } = where;
  const url = error instanceof SourceError ? error.url : spec.url;
  const cause = error instanceof SourceError ? error.cause : error;
  const code = errorCode(cause);
  const what = `downloading '${spec.path}' of ${target.model}/${target.version} from ${origin(url)}`;
  const timeouts: Record<string, string> = {
    UND_ERR_CONNECT_TIMEOUT: "timed out connecting",
    UND_ERR_HEADERS_TIMEOUT: `got no response headers within ${where.headersTimeoutMs} ms`,
    UND_ERR_BODY_TIMEOUT: `sent nothing for ${where.bodyTimeoutMs} ms mid-body`,
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
