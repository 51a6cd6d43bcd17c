// The notifier: sends events on to the channels that want them, at least once. It follows
// the events table with a cursor kept in the store (so an event recorded just before a
// crash is still fanned out after it), turns each event into one delivery per matching
// channel (skipping a kind about a subject the channel was sent within the hour: a
// flapping node notifies once), and sends due deliveries, retrying with exponential
// backoff for up to a day. A 410 disables the channel. A pass runs when an event is
// recorded in this process and every `pollMs` otherwise; one pass at a time. A pass that
// fails (the database unreachable) leaves the cursor and the deliveries where they were
// and runs again at the next poll; an outage is logged when it starts and when it ends.
import type { Logger } from "../core/log.ts";
import { describeError, NotFoundError, UnavailableError } from "../core/errors.ts";
import { backoffDelay } from "../core/backoff.ts";
import { CoalescedRun } from "../core/coalesced-run.ts";
import { severityRank } from "../events/event-kinds.ts";
import type { EventLog } from "../events/event-log.ts";
import { nowIso, type Store } from "../store/store.ts";
import { recordAudit } from "../store/audit.ts";
import type { Channel, ChannelStore } from "./channels.ts";
import { DeliveryRows, type Delivery, type DeliveryView } from "./delivery-rows.ts";
import type { NotifyEvent } from "./messages.ts";
import { sendNotification, type SendOutcome } from "./sender.ts";
import { webhookAgent, type WebhookAddressPolicy } from "./webhook-address.ts";
import type { Agent } from "undici";

export const NOTIFY_DEFAULTS = {
  /** The receiver must answer within this. */
  timeoutMs: 10_000,
  /** The first retry waits this; each next one twice as long as the last, up to maxBackoffMs. */
  backoffMs: 5_000,
  maxBackoffMs: 60 * 60_000,
  /** A delivery not through after this is given up. */
  giveUpMs: 24 * 60 * 60_000,
  /** One kind about one subject goes to a channel once within this. */
  dedupeMs: 60 * 60_000,
  pollMs: 1_000,
  /** Deliveries sent at once in a pass. */
  batch: 16,
  /** Finished deliveries are kept this long in the log. */
  keepMs: 30 * 24 * 60 * 60_000,
  /** Events are kept this long (the events API, the console's history). */
  keepEventsMs: 90 * 24 * 60 * 60_000,
};

export interface NotifierOptions {
  store: Store;
  events: EventLog;
  channels: ChannelStore;
  logger: Logger;
  /** Where Slack messages link to (the console). */
  consoleUrl: () => string;
  clock?: () => number;
  settings?: Partial<typeof NOTIFY_DEFAULTS>;
  /** Which receiver addresses deliveries may connect to (default: public ones only). */
  addresses?: WebhookAddressPolicy;
}

export class Notifier {
  readonly deliveries: DeliveryRows;
  private readonly settings: typeof NOTIFY_DEFAULTS;
  private readonly clock: () => number;
  private timer: NodeJS.Timeout | undefined;
  private unsubscribe: (() => void) | undefined;
  private readonly passes: CoalescedRun;
  private stopped = false;
  private lastPrune = 0;
  /** Since when passes fail, for one log line at each end of an outage; null while they work. */
  private failingSince: number | null = null;
  /** Tests being sent now: stop() waits for them, so none writes after the store closes. */
  private readonly tests = new Set<Promise<unknown>>();
  /** Aborts the attempts in flight at stop: each is recorded as failed and retried after the restart. */
  private stopping = new AbortController();
  /** Connects to receivers, checking each address first; made at the first send, closed at stop. */
  private dispatcher: Agent | undefined;

  constructor(private readonly options: NotifierOptions) {
    this.deliveries = new DeliveryRows(options.store);
    this.settings = { ...NOTIFY_DEFAULTS, ...options.settings };
    this.clock = options.clock ?? Date.now;
    this.passes = new CoalescedRun(
      async () => {
        if (this.stopped) return;
        await this.pass();
        if (this.failingSince !== null) {
          this.options.logger.info({ after_ms: this.clock() - this.failingSince }, "notification passes work again");
          this.failingSince = null;
        }
      },
      (error) => {
        if (this.failingSince !== null) return;
        this.failingSince = this.clock();
        this.options.logger.warn({ err: describeError(error) }, "a notification pass failed; passes run again at every poll until one works");
      },
    );
  }

  /** Starts sending; a server that leads again after standing by starts it again. */
  async start(): Promise<void> {
    this.stopped = false;
    this.stopping = new AbortController();
    this.unsubscribe = this.options.events.onRecorded(() => this.wake());
    this.timer = setInterval(() => this.wake(), this.settings.pollMs);
    this.timer.unref();
    this.wake();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.stopping.abort();
    if (this.timer !== undefined) clearInterval(this.timer);
    this.unsubscribe?.();
    await this.passes.idle();
    await Promise.allSettled([...this.tests]);
    const dispatcher = this.dispatcher;
    this.dispatcher = undefined;
    await dispatcher?.close();
  }

  /** Runs a pass now, or right after the one running. */
  wake(): void {
    if (!this.stopped) this.passes.request();
  }

  /** Resolves once no pass is running (tests). */
  async idle(): Promise<void> {
    await this.passes.idle();
  }

  /** Sends a test message to one channel now, logged like any delivery; returns how it went. */
  async test(name: string, actor: string): Promise<DeliveryView> {
    if (this.stopped)
      throw new UnavailableError("The server is stopping; send the test again once it is back.", { code: "server_stopping", retryAfterSeconds: 5 });
    const sending = this.sendTest(name, actor);
    this.tests.add(sending);
    try {
      return await sending;
    } finally {
      this.tests.delete(sending);
    }
  }

  private async sendTest(name: string, actor: string): Promise<DeliveryView> {
    const channel = await this.options.channels.get(name);
    const at = nowIso(this.clock);
    const event: NotifyEvent = {
      id: null,
      at,
      kind: "notify_test",
      severity: "info",
      subject: `channel:${channel.name}`,
      message: `A test from llmgw: channel '${channel.name}' receives notifications.`,
      data: { channel: channel.name },
    };
    const lease = this.leaseUntil();
    const id = await this.options.store.db.transaction().execute(async (trx) => {
      await recordAudit(trx, { at, actor, action: "notify.test", target: channel.name, detail: {} });
      // Claimed by this call: a pass does not send it too.
      return this.deliveries.insert(trx, channel.id, event, "sending", at, lease);
    });
    await this.attempt({ id, channelId: channel.id, event, attempts: 0, createdAt: at, lease }, channel);
    const delivery = await this.deliveries.get(id);
    if (delivery === null) throw new NotFoundError(`The channel '${name}' was removed while its test was being sent.`, { code: "channel_not_found" });
    return delivery;
  }

  /** Until when a sender holds the rows it claimed: past the receiver's timeout, with room to record the answer. */
  private leaseUntil(): string {
    return new Date(this.clock() + Math.max(60_000, this.settings.timeoutMs * 3)).toISOString();
  }

  private async pass(): Promise<void> {
    await this.fanOut();
    await this.sendDue();
    if (this.clock() - this.lastPrune > 60 * 60_000) {
      this.lastPrune = this.clock();
      await this.deliveries.prune(new Date(this.clock() - this.settings.keepMs).toISOString());
      await this.options.events.prune(new Date(this.clock() - this.settings.keepEventsMs).toISOString());
    }
  }

  /**
   * Events above the cursor become deliveries, in one transaction with the cursor's move. The
   * cursor row is locked and checked again inside it: a second server fanning out the same
   * events finds the cursor moved and inserts nothing.
   */
  private async fanOut(): Promise<void> {
    const { store, events } = this.options;
    for (;;) {
      const cursor = await store.db.selectFrom("notify_cursor").select("last_event_id").where("id", "=", 1).executeTakeFirst();
      if (cursor === undefined) {
        // Only a store whose cursor row was deleted by hand: start from now, not from the whole history.
        await store.db
          .insertInto("notify_cursor")
          .values({ id: 1, last_event_id: await events.latestId() })
          .execute();
        continue;
      }
      const from = Number(cursor.last_event_id);
      const read = await events.after(from, 100);
      const batch = settled(read, from, this.clock());
      if (batch.length === 0) return;
      const channels = (await this.options.channels.list()).filter((channel) => channel.disabledAt === null);
      const now = nowIso(this.clock);
      const since = new Date(this.clock() - this.settings.dedupeMs).toISOString();
      const queued = await store.db.transaction().execute(async (trx) => {
        let locked = trx.selectFrom("notify_cursor").select("last_event_id").where("id", "=", 1);
        if (store.dialect === "postgres") locked = locked.forUpdate();
        if (Number((await locked.executeTakeFirst())?.last_event_id) !== from) return null;
        let count = 0;
        for (const event of batch) {
          for (const channel of channels.filter((candidate) => wants(candidate, event))) {
            if (await this.deliveries.sentSince(trx, channel.id, event, since)) continue;
            await this.deliveries.insert(trx, channel.id, event, "pending", now);
            count += 1;
          }
        }
        await trx
          .updateTable("notify_cursor")
          .set({ last_event_id: batch.at(-1)!.id })
          .where("id", "=", 1)
          .execute();
        return count;
      });
      if (queued === null) continue;
      if (queued > 0) this.options.logger.debug({ events: batch.length, deliveries: queued }, "events queued for notification");
      // Stopped at a gap that may still fill: the next pass looks again.
      if (batch.length < read.length) return;
    }
  }

  private async sendDue(): Promise<void> {
    while (!this.stopped) {
      const due = await this.deliveries.claimDue(nowIso(this.clock), this.leaseUntil(), this.settings.batch);
      if (due.length === 0) return;
      const channels = new Map((await this.options.channels.list()).map((channel) => [channel.id, channel]));
      // Settled, not all: one attempt whose answer could not be recorded must not leave the others unawaited.
      const outcomes = await Promise.allSettled(due.map((delivery) => this.attempt(delivery, channels.get(delivery.channelId))));
      for (const outcome of outcomes) {
        if (outcome.status === "rejected")
          this.options.logger.warn({ err: describeError(outcome.reason) }, "could not record a notification attempt; it is sent again when its claim runs out");
      }
      if (due.length < this.settings.batch) return;
    }
  }

  /** One try of one delivery, and the row's state after it. */
  private async attempt(delivery: Delivery, channel: Channel | undefined): Promise<void> {
    const attempts = delivery.attempts + 1;
    const settle = (state: "delivered" | "pending" | "failed" | "cancelled", outcome: Pick<SendOutcome, "status" | "error">, nextAttemptAt: string | null) =>
      this.deliveries.settle(delivery, { state, attempts, status: outcome.status, error: outcome.error, nextAttemptAt, now: nowIso(this.clock) });
    if (channel === undefined || channel.disabledAt !== null) {
      await settle(
        "cancelled",
        { status: null, error: channel === undefined ? "the channel was removed" : `the channel is disabled: ${channel.disabledReason ?? "by an operator"}` },
        null,
      );
      return;
    }
    const target = this.options.channels.openTarget(channel);
    if (target === null) {
      // Sealed with another server's secret (several servers on one PostgreSQL, each with its
      // own data dir): left for the server that sealed it. Nothing was sent, so it is not an
      // attempt, and the wait is short and fixed rather than the backoff of a failing receiver.
      const error = "the channel's URL or secret was sealed by another server; this server's secret cannot open it";
      const retry = delivery.event.kind !== "notify_test" && this.clock() - Date.parse(delivery.createdAt) <= this.settings.giveUpMs;
      const next = retry ? new Date(this.clock() + Math.max(this.settings.pollMs, 1000) * 2).toISOString() : null;
      await this.deliveries.settle(delivery, {
        state: retry ? "pending" : "failed",
        attempts: delivery.attempts,
        status: null,
        error,
        nextAttemptAt: next,
        now: nowIso(this.clock),
      });
      return;
    }
    this.dispatcher ??= webhookAgent(this.options.addresses ?? { allowPrivate: false });
    const outcome = await sendNotification({ kind: channel.kind, ...target }, delivery.event, {
      messageId: `msg_${channel.id.slice(0, 8)}_${delivery.id}`,
      timeoutMs: this.settings.timeoutMs,
      consoleUrl: this.options.consoleUrl(),
      now: this.clock,
      stopping: this.stopping.signal,
      dispatcher: this.dispatcher,
    });
    const log = { channel: channel.name, kind: delivery.event.kind, subject: delivery.event.subject, attempts, status: outcome.status };
    if (outcome.result === "delivered") {
      await settle("delivered", outcome, null);
      return;
    }
    if (outcome.result === "gone") {
      const reason = `the receiver answered 410 Gone on ${nowIso(this.clock)}`;
      await this.options.channels.disable(channel.id, reason);
      await settle("failed", outcome, null);
      await this.deliveries.cancelPending(channel.id, `the channel was disabled: ${reason}`, nowIso(this.clock));
      this.options.logger.warn(
        { ...log },
        `notification channel disabled: the receiver answered 410 Gone; enable it with 'llmgw ctl notify enable ${channel.name}'`,
      );
      return;
    }
    if (delivery.event.kind === "notify_test") {
      // A test says how the receiver answers now; it is not kept trying for a day.
      await settle("failed", outcome, null);
      return;
    }
    // Doubling from backoffMs, capped, with ±20% jitter so the retries to one receiver spread.
    const delay = backoffDelay(attempts, { baseMs: this.settings.backoffMs, maxMs: this.settings.maxBackoffMs, jitter: 0.2 });
    if (this.clock() + delay - Date.parse(delivery.createdAt) > this.settings.giveUpMs) {
      await settle("failed", { status: outcome.status, error: `given up after ${attempts} attempts: ${outcome.error}` }, null);
      this.options.logger.warn({ ...log, err: outcome.error }, "a notification was given up");
      return;
    }
    await settle("pending", outcome, new Date(this.clock() + delay).toISOString());
    this.options.logger.info({ ...log, err: outcome.error, retry_in_ms: delay }, "a notification was not delivered; it is tried again");
  }
}

/** How long a gap in event ids may be an insert not yet committed, rather than one rolled back. */
const GAP_WAIT_MS = 5_000;

/**
 * The events the cursor may pass now. On PostgreSQL, ids come from a sequence when an insert
 * starts, so a later id could commit first, and passing it would skip the earlier one for
 * good. EventLog takes a lock around each insert so this does not happen; should an insert
 * slip past it (the lock timed out), the batch still stops before a gap until the event after
 * it is GAP_WAIT_MS old (a gap that old is an insert that failed). SQLite writes one at a time.
 */
export function settled<E extends { id: number; at: string }>(events: readonly E[], from: number, now: number): E[] {
  let expected = from + 1;
  const ready: E[] = [];
  for (const event of events) {
    if (event.id !== expected && now - Date.parse(event.at) < GAP_WAIT_MS) break;
    ready.push(event);
    expected = event.id + 1;
  }
  return ready;
}

function wants(channel: Channel, event: NotifyEvent): boolean {
  if (channel.events !== null && !channel.events.includes(event.kind as never)) return false;
  return severityRank(event.severity) >= severityRank(channel.minSeverity);
}
