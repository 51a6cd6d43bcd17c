// Ollama's routes on the gateway's port that no replica answers (gateway/side-routes.ts):
//   GET /api/tags      the models the key may use (names, aliases, adapters' names)
//   POST /api/show     one of them: details, capabilities, context length
//   GET /api/ps        those with a replica ready now
//   GET /api/version   the Ollama API version this translation follows
// and the model-management routes (pull, push, create, delete, copy, blobs), which answer
// 501: llmgw's models are added by an administrator and placed by the fleet, not pulled by
// a client. Any other path under /api/ is a 404 in Ollama's shape. llmgw's own admin API
// (/api/v1/...) shares the prefix and is never one of these (isOllamaPath).
import type { IncomingMessage, ServerResponse } from "node:http";
import { z } from "zod";
import { LlmgwError, NotFoundError, parseWith } from "../../core/errors.ts";
import { methodNotAllowed, readLimitedBody, sendJson } from "../../core/http.ts";
import { parseJsonBody } from "../../core/json-body.ts";
import type { Principal } from "../../keys/key-service.ts";
import type { ReplicaSource } from "../admission.ts";
import type { ModelResolver } from "../gateway-ports.ts";
import type { SideRoute, SideRouteFinder } from "../side-routes.ts";
import { OLLAMA_ERRORS } from "./ollama-errors.ts";
import { modelEntry, showAnswer, usableNames } from "./ollama-models.ts";
import { catalogName } from "./ollama-request.ts";
import { OLLAMA_PROXY_ROUTES, ollamaApiKey } from "./ollama-wire.ts";

/**
 * The Ollama release whose API (docs/api.md) this translation follows: the one that added
 * logprobs, the newest request field the ollama 0.6.4 client sends. Clients compare it to
 * decide which fields they may send.
 */
export const OLLAMA_API_VERSION = "0.12.11";

/**
 * /api/ps's `expires_at` for a replica that stays: the fleet stops replicas by the model's
 * scaling settings, not by a per-model deadline the gateway knows, and Ollama itself gives
 * a far-future time for a model kept loaded for ever (keep_alive -1). An ISO string, as
 * every date in Ollama's answers (the clients type it a Date, and JSON has no dates).
 */
export const NO_EXPIRY = "9999-12-31T23:59:59Z";

export interface OllamaRouteDependencies {
  catalog: ModelResolver;
  replicas: ReplicaSource;
  /** The gateway's body limits, which /api/show's small body is read under too. */
  maxBodyBytes: number;
  bodyTimeoutMs: number;
}

/** Whether a request path (query string allowed) is one of Ollama's: under /api/, but not llmgw's admin API /api/v1. */
export function isOllamaPath(url: string): boolean {
  const query = url.indexOf("?");
  const path = query === -1 ? url : url.slice(0, query);
  return path.startsWith("/api/") && path !== "/api/v1" && !path.startsWith("/api/v1/");
}

const MANAGEMENT_ROUTES = new Set(["/api/pull", "/api/push", "/api/create", "/api/delete", "/api/copy", "/api/blobs"]);

function isManagement(path: string): boolean {
  return MANAGEMENT_ROUTES.has(path) || path.startsWith("/api/blobs/");
}

const SERVED = "POST /api/chat, /api/generate, /api/embed, /api/embeddings and /api/show, and GET /api/tags, /api/ps and /api/version";

/** /api/show takes the model as `model`, or as `name` from clients older than that field; its other fields shape a Modelfile llmgw has none of. */
const showRequestSchema = z
  .looseObject({
    model: z.string({ error: "must be a string (a model name from GET /api/tags)" }).min(1, "must not be empty").optional(),
    name: z.string({ error: "must be a string (a model name from GET /api/tags)" }).min(1, "must not be empty").optional(),
  })
  .refine((body) => body.model !== undefined || body.name !== undefined, { message: "is required: the model's name from GET /api/tags", path: ["model"] });

export class OllamaRoutes {
  private readonly route: SideRoute;

  constructor(private readonly deps: OllamaRouteDependencies) {
    this.route = { apiKey: ollamaApiKey, errors: OLLAMA_ERRORS, serve: (req, res, principal, path) => this.serve(req, res, principal, path) };
  }

  /** The side route of an Ollama path; none for the proxied ones (/api/chat...) and for paths not Ollama's. */
  find(path: string): SideRoute | undefined {
    if (!isOllamaPath(path) || Object.hasOwn(OLLAMA_PROXY_ROUTES, path)) return undefined;
    return this.route;
  }

  private async serve(req: IncomingMessage, res: ServerResponse, principal: Principal, path: string): Promise<void> {
    const method = req.method ?? "GET";
    if (isManagement(path)) {
      throw new LlmgwError({
        status: 501,
        code: "model_management_unsupported",
        message: `llmgw does not manage models through Ollama's API (${path}). An administrator adds one with 'llmgw ctl model serve <hf-repo>'; GET /api/tags lists the models this key can use.`,
      });
    }
    switch (path) {
      case "/api/tags":
        if (method !== "GET") throw methodNotAllowed(method, path, "GET");
        sendJson(res, 200, { models: this.entries(principal, () => true).map(({ entry }) => entry) });
        return;
      case "/api/ps":
        if (method !== "GET") throw methodNotAllowed(method, path, "GET");
        sendJson(res, 200, { models: this.running(principal) });
        return;
      case "/api/version":
        if (method !== "GET") throw methodNotAllowed(method, path, "GET");
        sendJson(res, 200, { version: OLLAMA_API_VERSION });
        return;
      case "/api/show":
        if (method !== "POST") throw methodNotAllowed(method, path, "POST");
        sendJson(res, 200, await this.show(req, principal));
        return;
      default:
        throw new NotFoundError(`Unknown endpoint ${method} ${path}. llmgw serves Ollama's ${SERVED}.`, { code: "unknown_endpoint" });
    }
  }

  private entries(principal: Principal, include: (modelId: string) => boolean) {
    return usableNames(this.deps.catalog, principal)
      .filter(({ model }) => include(model.id))
      .map(({ name, model }) => ({ entry: modelEntry(name, model), model }));
  }

  /**
   * The models with a replica ready now. size_vram is 0: the gateway's replica table does
   * not know how much of a replica's memory is on a GPU (the node agents do).
   */
  private running(principal: Principal) {
    const ready = (modelId: string) => this.deps.replicas.forModel(modelId).some((replica) => replica.state === "ready");
    return this.entries(principal, ready).map(({ entry, model }) => ({
      ...entry,
      expires_at: NO_EXPIRY,
      size_vram: 0,
      ...(model.definition.context_length === undefined ? {} : { context_length: model.definition.context_length }),
    }));
  }

  private async show(req: IncomingMessage, principal: Principal) {
    const raw = await readLimitedBody(req, {
      maxBytes: this.deps.maxBodyBytes,
      timeoutMs: this.deps.bodyTimeoutMs,
      tooLargeHint: '/api/show takes a small JSON body: {"model": "<name>"}.',
    });
    const body = parseWith(showRequestSchema, parseJsonBody(raw.toString("utf8")), "request");
    const requested = body.model ?? body.name ?? "";
    const usable = usableNames(this.deps.catalog, principal);
    const name = catalogName(requested, { knows: (candidate) => usable.some((entry) => entry.name === candidate) });
    // A model the key may not use gets the same 404 as one that does not exist (model-access.ts says why).
    const found = usable.find((entry) => entry.name === name);
    if (found === undefined) {
      throw new NotFoundError(`model '${requested}' not found; GET /api/tags lists the models this key can use`, { code: "model_not_found", param: "model" });
    }
    return showAnswer(found.model);
  }
}

/** The finder of Ollama's side routes, for the gateway. */
export function ollamaSideRoutes(deps: OllamaRouteDependencies): SideRouteFinder {
  const routes = new OllamaRoutes(deps);
  return (path) => routes.find(path);
}
