// Following HTTP redirects by hand, for the Hub client and the mirror. The Hub answers a
// download of an LFS file with a redirect to its CDN and a signed URL; the registry token
// must not travel there, and undici, when asked to follow redirects, keeps every header.
// So redirects are followed here, one hop at a time, with the header rule applied at each
// hop, and the final answer is handed back with its body unread (the mirror streams it).
import type { Dispatcher } from "undici";

/** The statuses that carry a `Location` to follow. */
export const REDIRECT_STATUSES: ReadonlySet<number> = new Set([301, 302, 303, 307, 308]);

/** True when both URLs have the same scheme, host and port. */
export function isSameOrigin(a: string, b: string): boolean {
  try {
    return new URL(a).origin === new URL(b).origin;
  } catch {
    return false;
  }
}

/**
 * The headers to send when following a redirect from `from` to `to`. Like huggingface_hub,
 * the Authorization header is dropped when the redirect leaves the origin: the Hub sends
 * LFS downloads to a CDN with a signed URL, and the token must not travel there. Once
 * dropped it stays dropped, even if a later hop comes back to the registry.
 */
export function headersForRedirect(headers: Record<string, string>, from: string, to: string): Record<string, string> {
  if (isSameOrigin(from, to)) return { ...headers };
  const kept: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (name.toLowerCase() !== "authorization") kept[name] = value;
  }
  return kept;
}

export interface FollowRedirectsOptions {
  url: string;
  /** Headers of the first request. */
  headers: Record<string, string>;
  /** Sends one request. It turns its own transport failures into the caller's errors (it knows the URL). */
  send: (url: string, headers: Record<string, string>) => Promise<Dispatcher.ResponseData>;
  /** Redirects followed at most; the one after that is handed back unfollowed. */
  maxRedirects: number;
  /**
   * Whether to follow a redirect from `from` to `to` (`location` as sent). A redirect not
   * followed is handed back as the answer. Default: any http or https target.
   */
  follow?: (from: string, to: URL, location: string) => boolean;
  /** The headers for the next hop. Default `headersForRedirect`. */
  headersForRedirect?: (headers: Record<string, string>, from: string, to: string) => Record<string, string>;
}

export interface FollowedResponse {
  /** The URL that gave `response`. */
  url: string;
  /** The last answer, body unread. */
  response: Dispatcher.ResponseData;
  /**
   * Where `response` points when it is a redirect that was not followed (too many hops, or
   * a target `follow` refused); null when it is not a redirect.
   */
  redirect: URL | null;
  /** Redirects followed. */
  hops: number;
}

/** Sends `url` and follows its redirects, hop by hop, each redirect's body discarded. */
export async function followRedirects(options: FollowRedirectsOptions): Promise<FollowedResponse> {
  const follow = options.follow ?? ((_from: string, to: URL) => to.protocol === "http:" || to.protocol === "https:");
  const nextHeaders = options.headersForRedirect ?? headersForRedirect;
  let current = options.url;
  let headers = options.headers;
  for (let hops = 0; ; hops += 1) {
    const response = await options.send(current, headers);
    const location = firstHeader(response.headers.location);
    if (!REDIRECT_STATUSES.has(response.statusCode) || location === undefined) return { url: current, response, redirect: null, hops };
    let target: URL;
    try {
      target = new URL(location, current);
    } catch {
      // A Location that is not a URL cannot be followed: the caller sees the redirect status.
      return { url: current, response, redirect: null, hops };
    }
    if (hops >= options.maxRedirects || !follow(current, target, location)) return { url: current, response, redirect: target, hops };
    await response.body.dump().catch(() => undefined);
    headers = nextHeaders(headers, current, target.href);
    current = target.href;
  }
}

function firstHeader(value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value;
}
