// The servers sharing this database (`cluster_members`): each one's row by name, where the
// others reach it, its version, and when it was last seen. A server joins at start (in one
// transaction under an advisory lock, so two starting at once are checked against each
// other), says it is alive every `beatMs`, and marks its row stopped on a clean stop. A
// member not seen for `liveMs` is taken for gone (killed, or its machine is). On PostgreSQL
// every stamp is written, and every age judged, on the database's clock: a server whose own
// clock runs ahead must neither see the others as gone nor be seen as gone (SQLite has one
// server, on its own clock).
//
// Joining refuses two things, each with what to do: a live member given a different
// cluster secret (each could not open what the other sealed), and a live member of the
// same name from another data dir (the name says which server holds mirror files).
import { randomUUID } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import path from "node:path";
import { type Kysely, type RawBuilder, sql } from "kysely";
import { ConflictError, describeError, errorCode } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { nowIso, type Store } from "../store/store.ts";
import type { ClusterMembersTable, Database } from "../store/schema.ts";

export const MEMBER_DEFAULTS = {
  /** How often a server says it is alive. */
  beatMs: 2_000,
  /** A server not seen for this long is taken for gone (its mirror files are not redirected to). */
  liveMs: 10_000,
} as const;

/** The advisory lock key (two int4s) under which servers join; any fixed pair, the same in every llmgw. */
const JOIN_LOCK = [0x6c6d, 0x6a6f] as const;
const SERVER_ID_FILE = "server.id";
/** The database's clock now, as the ISO-8601 text the stamps are stored as (nowIso's format). */
export const DATABASE_NOW_ISO = sql<string>`to_char(now() at time zone 'utc', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')`;

export interface ClusterMember {
  name: string;
  url: string;
  version: string;
  started_at: string;
  last_seen: string;
  /** Seen within the last `liveMs` and not stopped. */
  live: boolean;
  stopped_at: string | null;
}

export interface MemberSelf {
  name: string;
  url: string;
  version: string;
  /** The cluster secret's check value (SecretBox.checkValue). */
  secretCheck: string;
  /** Where the secret came from, for the refusal's message. */
  secretSource: string;
}

export class ClusterMembers {
  readonly instance = randomUUID();
  private timer: NodeJS.Timeout | undefined;
  private readonly clock: () => number;
  private readonly liveMs: number;
  private readonly dataDirId: string;

  constructor(
    private readonly options: {
      store: Store;
      dataDir: string;
      self: MemberSelf;
      logger: Logger;
      /** This server's wall clock: SQLite's stamps and ages (PostgreSQL's are the database's). */
      clock?: () => number;
      beatMs?: number;
      liveMs?: number;
    },
  ) {
    this.clock = options.clock ?? Date.now;
    this.liveMs = options.liveMs ?? MEMBER_DEFAULTS.liveMs;
    this.dataDirId = dataDirId(options.dataDir);
  }

  get name(): string {
    return this.options.self.name;
  }

  /** Checks this server against the live members and records it; throws what stops it joining. */
  async join(): Promise<void> {
    const { store, self } = this.options;
    await store.db.transaction().execute(async (trx) => {
      if (store.dialect === "postgres") await sql`select pg_advisory_xact_lock(${JOIN_LOCK[0]}, ${JOIN_LOCK[1]})`.execute(trx);
      const rows = await trx.selectFrom("cluster_members").selectAll().orderBy("name").execute();
      const nowMs = await this.nowMs(trx);
      const live = rows.filter((row) => this.isLive(row, nowMs) && row.data_dir_id !== this.dataDirId);
      const otherSecret = live.filter((row) => row.secret_check !== self.secretCheck);
      if (otherSecret.length > 0) {
        throw new ConflictError(
          `This server's cluster secret (from ${self.secretSource}) differs from that of the running server${otherSecret.length === 1 ? "" : "s"} ${otherSecret.map((row) => `'${row.name}' (${row.url})`).join(", ")} on the same database. ` +
            `Servers sharing a database must be given the same secret: pass the same --cluster-secret-file (or LLMGW_CLUSTER_SECRET) to every one of them.`,
          { code: "cluster_secret_mismatch" },
        );
      }
      const sameName = live.find((row) => row.name === self.name);
      if (sameName !== undefined) {
        throw new ConflictError(
          `Another server named '${self.name}' runs on this database (${sameName.url}, last seen ${sameName.last_seen}). Give each server its own name with --server-name.`,
          { code: "server_name_in_use" },
        );
      }
      const now = this.stamp();
      const values = {
        instance: this.instance,
        data_dir_id: this.dataDirId,
        url: self.url,
        version: self.version,
        secret_check: self.secretCheck,
        started_at: now,
        last_seen: now,
        stopped_at: null,
      };
      await trx
        .insertInto("cluster_members")
        .values({ name: self.name, ...values })
        .onConflict((oc) => oc.column("name").doUpdateSet(values))
        .execute();
    });
    // SQLite has one server by construction: nobody needs to hear it is alive (nor its disk a write every 2 s).
    if (store.dialect !== "postgres") return;
    this.timer = setInterval(() => void this.beat(), this.options.beatMs ?? MEMBER_DEFAULTS.beatMs);
    this.timer.unref();
  }

  /** The address this server is reached at, once it listens (port 0 resolved). */
  async setUrl(url: string): Promise<void> {
    this.options.self.url = url;
    await this.beat();
  }

  async leave(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    await this.options.store.db
      .updateTable("cluster_members")
      .set({ stopped_at: this.stamp(), last_seen: this.stamp() })
      .where("name", "=", this.name)
      .where("instance", "=", this.instance)
      .execute()
      .catch((error: unknown) => this.options.logger.warn({ err: describeError(error) }, "could not record this server's stop in the cluster"));
  }

  async list(): Promise<ClusterMember[]> {
    const rows = await this.options.store.db.selectFrom("cluster_members").selectAll().orderBy("name").execute();
    const nowMs = await this.nowMs(this.options.store.db);
    return rows.map((row) => ({
      name: row.name,
      url: row.url,
      version: row.version,
      started_at: row.started_at,
      last_seen: row.last_seen,
      stopped_at: row.stopped_at,
      // This server runs as long as it answers (on SQLite it does not stamp its row).
      live: (row.name === this.name && row.instance === this.instance && row.stopped_at === null) || this.isLive(row, nowMs),
    }));
  }

  /** The live member of that name, or undefined. */
  async live(name: string): Promise<ClusterMember | undefined> {
    return (await this.list()).find((member) => member.name === name && member.live);
  }

  private isLive(row: Pick<ClusterMembersTable, "last_seen" | "stopped_at">, nowMs: number): boolean {
    return row.stopped_at === null && nowMs - Date.parse(row.last_seen) < this.liveMs;
  }

  /** A stamp for a row: the database's clock on PostgreSQL, this server's on SQLite. */
  private stamp(): string | RawBuilder<string> {
    return this.options.store.dialect === "postgres" ? DATABASE_NOW_ISO : nowIso(this.clock);
  }

  /** Now (epoch ms) on the clock the stamps were written with. */
  private async nowMs(db: Kysely<Database>): Promise<number> {
    if (this.options.store.dialect !== "postgres") return this.clock();
    const row = await sql<{ now: string }>`select ${DATABASE_NOW_ISO} as now`.execute(db);
    return Date.parse(row.rows[0]!.now);
  }

  private async beat(): Promise<void> {
    try {
      const result = await this.options.store.db
        .updateTable("cluster_members")
        .set({ last_seen: this.stamp(), url: this.options.self.url })
        .where("name", "=", this.name)
        .where("instance", "=", this.instance)
        .executeTakeFirst();
      if (result.numUpdatedRows === 0n)
        this.options.logger.error({ server: this.name }, "this server's cluster row was taken by another start of the same name; stop one of them");
    } catch (error) {
      this.options.logger.warn({ err: describeError(error) }, "could not record that this server is alive");
    }
  }
}

/** The data dir's own random id (DATA_DIR/server.id), made on first use. */
function dataDirId(dataDir: string): string {
  const file = path.join(dataDir, SERVER_ID_FILE);
  try {
    const id = readFileSync(file, "utf8").trim();
    if (id !== "") return id;
  } catch (error) {
    if (errorCode(error) !== "ENOENT") throw error;
  }
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const id = randomUUID();
  writeFileSync(file, `${id}\n`, { mode: 0o600 });
  return id;
}
