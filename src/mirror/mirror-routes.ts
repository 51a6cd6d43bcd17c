// The mirror's admin routes under /api/v1/mirror, mounted by the admin API behind its
// admin-key middleware: list files with state and progress plus disk use; start mirroring
// a repository (answered 202; the fetch runs in the background and GET shows progress);
// verify mirrored files again (202; GET .../verify/{id} shows progress and results); and
// delete a version, refused while catalog models use it unless forced. Every action is
// recorded in the audit trail with the admin key that asked for it. In a cluster, copying
// a version onto other servers is in replicate-routes.ts, mounted from here.
//
// The file server for nodes (GET /mirror/{model}/{version}/{file}) is in
// mirror-file-server.ts; it is re-exported here for the server's wiring.
import type { Hono } from "hono";
import { z } from "zod";
import { ConflictError, describeError, parseWith } from "../core/errors.ts";
import { JSON_API_BODY_LIMITS, readJsonRequest, type BodyLimits } from "../core/http.ts";
import { silentLogger, type Logger } from "../core/log.ts";
import type { Principal } from "../keys/key-service.ts";
import type { Registry } from "../registry/types.ts";
import type { MirrorPlanner } from "./artifact-choice.ts";
import { prepareMirrorFetch } from "./fetch-preparation.ts";
import { validateMirrorKey } from "./mirror-paths.ts";
import type { ModelsUsing } from "./mirror-users.ts";
import type { Mirror, MirrorFileView } from "./mirror.ts";
import { VerifyRuns } from "./verify-runs.ts";
import { mountReplicateRoutes } from "./replicate-routes.ts";
import type { AskServer } from "./server-asker.ts";

export {
  MIRROR_FILES_PREFIX,
  createMirrorFileHandler,
  isMirrorFileRequest,
  parseMirrorPath,
  parseRange,
  type MirrorFileHandlerOptions,
} from "./mirror-file-server.ts";
export type { MirrorPlanner } from "./artifact-choice.ts";
export type { AskServer, ServerRequest } from "./server-asker.ts";
export type { ReplicateRunView } from "./replicate-runs.ts";

/** The admin API's context variables: its middleware sets the verified principal. */
export type MirrorRoutesEnv = { Variables: { principal: Principal } };

export interface MirrorRoutesOptions {
  mirror: Mirror;
  /** Reads Hub repositories (a HubClient). */
  registry: Registry;
  /**
   * Plans a repository for this server's hardware; a fetch without quant or file takes its
   * recommendation. Without one, such a fetch takes the default (Q4_K_M).
   */
  planner?: MirrorPlanner;
  /** The catalog models that serve from a mirrored version (`catalogModelsUsing`); a delete of a used version is refused unless forced. */
  modelsUsing?: ModelsUsing;
  logger?: Logger;
  /** Base of relative local paths. Default: the server's working directory. */
  cwd?: string;
  /** Size and time limits of request bodies (default JSON_API_BODY_LIMITS). */
  bodyLimits?: BodyLimits;
  /**
   * In a cluster, how a replicate request for another server is passed to it with the
   * caller's Authorization (server-asker.ts). Default: over HTTP to its URL in the live list.
   */
  askServer?: AskServer;
}

const startSchema = z
  .object({
    repo: z.string().min(1),
    revision: z.string().min(1).optional(),
    quant: z.string().min(1).optional(),
    file: z.string().min(1).optional(),
    format: z.enum(["gguf", "safetensors"]).optional(),
    projector: z.union([z.boolean(), z.string().min(1)]).optional(),
    /** The mirror's name for the model; default `owner--name`. */
    model: z.string().min(1).optional(),
    /** The context (tokens) the plan picks an artifact for when neither quant nor file is given. */
    context: z.number().int().min(256).max(10_000_000).optional(),
  })
  .strict();

const verifySchema = z.strictObject({ model: z.string().min(1).optional(), version: z.string().min(1).optional() });

const forceSchema = z.enum(["true", "false", "1", "0"], { error: "must be true or false" }).optional();

/**
 * Adds the mirror's admin routes to the admin API app. Mount after the admin-key
 * middleware (it reads `c.get("principal")` for the audit trail); errors are thrown as
 * llmgw errors for the app's `onError` to render.
 *
 * - `GET /api/v1/mirror[?model=m]` → `{data: MirrorFileView[], versions: [...], disk}`
 * - `POST /api/v1/mirror` `{repo, revision?, quant?, file?, format?, projector?, model?, context?}` →
 *   202 `{model, version, repo, revision, set, picked: {by, artifact, reason}, files, totalBytes, progress}`
 * - `POST /api/v1/mirror/verify` `{model?, version?}` → 202 the run (`VerifyRunView`) and `progress`
 * - `GET /api/v1/mirror/verify/:id` → the run
 * - `DELETE /api/v1/mirror/:model/:version[?force=true]` → `{deleted: {model, version, files, bytes}}`;
 *   409 `mirror_version_in_use` naming the catalog models that use it, unless forced
 * - `POST /api/v1/mirror/replicate`, `GET /api/v1/mirror/replicate/:model/:version`: see replicate-routes.ts
 */
export function mountMirrorRoutes(app: Hono<MirrorRoutesEnv>, options: MirrorRoutesOptions): void {
  const { mirror } = options;
  const logger = options.logger ?? silentLogger();
  const verifications = new VerifyRuns({ mirror, logger });
  const actorOf = (principal: Principal) => `${principal.role}:${principal.name}`;
  const bodyLimits = options.bodyLimits ?? JSON_API_BODY_LIMITS;

  app.get("/api/v1/mirror", async (c) => {
    const model = c.req.query("model");
    const files = await mirror.list(model === undefined || model === "" ? {} : { model });
    const disk = await mirror.diskUsage();
    return c.json({ data: files, versions: summarizeVersions(files), disk });
  });

  app.post("/api/v1/mirror", async (c) => {
    const body = parseWith(startSchema, await readJsonRequest(c, bodyLimits));
    // Reading the repository stops when the client goes away; the fetch itself does not.
    const { model, plan, pick } = await prepareMirrorFetch({
      request: body,
      registry: options.registry,
      mirror,
      planner: options.planner,
      cwd: options.cwd,
      signal: c.req.raw.signal,
    });
    const fetch = { model, version: plan.version, repo: plan.repo, revision: plan.revision, files: plan.files };
    const actor = actorOf(c.get("principal"));
    await mirror.audit({
      actor,
      action: "mirror.fetch",
      target: `${model}/${plan.version}`,
      detail: { repo: plan.repo, revision: plan.revision, set: pick.artifact, picked_by: pick.by, files: plan.files.length, bytes: plan.totalBytes },
    });
    logger.info(
      { actor, model, version: plan.version, repo: plan.repo, set: pick.artifact, pickedBy: pick.by, files: plan.files.length, bytes: plan.totalBytes },
      "mirror fetch requested",
    );
    // The fetch outlives this request: its progress and outcome are in the rows (GET), and
    // Mirror.close() stops it when the server stops.
    mirror.fetchVersion(fetch).then(
      (summary) =>
        logger.info(
          { model, version: plan.version, complete: summary.complete, fetched: summary.fetched, skipped: summary.skipped, failed: summary.failed },
          "mirror fetch finished",
        ),
      (error: unknown) => logger.warn({ model, version: plan.version, err: describeError(error) }, "mirror fetch stopped"),
    );
    return c.json(
      {
        model,
        version: plan.version,
        repo: plan.repo,
        revision: plan.revision,
        set: pick.artifact,
        picked: pick,
        files: plan.files.map((file) => ({ path: file.path, size: file.size, sha256: file.sha256 })),
        totalBytes: plan.totalBytes,
        progress: `/api/v1/mirror?model=${encodeURIComponent(model)}`,
      },
      202,
    );
  });

  app.post("/api/v1/mirror/verify", async (c) => {
    const body = parseWith(verifySchema, await readJsonRequest(c, bodyLimits, { emptyAs: {} }));
    const run = await verifications.start({ model: body.model, version: body.version, actor: actorOf(c.get("principal")) });
    return c.json({ ...run, progress: `/api/v1/mirror/verify/${run.id}` }, 202);
  });

  app.get("/api/v1/mirror/verify/:id", (c) => c.json(verifications.get(c.req.param("id"))));

  mountReplicateRoutes(app, { mirror, askServer: options.askServer, logger, bodyLimits });

  app.delete("/api/v1/mirror/:model/:version", async (c) => {
    const model = validateMirrorKey("model", c.req.param("model"));
    const version = validateMirrorKey("version", c.req.param("version"));
    const forceText = parseWith(z.strictObject({ force: forceSchema }), c.req.query(), "delete query").force;
    const force = forceText === "true" || forceText === "1";
    const usedBy = options.modelsUsing === undefined ? [] : await options.modelsUsing(model, version);
    if (usedBy.length > 0 && !force) throw versionInUse(model, version, usedBy);
    const deleted = await mirror.deleteVersion(model, version, { actor: actorOf(c.get("principal")), force, usedBy });
    return c.json({ deleted: usedBy.length === 0 ? deleted : { ...deleted, forced: true, usedBy } });
  });
}

function versionInUse(model: string, version: string, usedBy: string[]): ConflictError {
  const names = usedBy.map((name) => `'${name}'`).join(", ");
  const one = usedBy.length === 1;
  return new ConflictError(
    `Version ${model}/${version} is in use by the catalog model${one ? "" : "s"} ${names}: deleting it would leave ${one ? "that model" : "them"} without weights. ` +
      `Remove or change ${one ? "that model" : "those models"} first, or delete anyway with --force (DELETE /api/v1/mirror/${model}/${version}?force=true).`,
    { code: "mirror_version_in_use" },
  );
}

/** One line per version: how many files, how many complete, bytes done of total, and an overall state. */
function summarizeVersions(files: MirrorFileView[]) {
  const versions = new Map<
    string,
    {
      model: string;
      version: string;
      repo: string;
      revision: string;
      files: number;
      complete: number;
      failed: number;
      bytesDone: number;
      bytesTotal: number;
      state: string;
    }
  >();
  for (const file of files) {
    const key = `${file.model}\u0000${file.version}`;
    const entry = versions.get(key) ?? {
      model: file.model,
      version: file.version,
      repo: file.repo,
      revision: file.revision,
      files: 0,
      complete: 0,
      failed: 0,
      bytesDone: 0,
      bytesTotal: 0,
      state: "",
    };
    entry.files += 1;
    if (file.state === "complete") entry.complete += 1;
    if (file.state === "failed") entry.failed += 1;
    entry.bytesDone += file.bytesDone;
    entry.bytesTotal += file.bytesTotal ?? 0;
    versions.set(key, entry);
  }
  return [...versions.values()].map((entry) => ({
    ...entry,
    state:
      entry.complete === entry.files
        ? "complete"
        : entry.failed > 0
          ? "failed"
          : files.some((f) => f.model === entry.model && f.version === entry.version && f.active)
            ? "fetching"
            : "pending",
  }));
}
