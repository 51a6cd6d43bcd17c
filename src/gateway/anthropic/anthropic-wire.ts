// The Anthropic Messages API (`POST /v1/messages`) as a wire format of the gateway: the
// official Anthropic SDKs talk to llmgw's models, with the same keys, budgets, rate
// limits, guards, admission, retries and usage rows as OpenAI clients, because the
// request runs as /v1/chat/completions on every engine and only its edges are
// translated (gateway/wire-format.ts). This folder owns the translations: the request
// (messages-request.ts), the JSON answer (messages-answer.ts), the stream
// (messages-stream.ts) and the error shape (anthropic-errors.ts).
import type { IncomingMessage } from "node:http";
import { bearerToken } from "../../core/bearer.ts";
import { AuthenticationError } from "../../core/errors.ts";
import type { WireFormat } from "../wire-format.ts";
import { ANTHROPIC_ERRORS } from "./anthropic-errors.ts";
import { MessagesAnswer } from "./messages-answer.ts";
import { messagesToChatBody } from "./messages-request.ts";
import { MessagesStream } from "./messages-stream.ts";

/**
 * The SDKs send the key as `x-api-key`; `Authorization: Bearer` works too (Anthropic's
 * `authToken` option, and curl habits). The `anthropic-version` header the SDKs send is
 * accepted and not required: there is one version of this translation.
 */
function apiKey(req: IncomingMessage): string {
  const header = req.headers["x-api-key"];
  const key = (typeof header === "string" ? header.trim() : "") || bearerToken(req.headers.authorization);
  // Said here rather than by the key service, whose message names only the Bearer header.
  if (key === undefined)
    throw new AuthenticationError("No API key given. Send it as 'x-api-key: <key>' (or 'Authorization: Bearer <key>').", { code: "missing_api_key" });
  return key;
}

export const anthropicMessages: WireFormat = {
  apiKey,
  begin(json) {
    const body = messagesToChatBody(json);
    return {
      body,
      // A successful event stream is translated event by event; anything else (a JSON
      // answer, an error of the upstream, a stream request the upstream refused) is held
      // whole and translated at its end, into the full event sequence when the client asked
      // for a stream and the upstream answered it with JSON anyway.
      answer: (head) => (head.eventStream && head.status === 200 ? new MessagesStream(body) : new MessagesAnswer(body, head.status)),
    };
  },
  errors: ANTHROPIC_ERRORS,
};
