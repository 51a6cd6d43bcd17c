// The OpenAI wire format of /v1/embeddings on the bundled engine: the request schema,
// its normalisation into a list of inputs (text or token ids), and the response shape
// with float or base64 vectors (shared/reference/protocols.md §4). Like openai-wire.ts it
// knows nothing about HTTP or llama.cpp, so the shapes are checked in isolation.
import { z } from "zod";
import { BadRequestError } from "../../core/errors.ts";

/** OpenAI's own limit on the inputs of one embeddings request. */
export const MAX_EMBEDDING_INPUTS = 2048;

const tokenIds = z.array(z.number().int().min(0)).min(1, "a token array must hold at least one token id");

export const embeddingRequestSchema = z.object({
  // The engine serves exactly one model, so `model` is informational, as in openai-wire.ts.
  model: z.string().optional(),
  input: z.union(
    [
      z.string(),
      z.array(z.string()).min(1, "input must hold at least one string").max(MAX_EMBEDDING_INPUTS, `at most ${MAX_EMBEDDING_INPUTS} inputs per request`),
      tokenIds,
      z.array(tokenIds).min(1, "input must hold at least one token array").max(MAX_EMBEDDING_INPUTS, `at most ${MAX_EMBEDDING_INPUTS} inputs per request`),
    ],
    { error: "input must be a string, an array of strings, an array of token ids, or an array of token id arrays" },
  ),
  encoding_format: z.enum(["float", "base64"], { error: "encoding_format must be 'float' or 'base64'" }).nullish(),
  dimensions: z.number().int().min(1).nullish(),
  user: z.string().nullish(),
});

export type EmbeddingRequest = z.output<typeof embeddingRequestSchema>;

/** One input to embed: text, or token ids as the client tokenised them. */
export type EmbeddingInput = string | number[];

export interface EmbeddingJob {
  inputs: EmbeddingInput[];
  encoding: "float" | "base64";
  /** The vector size the client asked for, if it asked; the engine can only give the model's own. */
  dimensions: number | null;
}

export function toEmbeddingJob(body: EmbeddingRequest): EmbeddingJob {
  const { input } = body;
  let inputs: EmbeddingInput[];
  if (typeof input === "string") inputs = [input];
  else if (input.every((item): item is number => typeof item === "number")) inputs = [input];
  else inputs = input as EmbeddingInput[];
  // OpenAI refuses empty strings too: an empty input has no tokens to pool.
  const empty = inputs.indexOf("");
  if (empty >= 0) {
    const param = typeof input === "string" ? "input" : `input[${empty}]`;
    throw new BadRequestError(`Invalid request body: field '${param}': the input is empty; send at least one character.`, { code: "invalid_field", param });
  }
  return { inputs, encoding: body.encoding_format ?? "float", dimensions: body.dimensions ?? null };
}

/**
 * Refuses `dimensions` unless it is the model's own size: llama.cpp cannot shorten a
 * vector the way OpenAI's Matryoshka-trained models can, and cutting one would silently
 * give a different (worse) embedding than the client expects.
 */
export function checkDimensions(job: EmbeddingJob, modelSize: number): void {
  if (job.dimensions === null || job.dimensions === modelSize) return;
  throw new BadRequestError(
    `Invalid request body: field 'dimensions': this model's embeddings have ${modelSize} dimensions and the engine cannot change that; omit 'dimensions' or send ${modelSize}.`,
    { code: "invalid_field", param: "dimensions" },
  );
}

/** A vector scaled to unit length (L2), as OpenAI's are; a zero vector stays zero. */
export function l2Normalize(vector: ArrayLike<number>): Float32Array {
  let sum = 0;
  for (let i = 0; i < vector.length; i++) sum += (vector[i] as number) ** 2;
  const norm = Math.sqrt(sum);
  const out = new Float32Array(vector.length);
  for (let i = 0; i < vector.length; i++) out[i] = norm === 0 ? 0 : (vector[i] as number) / norm;
  return out;
}

/** OpenAI's base64 encoding: the vector's float32 values, little-endian, as bytes. */
export function encodeBase64(vector: Float32Array): string {
  const bytes = Buffer.alloc(vector.length * 4);
  for (let i = 0; i < vector.length; i++) bytes.writeFloatLE(vector[i] as number, i * 4);
  return bytes.toString("base64");
}

export function embeddingList(options: { model: string; vectors: Float32Array[]; encoding: "float" | "base64"; promptTokens: number }) {
  return {
    object: "list" as const,
    data: options.vectors.map((vector, index) => ({
      object: "embedding" as const,
      index,
      embedding: options.encoding === "base64" ? encodeBase64(vector) : Array.from(vector),
    })),
    model: options.model,
    usage: { prompt_tokens: options.promptTokens, total_tokens: options.promptTokens },
  };
}
