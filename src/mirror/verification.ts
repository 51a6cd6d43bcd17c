// Whether a complete file is still the bytes that were verified. Two levels:
//
// - The cheap check, a stat: listings, lookups and the file server compare the file's size
//   and mtime with those recorded when its bytes last matched. Missing or resized: not
//   complete any more. Same size, other mtime: not served until its bytes are hashed again
//   (serving it under the old sha256 as ETag would vouch for bytes nobody checked).
// - The re-hash: `ctl mirror verify` (every file in scope), and a fetch of a version that
//   is already complete (only files whose stat changed). A match records the new stat; a
//   mismatch marks the row failed with both hashes in its error.
//
// In a cluster each server verifies only its own copy. A row that describes this server's
// disk is handled as above, except that when other servers hold verified copies, a bad
// copy here only drops this server's holder row (the row stays complete for them). A copy
// of a row that describes another server's disk is checked against its holder row and
// never changes the row (mirror-holders.ts).
import { ConflictError, NotFoundError, describeError, type LlmgwError } from "../core/errors.ts";
import { clause } from "../core/format.ts";
import type { Logger } from "../core/log.ts";
import { ContentHasher, hashFileInto } from "./content-hash.ts";
import { diskStamp, type DiskStamp } from "./disk-files.ts";
import { isOwnRow } from "./mirror-holders.ts";
import type { MirrorRow, MirrorRows } from "./mirror-rows.ts";
import { fileKey } from "./mirror-paths.ts";
import type { MirrorFetchFile, MirrorFileOutcome, VerifyFileResult, VerifyOptions, VerifySummary } from "./mirror-types.ts";
import { outcome, type FetchContext } from "./fetch-input.ts";

/** What is wrong with a complete row's file on disk, found with a stat; null when it looks as verified. */
export function diskProblem(row: MirrorRow, final: string, stamp: DiskStamp | null): LlmgwError | null {
  const what = `'${row.file}' of ${row.model}/${row.version}`;
  if (stamp === null) {
    return new NotFoundError(`The mirrored file ${what} is missing on disk (${final}); fetch the version again.`, { code: "mirror_file_missing" });
  }
  if (stamp.size !== row.bytes_total) {
    return new NotFoundError(`The mirrored file ${what} is ${stamp.size} bytes on disk instead of ${row.bytes_total} (${final}); fetch the version again.`, {
      code: "mirror_file_missing",
    });
  }
  // Rows verified before the stamp existed are stamped by recover() at the next start.
  if (row.verified_size !== null && (row.verified_size !== stamp.size || row.verified_mtime_ns !== stamp.mtimeNs)) {
    return new ConflictError(
      `The mirrored file ${what} was modified on disk (at ${nsToIso(stamp.mtimeNs)}) after its bytes were verified${row.verified_at === null ? "" : ` (at ${row.verified_at})`}, ` +
        `so it is not served until they are hashed again: run 'llmgw ctl mirror verify ${row.model} ${row.version}' (POST /api/v1/mirror/verify), or fetch the version again.`,
      { code: "mirror_file_changed" },
    );
  }
  return null;
}

/**
 * The sha256 a file must have: the one the registry published, when it published one;
 * otherwise (a local source) the one computed when it was copied in. Never the digest of
 * a download that failed its check (a failed row keeps that digest for its message).
 */
export function verifiedSha256(row: MirrorRow): string | null {
  return row.sha256 ?? row.actual_sha256;
}

export type RehashResult =
  | { kind: "missing" }
  /** The file changed while it was read; nothing can be said about it now. */
  | { kind: "moving" }
  | { kind: "hashed"; sha256: string; stamp: DiskStamp };

/** Reads a file once and hashes it, with the stat before and after so a file changing meanwhile is noticed. */
export async function rehash(final: string, options: { signal?: AbortSignal; onBytes?: (done: number) => void } = {}): Promise<RehashResult> {
  const before = await diskStamp(final);
  if (before === null) return { kind: "missing" };
  const hasher = new ContentHasher(null);
  try {
    await hashFileInto(final, hasher, options);
  } catch (error) {
    if (options.signal?.aborted === true) throw options.signal.reason ?? error;
    if ((await diskStamp(final)) === null) return { kind: "missing" };
    throw error;
  }
  const after = await diskStamp(final);
  if (after === null) return { kind: "missing" };
  if (after.size !== before.size || after.mtimeNs !== before.mtimeNs || hasher.bytes !== after.size) return { kind: "moving" };
  return { kind: "hashed", sha256: hasher.digest().sha256, stamp: after };
}

/** The error a row gets when its bytes on disk no longer match. */
export function mismatchMessage(row: MirrorRow, expected: string, actual: string): string {
  return (
    `The bytes of '${row.file}' of ${row.model}/${row.version} on disk no longer match: they were verified with sha256 ${expected}, ` +
    `the file now has sha256 ${actual}. It is not served any more; fetch the version again to replace it.`
  );
}

/**
 * The outcome of a fetched file that is already complete for this revision and published
 * hash and still holds those bytes: skipped as it is when its stat is as verified, or
 * hashed again first when its size or mtime changed since (and its new stat recorded when
 * it still matches). Null when it has to be fetched.
 */
export async function keepIfStillVerified(
  deps: Pick<VerifierDeps, "rows" | "logger">,
  row: MirrorRow,
  fetching: { context: FetchContext; spec: MirrorFetchFile; final: string },
): Promise<MirrorFileOutcome | null> {
  const { context, spec, final } = fetching;
  if (row.state !== "complete" || row.revision !== context.revision || row.sha256 !== spec.sha256) return null;
  if (spec.size !== null && row.bytes_total !== spec.size) return null;
  const expected = verifiedSha256(row);
  const problem = diskProblem(row, final, await diskStamp(final));
  const kept = outcome(spec, { state: "complete", skipped: true, bytesTotal: row.bytes_total, sha256: expected });
  if (problem === null) return kept;
  if (problem.code !== "mirror_file_changed" || expected === null) return null;
  const again = await rehash(final, { signal: context.signal });
  const where = { model: row.model, version: row.version, file: row.file };
  if (again.kind === "hashed" && again.sha256 === expected && again.stamp.size === row.bytes_total) {
    await deps.rows.markVerified(row, expected, again.stamp);
    deps.logger.info(where, "mirror file changed on disk but still matches its sha256");
    return { ...kept, reverified: true };
  }
  deps.logger.warn(
    { ...where, expected, actual: again.kind === "hashed" ? again.sha256 : again.kind },
    "mirror file changed on disk and no longer matches; fetching it again",
  );
  return null;
}

export interface VerifierDeps {
  rows: MirrorRows;
  logger: Logger;
  finalPath: (model: string, version: string, file: string) => string;
  /** True while this process fetches (or is about to fetch) the file. */
  isFetching: (key: string) => boolean;
  /** Runs `task` in the file's lane: after any running task of that file, and before the next one. */
  exclusive: <T>(key: string, task: () => Promise<T>) => Promise<T>;
}

/** Hashes each row's file again and records the result in its row. */
export async function verifyRows(deps: VerifierDeps, rows: MirrorRow[], options: VerifyOptions & { signal: AbortSignal }): Promise<VerifySummary> {
  const results: VerifyFileResult[] = [];
  for (const row of rows) {
    options.signal.throwIfAborted();
    const key = fileKey(row.model, row.version, row.file);
    const result = deps.isFetching(key)
      ? skipped(row, "it is being fetched now; verify it again once the fetch is done")
      : await deps.exclusive(key, () => verifyOne(deps, row, options));
    results.push(result);
    options.onFile?.(result);
  }
  return {
    files: results,
    ok: results.filter((r) => r.result === "ok").length,
    failed: results.filter((r) => r.result === "failed").length,
    skipped: results.filter((r) => r.result === "skipped").length,
    bytesHashed: results.reduce((sum, r) => sum + (r.actualSha256 === null ? 0 : (r.bytes ?? 0)), 0),
  };
}

async function verifyOne(deps: VerifierDeps, listed: MirrorRow, options: VerifyOptions & { signal: AbortSignal }): Promise<VerifyFileResult> {
  // Read again inside the file's lane: a fetch that ran meanwhile may have changed it.
  const row = await deps.rows.get(listed.model, listed.version, listed.file);
  if (row === undefined) return skipped(listed, "it was deleted meanwhile");
  const expected = verifiedSha256(row);
  const final = deps.finalPath(row.model, row.version, row.file);
  const self = deps.rows.self;
  // A row from before clusters whose file is not on this disk is some other server's.
  const own = isOwnRow(row, self) && !(self !== null && row.fetched_by === null && (await diskStamp(final)) === null);
  if (!own && self !== null) return verifyHeldCopy(deps, row, options, self);
  // A failed file that is on disk under its final name (it failed a verification, or its
  // refetch failed and left it there) is checked again against the sha256 it must have:
  // it may have been restored, and a match makes it complete again.
  if (row.state !== "complete" && !(row.state === "failed" && expected !== null && (await diskStamp(final)) !== null)) {
    return skipped(row, `it is not complete (${row.state}${row.error === null ? "" : `: ${clause(row.error)}`})`);
  }
  if (expected === null) return skipped(row, "no sha256 was recorded for it");
  const bytesTotal = row.bytes_total ?? 0;
  const outcome = await rehash(final, {
    signal: options.signal,
    onBytes: (done) => options.onProgress?.({ model: row.model, version: row.version, file: row.file, bytesDone: done, bytesTotal }),
  });
  const base = { model: row.model, version: row.version, file: row.file, expectedSha256: expected };
  if (outcome.kind !== "moving" && !(outcome.kind === "hashed" && outcome.sha256 === expected && outcome.stamp.size === row.bytes_total)) {
    const kept = await keepForOthers(
      deps,
      row,
      expected,
      self,
      outcome.kind === "missing" ? `is missing on disk (${final})` : `has sha256 ${outcome.sha256}, not ${expected}`,
    );
    if (kept !== null)
      return {
        ...base,
        result: "failed",
        actualSha256: outcome.kind === "hashed" ? outcome.sha256 : null,
        bytes: outcome.kind === "hashed" ? outcome.stamp.size : null,
        message: kept,
      };
  }
  if (outcome.kind === "missing") {
    const message = `The mirrored file '${row.file}' of ${row.model}/${row.version} is missing on disk (${final}); fetch the version again.`;
    await deps.rows.update(row, { state: "failed", bytes_done: 0, error: message });
    return { ...base, result: "failed", actualSha256: null, bytes: null, message };
  }
  if (outcome.kind === "moving") return skipped(row, "it changed while it was read; verify it again");
  if (outcome.sha256 === expected && outcome.stamp.size === row.bytes_total) {
    if (!(await deps.rows.markVerified(row, expected, outcome.stamp))) return skipped(row, "it was deleted meanwhile");
    return { ...base, result: "ok", actualSha256: outcome.sha256, bytes: outcome.stamp.size, message: null };
  }
  const message = mismatchMessage(row, expected, outcome.sha256);
  await deps.rows.update(row, { state: "failed", bytes_done: 0, error: message });
  deps.logger.warn({ model: row.model, version: row.version, file: row.file, expected, actual: outcome.sha256 }, "mirror file no longer matches its sha256");
  return { ...base, result: "failed", actualSha256: outcome.sha256, bytes: outcome.stamp.size, message };
}

/**
 * In a cluster, a bad copy on this server of a file other servers hold verified: only this
 * server's holder row goes (the row stays complete, and they go on serving it). Returns the
 * result's message, or null when nobody else holds it (the row is failed as on one server).
 */
async function keepForOthers(deps: VerifierDeps, row: MirrorRow, expected: string, self: string | null, what: string): Promise<string | null> {
  if (self === null) return null;
  const others = (await deps.rows.holders(row)).filter((holder) => holder.server !== self && holder.sha256 === expected).map((holder) => `'${holder.server}'`);
  if (others.length === 0) return null;
  await deps.rows.dropHeld(row);
  deps.logger.warn(
    { model: row.model, version: row.version, file: row.file, server: self },
    "this server's mirror copy no longer matches; other servers hold it",
  );
  return (
    `This server's ('${self}') copy of '${row.file}' of ${row.model}/${row.version} ${what}: it is not served from here any more. ` +
    `${others.join(", ")} hold${others.length === 1 ? "s" : ""} verified copies; copy one here with 'llmgw ctl mirror replicate ${row.model} ${row.version} --to ${self}'.`
  );
}

/** Verifies this server's copy of a file whose row describes another server's disk, against its holder row; the row is never changed. */
async function verifyHeldCopy(deps: VerifierDeps, row: MirrorRow, options: VerifyOptions & { signal: AbortSignal }, self: string): Promise<VerifyFileResult> {
  const expected = verifiedSha256(row);
  const final = deps.finalPath(row.model, row.version, row.file);
  const mine = (await deps.rows.holders(row)).find((holder) => holder.server === self);
  const replicate = `'llmgw ctl mirror replicate ${row.model} ${row.version} --to ${self}' copies it here`;
  if (mine === undefined && (await diskStamp(final)) === null) {
    return skipped(
      row,
      `this server ('${self}') holds no copy of it${row.fetched_by === null ? "" : ` (server '${row.fetched_by}' fetched it)`}; ${replicate}`,
    );
  }
  if (row.state !== "complete" || expected === null) return skipped(row, `it is not complete (${row.state})`);
  const outcome = await rehash(final, {
    signal: options.signal,
    onBytes: (done) => options.onProgress?.({ model: row.model, version: row.version, file: row.file, bytesDone: done, bytesTotal: row.bytes_total ?? 0 }),
  });
  const base = { model: row.model, version: row.version, file: row.file, expectedSha256: expected };
  if (outcome.kind === "moving") return skipped(row, "it changed while it was read; verify it again");
  if (outcome.kind === "hashed" && outcome.sha256 === expected && outcome.stamp.size === row.bytes_total) {
    await deps.rows.recordHeld(row, expected, outcome.stamp.size);
    return { ...base, result: "ok", actualSha256: outcome.sha256, bytes: outcome.stamp.size, message: null };
  }
  await deps.rows.dropHeld(row);
  const what = outcome.kind === "missing" ? `is missing on disk (${final})` : `has sha256 ${outcome.sha256}, not ${expected}`;
  deps.logger.warn({ model: row.model, version: row.version, file: row.file, server: self }, "this server's copy of a mirror file is bad");
  return {
    ...base,
    result: "failed",
    actualSha256: outcome.kind === "hashed" ? outcome.sha256 : null,
    bytes: outcome.kind === "hashed" ? outcome.stamp.size : null,
    message: `This server's ('${self}') copy of '${row.file}' of ${row.model}/${row.version} ${what}: it is not served from here any more (other servers' copies are not affected); ${replicate}.`,
  };
}

function skipped(row: MirrorRow, why: string): VerifyFileResult {
  return {
    model: row.model,
    version: row.version,
    file: row.file,
    result: "skipped",
    expectedSha256: verifiedSha256(row),
    actualSha256: null,
    bytes: row.bytes_total,
    message: `Not verified: ${why}.`,
  };
}

function nsToIso(ns: string): string {
  try {
    return new Date(Number(BigInt(ns) / 1_000_000n)).toISOString();
  } catch (error) {
    return `an unreadable time (${describeError(error)})`;
  }
}
