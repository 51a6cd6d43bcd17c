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
// - LlamaContext batches the decodes its sequences queue, but parallel generations only
//   share a batch in lockstep (decode-lockstep.ts), which also counts sampled tokens.
// - The `stop` parameter is matched here on the released text (stop-sequences.ts), not
//   with node-llama-cpp's custom stop triggers: LlamaCompletion's cannot match text made
//   of byte tokens, and can release a partial character (as U+FFFD) before one.
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
  type ChatWrapper,
  type GbnfJsonSchema,
  type Llama,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaModel,
  type LLamaContextualRepeatPenalty,
  type Token,
} from "node-llama-cpp";
import { BadRequestError, InternalError, UnavailableError } from "../../core/errors.ts";
import type { Logger } from "../../core/log.ts";
import { documentingFunctions, forcingFunctionCalls, toChatFunctions, toChatHistory, ToolCallCollector } from "./chat-tools.ts";
import { DecodeBatchMeter, type DecodeBatchCounts } from "./decode-batches.ts";
import { rewriteCompiledGrammars } from "./grammar-rewrites.ts";
import { DecodeLockstep, type GenerationTurn } from "./decode-lockstep.ts";
import { SequencePool } from "./sequence-pool.ts";
import type { ChatMessage, FinishReason, GenerationParams } from "./openai-wire.ts";
import { StopSequences } from "./stop-sequences.ts";
import { JSON_OBJECT_GRAMMAR } from "./json-schema-grammar.ts";
import type { ChatStructure, ToolCall, ToolCallDelta } from "./structured-wire.ts";

export interface GenerationResult {
  text: string;
  finishReason: FinishReason;
  /** The stop sequence that ended the reply, if one did. */
  stopSequence: string | null;
  promptTokens: number;
  completionTokens: number;
  /** The tool calls the reply made (finish reason "tool_calls" when there are any). */
  toolCalls: ToolCall[];
  /** True when the signal stopped the generation; text holds what was made until then. */
  aborted: boolean;
}

export interface GenerateOptions {
  params: GenerationParams;
  signal: AbortSignal;
  /** Called once the request holds a sequence and generation starts (after validation). */
  onStart?: () => void;
  /** Streamed text as it is generated: whole characters, never a stop sequence. */
  onText?: (text: string) => void;
  /** Chat only: a JSON format or tools the reply must follow. */
  structure?: ChatStructure;
  /** Chat only: streamed tool calls, as OpenAI's deltas. */
  onToolCall?: (delta: ToolCallDelta) => void;
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

// node-llama-cpp's stop reasons; the `stop` parameter is handled here (StopSequences), not
// by node-llama-cpp's custom stop triggers.
const STOP_REASON_TO_FINISH: Record<string, FinishReason> = {
  eogToken: "stop",
  stopGenerationTrigger: "stop",
  functionCalls: "tool_calls",
  abort: "stop",
  maxTokens: "length",
};

/**
 * A reply that made tool calls finishes with "tool_calls", unless max_tokens cut it off
 * (OpenAI's "length"; the calls completed before the limit are still returned).
 */
function finishReason(stopReason: string, toolCalls: number): FinishReason {
  const finish = STOP_REASON_TO_FINISH[stopReason] ?? "stop";
  return toolCalls > 0 && finish === "stop" ? "tool_calls" : finish;
}

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
  private readonly lockstep = new DecodeLockstep();
  private disposed = false;

  private constructor(
    private readonly llama: Llama,
    private readonly model: LlamaModel,
    private readonly context: LlamaContext,
    private readonly chatWrapper: ChatWrapper,
    sequences: LlamaContextSequence[],
    private readonly batchMeter: DecodeBatchMeter,
    private readonly logger: Logger,
  ) {
    for (const sequence of sequences) this.lockstep.attach(sequence);
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

  /** The decode batches run so far, and how many sequences shared them. */
  decodeBatches(): DecodeBatchCounts {
    return this.batchMeter.snapshot();
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
    rewriteCompiledGrammars(llama);
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
      const batchMeter = new DecodeBatchMeter();
      const context = await model.createContext({
        contextSize: perSequence,
        sequences: options.parallel,
        threads,
        batching: { itemPrioritizationStrategy: batchMeter.shareBatch },
      });
      const sequences = Array.from({ length: options.parallel }, () => context.getSequence());
      const chatWrapper = resolveChatWrapper(model);
      logger.info(
        { chatWrapper: chatWrapper.wrapperName, contextPerSequence: context.contextSize, sequences: options.parallel, threads: context.idealThreads },
        "model loaded",
      );
      return new LlamaRunner(llama, model, context, chatWrapper, sequences, batchMeter, logger);
    } catch (error) {
      await llama.dispose().catch(() => undefined);
      throw new ModelLoadError(`could not create a context of ${options.contextSize} tokens for ${options.parallel} sequences: ${loadFailureReason(llamaErrors, error)}`, {
        cause: error,
      });
    }
  }

  async chat(messages: ChatMessage[], options: GenerateOptions): Promise<GenerationResult> {
    const history = toChatHistory(messages);
    const tools = options.structure?.tools;
    const functions = tools && tools.callable.length > 0 ? toChatFunctions(tools.callable) : undefined;
    let chatWrapper = tools ? documentingFunctions(this.chatWrapper, toChatFunctions(tools.documented)) : this.chatWrapper;
    if (tools?.forced) chatWrapper = forcingFunctionCalls(chatWrapper);
    // The same tokens LlamaChat evaluates: the wrapper's rendering of the whole history,
    // with the functions it documents.
    const promptTokens = chatWrapper.generateContextState({ chatHistory: history }).contextText.tokenize(this.model.tokenizer).length;
    const maxTokens = this.outputBudget(promptTokens, options.params, "messages");
    const json = options.structure?.json;
    const grammar =
      json === undefined
        ? undefined
        : json === null
          ? await this.llama.createGrammar({ grammar: JSON_OBJECT_GRAMMAR, stopGenerationTriggers: ["\n\n\n\n"], trimWhitespaceSuffix: true })
          : await this.llama.createGrammarForJsonSchema<GbnfJsonSchema>(json);
    return this.generate(options, promptTokens, maxTokens, async (sequence, hooks) => {
      const chat = new LlamaChat({ contextSequence: sequence, chatWrapper, autoDisposeSequence: false });
      const collector = new ToolCallCollector(options.onToolCall);
      try {
        const result = await chat.generateResponse(history, {
          ...this.sampling(options.params),
          maxTokens,
          ...hooks,
          ...(functions
            ? {
                functions,
                documentFunctionParams: true,
                ...(tools?.parallel === false ? { maxParallelFunctionCalls: 1 } : {}),
                onFunctionCallParamsChunk: (chunk) => collector.paramsChunk(chunk),
                onFunctionCall: (call) => collector.functionCall(call),
              }
            : grammar
              ? { grammar }
              : {}),
        });
        return { stopReason: result.metadata.stopReason, toolCalls: collector.completed() };
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
    return this.generate(options, promptTokens, maxTokens, async (sequence, hooks, turn) => {
      const completion = new LlamaCompletion({ contextSequence: sequence, autoDisposeSequence: false });
      let released = 0;
      try {
        let stopReason: string;
        try {
          const result = await completion.generateCompletionWithMeta(tokens, {
            ...this.sampling(options.params),
            maxTokens,
            disableContextShift: true,
            ...hooks,
            onToken: (chunk) => {
              released += chunk.length;
            },
          });
          stopReason = result.metadata.stopReason;
        } catch (error) {
          // The turn's token iterator ended at maxTokens, which LlamaCompletion reports as
          // a context too small to generate in (see DecodeLockstep.begin).
          if (!turn.reachedLimit) throw error;
          stopReason = "maxTokens";
        }
        // LlamaCompletion releases a character's last byte token only with the token after
        // it, so a reply that ends there would lose a whole character.
        return { stopReason, heldText: this.wholeText(turn.tokens.slice(released), turn.tokens.slice(Math.max(0, released - 8), released)) };
      } finally {
        completion.dispose({ disposeSequence: false });
      }
    });
  }

  async dispose(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    this.pool.close(new UnavailableError("The engine is shutting down; retry on another replica."));
    this.lockstep.close();
    const counts = this.batchMeter.snapshot();
    this.logger.info(
      { decodeBatches: counts.batches, sharedBatches: counts.sharedBatches, sequencesPerBatch: counts.batches === 0 ? 0 : Number((counts.sequenceSteps / counts.batches).toFixed(2)) },
      "decode batches",
    );
    await this.llama.dispose();
  }

  /**
   * The text of `tokens` up to the last whole character: bytes of a character cut off by
   * the end of the generation are left out, never sent as U+FFFD. Control tokens (the end
   * of generation) have no text.
   */
  private wholeText(tokens: readonly Token[], before: readonly Token[]): string {
    // `before`: the tokens just ahead, so a leading "▁" decodes as a space, as it does mid-text.
    const text = this.model.detokenize(
      tokens.filter((token) => !this.model.isSpecialToken(token)),
      false,
      before.filter((token) => !this.model.isSpecialToken(token)),
    );
    return text.replace(/\uFFFD+$/, "");
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
      repeatPenalty: repeatPenalty(params),
    };
  }

  /**
   * Runs one generation on a free sequence, in lockstep with the others. `drive` starts
   * LlamaChat or LlamaCompletion with the hooks and returns node-llama-cpp's stop reason.
   * The text is what the text callback released (whole characters only: node-llama-cpp
   * holds back byte tokens until they form a valid UTF-8 character), cut at the first stop
   * sequence; the token count is what the sequence sampled.
   */
  private async generate(
    options: GenerateOptions,
    promptTokens: number,
    maxTokens: number,
    drive: (sequence: LlamaContextSequence, hooks: GenerationHooks, turn: GenerationTurn) => Promise<DriveOutcome>,
  ): Promise<GenerationResult> {
    if (this.disposed) throw new UnavailableError("The engine is shutting down; retry on another replica.");
    const sequence = await this.pool.acquire(options.signal);
    const turn = this.lockstep.begin(sequence, maxTokens);
    try {
      options.onStart?.();
      const stops = new StopSequences(options.params.stop);
      // A stop sequence ends the generation the way a client abort does, so node-llama-cpp
      // returns what it has; the finish reason tells the two apart.
      const stopFound = new AbortController();
      const signal = AbortSignal.any([options.signal, stopFound.signal]);
      let text = "";
      const send = (chunk: string): void => {
        if (chunk === "") return;
        text += chunk;
        options.onText?.(chunk);
      };
      const onTextChunk = (chunk: string): void => {
        const scan = stops.push(chunk);
        send(scan.text);
        if (scan.stopped && !stopFound.signal.aborted) stopFound.abort(new Error("stop sequence found"));
      };
      let stopReason: string;
      let toolCalls: ToolCall[] = [];
      try {
        const outcome = await drive(sequence, { signal, stopOnAbortSignal: true, onTextChunk }, turn);
        stopReason = outcome.stopReason;
        toolCalls = outcome.toolCalls ?? [];
        if (outcome.heldText && !signal.aborted) onTextChunk(outcome.heldText);
      } catch (error) {
        if (turn.reachedLimit) {
          // The token iterator ended at maxTokens, which node-llama-cpp reports as a
          // context too small to generate in.
          stopReason = "maxTokens";
        } else if (signal.aborted) {
          // LlamaChat throws the abort reason instead of returning when it had no text yet.
          stopReason = "abort";
        } else {
          this.logger.error({ err: error }, "generation failed");
          throw new InternalError("llama.cpp failed while generating; the engine log has the details.", { code: "generation_failed", cause: error });
        }
      }
      const stopped = stopFound.signal.aborted;
      const aborted = !stopped && options.signal.aborted;
      if (!stopped && !aborted) send(stops.flush());
      return {
        text,
        finishReason: stopped ? "stop" : finishReason(stopReason, toolCalls.length),
        stopSequence: stopped ? stops.matched : null,
        promptTokens,
        completionTokens: turn.sampledTokens,
        toolCalls,
        aborted,
      };
    } finally {
      turn.end();
      // Only after the generation settled: the sequence must not serve two requests at once.
      this.pool.release(sequence);
    }
  }
}

/** How LlamaChat or LlamaCompletion ended, and text of tokens it sampled but never released. */
interface DriveOutcome {
  stopReason: string;
  heldText?: string;
  toolCalls?: ToolCall[];
}

/** What `generate` hands LlamaChat and LlamaCompletion. */
interface GenerationHooks {
  signal: AbortSignal;
  stopOnAbortSignal: true;
  onTextChunk: (text: string) => void;
}
