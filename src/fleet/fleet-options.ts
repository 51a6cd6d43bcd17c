// What a Fleet (fleet.ts) is made with: its store, catalog and routing table, its timings
// (FLEET_DEFAULTS), and, with several servers, the fence its writes go through and whether
// it takes over from another leader; and what it says of a model beyond its replicas.
import type { Logger } from "../core/log.ts";
import type { SecretBox } from "../core/secret-box.ts";
import type { Fence } from "../cluster/leadership.ts";
import type { Catalog } from "../catalog/catalog.ts";
import type { Store } from "../store/store.ts";
import type { EventLog } from "../events/event-log.ts";
import type { MirrorReader } from "./model-weights.ts";
import type { PlacementNode, PlacementRequest, PlacementResult } from "./fleet-types.ts";
import type { ParkedModel } from "./parked-models.ts";
import type { ReplicaTable } from "./replica-table.ts";
import type { AutoscalingView, ScalingLoad } from "./autoscaling.ts";
import type { SharedCounts } from "./drain.ts";

export const FLEET_DEFAULTS = {
  /** A node without a heartbeat for this long is lost (DESIGN.md: nodes `ready` → `lost`). */
  nodeTimeoutMs: 15_000,
  heartbeatIntervalMs: 5_000,
  tickMs: 1_000,
  /** Heartbeat times reach the store this often (state changes at once). */
  heartbeatFlushMs: 5_000,
  /** A stopped replica's requests in flight get this long to finish before its engine is stopped anyway. */
  drainTimeoutMs: 60_000,
} as const;

export interface FleetOptions {
  store: Store;
  catalog: Catalog;
  replicas: ReplicaTable;
  mirror: MirrorReader;
  box: SecretBox;
  joinToken: () => string;
  logger: Logger;
  /** The wall clock (epoch ms). */
  clock?: () => number;
  /** A clock that never jumps (ms, any origin) for node heartbeat ages and settling; default `performance.now`. */
  monotonic?: () => number;
  nodeTimeoutMs?: number;
  heartbeatIntervalMs?: number;
  tickMs?: number;
  /** The gateway's requests in flight at a replica: a replica with some is drained before it stops. */
  inFlight?: (replicaId: string) => number;
  /** The gateway load of all servers, for autoscaling (cluster/gateway-loads.ts); default none (nothing scales up). */
  load?: ScalingLoad;
  /** Several servers: how a drain reads their requests in flight (drain.ts); absent, `inFlight` is all there is. */
  drainCounts?: SharedCounts | undefined;
  /** How long a drain waits for those requests before the replica is stopped anyway (default 60 s). */
  drainTimeoutMs?: number;
  place?: (input: { nodes: PlacementNode[]; requests: PlacementRequest[] }) => PlacementResult;
  /** Where node_lost, model_parked and the other fleet events are recorded (default: the store's events table). */
  events?: EventLog;
  /** Several servers on one store: the replica rows are written only while this server leads (cluster/leadership.ts). */
  fence?: Fence;
  /**
   * This server takes over from another leader (cluster/): the rows are what that one knew
   * until a moment ago and the nodes' engines kept running, so replicas keep their states
   * and stay routable instead of waiting for each node's next report.
   */
  takeover?: boolean;
}

/** What the fleet knows about a model beyond its replicas, for its health line. */
export interface ModelFleetStatus {
  parked: ParkedModel | null;
  unplaceable: string[] | null;
  weightsProblem: string | null;
  /** When replicas of the model share a node, how many where and why ("2 replicas on n1: n2 is lost"). */
  spread?: string | null;
  /** The replicas the fleet wants for the model now (reconciler.ts wantedReplicas), where known. */
  desired?: number;
  /** An autoscaled model's target, load and last decision (the leader's; null when it does not scale). */
  autoscaling?: AutoscalingView | null;
}
