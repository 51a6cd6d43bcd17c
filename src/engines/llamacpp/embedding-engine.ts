// The bundled engine for a dedicated embedding model (`llmgw engine --embeddings`, from a
// profile with `embeddings: true`): the model and one embedding context, created at
// start, and no generation context at all, so the memory a generating engine spends on
// its parallel sequences is not spent. Chat and completions are refused with a 400 that
// says why, the way llama-server started with --embedding refuses them.
import { availableParallelism } from "node:os";
import type { Llama } from "node-llama-cpp";
import { BadRequestError } from "../../core/errors.ts";
import type { Logger } from "../../core/log.ts";
import { LlamaEmbedder } from "./llama-embedder.ts";
import { loadFailureReason, ModelLoadError, openModel } from "./llama-load.ts";
import type { GenerationResult, TextGenerator } from "./llama-runner.ts";

export interface EmbeddingEngineOptions {
  modelPath: string;
  /** Tokens of the embedding context (llama-server's --ctx-size); 0 = the model's trained context. */
  contextSize: number;
  /** CPU threads; 0 = one per available core. */
  threads: number;
  logger: Logger;
  /** The model id, for the refusal of chat and completions. */
  modelName: string;
}

export class LlamaEmbeddingEngine implements TextGenerator {
  private disposed = false;

  private constructor(
    private readonly llama: Llama,
    readonly embedder: LlamaEmbedder,
    private readonly modelName: string,
  ) {}

  static async load(options: EmbeddingEngineOptions): Promise<LlamaEmbeddingEngine> {
    const threads = options.threads > 0 ? options.threads : availableParallelism();
    const { llama, model, llamaErrors } = await openModel({ modelPath: options.modelPath, threads, logger: options.logger });
    // An embedding model reads one input at a time, and BERT-style models are trained on
    // short ones (512 tokens): more context than the model's own would only cost memory.
    const contextSize = Math.min(options.contextSize > 0 ? options.contextSize : model.trainContextSize, model.trainContextSize);
    const embedder = new LlamaEmbedder({ model, contextSize, threads, logger: options.logger });
    try {
      await embedder.open();
    } catch (error) {
      await llama.dispose().catch(() => undefined);
      throw new ModelLoadError(`could not create an embedding context of ${contextSize} tokens: ${loadFailureReason(llamaErrors, error)}`, { cause: error });
    }
    options.logger.info({ contextSize, embeddingSize: embedder.embeddingSize, threads }, "embedding model loaded");
    return new LlamaEmbeddingEngine(llama, embedder, options.modelName);
  }

  get contextPerRequest(): number {
    return this.embedder.maxInputTokens + 1;
  }

  chat(): Promise<GenerationResult> {
    return Promise.reject(this.refusal("/v1/chat/completions"));
  }

  complete(): Promise<GenerationResult> {
    return Promise.reject(this.refusal("/v1/completions"));
  }

  async dispose(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    await this.llama.dispose();
  }

  private refusal(route: string): BadRequestError {
    return new BadRequestError(
      `Model '${this.modelName}' is an embedding model (served with embeddings: true) and does not generate text; use /v1/embeddings with it, or send ${route} to a chat model.`,
      { code: "model_not_generative" },
    );
  }
}
