// The fleet's replica records in memory (fleet.ts holds them here) and every change to
// one: the record is saved to its row (replica-rows.ts, the store's rows are the truth),
// published to the gateway's ReplicaTable (record-projections.ts), and its nodes'
// assignment versions are bumped when what they must run changes, so their agents' long
// polls answer (assignment-versions.ts). Also here: what a node's report of a replica
// changes, and the drain (drain.ts) a replica with requests in flight gets before its stop.
// A record's endpoint is only ever on its head node's approved address (node-address.ts):
// the gateway sends prompts and the engine key there, so one elsewhere is never kept.
// The fleet decides when; this module keeps the record, its row and its routing in step.
import type { CatalogModel } from "../catalog/catalog.ts";
import { formatHost } from "../core/format.ts";
import type { Logger } from "../core/log.ts";
import type { ReplicaReport } from "./agent-protocol.ts";
import type { AssignmentVersions } from "./assignment-versions.ts";
import type { Drains } from "./drain.ts";
import { fingerprintOf } from "./model-replicas.ts";
import { canonicalAddress, originHost, originOnAddress, sameAddress } from "./node-address.ts";
import type { FleetNode } from "./node-registry.ts";
import type { OutdatedHolds } from "./outdated-holds.ts";
import { tableEntryOf, workersReady } from "./record-projections.ts";
import type { ReplicaRecord, ReplicaRows } from "./replica-rows.ts";
import type { ReplicaState, ReplicaTable } from "./replica-table.ts";

export interface ReplicaRecordsOptions {
  rows: ReplicaRows;
  /** The gateway's routing table the records are published to. */
  replicas: ReplicaTable;
  versions: AssignmentVersions;
  drains: Drains;
  holds: OutdatedHolds;
  logger: Logger;
  modelById: (modelId: string) => CatalogModel | undefined;
  /** A node's approved address (undefined for a node no longer known). */
  nodeAddress: (nodeId: string) => string | undefined;
  /** A report moved a replica to a state the reconciler acts on (ready, parked, failed). */
  reconcile: () => void;
  /** A node reported a wanted replica parked (its supervisor gave up): the fleet parks its model. */
  onParked: (record: ReplicaRecord, node: FleetNode) => void;
}

export class ReplicaRecords {
  private readonly records = new Map<string, ReplicaRecord>();

  constructor(private readonly options: ReplicaRecordsOptions) {}

  get(id: string): ReplicaRecord | undefined {
    return this.records.get(id);
  }

  values(): IterableIterator<ReplicaRecord> {
    return this.records.values();
  }

  /**
   * A record read back from its row at start: kept and published, not saved again. An
   * endpoint that is not on its node's address now (a row from before an admin's change)
   * is dropped until the node reports the replica again.
   */
  restore(record: ReplicaRecord): void {
    const address = this.options.nodeAddress(record.nodeIds[0] ?? "");
    if (record.endpoint !== null && (address === undefined || !originOnAddress(record.endpoint.origin, address))) dropEndpoint(record);
    this.records.set(record.id, record);
    this.publish(record);
  }

  /**
   * An admin changed the node's address: an endpoint of its replicas on the old one leaves
   * routing at once, until the node reports the replica on the new address.
   */
  leaveOldAddress(record: ReplicaRecord, node: FleetNode): void {
    if (record.nodeIds[0] !== node.id || record.endpoint === null || originOnAddress(record.endpoint.origin, node.address)) return;
    this.options.logger.warn(
      { node: node.name, replica: record.id, endpoint: record.endpoint.origin, address: node.address },
      "a replica's endpoint is off its node's new address; not routed to until reported there",
    );
    dropEndpoint(record);
    this.options.rows.save(record);
    this.publish(record);
  }

  /** A record the reconciler just placed: kept, saved and published (the caller bumps its nodes). */
  add(record: ReplicaRecord): void {
    this.records.set(record.id, record);
    this.options.rows.save(record);
    this.publish(record);
  }

  /** Whether the replica is being drained before its stop (it takes no new requests). */
  draining(replicaId: string): boolean {
    return this.options.drains.has(replicaId);
  }

  /** A worker node's state of a replica over several nodes: the head learns when the workers' readiness changes. */
  recordWorker(record: ReplicaRecord, nodeId: string, state: string): void {
    const before = workersReady(record);
    record.workerStates = { ...record.workerStates, [nodeId]: state };
    if (workersReady(record) !== before) this.options.versions.bump(record.nodeIds[0]!);
  }

  /** What the replica's head node reported of it in a heartbeat. */
  applyReport(record: ReplicaRecord, report: ReplicaReport, node: FleetNode): void {
    // The endpoint is made from the node's approved address (the report's host names the
    // same host, in whatever form the agent was given it), so it is in the form every later
    // comparison (restore, leaveOldAddress) finds it in.
    const origin = report.endpoint === null ? null : `http://${formatHost(canonicalAddress(node.address))}:${report.endpoint.port}`;
    if (report.endpoint !== null && (!sameAddress(report.endpoint.host, node.address) || origin === null || originHost(origin) === null)) {
      // The gateway sends the engine key there: only to the node's approved address. (The
      // fleet refuses such a heartbeat before it gets here; this keeps the rule where
      // endpoints are made.) A node address no URL can hold (stored before such addresses
      // were refused) gives no endpoint either, until an admin gives the node another.
      this.options.logger.warn(
        { node: node.name, replica: record.id, reported: report.endpoint.host, address: node.address },
        "a replica's endpoint is not on its node's address, or no URL can hold it; ignored",
      );
      report = { ...report, endpoint: null, state: report.state === "ready" ? "starting" : report.state };
    }
    if (record.nodeIds.length > 1 && (report.rayAddress ?? null) !== (record.rayAddress ?? null)) {
      // The head's Ray address is news for the workers (a restarted head has a new one).
      record.rayAddress = report.rayAddress ?? null;
      for (const nodeId of record.nodeIds.slice(1)) this.options.versions.bump(nodeId);
    }
    // A draining replica is still running on its node, but must not be routed to again.
    const state: ReplicaState = (record.desired === "stop" || this.options.drains.has(record.id)) && report.state !== "stopped" ? "stopping" : report.state;
    const next = {
      state,
      endpoint: report.endpoint === null || origin === null ? null : { origin, basePath: "" },
      attempt: report.attempt,
      failures: report.failures,
      lastError: report.lastError,
      startedAt: report.startedAt === null ? null : new Date(report.startedAt).toISOString(),
      readyAt: report.readyAt === null ? null : new Date(report.readyAt).toISOString(),
      weightsVerified: report.weightsVerified,
    };
    const changed = (Object.keys(next) as (keyof typeof next)[]).some((key) => JSON.stringify(record[key]) !== JSON.stringify(next[key]));
    if (!changed) return;
    const wasParked = record.state === "parked";
    Object.assign(record, next);
    this.options.rows.save(record);
    this.publish(record);
    if (state === "parked" && !wasParked && record.desired === "run") this.options.onParked(record, node);
    if (state === "ready" || state === "parked" || state === "failed") this.options.reconcile();
  }

  /** Out of routing until its node reports it running again (its agent started anew, its engines went). */
  unconfirm(record: ReplicaRecord): void {
    record.state = "placed";
    record.endpoint = null;
    record.readyAt = null;
    this.options.rows.save(record);
    this.publish(record);
  }

  /**
   * Stops the replica. One the gateway has requests at is drained first (drain.ts): it
   * leaves routing now, and its node keeps running it (desired "run") until `finishDrains`
   * calls this again with `drained`.
   */
  markStopping(record: ReplicaRecord, drained = false): void {
    if (record.desired === "stop") return;
    if (!drained && this.options.drains.begin(record.id, this.options.modelById(record.modelId)?.name ?? record.modelId)) {
      // "stopping" in the record too: the reconciler no longer counts it as serving.
      if (record.state === "stopping") return;
      record.state = "stopping";
      this.options.rows.save(record);
      this.publish(record);
      return;
    }
    record.desired = "stop";
    record.state = "stopping";
    this.options.rows.save(record);
    this.publish(record);
    for (const nodeId of record.nodeIds) this.options.versions.bump(nodeId);
  }

  /** Stops the drained replicas whose requests are done or whose drain deadline passed. */
  finishDrains(): void {
    for (const id of this.options.drains.takeDone()) {
      const record = this.records.get(id);
      if (record !== undefined) this.markStopping(record, true);
    }
  }

  /** The replica is gone: its record, row and routing entry go, and its nodes no longer run it. */
  forget(record: ReplicaRecord): void {
    this.options.drains.end(record.id);
    this.records.delete(record.id);
    this.options.rows.delete(record.id);
    this.options.replicas.remove(record.id);
    for (const nodeId of record.nodeIds) this.options.versions.bump(nodeId);
  }

  /** Puts the record into the gateway's table: a stopping replica stays visible but takes no requests. */
  publish(record: ReplicaRecord): void {
    const leaving = record.desired === "stop" || this.options.drains.has(record.id);
    const model = this.options.modelById(record.modelId);
    // While an update checks a held model's new replicas, clients stay on the old ones.
    const unproven = model !== undefined && this.options.holds.unproven(model.id, record.id) && record.fingerprint === fingerprintOf(model, record.profile);
    if ((record.unproven ?? false) !== unproven) {
      // Other servers route from the rows: they must keep out of it too.
      record.unproven = unproven;
      this.options.rows.save(record);
    }
    this.options.replicas.upsert(tableEntryOf(record, model, this.options.replicas.get(record.id), leaving, unproven));
  }
}

/** Out of routing: no endpoint, and a ready replica counts as starting until its node reports it again. */
function dropEndpoint(record: ReplicaRecord): void {
  record.endpoint = null;
  if (record.state === "ready") record.state = "starting";
}
