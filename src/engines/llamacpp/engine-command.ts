// `llmgw engine`: the process the agent starts per replica of a GGUF model. It checks its
// arguments and the model file, listens at once (so /health answers 503 while loading,
// as llama-server does), loads the model, and serves until SIGTERM, SIGINT or SIGHUP, or
// until the agent that started it is gone. Failures the supervisor must record (bad
// arguments, a missing or invalid model, a busy port) are one plain line on stderr and a
// non-zero exit code, never a hang. LoRA adapters (--lora, repeatable; id = position) are
// checked and loaded at start like the model, and applied only to requests that name
// them (adapter-lanes.ts).
//
// Why the parent watch: the agent starts engines detached, in their own process group,
// so stopping one stops everything it forked. That also means nothing tells an engine
// when the agent is SIGKILLed or OOM-killed (the agent's exit hook never runs, and there
// is no terminal to hang up), and an orphaned engine would hold its port and memory
// forever. So the engine checks its parent pid every second and shuts down, like on
// SIGTERM, once it has changed (the orphan was handed to PID 1 or a subreaper).
// LLMGW_ENGINE_WATCH_PARENT=0 turns this off for an engine started by hand under a
// parent that exits on purpose (nohup, a shell script).
import { open, type FileHandle } from "node:fs/promises";
import { basename, resolve } from "node:path";
import { createLogger, type Logger } from "../../core/log.ts";
import { describeError } from "../../core/errors.ts";
import { createEngineServer } from "./engine-server.ts";
import { DEFAULT_ADAPTER_CONTEXTS } from "./adapter-lanes.ts";
import { ENGINE_THREAD_POOL_SIZE } from "./engine-launch.ts";
import type { TextGenerator } from "./llama-runner.ts";

/** The options commander hands over (`--ctx-size` arrives as `ctxSize`, and so on). */
export interface EngineCommandOptions {
  model?: string;
  port?: string;
  host?: string;
  key?: string;
  ctxSize?: string;
  parallel?: string;
  threads?: string;
  modelName?: string;
  /** Serve only /v1/embeddings, with no generation context (a dedicated embedding model). */
  embeddings?: boolean;
  /** LoRA adapter GGUF files, in id order (`--lora` once per adapter). */
  lora?: string[] | string;
  /** Most contexts kept for adapter combinations at once. */
  loraContexts?: string;
}

export interface EngineSettings {
  modelPath: string;
  modelName: string;
  host: string;
  port: number;
  key: string;
  contextSize: number;
  parallel: number;
  threads: number;
  embeddingsOnly: boolean;
  /** Absolute paths of the LoRA adapters, in id order. */
  adapterPaths: string[];
  maxAdapterContexts: number;
}

/** How often the engine checks that the agent that started it is still its parent. */
const PARENT_CHECK_MS = 1_000;

/** Exit codes the supervisor can tell apart. */
export const ENGINE_EXIT = { ok: 0, modelError: 1, usage: 2, listenError: 3 } as const;

class EngineStartError extends Error {
  constructor(
    message: string,
    readonly exitCode: number,
  ) {
    super(message);
    this.name = "EngineStartError";
  }
}

function integer(value: string | undefined, flag: string, min: number, max: number, fallback: number): number {
  if (value === undefined || value === "") return fallback;
  const parsed = Number(value);
  if (!Number.isInteger(parsed) || parsed < min || parsed > max) {
    throw new EngineStartError(`${flag} must be an integer from ${min} to ${max}, got '${value}'`, ENGINE_EXIT.usage);
  }
  return parsed;
}

/** Validates the command's options; the key falls back to LLMGW_ENGINE_KEY (kept out of `ps`). */
export function parseEngineOptions(options: EngineCommandOptions, env: NodeJS.ProcessEnv = process.env): EngineSettings {
  if (!options.model) throw new EngineStartError("--model is required", ENGINE_EXIT.usage);
  if (!options.port) throw new EngineStartError("--port is required", ENGINE_EXIT.usage);
  const key = options.key ?? env.LLMGW_ENGINE_KEY ?? "";
  if (key === "") throw new EngineStartError("no engine key: pass --key or set LLMGW_ENGINE_KEY", ENGINE_EXIT.usage);
  const modelPath = resolve(options.model);
  const adapterPaths = (options.lora === undefined ? [] : typeof options.lora === "string" ? [options.lora] : options.lora).map((path) => resolve(path));
  const embeddingsOnly = options.embeddings === true;
  if (embeddingsOnly && adapterPaths.length > 0) {
    throw new EngineStartError(
      "--lora cannot be combined with --embeddings: LoRA adapters apply to generation, and an embeddings-only engine has no generation context",
      ENGINE_EXIT.usage,
    );
  }
  return {
    modelPath,
    modelName: options.modelName && options.modelName !== "" ? options.modelName : basename(modelPath),
    host: options.host && options.host !== "" ? options.host : "127.0.0.1",
    port: integer(options.port, "--port", 1, 65535, 0),
    key,
    contextSize: integer(options.ctxSize, "--ctx-size", 0, 16_777_216, 4096),
    parallel: integer(options.parallel, "--parallel", 1, 256, 2),
    threads: integer(options.threads, "--threads", 0, 1024, 0),
    embeddingsOnly,
    adapterPaths,
    maxAdapterContexts: integer(options.loraContexts, "--lora-contexts", 1, 64, DEFAULT_ADAPTER_CONTEXTS),
  };
}

/**
 * Cheap checks before anything is loaded, so the common failures get a precise reason:
 * the file exists, is a regular readable file and starts with the GGUF magic.
 */
export async function checkModelFile(path: string): Promise<void> {
  let handle: FileHandle;
  try {
    handle = await open(path, "r");
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    const reason = code === "ENOENT" ? "no such file" : code === "EACCES" ? "permission denied" : describeError(error);
    throw new EngineStartError(reason, ENGINE_EXIT.modelError);
  }
  try {
    const stat = await handle.stat();
    if (!stat.isFile()) throw new EngineStartError("not a regular file", ENGINE_EXIT.modelError);
    const magic = Buffer.alloc(4);
    const { bytesRead } = await handle.read(magic, 0, 4, 0);
    if (bytesRead < 4 || magic.toString("latin1") !== "GGUF") {
      throw new EngineStartError(
        `not a GGUF file (it starts with ${JSON.stringify(magic.subarray(0, bytesRead).toString("latin1"))}, not "GGUF")`,
        ENGINE_EXIT.modelError,
      );
    }
  } catch (error) {
    if (error instanceof EngineStartError) throw error;
    throw new EngineStartError(describeError(error), ENGINE_EXIT.modelError);
  } finally {
    await handle.close();
  }
}

/** A --lora file that is missing or no GGUF file, reported like a model file but naming the adapter. */
class AdapterFileError extends EngineStartError {
  constructor(
    readonly path: string,
    reason: string,
  ) {
    super(reason, ENGINE_EXIT.modelError);
    this.name = "AdapterFileError";
  }
}

function fail(line: string, exitCode: number): never {
  process.stderr.write(`llmgw engine: ${line}\n`);
  process.exit(exitCode);
}

export async function runEngineCommand(options: EngineCommandOptions): Promise<void> {
  // Recorded first: if the agent dies while the engine starts, the watch below still sees the change.
  const parentPid = process.ppid;
  let settings: EngineSettings;
  try {
    settings = parseEngineOptions(options);
    await checkModelFile(settings.modelPath);
    for (const path of settings.adapterPaths) {
      await checkModelFile(path).catch((error: unknown) => {
        throw error instanceof EngineStartError ? new AdapterFileError(path, error.message) : error;
      });
    }
  } catch (error) {
    if (error instanceof AdapterFileError) fail(`cannot load LoRA adapter '${error.path}': ${error.message}`, error.exitCode);
    if (error instanceof EngineStartError && error.exitCode === ENGINE_EXIT.modelError) {
      fail(`cannot serve model file '${options.model ? resolve(options.model) : ""}': ${error.message}`, error.exitCode);
    }
    fail(describeError(error), error instanceof EngineStartError ? error.exitCode : ENGINE_EXIT.usage);
  }
  const logger: Logger = createLogger({ name: "llmgw-engine" });
  if (process.env.UV_THREADPOOL_SIZE !== ENGINE_THREAD_POOL_SIZE) {
    // Node sized its pool before this code ran; the launcher sets it, a hand-run engine may not.
    logger.warn(
      { UV_THREADPOOL_SIZE: process.env.UV_THREADPOOL_SIZE ?? null },
      `decoding runs at about half speed on the CPU unless the engine is started with UV_THREADPOOL_SIZE=${ENGINE_THREAD_POOL_SIZE} in its environment (llmgw's own launcher sets it)`,
    );
  }
  const engine = createEngineServer({ key: settings.key, modelName: settings.modelName, logger });
  try {
    const address = await engine.listen(settings.host, settings.port);
    logger.info({ host: address.address, port: address.port, model: settings.modelPath }, "engine listening; loading model");
  } catch (error) {
    fail(`cannot listen on ${settings.host}:${settings.port}: ${describeError(error)}`, ENGINE_EXIT.listenError);
  }

  let runner: TextGenerator | null = null;
  let stopping = false;
  let parentWatch: NodeJS.Timeout | undefined;
  const stop = (reason: string) => {
    if (stopping) return;
    stopping = true;
    clearInterval(parentWatch);
    logger.info({ reason }, "engine stopping");
    // Whatever happens below, the process is gone within a few seconds.
    setTimeout(() => process.exit(ENGINE_EXIT.ok), 5000).unref();
    void (async () => {
      await engine.shutdown(2000);
      // While loading there is nothing to wait for: the load cannot be interrupted, and
      // the process exit releases the memory.
      await runner?.dispose().catch((error: unknown) => logger.warn({ err: error }, "dispose failed"));
      process.exit(ENGINE_EXIT.ok);
    })();
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  // The default action of SIGHUP would end the process without aborting running
  // generations or answering their clients.
  process.on("SIGHUP", stop);
  if (process.env.LLMGW_ENGINE_WATCH_PARENT !== "0") {
    parentWatch = setInterval(() => {
      if (process.ppid === parentPid) return;
      logger.warn({ parentPid, ppid: process.ppid }, "the agent that started this engine is gone; stopping the engine");
      stop("parent-exited");
    }, PARENT_CHECK_MS);
    // The server keeps the process alive; the watch alone must not.
    parentWatch.unref();
  }

  // Imported only below: node-llama-cpp takes a while to import, and the failures above
  // should be reported without waiting for it.
  let runnerModule: typeof import("./llama-runner.ts") | undefined;
  try {
    const load = { modelPath: settings.modelPath, contextSize: settings.contextSize, threads: settings.threads, logger };
    if (settings.embeddingsOnly) {
      const { LlamaEmbeddingEngine } = await import("./embedding-engine.ts");
      runner = await LlamaEmbeddingEngine.load({ ...load, modelName: settings.modelName });
    } else {
      runnerModule = await import("./llama-runner.ts");
      runner = await runnerModule.LlamaRunner.load({
        ...load,
        parallel: settings.parallel,
        adapterPaths: settings.adapterPaths,
        maxAdapterContexts: settings.maxAdapterContexts,
      });
    }
  } catch (error) {
    if (stopping) return;
    if (runnerModule && error instanceof runnerModule.AdapterLoadError) {
      fail(`cannot load LoRA adapter '${error.path}': ${describeError(error)}`, ENGINE_EXIT.modelError);
    }
    fail(`cannot serve model file '${settings.modelPath}': ${describeError(error)}`, ENGINE_EXIT.modelError);
  }
  if (stopping) {
    await runner.dispose().catch(() => undefined);
    return;
  }
  engine.setGenerator(runner);
  logger.info({ model: settings.modelName, contextPerRequest: runner.contextPerRequest }, "engine ready");
}
