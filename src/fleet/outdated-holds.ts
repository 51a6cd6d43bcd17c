// Models whose update is being checked (a serve/update job smoke-tests the new replicas):
// while a model is held, the reconciler keeps its ready replicas of the earlier definition
// serving beside the new ones (reconciler.ts), so clients are served by the old ones until
// the new ones proved themselves, and a failed check can restore the old definition without
// a gap. Holds nest: a model stays held until every hold on it is released. The replicas
// that ran when a model's hold began are "proven"; one placed during the hold is not, and
// the gateway gets it without an endpoint until the release (only the update reaches it).

export class OutdatedHolds {
  private readonly counts = new Map<string, number>();
  private readonly proven = new Map<string, Set<string>>();

  /** Whether the replica was placed while its model is held (it takes no client traffic yet). */
  unproven(modelId: string, replicaId: string): boolean {
    const proven = this.proven.get(modelId);
    return proven !== undefined && !proven.has(replicaId);
  }

  /** The held model ids (what the reconciler reads). */
  held(): ReadonlySet<string> {
    return new Set(this.counts.keys());
  }

  /** Holds the model (`running`: its replicas now); the returned function releases this hold (once) and then calls `onRelease`. */
  hold(modelId: string, running: readonly string[], onRelease: () => void): () => void {
    if (!this.counts.has(modelId)) this.proven.set(modelId, new Set(running));
    this.counts.set(modelId, (this.counts.get(modelId) ?? 0) + 1);
    let released = false;
    return () => {
      // A release called twice must not end someone else's hold on the same model.
      if (released) return;
      released = true;
      const left = (this.counts.get(modelId) ?? 1) - 1;
      if (left > 0) {
        this.counts.set(modelId, left);
      } else {
        this.counts.delete(modelId);
        this.proven.delete(modelId);
      }
      onRelease();
    };
  }
}
