// The bundled engine's local build is tied to the CPU it was compiled for through
// node-llama-cpp's own folder naming (native-binding.ts): these tests hold node-llama-cpp
// to the two behaviours that relies on, so an upgrade that changes either fails here
// rather than loading a build on a CPU that cannot run it.
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { getLlama } from "node-llama-cpp";
import { cpuFingerprint } from "../llama-server/llama-cpp-source.ts";
import { bindingCmakeOptions, compilePercent, nodeLlamaCppDir } from "./native-binding.ts";

interface FolderNames {
  withoutCustomCmakeOptions: string;
  withCustomCmakeOptions: string;
}

/** node-llama-cpp's internal naming of a local build's folder (not exported: imported by path). */
async function folderFor(customCmakeOptions: Record<string, string>): Promise<FolderNames> {
  const dist = path.join(nodeLlamaCppDir(), "dist", "bindings", "utils");
  const naming = (await import(pathToFileURL(path.join(dist, "getBuildFolderNameForBuildOptions.js")).href)) as {
    getBuildFolderNameForBuildOptions(options: unknown): Promise<FolderNames>;
  };
  const release = (await import(pathToFileURL(path.join(dist, "binariesGithubRelease.js")).href)) as { builtinLlamaCppRelease: string };
  return naming.getBuildFolderNameForBuildOptions({
    platform: process.platform,
    arch: process.arch,
    gpu: false,
    llamaCpp: { repo: "ggml-org/llama.cpp", release: release.builtinLlamaCppRelease },
    customCmakeOptions: new Map(Object.entries(customCmakeOptions)),
  });
}

test("the local build's folder is named by the CPU fingerprint in its cmake options: another CPU's build is another folder", async () => {
  assert.deepEqual(bindingCmakeOptions(), { LLMGW_CPU: cpuFingerprint() });
  const here = await folderFor(bindingCmakeOptions());
  const elsewhere = await folderFor({ LLMGW_CPU: "0123456789abcdef" });
  const plain = await folderFor({});
  assert.notEqual(here.withCustomCmakeOptions, elsewhere.withCustomCmakeOptions);
  assert.notEqual(here.withCustomCmakeOptions, plain.withCustomCmakeOptions, "a build without the fingerprint is not taken for this CPU's");
  assert.ok(here.withCustomCmakeOptions.startsWith(`${process.platform}-${process.arch}`), here.withCustomCmakeOptions);
});

test("with the fingerprint among the options and no build for it, node-llama-cpp still loads its prebuilt binary", async () => {
  const llama = await getLlama({
    gpu: false,
    build: "never",
    skipDownload: true,
    usePrebuiltBinaries: true,
    progressLogs: false,
    maxThreads: 1,
    cmakeOptions: { LLMGW_CPU: "a-cpu-nothing-was-built-for" },
  });
  try {
    assert.equal(llama.buildType, "prebuilt");
  } finally {
    await llama.dispose();
  }
});

test("the compile's progress is read from Ninja's and Make's lines alike; other lines say nothing", () => {
  assert.equal(compilePercent("[1/277] Building CXX object CMakeFiles/llama-addon.dir/addon/AddonContext.cpp.o"), 1);
  assert.equal(compilePercent("[139/277] Building C object ggml/src/ggml-cpu.c.o"), 50);
  assert.equal(compilePercent("[277/277] Linking CXX shared module Release/llama-addon.node"), 100);
  assert.equal(compilePercent("[ 42%] Building CXX object src/llama.cpp.o"), 42);
  assert.equal(compilePercent("  1243 |   (__v16si)"), undefined);
  assert.equal(compilePercent("Cloning ggml-org/llama.cpp (local bundle) 42%"), undefined);
});
