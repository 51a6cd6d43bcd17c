// The max-token fields the gateway sends upstream when a key's limits reserved a bounded
// output: no engine may generate past what the budget and rate limits reserved, whichever
// field it reads.
import type { GatewayRequestBody } from "./request-schemas.ts";

const CHAT = "/v1/chat/completions";

/**
 * The fields to set in the upstream body (null: nothing to change). max_tokens is capped,
 * or set when the client sent neither field; max_completion_tokens is capped when the
 * client sent it. A chat client that sent only max_completion_tokens keeps to that field:
 * OpenAI's reasoning models refuse max_tokens, and every engine llmgw runs reads both.
 */
export function outputCapOf(path: string, body: GatewayRequestBody, cap: number | null): Record<string, number> | null {
  if (cap === null || (path !== CHAT && path !== "/v1/completions")) return null;
  const sent = (value: unknown) => value !== undefined && value !== null;
  const capped = (value: unknown) => (typeof value === "number" && value <= cap ? value : cap);
  const completionField = path === CHAT && sent(body.max_completion_tokens);
  const fields: Record<string, number> = {};
  if (!completionField || sent(body.max_tokens)) fields.max_tokens = capped(body.max_tokens);
  if (completionField) fields.max_completion_tokens = capped(body.max_completion_tokens);
  return Object.entries(fields).every(([field, value]) => body[field] === value) ? null : fields;
}
