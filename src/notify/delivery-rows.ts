// The delivery queue in the store: one row per event per channel, with its attempts, last
// answer and next try. Rows are the queue (a restarted server carries on with them) and the
// channel's delivery log at once (`ctl notify log`). States: pending (waiting for its next
// try), sending (claimed by a sender until its lease, in next_attempt_at, runs out),
// delivered, failed (given up, or the channel said 410), cancelled (its channel was
// disabled before it went out). A sender claims rows in one statement, so two senders
// (two servers on one PostgreSQL) never send one row at once; a row whose sender died is
// claimed again when its lease ends.
import { sql } from "kysely";
import type { Db, Store, Tx } from "../store/store.ts";
import type { NotifyEvent } from "./messages.ts";

export type DeliveryState = "pending" | "sending" | "delivered" | "failed" | "cancelled";

export interface Delivery {
  id: number;
  channelId: string;
  event: NotifyEvent;
  attempts: number;
  createdAt: string;
  /** The claim's lease: only the sender holding this claim may record the answer. */
  lease: string;
}

/** A line of a channel's delivery log, as the API shows it. */
export interface DeliveryView {
  id: number;
  kind: string;
  subject: string;
  event_id: number | null;
  state: DeliveryState;
  attempts: number;
  last_status: number | null;
  last_error: string | null;
  next_attempt_at: string | null;
  created_at: string;
  updated_at: string;
}

export class DeliveryRows {
  constructor(private readonly store: Store) {}

  /**
   * Whether the channel got (or is getting) this kind about this subject since `since`: the
   * hourly de-duplication. Deliveries that never arrived (failed, cancelled) do not count, so
   * a channel enabled again after a 410 hears about what happens next.
   */
  async sentSince(trx: Tx | Db, channelId: string, event: NotifyEvent, since: string): Promise<boolean> {
    const row = await trx
      .selectFrom("notify_deliveries")
      .select("id")
      .where("channel_id", "=", channelId)
      .where("kind", "=", event.kind)
      .where("subject", "=", event.subject)
      .where("created_at", ">=", since)
      .where("event_id", "is not", null)
      .where("state", "in", ["pending", "sending", "delivered"])
      .limit(1)
      .executeTakeFirst();
    return row !== undefined;
  }

  /** A new row: pending (due at once), or sending (claimed by the caller until `dueAt`). */
  async insert(trx: Tx | Db, channelId: string, event: NotifyEvent, state: "pending" | "sending", now: string, dueAt = now): Promise<number> {
    const row = await trx
      .insertInto("notify_deliveries")
      .values({
        channel_id: channelId,
        event_id: event.id,
        kind: event.kind,
        subject: event.subject,
        event: JSON.stringify(event),
        state,
        attempts: 0,
        next_attempt_at: dueAt,
        last_status: null,
        last_error: null,
        created_at: now,
        updated_at: now,
      })
      .returning("id")
      .executeTakeFirstOrThrow();
    return Number(row.id);
  }

  /**
   * Claims up to `limit` rows whose next try has come (and rows whose sender's lease ran out):
   * they become `sending` until `leaseUntil`. One statement: on PostgreSQL, rows another
   * server is claiming are skipped, not waited for.
   */
  async claimDue(now: string, leaseUntil: string, limit: number): Promise<Delivery[]> {
    const lock = this.store.dialect === "postgres" ? sql`for update skip locked` : sql``;
    const result = await sql<{ id: number; channel_id: string; event: string; attempts: number; created_at: string }>`
      update notify_deliveries set state = 'sending', next_attempt_at = ${leaseUntil}, updated_at = ${now}
      where id in (
        select id from notify_deliveries
        where state in ('pending', 'sending') and next_attempt_at <= ${now}
        order by next_attempt_at, id limit ${limit} ${lock}
      )
      returning id, channel_id, event, attempts, created_at`.execute(this.store.db);
    return result.rows.map((row) => ({
      id: Number(row.id),
      channelId: row.channel_id,
      event: JSON.parse(row.event) as NotifyEvent,
      attempts: Number(row.attempts),
      createdAt: row.created_at,
      lease: leaseUntil,
    }));
  }

  async get(id: number): Promise<DeliveryView | null> {
    const row = await this.store.db.selectFrom("notify_deliveries").selectAll().where("id", "=", id).executeTakeFirst();
    return row === undefined ? null : toView(row);
  }

  /** Records an attempt's answer on a row this sender claimed: the state it leaves and when it is tried next. */
  async settle(
    claim: Pick<Delivery, "id" | "lease">,
    change: { state: DeliveryState; attempts: number; status: number | null; error: string | null; nextAttemptAt: string | null; now: string },
  ): Promise<void> {
    await this.store.db
      .updateTable("notify_deliveries")
      .set({
        state: change.state,
        attempts: change.attempts,
        last_status: change.status,
        last_error: change.error,
        next_attempt_at: change.nextAttemptAt,
        updated_at: change.now,
      })
      .where("id", "=", claim.id)
      // A row cancelled meanwhile (its channel disabled) stays cancelled, and a sender whose
      // claim ran out (a stall past its lease) does not overwrite the one that claimed it next.
      .where("state", "=", "sending")
      .where("next_attempt_at", "=", claim.lease)
      .execute();
  }

  /** A disabled channel's waiting deliveries will not go out; they say why. */
  async cancelPending(channelId: string, reason: string, now: string): Promise<void> {
    await this.store.db
      .updateTable("notify_deliveries")
      .set({ state: "cancelled", last_error: reason, next_attempt_at: null, updated_at: now })
      .where("channel_id", "=", channelId)
      .where("state", "in", ["pending", "sending"])
      .execute();
  }

  /** Newest first. */
  async log(channelId: string, limit: number): Promise<DeliveryView[]> {
    const rows = await this.store.db
      .selectFrom("notify_deliveries")
      .selectAll()
      .where("channel_id", "=", channelId)
      .orderBy("id", "desc")
      .limit(limit)
      .execute();
    return rows.map(toView);
  }

  /** Finished rows older than `before` are deleted; pending ones stay whatever their age. */
  async prune(before: string): Promise<void> {
    await this.store.db.deleteFrom("notify_deliveries").where("state", "in", ["delivered", "failed", "cancelled"]).where("updated_at", "<", before).execute();
  }

  async counts(channelId: string): Promise<Record<DeliveryState, number>> {
    const rows = await this.store.db
      .selectFrom("notify_deliveries")
      .select(["state", sql<number>`count(*)`.as("count")])
      .where("channel_id", "=", channelId)
      .groupBy("state")
      .execute();
    const counts: Record<DeliveryState, number> = { pending: 0, sending: 0, delivered: 0, failed: 0, cancelled: 0 };
    for (const row of rows) counts[row.state as DeliveryState] = Number(row.count);
    return counts;
  }
}

type Row = {
  id: number;
  kind: string;
  subject: string;
  event_id: number | null;
  state: string;
  attempts: number;
  last_status: number | null;
  last_error: string | null;
  next_attempt_at: string | null;
  created_at: string;
  updated_at: string;
};

function toView(row: Row): DeliveryView {
  return {
    id: Number(row.id),
    kind: row.kind,
    subject: row.subject,
    event_id: row.event_id === null ? null : Number(row.event_id),
    state: row.state as DeliveryState,
    attempts: Number(row.attempts),
    last_status: row.last_status === null ? null : Number(row.last_status),
    last_error: row.last_error,
    next_attempt_at: row.state === "pending" ? row.next_attempt_at : null,
    created_at: row.created_at,
    updated_at: row.updated_at,
  };
}
