// Which network addresses notifications may go to. An admin gives a channel's URL, but the
// server sends from inside the network it runs in: a URL naming 169.254.169.254 (cloud
// metadata), 10.0.0.5 or localhost would make llmgw a way into places its admins' keys
// were never meant to reach (server-side request forgery). So, unless the server runs with
// --allow-private-webhooks, receivers in private, loopback, link-local and other
// non-public ranges are refused twice:
// - at the door, when a channel is added: a literal address, or any address its host name
//   resolves to then (a 400 naming the address, its range and the flag);
// - at every connection, on the address actually connected to: a name may resolve to a
//   public address when the channel is added and to a private one later (DNS rebinding),
//   so the dispatcher notifications are sent through checks what it is about to connect to.
import dns from "node:dns";
import { isIP } from "node:net";
import { Agent, buildConnector } from "undici";
import { BadRequestError } from "../core/errors.ts";

/** What an operator does to send notifications to private addresses on purpose. */
export const ALLOW_PRIVATE_WEBHOOKS_HINT = "run the server with --allow-private-webhooks (or LLMGW_ALLOW_PRIVATE_WEBHOOKS=1)";

/** Resolves a host name to every address it has (tests give their own, to play a DNS that changes its answer). */
export type ResolveHost = (hostname: string) => Promise<Array<{ address: string; family: number }>>;

export interface WebhookAddressPolicy {
  /** --allow-private-webhooks: receivers on private and loopback addresses are allowed. */
  allowPrivate: boolean;
  /** Default: the system resolver (getaddrinfo, as connections use). */
  resolve?: ResolveHost;
}

const systemResolve: ResolveHost = (hostname) => dns.promises.lookup(hostname, { all: true, verbatim: true });

/** A resolver that does not answer within this is not waited for at the door: the connection check still applies. */
const DOOR_LOOKUP_TIMEOUT_MS = 5_000;

interface Range {
  bytes: Uint8Array;
  prefixBits: number;
  cidr: string;
  what: string;
  /** For IPv6 ranges that carry an IPv4 address: where it sits; the IPv4 address's own range decides. */
  embeddedIPv4At?: number;
}

function range(cidr: string, what: string, embeddedIPv4At?: number): Range {
  const [address, bits] = cidr.split("/") as [string, string];
  const bytes = addressBytes(address);
  if (bytes === null) throw new Error(`not an address range: ${cidr}`);
  return { bytes, prefixBits: Number(bits), cidr, what, ...(embeddedIPv4At === undefined ? {} : { embeddedIPv4At }) };
}

// IANA's special-purpose registries (RFC 6890 and updates): every range that is not a
// public unicast destination. First match wins, so the narrow IPv6 ranges come first.
const IPV4_RANGES: readonly Range[] = [
  range("0.0.0.0/8", "'this network' (0.0.0.0 reaches this machine)"),
  range("10.0.0.0/8", "a private network"),
  range("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
  range("127.0.0.0/8", "loopback (this machine)"),
  range("169.254.0.0/16", "link-local (cloud metadata services answer at 169.254.169.254)"),
  range("172.16.0.0/12", "a private network"),
  range("192.0.0.0/24", "IETF protocol assignments"),
  range("192.168.0.0/16", "a private network"),
  range("198.18.0.0/15", "benchmarking networks"),
  range("224.0.0.0/4", "multicast"),
  range("240.0.0.0/4", "reserved (with the broadcast address 255.255.255.255)"),
];

const IPV6_RANGES: readonly Range[] = [
  range("::/128", "the unspecified address (reaches this machine)"),
  range("::1/128", "loopback (this machine)"),
  range("::ffff:0:0/96", "IPv4-mapped IPv6", 12),
  range("64:ff9b::/96", "NAT64", 12),
  range("2002::/16", "6to4", 2),
  range("::/96", "IPv4-compatible IPv6 (deprecated)"),
  range("64:ff9b:1::/48", "local-use NAT64"),
  range("100::/64", "discard-only"),
  range("fc00::/7", "unique local addresses (a private network)"),
  range("fe80::/10", "link-local"),
  range("fec0::/10", "site-local (deprecated)"),
  range("ff00::/8", "multicast"),
];

/** An IPv4 address as 4 bytes or an IPv6 one as 16 (brackets allowed); null when it is neither. */
export function addressBytes(text: string): Uint8Array | null {
  const address = text.startsWith("[") && text.endsWith("]") ? text.slice(1, -1) : text;
  const version = isIP(address);
  if (version === 4) return Uint8Array.from(address.split(".").map(Number));
  if (version !== 6) return null;
  let groups = address.replace(/%.*$/, "").toLowerCase();
  // A trailing dotted quad (::ffff:10.0.0.1) is the last two groups.
  const quad = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(groups);
  if (quad !== null) {
    const [a, b, c, d] = quad.slice(1).map(Number) as [number, number, number, number];
    groups = `${groups.slice(0, quad.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, tail] = groups.split("::") as [string, string | undefined];
  const headGroups = head === "" ? [] : head.split(":");
  const tailGroups = tail === undefined || tail === "" ? [] : tail.split(":");
  const all = tail === undefined ? headGroups : [...headGroups, ...Array<string>(8 - headGroups.length - tailGroups.length).fill("0"), ...tailGroups];
  const bytes = new Uint8Array(16);
  all.forEach((group, index) => {
    const value = Number.parseInt(group, 16);
    bytes[index * 2] = value >> 8;
    bytes[index * 2 + 1] = value & 0xff;
  });
  return bytes;
}

function inRange(bytes: Uint8Array, candidate: Range): boolean {
  if (bytes.length !== candidate.bytes.length) return false;
  for (let bit = 0; bit < candidate.prefixBits; bit += 8) {
    const take = Math.min(8, candidate.prefixBits - bit);
    const mask = (0xff << (8 - take)) & 0xff;
    if (((bytes[bit / 8] ?? 0) & mask) !== ((candidate.bytes[bit / 8] ?? 0) & mask)) return false;
  }
  return true;
}

/** The non-public range an address is in ("10.0.0.0/8, a private network"), or null for a public address. */
export function privateRangeOf(address: string): string | null {
  const bytes = addressBytes(address);
  if (bytes === null) return null;
  const found = (bytes.length === 4 ? IPV4_RANGES : IPV6_RANGES).find((candidate) => inRange(bytes, candidate));
  if (found === undefined) return null;
  if (found.embeddedIPv4At === undefined) return `${found.cidr}, ${found.what}`;
  // ::ffff:10.0.0.1 connects to 10.0.0.1; ::ffff:8.8.8.8 to a public address.
  const embedded = bytes.slice(found.embeddedIPv4At, found.embeddedIPv4At + 4).join(".");
  const inner = privateRangeOf(embedded);
  return inner === null ? null : `${found.cidr} (${found.what}) of ${embedded}, in ${inner}`;
}

function refusal(message: string, param: string | undefined): BadRequestError {
  return new BadRequestError(message, { code: "webhook_private_address", ...(param === undefined ? {} : { param }) });
}

/**
 * The check when a channel is added: a literal address in a non-public range, or a host
 * name resolving to one, is refused naming the address, its range and the flag.
 */
export async function checkReceiverAddress(url: URL, param: string, policy: WebhookAddressPolicy): Promise<void> {
  if (policy.allowPrivate) return;
  const host = url.hostname.replace(/^\[|\]$/g, "");
  const why = (address: string, range: string, via: string) =>
    `${param}: the receiver's address ${address}${via} is in ${range}. llmgw does not send notifications into private, loopback or link-local networks, where a URL could reach services that trust the server; give a public address, or ${ALLOW_PRIVATE_WEBHOOKS_HINT} if this receiver is meant to be on such a network.`;
  if (isIP(host) !== 0) {
    const where = privateRangeOf(host);
    if (where !== null) throw refusal(why(host, where, ""), param);
    return;
  }
  const addresses = await resolveAtTheDoor(host, policy.resolve ?? systemResolve);
  for (const { address } of addresses) {
    const where = privateRangeOf(address);
    if (where !== null) throw refusal(why(address, where, ` (what '${host}' resolves to)`), param);
  }
}

/**
 * Every address of a host name, or none when it does not resolve now. A name that does not
 * resolve (yet, or from this server) is accepted: a receiver may be added before its DNS
 * record exists, and each connection is checked anyway.
 */
async function resolveAtTheDoor(host: string, resolve: ResolveHost): Promise<Array<{ address: string }>> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<[]>((settle) => {
    timer = setTimeout(() => settle([]), DOOR_LOOKUP_TIMEOUT_MS);
  });
  try {
    return await Promise.race([resolve(host).catch(() => []), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

type LookupCallback = (error: NodeJS.ErrnoException | null, address: string | Array<{ address: string; family: number }>, family?: number) => void;

/**
 * A `lookup` for net.connect and tls.connect that resolves with `resolve` and, when
 * `guard`, fails the connection if any address of the name is in a non-public range. It
 * answers in both shapes Node asks for: one address, or all of them (autoSelectFamily).
 */
function connectLookup(resolve: ResolveHost, guard: boolean) {
  return (hostname: string, options: { family?: number | string; all?: boolean }, callback: LookupCallback): void => {
    resolve(hostname).then(
      (addresses) => {
        if (guard) {
          for (const { address } of addresses) {
            const where = privateRangeOf(address);
            if (where !== null) {
              callback(
                refusal(
                  `llmgw refused to connect to ${address} (what '${hostname}' resolves to now): it is in ${where}; ${ALLOW_PRIVATE_WEBHOOKS_HINT} to allow it`,
                  undefined,
                ),
                "",
              );
              return;
            }
          }
        }
        const family = options.family === 4 || options.family === "IPv4" ? 4 : options.family === 6 || options.family === "IPv6" ? 6 : 0;
        const usable = family === 0 ? addresses : addresses.filter((candidate) => candidate.family === family);
        const first = usable[0];
        if (first === undefined) {
          callback(Object.assign(new Error(`'${hostname}' has no address`), { code: "ENOTFOUND" }), "");
          return;
        }
        if (options.all === true) callback(null, usable);
        else callback(null, first.address, first.family);
      },
      (error: NodeJS.ErrnoException) => callback(error, ""),
    );
  };
}

/**
 * The dispatcher notifications are sent through. Unless private receivers are allowed, it
 * refuses a literal non-public address before connecting (net.connect does not look those
 * up) and resolves names through the guarded lookup, so no delivery ever connects to one.
 */
export function webhookAgent(policy: WebhookAddressPolicy): Agent {
  const lookup = !policy.allowPrivate || policy.resolve !== undefined ? connectLookup(policy.resolve ?? systemResolve, !policy.allowPrivate) : undefined;
  const connectSocket = buildConnector(lookup === undefined ? {} : ({ lookup } as buildConnector.BuildOptions));
  return new Agent({
    connect: (options, callback) => {
      if (!policy.allowPrivate) {
        const host = options.hostname.replace(/^\[|\]$/g, "");
        const where = isIP(host) === 0 ? null : privateRangeOf(host);
        if (where !== null) {
          callback(refusal(`llmgw refused to connect to ${host}: it is in ${where}; ${ALLOW_PRIVATE_WEBHOOKS_HINT} to allow it`, undefined), null);
          return;
        }
      }
      connectSocket(options, callback);
    },
  });
}
