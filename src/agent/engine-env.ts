// The engine's sandboxed, offline environment. An engine never inherits the agent's
// environment: it gets PATH and the locale, HOME, TMPDIR and every cache root the engines
// we run know of (XDG, Hugging Face, vLLM, Triton, Torch, CUDA) pointed below its run's
// state folder, what its launch adds, and last the offline and no-telemetry flags, which
// no launch can turn off. A launch that points one of those roots outside the state
// folder is refused before anything is spawned (DESIGN.md "Engine supervision"): an
// engine writing into the agent's own ~/.cache would share, and could poison, state
// across replicas and runs.
import { isAbsolute, join, relative, resolve } from "node:path";
import { LlmgwError } from "../core/errors.ts";

/** The environment variables that may only point inside the state folder. */
const STATE_PATH_VARS = new Set([
  "HOME",
  "TMPDIR",
  "TMP",
  "TEMP",
  "XDG_CACHE_HOME",
  "XDG_CONFIG_HOME",
  "XDG_DATA_HOME",
  "XDG_STATE_HOME",
  "XDG_RUNTIME_DIR",
  "HF_HOME",
  "HF_HUB_CACHE",
  "HF_DATASETS_CACHE",
  "TRANSFORMERS_CACHE",
  "TORCH_HOME",
  "VLLM_CACHE_ROOT",
  "TRITON_CACHE_DIR",
  "TORCHINDUCTOR_CACHE_DIR",
  "CUDA_CACHE_PATH",
  "PYTHONPYCACHEPREFIX",
  "NUMBA_CACHE_DIR",
  "RAY_TMPDIR",
]);

/** Set last, so no launch can turn hub downloads or telemetry back on. */
const OFFLINE_ENV: Record<string, string> = {
  HF_HUB_OFFLINE: "1",
  TRANSFORMERS_OFFLINE: "1",
  HF_DATASETS_OFFLINE: "1",
  HF_HUB_DISABLE_TELEMETRY: "1",
  DO_NOT_TRACK: "1",
  VLLM_NO_USAGE_STATS: "1",
};

/** The only variables taken from the agent's own environment. */
const INHERITED_ENV = ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ"];

/** Builds the engine's environment from scratch; throws when the launch points a state path outside the state folder. */
export function buildEngineEnv(stateDir: string, launchEnv: Record<string, string>): Record<string, string> {
  const home = join(stateDir, "home");
  const tmp = join(stateDir, "tmp");
  const cache = join(stateDir, "cache");
  const env: Record<string, string> = {};
  for (const name of INHERITED_ENV) {
    const value = process.env[name];
    if (value !== undefined) env[name] = value;
  }
  env.PATH ??= "/usr/local/bin:/usr/bin:/bin";
  Object.assign(env, {
    HOME: home,
    TMPDIR: tmp,
    TMP: tmp,
    TEMP: tmp,
    XDG_CACHE_HOME: cache,
    XDG_CONFIG_HOME: join(home, ".config"),
    XDG_DATA_HOME: join(home, ".local", "share"),
    XDG_STATE_HOME: join(home, ".local", "state"),
    HF_HOME: join(cache, "huggingface"),
    VLLM_CACHE_ROOT: join(cache, "vllm"),
    TRITON_CACHE_DIR: join(cache, "triton"),
    TORCHINDUCTOR_CACHE_DIR: join(cache, "torchinductor"),
    CUDA_CACHE_PATH: join(cache, "nv"),
  });
  for (const [name, value] of Object.entries(launchEnv)) {
    if (STATE_PATH_VARS.has(name)) {
      const target = resolve(stateDir, value);
      const rel = relative(stateDir, target);
      if (rel.startsWith("..") || isAbsolute(rel)) {
        throw new LlmgwError({
          code: "cache_path_outside_state",
          status: 500,
          message: `${name}=${value} points outside the run's state folder ${stateDir}; engines may write only below it. Remove ${name} from the engine's settings.`,
        });
      }
    }
    env[name] = value;
  }
  return Object.assign(env, OFFLINE_ENV);
}
