// The vLLM adapter: how the agent runs a vllm profile (`vllm serve DIR`) under the engine
// supervisor, one attempt at a time. Facts it relies on are from reference/engines.md
// ("vLLM") unless a comment says otherwise:
//
// - The key goes in the environment as VLLM_API_KEY (engines.md: `--api-key` /
//   `VLLM_API_KEY`), never on the command line, where `ps` would show it. It guards only
//   /v1, /v2 and /inference, so the engine binds to the node address the supervisor gives.
// - `--served-model-name` is the id /v1/models lists, so the engine reports the catalog
//   name. `--tensor-parallel-size` is GPUs per node and `--pipeline-parallel-size` nodes;
//   more than one node runs through Ray (`--distributed-executor-backend ray`) with the
//   cluster of ray-launch.ts, which vLLM joins at RAY_ADDRESS: the head's own discovery
//   file lives in the head's state folder, not this run's. `--max-model-len` only when
//   given: vLLM takes it from the model's config otherwise.
// - The offline flags (HF_HUB_OFFLINE, TRANSFORMERS_OFFLINE, VLLM_NO_USAGE_STATS,
//   DO_NOT_TRACK) and every cache root (VLLM_CACHE_ROOT, TRITON_CACHE_DIR,
//   TORCHINDUCTOR_CACHE_DIR, HF_HOME, CUDA_CACHE_PATH, XDG_CACHE_HOME, TMPDIR) are set by the
//   supervisor for every engine (src/agent/engine-env.ts), after the launch's own and
//   beyond its reach; this adapter does not repeat them.
// - TMPDIR must be short enough for Unix socket paths (107 bytes): vLLM's processes talk
//   over ZeroMQ `ipc://$TMPDIR/<uuid4>` sockets (vllm/utils: get_open_zmq_ipc_path, base
//   VLLM_RPC_BASE_PATH = the temp dir; not in engines.md), so a state folder too deep for
//   that is refused here with the numbers instead of failing inside vLLM.
// - Fallback (not in engines.md; vLLM's attention backend docs and its deprecation notes):
//   attempt 1 leaves the attention backend to vLLM (FlashAttention on most NVIDIA GPUs);
//   attempts 2 and later pass `--attention-backend TRITON_ATTN`, the Triton kernels that run
//   wherever vLLM runs on a GPU. The VLLM_ATTENTION_BACKEND variable was deprecated in vLLM
//   0.14 and is ignored by later releases, so the flag is used; XFORMERS, once the usual
//   fallback, was removed with the V0 engine. A profile whose engine_args choose the
//   backend keeps that choice on every attempt.
// - Readiness: connection refused while loading, then /health 200; then /v1/models with
//   the key must list the served name, and without the key must answer 401.
import { join } from "node:path";
import type { Profile } from "../../catalog/model-schema.ts";
import type { EngineLaunch } from "../../agent/supervisor-options.ts";
import { vllmMaxLoraRank } from "../../catalog/peft-folder.ts";
import { BadRequestError, LlmgwError } from "../../core/errors.ts";
import { allOf, engineKeyCheck } from "../engine-key-check.ts";
import { openAiModelsValidator } from "../openai-models-validator.ts";

export interface VllmLaunchOptions {
  /** The node's `vllm` (a path, or a name on PATH). */
  executable: string;
  /** The model's folder (config.json, safetensors, tokenizer), absolute. */
  modelDir: string;
  /** The catalog name the engine reports and answers to (--served-model-name). */
  modelName: string;
  profile: Profile;
  /** The replica's engine key; the gateway sends it as Bearer. Never on the command line. */
  engineKey: string;
  host: string;
  port: number;
  /** 1-based attempt number (AttemptContext.attempt); later attempts use the fallback backend. */
  attempt: number;
  /** The run's state folder (AttemptContext.stateDir); the supervisor points TMPDIR below it. */
  stateDir: string;
  /** GPUs per node. */
  tensorParallel: number;
  /** Nodes; above 1 the replica runs through the Ray cluster at rayAddress. */
  pipelineParallel: number;
  /** Context length (prompt + output); unset: the model's own. */
  maxModelLen?: number;
  /** The Ray head's GCS address (HOST:6379); needed when pipelineParallel > 1. */
  rayAddress?: string;
  /** GPU indexes placement gave this replica on this node (CUDA_VISIBLE_DEVICES). */
  gpus?: number[];
  /** The backend of attempts 2 and later. Default "TRITON_ATTN". */
  fallbackAttentionBackend?: string;
  /**
   * LoRA adapters (PEFT folders on this node): served under their own names with
   * `--enable-lora --lora-modules NAME=PATH ...`, so a request's `model` selects one, with
   * the limits vLLM needs for them (loraLimits).
   */
  adapters?: { servedName: string; path: string; rank?: number }[];
}

export const DEFAULT_FALLBACK_ATTENTION_BACKEND = "TRITON_ATTN";

/** sun_path holds 108 bytes with its terminating NUL. */
export const UNIX_SOCKET_PATH_MAX = 107;
/** `/<uuid4>` after vLLM's ZeroMQ socket folder. */
const VLLM_SOCKET_NAME_BYTES = 37;

/** Adapters one batch may mix by default: each slot holds GPU memory for an adapter of the largest rank. */
export const VLLM_MAX_LORAS_IN_BATCH = 4;

/**
 * vLLM's LoRA limits for these adapters (its defaults: rank 16, one adapter per batch, and
 * CPU copies only for that one):
 * - --max-lora-rank: the smallest rank vLLM accepts that holds every adapter's; it refuses
 *   to load an adapter above it, and GPU memory is reserved for it, so not the largest.
 * - --max-loras: requests for up to this many adapters share a batch; with the default 1,
 *   requests for two adapters wait for each other.
 * - --max-cpu-loras: every adapter stays in CPU memory, so none is read from disk again
 *   when it comes back into a batch.
 * A profile's engine_args come after these, so an operator's own values win.
 */
export function loraLimits(adapters: readonly { rank?: number }[], engineArgs: readonly string[] = []): string[] {
  const given = (flag: string) => engineArgs.some((arg) => arg === flag || arg.startsWith(`${flag}=`));
  const ranks = adapters.flatMap((adapter) => (adapter.rank === undefined ? [] : [adapter.rank]));
  const maxLoras = Math.min(adapters.length, VLLM_MAX_LORAS_IN_BATCH);
  const args: string[] = [];
  if (!given("--max-lora-rank")) args.push("--max-lora-rank", String(vllmMaxLoraRank(ranks)));
  // An operator's --max-loras may be above ours, and vLLM refuses --max-cpu-loras below it:
  // with theirs, vLLM's own default for the CPU copies (theirs) applies.
  if (!given("--max-loras")) {
    args.push("--max-loras", String(maxLoras));
    if (!given("--max-cpu-loras")) args.push("--max-cpu-loras", String(Math.max(adapters.length, maxLoras)));
  }
  return args;
}

/**
 * The GPU memory vLLM reserves for adapters: --max-loras slots, each as large as the largest
 * adapter would be at --max-lora-rank (an adapter's weights grow with its rank). vLLM takes it
 * from the KV cache's share, and fails to start when too little is left, so placement counts
 * it. An adapter's weights are its adapter_model.* files (or all its bytes when not listed).
 */
export function vllmLoraReserveBytes(adapters: readonly { rank?: number; bytes: number | null; files?: { file: string; bytes: number }[] }[]): number {
  if (adapters.length === 0) return 0;
  const maxRank = vllmMaxLoraRank(adapters.flatMap((adapter) => (adapter.rank === undefined ? [] : [adapter.rank])));
  let largestSlot = 0;
  for (const adapter of adapters) {
    const weights =
      adapter.files === undefined
        ? (adapter.bytes ?? 0)
        : adapter.files.filter((f) => f.file.startsWith("adapter_model.")).reduce((sum, f) => sum + f.bytes, 0);
    largestSlot = Math.max(largestSlot, Math.ceil((weights * maxRank) / (adapter.rank ?? maxRank)));
  }
  return Math.min(adapters.length, VLLM_MAX_LORAS_IN_BATCH) * largestSlot;
}

/** One attempt's launch of `vllm serve` for a vllm profile. */
export function vllmLaunch(options: VllmLaunchOptions): EngineLaunch {
  const { host, port } = options;
  for (const [name, value] of [
    ["tensorParallel", options.tensorParallel],
    ["pipelineParallel", options.pipelineParallel],
  ] as const) {
    if (!Number.isInteger(value) || value < 1) throw new BadRequestError(`vLLM ${name} must be a whole number of at least 1, got ${value}.`, { param: name });
  }
  const multiNode = options.pipelineParallel > 1;
  if (multiNode && options.rayAddress === undefined) {
    throw new BadRequestError(
      `A vLLM replica over ${options.pipelineParallel} nodes runs through a Ray cluster, but no Ray head address was given; start the head (rayHeadLaunch) and pass its HOST:6379.`,
      { param: "rayAddress" },
    );
  }
  // The supervisor's TMPDIR (engine-env.ts); vLLM's sockets go directly below it.
  const tmp = join(options.stateDir, "tmp");
  const socketBytes = Buffer.byteLength(tmp) + VLLM_SOCKET_NAME_BYTES;
  if (socketBytes > UNIX_SOCKET_PATH_MAX) {
    throw new LlmgwError({
      code: "state_path_too_long",
      status: 500,
      message:
        `vLLM's Unix sockets below ${tmp} would need ${socketBytes} bytes, more than the ${UNIX_SOCKET_PATH_MAX} a socket path may have; ` +
        `give the agent a data dir at least ${socketBytes - UNIX_SOCKET_PATH_MAX} bytes shorter.`,
    });
  }

  // A profile that picks the backend itself keeps its choice on every attempt (vLLM refuses
  // --attention-backend beside --attention-config / -ac, and takes the last of repeated flags).
  const profileBackend = options.profile.engine_args.find((arg) => /^(--attention-backend|--attention-config|-ac)([.=]|$)/.test(arg));
  const fallback = options.attempt > 1 && profileBackend === undefined;
  const attentionBackend = fallback ? (options.fallbackAttentionBackend ?? DEFAULT_FALLBACK_ATTENTION_BACKEND) : null;
  const args = [
    "serve",
    options.modelDir,
    "--host",
    host,
    "--port",
    String(port),
    "--served-model-name",
    options.modelName,
    "--tensor-parallel-size",
    String(options.tensorParallel),
    "--pipeline-parallel-size",
    String(options.pipelineParallel),
  ];
  if (options.maxModelLen !== undefined) args.push("--max-model-len", String(options.maxModelLen));
  if (multiNode) args.push("--distributed-executor-backend", "ray");
  if (attentionBackend !== null) args.push("--attention-backend", attentionBackend);
  if (options.adapters !== undefined && options.adapters.length > 0) {
    args.push("--enable-lora", "--lora-modules", ...options.adapters.map((adapter) => `${adapter.servedName}=${adapter.path}`));
    args.push(...loraLimits(options.adapters, options.profile.engine_args));
  }
  // Last, so an operator's own flags win over ours.
  args.push(...options.profile.engine_args);

  const env: Record<string, string> = { VLLM_API_KEY: options.engineKey };
  if (multiNode && options.rayAddress !== undefined) env.RAY_ADDRESS = options.rayAddress;
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
      engineKeyCheck({ key: options.engineKey, path: "/v1/models" }),
    ),
    settings: {
      engine: "vllm",
      attentionBackend: profileBackend === undefined ? (attentionBackend ?? "default") : "engine_args",
      tensorParallel: options.tensorParallel,
      pipelineParallel: options.pipelineParallel,
      maxModelLen: options.maxModelLen ?? null,
      ...(multiNode ? { rayAddress: options.rayAddress } : {}),
      ...(options.gpus === undefined ? {} : { gpus: options.gpus }),
    },
  };
}
