// The llama.cpp side of /v1/embeddings: one node-llama-cpp embedding context over the
// loaded model, the checks an input must pass before it is evaluated (token ids inside
// the vocabulary, a length that fits), and the vectors, L2-normalised as OpenAI's are.
//
// node-llama-cpp facts this module relies on (3.21.1):
// - `model.createEmbeddingContext()` is a context of its own (its own KV cache), with one
//   sequence; `getEmbeddingFor` erases it, evaluates the whole input and reads the pooled
//   vector of sequence 0. So inputs are evaluated one after another: several inputs
//   cannot share a decode through this API (the native getEmbedding reads sequence 0
//   only). Concurrent calls queue on the context's own lock.
// - It prepends BOS (and appends EOS/SEP where the vocabulary wants one, as BERT's does)
//   to text and to token arrays alike; `calculateInputLength` counts those too, so it is
//   the prompt_tokens of the answer.
// - It refuses an input of contextSize tokens or more with a plain Error; the check here
//   comes first and says how many tokens fit.
// - The vector is the raw pooled one (pooling from the model's metadata, mean when it has
//   none: llama-load.ts), not normalised.
// - The context's batch size must hold a whole input: llama.cpp pools only the last
//   decode of a split input (and aborts the process for a non-causal model such as BERT
//   when an input does not fit one batch), so batchSize = contextSize.
import type { LlamaEmbeddingContext, LlamaModel, Token } from "node-llama-cpp";
import { BadRequestError, InternalError, LlmgwError, UnavailableError } from "../../core/errors.ts";
import type { Logger } from "../../core/log.ts";
import { l2Normalize, type EmbeddingInput } from "./embeddings-wire.ts";

export interface EmbeddingBatch {
  /** One unit-length vector per input, in input order. */
  vectors: Float32Array[];
  /** Tokens evaluated over all inputs (with the BOS/EOS the model adds). */
  promptTokens: number;
}

/** What the HTTP layer needs to answer /v1/embeddings. */
export interface TextEmbedder {
  /** Length of every vector (the model's embedding size). */
  readonly embeddingSize: number;
  /** Most tokens one input may have. */
  readonly maxInputTokens: number;
  embed(inputs: EmbeddingInput[], signal: AbortSignal): Promise<EmbeddingBatch>;
}

export interface LlamaEmbedderOptions {
  model: LlamaModel;
  /** Tokens of the embedding context; an input may use all but one of them. */
  contextSize: number;
  threads: number;
  /**
   * Ask node-llama-cpp's thread splitter for `threads` as the minimum, not only the ideal:
   * for an embedder beside generating contexts that demand all the threads, which would
   * otherwise leave it one.
   */
  demandThreads?: boolean;
  logger: Logger;
}

export class LlamaEmbedder implements TextEmbedder {
  private context: Promise<LlamaEmbeddingContext> | null = null;
  private readonly vocabularySize: number;

  constructor(private readonly options: LlamaEmbedderOptions) {
    const tokens: unknown = options.model.fileInfo.metadata.tokenizer?.ggml?.tokens;
    this.vocabularySize = Array.isArray(tokens) ? tokens.length : Number.MAX_SAFE_INTEGER;
  }

  get embeddingSize(): number {
    return this.options.model.embeddingVectorSize;
  }

  /** CPU threads of the embedding context. */
  get threads(): number {
    return this.options.threads;
  }

  get maxInputTokens(): number {
    return this.options.contextSize - 1;
  }

  /** Creates the embedding context now (it is otherwise created by the first request). */
  async open(): Promise<void> {
    await this.embeddingContext();
  }

  async embed(inputs: EmbeddingInput[], signal: AbortSignal): Promise<EmbeddingBatch> {
    const context = await this.embeddingContext();
    // Every input is checked before any is evaluated, so a bad one costs no compute.
    const lengths = inputs.map((input, index) => this.checkedLength(context, input, inputs.length === 1 ? "input" : `input[${index}]`));
    const vectors: Float32Array[] = [];
    for (const input of inputs) {
      if (signal.aborted) throw signal.reason instanceof LlmgwError ? signal.reason : new UnavailableError("The embeddings request was stopped.");
      let raw: readonly number[];
      try {
        // node-llama-cpp copies a token array before adding BOS/EOS to it.
        raw = (await context.getEmbeddingFor(typeof input === "string" ? input : (input as Token[]))).vector;
      } catch (error) {
        this.options.logger.error({ err: error }, "embedding failed");
        throw new InternalError("llama.cpp failed while embedding; the engine log has the details.", { code: "embedding_failed", cause: error });
      }
      vectors.push(l2Normalize(raw));
    }
    return { vectors, promptTokens: lengths.reduce((sum, length) => sum + length, 0) };
  }

  private checkedLength(context: LlamaEmbeddingContext, input: EmbeddingInput, param: string): number {
    if (typeof input !== "string") {
      // llama.cpp does not check token ids; an id outside the vocabulary reads past its tables.
      const invalid = input.find((id) => id >= this.vocabularySize);
      if (invalid !== undefined) {
        throw new BadRequestError(`Invalid request body: field '${param}': token id ${invalid} is outside the vocabulary of ${this.vocabularySize} tokens.`, {
          code: "invalid_field",
          param: "input",
        });
      }
    }
    const length = context.calculateInputLength(typeof input === "string" ? input : (input as Token[]));
    if (length > this.maxInputTokens) {
      throw new BadRequestError(
        `Field '${param}' has ${length} tokens but this engine embeds at most ${this.maxInputTokens} tokens per input; shorten or split it, or serve the model with a larger context.`,
        { code: "context_length_exceeded", param: "input" },
      );
    }
    return length;
  }

  private embeddingContext(): Promise<LlamaEmbeddingContext> {
    if (this.context) return this.context;
    const { model, contextSize, threads, logger } = this.options;
    // LlamaEmbeddingContext's options type threads as a number, but it hands the value to
    // createContext as it is, whose public options take the { ideal, min } form too.
    const threadOption = (this.options.demandThreads ? { ideal: threads, min: threads } : threads) as number;
    const creating = model.createEmbeddingContext({ contextSize, batchSize: contextSize, threads: threadOption }).then(
      (context) => {
        logger.info({ contextSize, embeddingSize: model.embeddingVectorSize, threads }, "embedding context created");
        return context;
      },
      (error: unknown) => {
        // A later request tries again (memory may have been freed meanwhile).
        this.context = null;
        logger.error({ err: error }, "could not create the embedding context");
        throw new UnavailableError(`The engine could not create an embedding context of ${contextSize} tokens; the engine log has the details.`, {
          cause: error,
        });
      },
    );
    this.context = creating;
    return creating;
  }
}
