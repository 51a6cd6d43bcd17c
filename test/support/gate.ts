// A gate a test opens when it is ready: stand-ins wait on it to hold an answer or a stream
// at a known point, so a test controls the order of events instead of guessing at delays.
export class Gate {
  private opened = false;
  private readonly waiters: Array<() => void> = [];
  /** How many are waiting at the gate now. */
  get waiting(): number {
    return this.waiters.length;
  }

  /** Resolves when the gate opens (at once if it is open). */
  wait = (): Promise<void> => {
    if (this.opened) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  };

  /** Lets everyone through, now and later. */
  open(): void {
    this.opened = true;
    for (const resolve of this.waiters.splice(0)) resolve();
  }

  /** Lets the first waiter through and keeps the gate closed for the others. */
  releaseOne(): boolean {
    const next = this.waiters.shift();
    next?.();
    return next !== undefined;
  }
}
