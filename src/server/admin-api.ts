// The admin API under /api/v1 (used by `llmgw ctl` and the console), plus /healthz and
// /readyz. Handlers are thin: check the admin key, parse, call the domain, render. Every
// error leaves through `renderError`, in the same OpenAI shape as /v1.
import { Hono, type Context } from "hono";
import { bearerToken } from "../core/bearer.ts";
import { JSON_API_BODY_LIMITS, readJsonRequest, type BodyLimits } from "../core/http.ts";
import { z } from "zod";
import { BadRequestError, LlmgwError, NotFoundError, parseWith, renderError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { Catalog, CatalogModel } from "../catalog/catalog.ts";
import { DEFAULT_CONTEXT_POOL, redactDefinition } from "../catalog/model-schema.ts";
import type { KeyService, Principal } from "../keys/key-service.ts";
import type { LimitsService } from "../policy/limits.ts";
import { modelHealth } from "../fleet/model-health.ts";
import type { FleetAccess } from "../cluster/fleet-access.ts";
import { mountFleetRoutes } from "../fleet/fleet-routes.ts";
import { viewReplica, type ReplicaTable } from "../fleet/replica-table.ts";
import { mountMirrorRoutes, type MirrorRoutesOptions } from "../mirror/mirror-routes.ts";
import { mountServeRoutes, type ServeRoutesOptions } from "../serve/serve-routes.ts";
import type { AuditTrail } from "../store/audit.ts";
import { mountUsageRoutes, type UsageRoutesOptions } from "../usage/usage-routes.ts";
import type { StorageFaultState } from "../store/storage-fault.ts";
import { mountEventsRoutes, STILL_AUTHORIZED, type EventsRoutesOptions } from "../events/events-routes.ts";
import { mountConsoleRoutes, requestFacts, sessionOfRequest } from "../console/console-routes.ts";
import type { ConsoleSessions } from "../console/console-sessions.ts";
import { mountNotifyRoutes, type NotifyRoutesOptions } from "../notify/notify-routes.ts";
import { mountClusterRoutes, type ClusterRoutesOptions } from "../cluster/cluster-routes.ts";

/** What /readyz answers: 200 when ready, else 503 with the reason. */
export interface Readiness {
  status: "ready" | "starting" | "not_ready";
  reason?: string;
  /** The storage fault that makes the server not ready (a full disk, a read-only data dir), without where. */
  storage?: Pick<StorageFaultState, "kind" | "code" | "since">;
  /** Usage rows lost since start because the store refused them; the gateway answers regardless. */
  usage_rows_dropped: number;
}

export interface AdminApiOptions {
  catalog: Catalog;
  keys: KeyService;
  /** Budgets and rate limits: what a key spent and uses now (GET /api/v1/keys/:ref). */
  limits?: LimitsService;
  replicas: ReplicaTable;
  logger: Logger;
  /** Nodes, placement, parking (the /api/v1/nodes routes, model health, unpark), as this server sees them leading or standing by. */
  fleet: FleetAccess;
  /** The servers sharing the store (GET /api/v1/cluster). */
  cluster?: ClusterRoutesOptions;
  /** The join token agents join with (`ctl node join-token`). */
  joinToken: () => string;
  /** The weights mirror and the registry it fetches from (the /api/v1/mirror routes). */
  mirror?: MirrorRoutesOptions;
  /** Serve and update jobs, and the update check (the /api/v1/jobs and /api/v1/updates routes). */
  serve?: Omit<ServeRoutesOptions, "catalog" | "audit" | "bodyLimits">;
  /** Plans a repository against this server's pool (GET /api/v1/plan). */
  planner?: (query: { repo: string; revision?: string; contextSize: number; format?: "gguf" | "safetensors" }, signal: AbortSignal) => Promise<unknown>;
  /** Usage reports (GET /api/v1/usage), read from the store's aggregates. */
  usage?: Omit<UsageRoutesOptions, "keys" | "catalog">;
  /** The event log and its live stream (GET /api/v1/events, /api/v1/events/stream). */
  events?: EventsRoutesOptions;
  /** Notification channels, tests and delivery logs (/api/v1/notify). */
  notify?: Omit<NotifyRoutesOptions, "jsonBody" | "actor">;
  /** Console logins (the page at / and the session cookie the admin API also takes). */
  sessions?: ConsoleSessions;
  /** Whether the server is ready to take traffic (started, and its store takes writes). */
  readiness?: () => Promise<Readiness>;
  /** Every action of every domain, for GET /api/v1/audit; records unparks. */
  audit: AuditTrail;
  version: string;
  /** Size and time limits of request bodies (default JSON_API_BODY_LIMITS). */
  bodyLimits?: BodyLimits;
}

type Env = { Variables: { principal: Principal } };

const auditQuerySchema = z.strictObject({
  limit: z.coerce.number().int().min(1).max(1000).default(100),
  action: z.string().min(1).max(100, "is at most 100 characters: one action (key.revoke) or a prefix ending in '.' (key.)").optional(),
  target: z.string().min(1).max(500).optional(),
});

const planQuerySchema = z
  .strictObject({
    repo: z.string({ error: "is required: owner/name on the registry, or a local file or folder path" }).min(1),
    revision: z.string().min(1).optional(),
    context: z.coerce.number().int().min(256).max(10_000_000).default(DEFAULT_CONTEXT_POOL),
    format: z.enum(["gguf", "safetensors"]).optional(),
  })
  .transform(({ context, ...rest }) => ({ ...rest, contextSize: context }));

export function createAdminApi(options: AdminApiOptions): Hono<Env> {
  const { catalog, keys, replicas } = options;
  const bodyLimits = options.bodyLimits ?? JSON_API_BODY_LIMITS;
  const jsonBody = (c: Context) => readJsonRequest(c, bodyLimits);
  const app = new Hono<Env>();

  app.onError((error, c) => {
    if (!(error instanceof LlmgwError)) options.logger.error({ err: error, path: c.req.path }, "unexpected error in the admin API");
    const rendered = renderError(error);
    return c.json(rendered.body, rendered.status as 400, rendered.headers);
  });
  app.notFound((c) => {
    const rendered = renderError(new NotFoundError(`Unknown endpoint ${c.req.method} ${c.req.path}.`, { code: "unknown_endpoint" }));
    return c.json(rendered.body, 404);
  });

  app.get("/healthz", (c) => c.json({ status: "ok", version: options.version }));
  // On PostgreSQL the readiness check probes the database (at most once a second, within
  // 2 s), so a database gone silent turns this 503 and a load balancer stops sending here.
  app.get("/readyz", async (c) => {
    const readiness = (await options.readiness?.()) ?? { status: "ready", usage_rows_dropped: 0 };
    if (readiness.status === "ready") return c.json(readiness, 200);
    return c.json(readiness, 503, { "retry-after": "5" });
  });

  // Before the auth step below: the page and logging in need no key or session.
  if (options.sessions !== undefined) mountConsoleRoutes(app, { sessions: options.sessions, jsonBody, logger: options.logger });

  app.use("/api/v1/*", async (c, next) => {
    const bearer = bearerToken(c.req.header("authorization"));
    // A key in the header wins (ctl); without one, the console's session cookie.
    const session =
      bearer === undefined && options.sessions !== undefined ? await sessionOfRequest(options.sessions, requestFacts(c.req.raw.headers, c.req.method)) : null;
    c.set("principal", session?.principal ?? (await keys.verifyAdmin(bearer)));
    // Long answers (the event stream) ask again while they run: a logout or a revoked key ends them.
    const sessions = options.sessions;
    c.set(STILL_AUTHORIZED, session !== null && sessions !== undefined ? () => sessions.verify(session.token) : () => keys.verifyAdmin(bearer));
    await next();
  });

  const view = (model: CatalogModel) => {
    const modelReplicas = replicas.forModel(model.id);
    return {
      name: model.name,
      ...redactDefinition(model.definition),
      health: modelHealth(model, modelReplicas, options.fleet.status(model.id)),
      // Provenance per replica: whether its node checked the weights against the origin's sha256 before start.
      replicas: modelReplicas.map((replica) => ({ ...viewReplica(replica), weights_verified: options.fleet.weightsVerified(replica.id) })),
      created_by: model.created_by,
      created_at: model.created_at,
      updated_by: model.updated_by,
      updated_at: model.updated_at,
    };
  };
  const actor = (c: Context<Env>) => `${c.get("principal").role}:${c.get("principal").name}`;

  app.get("/api/v1/models", (c) => {
    const unreadable = catalog.unreadableModels();
    return c.json({ data: catalog.list().map(view), ...(unreadable.length > 0 ? { unreadable } : {}) });
  });
  app.post("/api/v1/models", async (c) => c.json(view(await catalog.create(await jsonBody(c), actor(c))), 201));
  app.get("/api/v1/models/:name", (c) => c.json(view(catalog.get(c.req.param("name")))));
  app.patch("/api/v1/models/:name", async (c) => c.json(view(await catalog.update(c.req.param("name"), await jsonBody(c), actor(c)))));
  app.delete("/api/v1/models/:name", async (c) => {
    await catalog.delete(c.req.param("name"), actor(c));
    return c.json({ deleted: c.req.param("name") });
  });
  mountFleetRoutes(app, { fleet: () => options.fleet.leader(), catalog, replicas, audit: options.audit, joinToken: options.joinToken, actor });
  app.get("/api/v1/audit", async (c) => c.json({ data: await options.audit.read(parseWith(auditQuerySchema, c.req.query(), "audit query")) }));

  app.get("/api/v1/plan", async (c) => {
    if (options.planner === undefined) throw new BadRequestError("This server has no planner configured.");
    // The request's signal: a ctl that gives up stops the registry reads it started.
    return c.json(await options.planner(parseWith(planQuerySchema, c.req.query(), "plan query"), c.req.raw.signal));
  });

  if (options.mirror !== undefined) mountMirrorRoutes(app, options.mirror);
  if (options.serve !== undefined) mountServeRoutes(app, { ...options.serve, catalog, audit: options.audit, bodyLimits });

  if (options.usage !== undefined) mountUsageRoutes(app, { ...options.usage, keys, catalog });
  if (options.events !== undefined) mountEventsRoutes(app, options.events);
  if (options.notify !== undefined) mountNotifyRoutes(app, { ...options.notify, jsonBody, actor });
  if (options.cluster !== undefined) mountClusterRoutes(app, options.cluster);

  app.get("/api/v1/replicas", (c) => c.json({ data: replicas.all().map(viewReplica) }));

  app.get("/api/v1/keys", async (c) => c.json({ data: await keys.list() }));
  app.post("/api/v1/keys", async (c) => {
    const { key, info } = await keys.create(await jsonBody(c), actor(c));
    return c.json({ ...info, key }, 201);
  });
  app.get("/api/v1/keys/:ref", async (c) => {
    const info = await keys.get(c.req.param("ref"));
    return c.json({ ...info, usage: (await options.limits?.usageOf(info)) ?? null });
  });
  app.patch("/api/v1/keys/:ref", async (c) => c.json(await keys.update(c.req.param("ref"), await jsonBody(c), actor(c))));
  app.delete("/api/v1/keys/:ref", async (c) => c.json(await keys.revoke(c.req.param("ref"), actor(c))));

  return app;
}
