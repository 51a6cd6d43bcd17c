// A job that runs at start and then every hour in the background (the retention sweeps of
// usage rows and of kept responses): one run at a time, and stop() waits for a run under
// way, so a server that closes its store never has a sweep still writing to it. The job
// says what it did and logs its own failures: the next hour tries again.
const HOUR_MS = 3_600_000;

export class HourlyJob {
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> = Promise.resolve();

  /** `run` must not reject (it logs its failures). */
  constructor(private readonly run: () => Promise<void>) {}

  /** Runs now (in the background) and every hour after. */
  start(): void {
    this.kick();
    this.timer = setInterval(() => this.kick(), HOUR_MS);
    this.timer.unref();
  }

  /** Stops the timer and waits for a run under way. */
  async stop(): Promise<void> {
    if (this.timer !== undefined) clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
  }

  private kick(): void {
    this.running = this.running.then(this.run);
  }
}
