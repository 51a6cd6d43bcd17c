// /agent/v1: the agent protocol (agent-protocol.ts) over HTTP, for `llmgw agent`. Join
// takes the join token in its body; every other call takes the node credential as Bearer.
// Bodies are checked at the door (their shape here, inventory and labels by the fleet) and every failure
// leaves through renderError, so an agent reads the same error shape as everyone else.
import { Hono, type Context } from "hono";
import { z } from "zod";
import { bearerToken } from "../core/bearer.ts";
import { LlmgwError, NotFoundError, parseWith, renderError } from "../core/errors.ts";
import { readJsonRequest, type BodyLimits } from "../core/http.ts";
import type { Logger } from "../core/log.ts";
import { heartbeatBodySchema, joinBodySchema, type Assignments } from "./agent-protocol.ts";
import type { NodeInventory } from "./fleet-types.ts";

export const AGENT_API_PREFIX = "/agent/v1";
/** A poll waits at most this long, below common proxies' 60 s idle timeouts. */
const MAX_POLL_WAIT_MS = 30_000;

const pollQuerySchema = z.strictObject({
  version: z.string().max(100).optional(),
  wait_ms: z.coerce.number().int().min(0).max(MAX_POLL_WAIT_MS).default(25_000),
});

export function createAgentApi(options: { fleet: Assignments; logger: Logger; bodyLimits: BodyLimits }): Hono {
  const app = new Hono();
  const body = (c: Context) => readJsonRequest(c, options.bodyLimits);
  app.onError((error, c) => {
    if (!(error instanceof LlmgwError)) options.logger.error({ err: error, path: c.req.path }, "unexpected error in the agent API");
    const rendered = renderError(error);
    return c.json(rendered.body, rendered.status as 400, rendered.headers);
  });
  app.notFound((c) => {
    const rendered = renderError(
      new NotFoundError(`Unknown agent endpoint ${c.req.method} ${c.req.path}; is this agent newer than the server?`, { code: "unknown_endpoint" }),
    );
    return c.json(rendered.body, 404);
  });

  app.post(`${AGENT_API_PREFIX}/join`, async (c) => {
    const request = parseWith(joinBodySchema, await body(c), "join request");
    // Inventory and labels are checked by the fleet itself (for in-process agents too), once.
    const reply = await options.fleet.join({
      joinToken: request.join_token,
      name: request.name,
      address: request.address,
      inventory: request.inventory as NodeInventory,
      labels: request.labels,
    });
    return c.json(reply, 201);
  });
  app.post(`${AGENT_API_PREFIX}/heartbeat`, async (c) => {
    const report = parseWith(heartbeatBodySchema, await body(c), "heartbeat");
    const reply = await options.fleet.heartbeat(bearerToken(c.req.header("authorization")) ?? "", { ...report, inventory: report.inventory as NodeInventory });
    return c.json(reply);
  });
  app.get(`${AGENT_API_PREFIX}/assignments`, async (c) => {
    const query = parseWith(pollQuerySchema, c.req.query(), "assignments query");
    const set = await options.fleet.assignments(bearerToken(c.req.header("authorization")) ?? "", {
      knownVersion: query.version ?? null,
      waitMs: query.wait_ms,
      signal: c.req.raw.signal,
    });
    return c.json(set);
  });
  return app;
}
