// The paths the gateway proxies to a replica, what each runs as upstream and which wire
// format it speaks: OpenAI's own routes pass as they are; the Anthropic Messages API,
// OpenAI's Responses API and Ollama's API are translated to and from chat completions
// (or embeddings) at the edges (wire-format.ts). Also how one answer is read and changed
// on its way back.
import type { z } from "zod";
import type { ErrorDialect } from "../core/http.ts";
import { anthropicMessages } from "./anthropic/anthropic-wire.ts";
import { OLLAMA_PROXY_ROUTES } from "./ollama/ollama-wire.ts";
import type { AnswerHead, BodyRewriter } from "./relay.ts";
import { chatCompletionSchema, completionSchema, embeddingSchema, type GatewayRequestBody } from "./request-schemas.ts";
import { StreamUsageFilter } from "./stream-usage.ts";
import type { WireExchange, WireFormat } from "./wire-format.ts";

export interface ProxyRoute {
  /** The upstream path the request runs as. */
  path: string;
  schema: z.ZodType<GatewayRequestBody>;
  /** Another wire format than OpenAI's, translated to and from `path`. */
  wire?: WireFormat;
}

const CHAT = "/v1/chat/completions";
const chat = chatCompletionSchema as z.ZodType<GatewayRequestBody>;
const embeddings = embeddingSchema as z.ZodType<GatewayRequestBody>;

/** The proxied routes; /v1/responses only where responses can be kept. */
export function proxyRoutes(formats: { responses: WireFormat | undefined }): ReadonlyMap<string, ProxyRoute> {
  const routes = new Map<string, ProxyRoute>([
    [CHAT, { path: CHAT, schema: chat }],
    ["/v1/completions", { path: "/v1/completions", schema: completionSchema as z.ZodType<GatewayRequestBody> }],
    ["/v1/embeddings", { path: "/v1/embeddings", schema: embeddings }],
    ["/v1/messages", { path: CHAT, schema: chat, wire: anthropicMessages }],
  ]);
  if (formats.responses !== undefined) routes.set("/v1/responses", { path: CHAT, schema: chat, wire: formats.responses });
  for (const [ollamaPath, { path, wire }] of Object.entries(OLLAMA_PROXY_ROUTES)) {
    routes.set(ollamaPath, { path, schema: path === CHAT ? chat : embeddings, wire });
  }
  return routes;
}

/**
 * How an answer is read and changed on its way: OpenAI's routes pass it as it is (less
 * the usage the gateway asked for on the client's behalf, stream-usage.ts); another wire
 * format's rewriter translates it. The relay reads the usage of JSON answers itself; a
 * stream's is read by its rewriter, or tapped when the client asked for it.
 */
export function answerHandling(exchange: WireExchange | null, injectUsage: boolean, errors: ErrorDialect | undefined) {
  if (exchange !== null) return { tapEventStream: false, rewrite: (head: AnswerHead): BodyRewriter => exchange.answer(head), errors };
  return { tapEventStream: !injectUsage, rewrite: injectUsage ? () => new StreamUsageFilter() : null };
}

/** A request's path without its query string or a trailing slash. */
export function pathOf(url: string | undefined): string {
  const raw = url ?? "/";
  const query = raw.indexOf("?");
  const path = query === -1 ? raw : raw.slice(0, query);
  return path.length > 1 && path.endsWith("/") ? path.slice(0, -1) : path;
}
