// Which models a key sees and may use: GET /v1/models (names, aliases and adapters' served
// names the key is allowed), and the check every request passes before anything else.
import { modelNotFound, type CatalogModel } from "../catalog/catalog.ts";
import { adapterServedName } from "../catalog/model-schema.ts";
import type { Principal } from "../keys/key-service.ts";
import type { ModelResolver } from "./gateway-ports.ts";

/** The OpenAI model list for `principal`. */
export function listModels(catalog: ModelResolver, principal: Principal) {
  const data = [];
  for (const model of catalog.list()) {
    const created = Math.floor(Date.parse(model.created_at) / 1000);
    for (const id of [model.name, ...model.definition.aliases, ...model.definition.adapters.map((a) => adapterServedName(model.name, a))]) {
      if (isAllowed(principal, model, id)) data.push({ id, object: "model", created, owned_by: "llmgw" });
    }
  }
  return { object: "list", data };
}

/**
 * A key restricted to some models gets the same 404 for a model it may not use as for one
 * that does not exist: a 403 would tell it which names exist (it could enumerate the
 * catalog). An administrator reads the key's allowed models with 'llmgw ctl key show'.
 */
export function assertAllowed(principal: Principal, model: CatalogModel, requested: string): void {
  if (!isAllowed(principal, model, requested)) throw modelNotFound(requested);
}

/**
 * Whether `name` names a model this key may use: what another wire format's spelling of a
 * name (Ollama's `name:latest`) is checked against, so that it tells a key nothing about
 * models it may not use.
 */
export function mayUse(catalog: ModelResolver, principal: Principal, name: string): boolean {
  const model = catalog.resolve(name);
  return model !== undefined && isAllowed(principal, model, name);
}

/** Allowed by the model's own name, or by the very name asked for (an alias, an adapter's name). */
function isAllowed(principal: Principal, model: CatalogModel, requested: string): boolean {
  const allowed = principal.allowedModels;
  return allowed === null || allowed.has(model.name) || allowed.has(requested);
}
