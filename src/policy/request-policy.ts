// The seams between the gateway's hot path and the policy it asks before a request runs:
// limits (budgets and rate limits, which reserve at admission and settle at the end) and
// guard models (which look at the input before it reaches a replica and, for answers that
// are not streamed, at the output before it reaches the client). The gateway depends only
// on these interfaces; src/policy implements them. The one seam the other way, how a guard
// asks its model (InternalCaller), is declared here too, so the policy never imports the
// gateway that imports it.
import type { CatalogModel } from "../catalog/catalog.ts";
import type { Principal } from "../keys/key-service.ts";
import type { TokenUsage } from "../core/token-usage.ts";

/** What one /v1 request asks for, as the policy sees it once the model is resolved. */
export interface PolicyRequest {
  principal: Principal;
  model: CatalogModel;
  /** The parsed chat-completions (or completions, embeddings) body. */
  body: { model: string; [key: string]: unknown };
  /**
   * The request body's length in bytes as it arrived, when that body is `body` itself (not
   * a translation): an upper bound of `JSON.stringify(body)`'s, since parsing only drops
   * whitespace and escapes. Lets the limits skip serialising the body again.
   */
  rawBytes?: number;
  /** The OpenAI path the request runs as (an Anthropic request runs as /v1/chat/completions). */
  endpoint: string;
}

/** A request admitted by the limits: what it reserved, until it settles. */
export interface LimitsPermit {
  /** Headers every answer to this request carries (x-ratelimit-*); empty for an unlimited key. */
  readonly headers: Readonly<Record<string, string>>;
  /**
   * The output tokens the reservation covers, when the key has a budget or a tokens-per-minute
   * limit (null or absent otherwise): the gateway caps the upstream's max_tokens at it, so an
   * answer cannot outgrow what was reserved.
   */
  readonly maxOutputTokens?: number | null;
  /**
   * Replaces the reservation by what the request used. Called exactly once, whatever the
   * outcome. `usage` null with `answered` false: no replica produced an answer (refused,
   * failed before its first byte, or sent its own error answer), which costs nothing; null
   * with `answered` true: a replica answered, or began to, without token counts (an
   * external server, a broken stream, a client that left), so the reservation stands.
   * The gateway decides which (gateway/request-outcome.ts).
   */
  settle(outcome: { usage: TokenUsage | null; answered: boolean }): void;
}

export interface RequestLimits {
  /**
   * Reserves the request's worst case against the key's budget and rate limits, atomically
   * in the store. Refused: throws a 429 LlmgwError (insufficient_quota or rate_limit_exceeded)
   * whose headers include Retry-After and the x-ratelimit-* headers; that is always a
   * rejected promise, never a synchronous throw. A permit may come back without a promise
   * (nothing to wait for), so callers await only what is a promise.
   */
  admit(request: PolicyRequest): LimitsPermit | Promise<LimitsPermit>;
}

/** One question llmgw itself asks a catalog model (a guard model asked about a client's request). */
export interface InternalCallRequest {
  model: CatalogModel;
  /** The chat-completions body without `model` (each replica gets its own upstream name). */
  body: Record<string, unknown>;
  /** The whole call, a wait in the model's queue included. */
  timeoutMs: number;
  /** The client's request: a client that leaves cancels the call. */
  signal: AbortSignal;
}

/**
 * Sends one non-stream chat completion through the gateway's admission and replicas and
 * resolves with the parsed JSON answer; the gateway implements it (gateway/internal-call.ts).
 * A model that refused the question itself rejects with code UPSTREAM_REFUSED_INPUT.
 */
export type InternalCaller = (request: InternalCallRequest) => Promise<unknown>;

/** Checks an answer that is not streamed before the client sees it; throws to refuse it. */
export type OutputCheck = (answer: Buffer) => Promise<void>;

export interface RequestGuards {
  /** Whether any guard is named for this request's model or key; when none is, checkInput is not called. */
  applies(request: PolicyRequest): boolean;
  /**
   * Asks the guard models named for this model or key about the input; throws a 400
   * content_policy_violation (unsafe) or 503 (guard failed, fail closed). Resolves with
   * the milliseconds spent, or null when no guard applies, and an output check when an
   * output guard applies to this (non-stream) request.
   */
  checkInput(request: PolicyRequest, signal: AbortSignal): Promise<{ guardMs: number | null; output: OutputCheck | null }>;
}
