// How llama.cpp's decode batches are filled, and a count of them: the engine's context
// calls `shareBatch` once for every batch it decodes, with the decodes its sequences have
// queued, so the count of calls and of sequences per call shows whether parallel
// generations really share decode steps (the engine logs it; tests and bench/engine read
// it). The sharing itself is node-llama-cpp's "maximumParallelism" idea, kept simple:
// every queued sequence gets an equal share of the batch's tokens, and what a short item
// (one generated token) leaves over goes to the longer ones (prompts) in queue order.
import type { BatchItem, CustomBatchingPrioritizationStrategy, PrioritizedBatchItem } from "node-llama-cpp";

export interface DecodeBatchCounts {
  /** Decode batches run so far. */
  batches: number;
  /** Sum over those batches of the sequences in each. */
  sequenceSteps: number;
  /** Batches that held more than one sequence. */
  sharedBatches: number;
}

export class DecodeBatchMeter {
  private readonly counts: DecodeBatchCounts = { batches: 0, sequenceSteps: 0, sharedBatches: 0 };

  /** The batching strategy to give `createContext({ batching: { itemPrioritizationStrategy } })`. */
  readonly shareBatch: CustomBatchingPrioritizationStrategy = ({ items, size }) => {
    const shares = shareEvenly(items, size);
    this.counts.batches += 1;
    this.counts.sequenceSteps += shares.length;
    if (shares.length > 1) this.counts.sharedBatches += 1;
    return shares;
  };

  snapshot(): DecodeBatchCounts {
    return { ...this.counts };
  }
}

/** Splits `size` batch slots over the queued items: equal shares first, then the rest in order. */
export function shareEvenly(items: readonly BatchItem[], size: number): PrioritizedBatchItem[] {
  const taken = items.slice(0, Math.max(1, Math.min(items.length, size)));
  const share = Math.max(1, Math.floor(size / taken.length));
  const shares = taken.map((item) => ({ item, processAmount: Math.min(item.tokens.length, share) }));
  let left = size - shares.reduce((sum, s) => sum + s.processAmount, 0);
  for (const entry of shares) {
    if (left <= 0) break;
    const more = Math.min(entry.item.tokens.length - entry.processAmount, left);
    entry.processAmount += more;
    left -= more;
  }
  return shares;
}
