// Failures on Ollama's routes (/api/...) in Ollama's shape: `{"error": "<message>"}` with
// the HTTP status, which is all the official clients read (ollama-js's checkOk takes
// `error` from a JSON body and keeps the status in ResponseError.status_code). Every error
// is rendered by core/errors.ts's renderError first, so the status, the headers
// (Retry-After, x-ratelimit-*) and the message stay llmgw's own; only the body changes.
// A stream that breaks after its first line ends with one more line of the same shape:
// the clients raise an error for any line that has `error`.
import { renderError } from "../../core/errors.ts";
import type { ErrorDialect, StreamFailure } from "../../core/http.ts";
import { upstreamErrorText } from "../upstream-error-text.ts";

export interface OllamaErrorBody {
  error: string;
}

/** The one renderer of llmgw's errors for /api/... */
export function renderOllamaError(error: unknown): { status: number; headers: Record<string, string>; body: OllamaErrorBody } {
  const rendered = renderError(error);
  const { message, code } = rendered.body.error;
  // The catalog's words point at /v1/models; an Ollama client lists with /api/tags.
  const said =
    code === "model_not_found" ? message.replace(/List the models with GET \/v1\/models[^.]*\./, "GET /api/tags lists the models this key can use.") : message;
  return { status: rendered.status, headers: rendered.headers, body: { error: said } };
}

/** One JSON line, as Ollama's streams are made of (application/x-ndjson). */
export function ndjsonLine(value: unknown): string {
  return `${JSON.stringify(value)}\n`;
}

/** The last line of a stream that broke after its first byte. */
export function ollamaStreamFailureEvent(failure: StreamFailure): string {
  return ndjsonLine({ error: failure.message });
}

export const OLLAMA_ERRORS: ErrorDialect = { render: renderOllamaError, streamFailureEvent: ollamaStreamFailureEvent };

/** The message of an upstream's own error answer (upstream-error-text.ts). */
export function upstreamErrorMessage(status: number, text: string): string {
  return upstreamErrorText(status, text).message;
}

/** An upstream's error answer in Ollama's shape, keeping its message. */
export function upstreamErrorBody(status: number, text: string): OllamaErrorBody {
  return { error: upstreamErrorMessage(status, text) };
}

/** The message of an error event inside an upstream's stream (OpenAI's `{"error": {...}}`, or a bare string). */
export function streamErrorMessage(error: unknown): string {
  if (typeof error === "string" && error !== "") return error;
  const fields = typeof error === "object" && error !== null ? (error as Record<string, unknown>) : {};
  return typeof fields.message === "string" && fields.message !== "" ? fields.message : "The model server failed in the middle of the answer.";
}
