// The HTTP face of the bundled engine, on node:http: /health (llama-server's semantics:
// 503 while the model loads, 200 when ready, no key), the engine key on /v1/*, routing,
// body parsing and validation, JSON and SSE responses, and cancellation: a client that
// goes away aborts its generation, and shutdown aborts them all. A stream that cannot
// finish (shutdown, a llama.cpp error) ends with core/http's one failure event and
// closes, never with [DONE]. The generation itself is behind `TextGenerator`
// (llama-runner.ts); the wire shapes are in openai-wire.ts.
import { createHash, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { AuthenticationError, LlmgwError, NotFoundError, UnavailableError, parseWith } from "../../core/errors.ts";
import { DEFAULT_BODY_TIMEOUT_MS, SSE_DONE, methodNotAllowed, readLimitedBody, sendError, sendJson, sseData, startEventStream } from "../../core/http.ts";
import { parseJsonBody } from "../../core/json-body.ts";
import type { Logger } from "../../core/log.ts";
import { checkDimensions, embeddingList, embeddingRequestSchema, toEmbeddingJob } from "./embeddings-wire.ts";
import type { GenerationResult, TextGenerator } from "./llama-runner.ts";
import {
  chatChunk,
  chatCompletion,
  chatCompletionRequestSchema,
  completionRequestSchema,
  modelList,
  newIdentity,
  textCompletion,
  textCompletionChunk,
  toChatJob,
  toCompletionJob,
  timings,
  toolCallDelta,
  usage,
  type ChoiceResult,
} from "./openai-wire.ts";

export interface EngineServerOptions {
  /** The engine key every /v1 request must present as a Bearer token. */
  key: string;
  /** The model id /v1/models reports and responses carry. */
  modelName: string;
  logger: Logger;
  /** Largest accepted request body; chat histories are text, so 16 MiB is generous. */
  maxBodyBytes?: number;
  /** The whole request body must arrive within this (default 30 s); else 408. */
  bodyTimeoutMs?: number;
  now?: () => number;
}

export interface EngineServer {
  readonly server: Server;
  /** Switches /health to ready and lets /v1 requests through to the generator. */
  setGenerator(generator: TextGenerator): void;
  listen(host: string, port: number): Promise<AddressInfo>;
  /** Stops accepting, aborts running generations and waits (bounded) for them to end. */
  shutdown(graceMs?: number): Promise<void>;
}

// llama-server's exact /health bodies; supervisors poll for them (shared/reference/engines.md).
const HEALTH_LOADING = { error: { code: 503, message: "Loading model", type: "unavailable_error" } };
const HEALTH_OK = { status: "ok" };

async function readJson(req: IncomingMessage, maxBytes: number, timeoutMs: number): Promise<unknown> {
  const body = await readLimitedBody(req, { maxBytes, timeoutMs, tooLargeHint: "Send a shorter conversation." });
  return parseJsonBody(body.toString("utf8"));
}

export function createEngineServer(options: EngineServerOptions): EngineServer {
  const { logger, modelName } = options;
  const now = options.now ?? Date.now;
  const maxBodyBytes = options.maxBodyBytes ?? 16 * 1024 * 1024;
  const bodyTimeoutMs = options.bodyTimeoutMs ?? DEFAULT_BODY_TIMEOUT_MS;
  // Compare digests so the comparison takes the same time whatever the length of the guess.
  const expectedKey = createHash("sha256").update(options.key).digest();
  const startedAt = Math.floor(now() / 1000);
  let generator: TextGenerator | null = null;
  let closing = false;
  const running = new Map<AbortController, Promise<void>>();

  const authorized = (header: string | undefined): boolean => {
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header ?? "");
    if (!match?.[1]) return false;
    return timingSafeEqual(createHash("sha256").update(match[1]).digest(), expectedKey);
  };

  const requireGenerator = (): TextGenerator => {
    if (closing) throw new UnavailableError("The engine is shutting down; retry on another replica.", { retryAfterSeconds: 1 });
    if (!generator) throw new UnavailableError("The model is still loading; retry shortly.", { retryAfterSeconds: 1 });
    return generator;
  };

  async function handleChat(req: IncomingMessage, res: ServerResponse, signal: AbortSignal): Promise<void> {
    const body = parseWith(chatCompletionRequestSchema, await readJson(req, maxBodyBytes, bodyTimeoutMs));
    const job = toChatJob(body);
    const engine = requireGenerator();
    const identity = newIdentity("chat", modelName, now);
    if (!job.stream) {
      const result = await engine.chat(job.messages, { params: job.params, structure: job.structure, signal });
      if (finishAborted(result, res, signal)) return;
      sendJson(res, 200, chatCompletion(identity, choiceResult(result)));
      return;
    }
    const stream = sseWriter(res);
    const result = await engine.chat(job.messages, {
      params: job.params,
      structure: job.structure,
      signal,
      // Headers and the role chunk go out only once the request holds a sequence, so
      // validation failures (such as a prompt longer than the context) are still plain
      // HTTP errors with their status.
      onStart: () => stream.start(chatChunk(identity, { delta: { role: "assistant", content: "" }, finishReason: null }, job.includeUsage)),
      onText: (text, logprobs) => {
        if (text !== "")
          stream.event(chatChunk(identity, { delta: { content: text }, finishReason: null, ...(logprobs ? { logprobs } : {}) }, job.includeUsage));
      },
      onToolCall: (delta) => stream.event(chatChunk(identity, { delta: toolCallDelta(delta), finishReason: null }, job.includeUsage)),
    });
    if (finishAborted(result, res, signal)) return;
    stream.event(chatChunk(identity, { delta: {}, finishReason: result.finishReason, stopSequence: result.stopSequence }, job.includeUsage));
    if (job.includeUsage) stream.event(chatChunk(identity, { usage: usage(result.promptTokens, result.completionTokens) }, true));
    stream.done();
  }

  async function handleCompletion(req: IncomingMessage, res: ServerResponse, signal: AbortSignal): Promise<void> {
    const body = parseWith(completionRequestSchema, await readJson(req, maxBodyBytes, bodyTimeoutMs));
    const job = toCompletionJob(body);
    const engine = requireGenerator();
    const identity = newIdentity("completion", modelName, now);
    if (!job.stream) {
      const result = await engine.complete(job.prompt, { params: job.params, signal });
      if (finishAborted(result, res, signal)) return;
      sendJson(res, 200, textCompletion(identity, choiceResult(result)));
      return;
    }
    const stream = sseWriter(res);
    const result = await engine.complete(job.prompt, {
      params: job.params,
      signal,
      onStart: () => stream.start(null),
      onText: (text, logprobs) => {
        if (text !== "") stream.event(textCompletionChunk(identity, { text, finishReason: null, ...(logprobs ? { logprobs } : {}) }, job.includeUsage));
      },
    });
    if (finishAborted(result, res, signal)) return;
    stream.event(textCompletionChunk(identity, { text: "", finishReason: result.finishReason, stopSequence: result.stopSequence }, job.includeUsage));
    if (job.includeUsage) stream.event(textCompletionChunk(identity, { usage: usage(result.promptTokens, result.completionTokens) }, true));
    stream.done();
  }

  async function handleEmbeddings(req: IncomingMessage, res: ServerResponse, signal: AbortSignal): Promise<void> {
    const job = toEmbeddingJob(parseWith(embeddingRequestSchema, await readJson(req, maxBodyBytes, bodyTimeoutMs)));
    const embedder = requireGenerator().embedder;
    if (!embedder) throw new NotFoundError("This engine does not serve /v1/embeddings.");
    checkDimensions(job, embedder.embeddingSize);
    const batch = await embedder.embed(job.inputs, signal);
    sendJson(res, 200, embeddingList({ model: modelName, vectors: batch.vectors, encoding: job.encoding, promptTokens: batch.promptTokens }));
  }

  /**
   * After an aborted generation: a client that left gets nothing more; one that is still
   * there (the engine is shutting down) gets the abort reason as its error.
   */
  function finishAborted(result: GenerationResult, res: ServerResponse, signal: AbortSignal): boolean {
    if (!result.aborted && !signal.aborted) return false;
    if (res.destroyed || res.writableEnded) return true;
    throw signal.reason instanceof LlmgwError ? signal.reason : new UnavailableError("The generation was stopped.");
  }

  async function route(req: IncomingMessage, res: ServerResponse, signal: AbortSignal): Promise<void> {
    const path = new URL(req.url ?? "/", "http://engine").pathname;
    const method = req.method ?? "GET";
    if (path === "/health") {
      if (method !== "GET" && method !== "HEAD") throw methodNotAllowed(method, path, "GET");
      if (generator && !closing) sendJson(res, 200, HEALTH_OK);
      else sendJson(res, 503, HEALTH_LOADING);
      return;
    }
    if (!path.startsWith("/v1/")) throw new NotFoundError(`No route ${method} ${path} on this engine; it serves /health and /v1/*.`);
    if (!authorized(req.headers.authorization)) {
      throw new AuthenticationError("Missing or wrong engine key: send 'Authorization: Bearer <engine key>'.");
    }
    const routes: Record<string, { method: string; handle: () => Promise<void> | void }> = {
      // Like llama-server, every /v1 route answers 503 until the model is loaded.
      "/v1/models": {
        method: "GET",
        handle: () => {
          requireGenerator();
          sendJson(res, 200, modelList(modelName, startedAt));
        },
      },
      "/v1/chat/completions": { method: "POST", handle: () => handleChat(req, res, signal) },
      "/v1/completions": { method: "POST", handle: () => handleCompletion(req, res, signal) },
      "/v1/embeddings": { method: "POST", handle: () => handleEmbeddings(req, res, signal) },
    };
    const target = routes[path];
    if (!target)
      throw new NotFoundError(`No route ${method} ${path}; this engine serves /v1/models, /v1/chat/completions, /v1/completions and /v1/embeddings.`);
    if (method !== target.method) throw methodNotAllowed(method, path, target.method);
    await target.handle();
  }

  const server = createServer((req, res) => {
    const started = now();
    const controller = new AbortController();
    // 'close' on the response before it finished means the client went away.
    res.on("close", () => {
      if (!res.writableFinished) controller.abort(new Error("client closed the connection"));
    });
    const work = route(req, res, controller.signal)
      .catch((error: unknown) => {
        if (!(error instanceof LlmgwError)) logger.error({ err: error, path: req.url }, "engine request failed");
        else if (res.headersSent) logger.warn({ code: error.code, path: req.url }, "engine stream ended with an error");
        // Before the headers: the OpenAI error with its status. After them: the stream's
        // failure event and a closed connection, never [DONE].
        if (!res.destroyed) sendError(req, res, error);
      })
      .finally(() => {
        logger.debug({ method: req.method, path: req.url, status: res.statusCode, ms: now() - started }, "engine request");
      });
    // Shutdown waits for the response to be closed, not only handled, so that a stream's
    // failure event has left before the process exits.
    const closed = new Promise<void>((resolve) => {
      if (res.closed) resolve();
      else res.once("close", () => resolve());
    });
    const settled = Promise.all([work, closed]).then(() => {
      running.delete(controller);
    });
    running.set(controller, settled);
  });
  // Generations can be long; the gateway bounds them, not node's default request timeout.
  server.requestTimeout = 0;

  return {
    server,
    setGenerator(value) {
      generator = value;
    },
    listen(host, port) {
      return new Promise((resolve, reject) => {
        const onError = (error: Error) => reject(error);
        server.once("error", onError);
        server.listen(port, host, () => {
          server.off("error", onError);
          resolve(server.address() as AddressInfo);
        });
      });
    },
    async shutdown(graceMs = 3000) {
      closing = true;
      server.close();
      server.closeIdleConnections();
      const reason = new UnavailableError("The engine is shutting down; retry on another replica.", { retryAfterSeconds: 1 });
      for (const controller of running.keys()) controller.abort(reason);
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        Promise.allSettled([...running.values()]),
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, graceMs);
          timer.unref();
        }),
      ]);
      clearTimeout(timer);
      server.closeAllConnections();
    },
  };
}

function choiceResult(result: GenerationResult): ChoiceResult {
  return {
    text: result.text,
    toolCalls: result.toolCalls,
    finishReason: result.finishReason,
    stopSequence: result.stopSequence,
    usage: usage(result.promptTokens, result.completionTokens),
    timings: timings(result.promptTokens, result.cachedTokens, result.completionTokens),
    ...(result.logprobs ? { logprobs: result.logprobs } : {}),
  };
}

interface SseWriter {
  /** Sends the status and headers, and a first event when given one. */
  start(first: unknown): void;
  event(payload: unknown): void;
  done(): void;
}

function sseWriter(res: ServerResponse): SseWriter {
  return {
    start(first) {
      if (res.headersSent) return;
      // Marks the response as an event stream, so a failure after this point ends it with
      // core/http's failure event rather than a reset.
      startEventStream(res);
      if (first !== null) res.write(sseData(first));
      else res.flushHeaders();
    },
    event(payload) {
      if (!res.headersSent) this.start(null);
      if (!res.destroyed) res.write(sseData(payload));
    },
    done() {
      if (!res.headersSent) this.start(null);
      res.end(SSE_DONE);
    },
  };
}
