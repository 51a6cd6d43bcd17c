// The reconciler's decision, as a pure function: from the catalog, the nodes, the replica
// records and the models' parking and demand, which replicas to create (and where) and
// which to stop. The fleet (fleet.ts) applies the decision, writes the rows and tells the
// nodes; keeping the decision free of I/O makes every rule below testable on its own.
//
// Rules, per model that runs on engines (external profiles are routed, never placed):
// - wanted = scaling.min, or while on demand (min 0) the replicas demand asks for; then,
//   while that is not 0, what autoscaling wants if more (autoscaling.ts); at most
//   scaling.max. A parked model gets no new replica (DESIGN.md "Replica lifecycle").
// - A replica on a lost or vanished node is stopped; the fleet replaces it elsewhere.
// - A replica made from an older definition (another fingerprint), or on a draining node,
//   is replaced first and stopped once enough current replicas are ready ("start the new
//   one before stopping the old one when there is room"); when the new one does not fit,
//   but would with the old one's room, the old one is stopped, and a later pass places the
//   new one there once its node confirms the stop.
// - While a model is held (an update checks its new replicas, see Fleet.holdOutdated), its
//   replicas that are outdated only by their fingerprint and have not failed keep running
//   alongside the new ones, and never make room for them (an update needs room for both);
//   ones on a draining or lost node go as above.
// - Extra replicas (scaled down, idle) stop, those not ready first, then those on the node
//   with the most replicas of the model (spread.ts).
// - Spread: replicas of one model go to different nodes whenever nodes with room exist
//   (placement prefers nodes without the model). Only replicas that stay count as "the
//   model is on that node": one being replaced (an older definition, on a draining node,
//   being drained or stopped) does not, so an update's successors spread too.
// - Rebalance: a model whose replicas are all ready and current, with two or more on one
//   node while a ready node without any of them has room, gets one more replica there (a
//   move); once it is ready, one of the crowded node's replicas stops (drained first), so
//   no request fails. One move at a time per model; none while the model is updated,
//   held, parked or not all ready; none to a node that came back or joined less than a
//   settling time ago (`settling`), so a flapping node is not given replicas to lose. A
//   move never crowds a node, so it cannot be undone by the next one.
// - A move whose new replica parks on its node (its supervisor's retries ran out) is given
//   up: that replica stops, the model is not parked (its other replicas serve; the fleet
//   does not park a model for a move's replica, `moving`), and no move of the model goes
//   to that node until its cool-down ends (`moveCooldowns`, spread.ts MOVE_COOLDOWN_MS).
// - A replica holds its room (memory, cores, GPUs) until its node confirms it stopped: a
//   stopping engine still has its memory, and a GPU is never given to two at once.
import type { CatalogModel } from "../catalog/catalog.ts";
import type { FleetNode } from "./node-registry.ts";
import type { PlacementNode, PlacementOption, PlacementRequest, PlacementResult, ReplicaNeeds } from "./fleet-types.ts";
import type { ReplicaRecord } from "./replica-rows.ts";
import {
  cooldownText,
  crowdedNodes,
  crowdText,
  failedMove,
  lastFailureOf,
  MOVE_COOLDOWN_MS,
  type MoveCooldown,
  moveUnderway,
  pickExtras,
  whyNotThere,
} from "./spread.ts";

export interface ReconcileInput {
  models: readonly CatalogModel[];
  nodes: readonly FleetNode[];
  replicas: readonly ReplicaRecord[];
  /** Model ids whose replicas parked: no new attempts until unparked or changed. */
  parked: ReadonlySet<string>;
  /** On-demand models (scaling.min 0): how many replicas requests want now. */
  demand: ReadonlyMap<string, number>;
  /** Autoscaled models: the replicas the load calls for now (autoscaling.ts); absent: the plain count. */
  autoscaled?: ReadonlyMap<string, number>;
  /** Model ids whose ready outdated replicas are kept while their update is checked (Fleet.holdOutdated). */
  holding: ReadonlySet<string>;
  /** How a model's replicas can run (its profiles with what they need), or null while unknown. */
  optionsFor: (model: CatalogModel) => PlacementOption[] | null;
  /** The fingerprint of a model's profile: replicas made from another one are outdated. */
  fingerprintOf: (model: CatalogModel, profile: string) => string;
  weightsKeyOf: (model: CatalogModel) => string | null;
  cachedWeights: (nodeId: string) => ReadonlySet<string>;
  place: (input: { nodes: PlacementNode[]; requests: PlacementRequest[] }) => PlacementResult;
  newReplicaId: () => string;
  /**
   * Nodes that came back or joined a moment ago → ms until a rebalance move may go there
   * (absent: settled). New replicas the model needs are placed there at once.
   */
  settling?: ReadonlyMap<string, number>;
  /** Model id → nodes a rebalance move of it failed on a while ago: no move of it goes there before their `until`. */
  moveCooldowns?: ReadonlyMap<string, readonly MoveCooldown[]>;
  /** Epoch ms now: a move given up in this pass cools its node down from now. */
  now?: number;
}

export interface NewReplica {
  id: string;
  modelId: string;
  profile: string;
  engine: "llamacpp" | "vllm";
  nodeIds: string[];
  gpus: Record<string, number[]>;
  fingerprint: string;
  needs: ReplicaNeeds;
}

export interface ReconcileDecision {
  create: NewReplica[];
  /** Replica ids to stop, with why (logged). */
  stop: Array<{ id: string; why: string }>;
  /** Models that wanted a replica no node could take, with one line per node. */
  unplaceable: Map<string, string[]>;
  /** Rebalance moves started: the new replica (in `create`), and the crowded node one of its model's replicas leaves. */
  moves: Array<{ modelId: string; replicaId: string; from: string; to: string[] }>;
  /** The replicas of rebalance moves under way or started now: their failures never park their model. */
  moving: Set<string>;
  /** Moves given up now (the new replica parked on its node; it is in `stop`), with the cool-downs their nodes start. */
  failedMoves: Array<{ modelId: string; replicaId: string; cooldowns: MoveCooldown[] }>;
  /** Models whose replicas share a node, with why ("2 replicas on n1: n2 is lost"). */
  spread: Map<string, string>;
}

/** A model with replicas sharing a node, as the rebalance sees it. */
interface Crowded {
  model: CatalogModel;
  crowded: Array<{ nodeId: string; count: number }>;
  options: PlacementOption[];
  /** Why no move is tried now, or null when one is. */
  waiting: string | null;
}

/**
 * The replicas a model wants now: scaling.min, or while on demand (min 0) what demand asks
 * for; then, while that is not 0, what autoscaling decided if more; at most scaling.max. An
 * on-demand model asleep stays at 0 whatever was decided while it was awake.
 */
export function wantedReplicas(model: CatalogModel, demand: number | undefined, autoscaled: number | undefined): number {
  const { min, max } = model.definition.scaling;
  const base = min > 0 ? min : (demand ?? 0);
  return Math.min(max, base === 0 ? 0 : Math.max(base, autoscaled ?? 0));
}

/** Whether a model's replicas are started by the fleet (it has an engine profile). */
export function runsOnEngines(model: CatalogModel): boolean {
  return model.definition.profiles.some((profile) => profile.engine !== "external");
}

export function reconcile(input: ReconcileInput): ReconcileDecision {
  const decision: ReconcileDecision = { create: [], stop: [], unplaceable: new Map(), moves: [], moving: new Set(), failedMoves: [], spread: new Map() };
  const cooldowns = new Map(input.moveCooldowns ?? []);
  const nodesById = new Map(input.nodes.map((node) => [node.id, node]));
  const nodeName = (id: string) => nodesById.get(id)?.name ?? id;
  const live = input.replicas.filter((r) => r.desired === "run");
  const onLostNode = (replica: ReplicaRecord) => replica.nodeIds.some((id) => nodesById.get(id) === undefined || nodesById.get(id)!.state === "lost");
  const stopped = new Set<string>();
  const stop = (id: string, why: string) => {
    if (stopped.has(id)) return;
    stopped.add(id);
    decision.stop.push({ id, why });
  };

  // Being stopped on a node that is gone: that node will never confirm it.
  for (const replica of input.replicas) if (replica.desired === "stop" && onLostNode(replica)) stop(replica.id, "its node is lost or was removed");

  const byModel = new Map<string, ReplicaRecord[]>();
  for (const replica of live) byModel.set(replica.modelId, [...(byModel.get(replica.modelId) ?? []), replica]);
  const models = new Map(input.models.map((model) => [model.id, model]));

  // Replicas of models that are gone, or no longer run on engines.
  for (const [modelId, replicas] of byModel) {
    const model = models.get(modelId);
    if (model === undefined || !runsOnEngines(model)) for (const r of replicas) stop(r.id, "its model was deleted or no longer runs on an engine");
  }

  const requests: PlacementRequest[] = [];
  /** Replicas being replaced (leaving): they do not count as their model being on their node. */
  const replaced = new Set<string>();
  const crowdedModels: Crowded[] = [];
  const requestModel = new Map<string, { model: CatalogModel; replaceable: ReplicaRecord[] }>();
  const optionsByModel = new Map<string, PlacementOption[]>();
  for (const model of input.models) {
    if (!runsOnEngines(model)) continue;
    const replicas = byModel.get(model.id) ?? [];
    const options = input.optionsFor(model);
    const wanted = wantedReplicas(model, input.demand.get(model.id), input.autoscaled?.get(model.id));
    const current: ReplicaRecord[] = [];
    const leaving: ReplicaRecord[] = [];
    const onDrainingNode = new Set<string>();
    for (const replica of replicas) {
      const draining = replica.nodeIds.some((id) => nodesById.get(id)?.state === "draining");
      if (draining) onDrainingNode.add(replica.id);
      if (onLostNode(replica)) {
        stop(replica.id, "its node is lost or was removed");
      } else if (replica.engineKey === null) {
        stop(replica.id, "its engine key was sealed with another server secret");
      } else if (draining || replica.fingerprint !== input.fingerprintOf(model, replica.profile)) {
        leaving.push(replica);
      } else {
        current.push(replica);
      }
    }
    for (const old of leaving) replaced.add(old.id);
    // A move whose new replica could not start on its node: it goes, the rest serve on.
    const failed = failedMove(current, wanted);
    if (failed !== null) {
      stop(failed.id, `a rebalance move that failed on node '${failed.nodeIds.map(nodeName).join("', '")}'`);
      current.splice(current.indexOf(failed), 1);
      const until = (input.now ?? 0) + MOVE_COOLDOWN_MS;
      const started = failed.nodeIds.map((nodeId) => ({ nodeId, until, lastError: lastFailureOf(failed.lastError) }));
      decision.failedMoves.push({ modelId: model.id, replicaId: failed.id, cooldowns: started });
      cooldowns.set(model.id, [...(cooldowns.get(model.id) ?? []).filter((c) => !failed.nodeIds.includes(c.nodeId)), ...started]);
    }
    // Extra replicas stop, the ones that are not serving first, then those on crowded nodes;
    // while a rebalance move's new replica starts, nothing (it is the extra one for now).
    const mover = moveUnderway(current, wanted);
    if (mover !== null) decision.moving.add(mover.id);
    if (current.length > wanted && mover === null) {
      const extras = pickExtras(current, current.length - wanted);
      const crowded = new Set(crowdedNodes(current).map((c) => c.nodeId));
      for (const extra of extras) {
        const shared = extra.nodeIds.find((id) => crowded.has(id));
        stop(extra.id, `more replicas than the model wants${shared === undefined ? "" : `; this one shared node '${nodeName(shared)}' with another`}`);
      }
      current.splice(0, current.length, ...current.filter((replica) => !extras.includes(replica)));
    }
    for (const replica of current) if (replica.state === "stopping") replaced.add(replica.id);
    const readyCurrent = current.filter((r) => r.state === "ready").length;
    const held = input.holding.has(model.id);
    for (const old of leaving) {
      // Nothing is lost by stopping one that does not serve; a serving one waits for its
      // successors. While its model is held it stays beside them, also when not ready yet
      // (after a restart, until its node reports it); a node being drained is not held up
      // by an update: its replicas go once replaced.
      if (held && keptWhileHeld(old) && !onDrainingNode.has(old.id)) continue;
      if (old.state !== "ready" || readyCurrent >= wanted) stop(old.id, "replaced by a replica of the current definition or another node");
    }
    const parked = input.parked.has(model.id);
    const staying = current.filter((replica) => replica.id !== mover?.id);
    const crowded = crowdedNodes(staying);
    if (crowded.length > 0) {
      const waiting =
        mover !== null
          ? `moving one to ${mover.nodeIds.map(nodeName).join(", ")}`
          : parked
            ? "one moves to another node once the model is unparked"
            : held || leaving.some((r) => !stopped.has(r.id))
              ? "one moves to another node once its update (or the replacing of its replicas) is done"
              : staying.length !== wanted || staying.some((r) => r.state !== "ready")
                ? "one moves to another node once all its replicas are ready"
                : options === null || options.length === 0
                  ? "one moves to another node once its weights are known"
                  : null;
      crowdedModels.push({ model, crowded, options: options ?? [], waiting });
    }
    const missing = parked ? 0 : wanted - current.length;
    if (missing <= 0) continue;
    if (options === null || options.length === 0) continue;
    optionsByModel.set(model.id, options);
    for (let i = 0; i < missing; i += 1) {
      const key = input.newReplicaId();
      requests.push({ key, modelId: model.id, modelName: model.name, options, weightsKey: input.weightsKeyOf(model) });
      // A held model's old replicas never make room: they serve until the new revision
      // passed its check, so an update without room for both waits instead (the job says so).
      requestModel.set(key, { model, replaceable: leaving.filter((r) => !stopped.has(r.id) && !(held && keptWhileHeld(r) && !onDrainingNode.has(r.id))) });
    }
  }
  const movable = crowdedModels.filter((c) => c.waiting === null);
  for (const c of crowdedModels) if (c.waiting !== null) decision.spread.set(c.model.id, `${crowdText(c.crowded, nodeName)}: ${c.waiting}`);
  if (requests.length === 0 && movable.length === 0) return decision;

  // What the replicas hold, node by node: every one whose node has not confirmed its stop.
  const usage = new Map<string, { memoryBytes: number; cores: number; gpus: number[]; models: Set<string> }>();
  for (const node of input.nodes) usage.set(node.id, { memoryBytes: 0, cores: 0, gpus: [], models: new Set() });
  const hold = (replica: ReplicaRecord, sign: 1 | -1) => {
    for (const nodeId of replica.nodeIds) {
      const used = usage.get(nodeId);
      if (used === undefined) continue;
      used.memoryBytes += sign * (replica.needs?.memoryBytes ?? 0);
      used.cores += sign * (replica.needs?.cores ?? 0);
      const gpus = replica.gpus[nodeId] ?? [];
      if (sign === 1) used.gpus.push(...gpus);
      else used.gpus = used.gpus.filter((index) => !gpus.includes(index));
      if (sign === 1 && replica.desired === "run" && !stopped.has(replica.id) && !replaced.has(replica.id)) used.models.add(replica.modelId);
    }
  };
  for (const replica of input.replicas) if (!onLostNode(replica)) hold(replica, 1);
  const placementNodes = (): PlacementNode[] =>
    input.nodes.map((node) => {
      const used = usage.get(node.id)!;
      return {
        id: node.id,
        name: node.name,
        state: node.state,
        inventory: node.inventory,
        labels: node.labels,
        used: { memoryBytes: used.memoryBytes, cores: used.cores, gpus: [...used.gpus] },
        models: used.models,
        cachedWeights: input.cachedWeights(node.id),
      };
    });
  const result = requests.length === 0 ? { placed: [], unplaceable: [] } : input.place({ nodes: placementNodes(), requests });
  /** A replica to create for what placement chose; returns the option it uses. */
  const createPlaced = (
    model: CatalogModel,
    options: readonly PlacementOption[],
    placed: { key: string; profile: string; nodeIds: string[]; gpus: Record<string, number[]> },
  ) => {
    const option = options.find((o) => o.profile === placed.profile)!;
    decision.create.push({
      id: placed.key,
      modelId: model.id,
      profile: placed.profile,
      engine: option.needs.engine,
      nodeIds: placed.nodeIds,
      gpus: placed.gpus,
      fingerprint: input.fingerprintOf(model, placed.profile),
      needs: option.needs,
    });
    return option;
  };
  for (const placed of result.placed) {
    const { model } = requestModel.get(placed.key)!;
    createPlaced(model, optionsByModel.get(model.id)!, placed);
  }
  for (const unplaceable of result.unplaceable) {
    const { replaceable } = requestModel.get(unplaceable.key)!;
    // No room for the successor: stop a predecessor only when its room would make the
    // successor fit; otherwise (a profile no node can run, a draining node) it keeps serving.
    const request = requests.find((r) => r.key === unplaceable.key)!;
    const old = replaceable.find((candidate) => {
      if (stopped.has(candidate.id)) return false;
      hold(candidate, -1);
      const fits = input.place({ nodes: placementNodes(), requests: [request] }).placed.length > 0;
      hold(candidate, 1);
      return fits;
    });
    if (old !== undefined) stop(old.id, "making room for its successor");
    else decision.unplaceable.set(unplaceable.modelId, unplaceable.explanation);
  }

  // Rebalance moves come last, each seeing the room the replicas placed above took.
  const take = (nodeIds: string[], needs: ReplicaNeeds, gpus: Record<string, number[]>, modelId: string) => {
    for (const nodeId of nodeIds) {
      const used = usage.get(nodeId);
      if (used === undefined) continue;
      used.memoryBytes += needs.memoryBytes;
      used.cores += needs.cores;
      used.gpus.push(...(gpus[nodeId] ?? []));
      used.models.add(modelId);
    }
  };
  for (const created of decision.create) take(created.nodeIds, created.needs, created.gpus, created.modelId);
  for (const c of movable) {
    const { model, options } = c;
    const settling = input.settling ?? new Map<string, number>();
    const cooling = new Map((cooldowns.get(model.id) ?? []).map((c) => [c.nodeId, c]));
    // Only nodes without a replica of the model, not settling, and where no move of it failed a moment ago, are offered.
    const others = placementNodes().filter((node) => !node.models.has(model.id));
    const offered = others.filter((node) => !settling.has(node.id) && !cooling.has(node.id));
    const request: PlacementRequest = { key: input.newReplicaId(), modelId: model.id, modelName: model.name, options, weightsKey: input.weightsKeyOf(model) };
    const outcome = offered.length === 0 ? null : input.place({ nodes: offered, requests: [request] });
    const placed = outcome?.placed[0];
    const crowd = crowdText(c.crowded, nodeName);
    if (placed === undefined) {
      const reasons = (outcome?.unplaceable[0]?.explanation ?? []).map(whyNotThere);
      for (const node of others) {
        const cooldown = cooling.get(node.id);
        const leftMs = settling.get(node.id);
        if (cooldown !== undefined) reasons.push(cooldownText(node.name, cooldown));
        else if (leftMs !== undefined) reasons.push(`${node.name} came back a moment ago; one moves there in ${Math.ceil(leftMs / 1000)} s if it stays`);
      }
      if (reasons.length === 0)
        reasons.push(input.nodes.length === 1 ? `${nodeName(c.crowded[0]!.nodeId)} is the only node` : "every other node runs one already");
      decision.spread.set(model.id, `${crowd}: ${reasons.join("; ")}`);
      continue;
    }
    const option = createPlaced(model, options, placed);
    take(placed.nodeIds, option.needs, placed.gpus, model.id);
    decision.moves.push({ modelId: model.id, replicaId: placed.key, from: c.crowded[0]!.nodeId, to: placed.nodeIds });
    decision.moving.add(placed.key);
    decision.spread.set(model.id, `${crowd}: moving one to ${placed.nodeIds.map(nodeName).join(", ")}`);
  }
  return decision;
}

/**
 * An outdated replica a held model keeps: one that serves, or may again (after a server
 * restart every replica is `placed` until its node reports it). Failed and parked ones go.
 */
function keptWhileHeld(replica: ReplicaRecord): boolean {
  return replica.state !== "failed" && replica.state !== "parked";
}
