// The most tokens a request can use, known before it runs, so admission can reserve its
// worst case against a budget or a tokens-per-minute limit. No tokenizer is needed: every
// text token of every tokenizer llmgw serves (BPE and SentencePiece with byte fallback)
// covers at least one UTF-8 byte, so the bytes of the text bound its tokens. The chat
// template adds tokens of its own (role markers, a default system prompt with a date), which
// the allowances below cover. Token ids (completions and embeddings) count as they are.
import type { CatalogModel } from "../catalog/catalog.ts";

/** Template tokens around one message: role markers and separators (a few in every template we know; 16 leaves room). */
export const PER_MESSAGE_ALLOWANCE = 16;
/** Tokens a template adds once: BOS, a default system prompt with today's date, the generation prompt. */
export const PER_REQUEST_ALLOWANCE = 256;
/** An image or audio part, when the model's context length is unknown (its tokens do not follow its bytes). */
export const MEDIA_PART_ALLOWANCE = 16_384;
/** Output of a request without max_tokens, for a model that states neither max_output nor context_length. */
export const DEFAULT_MAX_OUTPUT = 4096;

export interface TokenBound {
  prompt: number;
  output: number;
}

/** The upper bound of a request's prompt and output tokens, from its body and the model's limits. */
export function tokenBound(endpoint: string, body: Record<string, unknown>, model: CatalogModel): TokenBound {
  const contextLength = model.definition.context_length ?? null;
  const capped = (tokens: number) => (contextLength === null ? tokens : Math.min(tokens, contextLength));
  if (endpoint === "/v1/embeddings") return { prompt: capped(inputTokens(body.input)), output: 0 };
  const prompt = endpoint === "/v1/completions" ? inputTokens(body.prompt) + PER_REQUEST_ALLOWANCE : chatPromptTokens(body);
  return { prompt: capped(prompt), output: capped(maxOutput(body, model)) };
}

function maxOutput(body: Record<string, unknown>, model: CatalogModel): number {
  const asked = positive(body.max_tokens) ?? positive(body.max_completion_tokens);
  return asked ?? model.definition.max_output ?? model.definition.context_length ?? DEFAULT_MAX_OUTPUT;
}

/** A prompt or input: a string, strings, token ids, or lists of token ids. */
function inputTokens(input: unknown): number {
  if (typeof input === "string") return bytes(input);
  if (!Array.isArray(input)) return 0;
  let total = 0;
  for (const item of input) {
    if (typeof item === "number") total += 1;
    else if (typeof item === "string") total += bytes(item) + 1;
    else if (Array.isArray(item)) total += item.length + 1;
  }
  return total;
}

function chatPromptTokens(body: Record<string, unknown>): number {
  let total = PER_REQUEST_ALLOWANCE;
  const messages = Array.isArray(body.messages) ? body.messages : [];
  for (const message of messages) total += PER_MESSAGE_ALLOWANCE + messageTokens(message);
  // Tool and function definitions, and a response format's schema, are rendered into the prompt.
  for (const field of ["tools", "functions", "tool_choice", "response_format"]) {
    if (body[field] !== undefined && body[field] !== null) total += bytes(JSON.stringify(body[field]));
  }
  return total;
}

function messageTokens(message: unknown): number {
  if (typeof message !== "object" || message === null) return 0;
  let total = 0;
  for (const [field, value] of Object.entries(message)) {
    if (field === "content") total += contentTokens(value);
    // role, name, tool_call_id, tool_calls: whatever the template prints of them is text from here.
    else total += bytes(typeof value === "string" ? value : JSON.stringify(value) ?? "");
  }
  return total;
}

function contentTokens(content: unknown): number {
  if (typeof content === "string") return bytes(content);
  if (!Array.isArray(content)) return content === null || content === undefined ? 0 : bytes(JSON.stringify(content));
  let total = 0;
  for (const part of content) {
    if (typeof part !== "object" || part === null) continue;
    const { type, text } = part as { type?: unknown; text?: unknown };
    if (type === "text" && typeof text === "string") total += bytes(text) + 1;
    // An image's tokens follow its pixels, not its bytes; the context length caps the sum.
    else total += MEDIA_PART_ALLOWANCE;
  }
  return total;
}

function bytes(text: string): number {
  return Buffer.byteLength(text, "utf8");
}

function positive(value: unknown): number | undefined {
  return typeof value === "number" && Number.isInteger(value) && value > 0 ? value : undefined;
}
