// A request llmgw itself sends to a catalog model (a guard model asked about a client's
// request): one non-stream chat completion through the same admission (a slot at a ready
// replica, else the model's queue, with an on-demand start) and the same upstream pools as
// client requests, with the replica's engine key. It is bounded by its own timeout and by
// the client's signal, retried on another replica only before an answer, like the proxy, and
// its failures are classified as upstream.ts does.
import { ClientClosedError, LlmgwError, UpstreamError, describeError } from "../core/errors.ts";
import type { CatalogModel } from "../catalog/catalog.ts";
import type { FleetStatusOfModel } from "../fleet/model-health.ts";
import { isRoutable } from "../fleet/model-health.ts";
import type { Admission, ReplicaSource } from "./admission.ts";
import type { OnDemand } from "./gateway.ts";
import { unavailableError } from "./unavailable.ts";
import { classifyUpstreamFailure, isRetryableStatus, type UpstreamPools } from "./upstream.ts";

export interface InternalCallRequest {
  model: CatalogModel;
  /** The chat-completions body without `model` (each replica gets its own upstream name). */
  body: Record<string, unknown>;
  /** The whole call, a wait in the model's queue included. */
  timeoutMs: number;
  /** The client's request: a client that leaves cancels the call. */
  signal: AbortSignal;
}

/** Sends one internal chat completion; resolves with the parsed JSON answer. */
export type InternalCaller = (request: InternalCallRequest) => Promise<unknown>;

export interface InternalCallDependencies {
  admission: Admission;
  replicas: ReplicaSource;
  pools: UpstreamPools;
  onDemand?: OnDemand | undefined;
  fleetStatus?: ((modelId: string) => FleetStatusOfModel) | undefined;
}

/** The code of the failure when the model refused the question itself (HTTP 400 or 413). */
export const UPSTREAM_REFUSED_INPUT = "upstream_refused_input";

const MAX_ATTEMPTS = 2;
/** A guard's answer is a few words; anything far larger is not an answer to read. */
const MAX_ANSWER_BYTES = 1024 * 1024;

export async function callModelInternally(deps: InternalCallDependencies, request: InternalCallRequest): Promise<unknown> {
  const { model } = request;
  const timeout = AbortSignal.timeout(request.timeoutMs);
  const signal = AbortSignal.any([request.signal, timeout]);
  /** Why the call stopped, once its signal fired: the client left, or the time ran out. */
  const aborted = (): LlmgwError =>
    request.signal.aborted
      ? new ClientClosedError()
      : new UpstreamError(`Model '${model.name}' did not answer within ${request.timeoutMs / 1000} s.`, { status: 504, code: "upstream_timeout" });
  const tried = new Set<string>();
  let lastFailure: LlmgwError | undefined;
  deps.onDemand?.requested(model);
  try {
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt += 1) {
      const lease = await deps.admission.acquire(model, { exclude: tried, signal }).catch((error: unknown) => {
        throw signal.aborted ? aborted() : error;
      });
      if (lease === null) break;
      const replica = lease.replica;
      tried.add(replica.id);
      const label = `${model.name}/${replica.profile}`;
      const mayRetry = attempt + 1 < MAX_ATTEMPTS && deps.replicas.forModel(model.id).some((r) => isRoutable(r) && !tried.has(r.id));
      const payload = Buffer.from(JSON.stringify({ ...request.body, model: replica.upstreamModel, stream: false }));
      const headers: Record<string, string> = { "content-type": "application/json", "content-length": String(payload.length) };
      if (replica.engineKey !== null) headers.authorization = `Bearer ${replica.engineKey}`;
      try {
        const upstream = await deps.pools.get(replica.endpoint!.origin).request({
          path: `${replica.endpoint!.basePath}/v1/chat/completions`,
          method: "POST",
          headers,
          body: payload,
          signal,
        });
        const text = await readText(upstream.body, label);
        if (upstream.statusCode >= 200 && upstream.statusCode < 300) {
          try {
            return JSON.parse(text) as unknown;
          } catch (error) {
            throw new UpstreamError(`Replica ${label} answered with something that is not JSON.`, { code: "upstream_bad_answer", cause: error });
          }
        }
        // 400 and 413 say the question itself was refused (a prompt longer than the model's
        // context, on llama-server and vLLM): the caller must not read that as an outage.
        const refusedInput = upstream.statusCode === 400 || upstream.statusCode === 413;
        lastFailure = new UpstreamError(`Replica ${label} answered HTTP ${upstream.statusCode}${errorMessageOf(text)}.`, {
          code: refusedInput ? UPSTREAM_REFUSED_INPUT : "upstream_error",
          retryable: isRetryableStatus(upstream.statusCode),
        });
      } catch (error) {
        if (signal.aborted) throw aborted();
        if (error instanceof LlmgwError) throw error;
        lastFailure = classifyUpstreamFailure(error, label);
        if (lastFailure.retryable) deps.admission.coolDown(replica.id);
      } finally {
        lease.release();
      }
      if (!lastFailure.retryable || !mayRetry) throw lastFailure;
    }
    if (lastFailure !== undefined) throw lastFailure;
    throw unavailableError(model, deps.replicas.forModel(model.id), "client", deps.fleetStatus?.(model.id));
  } finally {
    deps.onDemand?.finished(model);
  }
}

async function readText(body: AsyncIterable<Buffer | Uint8Array>, label: string): Promise<string> {
  const chunks: Buffer[] = [];
  let bytes = 0;
  for await (const chunk of body) {
    bytes += chunk.length;
    if (bytes > MAX_ANSWER_BYTES) throw new UpstreamError(`Replica ${label} sent an answer over ${MAX_ANSWER_BYTES} bytes.`, { code: "upstream_bad_answer" });
    chunks.push(Buffer.from(chunk));
  }
  return Buffer.concat(chunks).toString("utf8");
}

/** ": <message>" of an OpenAI error body, for the failure's text; nothing when there is none. */
function errorMessageOf(text: string): string {
  try {
    const message = (JSON.parse(text) as { error?: { message?: unknown } }).error?.message;
    return typeof message === "string" ? `: ${describeError(message).slice(0, 200)}` : "";
  } catch {
    return "";
  }
}
