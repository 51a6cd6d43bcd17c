// The one error hierarchy of llmgw. Every failure a user can see is an LlmgwError with a
// stable `code`, the HTTP `status` it maps to, whether retrying may help, and the
// underlying `cause`. `renderError` is the only place that turns an error into the
// OpenAI error shape `{"error":{"message","type","param","code"}}`, so every prefix
// (/v1, /api/v1, /agent/v1, /mirror) answers failures the same way.
import type { z } from "zod";
import { clause } from "./format.ts";

export interface LlmgwErrorOptions {
  message: string;
  code: string;
  status: number;
  /** OpenAI's `type` field; derived from the status when omitted. */
  type?: string;
  /** The request field that was wrong, when one was. */
  param?: string | null;
  retryable?: boolean;
  cause?: unknown;
  /** Extra response headers (for example Retry-After). */
  headers?: Record<string, string>;
}

export class LlmgwError extends Error {
  readonly code: string;
  readonly status: number;
  readonly type: string;
  readonly param: string | null;
  readonly retryable: boolean;
  readonly headers: Record<string, string>;

  constructor(options: LlmgwErrorOptions) {
    super(options.message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code;
    this.status = options.status;
    this.type = options.type ?? typeForStatus(options.status);
    this.param = options.param ?? null;
    this.retryable = options.retryable ?? false;
    this.headers = options.headers ?? {};
  }
}

type Detail = Partial<Omit<LlmgwErrorOptions, "message" | "status">>;

/** 400: the request itself is wrong; `param` names the field. */
export class BadRequestError extends LlmgwError {
  constructor(message: string, detail: Detail = {}) {
    super({ code: "invalid_request", ...detail, message, status: 400 });
  }
}

/** 401: no key, an unknown key, a revoked or expired key. */
export class AuthenticationError extends LlmgwError {
  constructor(message: string, detail: Detail = {}) {
    super({ code: "invalid_api_key", ...detail, message, status: 401 });
  }
}

/** 403: a valid key that may not do this. */
export class PermissionDeniedError extends LlmgwError {
  constructor(message: string, detail: Detail = {}) {
    super({ code: "permission_denied", ...detail, message, status: 403 });
  }
}

export class NotFoundError extends LlmgwError {
  constructor(message: string, detail: Detail = {}) {
    super({ code: "not_found", ...detail, message, status: 404 });
  }
}

export class ConflictError extends LlmgwError {
  constructor(message: string, detail: Detail = {}) {
    super({ code: "conflict", ...detail, message, status: 409 });
  }
}

export class PayloadTooLargeError extends LlmgwError {
  constructor(message: string, detail: Detail = {}) {
    super({ code: "payload_too_large", ...detail, message, status: 413 });
  }
}

/** 408: the client did not send its request (headers or body) in time; the connection closes. */
export class RequestTimeoutError extends LlmgwError {
  constructor(message: string, detail: Detail = {}) {
    super({ code: "request_timeout", ...detail, message, status: 408, headers: { ...(detail.headers ?? {}), connection: "close" } });
  }
}

/** Response headers plus `Retry-After` when a wait is given (429 and 503 answers). */
function withRetryAfter(headers: Record<string, string> | undefined, seconds: number | undefined): Record<string, string> {
  return { ...(headers ?? {}), ...(seconds === undefined ? {} : { "retry-after": String(seconds) }) };
}

/** 429: too much at once (a full queue, a rate limit); Retry-After says when to come back. */
export class TooManyRequestsError extends LlmgwError {
  constructor(message: string, detail: Detail & { retryAfterSeconds?: number } = {}) {
    const { retryAfterSeconds, ...rest } = detail;
    super({
      code: "too_many_requests",
      retryable: true,
      ...rest,
      message,
      status: 429,
      headers: withRetryAfter(rest.headers, retryAfterSeconds),
    });
  }
}

/**
 * 499 (nginx's "client closed request"): the client went away before the answer. Nobody
 * receives it; it keeps usage rows and logs honest about why a request ended.
 */
export class ClientClosedError extends LlmgwError {
  constructor(message = "The client closed the connection before the answer.", detail: Detail = {}) {
    super({ code: "client_closed", ...detail, message, status: 499 });
  }
}

/** 503: nothing can serve this right now; Retry-After tells the client when to come back. */
export class UnavailableError extends LlmgwError {
  constructor(message: string, detail: Detail & { retryAfterSeconds?: number } = {}) {
    const { retryAfterSeconds, ...rest } = detail;
    super({
      code: "unavailable",
      retryable: true,
      ...rest,
      message,
      status: 503,
      headers: withRetryAfter(rest.headers, retryAfterSeconds),
    });
  }
}

/** 502/504: an upstream (engine, registry, external server) failed. */
export class UpstreamError extends LlmgwError {
  constructor(message: string, detail: Detail & { status?: number } = {}) {
    const { status, ...rest } = detail;
    super({ code: "upstream_error", ...rest, message, status: status ?? 502 });
  }
}

/**
 * The code of an UpstreamError from a model that refused the question itself (its HTTP 400
 * or 413: a prompt longer than its context, on llama-server and vLLM), which a caller must
 * not read as an outage. The gateway sets it on llmgw's own calls; the guard models read it.
 */
export const UPSTREAM_REFUSED_INPUT = "upstream_refused_input";

export class InternalError extends LlmgwError {
  constructor(message: string, detail: Detail = {}) {
    super({ code: "internal_error", ...detail, message, status: 500 });
  }
}

function typeForStatus(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 408) return "invalid_request_error";
  if (status === 409) return "conflict_error";
  if (status === 413) return "invalid_request_error";
  if (status === 429) return "rate_limit_error";
  if (status === 503) return "service_unavailable_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

/** Turns a zod failure into a 400 that names the first offending field. */
export function fromZodError(error: z.ZodError, what = "request body"): BadRequestError {
  const issue = error.issues[0];
  const path = issue ? issue.path.map(String).join(".") : "";
  const reason = issue?.message ?? "invalid";
  const message = path === "" ? `Invalid ${what}: ${reason}.` : `Invalid ${what}: field '${path}': ${reason}.`;
  return new BadRequestError(message, {
    code: "invalid_field",
    param: path === "" ? null : path,
    cause: error,
  });
}

/** Parses `value` with `schema`, throwing a 400 naming the field on failure. */
export function parseWith<T extends z.ZodType>(schema: T, value: unknown, what = "request body"): z.output<T> {
  const result = schema.safeParse(value);
  if (!result.success) throw fromZodError(result.error, what);
  return result.data;
}

export interface RenderedError {
  status: number;
  headers: Record<string, string>;
  body: { error: { message: string; type: string; param: string | null; code: string | null } };
}

/**
 * The single renderer of errors into OpenAI's error shape. Anything that is not an
 * LlmgwError is an internal fault: its text is not shown to the client (it may hold
 * paths or secrets); the caller logs it.
 */
export function renderError(error: unknown): RenderedError {
  const known = error instanceof LlmgwError ? error : new InternalError("Internal error in llmgw; the server log has the details.");
  return {
    status: known.status,
    headers: known.headers,
    body: { error: { message: known.message, type: known.type, param: known.param, code: known.code } },
  };
}

/**
 * The first string `code` on an error or its chain of causes (Node's errno codes such as
 * ECONNREFUSED, undici's UND_ERR_*), for classifying failures without reading messages.
 * undici's generic "UND_ERR" says nothing, so the search goes on past it.
 */
export function errorCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 5 && typeof current === "object" && current !== null; depth += 1) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string" && code !== "UND_ERR") return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/**
 * Best-effort text of any thrown value, for logs, recorded failures and messages that go
 * on after it. A final full stop is dropped (an ellipsis is kept): most messages are
 * sentences, and "failed: ${describeError(error)}. Try again" would otherwise end one twice.
 */
export function describeError(error: unknown): string {
  return clause(error instanceof Error ? error.message : String(error));
}
