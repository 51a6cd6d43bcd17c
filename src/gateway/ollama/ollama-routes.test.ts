// Ollama's side routes on a real loopback server, against a small catalog and replica
// table: the model list filtered by the key's allowed models, show (and its 404 for a
// model the key may not use), ps listing only models with a ready replica, version, the
// 501 of the model-management routes, 404 and 405 in Ollama's shape.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { CatalogModel } from "../../catalog/catalog.ts";
import { modelDefinitionSchema } from "../../catalog/model-schema.ts";
import { sendError } from "../../core/http.ts";
import type { Replica } from "../../fleet/replica-table.ts";
import type { Principal } from "../../keys/key-service.ts";
import type { ModelResolver } from "../gateway-ports.ts";
import { NO_EXPIRY, OLLAMA_API_VERSION, isOllamaPath, ollamaSideRoutes } from "./ollama-routes.ts";

function model(name: string, definition: Record<string, unknown>): CatalogModel {
  return {
    id: `id-${name}`,
    name,
    definition: modelDefinitionSchema.parse(definition),
    created_by: "admin",
    created_at: "2026-01-01T00:00:00.000Z",
    updated_by: "admin",
    updated_at: "2026-02-01T00:00:00.000Z",
  };
}

const external = (extra: Record<string, unknown> = {}) => ({ profiles: [{ name: "up", engine: "external", url: "http://127.0.0.1:9/v1" }], ...extra });
const MODELS = [model("llama", external({ aliases: ["chat"], context_length: 4096 })), model("qwen", external()), model("secret", external())];

const catalog: ModelResolver = {
  list: () => MODELS,
  resolve: (name) => MODELS.find((m) => m.name === name || m.definition.aliases.includes(name)),
};

function replica(modelId: string, state: Replica["state"]): Replica {
  return {
    id: `${modelId}-${state}`,
    modelId,
    modelName: modelId,
    profile: "up",
    engine: "external",
    nodeIds: [],
    state,
    endpoint: null,
    engineKey: null,
    upstreamModel: modelId,
    weight: 1,
    slots: 1,
    attempt: 0,
    failures: 0,
    lastError: null,
    startedAt: null,
    readyAt: null,
  };
}

const REPLICAS: Record<string, Replica[]> = {
  "id-llama": [replica("id-llama", "ready")],
  "id-qwen": [replica("id-qwen", "starting")],
  "id-secret": [replica("id-secret", "ready")],
};

const find = ollamaSideRoutes({
  catalog,
  replicas: { forModel: (id) => REPLICAS[id] ?? [], onChange: () => () => undefined },
  maxBodyBytes: 1024,
  bodyTimeoutMs: 5_000,
});

/** Keys by the Authorization header the test sends: "all" may use every model, "some" llama (and its alias) and qwen. */
const PRINCIPALS: Record<string, Principal> = {
  all: { keyId: "all", name: "all", role: "client", allowedModels: null, expiresAt: null },
  some: { keyId: "some", name: "some", role: "client", allowedModels: new Set(["llama", "qwen"]), expiresAt: null },
};

let server: Server;
let base: string;

before(async () => {
  // What the gateway does for a side route: find it by path, verify the key, serve, render failures with its dialect.
  server = createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    const route = find(path);
    if (route === undefined) {
      res.writeHead(418).end();
      return;
    }
    const key = route.apiKey(req) ?? "";
    const principal = PRINCIPALS[key];
    assert.ok(principal, `a test key: ${key}`);
    route.serve(req, res, principal, path).catch((error: unknown) => sendError(req, res, error, route.errors));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(() => new Promise<void>((resolve) => server.close(() => resolve())));

async function call(method: string, path: string, key: string, body?: unknown) {
  const res = await fetch(base + path, {
    method,
    headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  return { status: res.status, type: res.headers.get("content-type"), headers: res.headers, body: (await res.json()) as Record<string, unknown> };
}

test("isOllamaPath: under /api/ but not llmgw's admin API", () => {
  assert.equal(isOllamaPath("/api/tags"), true);
  assert.equal(isOllamaPath("/api/chat?x=1"), true);
  assert.equal(isOllamaPath("/api/blobs/sha256:abc"), true);
  assert.equal(isOllamaPath("/api/v1"), false);
  assert.equal(isOllamaPath("/api/v1/models"), false);
  assert.equal(isOllamaPath("/api/v1?x=1"), false);
  assert.equal(isOllamaPath("/v1/models"), false);
  assert.equal(isOllamaPath("/api"), false);
});

test("the proxied routes and paths that are not Ollama's have no side route", () => {
  for (const path of ["/api/chat", "/api/generate", "/api/embed", "/api/embeddings", "/api/v1/models", "/v1/chat/completions"])
    assert.equal(find(path), undefined, path);
  assert.ok(find("/api/tags"));
  assert.ok(find("/api/nonsense"));
});

test("/api/tags lists every name the key may use, aliases included", async () => {
  const all = await call("GET", "/api/tags", "all");
  assert.equal(all.status, 200);
  assert.match(all.type ?? "", /application\/json/);
  const names = (body: Record<string, unknown>) => (body.models as Array<{ name: string }>).map((entry) => entry.name).sort();
  assert.deepEqual(names(all.body), ["chat", "llama", "qwen", "secret"]);
  const some = await call("GET", "/api/tags", "some");
  assert.deepEqual(names(some.body), ["chat", "llama", "qwen"]);
  const llama = (some.body.models as Array<Record<string, unknown>>).find((entry) => entry.name === "llama");
  assert.equal(llama?.model, "llama");
  assert.equal(llama?.modified_at, "2026-02-01T00:00:00.000Z");
  assert.match(llama?.digest as string, /^[0-9a-f]{64}$/);
});

test("/api/show answers for a usable model (by model, legacy name, or :latest); a model the key may not use is a 404 like an unknown one", async () => {
  const shown = await call("POST", "/api/show", "some", { model: "llama" });
  assert.equal(shown.status, 200);
  assert.deepEqual(shown.body.capabilities, ["completion", "tools"]);
  assert.equal((shown.body.model_info as Record<string, unknown>)["llmgw.context_length"], 4096);
  assert.equal((await call("POST", "/api/show", "some", { name: "chat" })).status, 200);
  assert.equal((await call("POST", "/api/show", "some", { model: "llama:latest" })).status, 200);
  const hidden = await call("POST", "/api/show", "some", { model: "secret" });
  const unknown = await call("POST", "/api/show", "some", { model: "nothing" });
  assert.equal(hidden.status, 404);
  assert.deepEqual(hidden.body, { error: "model 'secret' not found; GET /api/tags lists the models this key can use" });
  assert.equal(unknown.status, 404);
  assert.deepEqual(unknown.body, { error: "model 'nothing' not found; GET /api/tags lists the models this key can use" });
  const missing = await call("POST", "/api/show", "some", {});
  assert.equal(missing.status, 400);
  assert.match(missing.body.error as string, /'model'/);
});

test("/api/ps lists the usable models with a replica ready now", async () => {
  const all = await call("GET", "/api/ps", "all");
  const models = all.body.models as Array<Record<string, unknown>>;
  assert.deepEqual(models.map((entry) => entry.name).sort(), ["chat", "llama", "secret"]);
  const llama = models.find((entry) => entry.name === "llama");
  assert.equal(llama?.expires_at, NO_EXPIRY);
  assert.equal(llama?.size_vram, 0);
  assert.equal(llama?.context_length, 4096);
  const some = await call("GET", "/api/ps", "some");
  assert.deepEqual((some.body.models as Array<{ name: string }>).map((entry) => entry.name).sort(), ["chat", "llama"]);
});

test("/api/version says which Ollama API this follows", async () => {
  assert.deepEqual((await call("GET", "/api/version", "all")).body, { version: OLLAMA_API_VERSION });
});

test("model management answers 501, saying how models are added", async () => {
  for (const [method, path] of [
    ["POST", "/api/pull"],
    ["POST", "/api/push"],
    ["POST", "/api/create"],
    ["DELETE", "/api/delete"],
    ["POST", "/api/copy"],
    ["POST", "/api/blobs/sha256:abc"],
  ] as const) {
    const answer = await call(method, path, "all", { model: "llama" });
    assert.equal(answer.status, 501, path);
    assert.match(answer.body.error as string, /llmgw ctl model serve/);
    assert.match(answer.body.error as string, /\/api\/tags/);
  }
});

test("another /api/ path is a 404 naming the routes; a wrong method a 405", async () => {
  const unknown = await call("GET", "/api/nonsense", "all");
  assert.equal(unknown.status, 404);
  assert.match(unknown.body.error as string, /\/api\/chat/);
  const wrong = await call("POST", "/api/tags", "all", {});
  assert.equal(wrong.status, 405);
  assert.equal(wrong.headers.get("allow"), "GET");
  assert.equal(typeof wrong.body.error, "string");
});
