// Follows the events table for live readers (GET /api/v1/events/stream): one reader of the
// table per server, however many streams are open. Each subscriber has its own place (the
// id it has seen), so a stream that resumes with Last-Event-ID first gets what it missed.
// It reads when this process records an event and every `pollMs`, so events another
// server wrote reach this server's streams too. A read that fails (the database
// unreachable) is tried again at the next poll, from the same place, so nothing is
// skipped; an outage is logged when it starts and when it ends, not at every poll.
import type { Logger } from "../core/log.ts";
import { describeError } from "../core/errors.ts";
import { CoalescedRun } from "../core/coalesced-run.ts";
import type { EventLog, StoredEvent } from "./event-log.ts";

interface Subscriber {
  after: number;
  deliver: (event: StoredEvent) => void;
}

export class EventFollower {
  private readonly subscribers = new Set<Subscriber>();
  private timer: NodeJS.Timeout | undefined;
  private unsubscribe: (() => void) | undefined;
  private readonly reader: CoalescedRun;
  /** Since when reads fail, for one log line at each end of an outage; null while they work. */
  private failingSince: number | null = null;

  constructor(private readonly options: { events: EventLog; logger: Logger; pollMs?: number }) {
    this.reader = new CoalescedRun(
      async () => {
        await this.readOnce();
        if (this.failingSince !== null) {
          options.logger.info({ after_ms: Date.now() - this.failingSince }, "reads new events for the event stream again");
          this.failingSince = null;
        }
      },
      (error) => {
        if (this.failingSince !== null) return;
        this.failingSince = Date.now();
        options.logger.warn({ err: describeError(error) }, "could not read new events for the event stream; trying again at every poll until it works");
      },
    );
  }

  /** Calls `deliver` with every event above `after`, in order, until the returned function is called. */
  subscribe(after: number, deliver: (event: StoredEvent) => void): () => void {
    const subscriber = { after, deliver };
    this.subscribers.add(subscriber);
    if (this.timer === undefined) {
      this.timer = setInterval(() => this.read(), this.options.pollMs ?? 1000);
      this.timer.unref();
      this.unsubscribe = this.options.events.onRecorded(() => this.read());
    }
    this.read();
    return () => {
      this.subscribers.delete(subscriber);
      if (this.subscribers.size === 0) this.close();
    };
  }

  close(): void {
    this.subscribers.clear();
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    this.unsubscribe?.();
    this.unsubscribe = undefined;
  }

  private read(): void {
    this.reader.request();
  }

  private async readOnce(): Promise<void> {
    if (this.subscribers.size === 0) return;
    const from = Math.min(...[...this.subscribers].map((subscriber) => subscriber.after));
    const batch = await this.options.events.after(from, 200);
    for (const event of batch) {
      for (const subscriber of this.subscribers) {
        // Subscribed during this read, further back than it reached: the next read starts from its place.
        if (subscriber.after < from) {
          this.read();
          continue;
        }
        if (event.id <= subscriber.after) continue;
        subscriber.after = event.id;
        subscriber.deliver(event);
      }
    }
    // A full batch means more are waiting.
    if (batch.length === 200) this.read();
  }
}
