// `llama-server --version` in the three shapes llama.cpp builds print (release, built from
// source, distribution package without git), each read into the version it records and
// the architecture list that follows; output without a version line reads as none.
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { BUNDLED_LLAMA_CPP, NEWEST_LLAMA_CPP_BUILD } from "../../gguf/llama-support.ts";
import { readLlamaServerVersion, unknownBuildWarning } from "./llama-server-version.ts";

const BUILT_WITH = "built with cc (Debian 12.2.0-14) 12.2.0 for x86_64-linux-gnu";

describe("readLlamaServerVersion", () => {
  test("a release build: build number and commit; a commit llmgw does not know takes the newest list", () => {
    const read = readLlamaServerVersion(`version: 4567 (abc1234)\n${BUILT_WITH}\n`);
    assert.deepEqual(read, { version: "4567 (abc1234)", build: NEWEST_LLAMA_CPP_BUILD, known: false });
  });

  test("a release build of the bundled engine's commit is that build", () => {
    assert.deepEqual(readLlamaServerVersion(`version: 1 (5b4ebc5)\n${BUILT_WITH}`), { version: "1 (5b4ebc5)", build: BUNDLED_LLAMA_CPP, known: true });
  });

  test("built from the llama.cpp source node-llama-cpp ships: a dev version with build and commit, known by the commit", () => {
    const read = readLlamaServerVersion(`version: 0.4.0-dev (build 1, commit 80fb11a)\n${BUILT_WITH}\n`);
    assert.deepEqual(read, { version: "0.4.0-dev (build 1, commit 80fb11a)", build: BUNDLED_LLAMA_CPP, known: true });
  });

  test("a distribution build without git: recorded as printed, the newest known list", () => {
    const read = readLlamaServerVersion(`version: 0 (unknown)\n${BUILT_WITH}\n`);
    assert.deepEqual(read, { version: "0 (unknown)", build: NEWEST_LLAMA_CPP_BUILD, known: false });
  });

  test("the version line after a CUDA build's device lines; no version line is no version", () => {
    const cuda = "ggml_cuda_init: found 1 CUDA devices:\n  Device 0: NVIDIA H100 80GB HBM3, compute capability 9.0, VMM: yes\nversion: 4567 (abc1234)\n";
    assert.equal(readLlamaServerVersion(cuda)?.version, "4567 (abc1234)");
    assert.equal(readLlamaServerVersion("usage: something else\n"), undefined);
    assert.equal(readLlamaServerVersion("version:   \n"), undefined);
  });

  test("control characters in the line are escaped, not recorded", () => {
    assert.equal(readLlamaServerVersion("version: 9 (\u001b[31mred)\n")?.version, "9 (\\x1b[31mred)");
  });

  test("the warning names the path, the version and the list it is taken to have", () => {
    const warning = unknownBuildWarning({ path: "/opt/llama/llama-server", version: "0 (unknown)" });
    assert.match(warning, /llama-server at \/opt\/llama\/llama-server reports version '0 \(unknown\)'/);
    assert.match(warning, new RegExp(NEWEST_LLAMA_CPP_BUILD.release.replace(/\./g, "\\.")));
  });
});
