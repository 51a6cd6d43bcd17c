// The /v1 hot path: authenticate the key, read and check the body, resolve the model or
// alias, pick a ready replica (fewest requests in flight), and proxy the request with
// undici on Node streams. Streams pass through chunk by chunk; a client that goes away
// cancels the upstream; a replica that refuses or fails before its first byte is replaced
// by another. Every failure leaves in OpenAI's error shape.
import type { IncomingMessage, ServerResponse } from "node:http";
import { performance } from "node:perf_hooks";
import type { z } from "zod";
import {
  BadRequestError,
  UpstreamError,
  LlmgwError,
  NotFoundError,
  PayloadTooLargeError,
  PermissionDeniedError,
  UnavailableError,
  describeError,
  parseWith,
  renderError,
} from "../core/errors.ts";
import { bearerToken } from "../core/bearer.ts";
import { parseJsonBody } from "../core/json-body.ts";
import type { Logger } from "../core/log.ts";
import { modelNotFound, type Catalog, type CatalogModel } from "../catalog/catalog.ts";
import type { KeyService, Principal } from "../keys/key-service.ts";
import type { Replica, ReplicaTable } from "../fleet/replica-table.ts";
import { chatCompletionSchema, completionSchema, embeddingSchema, type GatewayRequestBody } from "./request-schemas.ts";
import { classifyUpstreamFailure, isRetryableStatus, type UpstreamPools } from "./upstream.ts";
import { UsageTap } from "./usage-tap.ts";
import type { UsageRecorder } from "./usage-recorder.ts";

export interface GatewayOptions {
  catalog: Catalog;
  keys: KeyService;
  replicas: ReplicaTable;
  pools: UpstreamPools;
  usage?: UsageRecorder;
  logger: Logger;
  /** Largest request body accepted, in bytes. */
  maxBodyBytes?: number;
  /** How many replicas one request may try before giving up. */
  maxAttempts?: number;
}

interface ProxyRoute {
  path: string;
  schema: z.ZodType<GatewayRequestBody>;
}

const PROXY_ROUTES = new Map<string, ProxyRoute>([
  ["/v1/chat/completions", { path: "/v1/chat/completions", schema: chatCompletionSchema as z.ZodType<GatewayRequestBody> }],
  ["/v1/completions", { path: "/v1/completions", schema: completionSchema as z.ZodType<GatewayRequestBody> }],
  ["/v1/embeddings", { path: "/v1/embeddings", schema: embeddingSchema as z.ZodType<GatewayRequestBody> }],
]);

/**
 * Upstream response headers passed to the client. Everything else stays behind: hop-by-hop
 * headers, and what an external server says about itself (cookies, auth challenges, CORS,
 * its own rate limits) which would mislead a client of the gateway.
 */
const FORWARDED_HEADERS = new Set(["content-type", "content-length", "content-encoding", "cache-control", "retry-after", "retry-after-ms", "x-request-id"]);

/** Usage status of an answer cut short: nginx's "client closed request", and a bad gateway. */
const STATUS_CLIENT_GONE = 499;
const STATUS_UPSTREAM_FAILED = 502;

function forwardedHeaders(headers: Record<string, string | string[] | undefined>): Record<string, string | string[]> {
  const kept: Record<string, string | string[]> = {};
  for (const name in headers) {
    const value = headers[name];
    if (value !== undefined && (FORWARDED_HEADERS.has(name) || name.startsWith("openai-"))) kept[name] = value;
  }
  return kept;
}

export const DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024;
const COOLDOWN_MS = 5000;

export class Gateway {
  private readonly inFlight = new Map<string, number>();
  /** Replicas that just failed at the transport level are tried last for a few seconds. */
  private readonly coolingUntil = new Map<string, number>();
  private rotation = 0;
  private readonly maxBodyBytes: number;
  private readonly maxAttempts: number;

  /** The origin each replica was last seen at, so a pool no replica uses any more is closed. */
  private readonly originOf = new Map<string, string>();
  private readonly unsubscribe: () => void;

  constructor(private readonly options: GatewayOptions) {
    this.maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
    this.maxAttempts = options.maxAttempts ?? 3;
    this.unsubscribe = options.replicas.onChange((replica, removed) => this.forget(replica, removed));
  }

  /** Stops following the replica table (the pools themselves are closed by their owner). */
  close(): void {
    this.unsubscribe();
  }

  /**
   * Drops what the gateway keeps per replica when the replica goes away or moves (an
   * engine restart gets a new port): its counters, and its connection pool once no other
   * replica uses that origin.
   */
  private forget(replica: Replica, removed: boolean): void {
    const previous = this.originOf.get(replica.id);
    const current = removed ? undefined : replica.endpoint?.origin;
    if (removed) {
      this.inFlight.delete(replica.id);
      this.coolingUntil.delete(replica.id);
    }
    if (current === undefined) this.originOf.delete(replica.id);
    else this.originOf.set(replica.id, current);
    if (previous !== undefined && previous !== current && ![...this.originOf.values()].includes(previous)) {
      void this.options.pools.release(previous);
    }
  }

  /** Requests in flight per replica id (for tests and, later, metrics). */
  inFlightOf(replicaId: string): number {
    return this.inFlight.get(replicaId) ?? 0;
  }

  /** Node request listener for every path under /v1. */
  handle = (req: IncomingMessage, res: ServerResponse): void => {
    this.serve(req, res).catch((error: unknown) => this.fail(req, res, error));
  };

  private async serve(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const started = performance.now();
    const pathname = pathOf(req.url);
    const route = PROXY_ROUTES.get(pathname);
    if (pathname === "/v1/models" && req.method === "GET") {
      const principal = await this.options.keys.verify(bearerToken(req.headers.authorization));
      sendJson(res, 200, this.listModels(principal));
      return;
    }
    if (route === undefined) {
      throw new NotFoundError(`Unknown endpoint ${req.method} ${pathname}. llmgw serves GET /v1/models and POST /v1/chat/completions, /v1/completions, /v1/embeddings.`, { code: "unknown_endpoint" });
    }
    if (req.method !== "POST") {
      throw new LlmgwError({ message: `${pathname} takes POST, not ${req.method}.`, code: "method_not_allowed", status: 405, headers: { allow: "POST" } });
    }
    const principal = await this.options.keys.verify(bearerToken(req.headers.authorization));
    const raw = await readBody(req, this.maxBodyBytes);
    const body = parseWith(route.schema, parseJsonBody(raw.toString("utf8")), "request");
    const model = this.options.catalog.resolve(body.model);
    if (model === undefined) throw modelNotFound(body.model);
    assertAllowed(principal, model, body.model);
    await this.proxy({ req, res, route, raw, body, model, principal, started });
  }

  private listModels(principal: Principal) {
    const data = [];
    for (const model of this.options.catalog.list()) {
      const created = Math.floor(Date.parse(model.created_at) / 1000);
      for (const id of [model.name, ...model.definition.aliases]) {
        if (isAllowed(principal, model, id)) data.push({ id, object: "model", created, owned_by: "llmgw" });
      }
    }
    return { object: "list", data };
  }

  private async proxy(call: {
    req: IncomingMessage;
    res: ServerResponse;
    route: ProxyRoute;
    raw: Buffer;
    body: GatewayRequestBody;
    model: CatalogModel;
    principal: Principal;
    started: number;
  }): Promise<void> {
    const { req, res, route, body, model, principal, started } = call;
    const abort = new AbortController();
    const onClose = () => {
      if (!res.writableFinished) abort.abort();
    };
    res.on("close", onClose);
    const tried = new Set<string>();
    const stream = body.stream === true;
    // The body is re-serialised only when a replica knows the model by another name, and
    // then once per name, not once per attempt.
    const payloads = new Map<string, Buffer>([[body.model, call.raw]]);
    const payloadFor = (upstreamModel: string) => {
      let payload = payloads.get(upstreamModel);
      if (payload === undefined) {
        payload = Buffer.from(JSON.stringify({ ...body, model: upstreamModel }));
        payloads.set(upstreamModel, payload);
      }
      return payload;
    };
    let lastFailure: LlmgwError | undefined;
    try {
      for (let attempt = 0; attempt < this.maxAttempts; attempt += 1) {
        const replica = this.choose(model, tried);
        if (replica === undefined) break;
        tried.add(replica.id);
        const payload = payloadFor(replica.upstreamModel);
        const more = this.hasAlternative(model, tried) && attempt + 1 < this.maxAttempts;
        this.inFlight.set(replica.id, (this.inFlight.get(replica.id) ?? 0) + 1);
        let released = false;
        const release = () => {
          if (released) return;
          released = true;
          this.inFlight.set(replica.id, (this.inFlight.get(replica.id) ?? 1) - 1);
        };
        let upstream;
        try {
          upstream = await this.options.pools.get(replica.endpoint!.origin).request({
            path: replica.endpoint!.basePath + route.path,
            method: "POST",
            headers: upstreamHeaders(req, replica, payload.length),
            body: payload,
            signal: abort.signal,
          });
        } catch (error) {
          release();
          if (abort.signal.aborted) return;
          lastFailure = classifyUpstreamFailure(error, `${model.name}/${replica.profile}`);
          if (lastFailure.retryable) this.coolingUntil.set(replica.id, Date.now() + COOLDOWN_MS);
          this.options.logger.warn({ model: model.name, replica: replica.id, err: describeError(error) }, "replica failed before answering");
          if (lastFailure.retryable && more) continue;
          throw lastFailure;
        }
        const refusedUs = upstream.statusCode === 401 || upstream.statusCode === 403;
        if ((isRetryableStatus(upstream.statusCode) && more) || refusedUs) {
          // Nothing has reached the client yet, so another replica can still answer.
          upstream.body.resume();
          upstream.body.on("error", () => undefined);
          release();
          this.options.logger.warn({ model: model.name, replica: replica.id, status: upstream.statusCode }, "replica did not answer; trying another");
          if (refusedUs) {
            // The replica refused llmgw's own credentials (a wrong external api_key, an engine
            // restarted with another key). Passing its 401 on would tell the client that the
            // client's key is wrong, so it becomes a 502 that names the profile.
            lastFailure = new UpstreamError(
              `Replica ${model.name}/${replica.profile} refused llmgw's credentials (HTTP ${upstream.statusCode}). An administrator should check the profile's api_key.`,
              { code: "upstream_auth_failed" },
            );
            if (more) continue;
            throw lastFailure;
          }
          continue;
        }
        const includeUsage = (body.stream_options as { include_usage?: unknown } | null | undefined)?.include_usage === true;
        await this.relay({ res, upstream, replica, model, principal, started, stream, includeUsage, path: route.path, release });
        return;
      }
      throw lastFailure ?? this.noReadyReplica(model);
    } finally {
      res.off("close", onClose);
    }
  }

  /** Copies the upstream response to the client and records usage when it ends. */
  private relay(call: {
    res: ServerResponse;
    upstream: { statusCode: number; headers: Record<string, string | string[] | undefined>; body: NodeJS.ReadableStream & { destroy(error?: Error): void } };
    replica: Replica;
    model: CatalogModel;
    principal: Principal;
    started: number;
    stream: boolean;
    includeUsage: boolean;
    path: string;
    release: () => void;
  }): Promise<void> {
    const { res, upstream, replica, model, principal, started, stream, includeUsage, path, release } = call;
    res.writeHead(upstream.statusCode, forwardedHeaders(upstream.headers));
    // A stream carries usage only when the client asked for it; without that, keep nothing.
    const tap = stream && !includeUsage ? null : new UsageTap(stream);
    let firstByteAt: number | null = null;
    return new Promise<void>((resolve) => {
      let settled = false;
      /** `outcome`: the upstream status when the answer was relayed whole, else why not. */
      const finish = (outcome: "completed" | "client-gone" | "upstream-failed") => {
        if (settled) return;
        settled = true;
        release();
        const usage = tap?.usage() ?? null;
        this.options.usage?.record({
          at: new Date(performance.timeOrigin + started).toISOString(),
          key_id: principal.keyId,
          model: model.name,
          replica_id: replica.id,
          endpoint: path,
          prompt_tokens: usage?.prompt_tokens ?? null,
          completion_tokens: usage?.completion_tokens ?? null,
          ttft_ms: firstByteAt === null ? null : Math.round(firstByteAt - started),
          duration_ms: Math.round(performance.now() - started),
          status: outcome === "completed" ? upstream.statusCode : outcome === "client-gone" ? STATUS_CLIENT_GONE : STATUS_UPSTREAM_FAILED,
          stream: stream ? 1 : 0,
        });
        resolve();
      };
      upstream.body.on("data", (chunk: Buffer) => {
        if (firstByteAt === null) firstByteAt = performance.now();
        tap?.push(chunk);
        if (!res.write(chunk)) {
          upstream.body.pause();
          res.once("drain", () => upstream.body.resume());
        }
      });
      upstream.body.on("end", () => {
        res.end();
        finish("completed");
      });
      upstream.body.on("error", (error: Error) => {
        // After the first byte nothing can be retried: end the response so the client
        // sees a truncated answer rather than a hang.
        if (!res.destroyed) {
          this.options.logger.warn({ model: model.name, replica: replica.id, err: describeError(error) }, "upstream failed mid-response");
          res.destroy(error);
        }
        finish("upstream-failed");
      });
      res.on("close", () => {
        if (!res.writableFinished) {
          upstream.body.destroy();
          finish("client-gone");
        }
      });
    });
  }

  /**
   * The least busy ready replica not yet tried (in-flight requests over weight). Ties are
   * broken by a rotating start so equal replicas share sequential traffic evenly; a
   * replica that just refused connections counts as fully loaded until its cooldown ends.
   */
  private choose(model: CatalogModel, tried: ReadonlySet<string>): Replica | undefined {
    const candidates = this.options.replicas.forModel(model.id);
    const count = candidates.length;
    if (count === 0) return undefined;
    const now = Date.now();
    const start = this.rotation++ % count;
    let best: Replica | undefined;
    let bestLoad = Infinity;
    for (let i = 0; i < count; i += 1) {
      const replica = candidates[(start + i) % count]!;
      if (replica.state !== "ready" || replica.endpoint === null || tried.has(replica.id)) continue;
      const cooling = (this.coolingUntil.get(replica.id) ?? 0) > now;
      const load = cooling ? Number.MAX_SAFE_INTEGER : (this.inFlight.get(replica.id) ?? 0) / replica.weight;
      if (load < bestLoad) {
        best = replica;
        bestLoad = load;
      }
    }
    return best;
  }

  private hasAlternative(model: CatalogModel, tried: ReadonlySet<string>): boolean {
    return this.options.replicas.forModel(model.id).some((r) => r.state === "ready" && r.endpoint !== null && !tried.has(r.id));
  }

  /** A 503 that says why nothing can answer, from the replicas' states. */
  private noReadyReplica(model: CatalogModel): UnavailableError {
    const replicas = this.options.replicas.forModel(model.id);
    const parked = replicas.find((r) => r.state === "parked");
    if (parked !== undefined) {
      return new UnavailableError(
        `Model '${model.name}' is parked after ${parked.failures} failed starts: ${parked.lastError ?? "no error recorded"}. Fix the model (PATCH /api/v1/models/${model.name}) or unpark it.`,
        { code: "model_parked", retryAfterSeconds: 60 },
      );
    }
    const starting = replicas.find((r) => r.state === "starting" || r.state === "pending" || r.state === "placed" || r.state === "fetching");
    if (starting !== undefined) {
      return new UnavailableError(`Model '${model.name}' is starting (replica attempt ${starting.attempt}); retry in a few seconds.`, { code: "model_starting", retryAfterSeconds: 5 });
    }
    const failed = replicas.find((r) => r.state === "failed");
    if (failed !== undefined) {
      return new UnavailableError(`Model '${model.name}' has no ready replica; the last start failed: ${failed.lastError ?? "no error recorded"}. It is retried with backoff.`, {
        code: "model_failed",
        retryAfterSeconds: 10,
      });
    }
    if (replicas.length > 0) {
      return new UnavailableError(`Every replica of model '${model.name}' failed or is busy stopping; retry shortly.`, { code: "no_ready_replica", retryAfterSeconds: 5 });
    }
    const min = model.definition.scaling.min;
    return new UnavailableError(
      min === 0
        ? `Model '${model.name}' has no replica (scaling.min is 0). Raise scaling.min to run one.`
        : `Model '${model.name}' has no replica yet; the fleet has not placed it. Check 'llmgw ctl model list' for its state.`,
      { code: "no_ready_replica", retryAfterSeconds: 10 },
    );
  }

  private fail(req: IncomingMessage, res: ServerResponse, error: unknown): void {
    if (!(error instanceof LlmgwError)) this.options.logger.error({ err: error, path: pathOf(req.url) }, "unexpected error on /v1");
    if (res.headersSent) {
      res.destroy();
      return;
    }
    const rendered = renderError(error);
    if (error instanceof PayloadTooLargeError) {
      // Stop reading the oversized body; close the connection once the answer is out.
      res.setHeader("connection", "close");
      req.resume();
    }
    sendJson(res, rendered.status, rendered.body, rendered.headers);
  }
}

function assertAllowed(principal: Principal, model: CatalogModel, requested: string): void {
  if (!isAllowed(principal, model, requested)) {
    throw new PermissionDeniedError(`The key '${principal.name}' may not use model '${requested}'. Ask an administrator to add it to the key's allowed models.`, {
      code: "model_not_allowed",
      param: "model",
    });
  }
}

function isAllowed(principal: Principal, model: CatalogModel, requested: string): boolean {
  const allowed = principal.allowedModels;
  return allowed === null || allowed.has(model.name) || allowed.has(requested);
}

function upstreamHeaders(req: IncomingMessage, replica: Replica, length: number): Record<string, string> {
  const headers: Record<string, string> = { "content-type": "application/json", "content-length": String(length) };
  const accept = req.headers.accept;
  if (typeof accept === "string") headers.accept = accept;
  if (replica.engineKey !== null) headers.authorization = `Bearer ${replica.engineKey}`;
  return headers;
}

function pathOf(url: string | undefined): string {
  const raw = url ?? "/";
  const query = raw.indexOf("?");
  const path = query === -1 ? raw : raw.slice(0, query);
  return path.length > 1 && path.endsWith("/") ? path.slice(0, -1) : path;
}

function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers["content-length"] ?? NaN);
  if (Number.isFinite(declared) && declared > limit) {
    return Promise.reject(tooLarge(limit));
  }
  return new Promise<Buffer>((resolve, reject) => {
    if (req.destroyed || req.readableEnded) {
      // The client left (or the body was consumed) while the key was being checked.
      reject(new BadRequestError("The request body is gone: the client closed the connection.", { code: "body_read_failed" }));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        cleanup();
        reject(tooLarge(limit));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = () => {
      cleanup();
      resolve(Buffer.concat(chunks, size));
    };
    const onError = (error: Error) => {
      cleanup();
      reject(new BadRequestError(`The request body could not be read: ${error.message}.`, { code: "body_read_failed", cause: error }));
    };
    const onClose = () => {
      cleanup();
      reject(new BadRequestError("The client closed the connection before sending the whole body.", { code: "body_read_failed" }));
    };
    const cleanup = () => {
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", onError);
      req.off("close", onClose);
    };
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("error", onError);
    req.on("close", onClose);
  });
}

function tooLarge(limit: number): PayloadTooLargeError {
  return new PayloadTooLargeError(`The request body is larger than ${limit} bytes, the limit of this gateway. Send a smaller request or raise --max-body.`, {
    code: "request_too_large",
  });
}


export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { ...headers, "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}
