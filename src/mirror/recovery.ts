// Startup repair of the mirror, before anything fetches or serves: what a stopped (or
// killed) process left behind is turned into honest rows, so nothing half-written is ever
// presented as complete and every interrupted download can resume.
//
// Only the server that owns a mirror root may run this. On a PostgreSQL shared by several
// servers the rows are shared but the files and the in-flight map are not: another
// server's recovery would see this server's live downloads as `fetching` rows with nothing
// active, turn them back to `pending`, and move its freshly renamed files back to
// `.partial`. Until the fleet work adds an owner per mirror root (and a lease that says it
// is alive), run one mirror per database.
import { rename, unlink } from "node:fs/promises";
import type { Logger } from "../core/log.ts";
import { diskStamp, fileSize } from "./disk-files.ts";
import { PARTIAL_SUFFIX } from "./mirror-paths.ts";
import { fileKey, type MirrorRows } from "./mirror-rows.ts";
import type { RecoverSummary } from "./mirror-types.ts";

export interface RecoveryDeps {
  rows: MirrorRows;
  logger: Logger;
  /** The final path of a file; throws for a name that is no longer valid. */
  finalPath: (model: string, version: string, file: string) => string;
  /** True while this process works on the file. */
  isActive: (key: string) => boolean;
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
  const summary: RecoverSummary = { interrupted: 0, missing: 0, unconfirmed: 0 };
  for (const row of await deps.rows.list()) {
    if (deps.isActive(fileKey(row.model, row.version, row.file))) continue;
    let final: string;
    try {
      final = deps.finalPath(row.model, row.version, row.file);
    } catch {
      continue; // A row with a name that is no longer valid is never served.
    }
    const partial = final + PARTIAL_SUFFIX;
    if (row.state === "complete") {
      const stamp = await diskStamp(final);
      if (stamp === null || stamp.size !== row.bytes_total) {
        summary.missing += 1;
        await deps.rows.update(row, {
          state: "failed",
          error: `The mirrored file is ${stamp === null ? "missing" : `${stamp.size} bytes instead of ${row.bytes_total}`} on disk (${final}); fetch the version again.`,
        });
      } else if (row.verified_size === null && row.actual_sha256 !== null) {
        await deps.rows.markVerified(row, row.actual_sha256, stamp);
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
  if (summary.interrupted + summary.missing + summary.unconfirmed > 0) deps.logger.info(summary, "mirror recovered after restart");
  return summary;
}
