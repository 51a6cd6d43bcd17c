// The tokens a /v1 request is charged and recorded at, from what its answer's reader saw
// (relay.ts's result): the upstream's own count, checked against the meter's (output-meter.ts),
// held to the bound when the answer was cut there, or, when the upstream reported nothing,
// the gateway's estimate. The rules that turn these into a settlement are request-outcome.ts's.
import type { CatalogModel } from "../catalog/catalog.ts";
import type { TokenUsage } from "../core/token-usage.ts";
import { tokenBound } from "../policy/token-bound.ts";
import { estimatedJsonOutput, type OutputMeter } from "./output-meter.ts";
import type { RelayOutcome } from "./relay.ts";
import type { UsageTap } from "./usage-tap.ts";

/**
 * The usage an upstream reported, raised to what the meter counted where it counted more
 * (every text event came from at least one token, so a lower count is not the upstream's to
 * give), and, for an answer cut at the bound, never past the bound: nothing past it reached
 * the client.
 */
export function chargedUsage(reported: TokenUsage | null, meter: OutputMeter | null, outcome: RelayOutcome["kind"]): TokenUsage | null {
  if (reported === null || meter === null) return reported;
  const counted = Math.max(reported.completion_tokens, meter.countedOutput());
  const completion = outcome === "cut" ? meter.chargedWhenCut(counted) : counted;
  return completion === reported.completion_tokens ? reported : { prompt_tokens: reported.prompt_tokens, completion_tokens: completion };
}

/** What the estimate of an answer without usage is made from. */
export interface EstimateSource {
  /** The upstream path the request ran as. */
  path: string;
  body: Record<string, unknown>;
  model: CatalogModel;
  /** The bytes of the body as the client sent it, when it was sent in this wire format (else measured from `body`). */
  rawBytes: number | undefined;
  /** The output the limits reserved; null: none. */
  bound: number | null;
  /** What counted a stream. */
  meter: OutputMeter | null;
  /** What read a JSON answer. */
  tap: UsageTap | null;
}

/**
 * The usage of an answer whose replica reported none: the prompt at its bound (the bytes of
 * the request, as token-bound.ts reserves them) and the output from its text (output-meter.ts:
 * its bytes, held to the reserved output unless the answer is provably longer). Embeddings
 * generate no text.
 */
export function estimatedUsage(source: EstimateSource): TokenUsage {
  const prompt = tokenBound(source.path, source.body, source.model, source.rawBytes).prompt;
  if (source.path === "/v1/embeddings") return { prompt_tokens: prompt, completion_tokens: 0 };
  if (source.meter !== null) return { prompt_tokens: prompt, completion_tokens: source.meter.estimatedOutput() };
  const tap = source.tap;
  return { prompt_tokens: prompt, completion_tokens: tap === null ? 0 : estimatedJsonOutput(tap.wholeAnswer(), tap.answerBytes(), source.bound) };
}
