// Which GGUF architectures a node's llama.cpp can load. A GGUF file names its model
// architecture in `general.architecture`; llama.cpp looks that name up in its
// LLM_ARCH_NAMES table and refuses names it does not know ("unknown model architecture").
// The answer therefore depends on the llama.cpp build, so the lists here are keyed by
// build and an engine version this table does not know is reported as unknown rather
// than guessed from a neighbouring build.
//
// How the list for the bundled build was derived (nothing reads the binary at run time):
// - node-llama-cpp 3.21.1 records the llama.cpp it bundles in
//   node_modules/node-llama-cpp/llama/llama.cpp.info.json ({"tag": "v0.4.0",
//   "llamaCppGithubRepo": "ggml-org/llama.cpp"}) and binariesGithubRelease.json
//   ({"release": "v0.4.0"}); the prebuilt @node-llama-cpp/linux-x64 3.21.1 says the same in
//   bins/linux-x64/_nlcBuildMetadata.json. Reading LLAMA_BUILD_NUMBER and LLAMA_COMMIT
//   from its libllama-common.so (dlsym) gives build 1 and commit 5b4ebc5; the build number
//   is 1 because the source node-llama-cpp ships is one squashed commit, so it is not
//   used as a key.
// - `strings -n 2 libllama.v0.4.0.so` shows the LLM_ARCH_NAMES string literals as one
//   run from "clip" to "(unknown)" in .rodata; 5 names (bert, glm4, qwen, qwen2, rwkv7)
//   are not in that run because the linker stores them as the tails of longer strings
//   (for example "qwen2" inside "rwkv6qwen2"). The full table was then read from
//   src/llama-arch.cpp of the same source (node_modules/node-llama-cpp/llama/
//   gitRelease.bundle, HEAD 80fb11ac) and every name was checked to be in the binary.
//   llama-support.test.ts repeats that check against the installed binary, so a
//   node-llama-cpp upgrade without a new list fails the tests.
// - Two names in the table cannot be loaded as a model by this build: "clip" (a dummy
//   for llama-quantize; llama.cpp says "CLIP cannot be used as main model, use it with
//   --mmproj instead") and "gptj" (named, but llama_model_mapping in src/llama-model.cpp
//   has no case for it, so loading fails with "unsupported model architecture"; the
//   binary has no llama_model_gptj class either). "(unknown)" is the sentinel.
// Knowing the name is necessary, not sufficient: a file can still fail on a tensor type
// or a key this build lacks; the serve job's smoke test catches those.

export interface LlamaCppBuild {
  /** The llama.cpp release tag. */
  release: string;
  /** Short commit hash as llama.cpp reports it (`llama-server --version`). */
  commit: string;
  /**
   * Commits of the same source as other builds report them: node-llama-cpp ships its
   * llama.cpp as one squashed commit (gitRelease.bundle), and a llama-server built from that
   * bundle prints the bundle's commit, not the one its prebuilt library reports.
   */
  sourceCommits?: readonly string[];
  /** node-llama-cpp versions that bundle this build. */
  nodeLlamaCppVersions: readonly string[];
  /** Architecture names this build loads. */
  architectures: ReadonlySet<string>;
  /** Names this build knows but cannot load as a model, with why. */
  notLoadable: ReadonlyMap<string, string>;
}

export const BUNDLED_LLAMA_CPP: LlamaCppBuild = {
  release: "v0.4.0",
  commit: "5b4ebc5",
  // gitRelease.bundle's HEAD (80fb11ac): `llama-server --version` of a build from it prints
  // "version: 0.4.0-dev (build 1, commit 80fb11a)".
  sourceCommits: ["80fb11a"],
  nodeLlamaCppVersions: ["3.21.1"],
  architectures: new Set([
    "llama",
    "llama4",
    "deci",
    "falcon",
    "grok",
    "gpt2",
    "gptneox",
    "mpt",
    "baichuan",
    "starcoder",
    "refact",
    "bert",
    "modern-bert",
    "nomic-bert",
    "nomic-bert-moe",
    "neo-bert",
    "jina-bert-v2",
    "jina-bert-v3",
    "eurobert",
    "bloom",
    "stablelm",
    "qwen",
    "qwen2",
    "qwen2moe",
    "qwen2vl",
    "qwen3",
    "qwen3moe",
    "qwen3next",
    "qwen3vl",
    "qwen3vlmoe",
    "qwen35",
    "qwen35moe",
    "qwen4exp",
    "phi2",
    "phi3",
    "phimoe",
    "plamo",
    "plamo2",
    "plamo3",
    "codeshell",
    "orion",
    "internlm2",
    "minicpm",
    "minicpm3",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3n",
    "gemma4",
    "gemma4-assistant",
    "gemma-embedding",
    "starcoder2",
    "mamba",
    "mamba2",
    "jamba",
    "falcon-h1",
    "xverse",
    "command-r",
    "cohere2",
    "cohere2moe",
    "dbrx",
    "olmo",
    "olmo2",
    "olmoe",
    "muse-glimmer",
    "openelm",
    "arctic",
    "deepseek",
    "deepseek2",
    "deepseek2-ocr",
    "deepseek32",
    "deepseek4",
    "chatglm",
    "glm4",
    "glm4moe",
    "glm-dsa",
    "bitnet",
    "t5",
    "t5encoder",
    "jais",
    "jais2",
    "nemotron",
    "nemotron_h",
    "nemotron_h_moe",
    "exaone",
    "exaone4",
    "exaone-moe",
    "rwkv6",
    "rwkv6qwen2",
    "rwkv7",
    "arwkv7",
    "granite",
    "granitemoe",
    "granitehybrid",
    "graniteswitch",
    "granite_swa",
    "chameleon",
    "wavtokenizer-dec",
    "plm",
    "bailingmoe",
    "bailingmoe2",
    "bailingmoe3",
    "dots1",
    "dots3note",
    "arcee",
    "afmoe",
    "laguna",
    "ernie4_5",
    "ernie4_5-moe",
    "hunyuan-moe",
    "hunyuan-dense",
    "hunyuan_vl",
    "hy_v3",
    "smollm3",
    "gpt-oss",
    "lfm2",
    "lfm2moe",
    "dream",
    "smallthinker",
    "llada",
    "llada-moe",
    "seed_oss",
    "grovemoe",
    "apertus",
    "minimax-01",
    "minimax-m2",
    "minimax-m3",
    "cogvlm",
    "rnd1",
    "pangu-embedded",
    "mistral3",
    "eagle3",
    "dflash",
    "mistral4",
    "paddleocr",
    "mimo2",
    "step35",
    "llama-embed",
    "maincoder",
    "kimi-linear",
    "kimi-k3",
    "talkie",
    "mellum",
    "nanbeige",
    "qwen3tts",
    "pockettts",
  ]),
  notLoadable: new Map([
    ["clip", "'clip' is a vision projector, not a model: llama.cpp loads it with --mmproj beside a language model"],
    ["gptj", "this build names 'gptj' but has no implementation for it (\"unsupported model architecture\")"],
  ]),
};

/** Every llama.cpp build llmgw has an architecture list for, oldest first. Add a build here when an engine upgrade lands. */
export const LLAMA_CPP_BUILDS: readonly LlamaCppBuild[] = [BUNDLED_LLAMA_CPP];

/** The newest build llmgw has a list for: what a llama-server of an unknown build is taken to load. */
export const NEWEST_LLAMA_CPP_BUILD: LlamaCppBuild = LLAMA_CPP_BUILDS[LLAMA_CPP_BUILDS.length - 1]!;

export interface LlamaEngineIdentity {
  /**
   * "llamacpp" / "node-llama-cpp" (the bundled engine; version is the node-llama-cpp
   * version or the llama.cpp release tag) or "llama-server" / "llama.cpp" (a node's own
   * install; version is what `llama-server --version` prints, a release tag or a commit).
   */
  name: string;
  version: string;
}

export interface ArchitectureSupport {
  supported: boolean;
  /** "unknown-version": the engine's build is not in LLAMA_CPP_BUILDS, so llmgw cannot tell. */
  status: "supported" | "unsupported" | "unknown-version" | "not-llama-cpp";
  reason: string;
  /** The build the answer is for, in words, when known. */
  llamaCpp?: string;
}

const BUNDLED_NAMES = new Set(["llamacpp", "node-llama-cpp", "bundled", "llmgw-engine"]);
const SERVER_NAMES = new Set(["llama-server", "llama.cpp", "llama-cpp"]);

/** The build an engine runs, or undefined when the table does not know its version. */
export function resolveLlamaCppBuild(engine: LlamaEngineIdentity): LlamaCppBuild | undefined {
  const version = engine.version.trim();
  const name = engine.name.trim().toLowerCase();
  // `llama-server --version` prints "version: 1 (5b4ebc5)", or "version: 0.4.0-dev (build 1,
  // commit 80fb11a)" when built from source; a commit identifies the build.
  const commit = /\((?:[^()]*\bcommit\s+)?([0-9a-f]{7,40})\)/i.exec(version)?.[1] ?? (/^[0-9a-f]{7,40}$/i.test(version) ? version : undefined);
  const sameCommit = (known: string) => commit !== undefined && (known.startsWith(commit.toLowerCase()) || commit.toLowerCase().startsWith(known));
  return LLAMA_CPP_BUILDS.find((build) => {
    if (build.release === version || `v${version}` === build.release) return true;
    if (sameCommit(build.commit) || (build.sourceCommits ?? []).some(sameCommit)) return true;
    return BUNDLED_NAMES.has(name) && build.nodeLlamaCppVersions.includes(version.replace(/^v/, ""));
  });
}

export function describeLlamaCppBuild(build: LlamaCppBuild): string {
  const bundled = build.nodeLlamaCppVersions.length > 0 ? `, bundled in node-llama-cpp ${build.nodeLlamaCppVersions.join("/")}` : "";
  return `llama.cpp ${build.release} (commit ${build.commit}${bundled})`;
}

/** Whether the engine's llama.cpp can load a GGUF of `architecture`, and why not. */
export function checkArchitectureSupport(input: { architecture: string; engine: LlamaEngineIdentity }): ArchitectureSupport {
  const { architecture, engine } = input;
  const name = engine.name.trim().toLowerCase();
  if (!BUNDLED_NAMES.has(name) && !SERVER_NAMES.has(name)) {
    return {
      supported: false,
      status: "not-llama-cpp",
      reason: `Engine '${engine.name}' ${engine.version} is not llama.cpp; GGUF files run on llama.cpp (the bundled engine or llama-server).`,
    };
  }
  const build = resolveLlamaCppBuild(engine);
  if (!build) {
    const known = LLAMA_CPP_BUILDS.map(describeLlamaCppBuild).join("; ");
    return {
      supported: false,
      status: "unknown-version",
      reason: `llmgw has no architecture list for ${engine.name} version '${engine.version}', so it cannot tell whether it loads architecture '${architecture}'. Known builds: ${known}.`,
    };
  }
  const described = describeLlamaCppBuild(build);
  const notLoadable = build.notLoadable.get(architecture);
  if (notLoadable !== undefined) {
    return { supported: false, status: "unsupported", llamaCpp: described, reason: `${described} cannot load architecture '${architecture}': ${notLoadable}.` };
  }
  if (!build.architectures.has(architecture)) {
    return {
      supported: false,
      status: "unsupported",
      llamaCpp: described,
      reason: `${described} cannot load architecture '${architecture}': it is not among the ${build.architectures.size} architectures that build knows. A newer llama.cpp (llama-server on the node) may; otherwise choose a model with a supported architecture.`,
    };
  }
  return { supported: true, status: "supported", llamaCpp: described, reason: `${described} loads architecture '${architecture}'.` };
}
