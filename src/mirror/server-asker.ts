// How one server of a cluster asks another to do a mirror action on its own disk (copy a
// version there, show that copy's progress): the same admin request, sent to the other
// server's URL with the caller's Authorization, so the other server checks the caller's
// key itself and audits the action under the caller's name. The request is marked as
// passed on (`x-llmgw-forwarded-by`), so a server never passes it on again.
import { request, type Dispatcher } from "undici";
import { LlmgwError, UnavailableError, UpstreamError, describeError } from "../core/errors.ts";
import { FORWARDED_BY_HEADER } from "../cluster/leader-forward.ts";
import type { MirrorCluster } from "./mirror-cluster.ts";

export interface ServerRequest {
  method: "GET" | "POST";
  /** The admin API path, query included. */
  path: string;
  /** A JSON body, for a POST. */
  body?: unknown;
}

/**
 * Sends `request` to the server `name` with `authorization` and resolves with its JSON
 * answer; an answer of 400 or more rejects with an LlmgwError of that status and code,
 * whose message names the server.
 */
export type AskServer = (name: string, request: ServerRequest, authorization: string) => Promise<unknown>;

/** The default `AskServer`: the server's URL from the cluster's live list, over HTTP. */
export function httpServerAsker(options: { cluster: MirrorCluster; dispatcher?: Dispatcher; timeoutMs?: number }): AskServer {
  const timeoutMs = options.timeoutMs ?? 30_000;
  return async (name, ask, authorization) => {
    const server = (await options.cluster.liveServers()).find((live) => live.name === name);
    if (server === undefined) {
      throw new UnavailableError(`The server '${name}' is not running. Start it (or choose another with 'llmgw ctl cluster status'), then try again.`, {
        code: "server_not_running",
        retryAfterSeconds: 5,
      });
    }
    const url = `${server.url.replace(/\/+$/, "")}${ask.path}`;
    let response: Dispatcher.ResponseData;
    try {
      response = await request(url, {
        method: ask.method,
        headers: { authorization, [FORWARDED_BY_HEADER]: options.cluster.self, ...(ask.body === undefined ? {} : { "content-type": "application/json" }) },
        body: ask.body === undefined ? undefined : JSON.stringify(ask.body),
        headersTimeout: timeoutMs,
        bodyTimeout: timeoutMs,
        ...(options.dispatcher === undefined ? {} : { dispatcher: options.dispatcher }),
      });
    } catch (error) {
      throw new UpstreamError(`Cannot reach the server '${name}' at ${new URL(url).origin} (${describeError(error)}); it may have just stopped. Try again.`, {
        code: "server_unreachable",
        retryable: true,
        cause: error,
      });
    }
    const text = await response.body.text();
    let parsed: unknown = null;
    try {
      parsed = text === "" ? null : JSON.parse(text);
    } catch {
      parsed = null;
    }
    if (response.statusCode >= 400) {
      const detail = (parsed as { error?: { message?: string; code?: string } } | null)?.error;
      throw new LlmgwError({
        message: `The server '${name}' answered ${response.statusCode}: ${detail?.message ?? text.slice(0, 300)}`,
        code: detail?.code ?? "server_error",
        status: response.statusCode,
      });
    }
    return parsed;
  };
}
