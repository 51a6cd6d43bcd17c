// A wire format other than OpenAI's that enters the gateway's one request path: its own
// key header, body and error shape outside, a chat-completions request inside. The
// gateway runs every step (key, body limits, model, allowed models, limits and guards,
// admission, retries, the usage row) exactly as for /v1/chat/completions; only the edges
// change: the body is translated before it goes upstream, and the answer is rewritten on
// its way back (relay.ts's BodyRewriter). The Anthropic Messages API is one (anthropic/).
import type { IncomingMessage } from "node:http";
import type { ErrorDialect } from "../core/http.ts";
import type { AnswerHead, BodyRewriter } from "./relay.ts";
import type { GatewayRequestBody } from "./request-schemas.ts";

export interface WireFormat {
  /** The key the request carries (OpenAI's routes read `Authorization: Bearer`); may throw a 401 saying where to put it. */
  apiKey(req: IncomingMessage): string | undefined;
  /** Checks the client's JSON body (a 400 naming the field) and translates it into the upstream body. */
  toUpstream(json: unknown): GatewayRequestBody;
  /** The rewriter of one upstream answer to `request` (the translated body), back into this format. */
  answer(request: GatewayRequestBody, head: AnswerHead): BodyRewriter;
  /** Error bodies and the failure event of a broken stream, in this format. */
  errors: ErrorDialect;
}
