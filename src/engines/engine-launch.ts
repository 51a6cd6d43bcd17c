// Which engine runs a replica on this node, and its launch for one attempt: the one entry
// the agent's supervisor `prepare` calls (DESIGN.md "Engines"). A llamacpp profile runs on
// the bundled engine unless the node configures its own llama-server, which then takes
// every llamacpp profile; GPU llamacpp profiles need llama-server, since the bundled
// engine keeps only its CPU binary (CONVENTIONS.md), and so do profiles with engine_args,
// which are llama-server's options (engine-args-check.ts): the bundled engine takes only
// those llmgw sets. Placement sends neither to a node without llama-server
// (fleet/placement.ts); refusing here too says what to do, where the bundled engine would
// only fail on an option it does not know. A vllm profile runs `vllm serve` with its GPUs
// per node and nodes from the profile's hardware. External profiles run nothing, so
// asking for their launch is a bug in the caller.
import type { Profile } from "../catalog/model-schema.ts";
import type { AttemptContext, EngineLaunch } from "../agent/supervisor-options.ts";
import { BadRequestError, LlmgwError } from "../core/errors.ts";
import type { EngineName } from "../fleet/fleet-types.ts";
import { llamaCppLaunch } from "./llamacpp/engine-launch.ts";
import { llamaServerLaunch } from "./llama-server/llama-server-launch.ts";
import { vllmLaunch } from "./vllm/vllm-launch.ts";

/** The engines a node has configured beyond the bundled one. */
export interface NodeEngines {
  /** The node's llama-server (path or name on PATH); when set it runs every llamacpp profile. */
  llamaServer?: string;
  /** The node's vllm (path or name on PATH). */
  vllm?: string;
}

export interface ReplicaLaunchOptions {
  profile: Profile;
  /** The catalog name the engine reports and answers to. */
  modelName: string;
  /** llamacpp: the GGUF file (its first part when split); vllm: the model's folder. Absolute. */
  weightsPath: string;
  /** llama-server only: the vision projector. The bundled engine has no image input. */
  projectorPath?: string;
  /** The replica's engine key. */
  engineKey: string;
  /** The supervisor's attempt: number, host, the free port, the run's state folder. */
  attempt: Pick<AttemptContext, "attempt" | "host" | "port" | "stateDir">;
  engines: NodeEngines;
  /** GPU indexes placement gave the replica on this node. */
  gpus?: number[];
  /** vllm: context length (--max-model-len); unset: the model's own. */
  maxModelLen?: number;
  /** vllm over several nodes: the Ray head's HOST:6379. */
  rayAddress?: string;
  /** llama-server embedding profiles: whether the GGUF says how to pool (LlamaServerLaunchOptions). */
  modelDeclaresPooling?: boolean;
  /** LoRA adapters in the model's order (a request selects one by its position), with their paths on this node. */
  adapters?: LaunchAdapter[];
}

export interface LaunchAdapter {
  servedName: string;
  path: string;
  /** A vLLM adapter's LoRA rank, when the server read it. */
  rank?: number;
}

/** The engine that runs `profile` on a node with `engines`; throws when the node cannot run it. */
export function engineFor(profile: Profile, engines: NodeEngines, model: { projector?: boolean } = {}): EngineName {
  if (profile.engine === "llamacpp") {
    if (engines.llamaServer !== undefined) return "llama-server";
    if (model.projector === true) {
      throw new LlmgwError({
        code: "engine_unavailable",
        status: 409,
        message: `Profile '${profile.name}' serves a model with a vision projector, which only llama-server loads (--mmproj), and this node has none configured; configure the node's llama-server (llmgw agent --llama-server) or place the model elsewhere.`,
      });
    }

    if (profile.hardware.gpu !== undefined) {
      throw new LlmgwError({
        code: "engine_unavailable",
        status: 409,
        message: `Profile '${profile.name}' runs llama.cpp on ${profile.hardware.gpu.class} GPUs, which needs llama-server, and this node has none configured; configure the node's llama-server or place the profile elsewhere.`,
      });
    }
    if (profile.engine_args.length > 0) {
      throw new LlmgwError({
        code: "engine_unavailable",
        status: 409,
        message: `Profile '${profile.name}' passes engine_args, which are llama-server options, and this node has no llama-server configured (the bundled engine takes none); configure the node's llama-server (llmgw agent --llama-server) or place the profile elsewhere.`,
      });
    }
    return "llamacpp";
  }
  if (profile.engine === "vllm") {
    if (engines.vllm === undefined) {
      throw new LlmgwError({
        code: "engine_unavailable",
        status: 409,
        message: `Profile '${profile.name}' runs on vLLM, and this node has no vllm; install it on the node or place the profile elsewhere.`,
      });
    }
    return "vllm";
  }
  throw new BadRequestError(`Profile '${profile.name}' is external: it routes to an existing server and has no engine to launch.`, { param: "engine" });
}

/** One attempt's launch of the engine that runs `options.profile` on this node. */
export function engineLaunch(options: ReplicaLaunchOptions): EngineLaunch {
  const { profile, attempt, engines } = options;
  const common = { modelName: options.modelName, profile, engineKey: options.engineKey, host: attempt.host, port: attempt.port };
  switch (engineFor(profile, engines, { projector: options.projectorPath !== undefined })) {
    case "llamacpp":
      return llamaCppLaunch({
        ...common,
        weightsPath: options.weightsPath,
        ...(options.adapters === undefined ? {} : { adapters: options.adapters.map((adapter) => adapter.path) }),
      });
    case "llama-server":
      return llamaServerLaunch({
        ...common,
        executable: engines.llamaServer as string,
        weightsPath: options.weightsPath,
        attempt: attempt.attempt,
        ...(options.projectorPath === undefined ? {} : { projectorPath: options.projectorPath }),
        ...(options.gpus === undefined ? {} : { gpus: options.gpus }),
        ...(options.modelDeclaresPooling === undefined ? {} : { modelDeclaresPooling: options.modelDeclaresPooling }),
        ...(options.adapters === undefined ? {} : { adapterPaths: options.adapters.map((adapter) => adapter.path) }),
      });
    case "vllm": {
      const gpu = profile.hardware.gpu;
      if (gpu === undefined) {
        throw new BadRequestError(`Profile '${profile.name}' runs on vLLM but names no GPU hardware; vLLM runs on GPU nodes (hardware.gpu).`, {
          param: "hardware",
        });
      }
      return vllmLaunch({
        ...common,
        executable: engines.vllm as string,
        modelDir: options.weightsPath,
        attempt: attempt.attempt,
        stateDir: attempt.stateDir,
        tensorParallel: gpu.gpus_per_node,
        pipelineParallel: gpu.nodes,
        ...(options.maxModelLen === undefined ? {} : { maxModelLen: options.maxModelLen }),
        ...(options.rayAddress === undefined ? {} : { rayAddress: options.rayAddress }),
        ...(options.gpus === undefined ? {} : { gpus: options.gpus }),
        ...(options.adapters === undefined ? {} : { adapters: options.adapters }),
      });
    }
  }
}
