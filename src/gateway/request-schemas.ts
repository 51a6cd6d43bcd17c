// What the gateway checks in a /v1 request body before choosing a replica: the fields it
// needs (model, stream) and the common fields whose wrong type would otherwise come back
// from an engine as an obscure failure. Unknown fields pass through untouched: engines
// and external servers accept more than the gateway knows about.
import { z } from "zod";

const stop = z.union([z.string(), z.array(z.string()).max(16)]).nullable();
const positiveInt = z.number().int().positive();

const common = {
  model: z.string({ error: "is required and must be a string (a model name from GET /v1/models)" }).min(1, "must not be empty"),
  stream: z.boolean().nullable().optional(),
  stream_options: z.looseObject({ include_usage: z.boolean().optional() }).nullable().optional(),
  max_tokens: positiveInt.nullable().optional(),
  temperature: z.number().min(0).max(2).nullable().optional(),
  top_p: z.number().min(0).max(1).nullable().optional(),
  seed: z.number().int().nullable().optional(),
  stop: stop.optional(),
  n: z.number().int().min(1).max(1, "only n=1 is supported").nullable().optional(),
};

const message = z.looseObject({
  role: z.enum(["system", "developer", "user", "assistant", "tool", "function"], { error: "must be one of system, developer, user, assistant, tool" }),
});

export const chatCompletionSchema = z.looseObject({
  ...common,
  messages: z.array(message, { error: "is required and must be an array of messages" }).min(1, "must hold at least one message"),
  max_completion_tokens: positiveInt.nullable().optional(),
});

export const completionSchema = z.looseObject({
  ...common,
  prompt: z.union([z.string(), z.array(z.string()), z.array(z.number().int()), z.array(z.array(z.number().int()))], {
    error: "is required: a string, an array of strings or an array of token ids",
  }),
});

export const embeddingSchema = z.looseObject({
  model: common.model,
  input: z.union([z.string(), z.array(z.string()), z.array(z.number().int()), z.array(z.array(z.number().int()))], {
    error: "is required: a string, an array of strings or an array of token ids",
  }),
  encoding_format: z.enum(["float", "base64"]).optional(),
});

export type GatewayRequestBody = { model: string; stream?: boolean | null | undefined; [key: string]: unknown };
