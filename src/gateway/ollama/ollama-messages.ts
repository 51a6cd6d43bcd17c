// The messages of Ollama's /api/chat (and the prompt and images of /api/generate) as the
// chat-completions messages every engine takes:
// - images are base64 strings without a data: prefix; each becomes an image_url part with
//   a data URL whose media type is sniffed from the decoded bytes (the gateway then checks
//   it like any image part: image-parts.ts), placed before the text as Ollama puts its
//   image markers before a message's text;
// - an assistant's tool_calls carry their arguments as an object; chat completions carry
//   them as a JSON string, with an id per call, which Ollama's messages have none of, so
//   ids are made here;
// - a tool message answers the first open call of the assistant message before it (the
//   first one of its `tool_name` when it names one), and gets that call's id;
// - an assistant's `thinking` (a model's earlier reasoning, echoed back by clients) is
//   dropped: chat templates leave earlier reasoning out of the prompt, and llmgw never gives
//   reasoning apart from the answer.
import { randomBytes } from "node:crypto";
import { z } from "zod";
import { BadRequestError } from "../../core/errors.ts";
import { detectFormat } from "../image-parts.ts";

const MEDIA_TYPES = { png: "image/png", jpeg: "image/jpeg", gif: "image/gif", bmp: "image/bmp", webp: "image/webp" } as const;

/** Checks one Ollama image (base64, no prefix) and makes it a data URL; a 400 naming the field otherwise. */
export const ollamaImage = z.string({ error: "must be an image's bytes in base64 (a string)" }).transform((data, ctx) => {
  const problem = (message: string) => {
    ctx.addIssue({ code: "custom", message });
    return z.NEVER;
  };
  if (data.startsWith("data:")) return problem("must be the image's bytes in base64 without a 'data:...;base64,' prefix (Ollama's images are bare base64)");
  if (data === "") return problem("is empty; send the image's bytes in base64");
  const firstPad = data.indexOf("=");
  const padding = firstPad === -1 ? 0 : data.length - firstPad;
  // Strict base64, as the gateway checks it (image-parts.ts): a lenient decoder upstream
  // would stop at the first stray character and see a truncated image.
  if (data.length % 4 !== 0 || padding > 2 || /[^A-Za-z0-9+/=]/.test(data) || (firstPad !== -1 && data.slice(firstPad) !== "=".repeat(padding))) {
    return problem(
      "is not strict base64: use the standard alphabet (A-Z, a-z, 0-9, +, /), pad with '=' to a multiple of 4 characters, and leave out line breaks and spaces",
    );
  }
  // 24 characters are the first 18 bytes: enough for every signature detectFormat knows.
  const format = detectFormat(Buffer.from(data.slice(0, 24), "base64"));
  if (format === null) return problem("is not an image: its bytes do not start like a PNG, JPEG, GIF, BMP or WebP file");
  return `data:${MEDIA_TYPES[format]};base64,${data}`;
});

// Tool calls and tool definitions are loose: clients echo back what an Ollama server
// answered (a call's `function.index`, newer servers' ids), which only describes the call.
const toolCall = z.looseObject({
  function: z.looseObject(
    {
      name: z.string({ error: "is required: the name of the function called" }).min(1, "must not be empty"),
      arguments: z.record(z.string(), z.unknown(), { error: "must be an object (the call's arguments by name)" }).default({}),
    },
    { error: "is required: {name, arguments}" },
  ),
});

export const ollamaTool = z.looseObject({
  type: z.literal("function", { error: "must be 'function' (the only kind of tool)" }),
  function: z.looseObject(
    { name: z.string({ error: "is required: the function's name" }).min(1, "must not be empty") },
    { error: "is required: {name, description, parameters}" },
  ),
});

const MESSAGE_FIELDS = "role, content, images, tool_calls, tool_name, thinking";

export const ollamaMessage = z.strictObject(
  {
    role: z.enum(["system", "user", "assistant", "tool"], { error: "must be one of system, user, assistant, tool" }),
    content: z.string({ error: "must be a string" }).optional(),
    images: z.array(ollamaImage, { error: "must be an array of base64 images" }).optional(),
    tool_calls: z.array(toolCall, { error: "must be an array of tool calls ({function: {name, arguments}})" }).optional(),
    tool_name: z.string({ error: "must be a string (the name of the tool whose result this is)" }).optional(),
    thinking: z.string({ error: "must be a string" }).optional(),
  },
  {
    error: (issue) => (issue.code === "unrecognized_keys" ? `has an unknown field '${String(issue.keys[0])}'; a message takes ${MESSAGE_FIELDS}` : undefined),
  },
);

export type OllamaMessage = z.output<typeof ollamaMessage>;

type ContentPart = { type: "text"; text: string } | { type: "image_url"; image_url: { url: string } };

export interface ChatToolCall {
  id: string;
  type: "function";
  function: { name: string; arguments: string };
}

export type ChatMessage =
  | { role: "system" | "user"; content: string | ContentPart[] }
  | { role: "assistant"; content: string; tool_calls?: ChatToolCall[] }
  | { role: "tool"; tool_call_id: string; content: string };

/** Chat completions want an id per tool call; Ollama's calls have none. */
export function newToolCallId(): string {
  return `call_${randomBytes(12).toString("hex")}`;
}

/** A 400 in the shape fromZodError gives, for the checks a schema cannot make (they span messages). */
export function fieldError(param: string, reason: string): BadRequestError {
  return new BadRequestError(`Invalid request: field '${param}': ${reason}.`, { code: "invalid_field", param });
}

/** A user turn: the text, after the images when there are any. */
export function userContent(text: string, images: readonly string[] | undefined): string | ContentPart[] {
  if (images === undefined || images.length === 0) return text;
  const parts: ContentPart[] = images.map((url) => ({ type: "image_url", image_url: { url } }));
  if (text !== "") parts.push({ type: "text", text });
  return parts;
}

interface OpenCall {
  id: string;
  name: string;
  answered: boolean;
}

/** The chat-completions messages for Ollama's; a 400 naming the message for what cannot be translated. */
export function toChatMessages(messages: readonly OllamaMessage[]): ChatMessage[] {
  const out: ChatMessage[] = [];
  // The calls of the last assistant message, which the tool messages after it answer.
  let open: OpenCall[] = [];
  messages.forEach((message, index) => {
    const content = message.content ?? "";
    if (message.images !== undefined && message.images.length > 0 && message.role !== "user") {
      throw fieldError(`messages.${index}.images`, `images go on user messages (this one is '${message.role}')`);
    }
    if (message.tool_calls !== undefined && message.tool_calls.length > 0 && message.role !== "assistant") {
      throw fieldError(`messages.${index}.tool_calls`, `tool calls go on assistant messages (this one is '${message.role}')`);
    }
    switch (message.role) {
      case "system":
        out.push({ role: "system", content });
        return;
      case "user":
        out.push({ role: "user", content: userContent(content, message.images) });
        return;
      case "assistant": {
        const calls: ChatToolCall[] = (message.tool_calls ?? []).map((call) => ({
          id: newToolCallId(),
          type: "function",
          function: { name: call.function.name, arguments: JSON.stringify(call.function.arguments) },
        }));
        open = calls.map((call) => ({ id: call.id, name: call.function.name, answered: false }));
        out.push(calls.length === 0 ? { role: "assistant", content } : { role: "assistant", content, tool_calls: calls });
        return;
      }
      case "tool": {
        const name = message.tool_name;
        const call = open.find((candidate) => !candidate.answered && (name === undefined || candidate.name === name));
        if (call === undefined) throw fieldError(`messages.${index}`, unansweredReason(open, name));
        call.answered = true;
        out.push({ role: "tool", tool_call_id: call.id, content });
        return;
      }
    }
  });
  return out;
}

function unansweredReason(open: readonly OpenCall[], name: string | undefined): string {
  if (open.length === 0) return "a tool message answers a tool call: send it after the assistant message whose tool_calls it answers";
  const calls = open.map((call) => `'${call.name}'${call.answered ? " (answered)" : ""}`).join(", ");
  if (name !== undefined) return `answers no open call of '${name}' made by the assistant message before it (its calls: ${calls}); check tool_name`;
  return `the assistant message before it made ${open.length} tool call(s) (${calls}), all answered already`;
}
