// Which server holds the verified bytes of which mirror file, when several servers share
// one PostgreSQL (a cluster). The `mirror_files` rows are shared; the files are not: each
// server has its own mirror folder. A `mirror_holders` row (model, version, file, server,
// sha256, size, verified_at) says that server's disk has bytes with that sha256, checked
// at verified_at. A holder row only counts for the sha256 the file's row must have now,
// so a row fetched anew with other bytes leaves older holder rows meaningless rather than
// wrong.
//
// Whose disk a row's own stamp (verified size and mtime) describes: the server in
// `fetched_by`, the one that ran the fetch (or, when null, a row from before clusters:
// the single server's). Every other holder is checked against its holder row instead:
// the same size, and not modified after its bytes were verified (`verified_at`, from the
// mirror's clock, which in a cluster is the real one: it is compared with file mtimes).
//
// Without the cluster option the mirror writes no holder rows and judges every row as its
// own, exactly as a single server always did. copy-verdict.ts decides from these rows
// whether this server can serve a file.
import { ConflictError, NotFoundError, type LlmgwError } from "../core/errors.ts";
import type { MirrorFilesTable, MirrorHoldersTable } from "../store/schema.ts";
import type { Db, Tx } from "../store/store.ts";
import type { DiskStamp } from "./disk-files.ts";
import { fileKey } from "./mirror-paths.ts";

export type HolderRow = MirrorHoldersTable;

// The mirror_files row type from the schema, not from mirror-rows.ts: the rows module
// writes holder rows through this one, so this one must not depend on it.
type FileRef = Pick<MirrorFilesTable, "model" | "version" | "file">;

/** Whether this server's disk is the one a row's own stamp describes (see the module comment). */
export function isOwnRow(row: Pick<MirrorFilesTable, "fetched_by">, self: string | null): boolean {
  return self === null || row.fetched_by === null || row.fetched_by === self;
}

export async function upsertHolder(db: Db | Tx, holder: HolderRow): Promise<void> {
  const { sha256, size, verified_at } = holder;
  await db
    .insertInto("mirror_holders")
    .values(holder)
    .onConflict((conflict) => conflict.columns(["model", "version", "file", "server"]).doUpdateSet({ sha256, size, verified_at }))
    .execute();
}

export async function removeHolder(db: Db | Tx, ref: FileRef, server: string): Promise<void> {
  await db
    .deleteFrom("mirror_holders")
    .where("model", "=", ref.model)
    .where("version", "=", ref.version)
    .where("file", "=", ref.file)
    .where("server", "=", server)
    .execute();
}

export async function removeVersionHolders(db: Db | Tx, model: string, version: string): Promise<void> {
  await db.deleteFrom("mirror_holders").where("model", "=", model).where("version", "=", version).execute();
}

export function holdersOfFile(db: Db | Tx, ref: FileRef): Promise<HolderRow[]> {
  return db
    .selectFrom("mirror_holders")
    .selectAll()
    .where("model", "=", ref.model)
    .where("version", "=", ref.version)
    .where("file", "=", ref.file)
    .orderBy("server")
    .execute();
}

/** Every holder row (of one model, or one version), by `fileKey`, sorted by server name. */
export async function holdersByFile(db: Db | Tx, scope: { model?: string; version?: string } = {}): Promise<Map<string, HolderRow[]>> {
  let query = db.selectFrom("mirror_holders").selectAll();
  if (scope.model !== undefined) query = query.where("model", "=", scope.model);
  if (scope.version !== undefined) query = query.where("version", "=", scope.version);
  const byFile = new Map<string, HolderRow[]>();
  for (const holder of await query.orderBy("server").execute()) {
    const key = fileKey(holder.model, holder.version, holder.file);
    byFile.set(key, [...(byFile.get(key) ?? []), holder]);
  }
  return byFile;
}

/** What is wrong with another server's copy on this disk, judged by this server's holder row; null when it looks as verified. */
export function heldCopyProblem(row: FileRef, holder: HolderRow, final: string, stamp: DiskStamp | null): LlmgwError | null {
  const what = `'${row.file}' of ${row.model}/${row.version}`;
  if (stamp === null) return new NotFoundError(`This server's copy of ${what} is missing on disk (${final}).`, { code: "mirror_file_missing" });
  if (stamp.size !== Number(holder.size)) {
    return new NotFoundError(`This server's copy of ${what} is ${stamp.size} bytes on disk instead of ${holder.size} (${final}).`, {
      code: "mirror_file_missing",
    });
  }
  // The holder row has no mtime of its own: a copy written after its bytes were verified
  // has an mtime later than that moment (its bytes were written, then hashed, then recorded).
  const modifiedMs = Number(BigInt(stamp.mtimeNs) / 1_000_000n);
  if (modifiedMs > Date.parse(holder.verified_at)) {
    return new ConflictError(
      `This server's copy of ${what} was modified on disk (at ${new Date(modifiedMs).toISOString()}) after its bytes were verified (at ${holder.verified_at}), ` +
        `so it is not served until they are hashed again: run 'llmgw ctl mirror verify ${row.model} ${row.version}' on this server.`,
      { code: "mirror_file_changed" },
    );
  }
  return null;
}
