// The one migration history of llmgw, applied on every start for SQLite and PostgreSQL
// alike. Migrations are code (not files) so the package needs no loader; each is named
// with a sortable prefix and never edited once released: a change is a new migration.
import { sql, type Kysely, type Migration, type MigrationProvider } from "kysely";

export type Dialect = "sqlite" | "postgres";

type MigrationFactory = (dialect: Dialect) => Migration;

/** An auto-incrementing integer key, which the two databases spell differently. */
function serialType(dialect: Dialect) {
  return dialect === "postgres" ? sql`bigserial` : sql`integer`;
}

const migrations: Record<string, MigrationFactory> = {
  "0001_foundation": (dialect) => ({
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("models")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("name", "text", (c) => c.notNull().unique())
        .addColumn("definition", "text", (c) => c.notNull())
        .addColumn("created_by", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("updated_by", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createTable("model_aliases")
        .addColumn("alias", "text", (c) => c.primaryKey())
        .addColumn("model_id", "text", (c) => c.notNull().references("models.id").onDelete("cascade"))
        .execute();
      await db.schema.createIndex("model_aliases_model").on("model_aliases").column("model_id").execute();
      await db.schema
        .createTable("audit_log")
        .addColumn("id", serialType(dialect), (c) => (dialect === "sqlite" ? c.primaryKey().autoIncrement() : c.primaryKey()))
        .addColumn("at", "text", (c) => c.notNull())
        .addColumn("actor", "text", (c) => c.notNull())
        .addColumn("action", "text", (c) => c.notNull())
        .addColumn("target", "text", (c) => c.notNull())
        .addColumn("detail", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createTable("api_keys")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("name", "text", (c) => c.notNull())
        .addColumn("prefix", "text", (c) => c.notNull())
        .addColumn("hash", "text", (c) => c.notNull().unique())
        .addColumn("role", "text", (c) => c.notNull())
        .addColumn("allowed_models", "text")
        .addColumn("expires_at", "text")
        .addColumn("revoked_at", "text")
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("created_by", "text", (c) => c.notNull())
        .addColumn("last_used_at", "text")
        .execute();
      await db.schema
        .createTable("nodes")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("name", "text", (c) => c.notNull().unique())
        .addColumn("address", "text", (c) => c.notNull())
        .addColumn("labels", "text", (c) => c.notNull())
        .addColumn("inventory", "text", (c) => c.notNull())
        .addColumn("state", "text", (c) => c.notNull())
        .addColumn("last_heartbeat", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createTable("replicas")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("model_id", "text", (c) => c.notNull())
        .addColumn("profile", "text", (c) => c.notNull())
        .addColumn("node_ids", "text", (c) => c.notNull())
        .addColumn("endpoint", "text")
        .addColumn("engine_key", "text")
        .addColumn("state", "text", (c) => c.notNull())
        .addColumn("attempt", "integer", (c) => c.notNull())
        .addColumn("failures", "integer", (c) => c.notNull())
        .addColumn("last_error", "text")
        .addColumn("started_at", "text")
        .addColumn("ready_at", "text")
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("replicas_model").on("replicas").column("model_id").execute();
      await db.schema
        .createTable("usage")
        .addColumn("id", serialType(dialect), (c) => (dialect === "sqlite" ? c.primaryKey().autoIncrement() : c.primaryKey()))
        .addColumn("at", "text", (c) => c.notNull())
        .addColumn("key_id", "text")
        .addColumn("model", "text", (c) => c.notNull())
        .addColumn("replica_id", "text")
        .addColumn("endpoint", "text", (c) => c.notNull())
        .addColumn("prompt_tokens", "integer")
        .addColumn("completion_tokens", "integer")
        .addColumn("ttft_ms", "integer")
        .addColumn("duration_ms", "integer", (c) => c.notNull())
        .addColumn("status", "integer", (c) => c.notNull())
        .addColumn("stream", "integer", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("usage_at").on("usage").column("at").execute();
    },
  }),
  "0002_mirror": () => ({
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("mirror_files")
        .addColumn("model", "text", (c) => c.notNull())
        .addColumn("version", "text", (c) => c.notNull())
        .addColumn("file", "text", (c) => c.notNull())
        .addColumn("repo", "text", (c) => c.notNull())
        .addColumn("revision", "text", (c) => c.notNull())
        .addColumn("state", "text", (c) => c.notNull())
        .addColumn("sha256", "text")
        .addColumn("actual_sha256", "text")
        .addColumn("bytes_done", "bigint", (c) => c.notNull())
        .addColumn("bytes_total", "bigint")
        .addColumn("error", "text")
        .addColumn("source_url", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .addPrimaryKeyConstraint("mirror_files_pk", ["model", "version", "file"])
        .execute();
    },
  }),
};

export class CodeMigrationProvider implements MigrationProvider {
  constructor(private readonly dialect: Dialect) {}

  async getMigrations(): Promise<Record<string, Migration>> {
    return Object.fromEntries(Object.entries(migrations).map(([name, factory]) => [name, factory(this.dialect)]));
  }
}
