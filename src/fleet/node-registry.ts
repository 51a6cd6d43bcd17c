// The nodes of the fleet: who joined, with which credential (its sha256), what each one
// has (inventory, labels), its state (ready, lost, draining: an operator's drain holds
// through loss and return until undrained) and when it last sent a heartbeat. The
// in-memory map answers every heartbeat without a query; joins, state changes and
// removals are written at once, heartbeat times in batches (`flush`), since a few hundred
// nodes beating every 5 s would otherwise be a write per node per beat. Heartbeat ages are
// measured on a monotonic clock: a wall clock that jumps forward on this server must not
// make every node lost at once (the wall clock is only what is shown and stored). A node's
// address is set at join and changed only by an admin (node-address.ts): a heartbeat on
// another address is refused, never taken as the node's new one.
import { performance } from "node:perf_hooks";
import { AuthenticationError, ConflictError, NotFoundError, PermissionDeniedError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import { isUniqueViolation, nowIso, type Store } from "../store/store.ts";
import type { JoinReply, JoinRequest } from "./agent-protocol.ts";
import type { NodeInventory, NodeLabels, NodeState } from "./fleet-types.ts";
import { credentialNodeId, hashSecret, mintNodeCredential, newNodeId, sameHash } from "./node-credentials.ts";
import { addressMismatch, checkAddress, sameAddress } from "./node-address.ts";

export interface FleetNode {
  id: string;
  name: string;
  /** Where the gateway reaches its engines: as it joined, or as an admin last set it. */
  address: string;
  labels: NodeLabels;
  inventory: NodeInventory;
  state: NodeState;
  /** An operator drains it: it stays draining through being lost and back. */
  draining: boolean;
  /** Epoch ms (wall clock), for showing and storing; ages are judged on the monotonic clock. */
  lastHeartbeat: number;
  joinedAt: string;
  credentialHash: string;
}

export interface NodeRegistryOptions {
  store: Store;
  /** The join token now (it may be rotated while the server runs). */
  joinToken: () => string;
  logger: Logger;
  /** The wall clock (epoch ms): what is shown and stored. */
  clock?: () => number;
  /** A clock that never jumps (ms, any origin), for heartbeat ages; default `performance.now`. */
  monotonic?: () => number;
}

export class NodeRegistry {
  private readonly nodes = new Map<string, FleetNode>();
  /** Nodes removed by an operator: their credentials are refused by name. */
  private readonly removed = new Map<string, { name: string; removedAt: string }>();
  private readonly heartbeatDirty = new Set<string>();
  /** Each node's last heartbeat on the monotonic clock, by node id. */
  private readonly beatAt = new Map<string, number>();
  private readonly clock: () => number;
  private readonly monotonic: () => number;

  constructor(private readonly options: NodeRegistryOptions) {
    this.clock = options.clock ?? Date.now;
    this.monotonic = options.monotonic ?? (() => performance.now());
  }

  /** Reads the joined nodes. Their heartbeat clocks restart now: a server that was down saw none. */
  async load(): Promise<void> {
    const rows = await this.options.store.db.selectFrom("nodes").selectAll().execute();
    const now = this.clock();
    const beatAt = this.monotonic();
    for (const row of rows) {
      if (row.state === "removed" || row.credential_hash === null) {
        this.removed.set(row.id, { name: row.name, removedAt: row.removed_at ?? row.last_heartbeat });
        continue;
      }
      this.nodes.set(row.id, {
        id: row.id,
        name: row.name,
        address: row.address,
        labels: JSON.parse(row.labels) as NodeLabels,
        inventory: JSON.parse(row.inventory) as NodeInventory,
        state: row.state === "draining" ? "draining" : row.state === "lost" ? "lost" : "ready",
        draining: row.state === "draining",
        lastHeartbeat: now,
        joinedAt: row.joined_at ?? row.last_heartbeat,
        credentialHash: row.credential_hash,
      });
      this.beatAt.set(row.id, beatAt);
    }
  }

  list(): FleetNode[] {
    return [...this.nodes.values()].sort((a, b) => a.name.localeCompare(b.name));
  }

  get(id: string): FleetNode | undefined {
    return this.nodes.get(id);
  }

  byName(name: string): FleetNode {
    const node = [...this.nodes.values()].find((candidate) => candidate.name === name);
    if (node === undefined)
      throw new NotFoundError(`No node named '${name}'. 'llmgw ctl node list' shows the nodes that joined.`, { code: "node_not_found", param: "name" });
    return node;
  }

  async join(request: JoinRequest): Promise<JoinReply> {
    if (!sameHash(hashSecret(request.joinToken), hashSecret(this.options.joinToken()))) {
      throw new AuthenticationError(
        "The join token is not this server's. Copy it again from the server's data dir (join.token) or from 'llmgw ctl node join-token' on a machine with the admin key.",
        { code: "invalid_join_token" },
      );
    }
    // Kept in its canonical form (node-address.ts): every comparison with it is in that form too.
    const address = checkAddress(request.address, "address");
    // A joined node keeps its name, credential and address: joining again under its name
    // (with the join token, from this machine or any other) is refused, not a way to move it.
    const taken = [...this.nodes.values()].find((node) => node.name === request.name);
    if (taken !== undefined) throw nameTaken(request.name, `${taken.state}, last heartbeat ${new Date(taken.lastHeartbeat).toISOString()}`);
    const id = newNodeId();
    const credential = mintNodeCredential(id);
    const now = this.clock();
    const node: FleetNode = {
      id,
      name: request.name,
      address,
      labels: request.labels,
      inventory: request.inventory,
      state: "ready",
      draining: false,
      lastHeartbeat: now,
      joinedAt: nowIso(() => now),
      credentialHash: hashSecret(credential),
    };
    const db = this.options.store.db;
    // A removed node's name may be used again: its old row (kept to explain its dead credential) steps aside.
    try {
      await db.transaction().execute(async (trx) => {
        await trx.deleteFrom("nodes").where("name", "=", request.name).where("state", "=", "removed").execute();
        await trx
          .insertInto("nodes")
          .values({
            id,
            name: node.name,
            address: node.address,
            labels: JSON.stringify(node.labels),
            inventory: JSON.stringify(node.inventory),
            state: node.state,
            last_heartbeat: node.joinedAt,
            credential_hash: node.credentialHash,
            joined_at: node.joinedAt,
            removed_at: null,
          })
          .execute();
      });
    } catch (error) {
      // Two agents joining under one name at once: the database saw the second.
      if (isUniqueViolation(error)) throw nameTaken(request.name, "joining right now");
      throw error;
    }
    for (const [removedId, entry] of this.removed) if (entry.name === request.name) this.removed.delete(removedId);
    this.nodes.set(id, node);
    this.beatAt.set(id, this.monotonic());
    this.options.logger.info({ node: node.name, nodeId: id, address: node.address }, "node joined");
    return { nodeId: id, name: node.name, credential };
  }

  /**
   * The node a credential belongs to. `claimedName` is the name the agent says it runs as:
   * a credential copied to another machine (or another agent's data dir) is refused.
   */
  authenticate(credential: string | undefined, claimedName?: string): FleetNode {
    if (credential === undefined || credential === "") {
      throw new AuthenticationError("This call needs the node's credential as 'Authorization: Bearer ...'; an agent gets one by joining with the join token.", {
        code: "node_credential_missing",
      });
    }
    const nodeId = credentialNodeId(credential);
    const node = nodeId === null ? undefined : this.nodes.get(nodeId);
    if (nodeId !== null && node === undefined) {
      const removed = this.removed.get(nodeId);
      if (removed !== undefined) {
        throw new AuthenticationError(
          `Node '${removed.name}' was removed from the fleet at ${removed.removedAt}; its credential no longer works. Delete node.json in the agent's data dir and join again with the join token.`,
          { code: "node_removed" },
        );
      }
    }
    if (node === undefined || !sameHash(hashSecret(credential), node.credentialHash)) {
      throw new AuthenticationError(
        "This node credential is not known to this server (from another server, or damaged). Delete node.json in the agent's data dir and join again with the join token.",
        { code: "invalid_node_credential" },
      );
    }
    if (claimedName !== undefined && claimedName !== node.name) {
      throw new PermissionDeniedError(
        `This credential belongs to node '${node.name}', not '${claimedName}': each node joins with its own name and keeps its own credential. Give this agent its own --data-dir and join token, or run it as --name ${node.name}.`,
        { code: "node_credential_mismatch" },
      );
    }
    return node;
  }

  /**
   * Records a heartbeat; returns true when the node was lost and is back. One that gives
   * another address than the node's is refused (node-address.ts), and nothing of it is kept.
   */
  heartbeat(node: FleetNode, report: { address: string; inventory: NodeInventory; labels: NodeLabels }): boolean {
    if (!sameAddress(report.address, node.address)) throw addressMismatch(node, { where: "the heartbeat's address", address: report.address });
    node.lastHeartbeat = this.clock();
    this.beatAt.set(node.id, this.monotonic());
    node.inventory = report.inventory;
    node.labels = report.labels;
    this.heartbeatDirty.add(node.id);
    if (node.state !== "lost") return false;
    node.state = node.draining ? "draining" : "ready";
    return true;
  }

  /** Nodes whose last heartbeat is older than `timeoutMs` (on the monotonic clock), now marked lost. */
  expire(timeoutMs: number): FleetNode[] {
    const now = this.monotonic();
    const lost: FleetNode[] = [];
    for (const node of this.nodes.values()) {
      if (node.state !== "lost" && now - (this.beatAt.get(node.id) ?? now) > timeoutMs) {
        node.state = "lost";
        // Written at the next flush, so a restarted server does not take it for ready.
        this.heartbeatDirty.add(node.id);
        lost.push(node);
      }
    }
    return lost;
  }

  setState(node: FleetNode, state: NodeState): void {
    node.state = state;
    node.draining = state === "draining";
    this.heartbeatDirty.add(node.id);
  }

  /**
   * Ends an operator's drain (`ctl node undrain`): a draining node is ready again, and a lost
   * one that was draining comes back ready. A node that was not draining is refused, so that
   * nothing claims (or audits) a drain that was never there.
   */
  endDrain(node: FleetNode): void {
    if (!node.draining) {
      throw new ConflictError(`Node '${node.name}' is not draining (it is ${node.state}); there is nothing to undrain.`, { code: "node_not_draining" });
    }
    node.draining = false;
    if (node.state === "draining") node.state = "ready";
    this.heartbeatDirty.add(node.id);
  }

  /** An admin's change of the node's address (`ctl node update --address`), written at once in canonical form. */
  async setAddress(node: FleetNode, given: string): Promise<void> {
    const address = checkAddress(given, "address");
    if (address === node.address) return;
    await this.options.store.db.updateTable("nodes").set({ address }).where("id", "=", node.id).execute();
    node.address = address;
  }

  async remove(node: FleetNode): Promise<void> {
    const removedAt = nowIso(this.clock);
    await this.options.store.db.updateTable("nodes").set({ state: "removed", removed_at: removedAt }).where("id", "=", node.id).execute();
    this.nodes.delete(node.id);
    this.beatAt.delete(node.id);
    this.heartbeatDirty.delete(node.id);
    this.removed.set(node.id, { name: node.name, removedAt });
  }

  /** Writes the heartbeat times, states and inventories changed since the last flush (not the address: join and setAddress write it). */
  async flush(): Promise<void> {
    if (this.heartbeatDirty.size === 0) return;
    const ids = [...this.heartbeatDirty];
    this.heartbeatDirty.clear();
    const db = this.options.store.db;
    await db.transaction().execute(async (trx) => {
      for (const id of ids) {
        const node = this.nodes.get(id);
        if (node === undefined) continue;
        await trx
          .updateTable("nodes")
          .set({
            labels: JSON.stringify(node.labels),
            inventory: JSON.stringify(node.inventory),
            state: node.state,
            last_heartbeat: new Date(node.lastHeartbeat).toISOString(),
          })
          .where("id", "=", id)
          .execute();
      }
    });
  }
}

function nameTaken(name: string, detail: string): ConflictError {
  return new ConflictError(
    `A node named '${name}' has already joined (${detail}). ` +
      `If this is that machine, keep using its node credential (node.json in the agent's data dir); to replace it, run 'llmgw ctl node remove ${name}' first, or join under another --name.`,
    { code: "node_name_taken", param: "name" },
  );
}
