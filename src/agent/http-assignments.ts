// The agent protocol's client side for `llmgw agent`: the Assignments interface over HTTP
// to the servers' /agent/v1. An error the server answers comes back as the same error
// class with its code and status (a refused credential is a 401 here as there); a server
// that cannot be reached is a retryable UpstreamError.
//
// Several servers of one cluster (one PostgreSQL) all accept the agent protocol: a server
// that does not lead forwards the call to the leader. So the client keeps a list and a
// current server. A call that cannot reach the current server, or that it answers with
// 502, 503 or 504 (a server that is stopping, a follower without a leader right now), is
// sent to the next server, at most once round the list; the server that answered after
// such a move becomes the current one for the calls that follow. An answered 4xx is the
// server's word about this node (refused credential, node removed) and is not failed
// over: another server of the cluster would say the same.
import { Agent, request, type Dispatcher } from "undici";
import { LlmgwError, UpstreamError, describeError } from "../core/errors.ts";
import type { AssignmentSet, Assignments, HeartbeatReply, HeartbeatReport, JoinReply, JoinRequest } from "../fleet/agent-protocol.ts";

const CALL_TIMEOUT_MS = 15_000;

// Answers that say "this server cannot take the call now", unlike 500 (a fault in the call).
const FAILOVER_STATUSES = new Set([502, 503, 504]);

export interface HttpAssignmentsOptions {
  /** Told when calls move to another server: from, to, and why the previous one(s) failed. */
  onSwitch?: (from: string, to: string, why: string) => void;
}

/** One try of a call on one server. */
type Sent<T> = { kind: "value"; value: T } | { kind: "answer"; error: LlmgwError; reason: string } | { kind: "unreachable"; cause: unknown };

interface CallOptions {
  credential?: string;
  body?: unknown;
  signal?: AbortSignal;
  timeoutMs?: number;
}

export class HttpAssignments implements Assignments {
  private readonly dispatcher: Dispatcher;
  private readonly servers: readonly string[];
  private readonly onSwitch: ((from: string, to: string, why: string) => void) | undefined;
  private index = 0;

  /** `servers`: one base URL, or the servers of one cluster in the order to try them. */
  constructor(servers: string | readonly string[], options: HttpAssignmentsOptions = {}) {
    const list = [...new Set((typeof servers === "string" ? [servers] : servers).map((server) => server.replace(/\/+$/, "")))];
    if (list.length === 0) throw new LlmgwError({ status: 400, code: "server_missing", message: "HttpAssignments needs at least one llmgw server URL." });
    this.servers = list;
    this.onSwitch = options.onSwitch;
    // Long polls hold a connection open up to 30 s; headers must arrive after that, not before.
    this.dispatcher = new Agent({ headersTimeout: 60_000, bodyTimeout: 60_000, connect: { timeout: 10_000 } });
  }

  /** The server calls go to first now (the last one that took a call after a failover). */
  get current(): string {
    return this.servers[this.index] as string;
  }

  async join(body: JoinRequest): Promise<JoinReply> {
    return this.call<JoinReply>("POST", "/agent/v1/join", {
      body: { join_token: body.joinToken, name: body.name, address: body.address, inventory: body.inventory, labels: body.labels },
    });
  }

  heartbeat(credential: string, report: HeartbeatReport): Promise<HeartbeatReply> {
    return this.call<HeartbeatReply>("POST", "/agent/v1/heartbeat", { credential, body: report });
  }

  assignments(credential: string, options: { knownVersion: string | null; waitMs: number; signal: AbortSignal }): Promise<AssignmentSet> {
    const query = new URLSearchParams({ wait_ms: String(options.waitMs), ...(options.knownVersion === null ? {} : { version: options.knownVersion }) });
    return this.call<AssignmentSet>("GET", `/agent/v1/assignments?${query}`, {
      credential,
      signal: options.signal,
      timeoutMs: options.waitMs + CALL_TIMEOUT_MS,
    });
  }

  close(): Promise<void> {
    return this.dispatcher.close();
  }

  private async call<T>(method: "GET" | "POST", pathAndQuery: string, options: CallOptions): Promise<T> {
    // Only a joined agent has engines to keep and a loop that retries; a join just fails.
    const meanwhile = options.credential === undefined ? "check --server and that the server runs" : "the agent keeps its engines running and retries";
    const pathname = pathAndQuery.split("?")[0] as string;
    const first = this.index;
    const failed: string[] = [];
    let last: LlmgwError | undefined;
    for (let step = 0; step < this.servers.length; step += 1) {
      const index = (first + step) % this.servers.length;
      const server = this.servers[index] as string;
      const sent = await this.send<T>(server, method, pathAndQuery, options);
      if (sent.kind === "unreachable") {
        const unreachable = new UpstreamError(`Cannot reach the llmgw server at ${server} (${describeError(sent.cause)}); ${meanwhile}.`, {
          code: "server_unreachable",
          retryable: true,
          cause: sent.cause,
        });
        // The agent's own abort (it is stopping) is no sign of a bad server: end the call here.
        if (options.signal?.aborted === true) throw unreachable;
        failed.push(`${server} could not be reached (${describeError(sent.cause)})`);
        last = unreachable;
        continue;
      }
      if (sent.kind === "answer" && FAILOVER_STATUSES.has(sent.error.status)) {
        failed.push(`${server} ${sent.reason}`);
        last = sent.error;
        continue;
      }
      // This server answered. Only a call that had to move changes the current server: a
      // long poll that started on the old one before the move must not pull the others back.
      if (step > 0) this.moveTo(index, failed.join("; "));
      if (sent.kind === "answer") throw sent.error;
      return sent.value;
    }
    if (last === undefined || this.servers.length === 1) throw last as LlmgwError;
    throw new LlmgwError({
      status: last.status,
      code: last.code,
      type: last.type,
      retryable: last.retryable,
      headers: last.headers,
      cause: last,
      message: `No llmgw server took ${method} ${pathname}: ${failed.join("; ")}; ${meanwhile}.`,
    });
  }

  private moveTo(index: number, why: string): void {
    if (index === this.index) return;
    const from = this.current;
    this.index = index;
    this.onSwitch?.(from, this.current, why);
  }

  private async send<T>(server: string, method: "GET" | "POST", pathAndQuery: string, options: CallOptions): Promise<Sent<T>> {
    const url = new URL(pathAndQuery, server);
    const signals = [AbortSignal.timeout(options.timeoutMs ?? CALL_TIMEOUT_MS), ...(options.signal ? [options.signal] : [])];
    let response: Dispatcher.ResponseData;
    try {
      response = await request(url, {
        method,
        dispatcher: this.dispatcher,
        headers: {
          ...(options.credential === undefined ? {} : { authorization: `Bearer ${options.credential}` }),
          ...(options.body === undefined ? {} : { "content-type": "application/json" }),
        },
        ...(options.body === undefined ? {} : { body: JSON.stringify(options.body) }),
        signal: AbortSignal.any(signals),
      });
    } catch (error) {
      return { kind: "unreachable", cause: error };
    }
    const text = await response.body.text();
    if (response.statusCode >= 200 && response.statusCode < 300) return { kind: "value", value: JSON.parse(text) as T };
    let error: { message?: string; code?: string; type?: string } = {};
    try {
      error = (JSON.parse(text) as { error?: typeof error }).error ?? {};
    } catch {
      // Not our server's error shape (a proxy's page): reported with the status below.
    }
    const said = error.message ?? text.slice(0, 200);
    return {
      kind: "answer",
      reason: `answered ${response.statusCode}: ${said}`,
      error: new LlmgwError({
        status: response.statusCode,
        code: error.code ?? "server_error",
        message: `The llmgw server at ${server} answered ${response.statusCode} to ${method} ${url.pathname}: ${said}`,
        retryable: response.statusCode >= 500,
      }),
    };
  }
}
