// Keeps the probability distributions that llama.cpp hands node-llama-cpp (3.21.1) down to
// what logprobs can report, before node-llama-cpp turns each into a Map.
//
// Why: a generation that asks for logprobs samples with `probabilities: true`, and under
// greedy decoding (temperature 0) llama.cpp's candidates are the whole vocabulary. The
// native sampleToken then returns every token as a flat [token, probability, ...] array,
// and node-llama-cpp's reviveTokenProbabilities copies it into a Map entry by entry: for a
// 150k-token vocabulary that is tens of milliseconds of JavaScript per token, on the one
// thread that also drives every other sequence's decode steps. The engine reports at most
// 20 alternatives (OpenAI's top_logprobs cap) and the sampled token, and the array comes
// most likely first (token-logprobs.ts says why that holds), so this cuts it to its first
// 20 pairs plus the sampled token's pair (found with a scan of the flat array, far cheaper
// than a Map) before node-llama-cpp sees it. What remains is native and no option of
// node-llama-cpp avoids it: the sort of all candidates (on a worker thread) and the copy
// of the array into JavaScript (on the main thread). A 151,936-token vocabulary, 2 cores:
// about 18 and 45 ms per token; only the sampled token's probability (top_logprobs 0)
// skips the copy (decode-lockstep.ts, sampledOnly).
//
// How: the context's native handle (`_ctx`, node-llama-cpp's internal field) has the one
// sampleToken every sequence of the context calls; it is wrapped once per context. Only
// calls that ask for probabilities are touched, and in this engine only a logprobs turn
// does (decode-lockstep.ts).
import type { LlamaContext } from "node-llama-cpp";

/** OpenAI's most top_logprobs; completions' logprobs is at most 5. */
export const MOST_ALTERNATIVES = 20;

type SampleToken = (batchLogitIndex: number, sampler: unknown, probabilities?: boolean, confidence?: boolean) => Promise<unknown>;

/** The first `keep` [token, probability] pairs of a flat array, and the pair of `token` if it lies beyond. */
export function trimDistribution(flat: readonly number[], token: number, keep: number): number[] {
  if (flat.length <= 2 * (keep + 1)) return flat as number[];
  const trimmed = flat.slice(0, 2 * keep);
  for (let i = 0; i < 2 * keep; i += 2) if (flat[i] === token) return trimmed;
  for (let i = 2 * keep; i < flat.length; i += 2) {
    if (flat[i] === token) {
      trimmed.push(token, flat[i + 1] as number);
      break;
    }
  }
  return trimmed;
}

export function trimSampledDistributions(context: LlamaContext): void {
  const native = (context as unknown as { _ctx?: { sampleToken?: SampleToken } })._ctx;
  const original = native?.sampleToken;
  // A node-llama-cpp upgrade that moves this should fail loudly at load, not cost silently.
  if (!native || typeof original !== "function")
    throw new Error("node-llama-cpp no longer exposes LlamaContext._ctx.sampleToken; sampled-distributions.ts needs updating");
  const wrapped: SampleToken = async (batchLogitIndex, sampler, probabilities, confidence) => {
    const result = await original.call(native, batchLogitIndex, sampler, probabilities, confidence);
    if (probabilities !== true || !Array.isArray(result) || !Array.isArray(result[1])) return result;
    const [token, flat, ...rest] = result as [number, number[], ...unknown[]];
    return [token, trimDistribution(flat, token, MOST_ALTERNATIVES), ...rest];
  };
  // The addon's method is a read-only property of its prototype: shadowed on the instance.
  Object.defineProperty(native, "sampleToken", { value: wrapped, configurable: true, writable: true });
}
