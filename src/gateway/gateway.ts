// The /v1 hot path: authenticate the key, read and check the body, resolve the model or
// alias, take a slot at a ready replica (or wait in the model's queue: admission.ts), and
// proxy the request with undici on Node streams (relay.ts). A replica that refuses or
// fails before its first byte is replaced by another; a client that goes away cancels the
// upstream. Every request whose key is known leaves one usage row, whatever its outcome,
// and every failure leaves in OpenAI's error shape. The Anthropic Messages API
// (/v1/messages) enters the same path as a chat completion (wire-format.ts, anthropic/),
// with its own key header, body, answer and error shape at the edges.
//
// The gateway depends on narrow interfaces (gateway-ports.ts, and admission's replica
// source), not on the catalog, key service or replica table themselves. Which replica
// answers, and what a replica's failure means, is try-replicas.ts's, shared with llmgw's
// own calls to models (internal-call.ts).
import type { IncomingMessage, ServerResponse } from "node:http";
import { performance } from "node:perf_hooks";
import type { Dispatcher } from "undici";
import { ClientClosedError, LlmgwError, NotFoundError, UpstreamError, describeError, parseWith } from "../core/errors.ts";
import { bearerToken } from "../core/bearer.ts";
import { DEFAULT_BODY_TIMEOUT_MS, methodNotAllowed, readLimitedBody, sendError, sendJson, type ErrorDialect } from "../core/http.ts";
import { parseJsonBody } from "../core/json-body.ts";
import type { Logger } from "../core/log.ts";
import { modelNotFound, type CatalogModel } from "../catalog/catalog.ts";
import type { Principal } from "../keys/key-service.ts";
import type { Replica } from "../fleet/replica-table.ts";
import { Admission, type GatewayLoad, type Lease, type ReplicaSource } from "./admission.ts";
import type { KeyVerifier, ModelResolver, OnDemand, UsageSink } from "./gateway-ports.ts";
import { callModelInternally } from "./internal-call.ts";
import { relay } from "./relay.ts";
import type { WireExchange } from "./wire-format.ts";
import type { GatewayRequestBody } from "./request-schemas.ts";
import { answerHandling, pathOf, proxyRoutes, type ProxyRoute } from "./proxy-routes.ts";
import type { SideRoute, SideRouteFinder } from "./side-routes.ts";
import { ollamaSideRoutes } from "./ollama/ollama-routes.ts";
import { ResponsesRoutes } from "./responses/responses-routes.ts";
import { responsesWire } from "./responses/responses-wire.ts";
import type { ResponseStore } from "./responses/response-store.ts";
import { NO_FIELDS, adapterChoice, upstreamOf } from "./adapter-route.ts";
import { assertAllowed, listModels, mayUse } from "./model-access.ts";
import { checkImageParts, type ImageSettings } from "./image-parts.ts";
import { withUsageRequested } from "./stream-usage.ts";
import { outputCapOf } from "./output-cap.ts";
import { RequestCancel } from "./request-cancel.ts";
import { NO_ATTEMPT, settlementOf, type AttemptOutcome, type Settlement } from "./request-outcome.ts";
import type { OutputMeter } from "./output-meter.ts";
import { chargedUsage, estimatedUsage, type EstimateSource } from "./charged-usage.ts";
import type { UsageTap } from "./usage-tap.ts";
import type { FleetStatusOfModel } from "../fleet/model-health.ts";
import { withoutServerDetails } from "./unavailable.ts";
import { FailedBeforeAnswer, replicaLabel, tryReplicas, type ReplicaDependencies } from "./try-replicas.ts";
import { requestAffinity } from "./prefix-affinity.ts";
import type { UpstreamPools } from "./upstream.ts";
import type { TokenUsage } from "../core/token-usage.ts";
import { costUsd } from "../policy/cost.ts";
import type { InternalCaller, LimitsPermit, OutputCheck, PolicyRequest, RequestGuards, RequestLimits } from "../policy/request-policy.ts";
import type { RequestMetrics } from "../metrics/metrics.ts";

export interface GatewayOptions {
  catalog: ModelResolver;
  keys: KeyVerifier;
  replicas: ReplicaSource;
  pools: UpstreamPools;
  usage?: UsageSink;
  logger: Logger;
  /** Largest request body accepted, in bytes. */
  maxBodyBytes?: number;
  /** The whole request body must arrive within this (408 after). */
  bodyTimeoutMs?: number;
  /** How many replicas one request may try before giving up. */
  maxAttempts?: number;
  /** A client that reads nothing of its answer for this long is cut off and its slot freed. Default 60 s. */
  stalledReaderMs?: number;
  /** What the fleet knows of a model (parked, unplaceable), so a 503 says why. */
  fleetStatus?: (modelId: string) => FleetStatusOfModel;
  /** Starts replicas of models without any (scaling.min 0) when requests come, and stops idle ones. */
  onDemand?: OnDemand;
  /** Budgets and rate limits: reserved before a replica is asked, settled when the request ends. */
  limits?: RequestLimits;
  /** Guard models on the input (and on answers that are not streamed). */
  guards?: RequestGuards;
  /** Told of every /v1 request as it ends (Prometheus counters and histograms). */
  metrics?: RequestMetrics;
  /** What image parts may be, and whether image URLs are fetched (image-parts.ts; defaults there). */
  images?: Partial<ImageSettings>;
  /** Where the Responses API keeps responses (`store`, `previous_response_id`, GET/DELETE); without it /v1/responses is not served. */
  responses?: ResponseStore;
}

/** Usage status of an answer cut short by the upstream after its first byte: a bad gateway. */
const STATUS_UPSTREAM_BROKE = 502;

export const DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024;
const DEFAULT_STALLED_READER_MS = 60_000;

/** What one /v1 request has learned so far, for its usage row. */
interface Call {
  started: number;
  endpoint: string;
  principal: Principal | null;
  /** The catalog name once resolved; before that, what the client asked for. */
  model: string | null;
  replicaId: string | null;
  stream: boolean;
  /** When the replica whose answer the client got sent its first byte (a failed attempt's does not count). */
  firstByteAt: number | null;
  usage: TokenUsage | null;
  /** How the last replica attempt ended: with the usage, what the request costs (request-outcome.ts). */
  outcome: AttemptOutcome;
  /** The resolved catalog model (its prices give the cost). */
  catalogModel: CatalogModel | null;
  /** What the limits reserved for this request; settled once, when it ends. */
  permit: LimitsPermit | null;
  /** Milliseconds the guard models took on this request, when any applied. */
  guardMs: number | null;
  /** The request whose answer counts, and what read that answer: for an estimate when its replica reported no usage. */
  answered: ProxyRequest | null;
  meter: OutputMeter | null;
  tap: UsageTap | null;
}

/** A /v1 request ready for a replica: its key, body and model known, its policy passed. */
interface ProxyRequest {
  req: IncomingMessage;
  res: ServerResponse;
  call: Call;
  route: ProxyRoute;
  /** The translation of a request in another wire format; null for OpenAI's own routes. */
  exchange: WireExchange | null;
  raw: Buffer;
  body: GatewayRequestBody;
  model: CatalogModel;
  principal: Principal;
  cancel: RequestCancel;
  /** Looks at a whole non-stream answer before the client gets it (an output guard). */
  outputCheck: OutputCheck | null;
}

export class Gateway {
  private readonly admission: Admission;
  /** What every request's replica attempts (and every internal call's) work with. */
  private readonly replicaDeps: ReplicaDependencies;
  private readonly maxBodyBytes: number;
  /** The image checks' settings, with this gateway's body limit (an inlined body must fit it too). */
  private readonly imageSettings: Partial<ImageSettings>;
  private readonly bodyTimeoutMs: number;
  private readonly maxAttempts: number;
  /** The origin each replica was last seen at, so a pool no replica uses any more is closed. */
  private readonly originOf = new Map<string, string>();
  private readonly unsubscribe: () => void;
  /** The paths proxied to replicas, and the wire format each speaks. */
  private readonly routes: ReadonlyMap<string, ProxyRoute>;
  /** The stored responses' own routes (GET/DELETE /v1/responses/{id}, input_items). */
  private readonly responseRoutes: ResponsesRoutes | null;
  /** Ollama's catalog routes (/api/tags, /api/show, /api/ps, /api/version, the 501s). */
  private readonly ollamaRoutes: SideRouteFinder;

  constructor(private readonly options: GatewayOptions) {
    this.routes = proxyRoutes({ responses: options.responses === undefined ? undefined : responsesWire(options.responses) });
    this.responseRoutes = options.responses === undefined ? null : new ResponsesRoutes(options.responses);
    this.maxBodyBytes = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
    this.imageSettings = { maxBodyBytes: this.maxBodyBytes, ...options.images };
    this.bodyTimeoutMs = options.bodyTimeoutMs ?? DEFAULT_BODY_TIMEOUT_MS;
    const bodyLimits = { maxBodyBytes: this.maxBodyBytes, bodyTimeoutMs: this.bodyTimeoutMs };
    this.ollamaRoutes = ollamaSideRoutes({ catalog: options.catalog, replicas: options.replicas, ...bodyLimits });
    this.maxAttempts = options.maxAttempts ?? 3;
    this.admission = new Admission(options.replicas, Date.now, (modelId) => options.onDemand?.starting(modelId) ?? false);
    this.unsubscribe = options.replicas.onChange((replica, removed) => this.forgetOrigin(replica, removed));
    this.replicaDeps = {
      admission: this.admission,
      replicas: options.replicas,
      pools: options.pools,
      catalog: options.catalog,
      onDemand: options.onDemand,
      fleetStatus: options.fleetStatus,
      logger: options.logger,
    };
  }

  /** Stops following the replica table (the pools themselves are closed by their owner). */
  close(): void {
    this.unsubscribe();
    this.admission.close();
  }

  /** Sends one chat completion of llmgw's own (a guard model's question) through admission and the upstream pools. */
  callModel: InternalCaller = (request) => callModelInternally(this.replicaDeps, request);

  /** Requests in flight at a replica (for tests and metrics). */
  inFlightOf(replicaId: string): number {
    return this.admission.inFlightAt(replicaId);
  }

  /** Requests in flight and queued by model and by replica now (the autoscaler's and drains' input). */
  load(): GatewayLoad {
    return this.admission.load();
  }

  /** Looks at a model's waiting requests again, after the fleet's view of it changed (parked, unplaceable). */
  recheck(modelId: string): void {
    this.admission.recheck(modelId);
  }

  /** Requests waiting in a model's queue (for tests and metrics). */
  waitingFor(modelId: string): number {
    return this.admission.waiting(modelId);
  }

  /** Closes the connection pool of an origin once no replica uses it (an engine restart gets a new port). */
  private forgetOrigin(replica: Replica, removed: boolean): void {
    const previous = this.originOf.get(replica.id);
    const current = removed ? undefined : replica.endpoint?.origin;
    if (current === undefined) this.originOf.delete(replica.id);
    else this.originOf.set(replica.id, current);
    if (previous !== undefined && previous !== current && ![...this.originOf.values()].includes(previous)) {
      void this.options.pools.release(previous);
    }
  }

  /** Node request listener for every path under /v1; the key in the request is checked here. */
  handle = (req: IncomingMessage, res: ServerResponse): void => {
    this.start(req, res, undefined);
  };

  /**
   * A request its caller has already authenticated another way (the console's playground,
   * by its session), served as `principal`. Its own method, so that nothing that calls a
   * listener with a third argument can skip the key check.
   */
  handleAuthenticated(req: IncomingMessage, res: ServerResponse, principal: Principal): void {
    this.start(req, res, principal);
  }

  private start(req: IncomingMessage, res: ServerResponse, principal: Principal | undefined): void {
    const call: Call = {
      started: performance.now(),
      endpoint: pathOf(req.url),
      principal: null,
      model: null,
      replicaId: null,
      stream: false,
      firstByteAt: null,
      usage: null,
      outcome: NO_ATTEMPT,
      catalogModel: null,
      permit: null,
      guardMs: null,
      answered: null,
      meter: null,
      tap: null,
    };
    this.serve(req, res, call, principal).catch((error: unknown) => this.fail(req, res, error, call));
  }

  private async serve(req: IncomingMessage, res: ServerResponse, call: Call, authenticated: Principal | undefined): Promise<void> {
    const pathname = call.endpoint;
    const route = this.routes.get(pathname);
    if (pathname === "/v1/models" && req.method === "GET") {
      const principal = await this.options.keys.verify(bearerToken(req.headers.authorization));
      sendJson(res, 200, listModels(this.options.catalog, principal));
      this.record(call, 200);
      return;
    }
    if (route === undefined) {
      const side = this.sideRouteOf(pathname);
      if (side === undefined) {
        throw new NotFoundError(
          `Unknown endpoint ${req.method} ${pathname}. llmgw serves GET /v1/models and POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages, /v1/responses, and Ollama's /api/chat, /api/generate, /api/embed.`,
          { code: "unknown_endpoint" },
        );
      }
      call.principal = authenticated ?? (await this.options.keys.verify(side.apiKey(req)));
      await side.serve(req, res, call.principal, pathname);
      this.record(call, res.statusCode);
      return;
    }
    if (req.method !== "POST") throw methodNotAllowed(req.method ?? "GET", pathname, "POST");
    const principal = authenticated ?? (await this.options.keys.verify(route.wire?.apiKey(req) ?? bearerToken(req.headers.authorization)));
    call.principal = principal;
    const raw = await readLimitedBody(req, {
      maxBytes: this.maxBodyBytes,
      timeoutMs: this.bodyTimeoutMs,
      tooLargeHint: "Send a smaller request, or ask the operator to raise --max-body.",
    });
    const json = parseJsonBody(raw.toString("utf8"));
    // Only a translation that reads the store costs an await (the OpenAI routes' hot path has none).
    const begun = route.wire?.begin(json, { principal, knows: (name) => mayUse(this.options.catalog, principal, name) }) ?? null;
    const exchange = begun instanceof Promise ? await begun : begun;
    const body = exchange?.checked === true ? exchange.body : parseWith(route.schema, exchange === null ? json : exchange.body, "request");
    call.model = body.model;
    call.stream = body.stream === true;
    const model = this.options.catalog.resolve(body.model);
    if (model === undefined) throw modelNotFound(body.model);
    // Usage and metrics name an adapter by the name it was asked for; anything else by the model's own name.
    call.model = this.options.catalog.adapterOf?.(body.model) === undefined ? model.name : body.model;
    call.catalogModel = model;
    assertAllowed(call.principal, model, body.model);
    const images = checkImageParts(body, model, this.imageSettings);
    const cancel = new RequestCancel();
    const onClose = () => {
      if (!res.writableFinished) cancel.abort();
    };
    res.on("close", onClose);
    try {
      const policy = this.applyPolicy(
        { principal: call.principal, model, body, endpoint: route.path, ...(exchange === null ? { rawBytes: raw.length } : {}) },
        call,
        cancel,
      );
      const outputCheck = policy instanceof Promise ? await policy : policy;
      const sent = images === null ? null : await images.inline(cancel.signal, raw.length);
      const status = await this.proxy({ req, res, call, route, exchange, ...(sent ?? { raw, body }), model, principal: call.principal, cancel, outputCheck });
      this.record(call, status);
    } finally {
      res.off("close", onClose);
    }
  }

  /**
   * Limits first (cheap, and a key over its limits must not cost a guard model's time),
   * then the guards on the input. Returns the check for the output, if one applies.
   */
  private applyPolicy(request: PolicyRequest, call: Call, cancel: RequestCancel): OutputCheck | null | Promise<OutputCheck | null> {
    // Synchronous unless a limit or a guard has something to wait for: an await per request
    // is a measurable share of the gateway's cost at high request rates.
    if (this.options.limits !== undefined) {
      // Every answer to a limited key says where it stands: the relay writes the permit's
      // headers with the answer's own, and `fail` adds them to an error. (Not res.setHeader
      // here: headers set before writeHead send Node down its slow path for every header
      // of the answer, which the gateway benchmark measured at ~25 µs a request.)
      const admitted = this.options.limits.admit(request);
      if (admitted instanceof Promise) {
        return admitted.then((permit) => {
          call.permit = permit;
          return this.applyGuards(request, call, cancel);
        });
      }
      call.permit = admitted;
    }
    return this.applyGuards(request, call, cancel);
  }

  private applyGuards(request: PolicyRequest, call: Call, cancel: RequestCancel): OutputCheck | null | Promise<OutputCheck | null> {
    const guards = this.options.guards;
    if (guards === undefined || !guards.applies(request)) return null;
    return this.checkGuards(guards, request, call, cancel.signal);
  }

  private async checkGuards(guards: RequestGuards, request: PolicyRequest, call: Call, signal: AbortSignal): Promise<OutputCheck | null> {
    const guardStarted = performance.now();
    const checked = await guards.checkInput(request, signal).catch((error: unknown) => {
      // Only a guard that was asked refuses or fails: its time belongs in the usage row too.
      call.guardMs = Math.round(performance.now() - guardStarted);
      throw error;
    });
    if (signal.aborted) throw new ClientClosedError();
    call.guardMs = checked.guardMs;
    const output = checked.output;
    if (call.stream || output === null) return null;
    // The output guards' time counts in the request's guard time as well.
    return async (answer) => {
      const started = performance.now();
      try {
        await output(answer);
      } finally {
        call.guardMs = (call.guardMs ?? 0) + Math.round(performance.now() - started);
      }
    };
  }

  /** Runs the request against replicas until one answers (try-replicas.ts); returns the status for its usage row. */
  private proxy(request: ProxyRequest): Promise<number> {
    const { req, call, route, body, model } = request;
    const stream = body.stream === true;
    // Token counts for every stream: when the client did not ask for them, ask the upstream
    // and take them back out of what the client receives (stream-usage.ts).
    const injectUsage = stream && (body.stream_options as { include_usage?: unknown } | null | undefined)?.include_usage !== true;
    const payloads = new Map<string, Buffer>();
    const outputCap = outputCapOf(route.path, body, call.permit?.maxOutputTokens ?? null);
    // A JSON answer cannot be stopped half-way: where the limits bound the output and the
    // upstream is not trusted to keep to max_tokens, the request runs as a stream there,
    // stopped at the bound and put together again (relay-assembled.ts).
    const bounded = !stream && route.path !== "/v1/embeddings" && (call.permit?.maxOutputTokens ?? null) !== null;
    const assembles = (replica: Replica) => bounded && replica.untrustedOutput === true;
    const adapter = adapterChoice(this.options.catalog, body.model, model);
    const payloadFor = (replica: Replica): Buffer => {
      const routed = adapter === null ? null : upstreamOf(replica, adapter);
      const upstreamModel = routed?.model ?? replica.upstreamModel;
      const fields = routed?.fields ?? NO_FIELDS;
      // Bodies are kept per upstream name, and per adapter id too: replicas rolling out a change may know an adapter by another id.
      const cacheKey = fields === NO_FIELDS ? upstreamModel : `${upstreamModel}\u0000${JSON.stringify(fields)}`;
      if (assembles(replica)) {
        const key = `${cacheKey}\u0000stream`;
        let streamed = payloads.get(key);
        if (streamed === undefined) {
          streamed = Buffer.from(
            JSON.stringify({ ...body, model: upstreamModel, ...fields, ...outputCap, stream: true, stream_options: { include_usage: true } }),
          );
          payloads.set(key, streamed);
        }
        return streamed;
      }
      // The body as it arrived only when nothing is to be added to it (an adapter choice is).
      const asSent = upstreamModel === body.model && request.exchange === null && outputCap === null && fields.lora === undefined;
      if (asSent && !injectUsage) return request.raw;
      let payload = payloads.get(cacheKey);
      if (payload === undefined && asSent) {
        // Only the usage to ask for: the body as it arrived, with the field spliced in.
        payload = withUsageRequested(request.raw, body) ?? undefined;
        if (payload !== undefined) payloads.set(cacheKey, payload);
      }
      if (payload === undefined) {
        // Safe to re-serialise: parseJsonBody refused anything nested deep enough to overflow.
        const rewritten: Record<string, unknown> = { ...body, model: upstreamModel, ...fields, ...outputCap };
        if (injectUsage) rewritten.stream_options = { ...((body.stream_options as object | null | undefined) ?? {}), include_usage: true };
        payload = Buffer.from(JSON.stringify(rewritten));
        payloads.set(cacheKey, payload);
      }
      return payload;
    };
    const accept = req.headers.accept;
    return tryReplicas(this.replicaDeps, {
      model,
      path: route.path,
      payload: payloadFor,
      affinity: requestAffinity(model.definition, route.path, body),
      ...(adapter?.servedName == null ? {} : { exclude: (replica: Replica) => !replica.adapters?.includes(adapter.servedName!) }),
      accept: typeof accept === "string" ? accept : undefined,
      cancel: request.cancel,
      maxAttempts: this.maxAttempts,
      audience: request.principal.role === "admin" ? "admin" : "client",
      onReplica: (replica) => {
        call.replicaId = replica.id;
      },
      answer: (upstream, lease) => this.relayAnswer({ request, upstream, lease, injectUsage, assemble: assembles(lease.replica) }),
    });
  }

  /** Passes one replica's answer on to the client; its outcome decides the status, or that another replica may try. */
  private async relayAnswer(attempt: {
    request: ProxyRequest;
    upstream: Dispatcher.ResponseData;
    lease: Lease;
    injectUsage: boolean;
    /** The request runs as a stream upstream, to be held to its output bound (relay-assembled.ts). */
    assemble: boolean;
  }): Promise<number | FailedBeforeAnswer> {
    const { request, upstream, lease } = attempt;
    const { call, model } = request;
    const replica = lease.replica;
    const maxOutputTokens = call.permit?.maxOutputTokens ?? null;
    const result = await relay({
      res: request.res,
      upstream,
      ...answerHandling(request.exchange, attempt.injectUsage, request.route.wire?.errors),
      brokenMessage: `The replica serving model '${model.name}' failed in the middle of the answer, so the answer is incomplete. Retry the request.`,
      stalledReaderMs: this.options.stalledReaderMs ?? DEFAULT_STALLED_READER_MS,
      outputCheck: request.outputCheck,
      // The replica's slot is free once its body ended, while an output guard still reads the answer.
      onUpstreamEnd: () => lease.release(),
      headers: call.permit?.headers,
      meterStream: call.stream,
      outputBound: maxOutputTokens,
      assemble: attempt.assemble ? { completions: request.route.path === "/v1/completions" } : null,
    });
    const { outcome } = result;
    call.outcome = { kind: outcome.kind, upstreamStatus: upstream.statusCode, upstreamByte: result.firstByteAt !== null };
    // A failed attempt's timing and usage are not the request's: another replica may answer it.
    if (outcome.kind !== "failed-before-first-byte") {
      call.usage = chargedUsage(result.usage, result.meter, outcome.kind);
      call.firstByteAt = result.firstByteAt;
      call.answered = request;
      call.meter = result.meter;
      call.tap = result.tap;
    }
    switch (outcome.kind) {
      case "answered":
        return outcome.status;
      case "client-gone":
        return new ClientClosedError().status;
      case "refused":
        throw outcome.error;
      case "broken":
        this.options.logger.warn({ model: model.name, replica: replica.id, err: describeError(outcome.error) }, "upstream failed mid-answer");
        return STATUS_UPSTREAM_BROKE;
      case "cut":
        // An upstream that ignores max_tokens is a bad gateway's upstream: 502 in the usage row.
        this.options.logger.warn(
          {
            model: model.name,
            replica: replica.id,
            reserved_output: maxOutputTokens,
            counted_output: result.meter?.countedOutput(),
            unreadable: result.meter?.unreadable,
          },
          "the upstream went past the reserved output, or its stream could not be counted; the stream was cut",
        );
        // A JSON answer made of the stream reached the client whole, ended at the bound.
        return attempt.assemble ? request.res.statusCode : STATUS_UPSTREAM_BROKE;
      case "failed-before-first-byte":
        // Failed after its headers but before any byte: as good as a refused connection.
        return new FailedBeforeAnswer(
          new UpstreamError(`Replica ${replicaLabel(model, replica)} failed before sending its answer (${describeError(outcome.error)}).`, {
            code: "upstream_unreachable",
            retryable: true,
            cause: outcome.error,
          }),
        );
    }
  }

  /** The route no replica answers for a path: a stored response's, or Ollama's catalog routes. */
  private sideRouteOf(path: string): SideRoute | undefined {
    return this.responseRoutes?.find(path) ?? this.ollamaRoutes(path);
  }

  /** How failures on a path are told: its wire format's shape (OpenAI's by default). */
  private errorsOf(path: string): ErrorDialect | undefined {
    return this.routes.get(path)?.wire?.errors ?? this.sideRouteOf(path)?.errors;
  }

  private fail(req: IncomingMessage, res: ServerResponse, error: unknown, call: Call): void {
    if (!(error instanceof LlmgwError)) this.options.logger.error({ err: error, path: call.endpoint }, "unexpected error on /v1");
    const limitHeaders = call.permit?.headers;
    if (limitHeaders !== undefined && !res.headersSent) for (const [name, value] of Object.entries(limitHeaders)) res.setHeader(name, value);
    sendError(req, res, call.principal?.role === "admin" ? error : withoutServerDetails(error), this.errorsOf(call.endpoint));
    this.record(call, error instanceof LlmgwError ? error.status : 500);
  }

  /**
   * The one end of every /v1 request: the limits settle what was reserved, the metrics
   * count it, and a request whose key is known leaves one usage row, whatever its outcome.
   */
  private record(call: Call, status: number): void {
    // A closure only when an estimate may be needed: a request with reported usage makes none.
    const answered = call.answered;
    const settlement: Settlement = settlementOf(
      call.outcome,
      call.usage,
      call.usage === null && answered !== null ? () => estimatedUsage(estimateSource(answered, call)) : null,
    );
    if (call.permit !== null) {
      const permit = call.permit;
      call.permit = null;
      permit.settle(settlement);
    }
    const usage = settlement.usage;
    this.options.metrics?.requestEnded({
      // Never call.model: before resolution it is whatever the client sent, an unbounded label.
      model: call.catalogModel?.name ?? null,
      status,
      stream: call.stream,
      seconds: (performance.now() - call.started) / 1000,
      ttftSeconds: call.firstByteAt === null ? null : (call.firstByteAt - call.started) / 1000,
      usage,
    });
    if (call.principal === null || this.options.usage === undefined || !this.routes.has(call.endpoint)) return;
    this.options.usage.record({
      at: new Date(performance.timeOrigin + call.started).toISOString(),
      key_id: call.principal.keyId,
      // The table needs a model; a request refused before it named one records "-".
      model: call.model ?? "-",
      replica_id: call.replicaId,
      endpoint: call.endpoint,
      prompt_tokens: usage?.prompt_tokens ?? null,
      completion_tokens: usage?.completion_tokens ?? null,
      ttft_ms: call.firstByteAt === null ? null : Math.round(call.firstByteAt - call.started),
      duration_ms: Math.round(performance.now() - call.started),
      status,
      stream: call.stream ? 1 : 0,
      cost_usd: usage === null || call.catalogModel === null ? null : costUsd(call.catalogModel.definition.prices, usage),
      guard_ms: call.guardMs,
      estimated: settlement.estimated ? 1 : 0,
    });
  }
}

/** What the estimate of a request's answer is made from, when its replica reported no usage (charged-usage.ts). */
function estimateSource(request: ProxyRequest, call: Call): EstimateSource {
  const { route, body, model, raw } = request;
  const rawBytes = request.exchange === null ? raw.length : undefined;
  return { path: route.path, body, model, rawBytes, bound: call.permit?.maxOutputTokens ?? null, meter: call.meter, tap: call.tap };
}
