// Startup repair of the mirror, before anything fetches or serves: what a stopped (or
// killed) process left behind is turned into honest rows, so nothing half-written is ever
// presented as complete and every interrupted download can resume.
//
// Only the server that owns a mirror root may run this. On a PostgreSQL shared by several
// servers (a cluster) the rows are shared but the files and the in-flight map are not, so
// a server repairs only the rows that describe its own disk: `fetched_by` is its name, or
// null (a row from before clusters). A row another server fetched, or is fetching now, is
// never touched: that server repairs it at its own start. Of those rows this server only
// checks its own copies (its holder rows), and drops the holder row of a copy that is gone.
//
// In a cluster it also upgrades rows from before holder rows (a complete file this server
// has, as verified, becomes its row with its holder row), and removes version folders
// that have no rows left: a version deleted by another server, whose delete removed only
// that server's files (Mirror.deleteVersion).
import { rename, rm, rmdir, unlink } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "../core/log.ts";
import { diskStamp, fileSize, listDir } from "./disk-files.ts";
import { heldCopyProblem, isOwnRow } from "./mirror-holders.ts";
import { PARTIAL_SUFFIX, fileKey } from "./mirror-paths.ts";
import type { MirrorRow, MirrorRows } from "./mirror-rows.ts";
import type { RecoverSummary } from "./mirror-types.ts";
import { diskProblem, verifiedSha256 } from "./verification.ts";

export interface RecoveryDeps {
  rows: MirrorRows;
  logger: Logger;
  /** The final path of a file; throws for a name that is no longer valid. */
  finalPath: (model: string, version: string, file: string) => string;
  /** True while this process works on the file. */
  isActive: (key: string) => boolean;
  /** The mirror's folder; in a cluster, version folders without rows below it are removed. */
  root?: string;
}

/**
 * Rows a stopped process left `fetching` become `pending` with `bytes_done` set to the
 * size of their `.partial` (so they list as incomplete and resume from there); `complete`
 * rows whose file is gone or has another size become `failed`; a file under its final
 * name whose row is not `complete` (a crash between the rename and the row update) is
 * moved back to `.partial`, where the next fetch verifies it before presenting it (a
 * `failed` row's file is left where it is).
 * Complete rows verified before their disk stamp was recorded get one now, from the file
 * as it is (the size check above is what vouched for them until then).
 */
export async function recoverRows(deps: RecoveryDeps): Promise<RecoverSummary> {
  const self = deps.rows.self;
  const summary: RecoverSummary = { interrupted: 0, missing: 0, unconfirmed: 0, ...(self === null ? {} : { claimed: 0, dropped: 0, orphans: 0 }) };
  // Folders are listed before the rows are read, so a version whose rows appear meanwhile is kept.
  const folders = self === null || deps.root === undefined ? [] : await versionFolders(deps.root);
  const rows = await deps.rows.list();
  for (const row of rows) {
    if (deps.isActive(fileKey(row.model, row.version, row.file))) continue;
    let final: string;
    try {
      final = deps.finalPath(row.model, row.version, row.file);
    } catch {
      continue; // A row with a name that is no longer valid is never served.
    }
    const partial = final + PARTIAL_SUFFIX;
    if (!isOwnRow(row, self)) {
      if (await dropGoneCopy(deps, row, final)) summary.dropped = (summary.dropped ?? 0) + 1;
      continue;
    }
    if (row.state === "complete") {
      const stamp = await diskStamp(final);
      // A row from before clusters whose file is not here may be another server's, which claims it at its start.
      if (self !== null && row.fetched_by === null && stamp === null) continue;
      if (stamp === null || stamp.size !== row.bytes_total) {
        // Other servers hold verified copies: only this server's copy is gone, and its holder row with it.
        if (self !== null && (await othersHold(deps, row))) {
          await deps.rows.dropHeld(row);
          summary.dropped = (summary.dropped ?? 0) + 1;
          continue;
        }
        summary.missing += 1;
        await deps.rows.update(row, {
          state: "failed",
          error: `The mirrored file is ${stamp === null ? "missing" : `${stamp.size} bytes instead of ${row.bytes_total}`} on disk (${final}); fetch the version again.`,
        });
      } else if (row.verified_size === null && row.actual_sha256 !== null) {
        await deps.rows.markVerified(row, row.actual_sha256, stamp);
      } else if (self !== null && row.fetched_by === null && (await claimLegacy(deps, row, final))) {
        summary.claimed = (summary.claimed ?? 0) + 1;
      }
      continue;
    }
    // A failed row's final-named file failed a verification: it stays for the operator to
    // look at, and the next fetch replaces it (never resumes from it).
    if (row.state === "failed") continue;
    if ((await fileSize(final)) !== null) {
      summary.unconfirmed += 1;
      if ((await fileSize(partial)) === null) await rename(final, partial);
      else await unlink(final);
    }
    if (row.state === "fetching") {
      summary.interrupted += 1;
      const size = (await fileSize(partial)) ?? 0;
      await deps.rows.update(row, {
        state: "pending",
        bytes_done: size,
        error: `Interrupted at ${size} of ${row.bytes_total ?? "?"} bytes when the server stopped; fetching the version again resumes from there.`,
      });
    }
  }
  if (folders.length > 0) {
    const tracked = await deps.rows.versionKeys();
    for (const folder of folders) {
      if (tracked.has(fileKey(folder.model, folder.version, ""))) continue;
      await rm(folder.path, { recursive: true, force: true });
      await rmdir(path.dirname(folder.path)).catch(() => undefined);
      summary.orphans = (summary.orphans ?? 0) + 1;
    }
  }
  const changed = summary.interrupted + summary.missing + summary.unconfirmed + (summary.claimed ?? 0) + (summary.dropped ?? 0) + (summary.orphans ?? 0);
  if (changed > 0) deps.logger.info(summary, "mirror recovered after restart");
  return summary;
}

/** Drops this server's holder row of another server's file when its copy here is gone or resized; true when it did. */
async function dropGoneCopy(deps: RecoveryDeps, row: MirrorRow, final: string): Promise<boolean> {
  const self = deps.rows.self;
  if (self === null) return false;
  const mine = (await deps.rows.holders(row)).find((holder) => holder.server === self);
  if (mine === undefined) return false;
  // A copy modified since it was verified keeps its row: check() refuses it until a verification.
  const problem = heldCopyProblem(row, mine, final, await diskStamp(final));
  if (problem === null || problem.code !== "mirror_file_missing") return false;
  await deps.rows.dropHeld(row);
  deps.logger.info({ model: row.model, version: row.version, file: row.file, server: self }, `this server's mirror copy is gone: ${problem.message}`);
  return true;
}

async function othersHold(deps: RecoveryDeps, row: MirrorRow): Promise<boolean> {
  const sha256 = verifiedSha256(row);
  return (await deps.rows.holders(row)).some((holder) => holder.server !== deps.rows.self && holder.sha256 === sha256);
}

/** A complete row from before holder rows whose file this server has, as it was verified: it becomes this server's (the upgrade to holders). */
async function claimLegacy(deps: RecoveryDeps, row: MirrorRow, final: string): Promise<boolean> {
  const sha256 = verifiedSha256(row);
  if (sha256 === null) return false;
  const stamp = await diskStamp(final);
  if (stamp === null || diskProblem(row, final, stamp) !== null) return false;
  return deps.rows.claim(row, sha256, stamp.size);
}

async function versionFolders(root: string): Promise<Array<{ model: string; version: string; path: string }>> {
  const found: Array<{ model: string; version: string; path: string }> = [];
  for (const model of await listDir(root)) {
    if (!model.isDirectory()) continue;
    for (const version of await listDir(path.join(root, model.name))) {
      if (version.isDirectory()) found.push({ model: model.name, version: version.name, path: path.join(root, model.name, version.name) });
    }
  }
  return found;
}
