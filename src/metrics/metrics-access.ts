// Who may read GET /metrics. A scraper on the server's own machine needs no key: metrics
// say how busy models are and what keys spent, nothing that grants access, and a local
// Prometheus or node exporter setup should work without a secret. From anywhere else the
// request needs the metrics key (a secret given to the server, compared in constant time)
// or an admin key.
//
// A reverse proxy on the same host makes every request look local. When the proxy says
// so (Forwarded, X-Forwarded-For or X-Real-IP, which nginx, HAProxy, Caddy and Traefik
// add when configured to), the request is treated as remote and needs a key. A proxy that
// adds none of these makes /metrics open to whoever reaches the proxy: the README says to
// add the header or to refuse /metrics at the proxy.
//
// A local request must also name this server in its Host header (metrics-hosts.ts): one
// naming another host may come from a web page in a browser on this machine, through DNS
// rebinding, and needs a key like a remote one (a page has no key to send).
import { createHash, timingSafeEqual } from "node:crypto";
import type { IncomingHttpHeaders } from "node:http";
import { isIP } from "node:net";
import { AuthenticationError, BadRequestError, PermissionDeniedError } from "../core/errors.ts";
import { bearerToken } from "../core/bearer.ts";
import type { KeyVerifier } from "../gateway/gateway-ports.ts";
import type { MetricsHosts } from "./metrics-hosts.ts";

/** A shorter metrics key is refused at start: it could be guessed. */
export const MIN_METRICS_KEY_LENGTH = 16;

/** Headers by which a proxy tells where a request really came from. */
const FORWARDING_HEADERS = ["forwarded", "x-forwarded-for", "x-real-ip"] as const;

export interface MetricsAccessRequest {
  /** The socket's peer address (req.socket.remoteAddress). */
  remoteAddress: string | undefined;
  headers: IncomingHttpHeaders;
}

export interface MetricsAccessOptions {
  /** The metrics key, if the server was given one. */
  metricsKey: MetricsKey | null;
  /** Checks admin keys. */
  keys: KeyVerifier;
  /** The Host names a local scraper may use without a key; null: any (no check). */
  hosts: MetricsHosts | null;
}

/** A Host header cut to this length in the refusal (it is the sender's text). */
const MAX_HOST_SHOWN = 100;

/** The metrics key, kept as a digest so comparing takes the same time whatever is sent. */
export class MetricsKey {
  private readonly digest: Buffer;

  constructor(key: string) {
    if (key.length < MIN_METRICS_KEY_LENGTH) {
      throw new BadRequestError(
        `The metrics key is ${key.length} characters long; use at least ${MIN_METRICS_KEY_LENGTH}, for example from 'openssl rand -hex 24'.`,
        {
          code: "invalid_metrics_key",
        },
      );
    }
    this.digest = sha256(key);
  }

  matches(presented: string): boolean {
    return timingSafeEqual(this.digest, sha256(presented));
  }
}

/** Whether an address is this machine's loopback (127.0.0.0/8, ::1, or 127.x mapped into IPv6). */
export function isLoopback(address: string | undefined): boolean {
  if (address === undefined) return false;
  const v4 = address.startsWith("::ffff:") ? address.slice("::ffff:".length) : address;
  if (isIP(v4) === 4) return v4.startsWith("127.");
  return address === "::1";
}

/** Whether the request came from this machine and not through a proxy that says it forwards it. */
export function isLocalScrape(request: MetricsAccessRequest): boolean {
  if (!isLoopback(request.remoteAddress)) return false;
  return FORWARDING_HEADERS.every((name) => request.headers[name] === undefined);
}

/**
 * Resolves when the request may read /metrics; rejects with 401 (no key, a wrong key),
 * 403 (a client key) or 403 metrics_host_not_allowed (a local request without a key
 * whose Host is not one of this server's names).
 */
export async function authorizeMetrics(request: MetricsAccessRequest, options: MetricsAccessOptions): Promise<void> {
  const token = bearerToken(request.headers.authorization);
  if (isLocalScrape(request)) {
    if (options.hosts === null || options.hosts.allows(request.headers.host)) return;
    // 403, not 421 Misdirected Request: this server does serve that name, to a caller
    // with a key; and HTTP/2 clients take 421 as a cue to retry on another connection.
    if (token === undefined) throw foreignHost(request.headers.host ?? "");
  }
  if (token === undefined) {
    throw new AuthenticationError(
      "GET /metrics from another machine needs a key: send the metrics key (--metrics-key or LLMGW_METRICS_KEY on the server) or an admin key as 'Authorization: Bearer <key>'.",
      { code: "missing_api_key" },
    );
  }
  if (options.metricsKey?.matches(token) === true) return;
  let role: string;
  try {
    role = (await options.keys.verify(token)).role;
  } catch (error) {
    // An unknown key here is most likely a mistyped metrics key: say both kinds that work.
    if (error instanceof AuthenticationError && error.code === "invalid_api_key") {
      throw new AuthenticationError(
        `The key sent for /metrics is neither ${options.metricsKey === null ? "a metrics key (this server has none; start it with --metrics-key or LLMGW_METRICS_KEY)" : "the metrics key"} nor an admin key. Send one of them as 'Authorization: Bearer <key>'.`,
        { code: "invalid_api_key" },
      );
    }
    throw error;
  }
  if (role !== "admin") {
    throw new PermissionDeniedError("A client key may not read /metrics. Use the metrics key or an admin key.", { code: "admin_required" });
  }
}

function foreignHost(host: string): PermissionDeniedError {
  const shown = host.length > MAX_HOST_SHOWN ? `${host.slice(0, MAX_HOST_SHOWN)}…` : host;
  return new PermissionDeniedError(
    `GET /metrics was sent for the host '${shown}', which is not a name of this server; without a key only its own names are answered, so that a web page cannot read metrics through DNS rebinding. Scrape it by its listen address, start the server with --metrics-host NAME (or LLMGW_METRICS_HOST) if '${shown}' is this server's name, or send the metrics key.`,
    { code: "metrics_host_not_allowed" },
  );
}

function sha256(text: string): Buffer {
  return createHash("sha256").update(text, "utf8").digest();
}
