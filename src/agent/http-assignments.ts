// The agent protocol's client side for `llmgw agent`: the Assignments interface over HTTP
// to the server's /agent/v1. An error the server answers comes back as the same error
// class with its code and status (a refused credential is a 401 here as there); a server
// that cannot be reached is a retryable UpstreamError.
import { Agent, request, type Dispatcher } from "undici";
import { LlmgwError, UpstreamError, describeError } from "../core/errors.ts";
import type { AssignmentSet, Assignments, HeartbeatReply, HeartbeatReport, JoinReply, JoinRequest } from "../fleet/agent-protocol.ts";

const CALL_TIMEOUT_MS = 15_000;

export class HttpAssignments implements Assignments {
  private readonly dispatcher: Dispatcher;

  constructor(private readonly server: string) {
    // Long polls hold a connection open up to 30 s; headers must arrive after that, not before.
    this.dispatcher = new Agent({ headersTimeout: 60_000, bodyTimeout: 60_000, connect: { timeout: 10_000 } });
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
    return this.call<AssignmentSet>("GET", `/agent/v1/assignments?${query}`, { credential, signal: options.signal, timeoutMs: options.waitMs + CALL_TIMEOUT_MS });
  }

  close(): Promise<void> {
    return this.dispatcher.close();
  }

  private async call<T>(method: "GET" | "POST", pathname: string, options: { credential?: string; body?: unknown; signal?: AbortSignal; timeoutMs?: number }): Promise<T> {
    // Only a joined agent has engines to keep and a loop that retries; a join just fails.
    const meanwhile = options.credential === undefined ? "check --server and that the server runs" : "the agent keeps its engines running and retries";
    const url = new URL(pathname, this.server);
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
      throw new UpstreamError(`Cannot reach the llmgw server at ${this.server} (${describeError(error)}); ${meanwhile}.`, {
        code: "server_unreachable",
        retryable: true,
        cause: error,
      });
    }
    const text = await response.body.text();
    if (response.statusCode >= 200 && response.statusCode < 300) return JSON.parse(text) as T;
    let error: { message?: string; code?: string; type?: string } = {};
    try {
      error = (JSON.parse(text) as { error?: typeof error }).error ?? {};
    } catch {
      // Not our server's error shape (a proxy's page): reported with the status below.
    }
    throw new LlmgwError({
      status: response.statusCode,
      code: error.code ?? "server_error",
      message: `The llmgw server at ${this.server} answered ${response.statusCode} to ${method} ${url.pathname}: ${error.message ?? text.slice(0, 200)}`,
      retryable: response.statusCode >= 500,
    });
  }
}
