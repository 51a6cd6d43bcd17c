// The rate scopes of a key's request (limits.ts): the whole key's one-minute window, and
// the window of the model for this key when it has its own limits, and of the name asked
// for (an adapter's) when that has its own. Also here: how a scope
// is named in a refusal's message, and the x-ratelimit-* headers OpenAI sends, worked out
// from the scopes' windows.
import type { KeyLimits, RateLimits } from "./key-limits.ts";
import { WHOLE_KEY, type WindowRef, type WindowUse } from "./limit-store.ts";
import type { PolicyRequest } from "./request-policy.ts";

/** One rate scope a request is counted in: the whole key, or one model for it. */
export interface RateScope {
  ref: WindowRef;
  limits: RateLimits;
  /** The key's name, and the model's when the scope is one model's (messages only, built when needed). */
  keyName: string;
  model: string | null;
}

export function rateScopes(request: PolicyRequest, limits: KeyLimits, windowStart: string): RateScope[] {
  const keyId = request.principal.keyId;
  const scopes: RateScope[] = [];
  if (limits.rpm !== null || limits.tpm !== null) {
    scopes.push({ ref: { keyId, model: WHOLE_KEY, windowStart }, limits, keyName: request.principal.name, model: null });
  }
  const ofModel = limits.models.get(request.model.name);
  if (ofModel !== undefined) {
    scopes.push({ ref: { keyId, model: request.model.name, windowStart }, limits: ofModel, keyName: request.principal.name, model: request.model.name });
  }
  // A request by another name of the model (an adapter's served name, an alias) is also
  // counted under that name when the key limits it: an adapter is served like a model of its
  // own, and the model's limits still hold for it, since it runs on the model's replicas.
  const requested = request.body.model;
  if (requested !== request.model.name) {
    const ofName = limits.models.get(requested);
    if (ofName !== undefined) scopes.push({ ref: { keyId, model: requested, windowStart }, limits: ofName, keyName: request.principal.name, model: requested });
  }
  return scopes;
}

/** How a scope is named in messages. */
export function labelOf(scope: RateScope): string {
  return scope.model === null ? `for key '${scope.keyName}'` : `for key '${scope.keyName}' on model '${scope.model}'`;
}

/**
 * OpenAI's rate-limit headers, for the scope with the least left of each kind (the key's
 * own, or the model's for this key). Only for keys with rpm or tpm.
 */
export function rateHeaders(scopes: readonly RateScope[], uses: readonly WindowUse[], now: number, endsAt: number): Record<string, string> {
  // Written out rather than looped over the two kinds: it runs for every request of a
  // limited key, and the gateway benchmark counts every µs of it.
  let requestsLimit = -1;
  let requestsLeft = 0;
  let tokensLimit = -1;
  let tokensLeft = 0;
  for (let index = 0; index < scopes.length; index += 1) {
    const { rpm, tpm } = scopes[index]!.limits;
    const use = uses[index]!;
    if (rpm !== null) {
      const left = Math.max(0, rpm - use.requests);
      if (requestsLimit === -1 || left < requestsLeft) [requestsLimit, requestsLeft] = [rpm, left];
    }
    if (tpm !== null) {
      const left = Math.max(0, tpm - use.tokens);
      if (tokensLimit === -1 || left < tokensLeft) [tokensLimit, tokensLeft] = [tpm, left];
    }
  }
  const headers: Record<string, string> = {};
  if (requestsLimit === -1 && tokensLimit === -1) return headers;
  const reset = openAiDuration(endsAt - now);
  if (requestsLimit !== -1) {
    headers["x-ratelimit-limit-requests"] = String(requestsLimit);
    headers["x-ratelimit-remaining-requests"] = String(requestsLeft);
    headers["x-ratelimit-reset-requests"] = reset;
  }
  if (tokensLimit !== -1) {
    headers["x-ratelimit-limit-tokens"] = String(tokensLimit);
    headers["x-ratelimit-remaining-tokens"] = String(tokensLeft);
    headers["x-ratelimit-reset-tokens"] = reset;
  }
  return headers;
}

/** A wait the way OpenAI writes it (Go's durations): "850ms", "12s", "1m0s". Whole seconds above one, rounded up. */
export function openAiDuration(ms: number): string {
  if (ms < 1000) return `${Math.max(0, Math.ceil(ms))}ms`;
  const seconds = Math.ceil(ms / 1000);
  return seconds < 60 ? `${seconds}s` : `${Math.floor(seconds / 60)}m${seconds % 60}s`;
}
