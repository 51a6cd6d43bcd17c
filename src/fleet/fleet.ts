// The fleet on the server: nodes (node-registry.ts), replica records (replica-records.ts
// keeps them in step with their rows in replica-rows.ts, which are the truth), the
// reconciler (reconciler.ts decides, this applies), parking (parked-models.ts), and the
// agent protocol (agent-protocol.ts) that nodes call over /agent/v1 (`llmgw agent`) or
// in-process (`llmgw up`). The records feed the gateway's ReplicaTable
// (record-projections.ts), so routing never waits on the store.
//
// Every change (catalog, a node joining, back or lost, a replica's report) asks for a
// reconciliation; they run one at a time, and a 1 s tick runs one too (it notices lost
// nodes). Agents long-poll their assignments by version (assignment-versions.ts). Also
// here: each model's weights (weights-knowledge.ts), on-demand demand (demand.ts), drains
// before a stop (drain.ts, kept with the records), and an update's hold on a model's old
// replicas (outdated-holds.ts) with its replicas split by definition (model-replicas.ts).
// A node's address is its join's until an admin changes it (node-address.ts).
import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { BadRequestError, describeError } from "../core/errors.ts";
import { countOf } from "../core/format.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Assignment, AssignmentSet, Assignments, HeartbeatReply, HeartbeatReport, JoinReply, JoinRequest } from "./agent-protocol.ts";
import { EventLog } from "../events/event-log.ts";
import { checkInventory, checkLabels } from "./inventory-schema.ts";
import { AssignmentVersions } from "./assignment-versions.ts";
import { Demand } from "./demand.ts";
import { Drains } from "./drain.ts";
import { MoveCooldowns } from "./move-cooldowns.ts";
import { fingerprintOf, replicasByDefinition, type ReplicasByDefinition } from "./model-replicas.ts";
import { OutdatedHolds } from "./outdated-holds.ts";
import { ParkedModels } from "./parked-models.ts";
import { assignmentOf, placedRecord } from "./record-projections.ts";
import { Autoscaling } from "./autoscaling.ts";
import { WeightsKnowledge } from "./weights-knowledge.ts";
import { NodeRegistry, type FleetNode } from "./node-registry.ts";
import { NodeAddresses } from "./node-address.ts";
import { placeReplicas } from "./placement.ts";
import { reconcile, wantedReplicas, type ReconcileDecision } from "./reconciler.ts";
import { FLEET_DEFAULTS, type FleetOptions, type ModelFleetStatus } from "./fleet-options.ts";
import { ReplicaRecords } from "./replica-records.ts";
import { ReplicaRows, type ReplicaRecord } from "./replica-rows.ts";

export { FLEET_DEFAULTS, type FleetOptions, type ModelFleetStatus } from "./fleet-options.ts";

export class Fleet implements Assignments {
  readonly nodes: NodeRegistry;
  private readonly rows: ReplicaRows;
  private readonly records: ReplicaRecords;
  private readonly parked: ParkedModels;
  private unplaceable = new Map<string, string[]>();
  /** Models whose replicas share a node, with why (reconciler.ts, spread.ts). */
  private spread = new Map<string, string>();
  /** When each node came back or joined: rebalance moves wait until it has stayed ready a while. */
  private readonly backAt = new Map<string, number>();
  /** Nodes a model's rebalance move failed on, cooling down (move-cooldowns.ts). */
  private readonly moveCooldowns: MoveCooldowns;
  /** The replicas of rebalance moves under way, from the last reconciliation: their parking does not park their model. */
  private moving: ReadonlySet<string> = new Set();
  private readonly weights: WeightsKnowledge;
  private readonly demand: Demand;
  private readonly autoscaling: Autoscaling;
  /** The autoscaler's tick under way (it never rejects; `settled` waits for it). */
  private scaling: Promise<void> = Promise.resolve();
  private readonly holds = new OutdatedHolds();
  private statusListener: ((modelId: string) => void) | undefined;
  private readonly cached = new Map<string, ReadonlySet<string>>();
  /** Each node's agent run, from its heartbeats: a new one means its engines are new too. */
  private readonly agentRuns = new Map<string, string>();
  private readonly versions = new AssignmentVersions();
  private readonly clock: () => number;
  /** Node ages (heartbeats, settling) are on this one: a wall clock jumping forward loses no node. */
  private readonly monotonic: () => number;
  private readonly settings: { nodeTimeoutMs: number; heartbeatIntervalMs: number; tickMs: number };
  private chain: Promise<void> = Promise.resolve();
  private pending = false;
  private timer: NodeJS.Timeout | undefined;
  private lastFlush = 0;
  private unsubscribeCatalog: (() => void) | undefined;
  private stopped = false;
  private readonly events: EventLog;
  private readonly addresses: NodeAddresses;

  constructor(private readonly options: FleetOptions) {
    this.clock = options.clock ?? Date.now;
    this.monotonic = options.monotonic ?? (() => performance.now());
    this.events = options.events ?? new EventLog({ store: options.store, logger: options.logger, clock: this.clock });
    this.settings = {
      nodeTimeoutMs: options.nodeTimeoutMs ?? FLEET_DEFAULTS.nodeTimeoutMs,
      heartbeatIntervalMs: options.heartbeatIntervalMs ?? FLEET_DEFAULTS.heartbeatIntervalMs,
      tickMs: options.tickMs ?? FLEET_DEFAULTS.tickMs,
    };
    if (this.settings.heartbeatIntervalMs * 2 > this.settings.nodeTimeoutMs) {
      // One late or lost heartbeat must not make a healthy node lost.
      throw new BadRequestError(
        `The heartbeat interval (${this.settings.heartbeatIntervalMs} ms) must be at most half the node timeout (${this.settings.nodeTimeoutMs} ms); lower --heartbeat-interval or raise --node-timeout.`,
        { code: "invalid_fleet_timings" },
      );
    }
    this.nodes = new NodeRegistry({ store: options.store, joinToken: options.joinToken, logger: options.logger, clock: this.clock, monotonic: this.monotonic });
    this.addresses = new NodeAddresses({ nodes: this.nodes, events: this.events, logger: options.logger, clock: this.monotonic });
    this.demand = new Demand(this.clock);
    this.moveCooldowns = new MoveCooldowns(this.clock);
    const scalingParts = { store: options.store, events: this.events, logger: options.logger, clock: this.clock, load: options.load, fence: options.fence };
    const awake = (modelId: string) => this.demand.wants(modelId);
    this.autoscaling = new Autoscaling({ ...scalingParts, awake, parked: (modelId) => this.parked.has(modelId), onChange: () => this.schedule() });
    this.parked = new ParkedModels({ store: options.store, logger: options.logger, clock: this.clock });
    this.weights = new WeightsKnowledge({ mirror: options.mirror, logger: options.logger, onCopied: () => this.schedule(), store: options.store });
    this.rows = new ReplicaRows({
      store: options.store,
      box: options.box,
      logger: options.logger,
      clock: this.clock,
      ...(options.fence === undefined ? {} : { fence: options.fence }),
    });
    this.records = new ReplicaRecords({
      rows: this.rows,
      replicas: options.replicas,
      versions: this.versions,
      drains: new Drains({
        inFlight: (replicaId) => options.inFlight?.(replicaId) ?? 0,
        clock: this.clock,
        timeoutMs: options.drainTimeoutMs ?? FLEET_DEFAULTS.drainTimeoutMs,
        logger: options.logger,
        shared: options.drainCounts,
      }),
      holds: this.holds,
      logger: options.logger,
      modelById: (modelId) => this.modelById(modelId),
      nodeAddress: (nodeId) => this.nodes.get(nodeId)?.address,
      reconcile: () => this.schedule(),
      onParked: (record, node) => void this.park(record, node),
    });
  }

  async start(): Promise<void> {
    await this.nodes.load();
    await this.parked.load();
    await this.autoscaling.load();
    for (const record of await this.rows.load()) {
      const profile = this.options.catalog
        .list()
        .find((m) => m.id === record.modelId)
        ?.definition.profiles.find((p) => p.name === record.profile);
      record.engine = profile?.engine === "vllm" ? "vllm" : "llamacpp";
      // Until its node reports it, a replica of an earlier run is not routable: the engine
      // may have ended with the server (`up`) or may still run on its node (an agent that
      // kept going); the node's next heartbeat says which. Taking over from another leader
      // is different: that one knew the states until a moment ago.
      if (this.options.takeover !== true && record.state !== "parked" && record.state !== "stopping") {
        record.state = "placed";
        record.endpoint = null;
        record.weightsVerified = false;
      }
      this.records.restore(record);
      // An on-demand replica that ran before the restart stays wanted until it is idle.
      if (record.desired === "run") {
        this.demand.keep(record.modelId);
      }
    }
    this.unsubscribeCatalog = this.options.catalog.onChange(() => this.schedule());
    this.timer = setInterval(() => this.checkNow(), this.settings.tickMs);
    this.timer.unref();
    this.schedule();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer !== undefined) clearInterval(this.timer);
    this.unsubscribeCatalog?.();
    this.versions.wakeAll();
    await this.autoscaling.idle();
    await this.chain;
    await this.rows.flush();
    await this.nodes.flush().catch((error: unknown) => this.options.logger.warn({ err: describeError(error) }, "could not record node heartbeats"));
  }

  // --- The agent protocol ---------------------------------------------------------------

  async join(request: JoinRequest): Promise<JoinReply> {
    const reply = await this.nodes.join({
      ...request,
      inventory: checkInventory(request.inventory, "inventory"),
      labels: checkLabels(request.labels, "labels"),
    });
    this.backAt.set(reply.nodeId, this.monotonic());
    this.schedule();
    return reply;
  }

  async heartbeat(credential: string, report: HeartbeatReport): Promise<HeartbeatReply> {
    const node = this.nodes.authenticate(credential, report.name);
    // First: a report on another address than the node's is refused before anything of it is used.
    this.addresses.checkReport(node, report);
    const inventory = checkInventory(report.inventory, "inventory");
    if (this.nodes.heartbeat(node, { address: report.address, inventory, labels: checkLabels(report.labels, "labels") })) {
      this.options.logger.info({ node: node.name }, "node is back");
      void this.events.record({
        kind: "node_back",
        subject: `node:${node.name}`,
        data: { node: node.name },
        message: `Node '${node.name}' is back; replicas it still runs that were replaced elsewhere are stopped.`,
      });
      this.backAt.set(node.id, this.monotonic());
      this.versions.bump(node.id);
      this.schedule();
    }
    if (report.cached !== undefined) this.cached.set(node.id, new Set(report.cached));
    const reported = new Map(report.replicas.map((replica) => [replica.id, replica]));
    const restarted = report.agentRun !== undefined && this.agentRuns.has(node.id) && this.agentRuns.get(node.id) !== report.agentRun;
    if (report.agentRun !== undefined) this.agentRuns.set(node.id, report.agentRun);
    for (const record of [...this.records.values()]) {
      const index = record.nodeIds.indexOf(node.id);
      if (index < 0) continue;
      if (index > 0) {
        // A worker of a replica over several nodes: its Ray worker's state tells the head when to start vLLM.
        this.records.recordWorker(record, node.id, reported.get(record.id)?.state ?? "absent");
        continue;
      }
      const replica = reported.get(record.id);
      if (replica === undefined) {
        // Told to stop and no longer on the node: done.
        if (record.desired === "stop") this.records.forget(record);
        // The agent started again (after kill -9, say): its engines went with the last one,
        // so nothing is routed to them until it reports the replica running again.
        else if (restarted && record.state !== "parked" && record.state !== "placed") this.records.unconfirm(record);
        continue;
      }
      if (record.desired === "stop" && replica.state === "stopped") this.records.forget(record);
      else this.records.applyReport(record, replica, node);
    }
    this.records.finishDrains();
    return { nodeId: node.id, state: node.state, assignmentsVersion: this.versions.of(node.id), heartbeatIntervalMs: this.settings.heartbeatIntervalMs };
  }

  async assignments(credential: string, options: { knownVersion: string | null; waitMs: number; signal: AbortSignal }): Promise<AssignmentSet> {
    const node = this.nodes.authenticate(credential);
    if (options.knownVersion === this.versions.of(node.id) && !this.stopped) await this.versions.waitForChange(node.id, options.waitMs, options.signal);
    const version = this.versions.of(node.id);
    const assignments: Assignment[] = [];
    for (const record of this.records.values()) {
      const assignment = assignmentOf(record, this.modelById(record.modelId), node.id);
      if (assignment !== null) assignments.push(assignment);
    }
    return { version, assignments };
  }

  // --- On demand (the gateway's OnDemand) -----------------------------------------------

  /** A request for the model arrived: a model without replicas (scaling.min 0) gets one. */
  requested(model: CatalogModel): void {
    if (!this.demand.requested(model)) return;
    this.options.logger.info({ model: model.name }, "starting a replica on demand");
    this.schedule();
  }

  finished(model: CatalogModel): void {
    this.demand.finished(model.id);
  }

  /** Whether a replica of the model is being started on demand and may still come up. */
  starting(modelId: string): boolean {
    if (!this.demand.wants(modelId) || this.parked.has(modelId) || this.unplaceable.has(modelId)) return false;
    return this.weights.problem(modelId) === null;
  }

  // --- Model updates (server-side only: these carry engine keys) ------------------------

  /**
   * Keeps the model's running replicas serving and new ones out of routing until released
   * (outdated-holds.ts). Released as "rejected" (the new revision failed), the replicas
   * placed during the hold that the model no longer wants stop first: released, they would take traffic.
   */
  holdOutdated(modelId: string): (outcome?: "passed" | "rejected") => void {
    const ofModel = () => [...this.records.values()].filter((record) => record.modelId === modelId);
    const changed = () => {
      // Taken before start (a restarted server's unfinished update): start publishes and reconciles with it.
      if (this.timer === undefined) return;
      for (const record of ofModel()) this.records.publish(record);
      this.schedule();
    };
    const release = this.holds.hold(
      modelId,
      ofModel().map((record) => record.id),
      changed,
    );
    changed();
    return (outcome = "passed") => {
      const model = this.modelById(modelId);
      const unwanted = (r: ReplicaRecord) => this.holds.unproven(modelId, r.id) && (model === undefined || r.fingerprint !== fingerprintOf(model, r.profile));
      if (outcome === "rejected") for (const record of ofModel().filter(unwanted)) this.records.markStopping(record);
      release();
    };
  }

  /** The model's running replicas of its current and of earlier definitions, with endpoints and engine keys (server-side only). */
  replicasByDefinition(modelId: string): ReplicasByDefinition {
    return replicasByDefinition({
      modelId,
      model: this.modelById(modelId),
      records: this.records.values(),
      fingerprintOf,
      nodeName: (id) => this.nodes.get(id)?.name ?? id,
    });
  }

  /** Called with a model's id when its parking or placement changes (the gateway re-checks its waiting requests). */
  onStatusChange(listener: (modelId: string) => void): void {
    this.statusListener = listener;
  }

  /**
   * Stops the replicas of on-demand models that had no request for their idle time. Runs
   * in one turn of the event loop with the gateway's admission, so a request that took a
   * slot a moment ago keeps its replica (its count is above zero), and one that comes
   * after finds the replica stopping and waits for a fresh start.
   */
  private stopIdle(): void {
    for (const model of this.demand.takeIdle((modelId) => this.modelById(modelId))) {
      const replicas = [...this.records.values()].filter((r) => r.modelId === model.id && r.desired === "run");
      this.options.logger.info(
        { model: model.name, idleSeconds: model.definition.scaling.idle_seconds, replicas: replicas.length },
        "stopping idle on-demand replicas",
      );
      for (const record of replicas) this.records.markStopping(record);
    }
  }

  // --- Operations (admin API) ----------------------------------------------------------

  /** Ends a model's parking: its parked replicas go, and fresh ones are placed. Returns how many were parked. */
  async unpark(modelName: string): Promise<number> {
    const model = this.options.catalog.get(modelName);
    const count = await this.clearParking(model.id);
    this.schedule();
    return count;
  }

  async drain(name: string): Promise<FleetNode> {
    const node = this.nodes.byName(name);
    if (node.state === "lost")
      throw new BadRequestError(`Node '${name}' is lost; there is nothing to drain. Remove it with 'llmgw ctl node remove ${name}'.`, { code: "node_lost" });
    this.nodes.setState(node, "draining");
    await this.nodes.flush();
    this.schedule();
    return node;
  }

  /** Ends an operator's drain: the node takes new replicas again (a lost one once it is back); one not draining is refused (409). */
  async undrain(name: string): Promise<FleetNode> {
    const node = this.nodes.byName(name);
    this.nodes.endDrain(node);
    await this.nodes.flush();
    this.schedule();
    return node;
  }

  /** An admin moves the node (`ctl node update --address`): its replicas' endpoints on the old address leave routing until reported on the new one. */
  async updateAddress(name: string, address: string): Promise<{ node: FleetNode; previous: string }> {
    const changed = await this.addresses.change(name, address);
    for (const record of this.recordsOn(changed.node.id)) this.records.leaveOldAddress(record, changed.node);
    return changed;
  }

  async remove(name: string): Promise<FleetNode> {
    const node = this.nodes.byName(name);
    await this.nodes.remove(node);
    this.versions.bump(node.id);
    this.schedule();
    return node;
  }

  /** Whether the node verified the replica's weights (size and sha256) before its current start. */
  weightsVerified(replicaId: string): boolean {
    return this.records.get(replicaId)?.weightsVerified ?? false;
  }

  recordsOn(nodeId: string): ReplicaRecord[] {
    return [...this.records.values()].filter((r) => r.nodeIds.includes(nodeId));
  }

  status(modelId: string): ModelFleetStatus {
    const model = this.modelById(modelId);
    const wanted = model === undefined ? 0 : wantedReplicas(model, this.demand.wanted.get(modelId), this.autoscaling.desiredOf(modelId));
    return {
      parked: this.parked.get(modelId) ?? null,
      unplaceable: this.unplaceable.get(modelId) ?? null,
      weightsProblem: this.weights.problem(modelId),
      spread: this.spread.get(modelId) ?? null,
      desired: wanted,
      autoscaling: model === undefined ? null : this.autoscaling.view(model, wanted),
    };
  }

  /** Resolves after the reconciliations asked for so far have run (tests, and `up` before it reports). */
  async settled(): Promise<void> {
    await this.scaling;
    await this.chain;
  }

  // --- Reconciliation ----------------------------------------------------------------

  schedule(): void {
    if (this.pending || this.stopped) return;
    this.pending = true;
    this.chain = this.chain
      .then(async () => {
        this.pending = false;
        if (!this.stopped) await this.reconcileNow();
      })
      .catch((error: unknown) => this.options.logger.error({ err: describeError(error) }, "fleet reconciliation failed"));
  }

  /** What the 1 s tick does: lost nodes, idle on-demand replicas, drained replicas, heartbeat writes, a reconciliation. */
  checkNow(): void {
    for (const node of this.nodes.expire(this.settings.nodeTimeoutMs)) {
      this.options.logger.warn({ node: node.name, lastHeartbeat: new Date(node.lastHeartbeat).toISOString() }, "node lost");
      const replicas = this.recordsOn(node.id);
      void this.events.record({
        kind: "node_lost",
        subject: `node:${node.name}`,
        data: { node: node.name, replicas: replicas.length, last_heartbeat: new Date(node.lastHeartbeat).toISOString() },
        message: `Node '${node.name}' sent no heartbeat for ${Math.round(this.settings.nodeTimeoutMs / 1000)} s; ${countOf(replicas.length, "replica")} there ${replicas.length === 1 ? "is" : "are"} placed elsewhere where there is room.`,
      });
      this.versions.bump(node.id);
    }
    this.stopIdle();
    this.scaling = this.autoscaling.tick(this.options.catalog.list());
    this.records.finishDrains();
    if (this.clock() - this.lastFlush >= FLEET_DEFAULTS.heartbeatFlushMs) {
      this.lastFlush = this.clock();
      void this.nodes.flush().catch((error: unknown) => this.options.logger.warn({ err: describeError(error) }, "could not record node heartbeats"));
    }
    this.schedule();
  }

  private async reconcileNow(): Promise<void> {
    const models = this.options.catalog.list();
    // Read with the models, before anything is awaited: an update that points a model back
    // and then releases its hold meanwhile must not meet the new definition without its hold.
    const holding = this.holds.held();
    // Any change to a parked model's definition ends its parking (DESIGN.md "Replica lifecycle").
    for (const [modelId, parked] of this.parked.entries()) {
      const model = models.find((m) => m.id === modelId);
      if (model === undefined || model.updated_at > parked.at) await this.clearParking(modelId);
    }
    await this.weights.refresh(models, (modelId: string) => this.statusListener?.(modelId));
    const decision = reconcile({
      models,
      nodes: this.nodes.list(),
      replicas: [...this.records.values()],
      parked: this.parked.ids(),
      demand: this.demand.wanted,
      autoscaled: this.autoscaling.desired(),
      holding,
      optionsFor: (model) => this.weights.optionsFor(model),
      fingerprintOf: (model, profile) => fingerprintOf(model, profile),
      weightsKeyOf: (model) => this.weights.keyOf(model.id),
      cachedWeights: (nodeId) => this.cached.get(nodeId) ?? new Set(),
      place: this.options.place ?? placeReplicas,
      newReplicaId: () => `r-${randomBytes(6).toString("hex")}`,
      settling: this.settlingNodes(),
      moveCooldowns: this.moveCooldowns.active(),
      now: this.clock(),
    });
    this.apply(decision);
  }

  /**
   * Nodes that came back or joined less than two heartbeat intervals ago, with the ms left:
   * a node that has kept beating that long is taken to stay, and only then does a rebalance
   * move a replica there (new replicas a model needs go there at once).
   */
  private settlingNodes(): Map<string, number> {
    const settleMs = 2 * this.settings.heartbeatIntervalMs;
    const settling = new Map<string, number>();
    for (const [nodeId, at] of this.backAt) {
      const leftMs = at + settleMs - this.monotonic();
      if (leftMs > 0 && this.nodes.get(nodeId)?.state === "ready") settling.set(nodeId, leftMs);
      else if (leftMs <= 0) this.backAt.delete(nodeId);
    }
    return settling;
  }

  private apply(decision: ReconcileDecision): void {
    for (const { id, why } of decision.stop) {
      const record = this.records.get(id);
      if (record === undefined) continue;
      const nodes = record.nodeIds.map((nodeId) => this.nodes.get(nodeId));
      const lost = nodes.some((node) => node === undefined || node.state === "lost");
      // A draining replica stays desired "run" until it is drained: the reconciler names it again.
      if (this.records.draining(id) && !lost) continue;
      this.options.logger.info({ replica: id, why }, "stopping replica");
      // A lost or removed node cannot confirm the stop (nor serve a drain); if it comes back,
      // its agent stops the engine because the replica is no longer among its assignments.
      if (lost) this.records.forget(record);
      else this.records.markStopping(record);
    }
    for (const replica of decision.create) {
      const record = placedRecord(replica, {
        files: this.weights.filesOf(replica.modelId),
        adapters: this.weights.adaptersOf(replica.modelId),
        source: this.modelById(replica.modelId)?.definition.source ?? null,
        engineKey: randomBytes(24).toString("hex"),
      });
      this.records.add(record);
      const names = replica.nodeIds.map((id) => this.nodes.get(id)?.name ?? id).join(", ");
      this.options.logger.info({ replica: record.id, model: this.modelById(record.modelId)?.name, profile: record.profile, nodes: names }, "replica placed");
      for (const nodeId of replica.nodeIds) this.versions.bump(nodeId);
    }
    for (const move of decision.moves) {
      const name = this.modelById(move.modelId)?.name ?? move.modelId;
      const from = this.nodes.get(move.from)?.name ?? move.from;
      const to = move.to.map((id) => this.nodes.get(id)?.name ?? id).join(", ");
      this.options.logger.info({ model: name, replica: move.replicaId, from, to }, "moving a replica to spread its model");
      void this.events.record({
        kind: "replica_moved",
        subject: `model:${name}`,
        data: { model: name, replica: move.replicaId, from, to },
        message: `Model '${name}' had several replicas on node '${from}': replica ${move.replicaId} starts on '${to}', and one on '${from}' is drained and stopped once it is ready, so losing one node no longer takes the model down.`,
      });
    }
    for (const failed of decision.failedMoves) {
      this.moveCooldowns.add(failed.modelId, failed.cooldowns);
      const nodes = failed.cooldowns.map((c) => this.nodes.get(c.nodeId)?.name ?? c.nodeId).join(", ");
      const error = failed.cooldowns[0]?.lastError;
      this.options.logger.warn({ model: this.modelById(failed.modelId)?.name, replica: failed.replicaId, nodes, error }, "a rebalance move failed; given up");
    }
    this.moving = decision.moving;
    for (const [modelId, lines] of decision.unplaceable) {
      if (this.unplaceable.get(modelId)?.join("\n") !== lines.join("\n")) {
        const name = this.modelById(modelId)?.name ?? modelId;
        this.options.logger.warn({ model: name, explanation: lines }, "replica unplaceable");
        // Once when it starts (a changed explanation is logged, not announced again).
        if (!this.unplaceable.has(modelId)) {
          const message = `A replica of '${name}' fits on no node: ${lines.join("; ")}. Add a node or memory, or lower its context or replicas.`;
          void this.events.record({ kind: "replica_unplaceable", subject: `model:${name}`, data: { model: name, explanation: lines }, message });
        }
      }
    }
    const changed = [...new Set([...this.unplaceable.keys(), ...decision.unplaceable.keys()])].filter(
      (id) => this.unplaceable.has(id) !== decision.unplaceable.has(id),
    );
    this.unplaceable = decision.unplaceable;
    this.spread = decision.spread;
    for (const modelId of changed) this.statusListener?.(modelId);
  }

  private async park(record: ReplicaRecord, node: FleetNode): Promise<void> {
    const model = this.modelById(record.modelId);
    if (model === undefined || this.parked.has(model.id)) return;
    // A rebalance move's replica that cannot start says its node cannot run the model, not
    // that the model is broken: the reconciler gives the move up (reconciler.ts).
    if (this.moving.has(record.id)) return;
    const reason = `replica ${record.id} on node '${node.name}': ${record.lastError ?? "no error recorded"}`;
    await this.parked.park(model, reason);
    this.options.logger.error({ model: model.name, reason }, "model parked");
    this.statusListener?.(model.id);
    const data = { model: model.name, replica: record.id, node: node.name, reason };
    void this.events.record({
      kind: "model_parked",
      subject: `model:${model.name}`,
      data,
      message: `Model '${model.name}' is parked: ${reason}. Fix the cause, then 'llmgw ctl model unpark ${model.name}'.`,
    });
  }

  /**
   * Ends a model's parking: its parked replicas are stopped (each had its own supervisor
   * give up), so the next pass places fresh ones. Returns how many replicas were parked.
   */
  private async clearParking(modelId: string): Promise<number> {
    let count = 0;
    for (const record of this.records.values()) {
      if (record.modelId === modelId && record.state === "parked" && record.desired === "run") {
        this.records.markStopping(record);
        count += 1;
      }
    }
    if (!(await this.parked.clear(modelId))) return count;
    const model = this.modelById(modelId);
    if (model !== undefined)
      void this.events.record({
        kind: "model_unparked",
        subject: `model:${model.name}`,
        data: { model: model.name },
        message: `Model '${model.name}' is no longer parked; its replicas are started again.`,
      });
    return count;
  }

  private modelById(modelId: string): CatalogModel | undefined {
    return this.options.catalog.list().find((model) => model.id === modelId);
  }
}

/** Re-exported: what a replica of a profile was made from (model-replicas.ts). */
export { fingerprintOf };
