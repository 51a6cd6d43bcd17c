// The sampling, logprob and housekeeping fields of OpenAI's chat and completions request
// bodies beyond the basic ones (openai-wire.ts), as the bundled engine treats them: the
// ones llama.cpp can honour are parsed and normalised into generation parameters; the
// ones it cannot are refused with a 400 naming the field, never silently ignored; a few
// that change nothing about the answer are accepted and ignored, each with its reason.
// Fields OpenAI does not define (llama-server's other extensions) are stripped by zod as
// before. The field list follows the `openai` package's ChatCompletionCreateParams and
// CompletionCreateParams.
import { z } from "zod";
import { BadRequestError } from "../../core/errors.ts";

/** A field the engine cannot honour: only a missing value or null passes. */
function refused(what: string) {
  return z.null({ error: `${what} is not supported by the bundled engine; leave it out` }).optional();
}

// OpenAI's logit_bias: token id (as a JSON object key) → bias from -100 to 100.
const logitBiasSchema = z.record(z.string().regex(/^\d+$/, "keys must be token ids (non-negative integers)"), z.number().min(-100).max(100)).nullish();

/** Fields both endpoints share. */
export const sharedSamplingFields = {
  // llama.cpp's samplers that OpenAI does not define; llama-server and vLLM take them too.
  // top_k <= 0 keeps the whole vocabulary (vLLM says -1 for that, llama-server 0).
  top_k: z.number().int().min(-1).nullish(),
  min_p: z.number().min(0).max(1).nullish(),
  repeat_penalty: z.number().min(0).nullish(),
  logit_bias: logitBiasSchema,
};

/** Chat-only fields. */
export const chatSamplingFields = {
  logprobs: z.boolean().nullish(),
  top_logprobs: z.number().int().min(0).max(20).nullish(),
  // Accepted and ignored, because none of them changes what is generated:
  // - metadata: tags for OpenAI's dashboard and stored completions; nothing is stored here.
  // - safety_identifier: like `user`, an end-user id for OpenAI's abuse monitoring.
  // - prompt_cache_key, prompt_cache_retention: OpenAI's prompt-cache routing hints; each
  //   engine sequence reuses its cached prefix whatever they say.
  metadata: z.record(z.string(), z.string()).nullish(),
  safety_identifier: z.string().nullish(),
  prompt_cache_key: z.string().nullish(),
  prompt_cache_retention: z.string().nullish(),
  // There is one tier: "auto" and "default" name it; the others ask for what is not there.
  service_tier: z.enum(["auto", "default"], { error: "the bundled engine has one service tier; send 'auto' or 'default', or leave it out" }).nullish(),
  // store: true asks for the completion to be kept for distillation and evals.
  store: z.literal(false, { error: "store is not supported by the bundled engine (completions are not stored); leave it out" }).nullish(),
  modalities: z.array(z.literal("text", { error: "the bundled engine generates text only" })).nullish(),
  audio: refused("audio output"),
  prediction: refused("prediction (predicted outputs)"),
  reasoning_effort: refused("reasoning_effort"),
  verbosity: refused("verbosity"),
  web_search_options: refused("web search"),
  // The deprecated forms of tools and tool_choice.
  functions: refused("functions (deprecated; send tools)"),
  function_call: refused("function_call (deprecated; send tool_choice)"),
};

/** Legacy completions-only fields. */
export const completionSamplingFields = {
  // The legacy API allows at most 5 alternatives per token.
  logprobs: z.number().int().min(0).max(5).nullish(),
  best_of: z.literal(1, { error: "the bundled engine generates one candidate per request (best_of = 1)" }).nullish(),
  suffix: refused("suffix (insertion)"),
};

type SharedFields = { [K in keyof typeof sharedSamplingFields]?: z.output<(typeof sharedSamplingFields)[K]> };

/** What the shared fields add to a generation's parameters. */
export interface SamplingExtras {
  /** <= 0: the whole vocabulary. */
  topK?: number;
  minP?: number;
  /** llama.cpp's repeat penalty (1: none). */
  repeatPenalty?: number;
  /** Token id → bias added to its logit; -100 bans the token. */
  logitBias?: ReadonlyArray<readonly [number, number]>;
  /** Keep each sampled token's distribution and report `top` alternatives per token. */
  logprobs?: { top: number };
}

export function samplingExtras(body: SharedFields): SamplingExtras {
  const bias = body.logit_bias == null ? [] : Object.entries(body.logit_bias).map(([token, value]) => [Number(token), value] as const);
  return {
    ...(body.top_k == null ? {} : { topK: body.top_k }),
    ...(body.min_p == null ? {} : { minP: body.min_p }),
    ...(body.repeat_penalty == null ? {} : { repeatPenalty: body.repeat_penalty }),
    ...(bias.length === 0 ? {} : { logitBias: bias }),
  };
}

/** Chat: logprobs true, with top_logprobs alternatives; top_logprobs alone is refused, as OpenAI does. */
export function chatLogprobs(body: { logprobs?: boolean | null; top_logprobs?: number | null }): SamplingExtras {
  if (body.top_logprobs != null && body.logprobs !== true) {
    throw new BadRequestError("Invalid request body: field 'top_logprobs': logprobs must be set to true when top_logprobs is used.", {
      code: "invalid_field",
      param: "top_logprobs",
    });
  }
  return body.logprobs === true ? { logprobs: { top: body.top_logprobs ?? 0 } } : {};
}

/** Completions: logprobs N asks for the sampled token and N alternatives per token. */
export function completionLogprobs(body: { logprobs?: number | null }): SamplingExtras {
  return body.logprobs == null ? {} : { logprobs: { top: body.logprobs } };
}
