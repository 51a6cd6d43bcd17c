// Logprobs of a generation: pairs the tokens node-llama-cpp releases with the text it
// releases for them, looks up the distribution each token was sampled from (kept by the
// decode lockstep), and hands out one entry per token once the client has received that
// token's whole text, so that a stream chunk carries the logprobs of the text it carries.
//
// Which distribution: node-llama-cpp reports the probabilities of the candidates left
// after its sampler chain (logit_bias, the penalties, top-k, top-p, min-p, temperature),
// renormalised over them: the distribution the token was actually drawn from. OpenAI
// reports the model's raw distribution instead, but node-llama-cpp exposes no raw logits,
// and a second pass per token would double the work. The two agree under greedy decoding
// (temperature 0), where the chain keeps the whole vocabulary and scales nothing: then
// the figures are the model's softmax (after logit_bias and penalties). With sampling, the
// sampled token's logprob is always finite, but fewer than `top_logprobs` alternatives
// exist when top-k/top-p/min-p cut the candidates (the default top-k is 40), and the list
// is then shorter rather than padded with made-up figures. Under a grammar
// (response_format, tool-call arguments) the figures are likewise those of the
// constrained distribution: the tokens the grammar forbids are not alternatives (they
// have probability 0 there and are left out), and a token the grammar forces reports a
// logprob of 0. A banned token (logit_bias -100) is left out the same way.
//
// Cost: node-llama-cpp hands over each distribution sorted, most likely first: its native
// SampleToken (llama/addon/AddonContext.cpp) sorts llama.cpp's candidates by logit
// whenever probabilities or the confidence are asked for, under greedy decoding, sampling
// and grammars alike (the tests pin it: at temperature 0 the sampled token heads its
// top_logprobs). So the likeliest tokens are the first ones, and nothing here walks the
// rest of a vocabulary that can hold 150k tokens (sampled-distributions.ts trims it
// before node-llama-cpp makes it a Map).
import type { Token } from "node-llama-cpp";
import type { GenerationTurn, TokenDistribution } from "./decode-lockstep.ts";
import { bytesName } from "./token-bytes.ts";

/** One alternative: OpenAI's `top_logprobs` item. */
export interface TopLogprob {
  token: string;
  logprob: number;
  bytes: number[];
}

/** One released token with its logprob and the most likely alternatives at its step. */
export interface TokenLogprob extends TopLogprob {
  top_logprobs: TopLogprob[];
  /** Where the token's text starts in the reply (UTF-16 code units), for text_offset. */
  offset: number;
}

/** What the tracker needs from the model. */
export interface TokenVocabulary {
  /** The token's text following `before`; a control token's own spelling ("<|im_end|>"). */
  text(token: Token, before: readonly Token[]): string;
  /** The token's raw bytes from its vocabulary piece, when the piece spells them. */
  rawBytes(token: Token): number[] | null;
}

// OpenAI's figure for a token with no probability at all (a banned one): JSON has no -Infinity.
const NO_PROBABILITY = -9999;
// How many tokens before one decide how it detokenizes (a leading space, for instance).
const CONTEXT_TOKENS = 8;

const encoder = new TextEncoder();

export function logprobOf(probability: number | undefined): number {
  if (probability === undefined || !(probability > 0)) return NO_PROBABILITY;
  // Single-precision probabilities can sum a hair above 1; a logprob is never positive.
  return Math.min(0, Math.log(probability));
}

/**
 * The `count` most likely tokens of a distribution, most likely first: its first entries,
 * since node-llama-cpp's come in that order, and only those with a probability (see the
 * top of this file).
 */
export function mostLikely(distribution: TokenDistribution, count: number): Array<[Token, number]> {
  const best: Array<[Token, number]> = [];
  if (count <= 0) return best;
  for (const entry of distribution) {
    // Sorted: once one has no probability (or NaN), none after it has.
    if (!(entry[1] > 0)) break;
    best.push(entry);
    if (best.length === count) break;
  }
  return best;
}

/**
 * What a step needs kept for its logprobs: the `count` likeliest tokens, and the sampled
 * token always (its own logprob is reported even when it is not among them).
 */
export function keepForLogprobs(count: number): (token: Token, distribution: TokenDistribution) => TokenDistribution {
  return (token, distribution) => {
    const kept = new Map(mostLikely(distribution, count));
    const probability = distribution.get(token);
    // Appended last: it is not among the likeliest, so no likelier than any of them.
    if (!kept.has(token)) kept.set(token, probability ?? 0);
    return kept;
  };
}

interface Span {
  entries: TokenLogprob[];
  /** Where the span's text ends in the reply. */
  end: number;
}

export class LogprobTracker {
  private pending: Token[] = [];
  /** Index in turn.tokens of the first sampled token not yet matched to a released one. */
  private cursor = 0;
  private readonly spans: Span[] = [];
  private textLength = 0;

  constructor(
    private readonly turn: GenerationTurn,
    private readonly vocabulary: TokenVocabulary,
    /** Alternatives per token (top_logprobs). */
    private readonly top: number,
  ) {}

  /** node-llama-cpp is about to release these tokens' text (its onToken, right before onTextChunk). */
  tokens(tokens: readonly Token[]): void {
    this.pending.push(...tokens);
  }

  /** The text node-llama-cpp released for the pending tokens. */
  text(text: string): void {
    const start = this.textLength;
    this.textLength += text.length;
    const tokens = this.pending;
    this.pending = [];
    this.spans.push({ entries: this.entries(tokens, text, start), end: this.textLength });
  }

  /** The entries of the tokens whose text lies wholly in the first `released` characters of the reply. */
  release(released: number): TokenLogprob[] {
    const out: TokenLogprob[] = [];
    while (this.spans.length > 0 && (this.spans[0] as Span).end <= released) out.push(...(this.spans.shift() as Span).entries);
    return out;
  }

  private entries(tokens: readonly Token[], text: string, start: number): TokenLogprob[] {
    const entries: TokenLogprob[] = [];
    let bytesBefore = 0;
    for (const token of tokens) {
      const index = this.turn.tokens.indexOf(token, this.cursor);
      // A released token the sequence did not sample in this turn has no distribution.
      if (index < 0) continue;
      this.cursor = index + 1;
      const distribution = this.turn.distributions[index];
      if (!distribution) continue;
      const before = this.turn.tokens.slice(Math.max(0, index - CONTEXT_TOKENS), index);
      // One token, one chunk (the usual case): its text is exactly what was released.
      const own = this.describe(token, before, tokens.length === 1 && text !== "" ? text : undefined);
      entries.push({
        token: own.token,
        bytes: own.bytes,
        logprob: logprobOf(distribution.get(token)),
        top_logprobs: this.alternatives(token, distribution).map(([alternative, probability]) => {
          const { token: name, bytes } = this.describe(alternative, before);
          return { token: name, logprob: logprobOf(probability), bytes };
        }),
        offset: start + charactersIn(text, bytesBefore),
      });
      bytesBefore += own.bytes.length;
    }
    return entries;
  }

  /**
   * The likeliest tokens, with the sampled one last when the list has room and it is not
   * there (a token without probability, which only NaN figures from llama.cpp give).
   */
  private alternatives(token: Token, distribution: TokenDistribution): Array<[Token, number]> {
    const best = mostLikely(distribution, this.top);
    if (best.length < this.top && !best.some(([alternative]) => alternative === token)) best.push([token, distribution.get(token) ?? 0]);
    return best;
  }

  /** The token's name and bytes; part of a multi-byte character is named by its bytes. */
  private describe(token: Token, before: readonly Token[], known?: string): { token: string; bytes: number[] } {
    const text = known ?? this.vocabulary.text(token, before);
    // A byte token in the middle of a character detokenizes to U+FFFD, or to nothing when
    // node-llama-cpp holds its byte back for the rest of the character.
    const raw = text === "" || text.includes("\uFFFD") ? this.vocabulary.rawBytes(token) : null;
    if (raw !== null) return { token: bytesName(raw), bytes: raw };
    return { token: text, bytes: Array.from(encoder.encode(text)) };
  }
}

/** UTF-16 length of the whole characters in the first `byteCount` UTF-8 bytes of `text`. */
function charactersIn(text: string, byteCount: number): number {
  let bytes = 0;
  let units = 0;
  for (const char of text) {
    const point = char.codePointAt(0) ?? 0;
    const size = point < 0x80 ? 1 : point < 0x800 ? 2 : point < 0x10000 ? 3 : 4;
    if (bytes + size > byteCount) break;
    bytes += size;
    units += char.length;
  }
  return units;
}
