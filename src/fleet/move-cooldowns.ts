// The nodes a model's rebalance move failed on (reconciler.ts gives up a move whose new
// replica parked there, spread.ts): each gets none of that model's moves until its
// cool-down ends, so a broken engine on a node is not handed the model again and again.
// Kept in memory on the leader only: a server that takes over (or restarts) starts
// without them, so it may try such a move once more, and a second failure cools the node
// down again. The model is never parked for a move, and its other replicas serve meanwhile.
import type { MoveCooldown } from "./spread.ts";

export class MoveCooldowns {
  private readonly byModel = new Map<string, MoveCooldown[]>();

  constructor(private readonly clock: () => number) {}

  /** A move of the model failed: these nodes cool down (a node that already did starts again). */
  add(modelId: string, cooldowns: readonly MoveCooldown[]): void {
    const nodes = new Set(cooldowns.map((c) => c.nodeId));
    const kept = (this.byModel.get(modelId) ?? []).filter((c) => !nodes.has(c.nodeId));
    this.byModel.set(modelId, [...kept, ...cooldowns]);
  }

  /** Model id → the cool-downs that have not ended (the ended ones are forgotten). */
  active(): Map<string, MoveCooldown[]> {
    const now = this.clock();
    for (const [modelId, cooldowns] of this.byModel) {
      const left = cooldowns.filter((c) => c.until > now);
      if (left.length === 0) this.byModel.delete(modelId);
      else this.byModel.set(modelId, left);
    }
    return new Map([...this.byModel].map(([modelId, cooldowns]) => [modelId, [...cooldowns]]));
  }
}
