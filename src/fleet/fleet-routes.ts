// The fleet's part of the admin API: nodes (list, show, update its address, drain, undrain, remove, the join token),
// a model's health (replicas by state and node, parking, placement explanation) and
// unpark. Thin handlers over Fleet; every change is audited.
import type { Context, Hono } from "hono";
import { z } from "zod";
import type { Catalog } from "../catalog/catalog.ts";
import { parseWith } from "../core/errors.ts";
import { JSON_API_BODY_LIMITS, readJsonRequest, type BodyLimits } from "../core/http.ts";
import type { Principal } from "../keys/key-service.ts";
import type { AuditTrail } from "../store/audit.ts";
import { addressSchema } from "./agent-protocol.ts";
import type { Fleet } from "./fleet.ts";
import { modelHealthView, nodeView } from "./fleet-views.ts";
import type { ReplicaTable } from "./replica-table.ts";

type Env = { Variables: { principal: Principal } };

export interface FleetRoutesOptions {
  /** The leading server's Fleet (a standby forwards these routes to the leader: cluster/leader-forward.ts). */
  fleet: () => Fleet;
  catalog: Catalog;
  replicas: ReplicaTable;
  audit: AuditTrail;
  joinToken: () => string;
  actor: (c: Context<Env>) => string;
  bodyLimits?: BodyLimits;
}

/** What an admin may change of a node: its address (where the gateway reaches its engines). */
const nodeUpdateSchema = z.strictObject({ address: addressSchema });

export function mountFleetRoutes(app: Hono<Env>, options: FleetRoutesOptions): void {
  const { catalog, replicas, audit, actor } = options;
  const fleet = options.fleet;

  app.get("/api/v1/nodes", (c) =>
    c.json({
      data: fleet()
        .nodes.list()
        .map((node) => nodeView(node, fleet(), replicas)),
    }),
  );
  // Before /:name, so "join-token" is not taken for a node's name.
  app.get("/api/v1/nodes/join-token", async (c) => {
    await audit.record({ actor: actor(c), action: "node.join_token", target: "join.token", detail: {} });
    return c.json({ token: options.joinToken() });
  });
  app.get("/api/v1/nodes/:name", (c) => c.json(nodeView(fleet().nodes.byName(c.req.param("name")), fleet(), replicas)));
  // The only way a node's address changes after its join: an agent's report cannot (node-address.ts).
  app.patch("/api/v1/nodes/:name", async (c) => {
    const change = parseWith(nodeUpdateSchema, await readJsonRequest(c, options.bodyLimits ?? JSON_API_BODY_LIMITS), "node update");
    const { node, previous } = await fleet().updateAddress(c.req.param("name"), change.address);
    if (previous !== node.address)
      await audit.record({ actor: actor(c), action: "node.update", target: node.name, detail: { address: node.address, previous_address: previous } });
    return c.json({ ...nodeView(node, fleet(), replicas), previous_address: previous });
  });
  app.post("/api/v1/nodes/:name/drain", async (c) => {
    const node = await fleet().drain(c.req.param("name"));
    await audit.record({ actor: actor(c), action: "node.drain", target: node.name, detail: {} });
    return c.json(nodeView(node, fleet(), replicas));
  });
  app.post("/api/v1/nodes/:name/undrain", async (c) => {
    const node = await fleet().undrain(c.req.param("name"));
    await audit.record({ actor: actor(c), action: "node.undrain", target: node.name, detail: {} });
    return c.json(nodeView(node, fleet(), replicas));
  });
  app.delete("/api/v1/nodes/:name", async (c) => {
    const node = await fleet().remove(c.req.param("name"));
    await audit.record({ actor: actor(c), action: "node.remove", target: node.name, detail: { id: node.id } });
    return c.json({ removed: node.name });
  });

  app.get("/api/v1/models/:name/health", (c) => c.json(modelHealthView(catalog.get(c.req.param("name")), fleet(), replicas)));
  app.post("/api/v1/models/:name/unpark", async (c) => {
    const model = catalog.get(c.req.param("name"));
    const count = await fleet().unpark(model.name);
    await audit.record({ actor: actor(c), action: "model.unpark", target: model.name, detail: { replicas: count } });
    return c.json({ model: model.name, unparked: count });
  });
}
