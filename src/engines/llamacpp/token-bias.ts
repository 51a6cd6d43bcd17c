// OpenAI's logit_bias as node-llama-cpp's TokenBias. OpenAI adds the bias (-100..100) to
// the token's logit before sampling, "-100 or 100 should result in a ban or exclusive
// selection"; llama.cpp's logit-bias sampler adds it the same way, first in the chain. So
// a value is passed as a logit offset as it is, except -100, which becomes -Infinity: a
// real ban, where -100 would only make the token very unlikely. (+100 stays a finite
// offset: an infinite logit turns the softmax into NaN.)
//
// node-llama-cpp 3.21.1 quirk: TokenBias.set skips end-of-generation tokens, so a client
// could not ban the end of the reply (the usual way to make a model write on); the bias
// of such a token is written into the map that `set` fills and that the sequence reads
// when it builds the sampler (getTokenBiasesForAddon reads `_biases`).
import { TokenBias, type LlamaModel, type Token } from "node-llama-cpp";
import { BadRequestError } from "../../core/errors.ts";

const BAN = -100;

export function tokenBiasFor(model: LlamaModel, biases: ReadonlyArray<readonly [number, number]>, vocabularySize: number): TokenBias {
  const tokenBias = new TokenBias(model.tokenizer);
  const map = (tokenBias as unknown as { _biases: Map<Token, number> })._biases;
  for (const [token, bias] of biases) {
    if (token >= vocabularySize) {
      throw new BadRequestError(`Invalid request body: field 'logit_bias': token id ${token} is outside the vocabulary of ${vocabularySize} tokens.`, {
        code: "invalid_field",
        param: "logit_bias",
      });
    }
    map.set(token as Token, bias <= BAN ? -Infinity : bias);
  }
  return tokenBias;
}
