// The admin routes that copy a mirrored version onto other servers of a cluster, so each
// can serve it from its own disk (`llmgw ctl mirror replicate MODEL VERSION --to SERVER|all`).
// Copies run on the server that receives them (it pulls from a holder), so a request for
// another server is passed to it (`AskServer`) with the caller's key, and that server
// starts the copy, answers with the run, and audits it as `mirror.replicate`.
//
// - `POST /api/v1/mirror/replicate` `{model, version, to}` → 202 `{model, version, to, runs}`:
//   one run per server that copies (`ReplicateRunView`). `to` is a server's name or `all`:
//   every running server that does not hold every file of the version (200 with no runs
//   when they all do). Refused when the version is not complete, or a file has no running
//   holder; 404 for a server the cluster does not know; 503 for one that is not running.
//   Asking again while a run goes joins it.
// - `GET /api/v1/mirror/replicate/{model}/{version}[?server=NAME]` → the last run of that
//   version on that server (default: this one).
import type { Hono } from "hono";
import { z } from "zod";
import { ConflictError, NotFoundError, UnavailableError, describeError, parseWith } from "../core/errors.ts";
import { readJsonRequest, type BodyLimits } from "../core/http.ts";
import type { Logger } from "../core/log.ts";
import { FORWARDED_BY_HEADER } from "../cluster/leader-forward.ts";
import type { Principal } from "../keys/key-service.ts";
import type { MirrorCluster } from "./mirror-cluster.ts";
import { validateMirrorKey } from "./mirror-paths.ts";
import type { Mirror } from "./mirror.ts";
import { ReplicateRuns, type ReplicateRunView } from "./replicate-runs.ts";
import { httpServerAsker, type AskServer } from "./server-asker.ts";

const replicateSchema = z.strictObject({ model: z.string().min(1), version: z.string().min(1), to: z.string().min(1) });

export interface ReplicateRoutesOptions {
  mirror: Mirror;
  /** How a request is passed to another server; default `httpServerAsker` (the live URL, over HTTP). */
  askServer?: AskServer | undefined;
  logger: Logger;
  bodyLimits: BodyLimits;
}

type Env = { Variables: { principal: Principal } };

export function mountReplicateRoutes(app: Hono<Env>, options: ReplicateRoutesOptions): void {
  const { mirror, logger } = options;
  const cluster = mirror.cluster;
  const runs = cluster === null ? null : new ReplicateRuns({ mirror, server: cluster.self, logger });
  const ask = options.askServer ?? (cluster === null ? undefined : httpServerAsker({ cluster }));
  const clustered = (): { cluster: MirrorCluster; runs: ReplicateRuns; ask: AskServer } => {
    if (cluster === null || runs === null || ask === undefined) {
      throw new ConflictError("This server is not part of a cluster: its mirror is the only one, so there is no other server to copy to or from.", {
        code: "mirror_not_clustered",
      });
    }
    return { cluster, runs, ask };
  };

  app.post("/api/v1/mirror/replicate", async (c) => {
    const body = parseWith(replicateSchema, await readJsonRequest(c, options.bodyLimits));
    const { cluster, runs, ask } = clustered();
    const model = validateMirrorKey("model", body.model);
    const version = validateMirrorKey("version", body.version);
    const principal = c.get("principal");
    const actor = `${principal.role}:${principal.name}`;
    const authorization = c.req.header("authorization") ?? "";
    if (body.to === cluster.self) {
      return c.json({ model, version, to: body.to, runs: [await runs.start({ model, version, actor })] }, 202);
    }
    // A request passed on by another server is for this one: passing it on again could loop.
    const passedBy = c.req.header(FORWARDED_BY_HEADER);
    if (passedBy !== undefined) {
      throw new ConflictError(
        `Server '${passedBy}' asked this server ('${cluster.self}') to copy ${model}/${version} to '${body.to}'; each server copies only to itself. Check the servers' names with 'llmgw ctl cluster status'.`,
        {
          code: "mirror_wrong_server",
        },
      );
    }
    const askTo = (name: string) => ask(name, { method: "POST", path: "/api/v1/mirror/replicate", body: { model, version, to: name } }, authorization);
    if (body.to === "all") {
      const targets = await replicationTargets(mirror, cluster, model, version);
      const started = await Promise.all(
        targets.map(async (name): Promise<ReplicateRunView> => {
          try {
            if (name === cluster.self) return await runs.start({ model, version, actor });
            return firstRun(await askTo(name), name, model, version);
          } catch (error) {
            logger.warn({ model, version, server: name, err: describeError(error) }, "a server could not start a mirror replication");
            return refusedRun(name, model, version, describeError(error));
          }
        }),
      );
      return c.json({ model, version, to: "all", runs: started }, started.length === 0 ? 200 : 202);
    }
    const target = await cluster.server(body.to);
    if (!target.known) {
      throw new NotFoundError(`No server named '${body.to}' is in this cluster; 'llmgw ctl cluster status' lists them.`, {
        code: "mirror_server_not_found",
        param: "to",
      });
    }
    if (!target.live) {
      throw new UnavailableError(
        `The server '${body.to}' is not running${target.lastSeen === null ? "" : ` (last seen ${target.lastSeen})`}. Start it, then replicate again.`,
        {
          code: "server_not_running",
          retryAfterSeconds: 5,
        },
      );
    }
    return c.json({ model, version, to: body.to, runs: [firstRun(await askTo(body.to), body.to, model, version)] }, 202);
  });

  app.get("/api/v1/mirror/replicate/:model/:version", async (c) => {
    const { cluster, runs, ask } = clustered();
    const model = validateMirrorKey("model", c.req.param("model"));
    const version = validateMirrorKey("version", c.req.param("version"));
    const server = c.req.query("server");
    if (server === undefined || server === "" || server === cluster.self) return c.json(runs.get(model, version));
    if (c.req.header(FORWARDED_BY_HEADER) !== undefined) {
      throw new ConflictError(`This server is '${cluster.self}', not '${server}'; check the servers' names with 'llmgw ctl cluster status'.`, {
        code: "mirror_wrong_server",
      });
    }
    const path = `/api/v1/mirror/replicate/${encodeURIComponent(model)}/${encodeURIComponent(version)}`;
    return c.json((await ask(server, { method: "GET", path }, c.req.header("authorization") ?? "")) as ReplicateRunView);
  });
}

/** The running servers that do not hold every file of a version (by the holder rows). */
async function replicationTargets(mirror: Mirror, cluster: MirrorCluster, model: string, version: string): Promise<string[]> {
  const files = (await mirror.list({ model })).filter((file) => file.version === version);
  if (files.length === 0)
    throw new NotFoundError(`The mirror has no version ${model}/${version}. GET /api/v1/mirror lists what it holds.`, { code: "mirror_version_not_found" });
  const live = await cluster.liveServers();
  return live.map((server) => server.name).filter((name) => files.some((file) => !file.holders.includes(name)));
}

function firstRun(answer: unknown, server: string, model: string, version: string): ReplicateRunView {
  const run = (answer as { runs?: ReplicateRunView[] } | null)?.runs?.[0];
  return run ?? refusedRun(server, model, version, `The server '${server}' gave no run in its answer.`);
}

/** A server that could not start: a run that failed at once, with the reason. */
function refusedRun(server: string, model: string, version: string, error: string): ReplicateRunView {
  const now = new Date().toISOString();
  return {
    server,
    model,
    version,
    state: "failed",
    startedAt: now,
    finishedAt: now,
    totalBytes: 0,
    bytesDone: 0,
    copied: 0,
    alreadyHeld: 0,
    failed: 0,
    files: [],
    error,
  };
}
