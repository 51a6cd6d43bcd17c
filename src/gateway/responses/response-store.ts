// The Responses API's kept responses: a response created with `store` (the default, as
// OpenAI's) is written here before the client gets its end, with the input items it was
// given, so `previous_response_id` can continue it and GET /v1/responses/{id} (and its
// input_items) and DELETE can reach it. Each belongs to the key that created it: another
// key gets the same "not found" as for an id that never existed, so ids cannot be probed.
// Rows expire after the retention (--responses-retention, 30 days by default, as OpenAI
// keeps them); an expired row is never read, and a sweep deletes expired rows at start
// and every hour, a slice at a time (a long delete on SQLite would block the hot path).
import type { Statement } from "better-sqlite3";
import { sql } from "kysely";
import { BadRequestError, describeError } from "../../core/errors.ts";
import { HourlyJob } from "../../core/hourly-job.ts";
import type { Logger } from "../../core/log.ts";
import type { ResponsesTable } from "../../store/schema.ts";
import type { Store } from "../../store/store.ts";
import type { ResponseObject, StoredItem } from "./response-types.ts";

export const DEFAULT_RESPONSES_RETENTION_DAYS = 30;
/** A hundred years: beyond this an expiry no longer fits an ISO date (0 is the way to say "until deleted"). */
export const MAX_RESPONSES_RETENTION_DAYS = 36_500;
const DAY_MS = 86_400_000;
const DELETE_SLICE = 2000;
/** SQLite: how long a kept response may wait in memory before it is written (see keep). */
const WRITE_BEHIND_MS = 100;
/** The furthest back a chain is followed: a conversation longer than this starts at its last turns. */
export const MAX_CHAIN_DEPTH = 1000;
/** Expiry of rows kept for ever (retention 0): a date that sorts after any real one. */
const NEVER = "9999-12-31T23:59:59.999Z";

export interface StoredResponse {
  id: string;
  previousResponseId: string | null;
  model: string;
  /** The request's input items, as listed by input_items. */
  input: StoredItem[];
  response: ResponseObject;
}

export interface ResponseStoreOptions {
  store: Store;
  /** Days a response is kept; 0 keeps them until deleted (default 30). */
  retentionDays?: number | undefined;
  clock?: () => number;
  logger?: Logger;
}

const ROW_COLUMNS = ["id", "key_id", "previous_response_id", "model", "input", "response", "created_at", "expires_at"] as const;

interface Row {
  id: string;
  previous_response_id: string | null;
  model: string;
  input: string;
  response: string;
}

export class ResponseStore {
  private readonly store: Store;
  private readonly clock: () => number;
  readonly retentionDays: number;
  private insert: Statement<unknown[]> | undefined;
  /** SQLite: kept responses not yet written (see keep). */
  private pending: ResponsesTable[] = [];

  constructor(private readonly options: ResponseStoreOptions) {
    this.store = options.store;
    this.clock = options.clock ?? Date.now;
    this.retentionDays = options.retentionDays ?? DEFAULT_RESPONSES_RETENTION_DAYS;
    if (!Number.isInteger(this.retentionDays) || this.retentionDays < 0 || this.retentionDays > MAX_RESPONSES_RETENTION_DAYS) {
      throw new BadRequestError(
        `Invalid responses retention ${this.retentionDays}: expected whole days from 0 (until deleted) to ${MAX_RESPONSES_RETENTION_DAYS}.`,
        { code: "invalid_config" },
      );
    }
  }

  /** Writes a response at once; `responseJson`: the response already serialised (the client's answer is made of it). */
  async save(keyId: string, stored: StoredResponse, responseJson?: string): Promise<void> {
    const row = this.rowOf(keyId, stored, responseJson);
    const insert = this.sqliteInsert();
    if (insert === null) {
      await this.store.db.insertInto("responses").values(row).execute();
      return;
    }
    this.writePending();
    try {
      insert.run(ROW_COLUMNS.map((column) => row[column]));
    } catch (error) {
      throw this.store.nameFault(error);
    }
  }

  private rowOf(keyId: string, stored: StoredResponse, responseJson = JSON.stringify(stored.response)): ResponsesTable {
    const now = this.clock();
    return {
      id: stored.id,
      key_id: keyId,
      previous_response_id: stored.previousResponseId,
      model: stored.model,
      input: JSON.stringify(stored.input),
      response: responseJson,
      created_at: new Date(now).toISOString(),
      expires_at: this.retentionDays === 0 ? NEVER : new Date(now + this.retentionDays * DAY_MS).toISOString(),
    };
  }

  /** On SQLite, a prepared insert: compiling a Kysely query per response cost more than the write itself. */
  private sqliteInsert(): Statement<unknown[]> | null {
    const sqlite = this.store.sqlite;
    if (sqlite === undefined) return null;
    this.insert ??= sqlite.prepare(`INSERT INTO responses (${ROW_COLUMNS.join(", ")}) VALUES (${ROW_COLUMNS.map(() => "?").join(", ")})`);
    return this.insert;
  }

  /**
   * Keeps a finished response: resolved once it is kept (on SQLite at once: undefined);
   * never rejects. A response that cannot be written (a full
   * disk, the database away) still reaches its client, whose answer it is: the failure is
   * logged, and a later request chaining on it gets the 404 that says to send the whole
   * conversation.
   *
   * On PostgreSQL the row is written before this resolves: another server may take the
   * request that chains on it. On SQLite only this server reads the store, so the row
   * waits in memory (WRITE_BEHIND_MS at most) and the rows of that time are written in one
   * transaction; every read here writes what is waiting first, so a chain finds a response
   * at once. A commit per response (~60 µs on the event loop) was most of what
   * /v1/responses added to a chat completion's latency (bench/gateway/apis.ts). What a
   * crash can lose is the last WRITE_BEHIND_MS of kept responses (usage rows wait up to
   * a second the same way); stop() writes them.
   */
  keep(keyId: string, stored: StoredResponse, responseJson?: string): Promise<void> | undefined {
    const failed = (error: unknown) =>
      this.options.logger?.warn({ err: describeError(error), response: stored.id }, "a response could not be kept; chaining on it will not find it");
    if (this.store.sqlite === undefined) return this.save(keyId, stored, responseJson).catch(failed);
    try {
      this.pending.push(this.rowOf(keyId, stored, responseJson));
      if (this.pending.length === 1) setTimeout(() => this.writePending(), WRITE_BEHIND_MS).unref();
    } catch (error) {
      failed(error);
    }
    return undefined;
  }

  /** Writes the responses waiting in memory (SQLite); logs, never throws. */
  private writePending(): void {
    if (this.pending.length === 0) return;
    const rows = this.pending;
    this.pending = [];
    const insert = this.sqliteInsert()!;
    const write = (row: ResponsesTable) => insert.run(ROW_COLUMNS.map((column) => row[column]));
    try {
      this.store.sqlite!.transaction(() => rows.forEach(write))();
    } catch {
      // One row's fault must not cost the others theirs: each alone, and those that fail are named.
      for (const row of rows) {
        try {
          write(row);
        } catch (error) {
          this.options.logger?.warn(
            { err: describeError(this.store.nameFault(error)), response: row.id },
            "a response could not be kept; chaining on it will not find it",
          );
        }
      }
    }
  }

  /** The response `id` of this key, unless it expired or was deleted. */
  async get(id: string, keyId: string): Promise<StoredResponse | undefined> {
    this.writePending();
    const row = await this.store.db
      .selectFrom("responses")
      .select(["id", "previous_response_id", "model", "input", "response"])
      .where("id", "=", id)
      .where("key_id", "=", keyId)
      .where("expires_at", ">", this.nowIso())
      .executeTakeFirst();
    return row === undefined ? undefined : fromRow(row);
  }

  /**
   * The conversation that ends with response `id`, oldest first, in one query: each
   * response's previous one, as far back as they are kept (an expired or deleted one ends
   * the chain there), at most MAX_CHAIN_DEPTH. Empty when `id` itself is not this key's.
   */
  async chain(id: string, keyId: string): Promise<StoredResponse[]> {
    this.writePending();
    const now = this.nowIso();
    const result = await sql<Row & { depth: number }>`
      with recursive chain (id, previous_response_id, model, input, response, depth) as (
        select id, previous_response_id, model, input, response, 0 from responses
          where id = ${id} and key_id = ${keyId} and expires_at > ${now}
        union all
        select r.id, r.previous_response_id, r.model, r.input, r.response, chain.depth + 1
          from responses r join chain on r.id = chain.previous_response_id
          where r.key_id = ${keyId} and r.expires_at > ${now} and chain.depth < ${MAX_CHAIN_DEPTH - 1}
      )
      select id, previous_response_id, model, input, response, depth from chain order by depth desc`.execute(this.store.db);
    return result.rows.map(fromRow);
  }

  /** Deletes response `id` of this key; false when there was none. */
  async delete(id: string, keyId: string): Promise<boolean> {
    this.writePending();
    const result = await this.store.db
      .deleteFrom("responses")
      .where("id", "=", id)
      .where("key_id", "=", keyId)
      .where("expires_at", ">", this.nowIso())
      .executeTakeFirst();
    return Number(result.numDeletedRows) > 0;
  }

  /** Deletes the expired responses; returns how many went. */
  async sweep(sliceRows = DELETE_SLICE): Promise<number> {
    this.writePending();
    const db = this.store.db;
    const now = this.nowIso();
    let total = 0;
    for (;;) {
      const slice = db.selectFrom("responses").select("id").where("expires_at", "<=", now).limit(sliceRows);
      const result = await db.deleteFrom("responses").where("id", "in", slice).executeTakeFirst();
      const deleted = Number(result.numDeletedRows);
      total += deleted;
      if (deleted < sliceRows) return total;
    }
  }

  /** Sweeps now (in the background) and every hour after. */
  start(): void {
    this.hourly.start();
  }

  /** Stops the sweeps (waiting for one under way) and writes what waits in memory. */
  async stop(): Promise<void> {
    await this.hourly.stop();
    this.writePending();
  }

  private readonly hourly = new HourlyJob(() =>
    this.sweep().then(
      (deleted) => {
        if (deleted > 0) this.options.logger?.info({ deleted }, "responses past their retention were deleted");
      },
      // A full disk or an unreachable database: the next hour tries again (expired rows are never read meanwhile).
      (error: unknown) => this.options.logger?.warn({ err: describeError(error) }, "the sweep of expired responses failed; it runs again within the hour"),
    ),
  );

  private nowIso(): string {
    return new Date(this.clock()).toISOString();
  }
}

function fromRow(row: Row): StoredResponse {
  return {
    id: row.id,
    previousResponseId: row.previous_response_id,
    model: row.model,
    input: JSON.parse(row.input) as StoredItem[],
    response: JSON.parse(row.response) as ResponseObject,
  };
}
