// The OpenAI wire format of the bundled engine: request body schemas for
// /v1/chat/completions and /v1/completions, their normalisation into engine-neutral
// generation parameters, and the response and stream-chunk shapes (see
// shared/reference/protocols.md §4). Nothing here knows about HTTP or llama.cpp, so the
// shapes are checked in isolation and the same module can serve another engine later.
import { randomBytes } from "node:crypto";
import { z } from "zod";
import { BadRequestError } from "../../core/errors.ts";
import { chatLogprobsBody, completionLogprobsBody } from "./logprobs-wire.ts";
import {
  chatLogprobs,
  chatSamplingFields,
  completionLogprobs,
  completionSamplingFields,
  samplingExtras,
  sharedSamplingFields,
  type SamplingExtras,
} from "./sampling-fields.ts";
import type { TokenLogprob } from "./token-logprobs.ts";
import {
  responseFormatSchema,
  toChatStructure,
  toolCallDeltaField,
  toolCallSchema,
  toolCallsField,
  toolChoiceSchema,
  toolSchema,
  type ChatStructure,
  type ToolCall,
  type ToolCallDelta,
} from "./structured-wire.ts";

// ---------------------------------------------------------------------------------------
// Requests

/**
 * Largest |scale| a request may give an adapter. llama.cpp takes any float; adapters are
 * trained for 1, and far beyond a few times that the model's output is noise, so a larger
 * value is taken for a mistake (a percentage, say) rather than served.
 */
export const MAX_LORA_SCALE = 8;

// llama-server's per-request adapters: listed ones apply at their scale, unlisted ones at 0;
// no list (or an empty one) means the scales the engine started with, all 0 here. Ids are
// checked against the engine's adapters by the runner (adapter-lanes.ts).
const loraSchema = z
  .array(
    z.object({
      id: z.number({ error: "id must be the adapter's number (its position in the engine's --lora list)" }).int().min(0),
      scale: z
        .number({ error: `scale must be a number from -${MAX_LORA_SCALE} to ${MAX_LORA_SCALE}` })
        .min(-MAX_LORA_SCALE, `scale must be from -${MAX_LORA_SCALE} to ${MAX_LORA_SCALE}`)
        .max(MAX_LORA_SCALE, `scale must be from -${MAX_LORA_SCALE} to ${MAX_LORA_SCALE}`),
    }),
    { error: "lora must be a list of {id, scale} objects" },
  )
  .max(64, "lora lists at most 64 adapters")
  .nullish();

const stopSchema = z.union([z.string(), z.array(z.string()).max(4, "at most 4 stop sequences are allowed")]).nullish();

const samplingFields = {
  // The engine serves exactly one model, so `model` is informational (the gateway has
  // already resolved it); llama-server accepts a missing one as well.
  model: z.string().optional(),
  stream: z.boolean().nullish(),
  stream_options: z.object({ include_usage: z.boolean().nullish() }).nullish(),
  max_tokens: z.number().int().min(1).nullish(),
  temperature: z.number().min(0).max(2).nullish(),
  top_p: z.number().min(0).max(1).nullish(),
  seed: z.number().int().nullish(),
  stop: stopSchema,
  frequency_penalty: z.number().min(-2).max(2).nullish(),
  presence_penalty: z.number().min(-2).max(2).nullish(),
  n: z.literal(1, { error: "the bundled engine generates one choice per request (n = 1)" }).nullish(),
  user: z.string().nullish(),
  lora: loraSchema,
  ...sharedSamplingFields,
};

// Parts of any type are taken here and refused in toChatJob with a 400 that says what is
// missing: inside the string-or-parts union, zod would only say "Invalid input".
const contentPartSchema = z.looseObject({ type: z.string(), text: z.unknown().optional() });

const contentSchema = z.union([z.string(), z.array(contentPartSchema)]);

const messageSchema = z.object({
  role: z.enum(["system", "developer", "user", "assistant", "tool"], {
    error: "role must be one of system, developer, user, assistant, tool (the legacy 'function' role is not supported by the bundled engine)",
  }),
  content: contentSchema.nullish(),
  name: z.string().optional(),
  // Assistant messages: the calls the model made. Tool messages: which call they answer.
  tool_calls: z.array(toolCallSchema).nullish(),
  tool_call_id: z.string().nullish(),
});

export const chatCompletionRequestSchema = z.object({
  ...samplingFields,
  ...chatSamplingFields,
  messages: z.array(messageSchema).min(1, "messages must hold at least one message"),
  max_completion_tokens: z.number().int().min(1).nullish(),
  tools: z.array(toolSchema).nullish(),
  tool_choice: toolChoiceSchema.nullish(),
  parallel_tool_calls: z.boolean().nullish(),
  response_format: responseFormatSchema.nullish(),
});

export const completionRequestSchema = z.object({
  ...samplingFields,
  ...completionSamplingFields,
  prompt: z.union([z.string(), z.array(z.string()).length(1, "the bundled engine takes one prompt per request"), z.array(z.number().int().min(0)).min(1)], {
    error: "prompt must be a string, an array of one string, or an array of token ids",
  }),
  echo: z.literal(false, { error: "echo is not supported by the bundled engine" }).nullish(),
});

export type ChatCompletionRequest = z.output<typeof chatCompletionRequestSchema>;
export type CompletionRequest = z.output<typeof completionRequestSchema>;

export type ChatRole = "system" | "user" | "assistant" | "tool";
export interface ChatMessage {
  role: ChatRole;
  content: string;
  /** Assistant messages: the calls the model made. */
  toolCalls?: ToolCall[];
  /** Tool messages: the id of the call this message answers. */
  toolCallId?: string;
}

/** One adapter of a request's `lora` list: its id (position in --lora) and the scale to apply it at. */
export interface AdapterScale {
  id: number;
  scale: number;
}

/** What a generation needs, independent of the wire format and the engine. */
export interface GenerationParams extends SamplingExtras {
  /** Undefined: until the end of generation or of the context. */
  maxTokens?: number;
  temperature: number;
  topP?: number;
  seed?: number;
  stop: string[];
  frequencyPenalty?: number;
  presencePenalty?: number;
  /** LoRA adapters to apply; absent means the base model. */
  lora?: AdapterScale[];
}

// OpenAI's documented default temperature; callers that want greedy decoding send 0.
const DEFAULT_TEMPERATURE = 1;

function normaliseParams(body: ChatCompletionRequest | CompletionRequest, maxTokens: number | null | undefined): GenerationParams {
  const stop = body.stop == null ? [] : (typeof body.stop === "string" ? [body.stop] : body.stop).filter((s) => s !== "");
  return {
    ...(maxTokens == null ? {} : { maxTokens }),
    temperature: body.temperature ?? DEFAULT_TEMPERATURE,
    ...(body.top_p == null ? {} : { topP: body.top_p }),
    // llama.cpp seeds are uint32; OpenAI's are int64, so fold them into that range.
    ...(body.seed == null ? {} : { seed: Number(BigInt.asUintN(32, BigInt(body.seed))) }),
    stop,
    ...(body.frequency_penalty == null ? {} : { frequencyPenalty: body.frequency_penalty }),
    ...(body.presence_penalty == null ? {} : { presencePenalty: body.presence_penalty }),
    ...(body.lora == null || body.lora.length === 0 ? {} : { lora: body.lora }),
    ...samplingExtras(body),
  };
}

export interface ChatJob {
  messages: ChatMessage[];
  /** response_format and tools: what the answer must look like. */
  structure: ChatStructure;
  params: GenerationParams;
  stream: boolean;
  includeUsage: boolean;
}

export function toChatJob(body: ChatCompletionRequest): ChatJob {
  const messages = body.messages.map((message, index): ChatMessage => {
    const param = `messages.${index}`;
    const content = message.content == null ? "" : typeof message.content === "string" ? message.content : textOf(message.content, param);
    if (message.role === "tool") {
      if (!message.tool_call_id)
        throw new BadRequestError(`Invalid request body: field '${param}.tool_call_id': a tool message needs the id of the call it answers.`, {
          code: "invalid_field",
          param: `${param}.tool_call_id`,
        });
      return { role: "tool", content, toolCallId: message.tool_call_id };
    }
    if (message.tool_calls?.length && message.role !== "assistant") {
      throw new BadRequestError(`Invalid request body: field '${param}.tool_calls': only assistant messages carry tool calls.`, {
        code: "invalid_field",
        param: `${param}.tool_calls`,
      });
    }
    if (message.role === "assistant" && message.tool_calls?.length) {
      return {
        role: "assistant",
        content,
        toolCalls: message.tool_calls.map((call) => ({ id: call.id, name: call.function.name, arguments: call.function.arguments })),
      };
    }
    if (message.content == null && message.role !== "assistant") {
      throw new BadRequestError(`Invalid request body: field 'messages.${index}.content': a ${message.role} message needs content.`, {
        code: "invalid_field",
        param: `messages.${index}.content`,
      });
    }
    // Developer messages are OpenAI's newer name for system messages.
    return { role: message.role === "developer" ? "system" : message.role, content };
  });
  return {
    messages,
    structure: toChatStructure(body),
    // max_completion_tokens replaces the deprecated max_tokens; honour either.
    params: { ...normaliseParams(body, body.max_completion_tokens ?? body.max_tokens), ...chatLogprobs(body) },
    stream: body.stream === true,
    includeUsage: body.stream === true && body.stream_options?.include_usage === true,
  };
}

/**
 * The text of a message's parts. node-llama-cpp takes text only, so an image (or audio, or
 * file) part is refused rather than dropped: an answer that silently ignored the image
 * would look like the model's judgement of it.
 */
function textOf(parts: readonly { type: string; text?: unknown }[], param: string): string {
  let text = "";
  parts.forEach((part, index) => {
    const where = `${param}.content.${index}`;
    if (part.type === "image_url") {
      throw new BadRequestError(
        `The bundled llama.cpp engine (node-llama-cpp) takes no image input: ${where} is an image_url part. Serve the model with its vision projector on a node with llama-server ('llmgw ctl model serve REPO --projector') to send it images.`,
        { code: "engine_has_no_vision", param: where },
      );
    }
    if (part.type !== "text") {
      throw new BadRequestError(
        `The bundled llama.cpp engine (node-llama-cpp) reads text parts only: ${where} is of type '${part.type}'. Send its content as text (type "text").`,
        { code: "unsupported_content_part", param: where },
      );
    }
    if (typeof part.text !== "string") {
      throw new BadRequestError(`Invalid request body: field '${where}.text': a text part needs its text as a string.`, {
        code: "invalid_field",
        param: `${where}.text`,
      });
    }
    text += part.text;
  });
  return text;
}

export interface CompletionJob {
  prompt: string | number[];
  params: GenerationParams;
  stream: boolean;
  includeUsage: boolean;
}

export function toCompletionJob(body: CompletionRequest): CompletionJob {
  const prompt =
    typeof body.prompt === "string" ? body.prompt : body.prompt.every((p) => typeof p === "string") ? (body.prompt[0] as string) : (body.prompt as number[]);
  return {
    prompt,
    // The legacy completions API defaults to 16 tokens.
    params: { ...normaliseParams(body, body.max_tokens ?? 16), ...completionLogprobs(body) },
    stream: body.stream === true,
    includeUsage: body.stream === true && body.stream_options?.include_usage === true,
  };
}

// ---------------------------------------------------------------------------------------
// Responses

export type FinishReason = "stop" | "length" | "tool_calls";

/**
 * vLLM's `stop_reason` on a choice: the stop sequence that ended it. Chat completions
 * otherwise say only `stop`, and the Anthropic Messages API needs the sequence
 * (`stop_sequence`); the field is left out when no stop sequence ended the reply.
 */
function stopReasonField(stopSequence: string | null | undefined): { stop_reason?: string } {
  return typeof stopSequence === "string" ? { stop_reason: stopSequence } : {};
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

export function usage(promptTokens: number, completionTokens: number): Usage {
  return { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens };
}

/**
 * llama-server's `timings` extension, counts only: prompt tokens taken from the prompt
 * cache (`cache_n`), prompt tokens evaluated (`prompt_n`) and tokens generated
 * (`predicted_n`). Non-streamed responses carry it, next to the standard usage.
 */
export interface Timings {
  cache_n: number;
  prompt_n: number;
  predicted_n: number;
}

export function timings(promptTokens: number, cachedTokens: number, completionTokens: number): Timings {
  // usage counts the prompt as the runner rendered it, the cache the tokens the sequence
  // kept, and the two can disagree: LlamaChat may render a longer context than the runner
  // counted, and before a thought-segment checkpoint it keeps a prompt cached whole
  // without re-evaluating its last token. prompt_n is never negative.
  const cached = Math.min(cachedTokens, promptTokens);
  return { cache_n: cached, prompt_n: promptTokens - cached, predicted_n: completionTokens };
}

/** Identity shared by every chunk of one response (OpenAI repeats id and created). */
export interface ResponseIdentity {
  id: string;
  created: number;
  model: string;
}

export function newIdentity(kind: "chat" | "completion", model: string, now: () => number = Date.now): ResponseIdentity {
  const prefix = kind === "chat" ? "chatcmpl-" : "cmpl-";
  return { id: prefix + randomBytes(12).toString("hex"), created: Math.floor(now() / 1000), model };
}

/** A generation's outcome as the response shapes need it; logprobs only when asked for. */
export interface ChoiceResult {
  text: string;
  toolCalls?: readonly ToolCall[];
  finishReason: FinishReason;
  stopSequence?: string | null;
  usage: Usage;
  timings?: Timings;
  logprobs?: TokenLogprob[];
}

export function chatCompletion(identity: ResponseIdentity, result: ChoiceResult) {
  const calls = result.toolCalls ?? [];
  // OpenAI sends content null when a reply is only tool calls.
  const message =
    calls.length > 0
      ? { role: "assistant" as const, content: result.text === "" ? null : result.text, refusal: null, tool_calls: toolCallsField(calls) }
      : { role: "assistant" as const, content: result.text, refusal: null };
  return {
    id: identity.id,
    object: "chat.completion" as const,
    created: identity.created,
    model: identity.model,
    choices: [
      {
        index: 0,
        message,
        logprobs: chatLogprobsBody(result.logprobs),
        finish_reason: result.finishReason,
        ...stopReasonField(result.stopSequence),
      },
    ],
    usage: result.usage,
    ...(result.timings ? { timings: result.timings } : {}),
  };
}

export interface ChatDelta {
  role?: "assistant";
  content?: string;
  tool_calls?: Array<ReturnType<typeof toolCallDeltaField>>;
}

export function toolCallDelta(delta: ToolCallDelta): ChatDelta {
  return { tool_calls: [toolCallDeltaField(delta)] };
}

/**
 * One chat stream chunk. With include_usage every chunk carries `usage: null` and the
 * last one (empty choices) the numbers; without it the field is left out.
 */
export function chatChunk(
  identity: ResponseIdentity,
  part: { delta: ChatDelta; finishReason: FinishReason | null; stopSequence?: string | null; logprobs?: TokenLogprob[] } | { usage: Usage },
  includeUsage: boolean,
) {
  const base = { id: identity.id, object: "chat.completion.chunk" as const, created: identity.created, model: identity.model };
  if ("usage" in part) return { ...base, choices: [], usage: part.usage };
  return {
    ...base,
    choices: [
      { index: 0, delta: part.delta, logprobs: chatLogprobsBody(part.logprobs), finish_reason: part.finishReason, ...stopReasonField(part.stopSequence) },
    ],
    ...(includeUsage ? { usage: null } : {}),
  };
}

export function textCompletion(identity: ResponseIdentity, result: ChoiceResult) {
  return {
    id: identity.id,
    object: "text_completion" as const,
    created: identity.created,
    model: identity.model,
    choices: [
      {
        index: 0,
        text: result.text,
        logprobs: completionLogprobsBody(result.logprobs),
        finish_reason: result.finishReason,
        ...stopReasonField(result.stopSequence),
      },
    ],
    usage: result.usage,
    ...(result.timings ? { timings: result.timings } : {}),
  };
}

/** One legacy-completions stream chunk (OpenAI streams them with object "text_completion"). */
export function textCompletionChunk(
  identity: ResponseIdentity,
  part: { text: string; finishReason: FinishReason | null; stopSequence?: string | null; logprobs?: TokenLogprob[] } | { usage: Usage },
  includeUsage: boolean,
) {
  const base = { id: identity.id, object: "text_completion" as const, created: identity.created, model: identity.model };
  if ("usage" in part) return { ...base, choices: [], usage: part.usage };
  return {
    ...base,
    choices: [
      { index: 0, text: part.text, logprobs: completionLogprobsBody(part.logprobs), finish_reason: part.finishReason, ...stopReasonField(part.stopSequence) },
    ],
    ...(includeUsage ? { usage: null } : {}),
  };
}

export function modelList(model: string, created: number) {
  return { object: "list" as const, data: [{ id: model, object: "model" as const, created, owned_by: "llmgw" }] };
}
