// A node's address: where the gateway reaches the node's engines, so where it sends client
// prompts and the engine keys. It is fixed when the node joins (the join body's address:
// the agent's --advertise, accepted with the join token) and afterwards only an admin
// changes it (`llmgw ctl node update NAME --address HOST`). An agent's report that names
// another address (its own, a replica's endpoint, a Ray head's) is refused whole, so a
// node credential alone can never point the gateway at another host.
//
// This module owns what an address may be (a host name or an IP, nothing more), how two
// are compared, the refusal and its event (once per node per reported address, not once
// per heartbeat), and an admin's change with its event.
import { isIP } from "node:net";
import { BadRequestError, ConflictError } from "../core/errors.ts";
import { printable } from "../core/format.ts";
import type { Logger } from "../core/log.ts";
import type { EventLog } from "../events/event-log.ts";
import type { HeartbeatReport } from "./agent-protocol.ts";
import type { FleetNode, NodeRegistry } from "./node-registry.ts";

/** A host name: dot-separated labels of letters, digits, '-' and '_' (Docker's names have '_'), none starting or ending with '-'. */
const HOST_NAME = /^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*$/;

/** Why `value` is not a node address (a host name or an IP without scheme, port or path), or null when it is one. */
export function addressProblem(value: string): string | null {
  const shown = `'${printable(value)}'`;
  if (value === "") return "is empty: give the host name or IP address at which the gateway reaches this node's engines";
  if (value.includes("://")) return `${shown} has a scheme: give only the host name or IP address, without http:// and without a port`;
  if (value.includes("/")) return `${shown} has a path: give only the host name or IP address`;
  if (value.startsWith("[")) return `${shown} has brackets: give an IPv6 address without them (and without a port)`;
  if (isIP(value) !== 0) return null;
  if (value.includes(":")) return `${shown} has a port (or is no valid IPv6 address): give only the host name or IP address; engines get ports of their own`;
  if (/^[0-9.]+$/.test(value)) return `${shown} is not a valid IPv4 address`;
  if (value.length > 253 || !HOST_NAME.test(value))
    return `${shown} is not a host name or IP address: a host name is dot-separated labels of letters, digits, '-' and '_', at most 63 characters each`;
  return null;
}

/** The address, or a 400 naming `param` and what is wrong with it. */
export function checkAddress(value: string, param: string): string {
  const problem = addressProblem(value);
  if (problem !== null) throw new BadRequestError(`Invalid ${param}: ${problem}.`, { code: "invalid_address", param });
  return value;
}

/** Whether two addresses name the same host (host names ignore case; an agent always reports its address as it was given). */
export function sameAddress(a: string, b: string): boolean {
  return a.toLowerCase() === b.toLowerCase();
}

/** The host of an engine origin ("http://10.0.0.5:41234", "http://[::1]:41234"), without IPv6 brackets. */
export function originHost(origin: string): string {
  return new URL(origin).hostname.replace(/^\[(.*)\]$/, "$1");
}

/** The host of a Ray GCS address ("10.0.0.5:6379", "[::1]:6379"). */
function hostOfHostPort(text: string): string {
  const bracketed = /^\[([^\]]*)\](?::\d+)?$/.exec(text);
  if (bracketed !== null) return bracketed[1]!;
  const colon = text.lastIndexOf(":");
  return colon < 0 ? text : text.slice(0, colon);
}

/** An address an agent reported that is not its node's approved one, and where in the report it was. */
export interface ForeignAddress {
  /** "the heartbeat's address", "replica r-1's endpoint", "replica r-1's Ray head address". */
  where: string;
  address: string;
}

/** The first address in an agent's report that is not the node's approved one, or null when all are on it. */
export function foreignAddress(approved: string, report: Pick<HeartbeatReport, "address" | "replicas">): ForeignAddress | null {
  if (!sameAddress(report.address, approved)) return { where: "the heartbeat's address", address: report.address };
  for (const replica of report.replicas) {
    if (replica.endpoint !== null && !sameAddress(replica.endpoint.host, approved))
      return { where: `replica ${replica.id}'s endpoint`, address: replica.endpoint.host };
    if (typeof replica.rayAddress === "string" && !sameAddress(hostOfHostPort(replica.rayAddress), approved))
      return { where: `replica ${replica.id}'s Ray head address`, address: hostOfHostPort(replica.rayAddress) };
  }
  return null;
}

/** The refusal an agent gets: which address was approved, which was reported, and who can change it. */
export function addressMismatch(node: Pick<FleetNode, "name" | "address">, found: ForeignAddress): ConflictError {
  const reported = printable(found.address);
  return new ConflictError(
    `Node '${node.name}' joined with address ${node.address}, but this report gives ${found.where} as ${reported}; nothing of the report was applied. ` +
      `A node's address is fixed at join and only an admin changes it: if the node really moved, run 'llmgw ctl node update ${node.name} --address ${reported}'; ` +
      `otherwise start its agent with --advertise ${node.address}.`,
    { code: "node_address_mismatch", param: "address" },
  );
}

/**
 * Checks agents' reports against their nodes' approved addresses, and applies an admin's
 * change of one. A refusal is logged and recorded as a `node_address_refused` event the
 * first time a node reports a given foreign address; the same address again (an agent
 * heartbeats every few seconds) is refused quietly, until the node reports its approved
 * address again, reports yet another one, or an admin changes it. The memory of what was
 * announced is this server's: after a restart (or a new leader) the next refusal is
 * announced once more.
 */
export class NodeAddresses {
  /** By node id: the foreign address last announced. */
  private readonly announced = new Map<string, string>();

  constructor(private readonly options: { nodes: NodeRegistry; events: EventLog; logger: Logger }) {}

  /** Throws the refusal when the report names an address other than the node's; before anything of the report is applied. */
  checkReport(node: FleetNode, report: Pick<HeartbeatReport, "address" | "replicas">): void {
    const found = foreignAddress(node.address, report);
    if (found === null) {
      this.announced.delete(node.id);
      return;
    }
    const error = addressMismatch(node, found);
    if (this.announced.get(node.id) !== found.address) {
      this.announced.set(node.id, found.address);
      this.options.logger.warn(
        { node: node.name, approved: node.address, reported: found.address, where: found.where },
        "refused a node's report on another address",
      );
      void this.options.events.record({
        kind: "node_address_refused",
        subject: `node:${node.name}`,
        data: { node: node.name, approved: node.address, reported: found.address, where: found.where },
        message: error.message,
      });
    }
    throw error;
  }

  /** An admin's change: written at once and announced. Returns the node and its previous address (the same when nothing changed). */
  async change(name: string, address: string): Promise<{ node: FleetNode; previous: string }> {
    const node = this.options.nodes.byName(name);
    const previous = node.address;
    await this.options.nodes.setAddress(node, checkAddress(address, "address"));
    if (previous === node.address) return { node, previous };
    this.announced.delete(node.id);
    this.options.logger.info({ node: node.name, previous, address: node.address }, "node address changed by an admin");
    void this.options.events.record({
      kind: "node_address_changed",
      subject: `node:${node.name}`,
      data: { node: node.name, previous, address: node.address },
      message: `Node '${node.name}' now has address ${node.address} (was ${previous}); its engines are reached there once its agent reports them on it.`,
    });
    return { node, previous };
  }
}
