// The request side of Ollama's generation and embedding routes: each body checked with one
// zod schema (a 400 naming the field and saying what to do), and translated into the
// chat-completions body (/api/chat, /api/generate) or the embeddings body (/api/embed,
// /api/embeddings) that every engine takes. Unknown fields are refused, as with
// /v1/messages: a field llmgw dropped would give an answer that silently disregards what
// the client asked for. Fields are accepted and ignored only where they cannot change the
// answer; each says why.
//
// Things common to every route:
// - `stream` defaults to true, as in Ollama; a stream always asks for its usage
//   (stream_options.include_usage), which the done line's counts come from;
// - `keep_alive` is accepted and ignored: llmgw places, keeps and stops replicas by each
//   model's scaling settings (min, max, idle_seconds), the same for every key, so a client
//   cannot load or unload a model;
// - a model name may carry Ollama's tag: `name:latest` is the catalog's `name` when the
//   catalog knows only that (any other name goes on as given, and an unknown one gets the
//   gateway's 404).
import { z } from "zod";
import { parseWith } from "../../core/errors.ts";
import type { GatewayRequestBody } from "../request-schemas.ts";
import type { WireContext } from "../wire-format.ts";
import { fieldError, ollamaImage, ollamaMessage, ollamaTool, toChatMessages, userContent, type ChatMessage } from "./ollama-messages.ts";
import { applyOptions, ollamaOptionsSchema } from "./ollama-options.ts";

/** A translated generation request: the upstream body, and what the answer needs to know of the request. */
export interface OllamaGeneration {
  body: GatewayRequestBody;
  /** The model name as the client sent it: Ollama's answers echo it. */
  model: string;
  /** Whether the client asked for a stream (Ollama's default). */
  stream: boolean;
}

/** A translated embedding request. */
export interface OllamaEmbedding {
  body: GatewayRequestBody;
  model: string;
}

const TAG_LATEST = ":latest";

/** The catalog's name for an Ollama model name (see the top of this file). */
export function catalogName(requested: string, context: Pick<WireContext, "knows">): string {
  if (context.knows(requested) || !requested.endsWith(TAG_LATEST)) return requested;
  const bare = requested.slice(0, -TAG_LATEST.length);
  return bare !== "" && context.knows(bare) ? bare : requested;
}

function unknownField(route: string, fields: string) {
  return (issue: { code?: string; keys?: readonly PropertyKey[] }) =>
    issue.code === "unrecognized_keys" ? `unknown field '${String(issue.keys?.[0])}'; ${route} takes ${fields}` : undefined;
}

/** A field accepted only while it asks for nothing (absent, or the value that means "off"). */
function offOnly(isOff: (value: unknown) => boolean, message: string) {
  return z
    .unknown()
    .refine((value) => value === undefined || value === null || isOff(value), message)
    .optional();
}

const model = z.string({ error: "is required and must be a string (a model name from GET /api/tags)" }).min(1, "must not be empty");
const stream = z.boolean({ error: "must be a boolean (true or false)" }).optional();
// See the top of this file.
const keepAlive = z.union([z.string(), z.number()], { error: "must be a duration such as '5m' or a number of seconds" }).optional();

/**
 * "json" asks for any JSON object, an object is the JSON schema the answer must follow;
 * an empty string or null asks for nothing, as in Ollama.
 */
const format = z
  .union([z.literal("json"), z.literal(""), z.null(), z.record(z.string(), z.unknown())], {
    error: 'must be "json" (any JSON object) or a JSON schema object that the answer must follow',
  })
  .optional();

/**
 * Thinking models reason before they answer; Ollama can switch that on or off and set its
 * level. llmgw cannot: a model thinks as its engine runs it, and its reasoning comes as the
 * engine gives it (as `thinking` where the engine gives it apart, else in the answer's
 * text). `think: false` (and no think) is accepted, the model answering as its engine runs
 * it; asking for thinking is refused rather than silently not done.
 */
const think = offOnly(
  (value) => value === false,
  "llmgw cannot switch a model's thinking on or set its level (a model reasons, or not, as its engine runs it); leave think out, or set it to false",
);
const logprobs = offOnly(
  (value) => value === false,
  "log probabilities are not available through Ollama's API on llmgw; leave logprobs out, or use /v1/chat/completions",
);
const topLogprobs = offOnly(
  (value) => value === 0,
  "log probabilities are not available through Ollama's API on llmgw; leave top_logprobs out, or use /v1/chat/completions",
);

const generationFields = {
  model,
  format,
  options: ollamaOptionsSchema.optional(),
  stream,
  keep_alive: keepAlive,
  think,
  logprobs,
  top_logprobs: topLogprobs,
};

export const chatRequestSchema = z.strictObject(
  {
    ...generationFields,
    messages: z
      .array(ollamaMessage, { error: "is required and must be an array of messages" })
      // Ollama's call with no messages loads a model into memory: see keep_alive above.
      .min(1, "must hold at least one message: llmgw starts and keeps replicas by the model's scaling settings, so there is no model to load by hand"),
    tools: z.array(ollamaTool, { error: "must be an array of tools ({type: 'function', function: {name, description, parameters}})" }).optional(),
  },
  { error: unknownField("/api/chat", "model, messages, tools, format, options, stream, keep_alive, think") },
);

const imageGeneration = offOnly(() => false, "image generation is not supported by llmgw; leave width, height and steps out");

export const generateRequestSchema = z.strictObject(
  {
    ...generationFields,
    prompt: z.string({ error: "must be a string" }).optional(),
    system: z.string({ error: "must be a string" }).optional(),
    images: z.array(ollamaImage, { error: "must be an array of base64 images" }).optional(),
    suffix: offOnly((value) => value === "", "text after the insertion point (fill-in-the-middle) is not supported by llmgw; leave suffix out"),
    template: offOnly(
      (value) => value === "",
      "a prompt template of the request's own is not supported: the model's own chat template applies; leave template out, or send raw text to /v1/completions",
    ),
    context: offOnly(
      (value) => Array.isArray(value) && value.length === 0,
      "llmgw does not return or take a conversation's context as tokens; send the conversation's messages to /api/chat instead",
    ),
    raw: offOnly(
      (value) => value === false,
      "raw prompts (no chat template) are not supported on /api/generate; send the text to /v1/completions, or the conversation to /api/chat",
    ),
    width: imageGeneration,
    height: imageGeneration,
    steps: imageGeneration,
  },
  { error: unknownField("/api/generate", "model, prompt, system, images, format, options, stream, keep_alive, think") },
);

export const embedRequestSchema = z.strictObject(
  {
    model,
    input: z.union([z.string(), z.array(z.string()).min(1, "must hold at least one text")], { error: "is required: a string or an array of strings" }),
    // Ollama cuts an input longer than the model's context when truncate is true (its
    // default) and refuses it when false. llmgw's engines refuse it either way (a 400 that
    // says so), so both are accepted: no answer is ever made from a silently cut input.
    truncate: z.boolean({ error: "must be a boolean (true or false)" }).optional(),
    dimensions: offOnly(() => false, "llmgw gives embeddings in the model's own size; leave dimensions out"),
    options: ollamaOptionsSchema.optional(),
    keep_alive: keepAlive,
  },
  { error: unknownField("/api/embed", "model, input, truncate, options, keep_alive") },
);

export const embeddingsRequestSchema = z.strictObject(
  {
    model,
    prompt: z.string({ error: "is required and must be a string (the text to embed)" }),
    options: ollamaOptionsSchema.optional(),
    keep_alive: keepAlive,
  },
  { error: unknownField("/api/embeddings", "model, prompt, options, keep_alive") },
);

type GenerationRequest = z.output<typeof chatRequestSchema> | z.output<typeof generateRequestSchema>;

/** The parts of the chat body both generation routes share: format, options, stream. */
function generationBody(request: GenerationRequest, messages: ChatMessage[], context: WireContext): OllamaGeneration {
  const body: GatewayRequestBody = { model: catalogName(request.model, context), messages };
  if (request.format === "json") body.response_format = { type: "json_object" };
  else if (typeof request.format === "object" && request.format !== null) {
    body.response_format = { type: "json_schema", json_schema: { name: "response", schema: request.format } };
  }
  applyOptions(body, request.options);
  const streamed = request.stream !== false;
  if (streamed) {
    body.stream = true;
    body.stream_options = { include_usage: true };
  }
  return { body, model: request.model, stream: streamed };
}

/** Checks an /api/chat body (400 naming the field) and translates it. */
export function chatRequest(json: unknown, context: WireContext): OllamaGeneration {
  const request = parseWith(chatRequestSchema, json, "request");
  const translated = generationBody(request, toChatMessages(request.messages), context);
  // Ollama's tools are OpenAI's function tools already; they go on as they are.
  if (request.tools !== undefined && request.tools.length > 0) translated.body.tools = request.tools;
  return translated;
}

/**
 * Checks an /api/generate body and translates it into a chat completion: the system
 * prompt (if any) and the prompt as one user turn, through the model's chat template, as
 * Ollama does for a prompt that is not raw.
 */
export function generateRequest(json: unknown, context: WireContext): OllamaGeneration {
  const request = parseWith(generateRequestSchema, json, "request");
  const prompt = request.prompt ?? "";
  const images = request.images ?? [];
  // Ollama's empty prompt loads the model (or, with keep_alive 0, unloads it) and answers
  // a done line without generating. llmgw has no model to load by hand (see keep_alive),
  // and a gateway request always runs on a replica, so it says there is nothing to do
  // rather than pretend it loaded something.
  if (prompt === "" && images.length === 0) {
    throw fieldError(
      "prompt",
      "is empty, so there is nothing to generate. Ollama's empty prompt loads a model; llmgw starts and keeps replicas by the model's scaling settings, so send the prompt itself",
    );
  }
  const messages: ChatMessage[] = [];
  if (request.system !== undefined && request.system !== "") messages.push({ role: "system", content: request.system });
  messages.push({ role: "user", content: userContent(prompt, images) });
  return generationBody(request, messages, context);
}

/** Checks an /api/embed body and translates it into an embeddings body (floats, the default encoding). */
export function embedRequest(json: unknown, context: WireContext): OllamaEmbedding {
  const request = parseWith(embedRequestSchema, json, "request");
  return { body: { model: catalogName(request.model, context), input: request.input }, model: request.model };
}

/** Checks a legacy /api/embeddings body (one prompt) and translates it. */
export function embeddingsRequest(json: unknown, context: WireContext): OllamaEmbedding {
  const request = parseWith(embeddingsRequestSchema, json, "request");
  return { body: { model: catalogName(request.model, context), input: request.prompt }, model: request.model };
}
