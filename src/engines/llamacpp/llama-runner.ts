// The llama.cpp side of the bundled engine: loads one GGUF model through node-llama-cpp,
// owns the one context and its pool of parallel sequences, and turns a chat or a prompt
// plus generation parameters into text, a finish reason and token counts. It knows
// nothing about HTTP; the engine server drives it through the `TextGenerator` interface.
//
// node-llama-cpp facts this module relies on (3.21.1):
// - `createContext({contextSize, sequences})` allocates contextSize × sequences cells:
//   its contextSize is per sequence. llama-server's --ctx-size is the total shared by the
//   slots, so the engine divides it by --parallel.
// - `getSequence()` throws once all sequences are taken; we take them all up front and
//   lend them out, so a request waits for a free one instead of failing.
// - LlamaChat and LlamaCompletion adapt a reused sequence's state to the new tokens
//   (keeping the common prefix), so a sequence needs no clearing between requests.
// - The chat wrapper is resolved once from the model's `tokenizer.chat_template`
//   (`resolveChatWrapper`), which maps well-known templates (ChatML, Llama 3, ...) to
//   specialised wrappers and others to a Jinja wrapper.
// - Threads: without a GPU node-llama-cpp defaults to max(4, math cores). On a 2-core
//   machine that oversubscribes the cores, and llama.cpp's thread synchronisation then
//   made a tiny model tens of times slower than one thread here. So --threads 0 means
//   one thread per available core (os.availableParallelism), never more, and --threads N
//   sets both the library's maximum and the context's threads.
import { availableParallelism } from "node:os";
import {
  getLlama,
  LlamaChat,
  LlamaCompletion,
  LlamaLogLevel,
  resolveChatWrapper,
  type ChatHistoryItem,
  type ChatWrapper,
  type Llama,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaModel,
  type LLamaContextualRepeatPenalty,
  type Token,
} from "node-llama-cpp";
import { BadRequestError, UnavailableError } from "../../core/errors.ts";
import type { Logger } from "../../core/log.ts";
import type { ChatMessage, FinishReason, GenerationParams } from "./openai-wire.ts";

export interface GenerationResult {
  text: string;
  finishReason: FinishReason;
  promptTokens: number;
  completionTokens: number;
  /** True when the signal stopped the generation; text holds what was made until then. */
  aborted: boolean;
}

export interface GenerateOptions {
  params: GenerationParams;
  signal: AbortSignal;
  /** Called once the request holds a sequence and generation starts (after validation). */
  onStart?: () => void;
  /** Streamed text as it is generated (stop sequences are never part of it). */
  onText?: (text: string) => void;
}

/** What the HTTP layer needs from an engine. */
export interface TextGenerator {
  chat(messages: ChatMessage[], options: GenerateOptions): Promise<GenerationResult>;
  complete(prompt: string | number[], options: GenerateOptions): Promise<GenerationResult>;
  /** Tokens one request may use (prompt + output). */
  readonly contextPerRequest: number;
  dispose(): Promise<void>;
}

export interface LlamaRunnerOptions {
  modelPath: string;
  /** Total context shared by all sequences (llama-server's --ctx-size); 0 = the model's trained context. */
  contextSize: number;
  /** Number of requests generated at once. */
  parallel: number;
  /** CPU threads; 0 = one per available core. */
  threads: number;
  logger: Logger;
}

/** Why loading failed, with llama.cpp's own last error line when it printed one. */
export class ModelLoadError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ModelLoadError";
  }
}

/**
 * Lends out a fixed set of sequences. Waiters are served first come, first served; one
 * whose signal aborts leaves the queue.
 */
class SequencePool {
  private readonly free: LlamaContextSequence[];
  private readonly waiters: Array<{ resolve: (s: LlamaContextSequence) => void; reject: (e: unknown) => void }> = [];
  private closedWith: Error | null = null;

  constructor(sequences: LlamaContextSequence[]) {
    this.free = [...sequences];
  }

  acquire(signal: AbortSignal): Promise<LlamaContextSequence> {
    if (this.closedWith) return Promise.reject(this.closedWith);
    if (signal.aborted) return Promise.reject(signal.reason);
    const sequence = this.free.pop();
    if (sequence) return Promise.resolve(sequence);
    return new Promise((resolve, reject) => {
      const waiter = {
        resolve: (s: LlamaContextSequence) => {
          signal.removeEventListener("abort", onAbort);
          resolve(s);
        },
        reject: (e: unknown) => {
          signal.removeEventListener("abort", onAbort);
          reject(e);
        },
      };
      const onAbort = () => {
        const index = this.waiters.indexOf(waiter);
        if (index >= 0) this.waiters.splice(index, 1);
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  release(sequence: LlamaContextSequence): void {
    const waiter = this.waiters.shift();
    if (waiter) waiter.resolve(sequence);
    else this.free.push(sequence);
  }

  close(reason: Error): void {
    this.closedWith = reason;
    for (const waiter of this.waiters.splice(0)) waiter.reject(reason);
  }
}

const STOP_REASON_TO_FINISH: Record<string, FinishReason> = {
  eogToken: "stop",
  stopGenerationTrigger: "stop",
  customStopTrigger: "stop",
  functionCalls: "stop",
  abort: "stop",
  maxTokens: "length",
};

/**
 * The most specific reason for a failed load: llama.cpp logs "error loading model: <why>"
 * followed by generic lines ("failed to load model"), and node-llama-cpp's own error
 * says no more than the generic line.
 */
function loadFailureReason(llamaErrors: string[], error: unknown): string {
  const specific = llamaErrors.find((line) => line.includes("error loading model:"));
  if (specific) return specific.slice(specific.indexOf("error loading model:") + "error loading model:".length).trim();
  return llamaErrors[0] ?? (error instanceof Error ? error.message : String(error));
}

function toHistory(messages: ChatMessage[]): ChatHistoryItem[] {
  const history: ChatHistoryItem[] = messages.map((message): ChatHistoryItem => {
    if (message.role === "system") return { type: "system", text: message.content };
    if (message.role === "user") return { type: "user", text: message.content };
    return { type: "model", response: [message.content] };
  });
  // LlamaChat generates into the last model item; a trailing assistant message is
  // continued (prefill), otherwise an empty one starts the reply.
  if (history.at(-1)?.type !== "model") history.push({ type: "model", response: [] });
  return history;
}

/**
 * Counts the tokens of one generation: the ones streamed through `onToken`, plus what
 * node-llama-cpp never passes there. It holds back tokens that may start a stop trigger
 * and drops them when the generation ends on maxTokens, and the end-of-generation token
 * is not part of the reply; llama-server counts both (`tokens_predicted`), so we do too.
 * (The sequence's token meter is no substitute: LlamaCompletion and LlamaChat meter the
 * last token differently.)
 */
function tokenCounter(): { onToken: (tokens: Token[]) => void; total: (stopReason: string, maxTokens: number) => number } {
  let emitted = 0;
  return {
    onToken: (tokens) => {
      emitted += tokens.length;
    },
    total: (stopReason, maxTokens) => (stopReason === "maxTokens" ? maxTokens : stopReason === "eogToken" ? emitted + 1 : emitted),
  };
}

function repeatPenalty(params: GenerationParams): false | LLamaContextualRepeatPenalty {
  // OpenAI applies no penalty unless asked; node-llama-cpp applies one by default.
  if (params.frequencyPenalty === undefined && params.presencePenalty === undefined) return false;
  return {
    penalty: 1,
    ...(params.frequencyPenalty === undefined ? {} : { frequencyPenalty: params.frequencyPenalty }),
    ...(params.presencePenalty === undefined ? {} : { presencePenalty: params.presencePenalty }),
  };
}

export class LlamaRunner implements TextGenerator {
  private readonly pool: SequencePool;
  private disposed = false;

  private constructor(
    private readonly llama: Llama,
    private readonly model: LlamaModel,
    private readonly context: LlamaContext,
    private readonly chatWrapper: ChatWrapper,
    sequences: LlamaContextSequence[],
  ) {
    this.pool = new SequencePool(sequences);
  }

  get contextPerRequest(): number {
    return this.context.contextSize;
  }

  /** Number of tokens in the model's vocabulary (valid ids are below it). */
  get vocabularySize(): number {
    const tokens: unknown = this.model.fileInfo.metadata.tokenizer?.ggml?.tokens;
    return Array.isArray(tokens) ? tokens.length : Number.MAX_SAFE_INTEGER;
  }

  get chatWrapperName(): string {
    return this.chatWrapper.wrapperName;
  }

  static async load(options: LlamaRunnerOptions): Promise<LlamaRunner> {
    const { logger } = options;
    const threads = options.threads > 0 ? options.threads : availableParallelism();
    // llama.cpp explains a failed load only in its log; keep its error lines for the message.
    const llamaErrors: string[] = [];
    const llama = await getLlama({
      gpu: false,
      // Never build or download anything at run time: only the prebuilt binary in node_modules.
      build: "never",
      skipDownload: true,
      usePrebuiltBinaries: true,
      progressLogs: false,
      maxThreads: threads,
      logLevel: LlamaLogLevel.warn,
      logger: (level, message) => {
        const text = message.trim();
        if (text === "") return;
        if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) {
          // Bounded: the log callback stays installed for the life of the process.
          if (llamaErrors.length < 20) llamaErrors.push(text);
          logger.error({ llama: text }, "llama.cpp error");
        } else if (level === LlamaLogLevel.warn) logger.warn({ llama: text }, "llama.cpp warning");
        else logger.debug({ llama: text }, "llama.cpp");
      },
    });
    let model: LlamaModel;
    try {
      model = await llama.loadModel({ modelPath: options.modelPath });
    } catch (error) {
      await llama.dispose().catch(() => undefined);
      throw new ModelLoadError(`llama.cpp could not load it: ${loadFailureReason(llamaErrors, error)}`, { cause: error });
    }
    try {
      const total = options.contextSize > 0 ? options.contextSize : model.trainContextSize;
      const perSequence = Math.max(64, Math.floor(total / options.parallel));
      const context = await model.createContext({
        contextSize: perSequence,
        sequences: options.parallel,
        threads,
      });
      const sequences = Array.from({ length: options.parallel }, () => context.getSequence());
      const chatWrapper = resolveChatWrapper(model);
      logger.info(
        { chatWrapper: chatWrapper.wrapperName, contextPerSequence: context.contextSize, sequences: options.parallel, threads: context.idealThreads },
        "model loaded",
      );
      return new LlamaRunner(llama, model, context, chatWrapper, sequences);
    } catch (error) {
      await llama.dispose().catch(() => undefined);
      throw new ModelLoadError(`could not create a context of ${options.contextSize} tokens for ${options.parallel} sequences: ${loadFailureReason(llamaErrors, error)}`, {
        cause: error,
      });
    }
  }

  async chat(messages: ChatMessage[], options: GenerateOptions): Promise<GenerationResult> {
    const history = toHistory(messages);
    // The same tokens LlamaChat evaluates: the wrapper's rendering of the whole history.
    const promptTokens = this.chatWrapper.generateContextState({ chatHistory: history }).contextText.tokenize(this.model.tokenizer).length;
    const maxTokens = this.outputBudget(promptTokens, options.params, "messages");
    return this.withSequence(options, async (sequence) => {
      const chat = new LlamaChat({ contextSequence: sequence, chatWrapper: this.chatWrapper, autoDisposeSequence: false });
      const counter = tokenCounter();
      try {
        const result = await chat.generateResponse(history, {
          ...this.sampling(options.params),
          maxTokens,
          signal: options.signal,
          stopOnAbortSignal: true,
          onToken: counter.onToken,
          ...(options.onText ? { onTextChunk: options.onText } : {}),
        });
        return toResult({ response: result.response, stopReason: result.metadata.stopReason, promptTokens, counter, maxTokens, signal: options.signal });
      } finally {
        chat.dispose({ disposeSequence: false });
      }
    });
  }

  async complete(prompt: string | number[], options: GenerateOptions): Promise<GenerationResult> {
    // LlamaCompletion prepends BOS itself when the vocabulary wants one and then tokenises
    // a string with "trimLeadingSpace"; do the same here to know the prompt's length.
    const bos = this.model.tokens.shouldPrependBosToken ? this.model.tokens.bos : null;
    const tokens: Token[] =
      typeof prompt === "string" ? this.model.tokenize(prompt, false, bos != null ? "trimLeadingSpace" : undefined) : (prompt as Token[]);
    // llama.cpp does not check token ids; an id outside the vocabulary reads past its tables.
    const invalid = typeof prompt === "string" ? undefined : prompt.find((id) => id >= this.vocabularySize);
    if (invalid !== undefined) {
      throw new BadRequestError(`Invalid request body: field 'prompt': token id ${invalid} is outside the vocabulary of ${this.vocabularySize} tokens.`, {
        code: "invalid_field",
        param: "prompt",
      });
    }
    const promptTokens = tokens.length + (bos != null ? 1 : 0);
    if (promptTokens === 0) throw new BadRequestError("Invalid request body: field 'prompt': the prompt is empty.", { code: "invalid_field", param: "prompt" });
    const maxTokens = this.outputBudget(promptTokens, options.params, "prompt");
    return this.withSequence(options, async (sequence) => {
      const completion = new LlamaCompletion({ contextSequence: sequence, autoDisposeSequence: false });
      const counter = tokenCounter();
      try {
        const result = await completion.generateCompletionWithMeta(tokens, {
          ...this.sampling(options.params),
          maxTokens,
          disableContextShift: true,
          signal: options.signal,
          stopOnAbortSignal: true,
          onToken: counter.onToken,
          ...(options.onText ? { onTextChunk: options.onText } : {}),
        });
        return toResult({ response: result.response, stopReason: result.metadata.stopReason, promptTokens, counter, maxTokens, signal: options.signal });
      } finally {
        completion.dispose({ disposeSequence: false });
      }
    });
  }

  async dispose(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    this.pool.close(new UnavailableError("The engine is shutting down; retry on another replica."));
    await this.llama.dispose();
  }

  /**
   * How many tokens the reply may have: what was asked, capped by the room left in one
   * sequence (the engine never shifts the context, like llama-server's default).
   */
  private outputBudget(promptTokens: number, params: GenerationParams, param: string): number {
    const room = this.context.contextSize - promptTokens - 1;
    if (room < 1) {
      throw new BadRequestError(
        `The prompt has ${promptTokens} tokens but this engine allows ${this.context.contextSize} tokens per request (prompt and reply); shorten the ${param} or serve the model with a larger context.`,
        { code: "context_length_exceeded", param },
      );
    }
    return Math.min(params.maxTokens ?? room, room);
  }

  private sampling(params: GenerationParams) {
    return {
      temperature: params.temperature,
      ...(params.topP === undefined ? {} : { topP: params.topP }),
      ...(params.seed === undefined ? {} : { seed: params.seed }),
      ...(params.stop.length > 0 ? { customStopTriggers: params.stop } : {}),
      repeatPenalty: repeatPenalty(params),
    };
  }

  private async withSequence(options: GenerateOptions, run: (sequence: LlamaContextSequence) => Promise<GenerationResult>): Promise<GenerationResult> {
    if (this.disposed) throw new UnavailableError("The engine is shutting down; retry on another replica.");
    const sequence = await this.pool.acquire(options.signal);
    try {
      options.onStart?.();
      return await run(sequence);
    } finally {
      // Only after the generation settled: the sequence must not serve two requests at once.
      this.pool.release(sequence);
    }
  }
}

/** One generation's outcome in the shape the HTTP layer renders, for chat and completion alike. */
function toResult(outcome: {
  response: string;
  stopReason: Parameters<ReturnType<typeof tokenCounter>["total"]>[0];
  promptTokens: number;
  counter: ReturnType<typeof tokenCounter>;
  maxTokens: number;
  signal: AbortSignal;
}): GenerationResult {
  return {
    text: outcome.response,
    finishReason: STOP_REASON_TO_FINISH[outcome.stopReason] ?? "stop",
    promptTokens: outcome.promptTokens,
    completionTokens: outcome.counter.total(outcome.stopReason, outcome.maxTokens),
    aborted: outcome.stopReason === "abort" || outcome.signal.aborted,
  };
}
