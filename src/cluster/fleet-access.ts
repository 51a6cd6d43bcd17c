// The fleet as the rest of a server reaches it, whether this server leads or not. While it
// leads, everything goes to its Fleet (the reconciler's records, parking, node
// credentials). While it stands by, reads come from the FleetFollower (the leader's rows),
// requests that only the leader can answer are forwarded before they get here
// (leader-forward.ts), and a request for an on-demand model tells the leader through the
// change feed that the model is wanted, so a replica starts and is not stopped as idle
// while this server's clients use it.
import type { CatalogModel } from "../catalog/catalog.ts";
import type { OnDemand } from "../gateway/gateway-ports.ts";
import type { Fleet, ModelFleetStatus } from "../fleet/fleet.ts";
import type { FleetNode } from "../fleet/node-registry.ts";
import { runsOnEngines } from "../fleet/reconciler.ts";
import { NotLeaderError } from "./leadership.ts";
import type { FleetFollower } from "./fleet-follower.ts";

/** How often a standby repeats that a model is in use while its requests run (below any idle_seconds that matters). */
const DEMAND_REPEAT_MS = 1_000;

export class FleetAccess implements OnDemand {
  /** A standby's requests in flight per on-demand model: repeated to the leader while they run. */
  private readonly inFlight = new Map<string, number>();
  private repeater: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(
    private readonly options: {
      /** This server's Fleet while it leads, else null. */
      leading: () => Fleet | null;
      follower: () => FleetFollower | null;
      /** Tells the leader a model was just used (cluster-wire.ts sends it over the change feed). */
      tellDemand: (modelId: string) => void;
    },
  ) {}

  /** The leader's Fleet, here; a standby reaching this is answered 503 (its request should have been forwarded). */
  leader(): Fleet {
    const fleet = this.options.leading();
    if (fleet === null) throw new NotLeaderError("This server does not lead the cluster and could not pass the request on; retry in a few seconds.");
    return fleet;
  }

  status(modelId: string): ModelFleetStatus {
    return this.options.leading()?.status(modelId) ?? this.options.follower()?.status(modelId) ?? { parked: null, unplaceable: null, weightsProblem: null };
  }

  weightsVerified(replicaId: string): boolean {
    return this.options.leading()?.weightsVerified(replicaId) ?? this.options.follower()?.weightsVerified(replicaId) ?? false;
  }

  nodes(): FleetNode[] {
    return this.options.leading()?.nodes.list() ?? this.options.follower()?.nodeList() ?? [];
  }

  /** A node's credential (mirror downloads), checked against the leader's nodes or the rows. */
  authenticateNode(credential: string | undefined): FleetNode {
    const registry = this.options.leading()?.nodes ?? this.options.follower()?.nodes;
    if (registry === undefined) throw new NotLeaderError("This server is starting; retry in a moment.");
    return registry.authenticate(credential);
  }

  // --- OnDemand (the gateway) ---

  requested(model: CatalogModel): void {
    const fleet = this.options.leading();
    if (fleet !== null) {
      fleet.requested(model);
      return;
    }
    if (this.closed) return;
    if (!this.onDemand(model)) return;
    this.inFlight.set(model.id, (this.inFlight.get(model.id) ?? 0) + 1);
    this.options.tellDemand(model.id);
    if (this.repeater === undefined) {
      // The leader counts the idle time from the last word it had: while requests run here, it hears one each second.
      this.repeater = setInterval(() => {
        for (const modelId of this.inFlight.keys()) this.options.tellDemand(modelId);
      }, DEMAND_REPEAT_MS);
      this.repeater.unref();
    }
  }

  finished(model: CatalogModel): void {
    const fleet = this.options.leading();
    // A request counted here as a standby's is settled here, even if this server leads now:
    // else its count would keep the model in use for good. (Which of two requests of one
    // model settles which count does not matter: each count ends at zero.)
    if (!this.inFlight.has(model.id)) {
      fleet?.finished(model);
      return;
    }
    const left = (this.inFlight.get(model.id) ?? 1) - 1;
    if (left > 0) this.inFlight.set(model.id, left);
    else this.inFlight.delete(model.id);
    // The idle clock starts from the end of the last request.
    this.options.tellDemand(model.id);
    if (this.inFlight.size === 0 && this.repeater !== undefined) {
      clearInterval(this.repeater);
      this.repeater = undefined;
    }
  }

  starting(modelId: string): boolean {
    const fleet = this.options.leading();
    if (fleet !== null) return fleet.starting(modelId);
    // A standby cannot see the leader's placement: an on-demand model that is not parked
    // may be starting, so its requests wait (bounded by the queue's timeout).
    return this.options.follower()?.startsOnDemand(modelId) ?? false;
  }

  close(): void {
    this.closed = true;
    if (this.repeater !== undefined) clearInterval(this.repeater);
    this.repeater = undefined;
  }

  private onDemand(model: CatalogModel): boolean {
    return model.definition.scaling.min === 0 && runsOnEngines(model);
  }
}
