// Opening a GGUF model with node-llama-cpp for the bundled engine: the CPU-only binding
// (never built or downloaded at run time: this CPU's local build, else the prebuilt
// one), llama.cpp's log routed to ours, and the model loaded with the pooling the
// engine's embeddings use. Both the generating engine (llama-runner.ts) and the
// embedding-only one (embedding-engine.ts) start here.
//
// Pooling: llama.cpp pools an embedding context's token vectors the way the model's
// `<arch>.pooling_type` key says (BERT-style embedding models carry mean or CLS, Qwen3
// embedding models last). A generative model carries none, and llama.cpp then pools
// nothing: node-llama-cpp returns the last token's vector, which describes the next
// token more than the text. So for such a model the key is overridden to mean at load
// (llama.cpp reads it for every architecture, and uses it only in embedding contexts,
// so generation is unchanged).
import { resolve } from "node:path";
import { getLlama, LlamaLogLevel, readGgufFileInfo, type Llama, type LlamaModel } from "node-llama-cpp";
import type { Logger } from "../../core/log.ts";
import { cpuFingerprint } from "../llama-server/llama-cpp-source.ts";
import { bindingCmakeOptions, compileInProgress } from "./native-binding.ts";

/** Why loading failed, with llama.cpp's own last error line when it printed one. */
export class ModelLoadError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ModelLoadError";
  }
}

export interface OpenedModel {
  llama: Llama;
  model: LlamaModel;
  /** llama.cpp's error lines so far, for the message of a later failure (bounded). */
  llamaErrors: string[];
}

// llama.cpp's enum llama_pooling_type: UNSPECIFIED -1, NONE 0, MEAN 1, CLS 2, LAST 3, RANK 4.
const POOLING_MEAN = 1;

/**
 * The most specific reason for a failed load: llama.cpp logs "error loading model: <why>"
 * followed by generic lines ("failed to load model"), and node-llama-cpp's own error
 * says no more than the generic line.
 */
export function loadFailureReason(llamaErrors: string[], error: unknown): string {
  const specific = llamaErrors.find((line) => line.includes("error loading model:"));
  if (specific) return specific.slice(specific.indexOf("error loading model:") + "error loading model:".length).trim();
  return llamaErrors[0] ?? (error instanceof Error ? error.message : String(error));
}

/** A LoRA adapter (--lora) llama.cpp refused at start; `path` names the file. */
export class AdapterLoadError extends ModelLoadError {
  constructor(
    readonly path: string,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "AdapterLoadError";
  }
}

const ADAPTER_FAILURE = "failed to apply lora adapter:";

/**
 * The adapter behind a failed context creation, or undefined when the failure was not an
 * adapter's. llama.cpp explains it only in its log ("llama_adapter_lora_init: failed to
 * apply lora adapter: <why>"), and node-llama-cpp says which file only in its error's text
 * ('Failed to initialize LoRA adapter "<path>"', with the path resolved), so both are read.
 */
export function adapterLoadError(paths: readonly string[], llamaErrors: readonly string[], error: unknown): AdapterLoadError | undefined {
  const message = error instanceof Error ? error.message : String(error);
  const line = llamaErrors.findLast((text) => text.includes(ADAPTER_FAILURE));
  const path = paths.find((candidate) => message.includes(`"${resolve(candidate)}"`));
  if (line === undefined && path === undefined) return undefined;
  const reason = line === undefined ? message : line.slice(line.indexOf(ADAPTER_FAILURE) + ADAPTER_FAILURE.length).trim();
  const which = path ?? (paths.length === 1 ? paths[0] : undefined);
  return new AdapterLoadError(which ?? paths.join(", "), `llama.cpp could not load it as a LoRA adapter of this model: ${reason}`, { cause: error });
}

/** The metadata override that makes embeddings mean-pooled, or none when the model says how to pool. */
async function poolingOverride(modelPath: string): Promise<Record<string, Record<string, number>> | undefined> {
  const info = await readGgufFileInfo(modelPath, {
    readTensorInfo: false,
    logWarnings: false,
    ignoreKeys: ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"],
  });
  const metadata = info.metadata as unknown as Record<string, unknown>;
  const architecture = (metadata.general as { architecture?: unknown } | undefined)?.architecture;
  if (typeof architecture !== "string") return undefined;
  const pooling = (metadata[architecture] as { pooling_type?: unknown } | undefined)?.pooling_type;
  if (typeof pooling === "number" && pooling > 0) return undefined;
  return { [architecture]: { pooling_type: POOLING_MEAN } };
}

/** Loads the model on `threads` CPU threads; throws ModelLoadError with llama.cpp's reason. */
export async function openModel(options: { modelPath: string; threads: number; logger: Logger }): Promise<OpenedModel> {
  const { logger } = options;
  // llama.cpp explains a failed load only in its log; keep its error lines for the message.
  const llamaErrors: string[] = [];
  // While `llmgw engine build` compiles this CPU's build, node-llama-cpp would wait for
  // the compile to end before loading anything: ask for options no build has, which
  // leaves it the prebuilt binary at once.
  const compiling = compileInProgress();
  if (compiling)
    logger.warn(
      "the bundled engine's llama.cpp for this CPU is being compiled; this engine runs on node-llama-cpp's prebuilt binary until it is restarted after the build",
    );
  const llama = await getLlama({
    gpu: false,
    // Never build or download anything at run time: the local build `llmgw engine build`
    // made for this CPU (native-binding.ts; the options name its folder, so a build for
    // another CPU is never found), else the prebuilt binary in node_modules.
    build: "never",
    skipDownload: true,
    usePrebuiltBinaries: true,
    cmakeOptions: compiling ? bindingCmakeOptions(`${cpuFingerprint()}-compiling`) : bindingCmakeOptions(),
    progressLogs: false,
    maxThreads: options.threads,
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
  try {
    const overrides = await poolingOverride(options.modelPath).catch(() => undefined);
    // The override's type is node-llama-cpp's nested GGUF metadata; the key is per architecture.
    const model = await llama.loadModel({ modelPath: options.modelPath, ...(overrides ? { metadataOverrides: overrides as never } : {}) });
    return { llama, model, llamaErrors };
  } catch (error) {
    await llama.dispose().catch(() => undefined);
    throw new ModelLoadError(`llama.cpp could not load it: ${loadFailureReason(llamaErrors, error)}`, { cause: error });
  }
}
