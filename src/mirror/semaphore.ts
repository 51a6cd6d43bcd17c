// The limit on downloads running at once across the whole mirror: a counting semaphore
// whose waiters can give up through an AbortSignal (a fetch stopped while queued).

/** A counting semaphore whose waiters can give up through an AbortSignal. */
export class Semaphore {
  #free: number;
  readonly #waiters: (() => void)[] = [];

  constructor(size: number) {
    this.#free = size;
  }

  async acquire(signal: AbortSignal): Promise<() => void> {
    signal.throwIfAborted();
    if (this.#free > 0) {
      this.#free -= 1;
    } else {
      await new Promise<void>((resolve, reject) => {
        const onAbort = (): void => {
          const index = this.#waiters.indexOf(wake);
          if (index >= 0) this.#waiters.splice(index, 1);
          reject(signal.reason);
        };
        const wake = (): void => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        };
        this.#waiters.push(wake);
        signal.addEventListener("abort", onAbort, { once: true });
      });
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.#waiters.shift();
      if (next !== undefined) next();
      else this.#free += 1;
    };
  }
}
