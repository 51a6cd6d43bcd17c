// The one migration history of llmgw, applied on every start for SQLite and PostgreSQL
// alike. Migrations are code (not files) so the package needs no loader; each is named
// with a sortable prefix and never edited once released: a change is a new migration.
// A migration calls no live code that may change later (only Kysely and what is under
// migrations/, which is frozen with the migration that uses it), so it does the same on
// every database it ever meets.
//
// The runner is ours rather than Kysely's Migrator: that one decides whether its tables
// exist by introspecting every schema of the database, which is slow in a shared database
// and fails when another schema is dropped at the same moment. Here, one transaction takes
// a PostgreSQL advisory lock (so servers starting together migrate once), creates the
// history table if needed, and applies what is missing; DDL is transactional in both
// databases, so a failed migration leaves nothing half-applied.
import { sql, type Kysely } from "kysely";
import { backfillUsageAggregates0008 } from "./migrations/0008-usage-backfill.ts";

export type Dialect = "sqlite" | "postgres";

interface Migration {
  up(db: Kysely<unknown>): Promise<void>;
}

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
  // What a complete mirror file looked like on disk when its bytes were last hashed, so a
  // stat (not a hash) tells whether it changed since: a new size or mtime means hash again.
  "0003_mirror_verified": () => ({
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable("mirror_files").addColumn("verified_size", "bigint").execute();
      await db.schema.alterTable("mirror_files").addColumn("verified_mtime_ns", "text").execute();
      await db.schema.alterTable("mirror_files").addColumn("verified_at", "text").execute();
    },
  }),
  // One row the store rewrites to learn whether writes work again after a storage fault
  // (a full disk, a read-only data dir), so /readyz recovers by itself.
  "0004_store_probe": () => ({
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("store_probe")
        .addColumn("name", "text", (c) => c.primaryKey())
        .addColumn("at", "text", (c) => c.notNull())
        .execute();
    },
  }),
  // The fleet (issue 7): nodes join with a credential (only its sha256 is kept) and may be
  // removed (the row stays, so a credential used after removal gets a precise refusal);
  // replica rows become the reconciler's truth: what was placed where, from which model
  // definition (fingerprint), with which GPUs, whether the node should run or stop it,
  // and the engine key sealed with the server's secret (so a restarted server can still
  // call the engines its agents kept running). A model's parking lives with the model, so
  // it survives restarts; events record what operators are told (node_lost and others).
  "0005_fleet": (dialect) => ({
    async up(db: Kysely<unknown>) {
      for (const column of ["credential_hash", "joined_at", "removed_at"]) {
        await db.schema.alterTable("nodes").addColumn(column, "text").execute();
      }
      for (const column of ["fingerprint", "gpus", "desired", "spec"]) {
        await db.schema.alterTable("replicas").addColumn(column, "text").execute();
      }
      await db.schema
        .createTable("model_states")
        .addColumn("model_id", "text", (c) => c.primaryKey())
        .addColumn("parked_reason", "text")
        .addColumn("parked_at", "text")
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createTable("events")
        .addColumn("id", serialType(dialect), (c) => (dialect === "sqlite" ? c.primaryKey().autoIncrement() : c.primaryKey()))
        .addColumn("at", "text", (c) => c.notNull())
        .addColumn("kind", "text", (c) => c.notNull())
        .addColumn("severity", "text", (c) => c.notNull())
        .addColumn("subject", "text", (c) => c.notNull())
        .addColumn("message", "text", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("events_at").on("events").column("at").execute();
    },
  }),
  // Serve and update jobs (issue 8): each job keeps its request, its steps with their live
  // state, and the context a resumed run needs (the commit and files the registry step
  // chose; never a token). `model_updates` is what the update check last found per model.
  "0006_jobs": () => ({
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("jobs")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("kind", "text", (c) => c.notNull())
        .addColumn("state", "text", (c) => c.notNull())
        .addColumn("request", "text", (c) => c.notNull())
        .addColumn("steps", "text", (c) => c.notNull())
        .addColumn("context", "text")
        .addColumn("model", "text")
        .addColumn("error", "text")
        .addColumn("result", "text")
        .addColumn("resumed", "integer", (c) => c.notNull().defaultTo(0))
        .addColumn("created_by", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .addColumn("finished_at", "text")
        .execute();
      await db.schema.createIndex("jobs_created_at").on("jobs").column("created_at").execute();
      await db.schema
        .createTable("model_updates")
        .addColumn("model_id", "text", (c) => c.primaryKey())
        .addColumn("repo", "text", (c) => c.notNull())
        .addColumn("revision", "text", (c) => c.notNull())
        .addColumn("latest_revision", "text")
        .addColumn("checked_at", "text", (c) => c.notNull())
        .addColumn("error", "text")
        .execute();
    },
  }),
  // Budgets and rate limits (issue 9): the limits live on the key; what was spent and
  // reserved lives in one row per key and budget period ('total', a UTC day '2026-12-01'
  // or month '2026-12'), and requests and tokens in one row per key, model ('*' for the
  // whole key) and one-minute window. Money is counted in integer nano-USD, so sums and
  // the comparison against the limit are exact in both databases.
  "0007_key_limits": () => ({
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable("api_keys").addColumn("rpm", "integer").execute();
      await db.schema.alterTable("api_keys").addColumn("tpm", "integer").execute();
      await db.schema.alterTable("api_keys").addColumn("budget_usd", "double precision").execute();
      await db.schema.alterTable("api_keys").addColumn("budget_period", "text").execute();
      await db.schema.alterTable("api_keys").addColumn("model_limits", "text").execute();
      await db.schema
        .createTable("key_budgets")
        .addColumn("key_id", "text", (c) => c.notNull())
        .addColumn("period", "text", (c) => c.notNull())
        .addColumn("spent_nano", "bigint", (c) => c.notNull())
        .addColumn("reserved_nano", "bigint", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .addPrimaryKeyConstraint("key_budgets_pk", ["key_id", "period"])
        .execute();
      await db.schema
        .createTable("key_rate_windows")
        .addColumn("key_id", "text", (c) => c.notNull())
        .addColumn("model", "text", (c) => c.notNull())
        .addColumn("window_start", "text", (c) => c.notNull())
        .addColumn("requests", "integer", (c) => c.notNull())
        .addColumn("tokens", "bigint", (c) => c.notNull())
        .addPrimaryKeyConstraint("key_rate_windows_pk", ["key_id", "model", "window_start"])
        .execute();
      await db.schema.createIndex("key_rate_windows_start").on("key_rate_windows").column("window_start").execute();
    },
  }),
  // Usage you can read (issue 9): what a request cost and how long its guards took, on
  // the raw row; and per-minute and per-hour aggregates, which outlive the raw rows
  // (--usage-retention) and which every server's flush adds to, filled here from the raw
  // rows already stored (src/store/migrations/0008-usage-backfill.ts, frozen: it does not
  // follow the live aggregation in src/usage/). Money is a double in both databases
  // (SQLite's REAL is one; PostgreSQL's `real` would keep only ~7 digits of a long sum).
  "0008_usage_aggregates": (dialect) => ({
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable("usage").addColumn("cost_usd", "double precision").execute();
      await db.schema.alterTable("usage").addColumn("guard_ms", "integer").execute();
      // The same columns at two resolutions: minutes for recent reports, hours for long ones.
      for (const [table, start] of [
        ["usage_minutes", "minute"],
        ["usage_hours", "hour"],
      ] as const) {
        await db.schema
          .createTable(table)
          .addColumn(start, "text", (c) => c.notNull())
          .addColumn("key_id", "text", (c) => c.notNull())
          .addColumn("model", "text", (c) => c.notNull())
          .addColumn("requests", "bigint", (c) => c.notNull())
          .addColumn("errors", "bigint", (c) => c.notNull())
          .addColumn("prompt_tokens", "bigint", (c) => c.notNull())
          .addColumn("completion_tokens", "bigint", (c) => c.notNull())
          .addColumn("cost_usd", "double precision", (c) => c.notNull())
          .addColumn("duration_hist", "text", (c) => c.notNull())
          .addColumn("ttft_hist", "text", (c) => c.notNull())
          .addPrimaryKeyConstraint(`${table}_pk`, [start, "key_id", "model"])
          .execute();
      }
      await backfillUsageAggregates0008(db, dialect);
    },
  }),
  // Keys naming guard models (issue 9): a JSON object {input: [...], output: [...]} of
  // guard model names every request with the key is checked by; null for none.
  "0009_key_guards": () => ({
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable("api_keys").addColumn("guards", "text").execute();
    },
  }),
  // Notifications (issue 10): events gain structured data; channels say where events go
  // (URLs and secrets sealed); deliveries are the queue and its log, each one event to one
  // channel with its attempts. The cursor starts at the newest event, so a first channel
  // is not sent the whole history.
  "0010_notify": (dialect) => ({
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable("events").addColumn("data", "text").execute();
      await db.schema.createIndex("events_kind").on("events").columns(["kind", "id"]).execute();
      await db.schema
        .createTable("notify_channels")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("name", "text", (c) => c.notNull().unique())
        .addColumn("kind", "text", (c) => c.notNull())
        .addColumn("url_sealed", "text", (c) => c.notNull())
        .addColumn("url_shown", "text", (c) => c.notNull())
        .addColumn("secret_sealed", "text")
        .addColumn("events", "text")
        .addColumn("min_severity", "text", (c) => c.notNull())
        .addColumn("disabled_at", "text")
        .addColumn("disabled_reason", "text")
        .addColumn("created_by", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createTable("notify_deliveries")
        .addColumn("id", serialType(dialect), (c) => (dialect === "sqlite" ? c.primaryKey().autoIncrement() : c.primaryKey()))
        .addColumn("channel_id", "text", (c) => c.notNull())
        .addColumn("event_id", "integer")
        .addColumn("kind", "text", (c) => c.notNull())
        .addColumn("subject", "text", (c) => c.notNull())
        .addColumn("event", "text", (c) => c.notNull())
        .addColumn("state", "text", (c) => c.notNull())
        .addColumn("attempts", "integer", (c) => c.notNull())
        .addColumn("next_attempt_at", "text")
        .addColumn("last_status", "integer")
        .addColumn("last_error", "text")
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("notify_deliveries_due").on("notify_deliveries").columns(["state", "next_attempt_at"]).execute();
      await db.schema.createIndex("notify_deliveries_dedupe").on("notify_deliveries").columns(["channel_id", "kind", "subject", "created_at"]).execute();
      await db.schema
        .createTable("notify_cursor")
        .addColumn("id", "integer", (c) => c.primaryKey())
        .addColumn("last_event_id", "integer", (c) => c.notNull())
        .execute();
      await sql`insert into notify_cursor (id, last_event_id) select 1, coalesce(max(id), 0) from events`.execute(db);
    },
  }),
  "0011_console_sessions": () => ({
    async up(db: Kysely<unknown>) {
      // id is the sha256 of the session token in the browser's cookie, key_hash that of the
      // admin key that logged in: neither secret is stored.
      await db.schema
        .createTable("console_sessions")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("key_id", "text", (c) => c.notNull())
        .addColumn("key_hash", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("expires_at", "text", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("console_sessions_expiry").on("console_sessions").column("expires_at").execute();
    },
  }),
  // Many servers on one PostgreSQL (issue 11). `cluster_members`: each server's row, by its
  // name (one per data dir), with where it listens, its version, when it was last seen, and
  // a check value of its cluster secret (an HMAC, not the secret), so servers given
  // different secrets find out at start. `cluster_leader`: the one row whose term is the
  // fencing token (a new leader bumps it; writes of a stale one are refused). Settings the
  // whole cluster shares (the join token, sealed). `mirror_holders`: which server holds the
  // verified bytes of which mirror file, and `mirror_files.fetched_by` the server whose
  // disk has a fetch's partial bytes. On PostgreSQL, writes to the tables other servers
  // follow send a NOTIFY (schema.table) on commit, so they hear of it within a second.
  // `model_weights`: what a leader read of each model's weights (files, sizes, the GGUF
  // header), so the next leader can place replicas from nodes' caches even when the only
  // server holding the mirrored bytes is down.
  "0012_cluster": (dialect) => ({
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("cluster_members")
        .addColumn("name", "text", (c) => c.primaryKey())
        .addColumn("instance", "text", (c) => c.notNull())
        .addColumn("data_dir_id", "text", (c) => c.notNull())
        .addColumn("url", "text", (c) => c.notNull())
        .addColumn("version", "text", (c) => c.notNull())
        .addColumn("secret_check", "text", (c) => c.notNull())
        .addColumn("started_at", "text", (c) => c.notNull())
        .addColumn("last_seen", "text", (c) => c.notNull())
        .addColumn("stopped_at", "text")
        .execute();
      await db.schema
        .createTable("cluster_leader")
        .addColumn("id", "integer", (c) => c.primaryKey())
        .addColumn("term", "bigint", (c) => c.notNull())
        .addColumn("leader", "text")
        .addColumn("since", "text")
        .execute();
      await sql`insert into cluster_leader (id, term, leader, since) values (1, 0, null, null)`.execute(db);
      await db.schema
        .createTable("cluster_settings")
        .addColumn("name", "text", (c) => c.primaryKey())
        .addColumn("value", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createTable("mirror_holders")
        .addColumn("model", "text", (c) => c.notNull())
        .addColumn("version", "text", (c) => c.notNull())
        .addColumn("file", "text", (c) => c.notNull())
        .addColumn("server", "text", (c) => c.notNull())
        .addColumn("sha256", "text", (c) => c.notNull())
        .addColumn("size", "bigint", (c) => c.notNull())
        .addColumn("verified_at", "text", (c) => c.notNull())
        .addPrimaryKeyConstraint("mirror_holders_pk", ["model", "version", "file", "server"])
        .execute();
      await db.schema.alterTable("mirror_files").addColumn("fetched_by", "text").execute();
      await db.schema
        .createTable("model_weights")
        .addColumn("model_id", "text", (c) => c.primaryKey())
        .addColumn("source", "text", (c) => c.notNull())
        .addColumn("weights", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      if (dialect !== "postgres") return;
      await sql`create or replace function llmgw_notify_change() returns trigger language plpgsql as $$
        begin
          perform pg_notify('llmgw_changes', tg_table_schema || '.' || tg_table_name);
          return null;
        end $$`.execute(db);
      for (const table of CHANGE_FEED_TABLES) {
        // Updates of the columns written on every use (a key's last use, a node's heartbeat)
        // are not news to the other servers: telling them would empty their caches each time.
        const quiet = QUIET_COLUMNS[table];
        const update = quiet === undefined ? sql`update` : sql`update of ${sql.join(quiet.map((column) => sql.ref(column)))}`;
        await sql`create trigger llmgw_changes after insert or ${update} or delete or truncate on ${sql.table(table)} for each statement execute function llmgw_notify_change()`.execute(
          db,
        );
      }
    },
  }),
  "0013_usage_estimated": () => ({
    async up(db: Kysely<unknown>) {
      // 1: the row's token counts are the gateway's estimate, the upstream reported none.
      await db.schema
        .alterTable("usage")
        .addColumn("estimated", "integer", (c) => c.notNull().defaultTo(0))
        .execute();
      // How many requests of the minute or hour were counted so.
      for (const table of ["usage_minutes", "usage_hours"]) {
        await db.schema
          .alterTable(table)
          .addColumn("estimated_requests", "integer", (c) => c.notNull().defaultTo(0))
          .execute();
      }
    },
  }),
  // Autoscaling (issue 28). `model_scaling`: the leader's replicas wanted per autoscaled
  // model and its last decision (JSON), so a restart or a new leader goes on from there
  // instead of dropping to scaling.min, and standbys show it. `gateway_loads`: each server's
  // requests in flight and queued (JSON, by model and by replica), stamped on the database's
  // clock, which the leader sums to decide and to drain.
  "0014_autoscaling": (dialect) => ({
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("model_scaling")
        .addColumn("model_id", "text", (c) => c.primaryKey())
        .addColumn("desired", "integer", (c) => c.notNull())
        .addColumn("last_decision", "text")
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createTable("gateway_loads")
        .addColumn("server", "text", (c) => c.primaryKey())
        .addColumn("loads", "text", (c) => c.notNull())
        .addColumn("reported_at", "text", (c) => c.notNull())
        .execute();
      if (dialect !== "postgres") return;
      for (const table of CHANGE_FEED_TABLES_0014) {
        await sql`create trigger llmgw_changes after insert or update or delete or truncate on ${sql.table(table)} for each statement execute function llmgw_notify_change()`.execute(
          db,
        );
      }
    },
  }),
  // The Responses API's stored responses (issue 29): one row per response a key asked to
  // keep, with the input items it was given and the response it got (JSON), and the
  // response it continues. Rows go at expires_at (the retention setting when written).
  "0015_responses": () => ({
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("responses")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("key_id", "text", (c) => c.notNull())
        .addColumn("previous_response_id", "text")
        .addColumn("model", "text", (c) => c.notNull())
        .addColumn("input", "text", (c) => c.notNull())
        .addColumn("response", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("expires_at", "text", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("responses_expires_at").on("responses").column("expires_at").execute();
    },
  }),
  // External models' api_keys (issue 25) are sealed by no migration: the secret box is not
  // known when migrations run (on PostgreSQL it comes from the cluster secret) and a
  // migration calls no live code. The catalog seals plain keys when a server reads them
  // (src/catalog/sealed-keys.ts), with the key every server on the database shares.
};

/**
 * The tables whose writes other servers follow (src/cluster/change-feed.ts): the catalog,
 * keys, replicas and parking, nodes, console sessions and mirror holders.
 */
export const CHANGE_FEED_TABLES = [
  "models",
  "model_aliases",
  "api_keys",
  "replicas",
  "model_states",
  "nodes",
  "console_sessions",
  "mirror_holders",
  "cluster_leader",
] as const;

/** The followed tables added by 0014_autoscaling (0012's list is frozen with it). */
export const CHANGE_FEED_TABLES_0014 = ["model_scaling"] as const;

/** For the followed tables whose rows are stamped on every use: the columns whose updates are news. */
const QUIET_COLUMNS: Partial<Record<(typeof CHANGE_FEED_TABLES)[number], string[]>> = {
  api_keys: [
    "name",
    "prefix",
    "hash",
    "role",
    "allowed_models",
    "expires_at",
    "revoked_at",
    "rpm",
    "tpm",
    "budget_usd",
    "budget_period",
    "model_limits",
    "guards",
  ],
  nodes: ["name", "address", "labels", "inventory", "state", "credential_hash", "removed_at"],
};

/** Any number, the same in every llmgw: the key of the advisory lock migrations hold. */
const MIGRATION_LOCK_KEY = 0x6c6d6777;

/**
 * Applies every migration not yet recorded in `llmgw_migrations`; returns the names
 * applied. `until` (tests only) stops after the migration of that name, so a test can
 * write rows as an older llmgw did and then see the next migration take them over.
 */
export async function applyMigrations(db: Kysely<unknown>, dialect: Dialect, until?: string): Promise<string[]> {
  return db.transaction().execute(async (trx) => {
    if (dialect === "postgres") await sql`select pg_advisory_xact_lock(${MIGRATION_LOCK_KEY})`.execute(trx);
    await trx.schema
      .createTable("llmgw_migrations")
      .ifNotExists()
      .addColumn("name", "text", (c) => c.primaryKey())
      .addColumn("applied_at", "text", (c) => c.notNull())
      .execute();
    const done = new Set((await sql<{ name: string }>`select name from llmgw_migrations`.execute(trx)).rows.map((row) => row.name));
    const applied: string[] = [];
    for (const [name, factory] of Object.entries(migrations).sort(([a], [b]) => a.localeCompare(b))) {
      if (done.has(name)) continue;
      if (until !== undefined && name.localeCompare(until) > 0) break;
      try {
        await factory(dialect).up(trx);
      } catch (error) {
        throw new MigrationError(name, error);
      }
      await sql`insert into llmgw_migrations (name, applied_at) values (${name}, ${new Date().toISOString()})`.execute(trx);
      applied.push(name);
    }
    return applied;
  });
}

export class MigrationError extends Error {
  constructor(
    readonly migration: string,
    cause: unknown,
  ) {
    super(`migration ${migration} failed: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
  }
}
