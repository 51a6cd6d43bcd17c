// Finding llama.cpp's source and a finished build without git or cmake: the bundle's commit
// from its header (v2 and v3), the CPU fingerprint a GGML_NATIVE build is recorded with, and
// `--llama-server auto` refusing a build for another CPU while adopting one from before the
// fingerprint. Build folders here are written by hand (a record and a program file), which
// is all that `builtLlamaServer` reads; engine-build.test.ts compiles real ones.
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { bundleHead, builtLlamaServer, cpuFingerprint, llamaCppSource } from "./llama-cpp-source.ts";

const SHA1 = "80fb11ac73e66d89eae2c6a91d8a77428fa733ed";
const OTHER = "1111111111111111111111111111111111111111";

test("the default source is node-llama-cpp's own bundle, whose commit names the cache folder", async () => {
  const source = await llamaCppSource();
  assert.ok(existsSync(source.bundle), source.bundle);
  assert.match(source.bundle, /node-llama-cpp\/llama\/gitRelease\.bundle$/);
  assert.match(source.commit, /^[0-9a-f]{40}$/);
});

test("a bundle's header names its commit: HEAD first, else the first ref; v3 capabilities, SHA-256 and prerequisites are read past", () => {
  const pack = "PACK\u0000\u0000\u0000\u0002\u00ff\u00fe";
  assert.equal(bundleHead(`# v2 git bundle\n${SHA1} HEAD\n\n${pack}`), SHA1);
  assert.equal(bundleHead(`# v2 git bundle\n-${OTHER} an older commit\n${OTHER} refs/heads/master\n${SHA1} HEAD\n\n${pack}`), SHA1);
  assert.equal(bundleHead(`# v2 git bundle\n${OTHER} refs/heads/master\n\n${pack}`), OTHER);
  const sha256 = "ab".repeat(32);
  assert.equal(bundleHead(`# v3 git bundle\n@object-format=sha256\n@filter=blob:none\n${sha256} HEAD\n\n${pack}`), sha256);
  assert.equal(bundleHead(`# v4 git bundle\n${SHA1} HEAD\n\n`), undefined, "an unknown version");
  assert.equal(bundleHead(`# v2 git bundle\n${SHA1} HEAD\n`), undefined, "a header cut short");
  assert.equal(bundleHead(`# v2 git bundle\nnot a ref line\n\n`), undefined);
  assert.equal(bundleHead("PK\u0003\u0004 a zip file\n\n"), undefined);
});

describe("without git on PATH", () => {
  let dir: string;
  let savedPath: string | undefined;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "llmgw-llama-source-"));
    savedPath = process.env.PATH;
    process.env.PATH = "";
  });
  after(async () => {
    process.env.PATH = savedPath;
    await rm(dir, { recursive: true, force: true });
  });

  test("the commit of node-llama-cpp's bundle and of another bundle is read, and a file that is no bundle is named", async () => {
    assert.match((await llamaCppSource()).commit, /^[0-9a-f]{40}$/);
    const bundle = path.join(dir, "source.bundle");
    await writeFile(bundle, `# v2 git bundle\n${SHA1} HEAD\n\nPACK`);
    assert.deepEqual(await llamaCppSource(bundle), { bundle, commit: SHA1 });
    const junk = path.join(dir, "junk.bundle");
    await writeFile(junk, "hello\n");
    await assert.rejects(llamaCppSource(junk), /junk\.bundle is not a git bundle that names a commit \(it starts 'hello'\): reinstall/);
  });

  test("--llama-server auto finds a finished build", async () => {
    const root = path.join(dir, "root");
    const { bundle, buildDir } = await fakeBuild(root, { cpu_fingerprint: cpuFingerprint() });
    assert.equal(await builtLlamaServer({ root, bundle }), path.join(buildDir, "bin", "llama-server"));
  });
});

describe("--llama-server auto and the CPU a build was made for", () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), "llmgw-llama-cpu-"));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  test("a build recorded for another CPU is refused with a sentence that says what to do", async () => {
    const root = path.join(dir, "other");
    const { bundle } = await fakeBuild(root, { cpu_fingerprint: "fedcba9876543210" });
    await assert.rejects(builtLlamaServer({ root, bundle }), (error: Error & { code?: string }) => {
      assert.equal(error.code, "llama_server_other_cpu");
      assert.match(
        error.message,
        /^the llama-server build in .* is not for this machine: it was compiled for another CPU \(GGML_NATIVE; CPU fingerprint fedcba9876543210, this machine's is .*\) and could stop on an instruction this one lacks\. Run `llmgw engine build` to build it for this one\.$/,
      );
      return true;
    });
  });

  test("a record from before the fingerprint is used, and given this machine's fingerprint in place", async () => {
    const root = path.join(dir, "legacy");
    const { bundle, buildDir, record } = await fakeBuild(root, {});
    assert.equal(await builtLlamaServer({ root, bundle }), path.join(buildDir, "bin", "llama-server"));
    const after = JSON.parse(await readFile(path.join(buildDir, "build.json"), "utf8")) as Record<string, unknown>;
    assert.deepEqual(after, { ...record, cpu_fingerprint: cpuFingerprint() }, "every other field is kept");
  });
});

test("the CPU fingerprint hashes the feature flags, in any order; without a flags line it is 'unknown'", () => {
  const x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx2 fma\nbugs\t\t: spectre_v1\n";
  const fingerprint = cpuFingerprint(x86);
  assert.match(fingerprint, /^[0-9a-f]{16}$/);
  assert.equal(cpuFingerprint("processor\t: 0\nflags\t\t: fma avx2 fpu sse2\n"), fingerprint, "order does not matter");
  assert.notEqual(cpuFingerprint("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f\n"), fingerprint, "one more instruction set does");
  assert.match(cpuFingerprint("processor\t: 0\nFeatures\t: fp asimd evtstrm aes\n"), /^[0-9a-f]{16}$/, "ARM's line");
  assert.equal(cpuFingerprint("processor\t: 0\nmodel name\t: something\n"), "unknown");
  assert.equal(cpuFingerprint(""), "unknown");
  if (existsSync("/proc/cpuinfo")) assert.match(cpuFingerprint(), /^([0-9a-f]{16}|unknown)$/);
});

/** A build folder as `llmgw engine build` leaves it, for a hand-written one-commit bundle. */
async function fakeBuild(root: string, extra: Record<string, unknown>): Promise<{ bundle: string; buildDir: string; record: Record<string, unknown> }> {
  await mkdir(root, { recursive: true });
  const bundle = path.join(root, "source.bundle");
  await writeFile(bundle, `# v2 git bundle\n${SHA1} HEAD\n\nPACK`);
  const buildDir = path.join(root, SHA1);
  await mkdir(path.join(buildDir, "bin"), { recursive: true });
  await writeFile(path.join(buildDir, "bin", "llama-server"), "#!/bin/sh\n", { mode: 0o755 });
  const record = {
    commit: SHA1,
    flags: ["-DGGML_NATIVE=ON"],
    targets: ["llama-server", "llama-bench", "llama-batched-bench"],
    version: "0.4.0-dev (build 1, commit 80fb11a)",
    built_at: "2026-12-02T13:10:05.178Z",
    seconds: 8,
    ...extra,
  };
  await writeFile(path.join(buildDir, "build.json"), `${JSON.stringify(record, null, 2)}\n`);
  return { bundle, buildDir, record };
}
