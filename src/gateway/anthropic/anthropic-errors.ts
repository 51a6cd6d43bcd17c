// Failures on /v1/messages in the Anthropic Messages API's shape,
// `{"type":"error","error":{"type","message"}}` (protocols.md §8). Every error is rendered
// by core/errors.ts's renderError first, so the status, the headers (Retry-After,
// x-ratelimit-*) and the message stay llmgw's own; only the body's shape and its `type`
// change. llmgw keeps its status codes rather than Anthropic's 529 for a full queue: the
// official SDKs choose their error class and retries by status (429 and 5xx are retried,
// honouring Retry-After), and one status per failure keeps usage rows and metrics alike
// on both wire formats. The `type` says what happened: a model too busy to take the
// request (a full queue, a queue wait that ran out) is `overloaded_error`; other 503s
// (a model starting or parked, the database away) are `api_error`, because retrying
// against the same load does not help them and their message says what does.
import { renderError } from "../../core/errors.ts";
import { sseNamedEvent, type ErrorDialect, type StreamFailure } from "../../core/http.ts";
import { upstreamErrorText } from "../upstream-error-text.ts";

export type AnthropicErrorType =
  | "invalid_request_error"
  | "authentication_error"
  | "permission_error"
  | "not_found_error"
  | "request_too_large"
  | "rate_limit_error"
  | "api_error"
  | "overloaded_error";

export interface AnthropicErrorBody {
  type: "error";
  error: { type: AnthropicErrorType; message: string };
}

/** llmgw error codes that mean the model has more requests than it can take now. */
const OVERLOAD_CODES = new Set(["model_overloaded", "queue_timeout"]);

export function anthropicErrorType(status: number, code: string | null): AnthropicErrorType {
  if (code !== null && OVERLOAD_CODES.has(code)) return "overloaded_error";
  switch (status) {
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

export function anthropicErrorBody(type: AnthropicErrorType, message: string): AnthropicErrorBody {
  return { type: "error", error: { type, message } };
}

/** The one renderer of llmgw's errors for /v1/messages. */
export function renderAnthropicError(error: unknown): { status: number; headers: Record<string, string>; body: AnthropicErrorBody } {
  const rendered = renderError(error);
  const { message, code } = rendered.body.error;
  return { status: rendered.status, headers: rendered.headers, body: anthropicErrorBody(anthropicErrorType(rendered.status, code), message) };
}

/**
 * The last event of a stream that broke after its first byte: Anthropic's `event: error`,
 * which the official SDKs raise as an APIError. A replica that failed mid-answer is an
 * `api_error` (its failure, not load).
 */
export function anthropicStreamFailureEvent(failure: StreamFailure): string {
  return sseNamedEvent("error", anthropicErrorBody("api_error", failure.message));
}

export const ANTHROPIC_ERRORS: ErrorDialect = { render: renderAnthropicError, streamFailureEvent: anthropicStreamFailureEvent };

/** An upstream's own error answer (an engine's 400 for a prompt longer than its context, say) in Anthropic's shape, keeping its message. */
export function upstreamErrorBody(status: number, text: string): AnthropicErrorBody {
  const { message, code } = upstreamErrorText(status, text);
  return anthropicErrorBody(anthropicErrorType(status, code), message);
}
