// OpenAI's Responses API (`POST /v1/responses`) as a wire format of the gateway: the
// official SDK's `client.responses.create` (and the Agents SDK, which calls it first)
// talks to every model of the fleet with the same keys, limits, budgets, guards, usage
// rows and metrics as chat completions, because the request runs as /v1/chat/completions
// on every engine and only its edges are translated. This folder owns the translations
// (responses-request.ts, response-builder.ts, responses-answer.ts), the kept responses
// (response-store.ts) and their own routes (responses-routes.ts).
import { bearerToken } from "../../core/bearer.ts";
import { NotFoundError } from "../../core/errors.ts";
import { OPENAI_ERRORS } from "../../core/http.ts";
import type { WireExchange, WireFormat } from "../wire-format.ts";
import type { ResponseHead } from "./response-builder.ts";
import type { ResponseStore, StoredResponse } from "./response-store.ts";
import { newId, type StoredItem } from "./response-types.ts";
import { ResponsesAnswer, ResponsesStream, type ResponseTarget } from "./responses-answer.ts";
import { inputItems, parseResponsesRequest, toChatBody, type ResponsesRequest } from "./responses-request.ts";

/** The request's settings as the response object shows them (OpenAI's defaults where the request said nothing). */
export function echoOf(request: ResponsesRequest): Record<string, unknown> {
  return {
    instructions: request.instructions ?? null,
    max_output_tokens: request.max_output_tokens ?? null,
    max_tool_calls: request.max_tool_calls ?? null,
    metadata: request.metadata ?? {},
    // The name the client asked for, as OpenAI echoes it (not the replica's own name).
    model: request.model,
    parallel_tool_calls: request.parallel_tool_calls ?? true,
    previous_response_id: request.previous_response_id ?? null,
    reasoning: { effort: null, summary: null },
    service_tier: "default",
    store: request.store !== false,
    temperature: request.temperature ?? 1,
    text: { format: request.text?.format ?? { type: "text" }, verbosity: request.text?.verbosity ?? "medium" },
    tool_choice: request.tool_choice ?? "auto",
    tools: (request.tools ?? []).map((tool) => ({
      type: "function",
      name: tool.name,
      description: tool.description ?? null,
      parameters: tool.parameters ?? null,
      strict: tool.strict ?? null,
    })),
    top_p: request.top_p ?? 1,
    truncation: request.truncation ?? "disabled",
    user: request.user ?? null,
  };
}

export function responsesWire(store: ResponseStore): WireFormat {
  /** The exchange of a request, once the conversation it continues is known. */
  const exchange = (request: ResponsesRequest, input: StoredItem[], chain: readonly StoredResponse[], keyId: string): WireExchange => {
    const body = toChatBody(request, chain, input);
    const head: ResponseHead = { id: newId("resp"), createdAt: Math.floor(Date.now() / 1000), echo: echoOf(request) };
    const previousResponseId = request.previous_response_id ?? null;
    const target: ResponseTarget = {
      head,
      keep:
        request.store === false
          ? null
          : (response, json) => store.keep(keyId, { id: head.id, previousResponseId, model: request.model, input, response }, json),
    };
    return {
      body,
      // Model, ranges and a message at least: responses-request.ts checked what the chat schema would.
      checked: true,
      // A successful event stream is translated event by event; anything else (a JSON
      // answer, an error of the upstream) is held whole and translated at its end, into
      // the whole event sequence when the client asked for a stream and the upstream
      // answered it with JSON anyway.
      answer: (answer) =>
        answer.eventStream && answer.status === 200 ? new ResponsesStream(target) : new ResponsesAnswer(target, answer.status, request.stream === true),
    };
  };
  return {
    apiKey: (req) => bearerToken(req.headers.authorization),
    begin(json, { principal }) {
      const request = parseResponsesRequest(json);
      const input = inputItems(request);
      const previousId = request.previous_response_id ?? null;
      // Without a conversation to read, no await: most requests start one.
      if (previousId === null) return exchange(request, input, [], principal.keyId);
      return store.chain(previousId, principal.keyId).then((chain) => {
        // Another key's response is "not found" too: ids cannot be probed.
        if (chain.length === 0) {
          throw new NotFoundError(
            `Previous response '${previousId}' was not found: it does not exist, belongs to another key, was deleted${store.retentionDays === 0 ? "" : `, or is past its ${store.retentionDays}-day retention`}. Send the whole conversation in 'input' instead.`,
            { code: "previous_response_not_found", param: "previous_response_id" },
          );
        }
        return exchange(request, input, chain, principal.keyId);
      });
    },
    errors: OPENAI_ERRORS,
  };
}
