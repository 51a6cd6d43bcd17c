// Each node's assignment version and the long polls waiting on it. A version changes
// whenever what a node must run changes; an agent polls with the version it has and the
// poll answers as soon as the version moves. Versions carry a per-start prefix, so an
// agent's version from before a server restart never matches by chance.
import { randomBytes } from "node:crypto";

export class AssignmentVersions {
  private readonly versions = new Map<string, number>();
  private readonly wakeups = new Map<string, Set<() => void>>();
  private readonly boot = randomBytes(4).toString("hex");

  of(nodeId: string): string {
    return `${this.boot}.${this.versions.get(nodeId) ?? 0}`;
  }

  /** The node's assignments changed: a new version, and its waiting polls answer. */
  bump(nodeId: string): void {
    this.versions.set(nodeId, (this.versions.get(nodeId) ?? 0) + 1);
    const waiting = this.wakeups.get(nodeId);
    if (waiting === undefined) return;
    this.wakeups.delete(nodeId);
    for (const wake of waiting) wake();
  }

  /** Resolves at the node's next bump, after `waitMs`, or when `signal` aborts, whichever comes first. */
  waitForChange(nodeId: string, waitMs: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const set = this.wakeups.get(nodeId) ?? new Set<() => void>();
      this.wakeups.set(nodeId, set);
      const done = () => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        set.delete(done);
        resolve();
      };
      const timer = setTimeout(done, waitMs);
      signal.addEventListener("abort", done, { once: true });
      set.add(done);
    });
  }

  /** Answers every waiting poll (the server stops). */
  wakeAll(): void {
    for (const set of this.wakeups.values()) for (const wake of [...set]) wake();
  }
}
