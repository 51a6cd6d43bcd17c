// Records one usage row per /v1 request (key, model, replica, tokens, time to first
// token, duration, status). Rows are queued in memory and written in batches off the
// request path, so a slow database never slows an answer; `flush` drains the queue on
// shutdown so nothing recorded is lost.
import { describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Store } from "../store/store.ts";
import type { UsageTable } from "../store/schema.ts";

export type UsageRow = Omit<UsageTable, "id">;

export interface UsageRecorderOptions {
  store: Store;
  logger?: Logger;
  flushIntervalMs?: number;
  maxBatch?: number;
}

export class UsageRecorder {
  private queue: UsageRow[] = [];
  private timer: NodeJS.Timeout | undefined;
  private writing: Promise<void> = Promise.resolve();
  private readonly flushIntervalMs: number;
  private readonly maxBatch: number;

  constructor(private readonly options: UsageRecorderOptions) {
    this.flushIntervalMs = options.flushIntervalMs ?? 1000;
    this.maxBatch = options.maxBatch ?? 500;
  }

  record(row: UsageRow): void {
    this.queue.push(row);
    if (this.queue.length >= this.maxBatch) {
      void this.flush();
    } else if (this.timer === undefined) {
      this.timer = setTimeout(() => void this.flush(), this.flushIntervalMs);
      this.timer.unref();
    }
  }

  /** Writes everything queued so far; resolves when it is in the store. */
  flush(): Promise<void> {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    const batch = this.queue;
    this.queue = [];
    if (batch.length > 0) {
      this.writing = this.writing.then(async () => {
        try {
          await this.options.store.db.insertInto("usage").values(batch).execute();
        } catch (error) {
          this.options.logger?.error({ rows: batch.length, err: describeError(error) }, "could not record usage rows");
        }
      });
    }
    return this.writing;
  }
}
