// The `mirror_files` rows: the one place that reads and writes them. A row says what a
// file of a mirrored version is (source, published hash), how far its download got, and,
// once complete, the sha256 it was verified with and the size and mtime the file had on
// disk then. Audit entries of mirror actions are written here too, in the transaction of
// the change they describe where there is one.
import { recordAudit } from "../store/audit.ts";
import type { MirrorFilesTable } from "../store/schema.ts";
import { nowIso, type Store } from "../store/store.ts";
import type { DiskStamp } from "./disk-files.ts";
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
  action: "mirror.fetch" | "mirror.delete" | "mirror.verify";
  target: string;
  detail: Record<string, unknown>;
}

/** One key per file (or, with file "", per version) for in-memory maps. */
export function fileKey(model: string, version: string, file: string): string {
  return `${model}\u0000${version}\u0000${file}`;
}

export class MirrorRows {
  readonly #store: Store;
  readonly #clock: () => number;

  constructor(store: Store, clock: () => number) {
    this.#store = store;
    this.#clock = clock;
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
    };
    await this.#store.db
      .insertInto("mirror_files")
      .values({ model: source.model, version: source.version, file: spec.path, created_at: now, ...values })
      .onConflict((conflict) => conflict.columns(["model", "version", "file"]).doUpdateSet(values))
      .execute();
  }

  /** Changes a row's state, progress or error. A row that is no longer `complete` forgets its verified stamp. */
  async update(row: Pick<MirrorRow, "model" | "version" | "file">, fields: Partial<Pick<MirrorRow, "state" | "bytes_done" | "error">>): Promise<void> {
    const forget = fields.state !== undefined && fields.state !== "complete" ? { verified_size: null, verified_mtime_ns: null, verified_at: null } : {};
    await this.#store.db
      .updateTable("mirror_files")
      .set({ ...fields, ...forget, updated_at: nowIso(this.#clock) })
      .where("model", "=", row.model)
      .where("version", "=", row.version)
      .where("file", "=", row.file)
      .execute();
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
    const result = await this.#store.db
      .updateTable("mirror_files")
      .set({ state: "complete", error: null, actual_sha256: sha256, bytes_done: stamp.size, verified_size: stamp.size, verified_mtime_ns: stamp.mtimeNs, verified_at: now, updated_at: now })
      .where("model", "=", row.model)
      .where("version", "=", row.version)
      .where("file", "=", row.file)
      .executeTakeFirst();
    return Number(result.numUpdatedRows) > 0;
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
      check?.(rows);
      if (audit !== undefined) await recordAudit(trx, { at: nowIso(this.#clock), ...audit, detail: { ...audit.detail, files: rows } });
      return rows;
    });
  }

  async audit(entry: MirrorAuditEntry): Promise<void> {
    await recordAudit(this.#store.db, { at: nowIso(this.#clock), ...entry });
  }
}
