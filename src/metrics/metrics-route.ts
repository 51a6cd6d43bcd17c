// GET /metrics: Prometheus's text exposition format, for a local scraper without a key
// (that names this server in its Host header) and for anyone else with the metrics key or an admin key (metrics-access.ts). Raw
// node:http like the gateway: Prometheus scrapes often, and nothing here needs Hono.
import type { IncomingMessage, ServerResponse } from "node:http";
import { LlmgwError } from "../core/errors.ts";
import { methodNotAllowed, sendError } from "../core/http.ts";
import type { Logger } from "../core/log.ts";
import type { KeyVerifier } from "../gateway/gateway-ports.ts";
import { authorizeMetrics, type MetricsKey } from "./metrics-access.ts";
import { MetricsHosts, type MetricsHostsOptions } from "./metrics-hosts.ts";
import type { Metrics } from "./metrics.ts";

export const METRICS_PATH = "/metrics";

export interface MetricsRouteOptions {
  metrics: Metrics;
  keys: KeyVerifier;
  metricsKey: MetricsKey | null;
  /** What the Host names a local scraper may use without a key are made of (metrics-hosts.ts). */
  hosts: MetricsHostsOptions;
  logger: Logger;
}

/** Whether a request URL is GET /metrics's (a query string is allowed and ignored). */
export function isMetricsRequest(url: string): boolean {
  return url === METRICS_PATH || url.startsWith(`${METRICS_PATH}?`);
}

export function createMetricsHandler(options: MetricsRouteOptions): (req: IncomingMessage, res: ServerResponse) => void {
  const hosts = new MetricsHosts(options.hosts);
  const serve = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (req.method !== "GET" && req.method !== "HEAD") throw methodNotAllowed(req.method ?? "GET", METRICS_PATH, "GET");
    await authorizeMetrics({ remoteAddress: req.socket.remoteAddress, headers: req.headers }, { metricsKey: options.metricsKey, keys: options.keys, hosts });
    const text = await options.metrics.render();
    res.writeHead(200, { "content-type": options.metrics.contentType, "content-length": String(Buffer.byteLength(text)), "cache-control": "no-store" });
    res.end(req.method === "HEAD" ? undefined : text);
  };
  return (req, res) => {
    serve(req, res).catch((error: unknown) => {
      if (!(error instanceof LlmgwError)) options.logger.error({ err: error }, "unexpected error on /metrics");
      sendError(req, res, error);
    });
  };
}
