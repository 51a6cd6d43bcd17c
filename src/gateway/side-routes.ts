// Requests on the gateway's port that no replica answers: the stored responses of the
// Responses API (GET/DELETE /v1/responses/{id}, its input_items) and Ollama's catalog
// routes (/api/tags, /api/show, /api/ps, /api/version, and the model-management routes
// that answer 501). The gateway checks the key as for a proxied request (with the route's
// own key header) and counts the request in its metrics; the route answers it, in its own
// error shape.
import type { IncomingMessage, ServerResponse } from "node:http";
import type { ErrorDialect } from "../core/http.ts";
import type { Principal } from "../keys/key-service.ts";

export interface SideRoute {
  /** The key the request carries; may throw a 401 saying where to put it. */
  apiKey(req: IncomingMessage): string | undefined;
  /** Error bodies in this route's shape (the gateway renders what `serve` throws with it). */
  errors: ErrorDialect;
  /**
   * Answers one request whose key was verified: writes the whole answer (or throws an
   * LlmgwError, which the gateway renders with `errors`). `path` has no query string and
   * no trailing slash.
   */
  serve(req: IncomingMessage, res: ServerResponse, principal: Principal, path: string): Promise<void>;
}

/** Finds the side route for a path (any method: a route answers 405 itself). */
export type SideRouteFinder = (path: string) => SideRoute | undefined;
