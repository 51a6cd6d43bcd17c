// The request side of /v1/messages: the Anthropic Messages body, checked with one zod
// schema (protocols.md §8), and its translation into the chat-completions body every
// engine takes. The mapping: `system` becomes a leading system message, `stop_sequences`
// becomes `stop`, `metadata.user_id` becomes `user`, `top_k` passes as the extension
// field llama-server and vLLM read, and a stream always asks for its usage
// (`stream_options.include_usage`), which the stream translator needs for message_delta.
//
// Unknown fields are refused, as Anthropic refuses them: a field llmgw ignored (`tools`,
// `thinking`, a misspelt `stop_sequence`) would give an answer that silently disregards
// what the client asked for. Content is text only for now; another block type (image,
// tool_use, document) is refused with its type named, rather than dropped.
import { z } from "zod";
import { parseWith } from "../../core/errors.ts";
import type { GatewayRequestBody } from "../request-schemas.ts";

/** Fields of the Messages API that llmgw does not translate yet: named as such when sent. */
const NOT_YET_SUPPORTED = new Set(["tools", "tool_choice", "thinking", "output_config", "container", "mcp_servers", "context_management"]);

const FIELDS_TAKEN = "model, messages, max_tokens, system, stop_sequences, temperature, top_p, top_k, stream, metadata";

function unknownFieldMessage(keys: readonly PropertyKey[]): string {
  const key = String(keys[0]);
  if (NOT_YET_SUPPORTED.has(key))
    return `field '${key}' is not supported by llmgw's /v1/messages yet (it takes text conversations: ${FIELDS_TAKEN}); remove it`;
  return `unknown field '${key}'; /v1/messages takes ${FIELDS_TAKEN}`;
}

/** Fields a text block may carry; cache_control is a hint to Anthropic's prompt cache, and the answer is the same without it. */
const TEXT_BLOCK_FIELDS = new Set(["type", "text", "cache_control"]);

/**
 * One content block: text, or a 400 that names what is wrong with it (a block type that
 * is not supported, a missing text). The checks are refinements rather than a stricter
 * schema so that, inside the string-or-blocks union, zod reports them with their path
 * instead of the union's general message.
 */
const contentBlock = z.looseObject({}).superRefine((block, ctx) => {
  const type = block.type;
  if (type !== "text") {
    const message =
      typeof type === "string"
        ? `content blocks of type '${type}' are not supported yet; llmgw's /v1/messages takes text blocks (type 'text') only`
        : "is required (a content block type such as 'text')";
    ctx.addIssue({ code: "custom", path: ["type"], message });
    return;
  }
  if (typeof block.text !== "string") ctx.addIssue({ code: "custom", path: ["text"], message: "is required and must be a string" });
  const extra = Object.keys(block).find((key) => !TEXT_BLOCK_FIELDS.has(key));
  if (extra !== undefined) ctx.addIssue({ code: "custom", path: [extra], message: "is not a field of a text block (type, text)" });
}) as unknown as z.ZodType<{ type: "text"; text: string }>;

const content = z.union([z.string(), z.array(contentBlock)], { error: "must be a string or an array of text blocks" });

const message = z.strictObject({
  role: z.enum(["user", "assistant"], { error: "must be 'user' or 'assistant' (a system prompt goes in the top-level 'system' field)" }),
  content,
});

export const messagesRequestSchema = z.strictObject(
  {
    model: z.string({ error: "is required and must be a string (a model name from GET /v1/models)" }).min(1, "must not be empty"),
    max_tokens: z.number({ error: "is required: the most tokens to generate, a positive integer" }).int("must be an integer").positive("must be at least 1"),
    messages: z.array(message, { error: "is required and must be an array of messages" }).min(1, "must hold at least one message"),
    system: content.optional(),
    stop_sequences: z.array(z.string().min(1, "a stop sequence must not be empty"), { error: "must be an array of strings" }).optional(),
    temperature: z.number().min(0).max(1).optional(),
    top_p: z.number().min(0).max(1).optional(),
    top_k: z.number().int().positive().optional(),
    stream: z.boolean().optional(),
    // Ignored but for its user_id, which the chat request carries as `user`.
    metadata: z.looseObject({ user_id: z.string().nullable().optional() }).optional(),
    // Hints about Anthropic's own serving (its prompt cache, its capacity tiers): the
    // answer is the same without them, so they are accepted and ignored.
    cache_control: z.unknown().optional(),
    service_tier: z.unknown().optional(),
  },
  { error: (issue) => (issue.code === "unrecognized_keys" ? unknownFieldMessage(issue.keys) : undefined) },
);

export type MessagesRequest = z.output<typeof messagesRequestSchema>;

type TextPart = { type: "text"; text: string };
type ChatContent = string | TextPart[];

function chatContent(value: string | readonly { text: string }[]): ChatContent {
  return typeof value === "string" ? value : value.map((block) => ({ type: "text", text: block.text }));
}

function asParts(value: ChatContent): TextPart[] {
  return typeof value === "string" ? [{ type: "text", text: value }] : value;
}

/**
 * The chat-completions body for a Messages request. Consecutive turns of one role are
 * joined into one message, as Anthropic combines them: many chat templates refuse two
 * user turns in a row.
 */
export function toChatBody(request: MessagesRequest): GatewayRequestBody {
  const messages: Array<{ role: "system" | "user" | "assistant"; content: ChatContent }> = [];
  if (request.system !== undefined && request.system.length > 0) messages.push({ role: "system", content: chatContent(request.system) });
  for (const turn of request.messages) {
    const previous = messages.at(-1);
    const text = chatContent(turn.content);
    if (previous !== undefined && previous.role === turn.role) previous.content = [...asParts(previous.content), ...asParts(text)];
    else messages.push({ role: turn.role, content: text });
  }
  const body: GatewayRequestBody = { model: request.model, messages, max_tokens: request.max_tokens };
  if (request.stop_sequences !== undefined && request.stop_sequences.length > 0) body.stop = request.stop_sequences;
  if (request.temperature !== undefined) body.temperature = request.temperature;
  if (request.top_p !== undefined) body.top_p = request.top_p;
  if (request.top_k !== undefined) body.top_k = request.top_k;
  const user = request.metadata?.user_id;
  if (typeof user === "string" && user !== "") body.user = user;
  if (request.stream === true) {
    body.stream = true;
    body.stream_options = { include_usage: true };
  }
  return body;
}

/** Checks a Messages body (400 naming the field) and translates it. */
export function messagesToChatBody(json: unknown): GatewayRequestBody {
  return toChatBody(parseWith(messagesRequestSchema, json, "request"));
}
