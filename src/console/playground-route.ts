// The console's playground talks to models through the gateway, exactly as an application
// would, but the browser holds no API key: this route takes the console session (or an admin
// key), then hands the request to the gateway as that key. Usage, limits and guards apply as
// for any request of the key that logged in.
import type { IncomingMessage, ServerResponse } from "node:http";
import { bearerToken } from "../core/bearer.ts";
import { sendError } from "../core/http.ts";
import type { KeyService, Principal } from "../keys/key-service.ts";
import { requestFacts, sessionOfRequest } from "./console-routes.ts";
import type { ConsoleSessions } from "./console-sessions.ts";

export const PLAYGROUND_CHAT_PATH = "/api/v1/playground/chat/completions";

/** Whether a request URL is the playground's (a query string does not matter). */
export function isPlaygroundRequest(url: string): boolean {
  return url === PLAYGROUND_CHAT_PATH || url.startsWith(`${PLAYGROUND_CHAT_PATH}?`);
}

export interface PlaygroundOptions {
  sessions: ConsoleSessions;
  keys: KeyService;
  gateway: { handleAuthenticated(req: IncomingMessage, res: ServerResponse, principal: Principal): void };
}

export function createPlaygroundHandler(options: PlaygroundOptions): (req: IncomingMessage, res: ServerResponse) => Promise<void> {
  return async (req, res) => {
    let principal: Principal;
    try {
      const bearer = bearerToken(req.headers.authorization);
      const session = bearer === undefined ? await sessionOfRequest(options.sessions, requestFacts(req.headers, req.method ?? "POST")) : null;
      principal = session?.principal ?? (await options.keys.verifyAdmin(bearer));
    } catch (error) {
      sendError(req, res, error);
      return;
    }
    // The gateway routes by path: from here on this is a chat completion like any other.
    req.url = "/v1/chat/completions";
    options.gateway.handleAuthenticated(req, res, principal);
  };
}
