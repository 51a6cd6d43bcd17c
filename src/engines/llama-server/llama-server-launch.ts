// The llama-server adapter: how the agent runs a llamacpp profile on a node's own
// llama.cpp install (`llama-server`) under the engine supervisor, one attempt at a time.
// It exists beside the bundled engine because the bundled one keeps only its CPU binary
// (CONVENTIONS.md), so GPU profiles need the node's llama-server. Facts it relies on are
// from reference/engines.md ("llama.cpp llama-server") unless a comment says otherwise:
//
// - The key goes in the environment as LLAMA_API_KEY (engines.md: `--api-key`,
//   `--api-key-file` and env `LLAMA_API_KEY` all exist). On the command line it would show
//   in `ps`; a key file would have to be written by the adapter, which only builds a launch.
// - `--alias` is the id llama-server reports in /v1/models and answers to (llama.cpp
//   tools/server/README.md: "Set an alias for the model. The alias will be returned in API
//   responses"), so the engine reports the catalog name, not the GGUF's path.
// - `--ctx-size` with an explicit `--parallel` is the total context split per slot
//   (engines.md: an explicit -np turns the unified KV cache off), which is what
//   llamaCppSlots means by a pool shared by its parallel requests, as the bundled engine.
// - `-ngl 999` offloads every layer (llama.cpp caps it at the model's layer count); a
//   number, unlike `all`, is accepted by every llama-server build. CPU profiles get 0.
// - Flash attention (not in engines.md; llama.cpp common/arg.cpp since September 2025):
//   `-fa on|off|auto`, default auto. Attempt 1 asks for it explicitly (`-fa on`), so the
//   attempt record says what ran, not what auto might have picked; a GPU or model on which
//   it fails at start gets attempt 2 and later with `-fa off` (DESIGN.md "Engine
//   supervision": the default first, then the fallbacks). A profile whose engine_args set
//   -fa themselves keeps that choice on every attempt. Builds older than the on|off form
//   took a bare `-fa` and refuse `-fa on`; the node's reported llama.cpp version is how an
//   operator finds out.
// - Embedding profiles run with `--embedding`, and with `--pooling mean` when the model does
//   not say how to pool (see modelDeclaresPooling below).
// - Readiness: /health answers 503 while loading and 200 when ready; then /v1/models must
//   list the alias, and the key must be enforced (engine-key-check.ts: /v1/models is one
//   of llama-server's public routes, /props is not).
import type { Profile } from "../../catalog/model-schema.ts";
import type { EngineLaunch } from "../../agent/supervisor-options.ts";
import { llamaCppSlots } from "../llamacpp/engine-launch.ts";
import { openAiModelsValidator } from "../openai-models-validator.ts";
import { allOf, engineKeyCheck } from "../engine-key-check.ts";
import { readGgufHeader } from "../../gguf/header.ts";
import { BadRequestError } from "../../core/errors.ts";

export interface LlamaServerLaunchOptions {
  /** The node's llama-server (a path, or a name on PATH). */
  executable: string;
  /** The GGUF file to load (absolute; for a split GGUF, its first part). */
  weightsPath: string;
  /** The catalog name the engine reports and answers to (--alias). */
  modelName: string;
  profile: Profile;
  /** The replica's engine key; the gateway sends it as Bearer. Never on the command line. */
  engineKey: string;
  host: string;
  port: number;
  /** 1-based attempt number (AttemptContext.attempt); later attempts use the fallbacks. */
  attempt: number;
  /** Layers offloaded to the GPU. Default: "all" for GPU profiles, 0 for CPU profiles. */
  gpuLayers?: number | "all";
  /** The vision projector (--mmproj), for models with image input. */
  projectorPath?: string;
  /** GPU indexes placement gave this replica (CUDA_VISIBLE_DEVICES); unset: every GPU the engine sees. */
  gpus?: number[];
  /**
   * Embedding profiles: the model's GGUF declares how its embeddings pool (`<arch>.pooling_type`
   * above 0). When it does not (a generative model), llama-server pools nothing and its
   * /v1/embeddings refuses ("Pooling type 'none' is not OAI compatible"), so the launch asks
   * for mean pooling, as the bundled engine does (llamacpp/llama-load.ts). Read by the caller
   * (modelDeclaresPooling), since reading a header is I/O. Default true: nothing is added.
   */
  modelDeclaresPooling?: boolean;
  /**
   * LoRA adapters, in the model's order. Each is loaded at scale 0 (`--lora-scaled PATH:0`),
   * so a request without a `lora` field is the base model; the gateway selects an adapter per
   * request with llama-server's own field, `"lora": [{"id": N, "scale": S}]` (id = position).
   * (`--lora-init-without-apply` does not keep them off for requests at this llama.cpp.)
   */
  adapterPaths?: string[];
}

/** Every layer: more than any model has; llama.cpp offloads what there is. */
const ALL_LAYERS = "999";
const FLASH_ATTENTION_FLAGS = new Set(["-fa", "--flash-attn"]);
const POOLING_FLAGS = new Set(["--pooling"]);

/** One attempt's launch of llama-server for a llamacpp profile. */
export function llamaServerLaunch(options: LlamaServerLaunchOptions): EngineLaunch {
  const { profile, host, port } = options;
  const { contextPool, parallel } = llamaCppSlots(profile);
  const gpuLayersOption = options.gpuLayers ?? (profile.hardware.gpu === undefined ? 0 : "all");
  const gpuLayers = gpuLayersOption === "all" ? ALL_LAYERS : String(gpuLayersOption);
  const profileFlashAttention = flagValue(profile.engine_args, FLASH_ATTENTION_FLAGS);
  // null: the profile decides; otherwise on for the first attempt, off for the fallbacks.
  const flashAttention = profileFlashAttention === undefined ? options.attempt <= 1 : null;
  const args = [
    "-m",
    options.weightsPath,
    "--host",
    host,
    "--port",
    String(port),
    "--alias",
    options.modelName,
    "--ctx-size",
    String(contextPool),
    "--parallel",
    String(parallel),
    "-ngl",
    gpuLayers,
  ];
  if (options.projectorPath !== undefined) args.push("--mmproj", options.projectorPath);
  for (const adapter of options.adapterPaths ?? []) {
    // llama-server splits --lora-scaled at ',' and ':': the catalog refuses such paths, and a node's must not have them either.
    if (/[,:]/.test(adapter))
      throw new BadRequestError(`The adapter file ${adapter} has a ',' or ':' in its path, which llama-server's --lora-scaled cannot take; rename it.`, {
        code: "adapter_invalid",
      });
    args.push("--lora-scaled", `${adapter}:0`);
  }
  // llama-server's embedding-only mode, like the bundled engine's --embeddings.
  if (profile.embeddings === true) {
    args.push("--embedding");
    if (options.modelDeclaresPooling === false && flagValue(profile.engine_args, POOLING_FLAGS) === undefined) args.push("--pooling", "mean");
  }
  if (flashAttention !== null) args.push("-fa", flashAttention ? "on" : "off");
  // Last, so an operator's own flags win over ours (llama.cpp keeps the last value of a flag).
  args.push(...profile.engine_args);

  const env: Record<string, string> = { LLAMA_API_KEY: options.engineKey };
  if (options.gpus !== undefined) env.CUDA_VISIBLE_DEVICES = options.gpus.join(",");
  return {
    command: options.executable,
    args,
    env,
    host,
    port,
    healthPath: "/health",
    validate: allOf(
      openAiModelsValidator({ key: options.engineKey, expectedModel: options.modelName }),
      engineKeyCheck({ key: options.engineKey, path: "/props" }),
    ),
    settings: {
      engine: "llama-server",
      flashAttention: flashAttention ?? `engine_args: ${profileFlashAttention}`,
      gpuLayers,
      contextPool,
      parallel,
      ...(options.gpus === undefined ? {} : { gpus: options.gpus }),
    },
  };
}

/** The value of the last `flag VALUE` or `flag=VALUE` among `args` for any of `names`, or undefined. */
function flagValue(args: readonly string[], names: ReadonlySet<string>): string | undefined {
  let value: string | undefined;
  for (let i = 0; i < args.length; i += 1) {
    const arg = args[i] as string;
    const equals = arg.indexOf("=");
    if (equals !== -1 && names.has(arg.slice(0, equals))) value = arg.slice(equals + 1);
    else if (names.has(arg)) value = args[i + 1] ?? "";
  }
  return value;
}

/** Whether a GGUF says how its embeddings pool (`<arch>.pooling_type` above 0), for LlamaServerLaunchOptions.modelDeclaresPooling. */
export async function modelDeclaresPooling(weightsPath: string): Promise<boolean> {
  const header = await readGgufHeader({ file: weightsPath });
  return header.poolingType !== undefined && header.poolingType > 0;
}
