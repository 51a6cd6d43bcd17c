import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { BUNDLED_LLAMA_CPP, checkArchitectureSupport, resolveLlamaCppBuild } from "./llama-support.ts";

const bundled = { name: "llamacpp", version: "3.21.1" };

describe("checkArchitectureSupport", () => {
  test("the bundled llama.cpp loads llama", () => {
    const result = checkArchitectureSupport({ architecture: "llama", engine: bundled });
    assert.equal(result.supported, true);
    assert.equal(result.status, "supported");
    assert.match(result.reason, /llama\.cpp v0\.4\.0/);
  });

  test("a made-up architecture is refused with the version and the name in the reason", () => {
    const result = checkArchitectureSupport({ architecture: "frobnicator", engine: bundled });
    assert.equal(result.supported, false);
    assert.equal(result.status, "unsupported");
    assert.match(result.reason, /v0\.4\.0/);
    assert.match(result.reason, /commit 5b4ebc5/);
    assert.match(result.reason, /'frobnicator'/);
  });

  test("names the build knows but cannot load are refused with why", () => {
    const clip = checkArchitectureSupport({ architecture: "clip", engine: bundled });
    assert.equal(clip.supported, false);
    assert.match(clip.reason, /--mmproj/);
    const gptj = checkArchitectureSupport({ architecture: "gptj", engine: bundled });
    assert.equal(gptj.supported, false);
    assert.match(gptj.reason, /no implementation/);
  });

  test("recent architectures of this build are known", () => {
    for (const architecture of ["qwen2", "qwen3", "gemma3", "gpt-oss", "deepseek2", "mistral3", "bert", "rwkv7", "glm4"]) {
      assert.equal(checkArchitectureSupport({ architecture, engine: bundled }).supported, true, architecture);
    }
  });

  test("llama-server versions map by release tag or commit; unknown ones are said to be unknown", () => {
    assert.equal(resolveLlamaCppBuild({ name: "llama-server", version: "version: 1 (5b4ebc5)" }), BUNDLED_LLAMA_CPP);
    assert.equal(resolveLlamaCppBuild({ name: "llama-server", version: "v0.4.0" }), BUNDLED_LLAMA_CPP);
    assert.equal(resolveLlamaCppBuild({ name: "node-llama-cpp", version: "3.21.1" }), BUNDLED_LLAMA_CPP);
    const unknown = checkArchitectureSupport({ architecture: "llama", engine: { name: "llama-server", version: "version: 9999 (abcdef1)" } });
    assert.equal(unknown.supported, false);
    assert.equal(unknown.status, "unknown-version");
    assert.match(unknown.reason, /9999 \(abcdef1\)/);
    assert.match(unknown.reason, /cannot tell/);
    // A node-llama-cpp version this table has no list for is not assumed to be 3.21.1's.
    assert.equal(checkArchitectureSupport({ architecture: "llama", engine: { name: "llamacpp", version: "3.22.0" } }).status, "unknown-version");
  });

  test("vLLM is not llama.cpp", () => {
    const result = checkArchitectureSupport({ architecture: "llama", engine: { name: "vllm", version: "0.11.0" } });
    assert.equal(result.supported, false);
    assert.equal(result.status, "not-llama-cpp");
  });
});

// Guards the committed list against the installed engine: if node-llama-cpp is upgraded
// without a new list, this fails and says what changed.
describe("the committed architecture list matches the installed node-llama-cpp", () => {
  // The package's exports hide package.json; walk up from its entry point instead.
  let packageRoot = dirname(createRequire(import.meta.url).resolve("node-llama-cpp"));
  const isRoot = (dir: string) =>
    existsSync(join(dir, "package.json")) && (JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { name?: string }).name === "node-llama-cpp";
  while (!isRoot(packageRoot) && dirname(packageRoot) !== packageRoot) packageRoot = dirname(packageRoot);
  const binDir = join(packageRoot, "..", "@node-llama-cpp", "linux-x64", "bins", "linux-x64");

  test("node-llama-cpp version and its llama.cpp release", () => {
    const version = (JSON.parse(readFileSync(join(packageRoot, "package.json"), "utf8")) as { version: string }).version;
    const info = JSON.parse(readFileSync(join(packageRoot, "llama", "llama.cpp.info.json"), "utf8")) as { tag: string };
    assert.ok(BUNDLED_LLAMA_CPP.nodeLlamaCppVersions.includes(version), `node-llama-cpp ${version} has no architecture list`);
    assert.equal(info.tag, BUNDLED_LLAMA_CPP.release);
  });

  test("every name is in the prebuilt libllama and the LLM_ARCH_NAMES run has no others", {
    skip: !existsSync(binDir) && "the linux-x64 prebuilt binary is not installed",
  }, () => {
    const library = readdirSync(binDir).find((file) => /^libllama(\.v[\d.]+)?\.so$/.test(file));
    assert.ok(library, `no libllama*.so in ${binDir}`);
    const binary = readFileSync(join(binDir, library));
    const known = [...BUNDLED_LLAMA_CPP.architectures, ...BUNDLED_LLAMA_CPP.notLoadable.keys()];
    for (const name of known) {
      // The linker may store a name as the tail of a longer string, so look for "name\0".
      assert.ok(binary.includes(Buffer.from(`${name}\0`, "latin1")), `'${name}' is not in ${library}`);
    }
    // The table's literals sit together in .rodata from "clip" to "(unknown)".
    const start = binary.indexOf(Buffer.from("\0clip\0llama\0", "latin1"));
    const end = binary.indexOf(Buffer.from("\0(unknown)\0", "latin1"), start);
    assert.ok(start > 0 && end > start, "LLM_ARCH_NAMES run not found");
    const run = binary
      .subarray(start + 1, end)
      .toString("latin1")
      .split("\0");
    const extra = run.filter((name) => !known.includes(name));
    assert.deepEqual(extra, [], `architectures in ${library} missing from llama-support.ts`);
  });
});
