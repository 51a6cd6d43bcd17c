// The `mirror_files` rows: the one place that reads and writes them. A row says what a
// file of a mirrored version is (source, published hash), how far its download got, and,
// once complete, the sha256 it was verified with and the size and mtime the file had on
// disk then. Audit entries of mirror actions are written here too, in the transaction of
// the change they describe where there is one.
//
// In a cluster (`self` given) this server's writes to a row say whose disk it describes
// (`fetched_by`), and its holder row follows them in the same transaction: recorded when
// the row becomes complete or is verified again, removed when the row stops being
// complete here. Without `self` the rows are written exactly as on a single server.
import { recordAudit } from "../store/audit.ts";
import type { MirrorFilesTable } from "../store/schema.ts";
import { nowIso, type Db, type Store, type Tx } from "../store/store.ts";
import type { DiskStamp } from "./disk-files.ts";
import { fileKey } from "./mirror-paths.ts";
import { holdersByFile, holdersOfFile, removeHolder, removeVersionHolders, upsertHolder, type HolderRow } from "./mirror-holders.ts";
import type { MirrorFetchFile, MirrorFileState } from "./mirror-types.ts";

export type MirrorRow = MirrorFilesTable;

/** A version's identity as the rows record it. */
export interface RowSource {
  model: string;
  version: string;
  repo: string;
  revision: string;
}

export interface RowFields {
  state: MirrorFileState;
  bytes_done: number;
  error: string | null;
  actual_sha256: string | null;
  bytes_total?: number | null;
  /** The file on disk as it was when its bytes matched; only with `complete`. Anything else clears it. */
  verified?: DiskStamp | null;
}

/** A mirror action for the audit trail; `target` is `model/version`. */
export interface MirrorAuditEntry {
  actor: string;
  action: "mirror.fetch" | "mirror.delete" | "mirror.verify" | "mirror.replicate";
  target: string;
  detail: Record<string, unknown>;
}

export class MirrorRows {
  readonly #store: Store;
  readonly #clock: () => number;
  /** This server's name in a cluster; null on a single server. */
  readonly self: string | null;

  constructor(store: Store, clock: () => number, self: string | null = null) {
    this.#store = store;
    this.#clock = clock;
    this.self = self;
  }

  /** Runs `body` in a transaction when this server keeps holder rows (so row and holder change together), else directly. */
  async #write(body: (db: Tx | Db) => Promise<void>): Promise<void> {
    if (this.self === null) await body(this.#store.db);
    else await this.#store.db.transaction().execute(body);
  }

  get(model: string, version: string, file: string): Promise<MirrorRow | undefined> {
    return this.#store.db
      .selectFrom("mirror_files")
      .selectAll()
      .where("model", "=", model)
      .where("version", "=", version)
      .where("file", "=", file)
      .executeTakeFirst();
  }

  list(options: { model?: string; version?: string } = {}): Promise<MirrorRow[]> {
    let query = this.#store.db.selectFrom("mirror_files").selectAll();
    if (options.model !== undefined) query = query.where("model", "=", options.model);
    if (options.version !== undefined) query = query.where("version", "=", options.version);
    return query.orderBy("model").orderBy("version").orderBy("file").execute();
  }

  /** Every version the store has rows for, as `fileKey(model, version, "")`. */
  async versionKeys(): Promise<Set<string>> {
    const rows = await this.#store.db.selectFrom("mirror_files").select(["model", "version"]).distinct().execute();
    return new Set(rows.map((row) => fileKey(row.model, row.version, "")));
  }

  async upsert(source: RowSource, spec: MirrorFetchFile, fields: RowFields): Promise<void> {
    const now = nowIso(this.#clock);
    const verified = fields.state === "complete" ? (fields.verified ?? null) : null;
    const values = {
      repo: source.repo,
      revision: source.revision,
      state: fields.state,
      sha256: spec.sha256,
      actual_sha256: fields.actual_sha256,
      bytes_done: fields.bytes_done,
      bytes_total: fields.bytes_total !== undefined ? fields.bytes_total : spec.size,
      error: fields.error,
      source_url: spec.url,
      verified_size: verified?.size ?? null,
      verified_mtime_ns: verified?.mtimeNs ?? null,
      verified_at: verified === null ? null : now,
      updated_at: now,
      // In a cluster the row now describes this server's disk; on a single server the column is left as it is.
      ...(this.self === null ? {} : { fetched_by: this.self }),
    };
    const ref = { model: source.model, version: source.version, file: spec.path };
    await this.#write(async (db) => {
      await db
        .insertInto("mirror_files")
        .values({ ...ref, created_at: now, ...values })
        .onConflict((conflict) => conflict.columns(["model", "version", "file"]).doUpdateSet(values))
        .execute();
      if (this.self === null) return;
      // Complete: these bytes are here, verified. Anything else: this server's copy is being replaced or failed.
      const sha256 = spec.sha256 ?? fields.actual_sha256;
      if (verified !== null && sha256 !== null) await upsertHolder(db, { ...ref, server: this.self, sha256, size: verified.size, verified_at: now });
      else await removeHolder(db, ref, this.self);
    });
  }

  /** Changes a row's state, progress or error. A row that is no longer `complete` forgets its verified stamp. */
  async update(row: Pick<MirrorRow, "model" | "version" | "file">, fields: Partial<Pick<MirrorRow, "state" | "bytes_done" | "error">>): Promise<void> {
    const leaving = fields.state !== undefined && fields.state !== "complete";
    const forget = leaving ? { verified_size: null, verified_mtime_ns: null, verified_at: null } : {};
    await this.#write(async (db) => {
      await db
        .updateTable("mirror_files")
        .set({ ...fields, ...forget, updated_at: nowIso(this.#clock) })
        .where("model", "=", row.model)
        .where("version", "=", row.version)
        .where("file", "=", row.file)
        .execute();
      // Callers change only rows that describe this server's disk: a row no longer complete is not held here.
      if (leaving && this.self !== null) await removeHolder(db, row, this.self);
    });
  }

  /**
   * Records that the bytes on disk matched `sha256` with this stamp: the row becomes (or
   * stays) complete. Only when the row still expects that sha256, so a verification that
   * finishes after the file was fetched anew cannot stamp other bytes.
   */
  /**
   * Records that the file on disk has `sha256` and this stamp: complete again, whatever it
   * was. Callers hold the file's lane, so nothing fetches it meanwhile. False when the
   * row is gone (the version was deleted).
   */
  async markVerified(row: Pick<MirrorRow, "model" | "version" | "file">, sha256: string, stamp: DiskStamp): Promise<boolean> {
    const now = nowIso(this.#clock);
    let updated = false;
    await this.#write(async (db) => {
      const result = await db
        .updateTable("mirror_files")
        // The stamp is this server's disk: in a cluster the row says so (callers pass only rows that are this server's own).
        .set({
          state: "complete",
          error: null,
          actual_sha256: sha256,
          bytes_done: stamp.size,
          verified_size: stamp.size,
          verified_mtime_ns: stamp.mtimeNs,
          verified_at: now,
          updated_at: now,
          ...(this.self === null ? {} : { fetched_by: this.self }),
        })
        .where("model", "=", row.model)
        .where("version", "=", row.version)
        .where("file", "=", row.file)
        .executeTakeFirst();
      updated = Number(result.numUpdatedRows) > 0;
      if (updated && this.self !== null)
        await upsertHolder(db, { model: row.model, version: row.version, file: row.file, server: this.self, sha256, size: stamp.size, verified_at: now });
    });
    return updated;
  }

  /**
   * Records that this server holds verified bytes of a file whose row describes another
   * server's disk (a copy from a holder, or a verification of such a copy). Needs `self`.
   */
  async recordHeld(row: Pick<MirrorRow, "model" | "version" | "file">, sha256: string, size: number): Promise<void> {
    if (this.self === null) return;
    await upsertHolder(this.#store.db, {
      model: row.model,
      version: row.version,
      file: row.file,
      server: this.self,
      sha256,
      size,
      verified_at: nowIso(this.#clock),
    });
  }

  /** Every holder row (of one model, or one version), by `fileKey`, sorted by server name. */
  holdersByFile(scope: { model?: string; version?: string } = {}): Promise<Map<string, HolderRow[]>> {
    return holdersByFile(this.#store.db, scope);
  }

  /** The holder rows of a file, sorted by server name. */
  holders(row: Pick<MirrorRow, "model" | "version" | "file">): Promise<HolderRow[]> {
    return holdersOfFile(this.#store.db, row);
  }

  /** Records that this server no longer holds a file (its copy is gone or bad); the row is left as it is. */
  async dropHeld(row: Pick<MirrorRow, "model" | "version" | "file">): Promise<void> {
    if (this.self === null) return;
    await removeHolder(this.#store.db, row, this.self);
  }

  /**
   * Claims a complete row from before holder rows (`fetched_by` null) whose file this
   * server has, as verified: it becomes this server's row and holder. False when another
   * server claimed it first.
   */
  async claim(row: MirrorRow, sha256: string, size: number): Promise<boolean> {
    if (this.self === null) return false;
    const self = this.self;
    let claimed = false;
    await this.#write(async (db) => {
      const result = await db
        .updateTable("mirror_files")
        .set({ fetched_by: self })
        .where("model", "=", row.model)
        .where("version", "=", row.version)
        .where("file", "=", row.file)
        .where("fetched_by", "is", null)
        .executeTakeFirst();
      claimed = Number(result.numUpdatedRows) > 0;
      if (claimed)
        await upsertHolder(db, {
          model: row.model,
          version: row.version,
          file: row.file,
          server: self,
          sha256,
          size,
          verified_at: row.verified_at ?? nowIso(this.#clock),
        });
    });
    return claimed;
  }

  /** Bytes done of a file while it streams; only while the row is still fetching, so a late write never undoes the final state. */
  async recordProgress(source: Pick<RowSource, "model" | "version">, file: string, bytes: number): Promise<void> {
    await this.#store.db
      .updateTable("mirror_files")
      .set({ bytes_done: bytes, updated_at: nowIso(this.#clock) })
      .where("model", "=", source.model)
      .where("version", "=", source.version)
      .where("file", "=", file)
      .where("state", "=", "fetching")
      .execute();
  }

  /**
   * Removes a version's rows and records the audit entry in the same transaction; returns
   * how many went. `check` sees that count before the commit and may throw to undo both.
   */
  async deleteVersion(model: string, version: string, options: { audit?: MirrorAuditEntry; check?: (rows: number) => void } = {}): Promise<number> {
    const { audit, check } = options;
    return this.#store.db.transaction().execute(async (trx) => {
      const deleted = await trx.deleteFrom("mirror_files").where("model", "=", model).where("version", "=", version).executeTakeFirst();
      const rows = Number(deleted.numDeletedRows);
      // Every server's holder rows go with the rows: no server holds a version that is not there.
      await removeVersionHolders(trx, model, version);
      check?.(rows);
      if (audit !== undefined) await recordAudit(trx, { at: nowIso(this.#clock), ...audit, detail: { ...audit.detail, files: rows } });
      return rows;
    });
  }

  async audit(entry: MirrorAuditEntry): Promise<void> {
    await recordAudit(this.#store.db, { at: nowIso(this.#clock), ...entry });
  }
}
