// Fetches the image behind an http(s) URL of a chat request, so the gateway can send the
// engine its bytes as a data URL (image-parts.ts decides when). Engines here have no
// network, and a llama-server built without curl cannot fetch at all, so the gateway is
// the one place that fetches, and it fetches as carefully as the notifier sends:
// - one deadline (--image-fetch-timeout) covers resolving, connecting, every redirect, the
//   headers and the whole body, so an image host that trickles cannot hold a request past it;
// - the body is read up to --max-image-bytes and no further (a Content-Length above it is
//   refused before reading), and every byte is charged as it arrives to the request's
//   share of --max-body and to the process's budget of image bytes in flight (image-parts.ts);
// - at most MAX_REDIRECTS redirects, each target checked like the URL the client gave;
// - only ports 80 and 443, and no private, loopback or link-local address (unless
//   --allow-private-image-urls), checked on the address actually connected to, after
//   resolving, so a name that resolves to a public address for one connection and to
//   169.254.169.254 for the next (DNS rebinding) still cannot reach it. The ranges are the
//   notifier's (notify/webhook-address.ts's privateRangeOf);
// - host names are resolved by c-ares (dns.Resolver), not getaddrinfo: getaddrinfo runs on
//   libuv's pool of four threads, which the file system and crypto share, and a lookup
//   there cannot be cancelled, so a client naming hosts whose DNS never answers could stall
//   the whole server. c-ares queries are sockets on the event loop, cancelled at the deadline.
//
// Every failure is a 400 naming the request field: the URL is the client's choice, so a
// host that is slow, refuses or answers with an error is the request's fault as the
// gateway sees it. Not 408 (that says the client was slow to send its own request, and
// closes the connection), not 504 (a 5xx tells SDKs to retry a request that will fail the
// same way): OpenAI answers an image URL it cannot download with a 400 as well. A host that
// cannot be found, refuses the connection or does not answer gets one message for all
// three, so that image URLs cannot map which addresses and ports answer.
import dns from "node:dns";
import { isIP } from "node:net";
import type { Readable } from "node:stream";
import { Agent, buildConnector, request } from "undici";
import { BadRequestError, ClientClosedError, LlmgwError } from "../core/errors.ts";
import { formatBytes, printable } from "../core/format.ts";
import { privateRangeOf } from "../notify/webhook-address.ts";

/** How many redirects one image URL may take; browsers allow 20, but an image host needs one or two. */
export const MAX_REDIRECTS = 3;

/** What an operator does to let image URLs reach private addresses (and other ports) on purpose. */
export const ALLOW_PRIVATE_IMAGE_URLS_HINT = "run the server with --allow-private-image-urls";

/** The first bytes of an image, enough for every format signature image-parts.ts checks. */
export const HEAD_BYTES = 24;

/** Resolves a host name to its addresses; `signal` ends the lookup (the deadline, or the client leaving). */
export type ResolveImageHost = (hostname: string, signal: AbortSignal) => Promise<Array<{ address: string; family: number }>>;

/**
 * Where image URLs may lead when private addresses are not allowed: the non-public range an
 * address is in (null for a public one), and the ports allowed. Tests put a stand-in here
 * so that a loopback server can play a public host.
 */
export interface PublicNetwork {
  rangeOf(address: string): string | null;
  portAllowed(port: number): boolean;
}

/** The web's ports: an image URL naming another could probe services that are not image hosts (SMTP, Redis, an admin API). */
export const INTERNET: PublicNetwork = { rangeOf: privateRangeOf, portAllowed: (port) => port === 80 || port === 443 };

/**
 * Image bytes being fetched at once, by every request of the process together. Each
 * request's own share is bounded by --max-body already; this bounds how many such
 * requests hold fetched images in memory at the same moment. A request that holds all
 * of the budget's bytes may go over it, so that a single request larger than the budget
 * is not refused forever.
 */
export class ImageFetchBudget {
  private used = 0;

  constructor(readonly limitBytes: number) {}

  /** Bytes taken and not yet given back. */
  get inUse(): number {
    return this.used;
  }

  /** Takes `bytes` for a holder that holds `held` already; false when that would pass the limit while others hold bytes too. */
  take(bytes: number, held: number): boolean {
    if (this.used + bytes > this.limitBytes && this.used > held) return false;
    this.used += bytes;
    return true;
  }

  give(bytes: number): void {
    this.used = Math.max(0, this.used - bytes);
  }
}

/**
 * The process's budget: 128 MiB of images being fetched. A request holds its images about
 * four times over while they become its body (base64, the body's JSON, its bytes), so this
 * keeps image fetching to about half a GiB of the server's memory at worst.
 */
export const PROCESS_IMAGE_FETCH_BUDGET = new ImageFetchBudget(128 * 1024 * 1024);

export interface ImageFetchOptions {
  /** The URL as the client gave it (checked by `checkRemoteImageUrl` already). */
  url: URL;
  /** Where the URL is in the request, for `param` and messages: messages[0].content[1].image_url.url. */
  param: string;
  maxBytes: number;
  /** The time all images of the request have, for the message when it runs out. */
  timeoutMs: number;
  /** Aborted when the deadline passes. */
  deadline: AbortSignal;
  /** Aborted when the client leaves (or another image of the request failed). */
  cancel: AbortSignal;
  /** Shared by the images of one request; see `imageAgent`. */
  dispatcher: Agent;
  allowPrivate: boolean;
  network: PublicNetwork;
  /** Takes `bytes` more of the request's and the process's image budgets as they arrive; throws when either is spent. */
  charge(bytes: number): void;
  /** Called once with the image's first HEAD_BYTES bytes (all of a shorter one); throws when they are not an image. */
  checkHead(head: Buffer): void;
}

/** A fetched image: its first bytes and the whole of it in base64, as the data URL needs it. */
export interface FetchedImage {
  head: Buffer;
  base64: string;
}

/**
 * The address check of a URL before anything is sent: only http and https, and unless
 * private addresses are allowed, only the web's ports and no literal address in a
 * non-public range. Names are checked when connecting (`imageAgent`).
 */
export function checkRemoteImageUrl(url: URL, param: string, allowPrivate: boolean, network: PublicNetwork = INTERNET): void {
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new BadRequestError(
      `${param}: llmgw fetches images over http and https only, not ${printable(url.protocol)}; send the image as a data URL instead.`,
      { code: "invalid_image_url", param },
    );
  }
  if (allowPrivate) return;
  const host = url.hostname.replace(/^\[|\]$/g, "");
  const where = isIP(host) === 0 ? null : network.rangeOf(host);
  if (where !== null) throw privateAddressError(param, host, where, "");
  const port = url.port === "" ? (url.protocol === "https:" ? 443 : 80) : Number(url.port);
  if (!network.portAllowed(port)) {
    throw new BadRequestError(
      `${param}: the image URL names port ${port}; llmgw fetches images from ports 80 and 443 only, so that image URLs cannot reach other services. Give a URL on port 80 or 443, send the image as a data URL, or ${ALLOW_PRIVATE_IMAGE_URLS_HINT} (which allows any port) if such images are meant to be fetched.`,
      { code: "image_url_port_refused", param },
    );
  }
}

function privateAddressError(param: string, address: string, range: string, via: string): BadRequestError {
  return new BadRequestError(
    `${param}: the image's address ${address}${via} is in ${range}. llmgw does not fetch images from private, loopback or link-local networks, where a URL could reach services that trust the server; give a public URL or send the image as a data URL, or ${ALLOW_PRIVATE_IMAGE_URLS_HINT} if such images are meant to be fetched.`,
    { code: "image_url_private_address", param },
  );
}

/** The connection-time refusal, carried through undici to `fetchImage`, which names the field. */
class PrivateAddressRefused extends Error {
  constructor(
    readonly address: string,
    readonly range: string,
    readonly hostname: string | null,
  ) {
    super(`refused to connect to ${address}: it is in ${range}`);
  }
}

const LOOPBACK = [
  { address: "127.0.0.1", family: 4 },
  { address: "::1", family: 6 },
];

/**
 * The resolver image fetches use by default: c-ares, with `servers` in place of the
 * system's (/etc/resolv.conf) where given. Each lookup gets its own channel, so cancelling
 * it at the deadline cancels only its own queries. c-ares asks DNS only, not /etc/hosts:
 * `localhost` and names under it are loopback by RFC 6761, every other name must be in DNS.
 */
export function dnsResolver(options: { servers?: readonly string[]; timeoutMs?: number } = {}): ResolveImageHost {
  return async (hostname, signal) => {
    const name = hostname.toLowerCase().replace(/\.$/, "");
    if (name === "localhost" || name.endsWith(".localhost")) return LOOPBACK;
    signal.throwIfAborted();
    // Per try; c-ares waits longer on each retry. The request's deadline ends it sooner.
    const resolver = new dns.promises.Resolver({ timeout: options.timeoutMs ?? 2_000, tries: 2 });
    if (options.servers !== undefined) resolver.setServers(options.servers);
    const cancel = () => resolver.cancel();
    signal.addEventListener("abort", cancel, { once: true });
    try {
      const [v4, v6] = await Promise.allSettled([resolver.resolve4(hostname), resolver.resolve6(hostname)]);
      const addresses = [
        ...(v4.status === "fulfilled" ? v4.value.map((address) => ({ address, family: 4 })) : []),
        ...(v6.status === "fulfilled" ? v6.value.map((address) => ({ address, family: 6 })) : []),
      ];
      if (addresses.length === 0) throw v4.status === "rejected" ? v4.reason : Object.assign(new Error(`'${hostname}' has no address`), { code: "ENOTFOUND" });
      return addresses;
    } finally {
      signal.removeEventListener("abort", cancel);
    }
  };
}

type LookupCallback = (error: NodeJS.ErrnoException | null, address: string | Array<{ address: string; family: number }>, family?: number) => void;

/**
 * The dispatcher image fetches go through: one per request that fetches, destroyed when
 * its fetches end (image URLs name any host: a pool kept per host would only collect idle
 * sockets). Unless private addresses are allowed, a literal address is checked before
 * connecting (net.connect does not look those up) and a name is resolved here and refused
 * when any of its addresses is non-public; the connection goes to the addresses checked,
 * in both shapes Node asks a lookup for. `signal` ends lookups still running.
 */
export function imageAgent(options: { allowPrivate: boolean; resolve: ResolveImageHost; network: PublicNetwork; signal: AbortSignal }): Agent {
  const { network } = options;
  const lookup = (hostname: string, lookupOptions: { family?: number | string; all?: boolean }, callback: LookupCallback): void => {
    options.resolve(hostname, options.signal).then(
      (addresses) => {
        if (!options.allowPrivate) {
          for (const { address } of addresses) {
            const where = network.rangeOf(address);
            if (where !== null) {
              callback(new PrivateAddressRefused(address, where, hostname), "");
              return;
            }
          }
        }
        const wanted = lookupOptions.family;
        const family = wanted === 4 || wanted === "IPv4" ? 4 : wanted === 6 || wanted === "IPv6" ? 6 : 0;
        const usable = family === 0 ? addresses : addresses.filter((candidate) => candidate.family === family);
        const first = usable[0];
        if (first === undefined) callback(Object.assign(new Error(`'${hostname}' has no address`), { code: "ENOTFOUND" }), "");
        else if (lookupOptions.all === true) callback(null, usable);
        else callback(null, first.address, first.family);
      },
      (error: NodeJS.ErrnoException) => callback(error, ""),
    );
  };
  const connectSocket = buildConnector({ lookup } as buildConnector.BuildOptions);
  return new Agent({
    connect: (connectOptions, callback) => {
      const host = connectOptions.hostname.replace(/^\[|\]$/g, "");
      const where = options.allowPrivate || isIP(host) === 0 ? null : network.rangeOf(host);
      if (where !== null) {
        callback(new PrivateAddressRefused(host, where, null), null);
        return;
      }
      connectSocket(connectOptions, callback);
    },
  });
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);

/** The image, at most `maxBytes` of it; every failure is a 400 naming `param` (ClientClosedError when the client left, 503 when the budget is spent). */
export async function fetchImage(options: ImageFetchOptions): Promise<FetchedImage> {
  const { param } = options;
  const signal = AbortSignal.any([options.deadline, options.cancel]);
  let url = options.url;
  // Whether a host has answered: until then, every failure reads the same to the client.
  let answered = false;
  try {
    for (let redirects = 0; ; redirects += 1) {
      answered = false;
      const response = await request(url.href, {
        method: "GET",
        dispatcher: options.dispatcher,
        signal,
        headers: { accept: "image/png, image/jpeg, image/gif, image/bmp", "user-agent": "llmgw" },
      });
      answered = true;
      const location = response.headers.location;
      if (REDIRECTS.has(response.statusCode) && typeof location === "string") {
        discard(response.body);
        if (redirects === MAX_REDIRECTS) throw fetchFailed(options, `it redirected more than ${MAX_REDIRECTS} times`);
        const next = URL.canParse(location, url.href) ? new URL(location, url) : null;
        if (next === null) throw fetchFailed(options, `it redirected to '${printable(location)}', which is not a URL`);
        // The target is checked as the client's own URL would be: a public URL must not
        // bounce the gateway to a private one (the connection check would catch a name too).
        checkRemoteImageUrl(next, param, options.allowPrivate, options.network);
        url = next;
        continue;
      }
      if (response.statusCode < 200 || response.statusCode > 299) {
        discard(response.body);
        throw fetchFailed(options, `${url.host} answered HTTP ${response.statusCode}`);
      }
      return await readAtMost(response.body, Number(response.headers["content-length"] ?? Number.NaN), options);
    }
  } catch (error) {
    throw whyFetchFailed(error, options, answered);
  }
}

/** Drops a body the fetch will not read; undici reports the abort as an error event, which nobody needs. */
function discard(body: Readable): void {
  body.on("error", () => undefined);
  body.destroy();
}

/**
 * Reads the body into base64 as it arrives: each chunk is encoded (whole groups of three
 * bytes, the rest carried to the next chunk) and let go, so an image is held once as
 * base64, not as chunks, their concatenation and the base64 of that.
 */
async function readAtMost(body: Readable, declared: number, options: ImageFetchOptions): Promise<FetchedImage> {
  if (declared > options.maxBytes) {
    discard(body);
    throw tooLarge(options, `${formatBytes(declared)} by its Content-Length`);
  }
  try {
    // A declared length is charged before reading: a request over its budget stops before the image arrives.
    let charged = Number.isFinite(declared) && declared > 0 ? declared : 0;
    if (charged > 0) options.charge(charged);
    const parts: string[] = [];
    let head = Buffer.alloc(0);
    let headChecked = false;
    let carry = Buffer.alloc(0);
    let total = 0;
    for await (const chunk of body as AsyncIterable<Buffer>) {
      total += chunk.length;
      if (total > options.maxBytes) throw tooLarge(options, `more than ${formatBytes(options.maxBytes)}`);
      if (total > charged) {
        options.charge(total - charged);
        charged = total;
      }
      if (!headChecked) {
        head = Buffer.concat([head, chunk.subarray(0, HEAD_BYTES - head.length)]);
        if (head.length === HEAD_BYTES) {
          options.checkHead(head);
          headChecked = true;
        }
      }
      const data = carry.length === 0 ? chunk : Buffer.concat([carry, chunk]);
      const whole = data.length - (data.length % 3);
      parts.push(data.toString("base64", 0, whole));
      carry = Buffer.from(data.subarray(whole));
    }
    if (!headChecked) options.checkHead(head);
    parts.push(carry.toString("base64"));
    return { head, base64: parts.join("") };
  } catch (error) {
    discard(body);
    throw error;
  }
}

function tooLarge(options: ImageFetchOptions, what: string): BadRequestError {
  return new BadRequestError(
    `${options.param}: the image at ${printable(options.url.href)} is ${what}, over the limit of ${formatBytes(options.maxBytes)} an image may have (--max-image-bytes). Send a smaller image.`,
    { code: "image_too_large", param: options.param },
  );
}

function fetchFailed(options: ImageFetchOptions, why: string): BadRequestError {
  return new BadRequestError(
    `${options.param}: llmgw could not fetch the image at ${printable(options.url.href)}: ${why}. Check the URL, or send the image as a data URL (data:image/png;base64,...).`,
    { code: "image_fetch_failed", param: options.param },
  );
}

/** One error for whatever ended a fetch: ours as they are, the client leaving, a refused address, the deadline, a network fault. */
function whyFetchFailed(error: unknown, options: ImageFetchOptions, answered: boolean): Error {
  // Ours: a 400 naming the field, a budget's refusal, the check of an image's first bytes.
  if (error instanceof LlmgwError) return error;
  if (options.cancel.aborted) return new ClientClosedError();
  const refused = refusedAddressIn(error);
  if (refused !== null) {
    const via = refused.hostname === null ? "" : ` (what '${refused.hostname}' resolves to)`;
    return privateAddressError(options.param, refused.address, refused.range, via);
  }
  const seconds = options.timeoutMs / 1000;
  if (answered) {
    return fetchFailed(
      options,
      options.deadline.aborted ? `it did not arrive within ${seconds} s (--image-fetch-timeout)` : "the connection broke before the whole image arrived",
    );
  }
  // Not found, refused, reset or silent: the same words, so that the answers do not tell
  // which addresses and ports exist behind the server.
  return fetchFailed(options, `its host could not be reached, or did not answer within ${seconds} s (--image-fetch-timeout)`);
}

function refusedAddressIn(error: unknown): PrivateAddressRefused | null {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && current instanceof Error; depth += 1) {
    if (current instanceof PrivateAddressRefused) return current;
    current = current.cause;
  }
  return null;
}
