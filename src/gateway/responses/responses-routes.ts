// The kept responses' own routes, on the gateway's port with the gateway's keys:
//   GET    /v1/responses/{id}              the response as its client got it
//   DELETE /v1/responses/{id}              {id, object: "response", deleted: true}
//   GET    /v1/responses/{id}/input_items  the request's input items, a cursor page
//                                          (limit 1-100, default 20; order desc by default,
//                                          as OpenAI's; after/before an item id)
// A response of another key answers the same 404 as one that does not exist.
import type { IncomingMessage, ServerResponse } from "node:http";
import { BadRequestError, NotFoundError } from "../../core/errors.ts";
import { bearerToken } from "../../core/bearer.ts";
import { OPENAI_ERRORS, methodNotAllowed, sendJson } from "../../core/http.ts";
import type { Principal } from "../../keys/key-service.ts";
import type { SideRoute } from "../side-routes.ts";
import type { ResponseStore, StoredResponse } from "./response-store.ts";

const PREFIX = "/v1/responses/";
const DEFAULT_PAGE = 20;
const MAX_PAGE = 100;

export class ResponsesRoutes {
  private readonly route: SideRoute;

  constructor(private readonly store: ResponseStore) {
    this.route = {
      apiKey: (req) => bearerToken(req.headers.authorization),
      errors: OPENAI_ERRORS,
      serve: (req, res, principal, path) => this.serve(req, res, principal, path),
    };
  }

  /** The route for a path under /v1/responses/, or undefined for any other path. */
  find(path: string): SideRoute | undefined {
    return path.startsWith(PREFIX) && path.length > PREFIX.length ? this.route : undefined;
  }

  private async serve(req: IncomingMessage, res: ServerResponse, principal: Principal, path: string): Promise<void> {
    const [id, sub, ...rest] = path.slice(PREFIX.length).split("/");
    const method = req.method ?? "GET";
    req.resume();
    if (rest.length > 0 || (sub !== undefined && sub !== "input_items" && sub !== "cancel")) {
      throw new NotFoundError(`Unknown endpoint ${method} ${path}. Stored responses are at /v1/responses/{id} and /v1/responses/{id}/input_items.`, {
        code: "unknown_endpoint",
      });
    }
    const query = new URL(req.url ?? "/", "http://gateway").searchParams;
    if (sub === "cancel") {
      if (method !== "POST") throw methodNotAllowed(method, path, "POST");
      // Found first, so an id of another key is as unknown here as everywhere.
      await this.found(id!, principal);
      throw new BadRequestError("Only background responses can be cancelled, and llmgw runs none: this response is already complete.", {
        code: "not_cancellable",
      });
    }
    if (sub === "input_items") {
      if (method !== "GET") throw methodNotAllowed(method, path, "GET");
      sendJson(res, 200, inputItemsPage(await this.found(id!, principal), query));
      return;
    }
    if (method === "GET") {
      if (query.get("stream") === "true") {
        throw new BadRequestError("Streaming a kept response again is not supported; read it whole (without stream=true).", {
          code: "invalid_field",
          param: "stream",
        });
      }
      sendJson(res, 200, (await this.found(id!, principal)).response);
      return;
    }
    if (method === "POST") {
      // OpenAI's other POST routes under /v1/responses/ (input_tokens, compact): not served here.
      throw new NotFoundError(
        `Unknown endpoint POST ${path}. llmgw creates responses with POST /v1/responses and reads kept ones with GET /v1/responses/{id}.`,
        {
          code: "unknown_endpoint",
        },
      );
    }
    if (method === "DELETE") {
      if (!(await this.store.delete(id!, principal.keyId))) throw notFound(id!);
      sendJson(res, 200, { id, object: "response", deleted: true });
      return;
    }
    throw methodNotAllowed(method, path, "GET, DELETE");
  }

  private async found(id: string, principal: Principal): Promise<StoredResponse> {
    const stored = await this.store.get(id, principal.keyId);
    if (stored === undefined) throw notFound(id);
    return stored;
  }
}

function notFound(id: string): NotFoundError {
  return new NotFoundError(`No response '${id}': responses are kept per API key, until deleted or past their retention.`, { code: "response_not_found" });
}

/** One cursor page of a response's input items. */
function inputItemsPage(stored: StoredResponse, query: URLSearchParams) {
  const limitText = query.get("limit");
  const limit = limitText === null ? DEFAULT_PAGE : Number(limitText);
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_PAGE) {
    throw new BadRequestError(`Invalid query: 'limit' must be an integer from 1 to ${MAX_PAGE}.`, { code: "invalid_field", param: "limit" });
  }
  const order = query.get("order") ?? "desc";
  if (order !== "asc" && order !== "desc")
    throw new BadRequestError("Invalid query: 'order' must be 'asc' or 'desc'.", { code: "invalid_field", param: "order" });
  let items = order === "asc" ? stored.input : [...stored.input].reverse();
  const cursorAt = (name: "after" | "before"): number | null => {
    const cursor = query.get(name);
    if (cursor === null) return null;
    const at = items.findIndex((item) => item.id === cursor);
    if (at === -1) throw new BadRequestError(`Invalid query: '${name}' names no input item of this response.`, { code: "invalid_field", param: name });
    return at;
  };
  const after = cursorAt("after");
  if (after !== null) items = items.slice(after + 1);
  const before = cursorAt("before");
  // The page just before the cursor: its last `limit` items.
  if (before !== null) items = items.slice(Math.max(0, before - limit), before);
  const data = items.slice(0, limit);
  return { object: "list", data, first_id: data[0]?.id ?? null, last_id: data.at(-1)?.id ?? null, has_more: items.length > data.length };
}
