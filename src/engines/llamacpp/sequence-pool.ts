// The parallel sequences of the engine's one llama.cpp context, lent to one request at a
// time: a request waits for a free sequence (first come, first served) instead of failing,
// and leaves the queue when its signal aborts.
//
// Prompt cache: a sequence keeps the KV of its last request's tokens after it is given
// back, and LlamaChat and LlamaCompletion evaluate only what follows the part of the new
// prompt that the sequence already holds (node-llama-cpp's adaptStateToTokens). So a free
// sequence is chosen by the longest common prefix of its tokens and the new prompt, as
// llama-server picks a slot: a conversation's next turn, or a request that repeats a long
// system prompt, then skips evaluating the prefix. A sequence that shares only a sliver
// (the BOS token, a chat template's first tokens) is not worth the cache it would lose:
// below a tenth of the prompt (llama-server's default --slot-prompt-similarity, 0.1) the
// one given back longest ago is taken instead, so the caches used most recently last
// longest and an unused sequence is taken before a used one.
import type { LlamaContextSequence, Token } from "node-llama-cpp";

/** Shared prefix, as a share of the prompt, below which a free sequence is chosen by age. */
const MIN_PREFIX_SHARE = 0.1;

/**
 * Lends out a fixed set of sequences. Waiters are served first come, first served; one
 * whose signal aborts leaves the queue.
 */
export class SequencePool {
  /** Free sequences, the one given back longest ago first. */
  private readonly free: LlamaContextSequence[];
  private readonly waiters: Array<{ resolve: (s: LlamaContextSequence) => void; reject: (e: unknown) => void }> = [];
  private closedWith: Error | null = null;

  constructor(sequences: LlamaContextSequence[]) {
    this.free = [...sequences];
  }

  /**
   * A free sequence, or the next one given back. `prompt`: the tokens the request will
   * evaluate, to pick the free sequence that already holds the longest prefix of them.
   */
  acquire(signal: AbortSignal, prompt: readonly Token[] = []): Promise<LlamaContextSequence> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    if (signal.aborted) return Promise.reject(signal.reason);
    const sequence = this.takeFree(prompt);
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

  /**
   * The free sequence holding the longest prefix of `prompt`, when that is at least a
   * tenth of it; otherwise (or on a tie) the one free longest.
   */
  private takeFree(prompt: readonly Token[]): LlamaContextSequence | undefined {
    if (this.free.length === 0) return undefined;
    let best = 0;
    let bestShared = 0;
    for (const [index, sequence] of this.free.entries()) {
      const shared = prompt.length === 0 ? 0 : sequence.compareContextTokens(prompt as Token[]).firstDifferentIndex;
      if (shared > bestShared) {
        best = index;
        bestShared = shared;
      }
    }
    if (bestShared < MIN_PREFIX_SHARE * prompt.length) best = 0;
    return this.free.splice(best, 1)[0];
  }
}
