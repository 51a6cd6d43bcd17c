// The event log: what happened that an operator should hear about (a parked model, a lost
// node, a spent budget, new weights, a failed job), kept in the store's `events` table
// with kind, severity, subject, a readable message and structured data. Producers record;
// the events API lists and streams; the notifier sends them on. Recording never throws:
// an event that cannot be written is logged, and what caused it carries on.
//
// Readers follow the table by id (`after`), not by this process's memory, so a reader on
// another server sees the same events; `onRecorded` only wakes readers in this process at
// once instead of at their next poll.
import { sql } from "kysely";
import type { Logger } from "../core/log.ts";
import { describeError } from "../core/errors.ts";
import { nowIso, type Store } from "../store/store.ts";
import { EVENT_KINDS, type EventKind, type Severity } from "./event-kinds.ts";

export interface NewEvent {
  kind: Exclude<EventKind, "notify_test">;
  /** What it is about: "model:NAME", "node:NAME", "key:NAME", "job:ID". */
  subject: string;
  message: string;
  /** Structured fields for machines (model, node, key, job, revisions...); the webhook's `data`. */
  data?: Record<string, unknown>;
  /** The kind's own severity unless given. */
  severity?: Severity;
}

export interface StoredEvent {
  id: number;
  at: string;
  kind: string;
  severity: Severity;
  subject: string;
  message: string;
  data: Record<string, unknown>;
}

export interface EventQuery {
  kinds?: readonly string[];
  /** ISO time: events at or after it. */
  since?: string;
  limit?: number;
}

type EventRow = { id: number; at: string; kind: string; severity: string; subject: string; message: string; data: string | null };

/** Any number, the same in every llmgw: the advisory lock event inserts take on PostgreSQL. */
const EVENTS_INSERT_LOCK = 0x6c6d6765;

const COLUMNS = ["id", "at", "kind", "severity", "subject", "message", "data"] as const;

export class EventLog {
  private readonly listeners = new Set<(event: StoredEvent) => void>();
  /** PostgreSQL: this process's event writes, one after another, so a burst waits here rather than on the lock with a pool connection each. */
  private writes: Promise<unknown> = Promise.resolve();
  private readonly clock: () => number;

  constructor(private readonly options: { store: Store; logger: Logger; clock?: () => number }) {
    this.clock = options.clock ?? Date.now;
  }

  /** Writes the event; null when the store refused it (logged). */
  async record(event: NewEvent): Promise<StoredEvent | null> {
    const row = {
      at: nowIso(this.clock),
      kind: event.kind,
      severity: event.severity ?? EVENT_KINDS[event.kind].severity,
      subject: event.subject,
      message: event.message,
      data: JSON.stringify(event.data ?? {}),
    };
    let id: number;
    try {
      const { store } = this.options;
      // PostgreSQL takes an id from the sequence when an insert starts, so two inserts could
      // commit out of id order, and a reader following ids would skip the one committed last.
      // One lock for every event insert (held to commit) keeps ids and commits in one order,
      // across servers too. SQLite writes one at a time already.
      const plainInsert = async () => Number((await store.db.insertInto("events").values(row).returning("id").executeTakeFirstOrThrow()).id);
      if (store.dialect === "postgres") {
        const write = this.writes.then(() =>
          store.db
            .transaction()
            .execute(async (trx) => {
              // A holder that hangs (a lost connection) must not stop every server's events for long.
              await sql`set local lock_timeout = '5s'`.execute(trx);
              await sql`select pg_advisory_xact_lock(${EVENTS_INSERT_LOCK})`.execute(trx);
              return Number((await trx.insertInto("events").values(row).returning("id").executeTakeFirstOrThrow()).id);
            })
            // Without the lock rather than not at all: readers wait at a gap a few seconds anyway (notifier.ts `settled`).
            .catch(plainInsert),
        );
        this.writes = write.catch(() => undefined);
        id = await write;
      } else {
        id = await plainInsert();
      }
    } catch (error) {
      this.options.logger.warn({ kind: event.kind, subject: event.subject, err: describeError(error) }, "could not record an event");
      return null;
    }
    const stored = toEvent({ ...row, id });
    for (const listener of this.listeners) listener(stored);
    return stored;
  }

  /** Calls `listener` after each event this process records; returns the unsubscribe. */
  onRecorded(listener: (event: StoredEvent) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Newest first. */
  async list(query: EventQuery = {}): Promise<StoredEvent[]> {
    let select = this.options.store.db
      .selectFrom("events")
      .select(COLUMNS)
      .orderBy("id", "desc")
      .limit(query.limit ?? 100);
    if (query.kinds !== undefined && query.kinds.length > 0) select = select.where("kind", "in", [...query.kinds]);
    if (query.since !== undefined) select = select.where("at", ">=", query.since);
    return (await select.execute()).map(toEvent);
  }

  /** Events with an id above `id`, oldest first: how followers (the stream, the notifier) catch up. */
  async after(id: number, limit = 100): Promise<StoredEvent[]> {
    const rows = await this.options.store.db.selectFrom("events").select(COLUMNS).where("id", ">", id).orderBy("id", "asc").limit(limit).execute();
    return rows.map(toEvent);
  }

  /** Deletes events older than `before` (ISO time). */
  async prune(before: string): Promise<void> {
    await this.options.store.db.deleteFrom("events").where("at", "<", before).execute();
  }

  /** The id of the newest event, 0 when there is none. */
  async latestId(): Promise<number> {
    const row = await this.options.store.db
      .selectFrom("events")
      .select((eb) => eb.fn.max("id").as("id"))
      .executeTakeFirst();
    return Number(row?.id ?? 0);
  }
}

function toEvent(row: EventRow): StoredEvent {
  let data: Record<string, unknown> = {};
  if (row.data !== null) {
    try {
      data = JSON.parse(row.data) as Record<string, unknown>;
    } catch {
      // Rows are written by this module only; an unreadable one still shows its message.
    }
  }
  return { id: Number(row.id), at: row.at, kind: row.kind, severity: row.severity as Severity, subject: row.subject, message: row.message, data };
}
