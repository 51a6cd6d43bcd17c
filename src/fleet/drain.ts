// Replicas being drained before their stop. The node's agent ends a stopped engine with
// SIGTERM, and the bundled engine gives generations in flight only 2 s, so a replica the
// gateway still has requests at is first taken out of routing (published "stopping") while
// its node keeps running it; it is stopped for real once the gateway's count there is 0,
// or when the drain deadline passes (a stream that never ends must not keep an outdated
// engine forever). This module keeps that bookkeeping; the fleet (fleet.ts) publishes the
// replica, keeps its node's assignment, and does the stop when `takeDone` names it.
//
// Several servers (a shared store): the counts include the other servers' requests, read
// from their rows (cluster/gateway-loads.ts), which are up to a beat old, and a server
// learns that a replica stops a moment after it does. So there every stop drains, and a
// drain ends only once counts read `settleMs` after it began show nothing left (or at the
// deadline); counts that cannot be read are taken as requests still there.
//
// Nothing here is stored: after a server restart the gateway has nothing in flight, and
// the reconciler decides again about a replica whose drain was cut short.
import type { Logger } from "../core/log.ts";

export interface DrainOptions {
  /** The gateway's requests in flight at a replica (0 when the server has no gateway). */
  inFlight: (replicaId: string) => number;
  clock: () => number;
  /** How long a drain waits for its requests before the replica is stopped anyway. */
  timeoutMs: number;
  logger: Logger;
  /** Several servers: how their counts are read (absent: this server's counts are all there is). */
  shared?: SharedCounts | undefined;
}

/** The other servers' counts as a drain waits on them (GatewayLoads). */
export interface SharedCounts {
  /** How long after a drain begins a read of the counts surely includes every request sent to the replica before it left routing. */
  settleMs: number;
  /** When the other servers' counts were last read (on `clock`), or null before the first read. */
  readAt(): number | null;
  /** Whether the counts read last are fresh enough to go by. */
  known(): boolean;
}

interface Draining {
  since: number;
  model: string;
}

export class Drains {
  private readonly draining = new Map<string, Draining>();

  constructor(private readonly options: DrainOptions) {}

  /**
   * Starts draining the replica when the gateway has requests in flight there. False when
   * it has none and may stop at once; true when it drains (now or already).
   */
  begin(replicaId: string, model: string): boolean {
    if (this.draining.has(replicaId)) return true;
    const inFlight = this.options.inFlight(replicaId);
    if (inFlight <= 0 && this.options.shared === undefined) return false;
    this.draining.set(replicaId, { since: this.options.clock(), model });
    this.options.logger.info({ replica: replicaId, model, inFlight, timeoutMs: this.options.timeoutMs }, "draining replica");
    return true;
  }

  has(replicaId: string): boolean {
    return this.draining.has(replicaId);
  }

  /** The replica went without a stop of ours (its node was lost or removed). */
  end(replicaId: string): void {
    this.draining.delete(replicaId);
  }

  /**
   * The drained replicas to stop now: those with no request left in flight, and those past
   * the deadline. Each is no longer draining once named here.
   */
  takeDone(): string[] {
    const now = this.options.clock();
    const done: string[] = [];
    for (const [replicaId, drain] of this.draining) {
      const inFlight = this.options.inFlight(replicaId);
      const waitedMs = now - drain.since;
      const timedOut = waitedMs >= this.options.timeoutMs;
      const shared = this.options.shared;
      const settled = shared === undefined || ((shared.readAt() ?? Number.NEGATIVE_INFINITY) >= drain.since + shared.settleMs && shared.known());
      if ((inFlight > 0 || !settled) && !timedOut) continue;
      this.draining.delete(replicaId);
      done.push(replicaId);
      if (inFlight > 0 || !settled) {
        this.options.logger.warn(
          { replica: replicaId, model: drain.model, inFlight, waitedMs },
          settled
            ? "replica drained: the drain deadline passed with requests in flight; stopping it anyway"
            : "replica drained: the drain deadline passed before the other servers' requests could be counted; stopping it anyway",
        );
      } else {
        this.options.logger.info({ replica: replicaId, model: drain.model, inFlight, waitedMs }, "replica drained");
      }
    }
    return done;
  }
}
