// Runs one async job at a time for a loop that many things wake (a poll timer, a new event,
// a subscriber): asked while it runs, it runs once more right after, however often it was
// asked meanwhile. The notifier's passes and the event stream's reads use it.
export class CoalescedRun {
  private running: Promise<void> | null = null;
  private requested = false;

  constructor(
    private readonly job: () => Promise<void>,
    /** A round that throws is reported here; the next request runs again. */
    private readonly onError: (error: unknown) => void,
  ) {}

  /** Runs the job now, or once more after the round that is running (the job may call this too). */
  request(): void {
    if (this.running !== null) {
      this.requested = true;
      return;
    }
    this.running = (async () => {
      do {
        this.requested = false;
        try {
          await this.job();
        } catch (error) {
          this.onError(error);
        }
      } while (this.requested);
    })().finally(() => {
      this.running = null;
    });
  }

  /** Resolves once no round runs. */
  async idle(): Promise<void> {
    while (this.running !== null) await this.running;
  }
}
