// How a server hears that another changed something it keeps in memory (the catalog, keys,
// replica rows, parking, nodes, console sessions, mirror holders). Migration 0012 has
// PostgreSQL send `NOTIFY llmgw_changes, 'schema.table'` when a write to one of those
// tables commits; this module LISTENs on a connection of its own and tells each subscriber
// of the tables it follows. Changes of one table within `coalesceMs` make one call.
//
// Notifications are not stored: one sent while the connection was down is lost. So after
// every (re)connect, and every `resyncMs` as a safety net, every subscriber is called as if
// all its tables had changed, and reloads.
//
// The listening connection is checked with a query every `heartbeatMs`: one that gets no
// answer within the query deadline (a silent database, a partition) is destroyed, since
// an idle LISTEN would otherwise never learn it is dead. Reconnects back off (from
// `reconnectMs` up to `maxReconnectMs`); an outage is logged when it starts and when it
// ends, not at every try, and so is a subscriber that cannot reload meanwhile.
//
// SQLite has one server, whose own writes already update its memory: the feed is silent.
import type pg from "pg";
import { sql } from "kysely";
import { describeError } from "../core/errors.ts";
import { Backoff } from "../core/backoff.ts";
import { destroyClient, endClient } from "../store/postgres-connections.ts";
import type { Logger } from "../core/log.ts";
import type { Store } from "../store/store.ts";
import type { CHANGE_FEED_TABLES, CHANGE_FEED_TABLES_0014 } from "../store/migrations.ts";

export type FollowedTable = (typeof CHANGE_FEED_TABLES)[number] | (typeof CHANGE_FEED_TABLES_0014)[number];
/** `notified`: a notification of another server's write is among the causes (not only a resync). */
export type ChangeListener = (tables: ReadonlySet<FollowedTable>, cause: { notified: boolean }) => void | Promise<void>;

export const CHANGE_FEED_DEFAULTS = {
  coalesceMs: 20,
  resyncMs: 30_000,
  reconnectMs: 1_000,
  maxReconnectMs: 5_000,
  heartbeatMs: 5_000,
} as const;

const CHANNEL = "llmgw_changes";

interface Subscription {
  tables: ReadonlySet<FollowedTable>;
  listener: ChangeListener;
  pending: Set<FollowedTable>;
  /** Whether a notification (not only a resync) marked the pending tables. */
  notified: boolean;
  timer: NodeJS.Timeout | undefined;
  /** One call at a time per subscriber; changes meanwhile make one more call after it. */
  running: Promise<void>;
  /** Whether its last reload failed (so that a failing one is logged once, not at every retry). */
  failing: boolean;
}

/** A message one server sends the others (not a table write): `~topic:value` after the schema. */
type TopicListener = (value: string) => void;

export class ChangeFeed {
  private readonly subscriptions = new Set<Subscription>();
  private readonly topics = new Map<string, Set<TopicListener>>();
  private client: pg.Client | null = null;
  private resyncTimer: NodeJS.Timeout | undefined;
  private reconnectTimer: NodeJS.Timeout | undefined;
  private heartbeatTimer: NodeJS.Timeout | undefined;
  /** One heartbeat query at a time: a silent connection must not pile them up. */
  private heartbeating = false;
  private stopped = false;
  private readonly settings: { coalesceMs: number; resyncMs: number; reconnectMs: number; heartbeatMs: number };
  private readonly reconnects: Backoff;
  /** When the listening connection was lost (for the one log line when it is back); null while it listens. */
  private lostSince: number | null = null;

  constructor(
    private readonly options: {
      store: Store;
      logger: Logger;
      coalesceMs?: number;
      resyncMs?: number;
      reconnectMs?: number;
      heartbeatMs?: number;
    },
  ) {
    this.settings = {
      coalesceMs: options.coalesceMs ?? CHANGE_FEED_DEFAULTS.coalesceMs,
      resyncMs: options.resyncMs ?? CHANGE_FEED_DEFAULTS.resyncMs,
      reconnectMs: options.reconnectMs ?? CHANGE_FEED_DEFAULTS.reconnectMs,
      heartbeatMs: options.heartbeatMs ?? CHANGE_FEED_DEFAULTS.heartbeatMs,
    };
    const reconnectMs = this.settings.reconnectMs;
    this.reconnects = new Backoff({ baseMs: reconnectMs, maxMs: Math.max(reconnectMs, CHANGE_FEED_DEFAULTS.maxReconnectMs), jitter: 0.2 });
  }

  /** Whether the connection that hears other servers' changes is listening now. */
  get listening(): boolean {
    return this.client !== null;
  }

  /** Whether other servers can write this database (PostgreSQL): only then is there anything to hear. */
  get shared(): boolean {
    return this.options.store.dialect === "postgres";
  }

  /** Calls `listener` after other servers' writes to any of `tables` (and at resyncs). */
  subscribe(tables: readonly FollowedTable[], listener: ChangeListener): () => void {
    const subscription: Subscription = {
      tables: new Set(tables),
      listener,
      pending: new Set(),
      notified: false,
      timer: undefined,
      running: Promise.resolve(),
      failing: false,
    };
    this.subscriptions.add(subscription);
    return () => {
      this.subscriptions.delete(subscription);
      if (subscription.timer !== undefined) clearTimeout(subscription.timer);
    };
  }

  /** Calls `listener` with each value other servers `tell` on the topic. */
  onTold(topic: string, listener: TopicListener): () => void {
    const listeners = this.topics.get(topic) ?? new Set<TopicListener>();
    listeners.add(listener);
    this.topics.set(topic, listeners);
    return () => listeners.delete(listener);
  }

  /** Sends a value on a topic to every server listening (this one too); lost if none listens. */
  tell(topic: string, value: string): void {
    if (!this.shared) return;
    void sql`select pg_notify(${CHANNEL}, ${`${this.options.store.schema}.~${topic}:${value}`})`
      .execute(this.options.store.db)
      .catch((error: unknown) => this.options.logger.warn({ topic, err: describeError(error) }, "could not tell the other servers"));
  }

  /** Starts listening (PostgreSQL); resolves once the first LISTEN is in place. */
  async start(): Promise<void> {
    if (!this.shared) return;
    await this.connect();
    this.resyncTimer = setInterval(() => this.resync(), this.settings.resyncMs);
    this.resyncTimer.unref();
    this.heartbeatTimer = setInterval(() => this.heartbeat(), this.settings.heartbeatMs);
    this.heartbeatTimer.unref();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.resyncTimer !== undefined) clearInterval(this.resyncTimer);
    if (this.heartbeatTimer !== undefined) clearInterval(this.heartbeatTimer);
    if (this.reconnectTimer !== undefined) clearTimeout(this.reconnectTimer);
    for (const subscription of this.subscriptions) if (subscription.timer !== undefined) clearTimeout(subscription.timer);
    const client = this.client;
    this.client = null;
    if (client !== null) await endClient(client);
    await Promise.all([...this.subscriptions].map((subscription) => subscription.running));
  }

  /** Every subscriber reloads everything it follows. */
  resync(): void {
    for (const subscription of this.subscriptions) for (const table of subscription.tables) this.mark(subscription, table, false);
  }

  private async connect(): Promise<void> {
    let client: pg.Client | undefined;
    try {
      client = await this.options.store.dedicatedClient!();
      const listening = client;
      if (this.stopped) {
        await endClient(client);
        return;
      }
      client.on("notification", (message) => {
        if (message.channel !== CHANNEL || message.payload === undefined) return;
        const dot = message.payload.indexOf(".");
        // Other schemas of the same database (other llmgw installs, tests) notify on the same channel.
        if (message.payload.slice(0, dot) !== this.options.store.schema) return;
        const rest = message.payload.slice(dot + 1);
        if (rest.startsWith("~")) this.told(rest.slice(1));
        else this.changed(rest as FollowedTable);
      });
      client.on("end", () => {
        if (this.client !== listening) return;
        this.client = null;
        if (!this.stopped) {
          this.lost("lost the connection that hears other servers' changes; reconnecting until the database answers");
          this.scheduleReconnect();
        }
      });
      await client.query(`listen ${CHANNEL}`);
      if (this.stopped) {
        await endClient(client);
        return;
      }
      this.client = client;
      this.reconnects.succeeded();
      if (this.lostSince !== null) {
        this.options.logger.info({ after_ms: Date.now() - this.lostSince }, "hears other servers' changes again; reloading what it keeps");
        this.lostSince = null;
      }
      // Whatever was written while nobody listened is read now.
      this.resync();
    } catch (error) {
      if (client !== undefined && this.client !== client) destroyClient(client);
      this.lost("could not listen for other servers' changes; retrying until the database answers", error);
      this.scheduleReconnect();
    }
  }

  /** The first failure of an outage is logged; the tries after it are not. */
  private lost(message: string, error?: unknown): void {
    if (this.lostSince !== null) return;
    this.lostSince = Date.now();
    this.options.logger.warn(error === undefined ? {} : { err: describeError(error) }, message);
  }

  private scheduleReconnect(): void {
    if (this.stopped || this.reconnectTimer !== undefined) return;
    this.reconnectTimer = setTimeout(() => {
      this.reconnectTimer = undefined;
      void this.connect();
    }, this.reconnects.failed());
    this.reconnectTimer.unref();
  }

  /**
   * A query on the listening connection: one that fails or gets no answer within the query
   * deadline destroys the connection, whose "end" then reconnects.
   */
  private heartbeat(): void {
    const client = this.client;
    if (client === null || this.stopped || this.heartbeating) return;
    this.heartbeating = true;
    void client
      .query("select 1")
      .catch(() => {
        if (this.client === client) destroyClient(client);
      })
      .finally(() => (this.heartbeating = false));
  }

  private told(message: string): void {
    const colon = message.indexOf(":");
    for (const listener of this.topics.get(message.slice(0, colon)) ?? []) {
      try {
        listener(message.slice(colon + 1));
      } catch (error) {
        this.options.logger.warn({ err: describeError(error) }, "a message from another server could not be handled");
      }
    }
  }

  private changed(table: FollowedTable): void {
    for (const subscription of this.subscriptions) if (subscription.tables.has(table)) this.mark(subscription, table, true);
  }

  private mark(subscription: Subscription, table: FollowedTable, notified: boolean): void {
    subscription.pending.add(table);
    if (notified) subscription.notified = true;
    if (subscription.timer !== undefined) return;
    subscription.timer = setTimeout(() => {
      subscription.timer = undefined;
      subscription.running = subscription.running.then(async () => {
        if (!this.subscriptions.has(subscription) || subscription.pending.size === 0) return;
        const tables = new Set(subscription.pending);
        const notified = subscription.notified;
        subscription.pending.clear();
        subscription.notified = false;
        try {
          await subscription.listener(tables, { notified });
          if (subscription.failing) this.options.logger.info({ tables: [...tables] }, "took in other servers' changes again");
          subscription.failing = false;
        } catch (error) {
          if (!subscription.failing)
            this.options.logger.warn(
              { err: describeError(error), tables: [...tables] },
              "could not take in another server's change; trying again every second",
            );
          subscription.failing = true;
          const retry = setTimeout(() => {
            if (this.subscriptions.has(subscription)) for (const table of tables) this.mark(subscription, table, notified);
          }, this.settings.reconnectMs);
          retry.unref();
        }
      });
    }, this.settings.coalesceMs);
    subscription.timer.unref();
  }
}
