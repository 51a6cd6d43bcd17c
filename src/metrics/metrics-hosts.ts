// The Host names under which GET /metrics answers a local scraper without a key. Without
// this check a web page could read the metrics through DNS rebinding: its name
// (evil.example) first resolves to the attacker's server, then to 127.0.0.1, and the
// operator's browser, still on "evil.example", sends the page's requests to this server
// from loopback, with `Host: evil.example`. Browsers always send the name they think they
// talk to, so a Host that names this server is one a rebinding page cannot send.
//
// This server's names: where it listens (the address as given and as bound), the loopback
// names (localhost, 127.0.0.1, [::1]) with the listen port when it listens on loopback or
// on every interface (then also the machine's host name, the console's default address),
// the hosts of --public-url and --advertise-url, and the names given with --metrics-host.
// Loopback names must carry the listen port; the other names may carry any port (a proxy
// in front may forward them with its own, or with none).
import os from "node:os";
import { isIP } from "node:net";
import { BadRequestError } from "../core/errors.ts";

/** Named as in ServerConfig, so that the server passes its config as it is. */
export interface MetricsHostsOptions {
  /** --listen as given (port 0 in tests: the bound port then comes from `bound`). */
  host: string;
  port: number;
  /** The address and port the listener is bound to; null before it listens. */
  bound: () => { address: string; port: number } | null;
  publicUrl?: string | undefined;
  advertiseUrl?: string | undefined;
  /** --metrics-host names, each `name` (any port) or `name:port`. */
  metricsHosts?: readonly string[] | undefined;
}

interface HostPort {
  /** Lower case; an IPv6 address in brackets, as in a Host header. */
  name: string;
  /** null: any port. */
  port: number | null;
}

/** HTTP's port when a Host header names none (this server speaks plain HTTP). */
const DEFAULT_PORT = 80;
/** Valid --metrics-host values: a DNS name or IPv4 address, or an IPv6 one in brackets, with an optional port. */
const HOST_PATTERN = /^(?:\[[0-9a-f:.]+\]|[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?)(?::\d{1,5})?$/i;

export class MetricsHosts {
  constructor(private readonly options: MetricsHostsOptions) {}

  /** Whether a Host header value names this server. A request without one (HTTP/1.0, not a browser) passes. */
  allows(host: string | undefined): boolean {
    if (host === undefined) return true;
    const presented = parseHostPort(host);
    if (presented === null) return false;
    const port = presented.port ?? DEFAULT_PORT;
    return this.names().some((allowed) => allowed.name === presented.name && (allowed.port === null || allowed.port === port));
  }

  /** Every name this server answers to, for the error message and tests. */
  names(): HostPort[] {
    const listen = this.options;
    const listening = listen.bound();
    const ports = [...new Set([listen.port, ...(listening === null ? [] : [listening.port])])].filter((port) => port !== 0);
    const names: HostPort[] = [];
    const withPorts = (name: string) => {
      // A configured port of 0 (tests) is what HTTP/1.0 requests get as their Host (server.ts fills it in).
      for (const port of listen.port === 0 ? [...ports, 0] : ports) names.push({ name: bracketed(name), port });
    };
    withPorts(listen.host);
    if (listening !== null) withPorts(listening.address);
    const everyInterface = [listen.host, listening?.address].some((address) => address === "0.0.0.0" || address === "::");
    if (everyInterface || isLoopbackName(listen.host)) for (const name of ["localhost", "127.0.0.1", "::1"]) withPorts(name);
    if (everyInterface) withPorts(os.hostname());
    for (const url of [this.options.publicUrl, this.options.advertiseUrl]) {
      if (url !== undefined) names.push({ name: new URL(url).hostname.toLowerCase(), port: null });
    }
    for (const extra of this.options.metricsHosts ?? []) {
      const parsed = parseHostPort(extra);
      if (parsed !== null) names.push(parsed);
    }
    return names;
  }
}

/**
 * --metrics-host (repeatable) and LLMGW_METRICS_HOST: names separated by commas; throws
 * naming the value that is not a host name.
 */
export function parseMetricsHosts(values: readonly string[]): string[] {
  const names = values
    .flatMap((value) => value.split(","))
    .map((name) => name.trim())
    .filter((name) => name !== "");
  for (const name of names) {
    if (!HOST_PATTERN.test(name) || parseHostPort(name) === null) {
      throw new BadRequestError(
        `Invalid --metrics-host (or LLMGW_METRICS_HOST) '${name}': give the host name a local scraper sends for this server, such as prometheus.internal or llmgw.internal:8700 (no scheme or path).`,
        { code: "invalid_metrics_host" },
      );
    }
  }
  return names.map((name) => name.toLowerCase());
}

/** `name`, `name:port`, `[v6]` or `[v6]:port`, lower case; null when it is none of these. */
function parseHostPort(value: string): HostPort | null {
  const match = /^(\[[^\]]*\]|[^:[\]]*)(?::(\d{1,5}))?$/.exec(value.trim().toLowerCase());
  if (match === null || match[1] === "") return null;
  const port = match[2] === undefined ? null : Number(match[2]);
  if (port !== null && port > 65535) return null;
  return { name: match[1]!, port };
}

/** An IPv6 address as a Host header writes it. */
function bracketed(address: string): string {
  const lower = address.toLowerCase();
  return isIP(lower) === 6 ? `[${lower}]` : lower;
}

function isLoopbackName(host: string): boolean {
  return host === "localhost" || host === "::1" || (isIP(host) === 4 && host.startsWith("127."));
}
