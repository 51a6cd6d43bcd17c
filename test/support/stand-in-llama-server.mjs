#!/usr/bin/env node
// A stand-in for llama.cpp's `llama-server`, for the adapter tests (a GPU build of the
// real one cannot run here). It stands for these real behaviours (reference/engines.md,
// "llama.cpp llama-server", and llama.cpp tools/server where engines.md is silent):
//
// - It takes the flags llmgw passes: -m, --host, --port, --alias, --ctx-size, --parallel,
//   -ngl, --mmproj, -fa on|off|auto; the key from --api-key, --api-key-file or the
//   LLAMA_API_KEY environment variable.
// - The HTTP server is up at once and the model loads behind it: /health answers 503
//   {"error":{"code":503,"message":"Loading model","type":"unavailable_error"}} while
//   loading, then 200 {"status":"ok"}; other routes answer the same 503 while loading.
// - /health, /v1/health, /models and /v1/models are public (llama-server's public
//   endpoints); every other route needs `Authorization: Bearer KEY` when a key is set and
//   answers 401 {"error":{"code":401,"message":"Invalid API Key","type":"authentication_error"}}.
// - /v1/models lists the alias (or the model path without one); /props reports the
//   context and slots.
// - A model file that does not exist fails the load: the process prints an error and exits 1.
//
// What the tests control (environment variables, set by a wrapper script the test writes):
// - STAND_IN_RECORD: a file to which one JSON line {pid, argv, env} is appended at start.
// - STAND_IN_LOAD_MS: how long "loading" takes (default 300).
// - STAND_IN_NEVER_READY=1: never finishes loading.
// - STAND_IN_IGNORE_KEY_ENV=1: ignores LLAMA_API_KEY, like a build that does not read it
//   (it then runs without a key and serves everyone).
// - STAND_IN_CRASH=flash-attn: the load fails as on a GPU where flash attention does not
//   work, when flash attention is on (-fa on); STAND_IN_CRASH=always: the load always fails.
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import http from "node:http";

const argv = process.argv.slice(2);
const flag = (...names) => {
  let value;
  for (let i = 0; i < argv.length; i += 1) {
    const arg = argv[i];
    const equals = arg.indexOf("=");
    if (equals !== -1 && names.includes(arg.slice(0, equals))) value = arg.slice(equals + 1);
    else if (names.includes(arg)) value = argv[i + 1];
  }
  return value;
};

if (process.env.STAND_IN_RECORD) {
  appendFileSync(process.env.STAND_IN_RECORD, `${JSON.stringify({ pid: process.pid, argv, env: process.env })}\n`);
}

const modelPath = flag("-m", "--model");
const host = flag("--host") ?? "127.0.0.1";
const port = Number(flag("--port") ?? "8080");
const alias = flag("-a", "--alias");
const ctxSize = Number(flag("-c", "--ctx-size") ?? "4096");
const parallel = Number(flag("-np", "--parallel") ?? "4");
const flashAttention = flag("-fa", "--flash-attn") ?? "auto";
const keyFile = flag("--api-key-file");
const keys = [
  ...(flag("--api-key") ?? (process.env.STAND_IN_IGNORE_KEY_ENV === "1" ? undefined : process.env.LLAMA_API_KEY) ?? "").split(","),
  ...(keyFile ? readFileSync(keyFile, "utf8").split("\n") : []),
]
  .map((key) => key.trim())
  .filter((key) => key !== "");

if (!["on", "off", "auto", "1", "0", "-1", "enabled", "disabled"].includes(flashAttention)) {
  console.error(`error: unkown value for --flash-attn: '${flashAttention}'`);
  process.exit(1);
}
if (modelPath === undefined) {
  console.error("error: --model is required");
  process.exit(1);
}

const loadMs = Number(process.env.STAND_IN_LOAD_MS ?? "300");
const crash = process.env.STAND_IN_CRASH ?? "";
let loaded = false;

const json = (res, status, body) => {
  res.writeHead(status, { "content-type": "application/json; charset=utf-8" });
  res.end(JSON.stringify(body));
};
const PUBLIC = new Set(["/health", "/v1/health", "/models", "/v1/models"]);

const server = http.createServer((req, res) => {
  const path = (req.url ?? "/").split("?")[0];
  if (!loaded) {
    json(res, 503, { error: { code: 503, message: "Loading model", type: "unavailable_error" } });
    return;
  }
  if (keys.length > 0 && !PUBLIC.has(path)) {
    const auth = req.headers.authorization ?? "";
    if (!keys.some((key) => auth === `Bearer ${key}`)) {
      json(res, 401, { error: { code: 401, message: "Invalid API Key", type: "authentication_error" } });
      return;
    }
  }
  if (path === "/health" || path === "/v1/health") return json(res, 200, { status: "ok" });
  if (path === "/models" || path === "/v1/models") {
    const id = alias ?? modelPath;
    return json(res, 200, {
      models: [{ name: id, model: id, type: "model" }],
      object: "list",
      data: [{ id, object: "model", created: Math.floor(Date.now() / 1000), owned_by: "llamacpp", meta: { n_ctx_train: 4096 } }],
    });
  }
  if (path === "/props") {
    return json(res, 200, {
      default_generation_settings: { n_ctx: Math.floor(ctxSize / parallel) },
      total_slots: parallel,
      model_path: modelPath,
      model_alias: alias ?? modelPath,
    });
  }
  json(res, 404, { error: { code: 404, message: "File Not Found", type: "not_found_error" } });
});

server.listen(port, host, () => {
  console.log(`main: server is listening on http://${host}:${port} - starting the main loop`);
  console.log(`llama_model_loader: loading model from ${modelPath}`);
  if (process.env.STAND_IN_NEVER_READY === "1") return;
  setTimeout(() => {
    if (!existsSync(modelPath)) {
      console.error(`llama_model_load: error loading model: failed to open ${modelPath}: No such file or directory`);
      process.exit(1);
    }
    const flashOn = ["on", "1", "enabled"].includes(flashAttention);
    if (crash === "always" || (crash === "flash-attn" && flashOn)) {
      console.error(
        flashOn
          ? "llama_init_from_model: failed to initialize the context: flash attention is not supported on this device"
          : "llama_init_from_model: failed to initialize the context",
      );
      process.exit(1);
    }
    loaded = true;
    console.log("srv  update_slots: all slots are idle");
  }, loadMs);
});
