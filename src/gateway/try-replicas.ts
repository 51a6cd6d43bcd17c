// One request sent to a model's replicas until one answers: the loop that both the /v1
// proxy (gateway.ts) and llmgw's own calls to a model (internal-call.ts, for guard models)
// run, so that a replica failure means the same thing to both. Each attempt takes a slot at
// a ready replica not yet tried (admission.ts, which may queue or start one on demand),
// sends the request through that replica's pool, and hands the answer to the caller, who
// reads or relays it. What happens before that is decided here, once:
// - a refused connection or a reset before the answer (upstream.ts classifies it): the
//   replica is cooled down, so others are preferred for a few seconds, and another one gets
//   the request;
// - 408/409/429/5xx while another replica may still be tried: the answer is dropped, unread,
//   and another replica gets the request; on the last attempt the caller gets it as it is
//   (the proxy passes the upstream's own error answer on; an internal call reports it);
// - 401/403: the replica refused llmgw's own credentials, see AUTH_REFUSED;
// - a failure the caller meets before anything reached its own client (FailedBeforeAnswer):
//   as a reset;
// - anything after that is the caller's: an answer cannot be retried once it has begun.
// Another replica is tried only while attempts are left and an untried ready one exists.
import type { Dispatcher } from "undici";
import { ClientClosedError, LlmgwError, NotFoundError, UpstreamError, describeError } from "../core/errors.ts";
import type { Logger } from "../core/log.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import { isRoutable, type FleetStatusOfModel } from "../fleet/model-health.ts";
import type { Replica } from "../fleet/replica-table.ts";
import type { Admission, Lease, ReplicaSource } from "./admission.ts";
import type { ModelResolver, OnDemand } from "./gateway-ports.ts";
import { RequestCancel } from "./request-cancel.ts";
import { unavailableError } from "./unavailable.ts";
import { classifyUpstreamFailure, isRetryableStatus, type UpstreamPools } from "./upstream.ts";

/** What the loop works with; one of these per gateway, shared by all its requests. */
export interface ReplicaDependencies {
  admission: Admission;
  replicas: ReplicaSource;
  pools: UpstreamPools;
  /** When given, a model removed from the catalog while its request waited is a 404 rather than a 503. */
  catalog?: Pick<ModelResolver, "resolve"> | undefined;
  onDemand?: OnDemand | undefined;
  /** What the fleet knows of a model (parked, unplaceable), so a 503 says why. */
  fleetStatus?: ((modelId: string) => FleetStatusOfModel) | undefined;
  logger?: Logger | undefined;
}

/** One request to send to a model's replicas. */
export interface ReplicaRequest<T> {
  model: CatalogModel;
  /** The OpenAI path the request runs as, after the replica's base path. */
  path: string;
  /** The body for a replica (each may know the model by its own upstream name). */
  payload(replica: Replica): Buffer;
  /** Replicas this request must not go to (one whose engine lacks the adapter asked for). */
  exclude?: (replica: Replica) => boolean;
  /** The hash of the prompt's start when the model is routed by prefix (prefix-affinity.ts). */
  affinity?: number | undefined;
  /** The client's Accept header, passed on. */
  accept?: string | undefined;
  /**
   * Ends the waits and the upstream request. The proxy's RequestCancel makes no AbortSignal
   * unless a wait needs one; an internal call has its AbortSignal already.
   */
  cancel: RequestCancel | AbortSignal;
  /** Replicas one request may try, the first included. */
  maxAttempts: number;
  /** Who reads a 503: an administrator sees the replica's recorded error, a client does not. */
  audience: "admin" | "client";
  /** The error once `cancel` fired, when it is not simply the client leaving (an internal call's own timeout). */
  aborted?: () => LlmgwError;
  /** Told of each replica as it is tried (the usage row names the last one). */
  onReplica?: (replica: Replica) => void;
  /**
   * Reads or relays an answer the loop accepted: a 2xx, or the last attempt's error answer.
   * Returns the caller's result, or FailedBeforeAnswer when the replica failed before
   * anything reached the caller's client; whatever it throws ends the request. The lease is
   * released when it returns, if the caller has not released it sooner.
   */
  answer(upstream: Dispatcher.ResponseData, lease: Lease): Promise<T | FailedBeforeAnswer>;
}

/** What `answer` returns when the replica failed before anything reached the client: another replica may answer. */
export class FailedBeforeAnswer {
  constructor(readonly error: LlmgwError) {}
}

/** How a replica is named in messages and logs: the model and its profile. */
export function replicaLabel(model: CatalogModel, replica: Replica): string {
  return `${model.name}/${replica.profile}`;
}

/**
 * Why a 401 or 403 from a replica is no answer. The replica refused llmgw's own credentials
 * (an external profile's wrong api_key, an engine restarted with another key): passing its
 * 401 on would tell a client that the client's key is wrong, so it becomes a 502 that names
 * the profile. Another replica is tried, since another profile has its own key. The proxy
 * has always done this; internal calls used to report it as a plain "HTTP 401" and give up,
 * so a guard whose first replica had a bad key failed although a second could answer, with
 * words that sent an operator looking at the client's key. Now both do what the proxy does.
 */
function authRefused(label: string, status: number): LlmgwError {
  return new UpstreamError(`Replica ${label} refused llmgw's credentials (HTTP ${status}). An administrator should check the profile's api_key.`, {
    code: "upstream_auth_failed",
  });
}

/** Sends `request` to the model's replicas until one answers; resolves with what its `answer` made of it. */
export async function tryReplicas<T>(deps: ReplicaDependencies, request: ReplicaRequest<T>): Promise<T> {
  const { model, cancel } = request;
  const tried = new Set<string>();
  if (request.exclude !== undefined) for (const replica of deps.replicas.forModel(model.id)) if (request.exclude(replica)) tried.add(replica.id);
  let lastFailure: LlmgwError | undefined;
  deps.onDemand?.requested(model);
  try {
    for (let attempt = 0; attempt < request.maxAttempts; attempt += 1) {
      let lease: Lease | null;
      try {
        // The signal only when the request has to wait (a getter): most never do.
        lease = await deps.admission.acquire(model, {
          exclude: tried,
          affinity: request.affinity,
          get signal() {
            return cancel instanceof RequestCancel ? cancel.signal : cancel;
          },
        });
      } catch (error) {
        throw acquireFailure(deps, request, error);
      }
      if (lease === null) break;
      const replica = lease.replica;
      tried.add(replica.id);
      request.onReplica?.(replica);
      const mayRetry = attempt + 1 < request.maxAttempts && hasUntried(deps.replicas, model, tried);
      const payload = request.payload(replica);
      let upstream: Dispatcher.ResponseData;
      try {
        upstream = await deps.pools.get(replica.endpoint!.origin).request({
          path: replica.endpoint!.basePath + request.path,
          method: "POST",
          headers: upstreamHeaders(replica, payload.length, request.accept),
          body: payload,
          signal: cancel,
        });
      } catch (error) {
        lease.release();
        if (cancel.aborted) throw request.aborted?.() ?? new ClientClosedError();
        lastFailure = classifyUpstreamFailure(error, replicaLabel(model, replica));
        if (lastFailure.retryable) deps.admission.coolDown(replica.id);
        deps.logger?.warn({ model: model.name, replica: replica.id, err: describeError(error) }, "replica failed before answering");
        if (lastFailure.retryable && mayRetry) continue;
        throw lastFailure;
      }
      const status = upstream.statusCode;
      const refusedUs = status === 401 || status === 403;
      if (refusedUs || (mayRetry && isRetryableStatus(status))) {
        // Nothing has reached the caller yet, so another replica can still answer.
        upstream.body.resume();
        upstream.body.on("error", ignore);
        lease.release();
        deps.logger?.warn(
          { model: model.name, replica: replica.id, status },
          mayRetry ? "replica did not answer; trying another" : "replica refused llmgw's credentials",
        );
        // A retried 408/409/429/5xx is not kept as the request's failure: when no other replica
        // turns up after all, the model's own state (its health, or its removal) says more
        // than one replica's busy answer. A refusal of our credentials is kept: it names the
        // profile whose key is wrong.
        if (refusedUs) lastFailure = authRefused(replicaLabel(model, replica), status);
        if (mayRetry) continue;
        throw lastFailure ?? authRefused(replicaLabel(model, replica), status);
      }
      let answered: T | FailedBeforeAnswer;
      try {
        answered = await request.answer(upstream, lease);
      } finally {
        lease.release();
      }
      if (!(answered instanceof FailedBeforeAnswer)) return answered;
      lastFailure = answered.error;
      if (lastFailure.retryable) deps.admission.coolDown(replica.id);
      deps.logger?.warn({ model: model.name, replica: replica.id, err: describeError(lastFailure) }, "replica failed before its first byte");
      if (lastFailure.retryable && mayRetry) continue;
      throw lastFailure;
    }
    if (lastFailure !== undefined) throw lastFailure;
    if (deps.catalog !== undefined && deps.catalog.resolve(model.name)?.id !== model.id) {
      throw new NotFoundError(`Model '${model.name}' was removed while the request waited.`, { code: "model_not_found", param: "model" });
    }
    throw unavailableError(model, deps.replicas.forModel(model.id), request.audience, deps.fleetStatus?.(model.id));
  } finally {
    deps.onDemand?.finished(model);
  }
}

/**
 * What a failed wait for a slot becomes. A full queue or a wait that timed out while no
 * replica was ready at all is no overload: the model is starting (or failing to), and its
 * health says so.
 */
function acquireFailure(deps: ReplicaDependencies, request: ReplicaRequest<unknown>, error: unknown): unknown {
  if (request.cancel.aborted) return request.aborted?.() ?? error;
  const queueLimit = error instanceof LlmgwError && (error.code === "model_overloaded" || error.code === "queue_timeout");
  const replicas = deps.replicas.forModel(request.model.id);
  if (!queueLimit || replicas.some(isRoutable)) return error;
  return unavailableError(request.model, replicas, request.audience, deps.fleetStatus?.(request.model.id));
}

/** Whether a ready replica not yet tried exists (busy or not), so a failed attempt may be retried. */
function hasUntried(replicas: ReplicaSource, model: CatalogModel, tried: ReadonlySet<string>): boolean {
  return replicas.forModel(model.id).some((r) => isRoutable(r) && !tried.has(r.id));
}

function upstreamHeaders(replica: Replica, length: number, accept: string | undefined): Record<string, string> {
  const headers: Record<string, string> = { "content-type": "application/json", "content-length": String(length) };
  if (accept !== undefined) headers.accept = accept;
  if (replica.engineKey !== null) headers.authorization = `Bearer ${replica.engineKey}`;
  return headers;
}

/** A dropped answer's body may still fail as it drains; nobody reads it any more. */
function ignore(): void {}
