// A request llmgw itself sends to a catalog model (a guard model asked about a client's
// request): one non-stream chat completion through the same admission (a slot at a ready
// replica, else the model's queue, with an on-demand start), the same upstream pools and the
// same replica-attempt loop as client requests (try-replicas.ts), with the replica's engine
// key. It is bounded by its own timeout and by the client's signal. The caller type it
// implements, InternalCaller, is declared by the policy that uses it (request-policy.ts).
import { ClientClosedError, LlmgwError, UPSTREAM_REFUSED_INPUT, UpstreamError, describeError } from "../core/errors.ts";
import type { InternalCallRequest } from "../policy/request-policy.ts";
import { FailedBeforeAnswer, replicaLabel, tryReplicas, type ReplicaDependencies } from "./try-replicas.ts";
import { classifyUpstreamFailure, isRetryableStatus } from "./upstream.ts";

/** Replicas one internal call may try: a guard's question has a short deadline of its own. */
const MAX_ATTEMPTS = 2;
/** A guard's answer is a few words; anything far larger is not an answer to read. */
const MAX_ANSWER_BYTES = 1024 * 1024;

/** Sends one internal chat completion; resolves with the parsed JSON answer. */
export async function callModelInternally(deps: ReplicaDependencies, request: InternalCallRequest): Promise<unknown> {
  const { model } = request;
  const timeout = AbortSignal.timeout(request.timeoutMs);
  const signal = AbortSignal.any([request.signal, timeout]);
  /** Why the call stopped, once its signal fired: the client left, or the time ran out. */
  const aborted = (): LlmgwError =>
    request.signal.aborted
      ? new ClientClosedError()
      : new UpstreamError(`Model '${model.name}' did not answer within ${request.timeoutMs / 1000} s.`, { status: 504, code: "upstream_timeout" });
  return tryReplicas(deps, {
    model,
    path: "/v1/chat/completions",
    payload: (replica) => Buffer.from(JSON.stringify({ ...request.body, model: replica.upstreamModel, stream: false })),
    cancel: signal,
    maxAttempts: MAX_ATTEMPTS,
    // A guard's failure reaches the client in the guard's own 503; it names no server detail.
    audience: "client",
    aborted,
    answer: async (upstream, lease) => {
      const label = replicaLabel(model, lease.replica);
      let text: string;
      try {
        text = await readText(upstream.body, label);
      } catch (error) {
        if (signal.aborted) throw aborted();
        if (error instanceof LlmgwError) throw error;
        // Dropped while the answer was read: nothing of it was used, so another replica may answer.
        return new FailedBeforeAnswer(classifyUpstreamFailure(error, label));
      }
      const status = upstream.statusCode;
      if (status >= 200 && status < 300) {
        try {
          return JSON.parse(text) as unknown;
        } catch (error) {
          throw new UpstreamError(`Replica ${label} answered with something that is not JSON.`, { code: "upstream_bad_answer", cause: error });
        }
      }
      // 400 and 413 say the question itself was refused (a prompt longer than the model's
      // context, on llama-server and vLLM): the caller must not read that as an outage.
      const refusedInput = status === 400 || status === 413;
      throw new UpstreamError(`Replica ${label} answered HTTP ${status}${errorMessageOf(text)}.`, {
        code: refusedInput ? UPSTREAM_REFUSED_INPUT : "upstream_error",
        retryable: isRetryableStatus(status),
      });
    },
  });
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
