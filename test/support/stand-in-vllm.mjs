#!/usr/bin/env node
// A stand-in for `vllm serve`, for the adapter tests (vLLM needs a GPU and cannot run
// here). It stands for these real behaviours (reference/engines.md, "vLLM", and vLLM's
// OpenAI server where engines.md is silent):
//
// - `vllm serve DIR` with --host, --port, --served-model-name, --tensor-parallel-size,
//   --pipeline-parallel-size, --max-model-len, --distributed-executor-backend,
//   --attention-backend; the key from --api-key or the VLLM_API_KEY environment variable.
// - The HTTP API comes up only after the engine has initialised: while loading, nothing
//   listens on the port (a health check gets connection refused, not 503); then /health
//   answers 200 with an empty body.
// - The key guards only /v1 (and /v2, /inference): /v1/models without `Authorization:
//   Bearer KEY` answers 401 {"error":"Unauthorized"}; /health stays open.
// - /v1/models lists the served model name (the folder's path without one).
// - With --distributed-executor-backend ray (a replica over several nodes), it runs on the
//   Ray cluster at RAY_ADDRESS and cannot start when that does not answer.
// - Offline, a folder without config.json cannot be loaded: the process prints an error
//   and exits 1 (the real one would try the Hub and fail, since HF_HUB_OFFLINE=1); nor can
//   one that misses a shard its model.safetensors.index.json names.
// - POST /v1/chat/completions answers in OpenAI's shape (a stream of chat.completion.chunk
//   events with a final usage chunk when stream_options.include_usage, or one
//   chat.completion), always with the same short sentence: the stand-in has no model.
//
// What the tests control (environment variables, set by a wrapper script the test writes):
// - STAND_IN_RECORD: a file to which one JSON line {pid, argv, env} is appended at start.
// - STAND_IN_LOAD_MS: how long "loading" takes before the port is bound (default 300).
// - STAND_IN_NEVER_READY=1: never finishes loading (never listens).
// - STAND_IN_CRASH=default-attention: the engine dies during start-up with the default
//   attention backend (FlashAttention on a GPU older than Ampere), and starts with any
//   --attention-backend; STAND_IN_CRASH=always: it always dies during start-up.
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { join } from "node:path";

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

if (argv[0] !== "serve" || argv[1] === undefined || argv[1].startsWith("-")) {
  console.error("usage: vllm serve MODEL [options]");
  process.exit(2);
}
const modelDir = argv[1];
const host = flag("--host") ?? "0.0.0.0";
const port = Number(flag("--port") ?? "8000");
const served = flag("--served-model-name") ?? modelDir;
const maxModelLen = Number(flag("--max-model-len") ?? "4096");
const attentionBackend = flag("--attention-backend");
const key = flag("--api-key") ?? process.env.VLLM_API_KEY;
const loadMs = Number(process.env.STAND_IN_LOAD_MS ?? "300");
const crash = process.env.STAND_IN_CRASH ?? "";

console.log(`INFO api_server.py: vLLM API server version 0.0.0-stand-in`);
console.log(`INFO api_server.py: args: model=${modelDir} served_model_name=${served} attention_backend=${attentionBackend ?? "None"}`);

const json = (res, status, body) => {
  res.writeHead(status, { "content-type": "application/json" });
  res.end(JSON.stringify(body));
};

const REPLY = ["Hello", " from", " the", " stand-in", " vLLM", "."];

function answerChat(res, request) {
  const id = `chatcmpl-${process.pid}-${Date.now()}`;
  const created = Math.floor(Date.now() / 1000);
  const usage = { prompt_tokens: 8, completion_tokens: REPLY.length, total_tokens: 8 + REPLY.length };
  if (request.stream !== true) {
    return json(res, 200, {
      id,
      object: "chat.completion",
      created,
      model: served,
      choices: [{ index: 0, message: { role: "assistant", content: REPLY.join("") }, finish_reason: "stop" }],
      usage,
    });
  }
  res.writeHead(200, { "content-type": "text/event-stream" });
  const send = (chunk) => res.write(`data: ${JSON.stringify({ id, object: "chat.completion.chunk", created, model: served, ...chunk })}\n\n`);
  send({ choices: [{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }] });
  for (const piece of REPLY) send({ choices: [{ index: 0, delta: { content: piece }, finish_reason: null }] });
  send({ choices: [{ index: 0, delta: {}, finish_reason: "stop" }] });
  if (request.stream_options?.include_usage === true) send({ choices: [], usage });
  res.end("data: [DONE]\n\n");
}

function serve() {
  const server = http.createServer((req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    if (path === "/health") {
      res.writeHead(200);
      res.end();
      return;
    }
    if (key !== undefined && key !== "" && (path.startsWith("/v1") || path.startsWith("/v2") || path.startsWith("/inference"))) {
      if (req.headers.authorization !== `Bearer ${key}`) return json(res, 401, { error: "Unauthorized" });
    }
    if (path === "/v1/models") {
      return json(res, 200, {
        object: "list",
        data: [
          {
            id: served,
            object: "model",
            created: Math.floor(Date.now() / 1000),
            owned_by: "vllm",
            root: modelDir,
            parent: null,
            max_model_len: maxModelLen,
            permission: [],
          },
        ],
      });
    }
    if (path === "/v1/chat/completions" && req.method === "POST") {
      let body = "";
      req.on("data", (chunk) => (body += chunk));
      req.on("end", () => answerChat(res, JSON.parse(body)));
      return;
    }
    json(res, 404, { detail: "Not Found" });
  });
  server.listen(port, host, () => console.log(`INFO:     Uvicorn running on http://${host}:${port} (Press CTRL+C to quit)`));
}

if (process.env.STAND_IN_NEVER_READY === "1") {
  // Loading forever: the process lives and never binds its port.
  setInterval(() => console.log("INFO loader.py: still loading weights"), 1000);
} else {
  setTimeout(() => {
    if (!existsSync(join(modelDir, "config.json"))) {
      console.error(`OSError: ${modelDir} does not appear to have a file named config.json (HF_HUB_OFFLINE=${process.env.HF_HUB_OFFLINE ?? "0"})`);
      process.exit(1);
    }
    const index = join(modelDir, "model.safetensors.index.json");
    if (existsSync(index)) {
      const shards = [...new Set(Object.values(JSON.parse(readFileSync(index, "utf8")).weight_map ?? {}))];
      const missing = shards.find((shard) => !existsSync(join(modelDir, shard)));
      if (missing !== undefined) {
        console.error(`FileNotFoundError: ${join(modelDir, missing)} (named by model.safetensors.index.json)`);
        process.exit(1);
      }
    }
    if (crash === "always" || (crash === "default-attention" && attentionBackend === undefined)) {
      console.error("ERROR core.py: EngineCore failed to start.");
      console.error("RuntimeError: FlashAttention only supports Ampere GPUs or newer.");
      process.exit(1);
    }
    if (flag("--distributed-executor-backend") === "ray") {
      // Over several nodes, vLLM runs on the Ray cluster at RAY_ADDRESS; without it, it cannot start.
      const address = process.env.RAY_ADDRESS ?? "";
      const socket = net.connect(Number(address.slice(address.lastIndexOf(":") + 1)), address.slice(0, address.lastIndexOf(":")), () => {
        console.log(`INFO ray_utils.py: Connected to Ray cluster at ${address}`);
        serve();
      });
      socket.on("error", (error) => {
        console.error(`ConnectionError: could not connect to the Ray cluster at '${address}': ${error.message}`);
        process.exit(1);
      });
      return;
    }
    serve();
  }, loadMs);
}
