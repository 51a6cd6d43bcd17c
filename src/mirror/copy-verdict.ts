// Whether this server can serve a complete mirror file from its own disk, in a cluster or
// alone: the stat check of its copy (against the row's stamp when the row is its own,
// against its holder row otherwise; see mirror-holders.ts), and, when it does not hold the
// file, which other servers do. `Mirror.check` and the listings both decide here, so a
// file is never listed complete where it would be refused.
import { ConflictError, NotFoundError, UnavailableError, type LlmgwError } from "../core/errors.ts";
import { formatBytes } from "../core/format.ts";
import type { DiskStamp } from "./disk-files.ts";
import { heldCopyProblem, isOwnRow, type HolderRow } from "./mirror-holders.ts";
import type { MirrorRow } from "./mirror-rows.ts";
import type { MirrorHolder } from "./mirror-types.ts";
import { diskProblem } from "./verification.ts";

export type CopyVerdict = { kind: "ok"; size: number } | { kind: "elsewhere"; others: HolderRow[] } | { kind: "refused"; error: LlmgwError };

/**
 * The verdict on a complete row's file. `holders` are the file's holder rows for the
 * sha256 it must have; `self` is this server's name, null without the cluster option (the
 * single-server check, unchanged). In a cluster this server holds the file when its copy
 * passes the stat check and it has a holder row; when it does not and another server
 * does, the file is `elsewhere`. A copy that passes without a holder row while nobody else
 * holds it is served as before (a row from before holders; recover() records the holder).
 */
export function judgeCopy(input: { row: MirrorRow; final: string; stamp: DiskStamp | null; self: string | null; holders: HolderRow[] }): CopyVerdict {
  const { row, final, stamp, self, holders } = input;
  if (self === null) {
    const problem = diskProblem(row, final, stamp);
    return problem === null && stamp !== null
      ? { kind: "ok", size: stamp.size }
      : { kind: "refused", error: problem ?? new NotFoundError(`'${row.file}' is missing.`) };
  }
  const mine = holders.find((holder) => holder.server === self);
  const others = holders.filter((holder) => holder.server !== self);
  let local: LlmgwError | null;
  if (isOwnRow(row, self)) local = diskProblem(row, final, stamp);
  else if (mine !== undefined) local = heldCopyProblem(row, mine, final, stamp);
  else local = notHere(row, self);
  if (local === null && stamp !== null && (mine !== undefined || others.length === 0)) return { kind: "ok", size: stamp.size };
  if (others.length > 0) return { kind: "elsewhere", others };
  return { kind: "refused", error: local ?? notHere(row, self) };
}

function notHere(row: MirrorRow, self: string): LlmgwError {
  const by = row.fetched_by === null ? "" : ` (server '${row.fetched_by}' fetched it)`;
  return new NotFoundError(
    `The mirrored file '${row.file}' of ${row.model}/${row.version} is not on this server ('${self}')${by}, and no server holds verified bytes of it; fetch the version again.`,
    { code: "mirror_file_not_here" },
  );
}

/** The holders as a message names them: `'a' (running)`, `'b' (not running, last seen …)`. */
export function describeHolders(holders: MirrorHolder[]): string {
  return holders
    .map((holder) => `'${holder.name}' (${holder.live ? "running" : `not running${holder.lastSeen === null ? "" : `, last seen ${holder.lastSeen}`}`})`)
    .join(", ");
}

/** What a reader that cannot follow a file to its holders answers: which servers hold it, and how to copy it here. */
export function elsewhereError(row: Pick<MirrorRow, "model" | "version" | "file">, self: string, holders: MirrorHolder[]): LlmgwError {
  return new ConflictError(
    `The mirrored file '${row.file}' of ${row.model}/${row.version} is not on this server ('${self}'); it is held by ${describeHolders(holders)}. ` +
      `Copy it here with 'llmgw ctl mirror replicate ${row.model} ${row.version} --to ${self}' (or --to all).`,
    { code: "mirror_file_elsewhere" },
  );
}

/**
 * What a reader of a file that is still being fetched into the mirror answers: a 503 with
 * Retry-After, not a 404, so a node asking for it waits (weights-wait.ts) instead of
 * counting an engine failure. `fetcher` is the server fetching it (in a cluster), as the
 * cluster sees it: one that is not running left the fetch to whoever resumes its job.
 */
export function stillFetchingError(row: Pick<MirrorRow, "model" | "version" | "file" | "bytes_done" | "bytes_total">, fetcher?: MirrorHolder): LlmgwError {
  const total = row.bytes_total === null ? "" : ` of ${formatBytes(row.bytes_total)}`;
  const by =
    fetcher === undefined
      ? ""
      : fetcher.live
        ? ` by server '${fetcher.name}'`
        : ` by server '${fetcher.name}', which is not running now (a job resumed on another server fetches it again)`;
  return new UnavailableError(
    `The mirror has no complete file '${row.file}' in ${row.model}/${row.version} yet: it is being fetched${by}, ${formatBytes(row.bytes_done)}${total} so far. Ask again in a few seconds.`,
    { code: "mirror_file_fetching", retryAfterSeconds: 5 },
  );
}
