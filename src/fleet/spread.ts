// Spreading a model's replicas over nodes, the parts of it the reconciler (reconciler.ts)
// asks about: how many replicas of a model each node runs, which of a model's extra
// replicas to stop (those on the most crowded node first), whether a rebalance move is
// under way, and the sentence `ctl model show` prints when replicas share a node. Replicas
// of one model on different nodes survive a node's loss; two on one node go down together.
//
// A move is not recorded anywhere: it is recognised from the replicas themselves (one more
// than wanted, the one not ready yet alone on its node while another node runs two or more
// ready ones), so a server that restarts or takes over mid-move finishes it the same way.
// A move whose new replica parks on its node (its supervisor's retries ran out) is given
// up instead (`failedMove`): the model is not parked for it, its other replicas serve on,
// and that node gets none of the model's moves for MOVE_COOLDOWN_MS (move-cooldowns.ts).
import { clause, printable } from "../core/format.ts";
import { ROOM_TAKEN } from "./placement.ts";
import type { ReplicaRecord } from "./replica-rows.ts";

/** How long a node a model's move failed on gets no move of that model: a broken engine there is not tried again and again. */
export const MOVE_COOLDOWN_MS = 10 * 60_000;

/** A node a model's rebalance move failed on: no move of the model goes there before `until` (epoch ms). */
export interface MoveCooldown {
  nodeId: string;
  until: number;
  /** The move's replica's last failure, for the spread line. */
  lastError: string;
}

/** Replicas of one model per node id (a replica over several nodes counts on each). */
export function replicasPerNode(replicas: readonly ReplicaRecord[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const replica of replicas) for (const nodeId of replica.nodeIds) counts.set(nodeId, (counts.get(nodeId) ?? 0) + 1);
  return counts;
}

/** Node ids that run two or more of the replicas, with how many, most first (then by id). */
export function crowdedNodes(replicas: readonly ReplicaRecord[]): Array<{ nodeId: string; count: number }> {
  return [...replicasPerNode(replicas)]
    .filter(([, count]) => count >= 2)
    .map(([nodeId, count]) => ({ nodeId, count }))
    .sort((a, b) => b.count - a.count || (a.nodeId < b.nodeId ? -1 : a.nodeId > b.nodeId ? 1 : 0));
}

/**
 * The new replica of a rebalance move that is not ready yet, or null when no move is under
 * way: the model has one replica more than it wants, that one is starting (or failed and
 * waits for its node's retry) alone on its node, and another node runs two or more ready
 * ones. While it starts nothing is stopped; once it is ready, `pickExtras` stops one of
 * the crowded node's.
 */
export function moveUnderway(current: readonly ReplicaRecord[], wanted: number): ReplicaRecord | null {
  const mover = moveReplica(current, wanted);
  return mover?.state === "parked" ? null : mover;
}

/** The new replica of a rebalance move that parked on its node (its retries ran out), or null: the move is given up. */
export function failedMove(current: readonly ReplicaRecord[], wanted: number): ReplicaRecord | null {
  const mover = moveReplica(current, wanted);
  return mover?.state === "parked" ? mover : null;
}

/** A move's new replica as `moveUnderway` describes it, also one that parked. */
function moveReplica(current: readonly ReplicaRecord[], wanted: number): ReplicaRecord | null {
  if (wanted < 1 || current.length !== wanted + 1) return null;
  const notReady = current.filter((replica) => replica.state !== "ready");
  const mover = notReady[0];
  if (notReady.length !== 1 || mover === undefined) return null;
  if (mover.state === "stopping" || mover.state === "stopped") return null;
  const others = current.filter((replica) => replica !== mover);
  const perNode = replicasPerNode(others);
  if (mover.nodeIds.some((nodeId) => perNode.has(nodeId))) return null;
  return crowdedNodes(others).length > 0 ? mover : null;
}

/**
 * What made a parked replica give up, for a sentence: the engine supervisor's parking
 * message (engine-supervisor.ts) ends with "Last failure: <message>", which is the part
 * that says what is wrong on the node.
 */
export function lastFailureOf(lastError: string | null): string {
  if (lastError === null) return "no error recorded";
  const marker = "Last failure: ";
  const at = lastError.lastIndexOf(marker);
  return printable(clause(at < 0 ? lastError : lastError.slice(at + marker.length)));
}

/** "moving one to n2 failed: <error>; not tried again before 14:30 UTC" (the minute rounded up, so it is never early). */
export function cooldownText(nodeName: string, cooldown: MoveCooldown): string {
  const minute = new Date(Math.ceil(cooldown.until / 60_000) * 60_000).toISOString().slice(11, 16);
  return `moving one to ${nodeName} failed: ${cooldown.lastError}; not tried again before ${minute} UTC`;
}

/**
 * Which `count` of a model's current replicas stop when it has more than it wants: first
 * those already leaving (drained), then parked and failed ones, then ones not ready, then
 * ready ones; within each, the one on the node with the most replicas of the model (so the
 * ones left are spread), then the newest.
 */
export function pickExtras(current: readonly ReplicaRecord[], count: number): ReplicaRecord[] {
  const left = [...current];
  const picked: ReplicaRecord[] = [];
  while (picked.length < count && left.length > 0) {
    const perNode = replicasPerNode(left);
    const crowd = (replica: ReplicaRecord) => Math.max(0, ...replica.nodeIds.map((nodeId) => perNode.get(nodeId) ?? 0));
    left.sort((a, b) => stopRank(a) - stopRank(b) || crowd(b) - crowd(a) || (b.startedAt ?? "").localeCompare(a.startedAt ?? ""));
    picked.push(left.shift()!);
  }
  return picked;
}

/** Stop order among extras: leaving first, then parked and failed, then not ready, ready last. */
function stopRank(replica: ReplicaRecord): number {
  switch (replica.state) {
    case "stopping":
      return 0;
    case "parked":
    case "failed":
      return 1;
    case "ready":
      return 3;
    default:
      return 2;
  }
}

/** "2 replicas on n1", "3 replicas on n1, 2 on n2". */
export function crowdText(crowded: ReadonlyArray<{ nodeId: string; count: number }>, nodeName: (nodeId: string) => string): string {
  return crowded.map((c, i) => `${c.count}${i === 0 ? " replicas" : ""} on ${nodeName(c.nodeId)}`).join(", ");
}

/**
 * Why a node that runs no replica of the model did not take one, from placement's
 * explanation line for it ("n2: 0.8 GiB free, needs 1.2 GiB", "n2: lost"): "n2 is lost",
 * "n2 has no room (0.8 GiB free, needs 1.2 GiB)", "n2 cannot run it (no vllm engine)".
 */
export function whyNotThere(line: string): string {
  const colon = line.indexOf(": ");
  if (colon < 0) return line;
  const name = line.slice(0, colon);
  const reason = line.slice(colon + 2);
  if (reason === "lost" || reason === "draining") return `${name} is ${reason}`;
  return line.includes(ROOM_TAKEN) ? `${name} has no room (${reason})` : `${name} cannot run it (${reason})`;
}
