// What a node's own `llama-server --version` says, and which architecture list follows
// from it. llama.cpp prints one "version: ..." line on stderr (common/common.cpp
// print_build_info), but its shape depends on how the binary was built:
//   release builds            version: 4567 (abc1234)
//   built from source         version: 0.4.0-dev (build 1, commit 80fb11a)
//   distribution packages     version: 0 (unknown)   (built outside a git checkout)
// Any of them is a working llama-server, so the line is recorded as printed and never
// refused for its shape. The build is looked up by its commit (llama-support.ts); one llmgw
// has no list for is taken to load what the newest known build loads, with a warning for
// the agent's log: refusing it would keep the node from starting, and a model whose
// architecture the build lacks still fails its smoke test with llama.cpp's own words.
import { printable } from "../../core/format.ts";
import { NEWEST_LLAMA_CPP_BUILD, describeLlamaCppBuild, resolveLlamaCppBuild, type LlamaCppBuild } from "../../gguf/llama-support.ts";

export interface LlamaServerVersion {
  /** What follows "version:", as printed: "4567 (abc1234)", "0.4.0-dev (build 1, commit 80fb11a)", "0 (unknown)". */
  version: string;
  /** The build whose architecture list applies: the one the version names, else the newest llmgw knows. */
  build: LlamaCppBuild;
  /** False when llmgw has no list for this build and assumes the newest one. */
  known: boolean;
}

/** Reads the first "version: ..." line of `llama-server --version`'s output; undefined when there is none. */
export function readLlamaServerVersion(output: string): LlamaServerVersion | undefined {
  const line = output
    .split("\n")
    .map((text) => /^\s*version:\s*(\S.*?)\s*$/i.exec(text)?.[1])
    .find((text) => text !== undefined);
  if (line === undefined) return undefined;
  // The inventory carries it to the server and `ctl node show` prints it: no control characters.
  const version = printable(line);
  const build = resolveLlamaCppBuild({ name: "llama-server", version });
  return build === undefined ? { version, build: NEWEST_LLAMA_CPP_BUILD, known: false } : { version, build, known: true };
}

/** The agent's warning for a build llmgw has no architecture list for. */
export function unknownBuildWarning(options: { path: string; version: string }): string {
  return (
    `llama-server at ${options.path} reports version '${options.version}', a build llmgw has no architecture list for; ` +
    `it is taken to load what ${describeLlamaCppBuild(NEWEST_LLAMA_CPP_BUILD)} loads, the newest build llmgw knows. ` +
    `A model whose architecture this build lacks fails its smoke test with llama.cpp's own error.`
  );
}
