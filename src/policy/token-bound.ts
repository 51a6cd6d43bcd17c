// The most tokens a request can use, known before it runs, so admission can reserve its
// worst case against a budget or a tokens-per-minute limit. No tokenizer is needed: every
// text token of every tokenizer llmgw serves (BPE and SentencePiece with byte fallback)
// covers at least one UTF-8 byte, so bytes bound tokens. The prompt is bounded by the bytes
// of the whole request body as JSON, not by the fields we know to be prompt: an engine may
// render pass-through fields into the prompt (vLLM's documents, chat_template_kwargs, a
// completions suffix), and JSON escaping only ever adds bytes. Token ids (completions and
// embeddings) take at least two bytes each in JSON ("1,"), so they are covered too. The
// template adds tokens of its own (role markers, BOS/CLS/SEP, a default system prompt),
// which the allowances below cover. Media parts (an image's tokens follow its pixels, not
// its bytes) count an allowance; only a model's context_length truly caps them.
import type { CatalogModel } from "../catalog/catalog.ts";

/** Template tokens around one message: role markers and separators (a few in every template we know; 16 leaves room). */
export const PER_MESSAGE_ALLOWANCE = 16;
/** Tokens a template adds once: BOS, a default system prompt with today's date, the generation prompt. */
export const PER_REQUEST_ALLOWANCE = 256;
/**
 * Tokens a template adds when a request sends tools: the preamble that tells the model how
 * to call functions, which is not in the body (node-llama-cpp's function-calling text, or a
 * model's own tool template). The bundled engine's was measured at ~430 tokens for one tool
 * on a ChatML model; Llama 3.1's and Hermes' templates are of the same order.
 */
export const TOOLS_ALLOWANCE = 1024;
/** Per tool defined and per tool call in the history: its name and the markers around it. */
export const PER_TOOL_ALLOWANCE = 64;
/** Special tokens around one embeddings input (BOS/CLS, SEP/EOS). */
export const PER_INPUT_ALLOWANCE = 4;
/** An image or audio part, when the model's context length is unknown (its tokens do not follow its bytes). */
export const MEDIA_PART_ALLOWANCE = 16_384;
/** Output of a request without max_tokens, for a model that states neither max_output nor context_length. */
export const DEFAULT_MAX_OUTPUT = 4096;

export interface TokenBound {
  /** The most prompt tokens. */
  prompt: number;
  /** The most output tokens: what the gateway lets the upstream generate (max_tokens). */
  output: number;
  /** The most tokens in all: prompt + output, capped at the context length (one context holds both). */
  total: number;
}

/** The upper bound of a request's prompt and output tokens, from its body and the model's limits. */
export function tokenBound(endpoint: string, body: Record<string, unknown>, model: CatalogModel, rawBytes?: number): TokenBound {
  const contextLength = model.definition.context_length ?? null;
  const capped = (tokens: number) => (contextLength === null ? tokens : Math.min(tokens, contextLength));
  const bodyBytes = rawBytes ?? bytes(JSON.stringify(body));
  if (endpoint === "/v1/embeddings") {
    // Each input is embedded in a context of its own, so the context length caps each
    // input, not their sum: n inputs may use up to n contexts' worth of tokens.
    const inputs = inputCount(body.input);
    const bytesBound = bodyBytes + PER_INPUT_ALLOWANCE * inputs;
    const prompt = contextLength === null ? bytesBound : Math.min(bytesBound, contextLength * inputs);
    return { prompt, output: 0, total: prompt };
  }
  const prompt = capped(endpoint === "/v1/completions" ? bodyBytes + PER_REQUEST_ALLOWANCE : chatPromptTokens(body, bodyBytes));
  const output = capped(maxOutput(body, model));
  return { prompt, output, total: capped(prompt + output) };
}

/**
 * The output a request may generate: the larger of max_tokens and max_completion_tokens
 * when it sends either (engines differ in which one wins, so the bound takes the larger),
 * else the model's max_output, context length, or a default.
 */
function maxOutput(body: Record<string, unknown>, model: CatalogModel): number {
  const maxTokens = positive(body.max_tokens);
  const maxCompletionTokens = positive(body.max_completion_tokens);
  if (maxTokens !== undefined || maxCompletionTokens !== undefined) return Math.max(maxTokens ?? 0, maxCompletionTokens ?? 0);
  return model.definition.max_output ?? model.definition.context_length ?? DEFAULT_MAX_OUTPUT;
}

function inputCount(input: unknown): number {
  return Array.isArray(input) && input.length > 0 && typeof input[0] !== "number" ? input.length : 1;
}

/** The body's bytes, with each media part's bytes replaced by its allowance (or kept, when more), plus the template's allowances. */
function chatPromptTokens(body: Record<string, unknown>, bodyBytes: number): number {
  let total = PER_REQUEST_ALLOWANCE + bodyBytes;
  // Tools are documented in the prompt whatever tool_choice says ("none" included).
  if (Array.isArray(body.tools) && body.tools.length > 0) total += TOOLS_ALLOWANCE + PER_TOOL_ALLOWANCE * body.tools.length;
  const messages = Array.isArray(body.messages) ? body.messages : [];
  for (const message of messages) {
    total += PER_MESSAGE_ALLOWANCE;
    const calls = (message as { tool_calls?: unknown } | null)?.tool_calls;
    if (Array.isArray(calls)) total += PER_TOOL_ALLOWANCE * calls.length;
    const content = (message as { content?: unknown } | null)?.content;
    if (!Array.isArray(content)) continue;
    for (const part of content) {
      if (typeof part !== "object" || part === null || (part as { type?: unknown }).type === "text") continue;
      const partBytes = bytes(JSON.stringify(part));
      // An image's bytes (often a long data: URL) say nothing of its tokens: the allowance
      // replaces them. A file or audio part keeps its bytes when they are more.
      const isImage = (part as { type?: unknown }).type === "image_url";
      total += (isImage ? MEDIA_PART_ALLOWANCE : Math.max(partBytes, MEDIA_PART_ALLOWANCE)) - partBytes;
    }
  }
  return total;
}

function bytes(text: string): number {
  return Buffer.byteLength(text, "utf8");
}

function positive(value: unknown): number | undefined {
  return typeof value === "number" && Number.isInteger(value) && value > 0 ? value : undefined;
}
