// The wire shapes of logprobs: chat's `choices[].logprobs` ({content: [{token, logprob,
// bytes, top_logprobs}], refusal}) and the legacy completions' ({tokens, token_logprobs,
// top_logprobs: [{token: logprob}], text_offset}), from the engine's per-token entries
// (token-logprobs.ts). A response or chunk of a request that did not ask for logprobs
// carries `logprobs: null`, as OpenAI's do.
import type { TokenLogprob } from "./token-logprobs.ts";

export function chatLogprobsBody(entries: readonly TokenLogprob[] | undefined) {
  if (entries === undefined) return null;
  return {
    content: entries.map((entry) => ({ token: entry.token, logprob: entry.logprob, bytes: entry.bytes, top_logprobs: entry.top_logprobs })),
    refusal: null,
  };
}

/**
 * The legacy shape. Its top_logprobs maps token text to logprob, so two tokens with the
 * same text keep the likelier one; as in OpenAI's API the sampled token is always among
 * them, so a map may hold N + 1 tokens. text_offset counts from the start of the
 * completion (no echo), in UTF-16 code units.
 */
export function completionLogprobsBody(entries: readonly TokenLogprob[] | undefined) {
  if (entries === undefined) return null;
  return {
    tokens: entries.map((entry) => entry.token),
    token_logprobs: entries.map((entry) => entry.logprob),
    top_logprobs: entries.map((entry) => {
      const top: Record<string, number> = {};
      for (const alternative of entry.top_logprobs) if (!(alternative.token in top)) top[alternative.token] = alternative.logprob;
      if (!(entry.token in top)) top[entry.token] = entry.logprob;
      return top;
    }),
    text_offset: entries.map((entry) => entry.offset),
  };
}
