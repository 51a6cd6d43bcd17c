// The request side of /v1/responses: OpenAI's Responses body, checked field by field, and
// its translation into the chat-completions body every engine takes. The mapping:
// `instructions` becomes a leading system message; the conversation is the kept chain of
// `previous_response_id` (each response's input items, then its output) followed by this
// request's `input`; messages keep their role (developer becomes system, which every chat
// template knows); function_call items become an assistant message's tool_calls and
// function_call_output items tool messages; `tools` (function tools) and `tool_choice`
// take the chat shape; `text.format` becomes response_format; `max_output_tokens` becomes
// max_tokens. A stream always asks for its usage, which response.completed carries.
//
// Unknown fields and item types are refused with a 400 naming them, as OpenAI refuses
// them, and so are OpenAI's built-in tools (web search, file search, computer use, code
// interpreter...), which no engine here runs: an answer that silently ignored them would
// look like the model's own.
import { z } from "zod";
import { BadRequestError, parseWith } from "../../core/errors.ts";
import type { GatewayRequestBody } from "../request-schemas.ts";
import type { StoredResponse } from "./response-store.ts";
import { newId, type StoredItem } from "./response-types.ts";

const FIELDS_TAKEN =
  "model, input, instructions, previous_response_id, store, stream, tools, tool_choice, parallel_tool_calls, text, max_output_tokens, temperature, top_p, metadata, user";

/** Fields of the Responses API that need what llmgw does not have (background jobs, conversations objects, prompt templates). */
const NOT_SUPPORTED: Record<string, string> = {
  conversation: "conversations are not kept by llmgw; chain responses with previous_response_id",
  prompt: "prompt templates are not kept by llmgw; send the input and instructions themselves",
  top_logprobs: "log probabilities are not returned by llmgw's /v1/responses; use /v1/chat/completions with logprobs",
};

function unknownFieldMessage(keys: readonly PropertyKey[]): string {
  const key = String(keys[0]);
  return `unknown field '${key}'; /v1/responses takes ${FIELDS_TAKEN}`;
}

const functionTool = z.strictObject({
  type: z.literal("function"),
  name: z.string({ error: "is required: the function's name" }).min(1, "must not be empty"),
  description: z.string().nullish(),
  parameters: z.record(z.string(), z.unknown()).nullish(),
  strict: z.boolean().nullish(),
});

/** A tool: a function, or a 400 naming the built-in tool that is not served. */
const tool = z.looseObject({}).superRefine((value, ctx) => {
  const type = value.type;
  if (type === "function") {
    const parsed = functionTool.safeParse(value);
    for (const issue of parsed.error?.issues ?? []) ctx.addIssue({ ...issue, code: "custom", path: issue.path, message: issue.message });
    return;
  }
  ctx.addIssue({
    code: "custom",
    path: ["type"],
    message:
      typeof type === "string"
        ? `built-in tool '${type}' is not supported: llmgw's models call function tools only (type 'function')`
        : "is required: 'function' (llmgw's models call function tools only)",
  });
}) as unknown as z.ZodType<z.output<typeof functionTool>>;

const toolChoice = z.union([z.enum(["none", "auto", "required"]), z.strictObject({ type: z.literal("function"), name: z.string().min(1) })], {
  error: "must be 'none', 'auto', 'required' or {type: 'function', name} (built-in tools are not served)",
});

const textFormat = z.discriminatedUnion(
  "type",
  [
    z.strictObject({ type: z.literal("text") }),
    z.strictObject({ type: z.literal("json_object") }),
    z.strictObject({
      type: z.literal("json_schema"),
      name: z.string({ error: "is required: a name for the schema" }).min(1),
      schema: z.record(z.string(), z.unknown(), { error: "is required: a JSON schema object" }),
      description: z.string().nullish(),
      strict: z.boolean().nullish(),
    }),
  ],
  { error: "must be {type: 'text'}, {type: 'json_object'} or {type: 'json_schema', name, schema}" },
);

export const responsesRequestSchema = z.strictObject(
  {
    model: z.string({ error: "is required and must be a string (a model name from GET /v1/models)" }).min(1, "must not be empty"),
    input: z.union([z.string(), z.array(z.unknown())], { error: "is required: a string, or an array of input items" }),
    instructions: z.string().nullish(),
    previous_response_id: z.string().min(1).nullish(),
    store: z.boolean().nullish(),
    stream: z.boolean().nullish(),
    tools: z.array(tool).nullish(),
    tool_choice: toolChoice.nullish(),
    parallel_tool_calls: z.boolean().nullish(),
    text: z
      .strictObject({
        format: textFormat.nullish(),
        // OpenAI's hint for how long its reasoning models answer; llmgw's engines have no such knob.
        verbosity: z.enum(["low", "medium", "high"]).nullish(),
      })
      .nullish(),
    max_output_tokens: z.number().int("must be an integer").positive("must be at least 1").nullish(),
    temperature: z.number().min(0).max(2).nullish(),
    top_p: z.number().min(0).max(1).nullish(),
    metadata: z.record(z.string(), z.string().max(512)).nullish(),
    user: z.string().nullish(),
    // Accepted, and each changes nothing here:
    // - truncation: llmgw never drops turns ('disabled'); a conversation over the context is refused by the engine either way.
    // - reasoning, include: the models here return no reasoning items, and nothing else `include` can add is produced.
    // - service_tier, safety_identifier, prompt_cache_key, stream_options: hints about OpenAI's own serving.
    // - max_tool_calls: it bounds calls of built-in tools, which are not served.
    truncation: z.enum(["auto", "disabled"]).nullish(),
    reasoning: z.looseObject({}).nullish(),
    include: z.array(z.string()).nullish(),
    service_tier: z.string().nullish(),
    safety_identifier: z.string().nullish(),
    prompt_cache_key: z.string().nullish(),
    stream_options: z.looseObject({}).nullish(),
    max_tool_calls: z.number().int().min(0).nullish(),
    background: z.literal(false, { error: "background responses are not supported by llmgw; send the request without it" }).nullish(),
  },
  // Unknown fields are refused before the schema runs (parseResponsesRequest), with the field as the param.
);

export type ResponsesRequest = z.output<typeof responsesRequestSchema>;

type ChatPart = { type: "text"; text: string } | { type: "image_url"; image_url: { url: string; detail?: string } };
type ToolCall = { id: string; type: "function"; function: { name: string; arguments: string } };
type ChatMessage =
  | { role: "system" | "user"; content: string | ChatPart[] }
  | { role: "assistant"; content: string | null; tool_calls?: ToolCall[] }
  | { role: "tool"; tool_call_id: string; content: string };

const MESSAGE_ROLES = new Set(["user", "assistant", "system", "developer"]);
const TEXT_PARTS = new Set(["input_text", "output_text"]);
/** Item types of OpenAI's built-in tools and features that llmgw's engines do not run. */
const ITEM_TYPES_TAKEN = "message, function_call, function_call_output";

function refuse(path: string, message: string): never {
  throw new BadRequestError(`Invalid request: field '${path}': ${message}.`, { code: "invalid_field", param: path });
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function requireString(item: Record<string, unknown>, field: string, path: string): string {
  const value = item[field];
  if (typeof value !== "string") refuse(`${path}.${field}`, "is required and must be a string");
  return value;
}

/** A message's content parts, checked; a string becomes one text part of the role's kind. */
function messageParts(item: Record<string, unknown>, role: string, path: string): Record<string, unknown>[] {
  const content = item.content;
  if (typeof content === "string") return [{ type: role === "assistant" ? "output_text" : "input_text", text: content }];
  if (!Array.isArray(content)) refuse(`${path}.content`, "is required: a string or an array of content parts");
  return content.map((part, index) => {
    const at = `${path}.content[${index}]`;
    if (!isObject(part)) refuse(at, "must be a content part object");
    const type = part.type;
    if (typeof type === "string" && TEXT_PARTS.has(type)) {
      requireString(part, "text", at);
      return part;
    }
    if (type === "refusal" && role === "assistant") {
      requireString(part, "refusal", at);
      return part;
    }
    if (type === "input_image" && role === "user") {
      if (part.file_id != null) refuse(`${at}.file_id`, "files are not kept by llmgw; send the image as image_url (a URL or a data: URL)");
      requireString(part, "image_url", at);
      return part;
    }
    return refuse(
      `${at}.type`,
      typeof type === "string"
        ? `content parts of type '${type}' are not supported in a ${role} message (text: input_text or output_text; images: input_image in user messages)`
        : "is required (input_text, output_text or input_image)",
    );
  });
}

/** One input item, checked, with an id (the client's, or a new one) for input_items. */
function checkItem(raw: unknown, index: number): StoredItem {
  const path = `input[${index}]`;
  if (!isObject(raw)) refuse(path, "must be an item object");
  const type = raw.type ?? (raw.role !== undefined ? "message" : undefined);
  const id = typeof raw.id === "string" && raw.id !== "" ? raw.id : null;
  switch (type) {
    case "message": {
      const role = raw.role;
      if (typeof role !== "string" || !MESSAGE_ROLES.has(role)) refuse(`${path}.role`, "must be 'user', 'assistant', 'system' or 'developer'");
      return { id: id ?? newId("msg"), type: "message", role, status: "completed", content: messageParts(raw, role, path) };
    }
    case "function_call":
      return {
        id: id ?? newId("fc"),
        type: "function_call",
        status: "completed",
        call_id: requireString(raw, "call_id", path),
        name: requireString(raw, "name", path),
        arguments: requireString(raw, "arguments", path),
      };
    case "function_call_output": {
      const output = raw.output;
      if (typeof output !== "string" && !Array.isArray(output)) refuse(`${path}.output`, "is required: the function's result as a string (or text parts)");
      return { id: id ?? newId("fco"), type: "function_call_output", status: "completed", call_id: requireString(raw, "call_id", path), output };
    }
    default:
      return refuse(
        `${path}.type`,
        typeof type === "string"
          ? `items of type '${type}' are not supported; llmgw's /v1/responses takes ${ITEM_TYPES_TAKEN} items`
          : `is required (${ITEM_TYPES_TAKEN})`,
      );
  }
}

/** The request's input as items: a string is one user message. */
export function inputItems(request: ResponsesRequest): StoredItem[] {
  if (typeof request.input === "string") {
    return [{ id: newId("msg"), type: "message", role: "user", status: "completed", content: [{ type: "input_text", text: request.input }] }];
  }
  if (request.input.length === 0) refuse("input", "must hold at least one item");
  return request.input.map(checkItem);
}

function textOf(parts: readonly Record<string, unknown>[]): string {
  return parts.map((part) => (typeof part.text === "string" ? part.text : typeof part.refusal === "string" ? part.refusal : "")).join("");
}

/** A function's output as the tool message's text: a string, or its text parts joined. */
function outputText(output: unknown, path: string): string {
  if (typeof output === "string") return output;
  const parts = output as unknown[];
  return parts
    .map((part, index) => {
      if (isObject(part) && (part.type === "input_text" || part.type === "output_text") && typeof part.text === "string") return part.text;
      return refuse(`${path}.output[${index}]`, "function outputs take text parts (input_text) only here");
    })
    .join("");
}

/**
 * The chat messages of a conversation: `items` in order (the kept chain's, then the
 * request's). Function calls join the assistant message just before them (a model that
 * wrote text and then called a tool said both in one turn); each output must answer a
 * call made earlier in the conversation, as chat templates pair them by id.
 */
export function itemsToMessages(items: readonly Record<string, unknown>[], instructions: string | null | undefined, firstInput = 0): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (instructions != null && instructions !== "") messages.push({ role: "system", content: instructions });
  const calls = new Set<string>();
  items.forEach((item, index) => {
    // Only this request's items can be wrong: the chain's were checked when they came.
    const path = index >= firstInput ? `input[${index - firstInput}]` : "previous_response_id";
    switch (item.type) {
      case "message": {
        const parts = item.content as Record<string, unknown>[];
        const role = item.role as string;
        if (role === "assistant") messages.push({ role: "assistant", content: textOf(parts) });
        else if (role === "user" && parts.some((part) => part.type === "input_image")) {
          messages.push({
            role: "user",
            content: parts.map((part): ChatPart => {
              if (part.type !== "input_image") return { type: "text", text: String(part.text ?? "") };
              const detail = typeof part.detail === "string" ? { detail: part.detail } : {};
              return { type: "image_url", image_url: { url: String(part.image_url), ...detail } };
            }),
          });
        } else messages.push({ role: role === "user" ? "user" : "system", content: textOf(parts) });
        return;
      }
      case "function_call": {
        const call: ToolCall = { id: String(item.call_id), type: "function", function: { name: String(item.name), arguments: String(item.arguments) } };
        calls.add(call.id);
        const last = messages.at(-1);
        if (last?.role === "assistant") last.tool_calls = [...(last.tool_calls ?? []), call];
        else messages.push({ role: "assistant", content: null, tool_calls: [call] });
        return;
      }
      case "function_call_output": {
        const callId = String(item.call_id);
        // A kept output whose call is in a part of the chain no longer kept (deleted, expired, past MAX_CHAIN_DEPTH): dropped with it.
        if (!calls.has(callId) && index < firstInput) return;
        if (!calls.has(callId)) {
          refuse(
            `${path}.call_id`,
            `no function call with call_id '${callId}' comes before this output in the conversation (send the function_call item, or chain with previous_response_id)`,
          );
        }
        messages.push({ role: "tool", tool_call_id: callId, content: outputText(item.output, path) });
        return;
      }
    }
  });
  return messages;
}

/** The conversation's items: each kept response's input and output, oldest first, then this request's input. */
export function conversationItems(chain: readonly StoredResponse[], input: readonly StoredItem[]): Record<string, unknown>[] {
  const items: Record<string, unknown>[] = [];
  for (const kept of chain) items.push(...kept.input, ...(kept.response.output as unknown as Record<string, unknown>[]));
  items.push(...input);
  return items;
}

/** The chat-completions body for a Responses request continuing `chain`. */
export function toChatBody(request: ResponsesRequest, chain: readonly StoredResponse[], input: readonly StoredItem[]): GatewayRequestBody {
  const items = conversationItems(chain, input);
  const messages = itemsToMessages(items, request.instructions, items.length - input.length);
  const body: GatewayRequestBody = { model: request.model, messages };
  if (request.max_output_tokens != null) body.max_tokens = request.max_output_tokens;
  if (request.temperature != null) body.temperature = request.temperature;
  if (request.top_p != null) body.top_p = request.top_p;
  if (request.user != null && request.user !== "") body.user = request.user;
  if (request.tools != null && request.tools.length > 0) {
    body.tools = request.tools.map((tool) => ({
      type: "function",
      function: {
        name: tool.name,
        ...(tool.description == null ? {} : { description: tool.description }),
        ...(tool.parameters == null ? {} : { parameters: tool.parameters }),
        ...(tool.strict == null ? {} : { strict: tool.strict }),
      },
    }));
  }
  const choice = request.tool_choice;
  if (choice != null) body.tool_choice = typeof choice === "string" ? choice : { type: "function", function: { name: choice.name } };
  if (request.parallel_tool_calls != null) body.parallel_tool_calls = request.parallel_tool_calls;
  const format = request.text?.format;
  if (format?.type === "json_object") body.response_format = { type: "json_object" };
  if (format?.type === "json_schema") {
    body.response_format = {
      type: "json_schema",
      json_schema: {
        name: format.name,
        schema: format.schema,
        ...(format.strict == null ? {} : { strict: format.strict }),
        ...(format.description == null ? {} : { description: format.description }),
      },
    };
  }
  if (request.stream === true) {
    body.stream = true;
    body.stream_options = { include_usage: true };
  }
  return body;
}

/** Checks a Responses body (a 400 naming the field; an unknown field is the param). */
export function parseResponsesRequest(json: unknown): ResponsesRequest {
  if (!isObject(json)) return parseWith(responsesRequestSchema, json, "request");
  const unknown = Object.keys(json).find((key) => !(key in responsesRequestSchema.shape));
  if (unknown !== undefined) {
    const reason = NOT_SUPPORTED[unknown];
    throw new BadRequestError(`Invalid request: ${reason === undefined ? unknownFieldMessage([unknown]) : `field '${unknown}' is not supported: ${reason}`}.`, {
      code: "invalid_field",
      param: unknown,
    });
  }
  if (isSimpleRequest(json)) return json as ResponsesRequest;
  return parseWith(responsesRequestSchema, json, "request");
}

const nullish = (value: unknown, check: (value: unknown) => boolean): boolean => value === undefined || value === null || check(value);
const isNumberIn = (min: number, max: number) => (value: unknown) => typeof value === "number" && value >= min && value <= max;
const isString = (value: unknown) => typeof value === "string";
const isBoolean = (value: unknown) => typeof value === "boolean";

/**
 * A request of plain fields only, each valid: taken as it is, without the schema. A zod
 * parse of this schema cost ~15 µs a request in the server (bench/gateway/apis.ts's
 * profile), a fifth of what /v1/responses adds. Anything else, valid or not, goes through
 * the schema, which words the errors.
 */
function isSimpleRequest(json: Record<string, unknown>): boolean {
  for (const key in json) if (!SIMPLE_FIELDS.has(key)) return false;
  const { model, input, max_output_tokens: max } = json;
  return (
    typeof model === "string" &&
    model !== "" &&
    (typeof input === "string" || Array.isArray(input)) &&
    nullish(json.instructions, isString) &&
    nullish(max, (value) => Number.isInteger(value) && (value as number) >= 1) &&
    nullish(json.temperature, isNumberIn(0, 2)) &&
    nullish(json.top_p, isNumberIn(0, 1)) &&
    nullish(json.stream, isBoolean) &&
    nullish(json.store, isBoolean) &&
    nullish(json.user, isString) &&
    nullish(json.previous_response_id, (value) => typeof value === "string" && value !== "")
  );
}

const SIMPLE_FIELDS = new Set([
  "model",
  "input",
  "instructions",
  "max_output_tokens",
  "temperature",
  "top_p",
  "stream",
  "store",
  "user",
  "previous_response_id",
]);
