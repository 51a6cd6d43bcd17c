// How a mirror file is shown to readers (GET /api/v1/mirror, `ctl mirror list`): its row,
// overlaid with what this process knows (a fetch in flight or queued) and with what the
// disk says (a complete file that is gone or changed is not shown complete; in a cluster,
// one that another server holds is complete, and `holders` says where).
import type { LlmgwError } from "../core/errors.ts";
import type { ActiveFile } from "./fetch-input.ts";
import type { MirrorRow } from "./mirror-rows.ts";
import type { MirrorFileState, MirrorFileView } from "./mirror-types.ts";

export async function viewRow(
  row: MirrorRow,
  live: {
    /** The file's download in this process, when it runs. */
    active: ActiveFile | undefined;
    /** A running fetch call will work on the file. */
    claimed: boolean;
    /** The check of a complete file on this disk (copy-verdict.ts): why it cannot be served, or null. */
    onDisk: () => Promise<LlmgwError | null>;
    /** The servers holding its verified bytes (none without the cluster option). */
    holders: string[];
  },
): Promise<MirrorFileView> {
  const { active } = live;
  // Claimed by a running call but not started yet: queued, whatever an earlier run left.
  const claimed = active === undefined && live.claimed;
  let state = (active?.state ?? (claimed && row.state !== "complete" ? "pending" : row.state)) as MirrorFileState;
  let error = row.error;
  if (state === "complete") {
    // A complete row is only as good as the file behind it: a stat says whether it still is.
    const problem = await live.onDisk();
    if (problem !== null) {
      state = "failed";
      error = problem.message;
    }
  }
  const bytesDone = active !== undefined ? active.bytesDone : row.bytes_done;
  const bytesTotal = row.bytes_total;
  return {
    model: row.model,
    version: row.version,
    file: row.file,
    repo: row.repo,
    revision: row.revision,
    state,
    sha256: row.sha256,
    actualSha256: row.actual_sha256,
    bytesDone,
    bytesTotal,
    percent: bytesTotal === null ? null : bytesTotal === 0 ? (state === "complete" ? 100 : 0) : Math.floor((bytesDone / bytesTotal) * 1000) / 10,
    error,
    sourceUrl: row.source_url,
    active: active !== undefined || claimed,
    verifiedAt: row.verified_at,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
    holders: live.holders,
  };
}
