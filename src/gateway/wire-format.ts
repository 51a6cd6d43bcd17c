// A wire format other than OpenAI's chat completions that enters the gateway's one request
// path: its own key header, body and error shape outside, a chat-completions (or
// embeddings) request inside. The gateway runs every step (key, body limits, model,
// allowed models, limits and guards, admission, retries, the usage row) exactly as for
// /v1/chat/completions; only the edges change: the body is translated before it goes
// upstream, and the answer is rewritten on its way back (relay.ts's BodyRewriter). The
// Anthropic Messages API (anthropic/), OpenAI's Responses API (responses/) and Ollama's
// API (ollama/) are such formats.
import type { IncomingMessage } from "node:http";
import type { ErrorDialect } from "../core/http.ts";
import type { Principal } from "../keys/key-service.ts";
import type { AnswerHead, BodyRewriter } from "./relay.ts";
import type { GatewayRequestBody } from "./request-schemas.ts";

/** What a translation may know of the request besides its body. */
export interface WireContext {
  /** The key's principal: a stored conversation (a previous response) belongs to one key. */
  principal: Principal;
  /** Whether this key may use a model (or alias, or adapter) by this name: for names a format spells its own way (Ollama's `name:latest`). */
  knows(name: string): boolean;
}

/** One request in a wire format: what goes upstream, and how the answer comes back. */
export interface WireExchange {
  /** The upstream body (checked once more by the route's schema, unless `checked`). */
  body: GatewayRequestBody;
  /**
   * The translation built the body only from fields it checked against at least the
   * route's rules (ranges, a message at least), so the route's schema need not read it
   * again: a zod parse is a measurable share of a request's cost (bench/gateway/apis.ts).
   */
  checked?: boolean;
  /** The rewriter of one upstream answer (each replica attempt gets its own) back into this format. */
  answer(head: AnswerHead): BodyRewriter;
}

export interface WireFormat {
  /** The key the request carries (OpenAI's routes read `Authorization: Bearer`); may throw a 401 saying where to put it. */
  apiKey(req: IncomingMessage): string | undefined;
  /** Checks the client's JSON body (a 400 naming the field) and translates it; async where the translation reads the store. */
  begin(json: unknown, context: WireContext): WireExchange | Promise<WireExchange>;
  /** Error bodies and the failure event of a broken stream, in this format. */
  errors: ErrorDialect;
}
