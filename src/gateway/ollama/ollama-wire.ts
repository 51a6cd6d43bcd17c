// Ollama's API (`/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings`) as wire
// formats of the gateway: the official ollama clients, and the tools built on them, talk
// to llmgw's models with the same keys, budgets, rate limits, guards, admission, retries
// and usage rows as OpenAI clients, because each request runs as /v1/chat/completions or
// /v1/embeddings on every engine and only its edges are translated (gateway/wire-format.ts).
// This folder owns the translations: the requests (ollama-request.ts, ollama-messages.ts,
// ollama-options.ts), the answers (ollama-answer.ts, ollama-stream.ts, ollama-lines.ts),
// the error shape (ollama-errors.ts), and the routes no replica answers: the model list,
// show, ps, version, and the model-management routes llmgw refuses (ollama-routes.ts).
import type { IncomingMessage } from "node:http";
import { bearerToken } from "../../core/bearer.ts";
import { AuthenticationError } from "../../core/errors.ts";
import type { WireFormat } from "../wire-format.ts";
import { OllamaAnswer, OllamaEmbedAnswer, type EmbeddingKind } from "./ollama-answer.ts";
import { OLLAMA_ERRORS } from "./ollama-errors.ts";
import { monotonicNanos, type GenerationKind, type NanoClock } from "./ollama-lines.ts";
import { chatRequest, embeddingsRequest, embedRequest, generateRequest } from "./ollama-request.ts";
import { OllamaStream } from "./ollama-stream.ts";

/**
 * Ollama has no keys of its own; its clients send any headers they are given, so the key
 * goes as `Authorization: Bearer`, the way every llmgw API takes one. Said here rather than
 * by the key service, whose message does not say how to set it in the ollama client.
 */
export function ollamaApiKey(req: IncomingMessage): string {
  const key = bearerToken(req.headers.authorization);
  if (key === undefined) {
    throw new AuthenticationError(
      "No API key given. Send it as 'Authorization: Bearer <key>' (in the ollama client: new Ollama({ host, headers: { Authorization: 'Bearer <key>' } }))",
      { code: "missing_api_key" },
    );
  }
  return key;
}

/** The wire format of a generation route; `clock` is for tests. */
export function ollamaGenerationWire(kind: GenerationKind, clock: NanoClock = monotonicNanos): WireFormat {
  const translate = kind === "chat" ? chatRequest : generateRequest;
  return {
    apiKey: ollamaApiKey,
    begin(json, context) {
      // The durations count from here, when llmgw took the request (ollama-lines.ts).
      const startedAt = clock();
      const { body, model, stream } = translate(json, context);
      const request = { kind, model, stream, startedAt, clock };
      return {
        body,
        // A successful event stream is translated event by event; anything else (a JSON
        // answer, an error of the upstream) is held whole and translated at its end, into
        // lines when the client asked for a stream and the upstream answered whole anyway.
        answer: (head) => (head.eventStream && head.status === 200 ? new OllamaStream(request) : new OllamaAnswer(request, head.status)),
      };
    },
    errors: OLLAMA_ERRORS,
  };
}

/** The wire format of an embedding route; `clock` is for tests. */
export function ollamaEmbeddingWire(kind: EmbeddingKind, clock: NanoClock = monotonicNanos): WireFormat {
  const translate = kind === "embed" ? embedRequest : embeddingsRequest;
  return {
    apiKey: ollamaApiKey,
    begin(json, context) {
      const startedAt = clock();
      const { body, model } = translate(json, context);
      return { body, answer: (head) => new OllamaEmbedAnswer({ kind, model, startedAt, clock }, head.status) };
    },
    errors: OLLAMA_ERRORS,
  };
}

export const ollamaChat = ollamaGenerationWire("chat");
export const ollamaGenerate = ollamaGenerationWire("generate");
export const ollamaEmbed = ollamaEmbeddingWire("embed");
export const ollamaEmbeddings = ollamaEmbeddingWire("embeddings");

/** Ollama's proxied routes: the upstream path each runs as, and its wire format. */
export const OLLAMA_PROXY_ROUTES: Readonly<Record<string, { path: "/v1/chat/completions" | "/v1/embeddings"; wire: WireFormat }>> = {
  "/api/chat": { path: "/v1/chat/completions", wire: ollamaChat },
  "/api/generate": { path: "/v1/chat/completions", wire: ollamaGenerate },
  "/api/embed": { path: "/v1/embeddings", wire: ollamaEmbed },
  "/api/embeddings": { path: "/v1/embeddings", wire: ollamaEmbeddings },
};
