// Fetches the image behind an http(s) URL of a chat request, so the gateway can send the
// engine its bytes as a data URL (image-parts.ts decides when). Engines here have no
// network, and a llama-server built without curl cannot fetch at all, so the gateway is
// the one place that fetches, and it fetches as carefully as the notifier sends:
// - one deadline (--image-fetch-timeout) covers connecting, every redirect, the headers
//   and the whole body, so an image host that trickles cannot hold a request past it;
// - the body is read up to --max-image-bytes and no further (a Content-Length above it is
//   refused before reading);
// - at most MAX_REDIRECTS redirects, each target checked like the URL the client gave;
// - private, loopback and link-local addresses are refused (unless
//   --allow-private-image-urls) on the address actually connected to, after resolving,
//   so a name that resolves to a public address at the door and to 169.254.169.254 when
//   connecting (DNS rebinding) still cannot reach it. The ranges are the notifier's
//   (notify/webhook-address.ts's privateRangeOf).
//
// Every failure is a 400 naming the request field: the URL is the client's choice, so a
// host that is slow, refuses or answers with an error is the request's fault as the
// gateway sees it. Not 408 (that says the client was slow to send its own request, and
// closes the connection), not 504 (a 5xx tells SDKs to retry a request that will fail the
// same way): OpenAI answers an image URL it cannot download with a 400 as well.
import dns from "node:dns";
import { isIP } from "node:net";
import type { Readable } from "node:stream";
import { Agent, buildConnector, request } from "undici";
import { BadRequestError, ClientClosedError, describeError, errorCode } from "../core/errors.ts";
import { formatBytes, printable } from "../core/format.ts";
import { privateRangeOf, type ResolveHost } from "../notify/webhook-address.ts";

/** How many redirects one image URL may take; browsers allow 20, but an image host needs one or two. */
export const MAX_REDIRECTS = 3;

/** What an operator does to let image URLs reach private addresses on purpose. */
export const ALLOW_PRIVATE_IMAGE_URLS_HINT = "run the server with --allow-private-image-urls";

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
}

/**
 * The address check of a URL's host before anything is sent: only http and https, and no
 * literal address in a non-public range. Names are checked when connecting (`imageAgent`).
 */
export function checkRemoteImageUrl(url: URL, param: string, allowPrivate: boolean): void {
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new BadRequestError(
      `${param}: llmgw fetches images over http and https only, not ${printable(url.protocol)}; send the image as a data URL instead.`,
      {
        code: "invalid_image_url",
        param,
      },
    );
  }
  if (allowPrivate) return;
  const host = url.hostname.replace(/^\[|\]$/g, "");
  const where = isIP(host) === 0 ? null : privateRangeOf(host);
  if (where !== null) throw privateAddressError(param, host, where, "");
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

const systemResolve: ResolveHost = (hostname) => dns.promises.lookup(hostname, { all: true, verbatim: true });

type LookupCallback = (error: NodeJS.ErrnoException | null, address: string | Array<{ address: string; family: number }>, family?: number) => void;

/**
 * The dispatcher image fetches go through: one per request that fetches, destroyed when
 * its fetches end (image URLs name any host: a pool kept per host would only collect idle
 * sockets). Unless private addresses are allowed, a literal address is checked before
 * connecting (net.connect does not look those up) and a name is resolved here and refused
 * when any of its addresses is non-public, in both shapes Node asks a lookup for.
 */
export function imageAgent(options: { allowPrivate: boolean; resolve?: ResolveHost }): Agent {
  const resolve = options.resolve ?? systemResolve;
  const lookup = (hostname: string, lookupOptions: { family?: number | string; all?: boolean }, callback: LookupCallback): void => {
    resolve(hostname).then(
      (addresses) => {
        if (!options.allowPrivate) {
          for (const { address } of addresses) {
            const where = privateRangeOf(address);
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
      const where = options.allowPrivate || isIP(host) === 0 ? null : privateRangeOf(host);
      if (where !== null) {
        callback(new PrivateAddressRefused(host, where, null), null);
        return;
      }
      connectSocket(connectOptions, callback);
    },
  });
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);

/** The image's bytes, at most `maxBytes` of them; every failure is a 400 naming `param` (ClientClosedError when the client left). */
export async function fetchImage(options: ImageFetchOptions): Promise<Buffer> {
  const { param } = options;
  const signal = AbortSignal.any([options.deadline, options.cancel]);
  let url = options.url;
  try {
    for (let redirects = 0; ; redirects += 1) {
      const response = await request(url.href, {
        method: "GET",
        dispatcher: options.dispatcher,
        signal,
        headers: { accept: "image/png, image/jpeg, image/gif, image/bmp", "user-agent": "llmgw" },
      });
      const location = response.headers.location;
      if (REDIRECTS.has(response.statusCode) && typeof location === "string") {
        discard(response.body);
        if (redirects === MAX_REDIRECTS) throw fetchFailed(options, `it redirected more than ${MAX_REDIRECTS} times`);
        const next = URL.canParse(location, url.href) ? new URL(location, url) : null;
        if (next === null) throw fetchFailed(options, `it redirected to '${printable(location)}', which is not a URL`);
        // The target is checked as the client's own URL would be: a public URL must not
        // bounce the gateway to a private one (the connection check would catch a name too).
        checkRemoteImageUrl(next, param, options.allowPrivate);
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
    throw whyFetchFailed(error, options);
  }
}

/** Drops a body the fetch will not read; undici reports the abort as an error event, which nobody needs. */
function discard(body: Readable): void {
  body.on("error", () => undefined);
  body.destroy();
}

async function readAtMost(body: Readable, declared: number, options: ImageFetchOptions): Promise<Buffer> {
  if (declared > options.maxBytes) {
    discard(body);
    throw tooLarge(options, `${formatBytes(declared)} by its Content-Length`);
  }
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of body) {
    total += chunk.length;
    if (total > options.maxBytes) {
      discard(body);
      throw tooLarge(options, `more than ${formatBytes(options.maxBytes)}`);
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks, total);
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

/** One error for whatever ended a fetch: ours as they are, the deadline, the client leaving, a refused address, a network fault. */
function whyFetchFailed(error: unknown, options: ImageFetchOptions): Error {
  if (error instanceof BadRequestError) return error;
  if (options.cancel.aborted) return new ClientClosedError();
  if (options.deadline.aborted) return fetchFailed(options, `it did not arrive within ${options.timeoutMs / 1000} s (--image-fetch-timeout)`);
  const refused = refusedAddressIn(error);
  if (refused !== null) {
    const via = refused.hostname === null ? "" : ` (what '${refused.hostname}' resolves to)`;
    return privateAddressError(options.param, refused.address, refused.range, via);
  }
  const code = errorCode(error);
  return fetchFailed(options, code === undefined ? describeError(error) : `${describeError(error)} (${code})`);
}

function refusedAddressIn(error: unknown): PrivateAddressRefused | null {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && current instanceof Error; depth += 1) {
    if (current instanceof PrivateAddressRefused) return current;
    current = current.cause;
  }
  return null;
}
