// Requests only the leader can answer, sent on by a server that does not lead. The agent
// protocol (heartbeats, assignments) and the fleet's operations (nodes, drain, unpark,
// the plan, serve and update jobs, cancels, update checks) work on state
// the leader keeps in memory; so any server takes them, and a standby passes them to the
// leader as they are (method, path, headers, body, streamed both ways) and its answer back.
// Mirror fetches go to the leader too, so the files the leader places replicas with are on
// its disk, unless the servers are given `--mirror-on NAME`: then to that server.
// The leader checks the key, the session or the node credential itself, as it would from
// the client directly.
//
// A forwarded request carries `x-llmgw-forwarded-by`; a server that gets one and does not
// lead either (the lead moved meanwhile) answers 503 rather than pass it on again. While no
// server leads (a few seconds after a leader dies) the answer is 503 with Retry-After,
// which agents and the OpenAI-style clients retry.
import http from "node:http";
import https from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import { describeError } from "../core/errors.ts";
import { sendError } from "../core/http.ts";
import type { Logger } from "../core/log.ts";
import type { Store } from "../store/store.ts";
import { NotLeaderError } from "./leadership.ts";
import type { ClusterMembers } from "./cluster-members.ts";

export const FORWARDED_BY_HEADER = "x-llmgw-forwarded-by";

/** Hop-by-hop headers (RFC 9110 7.6.1) stay on their hop. */
const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te", "trailer"]);

/** A forwarded exchange with no byte either way for this long is cut. */
const FORWARD_IDLE_MS = 120_000;

/** The headers of a message without its hop-by-hop ones, those its Connection header names included. */
function endToEndHeaders(headers: http.IncomingHttpHeaders): http.OutgoingHttpHeaders {
  const named = new Set(
    String(headers.connection ?? "")
      .split(",")
      .map((name) => name.trim().toLowerCase())
      .filter((name) => name !== ""),
  );
  const kept: http.OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(headers)) if (!HOP_BY_HOP.has(name) && !named.has(name) && value !== undefined) kept[name] = value;
  return kept;
}

/** Whether only the leader can answer this request (see the module comment for why each). */
export function isLeaderRequest(method: string, url: string): boolean {
  const path = url.split("?", 1)[0]!;
  if (path.startsWith("/agent/v1/")) return true;
  if (path === "/api/v1/nodes" || path.startsWith("/api/v1/nodes/")) return true;
  if (path === "/api/v1/plan") return true;
  if (method === "POST" && (path === "/api/v1/jobs/serve" || path === "/api/v1/jobs/update" || /^\/api\/v1\/jobs\/[^/]+\/cancel$/.test(path))) return true;
  if (method === "POST" && /^\/api\/v1\/models\/[^/]+\/(unpark|rollback)$/.test(path)) return true;
  if (method === "GET" && /^\/api\/v1\/models\/[^/]+\/health$/.test(path)) return true;
  return method === "POST" && path === "/api/v1/updates/check";
}

/**
 * Where a request is answered: here, by the leader, or by a named server. A mirror fetch
 * (`POST /api/v1/mirror`) goes to the --mirror-on server when there is one, else to the
 * leader; one that another server passed here was meant for this one.
 */
export function answeredBy(req: IncomingMessage, options: { mirrorOn: string | undefined; self: string }): "here" | "leader" | { server: string } {
  const method = req.method ?? "GET";
  const url = req.url ?? "/";
  if (method === "POST" && url.split("?", 1)[0] === "/api/v1/mirror") {
    if (req.headers[FORWARDED_BY_HEADER] !== undefined || options.mirrorOn === options.self) return "here";
    return options.mirrorOn === undefined ? "leader" : { server: options.mirrorOn };
  }
  return isLeaderRequest(method, url) ? "leader" : "here";
}

export class LeaderForwarder {
  private readonly agents = { http: new http.Agent({ keepAlive: true }), https: new https.Agent({ keepAlive: true }) };

  constructor(private readonly options: { store: Store; members: ClusterMembers; logger: Logger }) {}

  /** Sends the request to the leader (or to the named server) and its answer back. */
  async forward(req: IncomingMessage, res: ServerResponse, to?: string): Promise<void> {
    let target: string;
    try {
      if (req.headers[FORWARDED_BY_HEADER] !== undefined) {
        throw new NotLeaderError(
          `This server was passed a request for the leader by '${String(req.headers[FORWARDED_BY_HEADER])}' but does not lead: the lead is moving. Retry in a few seconds.`,
        );
      }
      target = await this.urlOf(to);
    } catch (error) {
      req.resume();
      sendError(req, res, error);
      return;
    }
    const url = new URL(req.url ?? "/", target);
    const headers = endToEndHeaders(req.headers);
    headers[FORWARDED_BY_HEADER] = this.options.members.name;
    const client = url.protocol === "https:" ? https : http;
    await new Promise<void>((resolve) => {
      const upstream = client.request(
        url,
        { method: req.method ?? "GET", headers, agent: url.protocol === "https:" ? this.agents.https : this.agents.http },
        (answer) => {
          res.writeHead(answer.statusCode ?? 502, endToEndHeaders(answer.headers));
          answer.pipe(res);
          answer.on("end", resolve);
          answer.on("error", () => {
            res.destroy();
            resolve();
          });
        },
      );
      upstream.on("error", (error) => {
        this.options.logger.warn({ to: url.origin, path: url.pathname, err: describeError(error) }, "could not pass a request to the leader");
        if (!res.headersSent)
          sendError(
            req,
            res,
            new NotLeaderError(`The leader at ${url.origin} cannot be reached (${describeError(error)}); another server takes over within seconds. Retry.`),
          );
        else res.destroy();
        resolve();
      });
      // A leader that stops answering mid-way (no byte for two minutes; long polls send theirs within 30 s).
      upstream.setTimeout(FORWARD_IDLE_MS, () => upstream.destroy(new Error(`no answer for ${FORWARD_IDLE_MS / 1000} s`)));
      // The client went away (an agent's long poll cut short): so does the leg to the leader.
      res.on("close", () => {
        if (!res.writableFinished) upstream.destroy();
        resolve();
      });
      req.pipe(upstream);
    });
  }

  close(): void {
    this.agents.http.destroy();
    this.agents.https.destroy();
  }

  private async urlOf(name?: string): Promise<string> {
    let wanted = name;
    if (wanted === undefined) {
      const row = await this.options.store.db.selectFrom("cluster_leader").select(["leader"]).where("id", "=", 1).executeTakeFirst();
      wanted = row?.leader ?? undefined;
      if (wanted === undefined) throw new NotLeaderError("No server leads the cluster yet; one takes the lead within seconds. Retry.");
    }
    const member = await this.options.members.live(wanted);
    if (member === undefined) {
      throw new NotLeaderError(
        name === undefined
          ? `The leader '${wanted}' is not answering; another server takes over within seconds. Retry.`
          : `The server '${wanted}' is not running (not seen for a while). Start it, or choose another with 'llmgw ctl cluster status'.`,
      );
    }
    if (member.name === this.options.members.name) throw new NotLeaderError("This server is taking the lead; retry in a moment.");
    return member.url;
  }
}
