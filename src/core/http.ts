// The raw `node:http` helpers every handler outside Hono shares: the gateway (/v1), the
// mirror file server and the bundled engine. One JSON reply, one limited body reader
// (size and time), one error writer, one 405, and the one policy for a stream that fails
// after its first byte: a final SSE `data: {"error": ...}` event, then close, never
// `[DONE]` (the OpenAI SDKs raise an APIError for such an event, where a bare socket reset
// would surface as a connection error or, worse, as a clean end). A route of another wire
// format passes its own ErrorDialect (error body and failure event) to the same writers.
import type { IncomingMessage, ServerResponse } from "node:http";
import { ClientClosedError, LlmgwError, PayloadTooLargeError, RequestTimeoutError, renderError } from "./errors.ts";
import { formatBytes } from "./format.ts";
import { parseJsonBody } from "./json-body.ts";

/** How long a request body may take to arrive whole, unless the server is told otherwise (--body-timeout). */
export const DEFAULT_BODY_TIMEOUT_MS = 30_000;

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { ...headers, "content-type": "application/json", "content-length": String(Buffer.byteLength(text)) });
  res.end(text);
}

export const SSE_HEADERS: Readonly<Record<string, string>> = {
  "content-type": "text/event-stream; charset=utf-8",
  "cache-control": "no-cache",
  connection: "keep-alive",
  // Proxies such as nginx buffer responses unless told not to.
  "x-accel-buffering": "no",
};

export const SSE_DONE = "data: [DONE]\n\n";

/**
 * Responses that are event streams (SSE, or Ollama's JSON lines, whose own line can say what
 * failed too). Node does not keep the headers given to
 * `writeHead(status, headers)` where `getHeader` can read them, so a response is marked
 * here when its stream starts, and `endBrokenResponse` knows to end it with an event.
 */
const eventStreams = new WeakSet<ServerResponse>();

/** Sends the status and headers of an event stream (SSE_HEADERS unless given others). */
export function startEventStream(res: ServerResponse, status = 200, headers: Readonly<Record<string, string | string[]>> = SSE_HEADERS): void {
  res.writeHead(status, headers);
  eventStreams.add(res);
}

function isEventStream(res: ServerResponse): boolean {
  if (eventStreams.has(res)) return true;
  const type = res.getHeader("content-type");
  return typeof type === "string" && type.startsWith("text/event-stream");
}

export function sseData(payload: unknown): string {
  return `data: ${JSON.stringify(payload)}\n\n`;
}

/** An event with a name (`event:` line), as the Anthropic Messages API streams them. */
export function sseNamedEvent(name: string, payload: unknown): string {
  return `event: ${name}\ndata: ${JSON.stringify(payload)}\n\n`;
}

/** What the last event of a failed stream says; `code` tells the client which failure it was. */
export interface StreamFailure {
  message: string;
  code: string;
}

/** The final event of a stream that broke after its first byte (OpenAI's error object). */
export function streamFailureEvent(failure: StreamFailure): string {
  return sseData({ error: { message: failure.message, type: "server_error", param: null, code: failure.code } });
}

/**
 * How one wire format answers failures: the error body with its status and headers, and
 * the last event of a stream that broke. OpenAI's (renderError) unless a route speaks
 * another format (the Anthropic Messages API, gateway/anthropic/).
 */
export interface ErrorDialect {
  render(error: unknown): { status: number; headers: Record<string, string>; body: unknown };
  streamFailureEvent(failure: StreamFailure): string;
}

export const OPENAI_ERRORS: ErrorDialect = { render: renderError, streamFailureEvent };

/**
 * Ends a response whose headers are already out because something failed mid-answer. An
 * event stream gets the failure event and then closes; any other body cannot say anything
 * any more, so the connection is destroyed and the client sees a truncated answer, never
 * one that looks complete.
 */
export function endBrokenResponse(res: ServerResponse, failure: StreamFailure, dialect: ErrorDialect = OPENAI_ERRORS): void {
  if (res.destroyed || res.writableEnded) return;
  if (isEventStream(res)) {
    // Close the connection after this: the stream's framing is intact, but the upstream
    // that fed it is gone, and a keep-alive reuse gains nothing. The socket is taken now:
    // a finished response is detached from it (res.socket is null in the callback).
    const socket = res.socket;
    res.end(dialect.streamFailureEvent(failure), () => socket?.destroySoon());
    return;
  }
  res.destroy();
}

export function methodNotAllowed(method: string, path: string, allowed: string): LlmgwError {
  return new LlmgwError({
    message: `${method} is not allowed on ${path}; use ${allowed}.`,
    code: "method_not_allowed",
    status: 405,
    headers: { allow: allowed },
  });
}

/**
 * Answers an error: the error shape of the dialect (OpenAI's by default) with its status
 * and headers, or, when the answer had already begun, `endBrokenResponse`. A HEAD request
 * gets the headers only.
 */
export function sendError(req: IncomingMessage, res: ServerResponse, error: unknown, dialect: ErrorDialect = OPENAI_ERRORS): void {
  // The client is gone (or the answer is done): nobody would read it.
  if (res.destroyed || res.writableEnded) return;
  if (res.headersSent) {
    const rendered = renderError(error).body.error;
    endBrokenResponse(res, { message: rendered.message, code: rendered.code ?? "internal_error" }, dialect);
    return;
  }
  const rendered = dialect.render(error);
  const text = JSON.stringify(rendered.body);
  res.writeHead(rendered.status, {
    ...rendered.headers,
    // Answered before the body was read (a bad key, an unknown path): Node would go on
    // reading and dropping the rest, which a client could trickle forever. Close instead.
    ...(req.complete ? {} : { connection: "close" }),
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(text)),
  });
  res.end(req.method === "HEAD" ? undefined : text);
}

export interface BodyLimits {
  /** Largest body accepted, in bytes; more is a 413 and the connection closes. */
  maxBytes: number;
  /** The whole body must arrive within this after reading starts; else 408 and the connection closes. */
  timeoutMs?: number;
  /** What to tell the client about the size limit (how to get under it). */
  tooLargeHint?: string;
}

/**
 * Reads a request body of at most `maxBytes`. It settles in every case: the whole body,
 * a 413 (declared or actual size over the limit), a 408 (the body stalled past
 * `timeoutMs`: a client with a valid key must not hold a socket forever), or a 499 when
 * the client went away first. The 413 and 408 carry `connection: close`, so the rest of
 * the body is never read.
 */
export function readLimitedBody(req: IncomingMessage, limits: BodyLimits): Promise<Buffer> {
  const tooLarge = () =>
    new PayloadTooLargeError(
      `The request body is larger than ${formatBytes(limits.maxBytes)}, the limit here.${limits.tooLargeHint ? ` ${limits.tooLargeHint}` : ""}`,
      {
        code: "request_too_large",
        headers: { connection: "close" },
      },
    );
  const declared = Number(req.headers["content-length"] ?? NaN);
  if (Number.isFinite(declared) && declared > limits.maxBytes) return Promise.reject(tooLarge());
  return new Promise<Buffer>((resolve, reject) => {
    if (req.destroyed || req.readableEnded) {
      // The client left (or the body was consumed) while the request waited, say on a key check.
      reject(new ClientClosedError("The client closed the connection before its request body was read."));
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    let timer: NodeJS.Timeout | undefined;
    const settle = (outcome: () => void): void => {
      if (timer !== undefined) clearTimeout(timer);
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", onError);
      req.off("close", onClose);
      outcome();
    };
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > limits.maxBytes) {
        req.pause();
        settle(() => reject(tooLarge()));
        return;
      }
      chunks.push(chunk);
    };
    const onEnd = (): void => settle(() => resolve(Buffer.concat(chunks, size)));
    // An aborted request emits 'error' (ECONNRESET "aborted") before 'close': still the client leaving.
    const onError = (error: Error): void =>
      settle(() => reject(new ClientClosedError("The client closed the connection before sending the whole body.", { cause: error })));
    const onClose = (): void => settle(() => reject(new ClientClosedError("The client closed the connection before sending the whole body.")));
    if (limits.timeoutMs !== undefined && limits.timeoutMs > 0) {
      const seconds = limits.timeoutMs / 1000;
      timer = setTimeout(() => {
        req.pause();
        settle(() =>
          reject(
            new RequestTimeoutError(
              `The request body did not arrive within ${seconds} s (received ${size} bytes). Send the whole body at once, or ask the operator to raise --body-timeout.`,
              {
                code: "body_timeout",
              },
            ),
          ),
        );
      }, limits.timeoutMs);
      timer.unref();
    }
    req.on("data", onData);
    req.on("end", onEnd);
    req.on("error", onError);
    req.on("close", onClose);
  });
}

/**
 * Body limits of the JSON APIs beyond /v1 (admin API, mirror routes): their documents (a
 * model definition, a key, a fetch request) are small, so 1 MiB is plenty.
 */
export const JSON_API_BODY_LIMITS: BodyLimits = {
  maxBytes: 1024 * 1024,
  timeoutMs: DEFAULT_BODY_TIMEOUT_MS,
  tooLargeHint: "Admin API bodies are small JSON documents; check what is being sent.",
};

/** What a Hono route on @hono/node-server offers for reading its body. */
export interface JsonRequestSource {
  env?: unknown;
  req: { text(): Promise<string> };
}

/**
 * The JSON body of an admin route, read with the same size and time limits as /v1 bodies:
 * on the node server straight from the socket (`env.incoming`), so a stalled body gets
 * its 408 like any other; in Hono's in-process test requests, which have no socket, from
 * the request object.
 */
export async function readJsonRequest(c: JsonRequestSource, limits: BodyLimits, options: { emptyAs?: unknown } = {}): Promise<unknown> {
  const incoming = (c.env as { incoming?: IncomingMessage } | undefined)?.incoming;
  const text = incoming === undefined ? await c.req.text() : (await readLimitedBody(incoming, limits)).toString("utf8");
  // Routes whose every field is optional may take no body at all.
  if (options.emptyAs !== undefined && text.trim() === "") return options.emptyAs;
  return parseJsonBody(text);
}
