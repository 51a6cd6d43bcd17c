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
// - LoRA adapters (--lora) are per context: a request that names adapters runs on a
//   context of its own for that combination (adapter-lanes.ts says how they are made,
//   shared and bounded); the base keeps the context made here.
import { availableParallelism } from "node:os";
import {
  LlamaChat,
  LlamaCompletion,
  resolveChatWrapper,
  type ChatWrapper,
  type GbnfJsonSchema,
  type Llama,
  type LlamaContext,
  type LlamaContextSequence,
  type LlamaGrammar,
  type LlamaModel,
  type LLamaContextualRepeatPenalty,
  type Token,
} from "node-llama-cpp";
import { BadRequestError, InternalError, UnavailableError } from "../../core/errors.ts";
import type { Logger } from "../../core/log.ts";
import { AdapterLanes, createLane, DEFAULT_ADAPTER_CONTEXTS, type LaneChoice } from "./adapter-lanes.ts";
import { documentingFunctions, forcingFunctionCalls, toChatFunctions, toChatHistory, ToolCallCollector } from "./chat-tools.ts";
import { DecodeBatchMeter, type DecodeBatchCounts } from "./decode-batches.ts";
import { rewriteCompiledGrammars } from "./grammar-rewrites.ts";
import type { GenerationTurn } from "./decode-lockstep.ts";
import { LlamaEmbedder, type TextEmbedder } from "./llama-embedder.ts";
import { AdapterLoadError, adapterLoadError, loadFailureReason, ModelLoadError, openModel } from "./llama-load.ts";
import type { ChatMessage, FinishReason, GenerationParams } from "./openai-wire.ts";
import { StopSequences } from "./stop-sequences.ts";
import { tokenBiasFor } from "./token-bias.ts";
import { pieceBytes, type TokenPieces } from "./token-bytes.ts";
import { keepForLogprobs, LogprobTracker, type TokenLogprob, type TokenVocabulary } from "./token-logprobs.ts";
import { JSON_OBJECT_GRAMMAR } from "./json-schema-grammar.ts";
import { ToolGrammarCheck } from "./tool-grammars.ts";
import type { ChatStructure, ToolCall, ToolCallDelta } from "./structured-wire.ts";

export { AdapterLoadError, ModelLoadError };

export interface GenerationResult {
  text: string;
  finishReason: FinishReason;
  /** The stop sequence that ended the reply, if one did. */
  stopSequence: string | null;
  promptTokens: number;
  /** Of promptTokens, those the sequence held from an earlier request and did not evaluate (the prompt cache). */
  cachedTokens: number;
  completionTokens: number;
  /** The tool calls the reply made (finish reason "tool_calls" when there are any). */
  toolCalls: ToolCall[];
  /** True when the signal stopped the generation; text holds what was made until then. */
  aborted: boolean;
  /** With params.logprobs: one entry per token of `text` (see token-logprobs.ts). */
  logprobs?: TokenLogprob[];
}

export interface GenerateOptions {
  params: GenerationParams;
  signal: AbortSignal;
  /** Called once the request holds a sequence and generation starts (after validation). */
  onStart?: () => void;
  /**
   * Streamed text as it is generated: whole characters, never a stop sequence. With
   * params.logprobs, the entries of the tokens whose text is now wholly sent.
   */
  onText?: (text: string, logprobs?: TokenLogprob[]) => void;
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
  /** /v1/embeddings; an engine without one answers that it does not embed. */
  readonly embedder?: TextEmbedder;
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
  /** LoRA adapter files in id order (--lora); loaded at start, applied when a request names them. */
  adapterPaths?: readonly string[];
  /** Most contexts kept for adapter combinations at once (--lora-contexts); default DEFAULT_ADAPTER_CONTEXTS. */
  maxAdapterContexts?: number;
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
 * (OpenAI's "length"; the calls made until the limit are still returned, the last one
 * possibly with incomplete arguments: ToolCallCollector.made).
 */
function finishReason(stopReason: string, toolCalls: number): FinishReason {
  const finish = STOP_REASON_TO_FINISH[stopReason] ?? "stop";
  return toolCalls > 0 && finish === "stop" ? "tool_calls" : finish;
}

function repeatPenalty(params: GenerationParams): false | LLamaContextualRepeatPenalty {
  // OpenAI applies no penalty unless asked; node-llama-cpp applies one by default.
  if (params.frequencyPenalty === undefined && params.presencePenalty === undefined && params.repeatPenalty === undefined) return false;
  return {
    penalty: params.repeatPenalty ?? 1,
    // Over the last 64 tokens of the reply (llama.cpp's repeat_last_n), newlines included
    // like any token: node-llama-cpp exempts them unless told, OpenAI and llama.cpp do not.
    lastTokens: 64,
    penalizeNewLine: true,
    ...(params.frequencyPenalty === undefined ? {} : { frequencyPenalty: params.frequencyPenalty }),
    ...(params.presencePenalty === undefined ? {} : { presencePenalty: params.presencePenalty }),
  };
}

export class LlamaRunner implements TextGenerator {
  private readonly context: LlamaContext;
  private readonly toolGrammars: ToolGrammarCheck;
  private disposed = false;
  readonly embedder: TextEmbedder;

  private constructor(
    private readonly llama: Llama,
    private readonly model: LlamaModel,
    private readonly lanes: AdapterLanes,
    private readonly chatWrapper: ChatWrapper,
    private readonly batchMeter: DecodeBatchMeter,
    private readonly logger: Logger,
  ) {
    this.context = lanes.base.context;
    this.toolGrammars = new ToolGrammarCheck(llama);
    // Its context is created on the first embeddings request, so an engine that only
    // generates never holds the memory; one input fits what one request may use here.
    // Half the threads (at least one), and demanded as the lanes demand theirs
    // (adapter-lanes.ts): as a plain number, node-llama-cpp's thread splitter would cut it
    // to one thread whenever a generation step, which demands all threads, is queued at
    // the same moment; demanded, the batch waits for that step and runs at its width.
    this.embedder = new LlamaEmbedder({
      model,
      contextSize: this.context.contextSize,
      threads: Math.max(1, Math.floor(this.context.idealThreads / 2)),
      demandThreads: true,
      logger,
    });
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

  /** Contexts made for adapter combinations that exist now (the base's not counted). */
  get adapterContexts(): number {
    return this.lanes.adapterLaneCount;
  }

  /** The decode batches run so far, and how many sequences shared them. */
  decodeBatches(): DecodeBatchCounts {
    return this.batchMeter.snapshot();
  }

  static async load(options: LlamaRunnerOptions): Promise<LlamaRunner> {
    const { logger } = options;
    const threads = options.threads > 0 ? options.threads : availableParallelism();
    const { llama, model, llamaErrors } = await openModel({ modelPath: options.modelPath, threads, logger });
    // Before any grammar is compiled (grammar-rewrites.ts says why).
    rewriteCompiledGrammars(llama);
    try {
      const total = options.contextSize > 0 ? options.contextSize : model.trainContextSize;
      const perSequence = Math.max(64, Math.floor(total / options.parallel));
      const batchMeter = new DecodeBatchMeter();
      const shape = { model, contextSize: perSequence, sequences: options.parallel, threads, batchMeter };
      const adapterPaths = options.adapterPaths ?? [];
      // Every adapter at scale 0, as llama-server's --lora-scaled PATH:0: loaded and checked
      // now, left out of the base's graph (adapter-lanes.ts).
      const adapters = adapterPaths.map((filePath) => ({ filePath, scale: 0 }));
      const base = await createLane(shape, "", adapters).catch((error: unknown) => {
        throw adapterLoadError(adapterPaths, llamaErrors, error) ?? error;
      });
      const lanes = new AdapterLanes({ base, shape, adapterPaths, maxAdapterLanes: options.maxAdapterContexts ?? DEFAULT_ADAPTER_CONTEXTS, logger });
      const chatWrapper = resolveChatWrapper(model);
      logger.info(
        {
          chatWrapper: chatWrapper.wrapperName,
          contextPerSequence: base.context.contextSize,
          sequences: options.parallel,
          threads: base.context.idealThreads,
          adapters: adapterPaths.length,
          // "localBuild": compiled for this CPU by `llmgw engine build` (native-binding.ts).
          binding: llama.buildType,
        },
        "model loaded",
      );
      return new LlamaRunner(llama, model, lanes, chatWrapper, batchMeter, logger);
    } catch (error) {
      await llama.dispose().catch(() => undefined);
      if (error instanceof AdapterLoadError) throw error;
      throw new ModelLoadError(
        `could not create a context of ${options.contextSize} tokens for ${options.parallel} sequences: ${loadFailureReason(llamaErrors, error)}`,
        {
          cause: error,
        },
      );
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
    const prompt = chatWrapper.generateContextState({ chatHistory: history }).contextText.tokenize(this.model.tokenizer);
    const promptTokens = prompt.length;
    const maxTokens = this.outputBudget(promptTokens, options.params, "messages");
    // Before a sequence is taken, so that a bad logit_bias is a plain 400.
    const sampling = this.sampling(options.params);
    const json = options.structure?.json;
    const grammar = json === undefined ? undefined : await this.grammarFor(json);
    // LlamaChat compiles a function's grammar only once the model calls it (tool-grammars.ts).
    if (tools) await this.toolGrammars.check(tools.callable, tools.documented);
    return this.generate(options, prompt, maxTokens, async (sequence, hooks) => {
      const chat = new LlamaChat({ contextSequence: sequence, chatWrapper, autoDisposeSequence: false });
      const collector = new ToolCallCollector(options.onToolCall);
      try {
        const result = await chat.generateResponse(history, {
          ...sampling,
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
        return { stopReason: result.metadata.stopReason, toolCalls: collector.made() };
      } finally {
        chat.dispose({ disposeSequence: false });
      }
    });
  }

  async complete(prompt: string | number[], options: GenerateOptions): Promise<GenerationResult> {
    // LlamaCompletion prepends BOS itself when the vocabulary wants one and then tokenises
    // a string with "trimLeadingSpace"; do the same here to know the prompt's length.
    const bos = this.model.tokens.shouldPrependBosToken ? this.model.tokens.bos : null;
    const tokens: Token[] = typeof prompt === "string" ? this.model.tokenize(prompt, false, bos != null ? "trimLeadingSpace" : undefined) : (prompt as Token[]);
    // llama.cpp does not check token ids; an id outside the vocabulary reads past its tables.
    const invalid = typeof prompt === "string" ? undefined : prompt.find((id) => id >= this.vocabularySize);
    if (invalid !== undefined) {
      throw new BadRequestError(`Invalid request body: field 'prompt': token id ${invalid} is outside the vocabulary of ${this.vocabularySize} tokens.`, {
        code: "invalid_field",
        param: "prompt",
      });
    }
    const evaluated = bos != null ? [bos, ...tokens] : tokens;
    const promptTokens = evaluated.length;
    if (promptTokens === 0) throw new BadRequestError("Invalid request body: field 'prompt': the prompt is empty.", { code: "invalid_field", param: "prompt" });
    const maxTokens = this.outputBudget(promptTokens, options.params, "prompt");
    const sampling = this.sampling(options.params);
    return this.generate(options, evaluated, maxTokens, async (sequence, hooks, turn) => {
      const completion = new LlamaCompletion({ contextSequence: sequence, autoDisposeSequence: false });
      let released = 0;
      try {
        let stopReason: string;
        try {
          const result = await completion.generateCompletionWithMeta(tokens, {
            ...sampling,
            maxTokens,
            disableContextShift: true,
            // LlamaCompletion fits the prompt into the context less this shift's room (a
            // tenth by default), dropping the front of a longer one; outputBudget has
            // already refused any prompt that does not fit, so nothing may be dropped.
            contextShiftSize: 1,
            ...hooks,
            onToken: (chunk) => {
              released += chunk.length;
              hooks.onToken?.(chunk);
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
        const heldTokens = turn.tokens.slice(released);
        return { stopReason, heldTokens, heldText: this.wholeText(heldTokens, turn.tokens.slice(Math.max(0, released - 8), released)) };
      } finally {
        completion.dispose({ disposeSequence: false });
      }
    });
  }

  async dispose(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    this.lanes.close(new UnavailableError("The engine is shutting down; retry on another replica."));
    const counts = this.batchMeter.snapshot();
    this.logger.info(
      {
        decodeBatches: counts.batches,
        sharedBatches: counts.sharedBatches,
        sequencesPerBatch: counts.batches === 0 ? 0 : Number((counts.sequenceSteps / counts.batches).toFixed(2)),
      },
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
   * The grammar of a response_format: any JSON object (null) or a translated schema. The
   * schema was checked when the request arrived (json-schema-grammar.ts); should llama.cpp
   * still refuse the grammar, that is the request's schema, so a 400, not an engine fault.
   */
  private async grammarFor(json: GbnfJsonSchema | null): Promise<LlamaGrammar> {
    if (json === null) return this.llama.createGrammar({ grammar: JSON_OBJECT_GRAMMAR, stopGenerationTriggers: ["\n\n\n\n"], trimWhitespaceSuffix: true });
    try {
      return await this.llama.createGrammarForJsonSchema<GbnfJsonSchema>(json);
    } catch (error) {
      throw new BadRequestError(
        `Invalid request body: field 'response_format.json_schema.schema': llama.cpp could not build a grammar from it (${error instanceof Error ? error.message : String(error)}); simplify the schema, or serve the model with llama-server or vLLM.`,
        { code: "invalid_schema", param: "response_format.json_schema.schema", cause: error },
      );
    }
  }

  /** The model's side of logprobs: token texts, and raw bytes for partial characters. */
  private tokenVocabulary(): TokenVocabulary {
    const ggml = this.model.fileInfo.metadata.tokenizer?.ggml;
    const pieces: TokenPieces = { pieces: Array.isArray(ggml?.tokens) ? (ggml.tokens as string[]) : [], kind: String(ggml?.model ?? "") };
    return {
      // A control token (an alternative such as the end of turn) is shown by its spelling.
      text: (token, before) => this.model.detokenize([token], this.model.isSpecialToken(token), before),
      rawBytes: (token) => pieceBytes(pieces, token),
    };
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
      ...(params.topK === undefined ? {} : { topK: params.topK }),
      ...(params.minP === undefined ? {} : { minP: params.minP }),
      ...(params.logitBias === undefined ? {} : { tokenBias: tokenBiasFor(this.model, params.logitBias, this.vocabularySize) }),
      ...(params.seed === undefined ? {} : { seed: params.seed }),
      repeatPenalty: repeatPenalty(params),
    };
  }

  /**
   * Runs one generation on a free sequence, in lockstep with the others. `drive` starts
   * LlamaChat or LlamaCompletion with the hooks and returns node-llama-cpp's stop reason.
   * The text is what the text callback released (whole characters only: node-llama-cpp
   * holds back byte tokens until they form a valid UTF-8 character), cut at the first stop
   * sequence; the token count is what the sequence sampled. `prompt`: the tokens the
   * generation evaluates first, to pick the sequence that holds most of them already.
   */
  private async generate(
    options: GenerateOptions,
    prompt: readonly Token[],
    maxTokens: number,
    drive: (sequence: LlamaContextSequence, hooks: GenerationHooks, turn: GenerationTurn) => Promise<DriveOutcome>,
  ): Promise<GenerationResult> {
    if (this.disposed) throw new UnavailableError("The engine is shutting down; retry on another replica.");
    // The base, or the context of the adapters the request names (400 for unknown ones).
    const choice: LaneChoice = this.lanes.choose(options.params.lora);
    const lane = await this.lanes.acquire(choice);
    let sequence: LlamaContextSequence;
    try {
      sequence = await lane.pool.acquire(options.signal, prompt);
    } catch (error) {
      this.lanes.release(lane);
      throw error;
    }
    const wantsLogprobs = options.params.logprobs;
    const turn = lane.lockstep.begin(
      sequence,
      maxTokens,
      wantsLogprobs === undefined ? {} : { keepDistribution: keepForLogprobs(wantsLogprobs.top), sampledOnly: wantsLogprobs.top === 0 },
    );
    const tracker = wantsLogprobs === undefined ? null : new LogprobTracker(turn, this.tokenVocabulary(), wantsLogprobs.top);
    const logprobs: TokenLogprob[] = [];
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
        const entries = tracker?.release(text.length);
        if (entries) logprobs.push(...entries);
        options.onText?.(chunk, entries);
      };
      const onTextChunk = (chunk: string): void => {
        tracker?.text(chunk);
        const scan = stops.push(chunk);
        send(scan.text);
        if (scan.stopped && !stopFound.signal.aborted) stopFound.abort(new Error("stop sequence found"));
      };
      let stopReason: string;
      let toolCalls: ToolCall[] = [];
      try {
        const hooks: GenerationHooks = {
          signal,
          stopOnAbortSignal: true,
          onTextChunk,
          ...(tracker ? { onToken: (tokens: Token[]) => tracker.tokens(tokens) } : {}),
        };
        const outcome = await drive(sequence, hooks, turn);
        stopReason = outcome.stopReason;
        toolCalls = outcome.toolCalls ?? [];
        if (outcome.heldText && !signal.aborted) {
          tracker?.tokens(outcome.heldTokens ?? []);
          onTextChunk(outcome.heldText);
        }
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
        promptTokens: prompt.length,
        cachedTokens: turn.cachedTokens,
        completionTokens: turn.sampledTokens,
        toolCalls,
        aborted,
        ...(tracker ? { logprobs } : {}),
      };
    } finally {
      turn.end();
      // Only after the generation settled: the sequence must not serve two requests at once.
      lane.pool.release(sequence);
      this.lanes.release(lane);
    }
  }
}

/** How LlamaChat or LlamaCompletion ended, and text of tokens it sampled but never released. */
interface DriveOutcome {
  stopReason: string;
  heldText?: string;
  heldTokens?: Token[];
  toolCalls?: ToolCall[];
}

/** What `generate` hands LlamaChat and LlamaCompletion. */
interface GenerationHooks {
  signal: AbortSignal;
  stopOnAbortSignal: true;
  onTextChunk: (text: string) => void;
  /** Only when logprobs are wanted: the tokens whose text the next onTextChunk releases. */
  onToken?: (tokens: Token[]) => void;
}
