// The parallel sequences of the engine's one llama.cpp context, lent to one request at a
// time: a request waits for a free sequence (first come, first served) instead of failing,
// and leaves the queue when its signal aborts.
import type { LlamaContextSequence } from "node-llama-cpp";

/**
 * Lends out a fixed set of sequences. Waiters are served first come, first served; one
 * whose signal aborts leaves the queue.
 */
export class SequencePool {
  private readonly free: LlamaContextSequence[];
  private readonly waiters: Array<{ resolve: (s: LlamaContextSequence) => void; reject: (e: unknown) => void }> = [];
  private closedWith: Error | null = null;

  constructor(sequences: LlamaContextSequence[]) {
    this.free = [...sequences];
  }

  acquire(signal: AbortSignal): Promise<LlamaContextSequence> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    if (signal.aborted) return Promise.reject(signal.reason);
    const sequence = this.free.pop();
    if (sequence) return Promise.resolve(sequence);
    return new Promise((resolve, reject) => {
      const waiter = {
        resolve: (s: LlamaContextSequence) => {
          signal.removeEventListener("abort", onAbort);
          resolve(s);
        },
        reject: (e: unknown) => {
          signal.removeEventListener("abort", onAbort);
          reject(e);
        },
      };
      const onAbort = () => {
        const index = this.waiters.indexOf(waiter);
        if (index >= 0) this.waiters.splice(index, 1);
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  release(sequence: LlamaContextSequence): void {
    const waiter = this.waiters.shift();
    if (waiter) waiter.resolve(sequence);
    else this.free.push(sequence);
  }

  close(reason: Error): void {
    this.closedWith = reason;
    for (const waiter of this.waiters.splice(0)) waiter.reject(reason);
  }
}
