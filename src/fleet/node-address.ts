// A node's address: where the gateway reaches the node's engines, so where it sends client
// prompts and the engine keys. It is fixed when the node joins (the join body's address:
// the agent's --advertise, accepted with the join token) and afterwards only an admin
// changes it (`llmgw ctl node update NAME --address HOST`). An agent's report that names
// another address (its own, a replica's endpoint, a Ray head's) is refused whole, so a
// node credential alone can never point the gateway at another host.
//
// This module owns what an address may be (a host name or an IP, nothing more, and nothing
// a URL would read as another host: no IPv6 zone id, IPv4 only in dotted decimal), its one
// canonical form (kept at join and update, and the form every comparison is made in), the
// refusal and its event (at most once per node per 10 minutes, not once per heartbeat),
// and an admin's change with its event.
import { isIP } from "node:net";
import { performance } from "node:perf_hooks";
import { BadRequestError, ConflictError } from "../core/errors.ts";
import { printable } from "../core/format.ts";
import type { Logger } from "../core/log.ts";
import type { EventLog } from "../events/event-log.ts";
import type { HeartbeatReport } from "./agent-protocol.ts";
import type { FleetNode, NodeRegistry } from "./node-registry.ts";

/** A host name: dot-separated labels of letters, digits, '-' and '_' (Docker's names have '_'), none starting or ending with '-'. */
const HOST_NAME = /^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9_-]{1,63}(?<!-))*$/;

/**
 * The host as a URL reads it (WHATWG: lower-case, IPv6 compressed and bracketed, IPv4 in
 * any base turned dotted decimal), or null when no URL can hold it. The gateway reaches
 * engines through URLs, so this is what an address really names.
 */
function urlHostname(host: string): string | null {
  try {
    return new URL(`http://${isIP(host) === 6 ? `[${host}]` : host}`).hostname;
  } catch {
    return null;
  }
}

/** Why `value` is not a node address (a host name or an IP without scheme, port or path), or null when it is one. */
export function addressProblem(value: string): string | null {
  const shown = `'${printable(value)}'`;
  if (value === "") return "is empty: give the host name or IP address at which the gateway reaches this node's engines";
  if (value.includes("://")) return `${shown} has a scheme: give only the host name or IP address, without http:// and without a port`;
  if (value.includes("/")) return `${shown} has a path: give only the host name or IP address`;
  if (value.startsWith("[")) return `${shown} has brackets: give an IPv6 address without them (and without a port)`;
  const zone = value.indexOf("%");
  // isIP accepts "fe80::1%eth0", but an engine's URL cannot carry a zone id: every endpoint on it would be unusable.
  if (zone >= 0 && isIP(value) === 6)
    return `${shown} has a zone id (${printable(value.slice(zone))}): a URL cannot carry it; give an address that routes without one (a global or unique local IPv6 address, an IPv4 address or a host name)`;
  if (isIP(value) !== 0) return null;
  if (value.includes(":")) return `${shown} has a port (or is no valid IPv6 address): give only the host name or IP address; engines get ports of their own`;
  const name = value.endsWith(".") ? value.slice(0, -1) : value;
  if (name.length > 253 || !HOST_NAME.test(name))
    return `${shown} is not a host name or IP address: a host name is dot-separated labels of letters, digits, '-' and '_', at most 63 characters each`;
  // Only now, with nothing but labels left ("gpu@01" would be user "gpu" at host 01), is a URL asked what the host is.
  const hostname = urlHostname(value);
  // "127.1", "0x7f.1", "0177.0.0.1", "2130706433": a URL (so the gateway) connects to the IPv4 address they stand for.
  if (hostname !== null && isIP(hostname) === 4)
    return `${shown} is read as the IPv4 address ${hostname}: give it in dotted-decimal form (${hostname}), or give a host name`;
  if (/^[0-9.]+$/.test(value)) return `${shown} is not a valid IPv4 address: give four numbers 0-255 in dotted-decimal form (10.0.0.5)`;
  if (hostname === null)
    return `${shown} is a host name no URL can carry (a last label that is a number makes it an IPv4 address, and an 'xn--' label must be valid punycode): give another host name or the IP address`;
  return null;
}

/**
 * An address's one form: the host as a URL gives it, without IPv6 brackets, and a host
 * name without its trailing dot ("0:0:0:0:0:0:0:1" → "::1", "GPU-01.lan." → "gpu-01.lan").
 * A value that is no address (a row from before these checks) is only lower-cased.
 */
export function canonicalAddress(value: string): string {
  const hostname = addressProblem(value) === null ? urlHostname(value) : null;
  if (hostname === null) return value.toLowerCase();
  return hostname.replace(/^\[(.*)\]$/, "$1").replace(/\.$/, "");
}

/** The address in its canonical form, or a 400 naming `param` and what is wrong with it. */
export function checkAddress(value: string, param: string): string {
  const problem = addressProblem(value);
  if (problem !== null) throw new BadRequestError(`Invalid ${param}: ${problem}.`, { code: "invalid_address", param });
  return canonicalAddress(value);
}

/** Whether two addresses name the same host: compared in canonical form (an agent reports its address as it was given). */
export function sameAddress(a: string, b: string): boolean {
  return canonicalAddress(a) === canonicalAddress(b);
}

/** The host of an engine origin ("http://10.0.0.5:41234", "http://[::1]:41234"), without IPv6 brackets; null when no URL can be read from it. */
export function originHost(origin: string): string | null {
  try {
    return new URL(origin).hostname.replace(/^\[(.*)\]$/, "$1");
  } catch {
    return null;
  }
}

/** Whether an engine origin is on the address (false for one no URL can be read from). */
export function originOnAddress(origin: string, address: string): boolean {
  const host = originHost(origin);
  return host !== null && sameAddress(host, address);
}

/**
 * The host of a Ray GCS address ("10.0.0.5:6379", "[::1]:6379", as the agent writes it):
 * a host and a port 1-65535, nothing more; a 400 otherwise (workers connect there).
 */
function rayHeadHost(text: string, param: string): string {
  const match = /^(?:\[([^\]]+)\]|([^:[\]]+)):([0-9]{1,5})$/.exec(text);
  const port = match === null ? 0 : Number(match[3]);
  if (match === null || port < 1 || port > 65535) {
    throw new BadRequestError(
      `Invalid ${param}: '${printable(text)}' is not a Ray head address: it must be HOST:PORT with the node's address as HOST ([HOST]:PORT for IPv6) and a port 1-65535, nothing else.`,
      { code: "invalid_ray_address", param },
    );
  }
  return match[1] ?? match[2]!;
}

/** An address an agent reported that is not its node's approved one, and where in the report it was. */
export interface ForeignAddress {
  /** "the heartbeat's address", "replica r-1's endpoint", "replica r-1's Ray head address". */
  where: string;
  address: string;
}

/**
 * The first address in an agent's report that is not the node's approved one, or null when
 * all are on it (compared in canonical form). A Ray head address that is not HOST:PORT is a 400.
 */
export function foreignAddress(approved: string, report: Pick<HeartbeatReport, "address" | "replicas">): ForeignAddress | null {
  if (!sameAddress(report.address, approved)) return { where: "the heartbeat's address", address: report.address };
  for (const [index, replica] of report.replicas.entries()) {
    if (replica.endpoint !== null && !sameAddress(replica.endpoint.host, approved))
      return { where: `replica ${replica.id}'s endpoint`, address: replica.endpoint.host };
    if (typeof replica.rayAddress !== "string") continue;
    const rayHost = rayHeadHost(replica.rayAddress, `replicas[${index}].rayAddress`);
    if (!sameAddress(rayHost, approved)) return { where: `replica ${replica.id}'s Ray head address`, address: rayHost };
  }
  return null;
}

/** The refusal an agent gets: which address was approved, which was reported, and who can change it. */
export function addressMismatch(node: Pick<FleetNode, "name" | "address">, found: ForeignAddress): ConflictError {
  const reported = printable(found.address);
  return new ConflictError(
    `Node '${node.name}' joined with address ${node.address}, but this report gives ${found.where} as ${reported}; nothing of the report was applied. ` +
      `A node's address is fixed at join and only an admin changes it: if the node really moved, run 'llmgw ctl node update ${node.name} --address ${printable(canonicalAddress(found.address))}'; ` +
      `otherwise start its agent with --advertise ${node.address}.`,
    { code: "node_address_mismatch", param: "address" },
  );
}

/** Refusals of one node's reports are announced (an event, a log line) at most this often. */
export const REFUSAL_ANNOUNCE_INTERVAL_MS = 10 * 60_000;

/**
 * Checks agents' reports against their nodes' approved addresses, and applies an admin's
 * change of one. Every refusal is answered (409); it is logged and recorded as a
 * `node_address_refused` event at most once per node per 10 minutes, whatever address it
 * names: an agent heartbeats every few seconds, and a credential holder alternating
 * addresses must not turn each one into an event and a notification. The next event says
 * how many refusals were not announced. An admin's change starts the node afresh. The
 * memory is this server's: after a restart (or a new leader) the next refusal is announced.
 */
export class NodeAddresses {
  /** By node id: when a refusal was last announced (on `clock`), and how many since were not. */
  private readonly announced = new Map<string, { at: number; suppressed: number }>();
  private readonly clock: () => number;

  /** `clock`: ms that never jump (default `performance.now`), for the announcement interval. */
  constructor(private readonly options: { nodes: NodeRegistry; events: EventLog; logger: Logger; clock?: () => number }) {
    this.clock = options.clock ?? (() => performance.now());
  }

  /** Throws the refusal when the report names an address other than the node's (or no address at all); before anything of the report is applied. */
  checkReport(node: FleetNode, report: Pick<HeartbeatReport, "address" | "replicas">): void {
    checkAddress(report.address, "address");
    const found = foreignAddress(node.address, report);
    if (found === null) return;
    const error = addressMismatch(node, found);
    const now = this.clock();
    const last = this.announced.get(node.id);
    if (last !== undefined && now - last.at < REFUSAL_ANNOUNCE_INTERVAL_MS) {
      last.suppressed += 1;
      throw error;
    }
    const suppressed = last?.suppressed ?? 0;
    this.announced.set(node.id, { at: now, suppressed: 0 });
    const data = { node: node.name, approved: node.address, reported: found.address, where: found.where, suppressed };
    this.options.logger.warn(data, "refused a node's report on another address");
    const quiet =
      suppressed === 0
        ? ""
        : ` (${suppressed} more refusals of node '${node.name}' since the last such event were not announced: at most one is, per node per 10 minutes.)`;
    void this.options.events.record({ kind: "node_address_refused", subject: `node:${node.name}`, data, message: error.message + quiet });
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
