// The bundled llama.cpp engine's launch: how the agent runs a llamacpp profile on this
// machine as `llmgw engine ...` (engine-command.ts) under the engine supervisor. It turns
// a profile into the engine's command line (context pool, parallel sequences, threads,
// the profile's own engine args, the model's LoRA adapters), hands the engine its key through the environment (so
// it does not show in `ps`), and asks for readiness as "/health answers 200 and
// /v1/models with this key lists this model", not merely "something on the port says 200".
import { fileURLToPath } from "node:url";
import { DEFAULT_CONTEXT_PER_REQUEST, DEFAULT_CONTEXT_POOL, type Profile } from "../../catalog/model-schema.ts";
import type { EngineLaunch } from "../../agent/supervisor-options.ts";
import { openAiModelsValidator } from "../openai-models-validator.ts";

/**
 * libuv's thread pool size for the engine process (UV_THREADPOOL_SIZE). node-llama-cpp
 * runs each decode step on that pool, and with the default 4 threads each step starts
 * from whichever pool thread is free, a different one nearly every time. llama.cpp
 * (without a thread pool of its own attached, as node-llama-cpp's binding leaves it)
 * then runs a step at about half the speed of the same step started from the same
 * thread each time: 40–45 against 70–80 tokens/s on the engine benchmark's model, the
 * latter llama-bench's own figure (bench/engine/README.md, "Where the time went"). With
 * one pool thread every decode and sampling call starts from the same thread. Nothing
 * else in the engine needs the pool to be wider: it serves HTTP on the main thread and
 * reads no files while generating. A second context (embeddings, an adapter lane) takes
 * its turn on that thread: their contexts demand their threads from node-llama-cpp's
 * thread splitter (adapter-lanes.ts), so a turn runs at its full width instead of two
 * decodes sharing the cores.
 */
export const ENGINE_THREAD_POOL_SIZE = "1";

const LLMGW_BIN = fileURLToPath(new URL("../../../bin/llmgw.js", import.meta.url));

export interface LlamaCppLaunchOptions {
  /** The GGUF file to load (absolute). */
  weightsPath: string;
  /** The name the engine serves the model under; requests and /v1/models use it. */
  modelName: string;
  profile: Profile;
  /** The attempt's engine key, which the gateway sends as Bearer; never on the command line. */
  engineKey: string;
  host: string;
  port: number;
  /**
   * LoRA adapter files (absolute), in id order: a request's `lora: [{id, scale}]` names
   * them by position. Loaded at start, applied only to requests that name them.
   */
  adapters?: string[];
}

/** The context pool and parallel sequences a profile gives the engine: its own values, or the defaults (a 16k pool of 4k per request). */
export function llamaCppSlots(profile: Profile): { contextPool: number; parallel: number } {
  const contextPool = profile.ctx_size ?? DEFAULT_CONTEXT_POOL;
  const parallel = profile.parallel ?? Math.max(1, Math.floor(contextPool / DEFAULT_CONTEXT_PER_REQUEST));
  return { contextPool, parallel };
}

/** One attempt's launch of `llmgw engine` for a llamacpp profile. */
export function llamaCppLaunch(options: LlamaCppLaunchOptions): EngineLaunch {
  const { profile, host, port } = options;
  const { contextPool, parallel } = llamaCppSlots(profile);
  const threads = profile.threads ?? 0;
  return {
    // The engine runs on the same Node as the agent, from the same install.
    command: process.execPath,
    args: [
      LLMGW_BIN,
      "engine",
      "--model",
      options.weightsPath,
      "--host",
      host,
      "--port",
      String(port),
      "--ctx-size",
      String(contextPool),
      "--parallel",
      String(parallel),
      "--threads",
      String(threads),
      "--model-name",
      options.modelName,
      ...(profile.embeddings === true ? ["--embeddings"] : []),
      ...(options.adapters ?? []).flatMap((path) => ["--lora", path]),
      ...profile.engine_args,
    ],
    // The key travels in the environment so it does not show in `ps`; the pool size
    // must be there too, since Node sizes its thread pool before any of our code runs.
    env: {
      LLMGW_ENGINE_KEY: options.engineKey,
      LLMGW_LOG_LEVEL: process.env.LLMGW_LOG_LEVEL ?? "info",
      NODE_OPTIONS: "",
      UV_THREADPOOL_SIZE: ENGINE_THREAD_POOL_SIZE,
    },
    host,
    port,
    healthPath: "/health",
    validate: openAiModelsValidator({ key: options.engineKey, expectedModel: options.modelName }),
    settings: { contextPool, parallel, threads },
  };
}
