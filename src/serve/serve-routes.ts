// The jobs' admin routes, mounted by the admin API behind its admin-key middleware. They
// only parse, check at the door and hand over to the runner; every job is audited with
// the admin key that asked for it.
//
// - `POST /api/v1/jobs/serve` → 202 the job (serve-request.ts checks the body first)
// - `POST /api/v1/jobs/update` `{model, revision?}` → 202 the job
// - `POST /api/v1/models/:name/rollback` → 202 an update job back to the previous revision
// - `GET /api/v1/jobs[?state&kind&model&limit]`, `GET /api/v1/jobs/:id`
// - `POST /api/v1/jobs/:id/cancel` → the job once stopped
// - `GET /api/v1/updates`, `POST /api/v1/updates/check` `{model?}`
import type { Context, Hono } from "hono";
import { z } from "zod";
import { ConflictError, parseWith } from "../core/errors.ts";
import { JSON_API_BODY_LIMITS, readJsonRequest, type BodyLimits } from "../core/http.ts";
import type { Catalog } from "../catalog/catalog.ts";
import type { Principal } from "../keys/key-service.ts";
import type { AuditTrail } from "../store/audit.ts";
import type { JobRunner } from "./jobs.ts";
import { checkServeRequest } from "./serve-request.ts";
import { checkUpdateRequest } from "./update-job.ts";
import type { UpdateChecker } from "./update-checker.ts";

type Env = { Variables: { principal: Principal } };

export interface ServeRoutesOptions {
  jobs: JobRunner;
  catalog: Catalog;
  updates: UpdateChecker;
  audit: AuditTrail;
  cwd?: string;
  bodyLimits?: BodyLimits;
}

const listQuerySchema = z.strictObject({
  state: z.enum(["queued", "running", "done", "waiting", "failed", "cancelled"]).optional(),
  kind: z.enum(["serve", "update"]).optional(),
  model: z.string().min(1).optional(),
  limit: z.coerce.number().int().min(1).max(1000).default(100),
});

const checkBodySchema = z.strictObject({ model: z.string().min(1).optional() });

export function mountServeRoutes(app: Hono<Env>, options: ServeRoutesOptions): void {
  const bodyLimits = options.bodyLimits ?? JSON_API_BODY_LIMITS;
  const actor = (c: Context<Env>) => `${c.get("principal").role}:${c.get("principal").name}`;
  /** One job at a time per model: two would race for its name or its revision. */
  const refuseBusy = async (model: string) => {
    const busy = await options.jobs.unfinishedFor(model);
    if (busy !== undefined) {
      throw new ConflictError(
        `Job ${busy.id} (${busy.kind}) is still working on '${model}'. Follow it with 'llmgw ctl job watch ${busy.id}', or cancel it with 'llmgw ctl job cancel ${busy.id}'.`,
        { code: "job_in_progress" },
      );
    }
  };

  app.post("/api/v1/jobs/serve", async (c) => {
    const request = await checkServeRequest(await readJsonRequest(c, bodyLimits), {
      catalog: options.catalog,
      ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
    });
    await refuseBusy(request.name);
    const job = await options.jobs.submit("serve", request as unknown as Record<string, unknown>, actor(c), null);
    await options.audit.record({ actor: actor(c), action: "job.serve", target: request.name, detail: { job: job.id, repo: request.repo } });
    return c.json(job, 202);
  });

  app.post("/api/v1/jobs/update", async (c) => {
    const request = checkUpdateRequest(await readJsonRequest(c, bodyLimits), options.catalog, false);
    await refuseBusy(request.model);
    const job = await options.jobs.submit("update", request, actor(c), request.model);
    await options.audit.record({
      actor: actor(c),
      action: "job.update",
      target: request.model,
      detail: { job: job.id, ...(request.revision === undefined ? {} : { revision: request.revision }) },
    });
    return c.json(job, 202);
  });

  app.post("/api/v1/models/:name/rollback", async (c) => {
    const request = checkUpdateRequest({ model: c.req.param("name") }, options.catalog, true);
    await refuseBusy(request.model);
    const job = await options.jobs.submit("update", request, actor(c), request.model);
    await options.audit.record({ actor: actor(c), action: "job.rollback", target: request.model, detail: { job: job.id, revision: request.revision } });
    return c.json(job, 202);
  });

  app.get("/api/v1/jobs", async (c) => {
    const query = parseWith(listQuerySchema, c.req.query(), "jobs query");
    return c.json({ data: await options.jobs.list(query) });
  });
  app.get("/api/v1/jobs/:id", async (c) => c.json(await options.jobs.get(c.req.param("id"))));
  app.post("/api/v1/jobs/:id/cancel", async (c) => {
    const job = await options.jobs.cancel(c.req.param("id"));
    await options.audit.record({ actor: actor(c), action: "job.cancel", target: job.model ?? job.id, detail: { job: job.id } });
    return c.json(job);
  });

  app.get("/api/v1/updates", async (c) => c.json({ data: await options.updates.list() }));
  app.post("/api/v1/updates/check", async (c) => {
    const body = parseWith(checkBodySchema, await readJsonRequest(c, bodyLimits, { emptyAs: {} }), "update check");
    return c.json({ data: await options.updates.checkNow(body.model) });
  });
}
