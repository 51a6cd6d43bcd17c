// `llmgw ctl model plan` as a user runs it: the CLI as a child process against a real
// server whose registry is the stand-in Hub (test/support/stand-in-hub.ts, speaking the
// Hub's API shapes), and against a local GGUF file.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { startHarness, type Harness } from "./support/server-harness.ts";
import { startStandInHub, type StandInHub } from "./support/stand-in-hub.ts";
import { buildStandInRepos, GATED_REPO, GGUF_REPO, makeUnreadableFile, SAFETENSORS_REPO } from "./support/stand-in-repos.ts";
import { writeTinyLlamaGguf } from "../src/gguf/tiny-model.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const run = promisify(execFile);

describe("llmgw ctl model plan", () => {
  let hub: StandInHub;
  let harness: Harness;
  let workDir: string;

  before(async () => {
    const repos = await buildStandInRepos();
    hub = await startStandInHub({ repos: repos.all });
    harness = await startHarness({ registryEndpoint: hub.url });
    workDir = mkdtempSync(path.join(tmpdir(), "llmgw-plan-"));
  });

  after(async () => {
    await harness.close();
    await hub.close();
    rmSync(workDir, { recursive: true, force: true });
  });

  const ctl = (args: string[], cwd = workDir) =>
    run(process.execPath, [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, ...args], { cwd, env: { ...process.env, LLMGW_LOG_LEVEL: "silent" } });

  test("plans every quantisation of a GGUF repository on this machine and recommends one", async () => {
    const { stdout } = await ctl(["model", "plan", GGUF_REPO, "--context", "4096"]);
    assert.match(stdout, new RegExp(`${GGUF_REPO} @ main`));
    for (const quant of ["Q4_K_M", "Q8_0", "F16"]) assert.match(stdout, new RegExp(`^${quant}\\s+gguf\\s+llama\\.cpp\\s+CPU`, "m"));
    assert.match(stdout, /Recommend/i);

    const { stdout: json } = await ctl(["model", "plan", GGUF_REPO, "--context", "4096", "--json"]);
    const result = JSON.parse(json);
    assert.equal(result.sha.length, 40);
    // Tiny models fit anywhere, so the best quality wins: F16 over Q8_0 over Q4_K_M.
    assert.equal(result.plan.recommendation.artifact.label, "F16");
    assert.ok(result.plan.options.every((o: { fits: boolean }) => o.fits));
    // The header check read only the header: the stand-in saw ranged GETs of the files, never a whole one.
    const fileReads = hub.requests.filter((r) => r.method === "GET" && (r.path.includes("/resolve/") || r.path.startsWith("/cdn/")));
    assert.ok(fileReads.length > 0);
    assert.ok(fileReads.every((r) => r.range !== undefined), "every read of a GGUF file asked for a byte range");
  });

  test("plans a safetensors repository from config.json and the index", async () => {
    const { stdout } = await ctl(["model", "plan", SAFETENSORS_REPO, "--json"]);
    const result = JSON.parse(stdout);
    const options = result.plan.options as Array<{ artifact: { format: string }; engine: string; fits: boolean; why?: string }>;
    assert.ok(options.length > 0);
    assert.ok(options.every((o) => o.artifact.format === "safetensors" && o.engine === "vllm"));
    // This machine has no GPU, and vLLM needs one.
    assert.equal(result.plan.recommendation, null);
    assert.match(result.plan.explanation, /GPU/);
  });

  test("plans a local GGUF file", async () => {
    const file = path.join(workDir, "local.gguf");
    await writeTinyLlamaGguf({ path: file, seed: 3 });
    const { stdout } = await ctl(["model", "plan", "./local.gguf", "--json"]);
    const result = JSON.parse(stdout);
    assert.match(result.repo, /^file:\/\//);
    assert.equal(result.plan.recommendation.engine, "llamacpp");
    assert.equal(result.plan.recommendation.artifact.format, "gguf");
  });

  test("plans a local folder from its listing and headers: nothing is hashed, and a quantisation it cannot read is noted by name", async (t) => {
    const folder = path.join(workDir, "folder");
    mkdirSync(folder);
    await writeTinyLlamaGguf({ path: path.join(folder, "tiny-Q4_K_M.gguf"), seed: 4 });
    const unreadable = path.join(folder, "tiny-Q8_0.gguf");
    if (!(await makeUnreadableFile(unreadable))) {
      t.skip("no way to make a file this process cannot read here");
      return;
    }
    const { stdout } = await ctl(["model", "plan", "./folder", "--json"]);
    const result = JSON.parse(stdout);
    const byName = Object.fromEntries(result.artifacts.map((a: { name: string; planned: boolean; note?: string }) => [a.name, a]));
    assert.equal(byName.Q4_K_M.planned, true);
    assert.equal(byName.Q8_0.planned, false);
    assert.match(byName.Q8_0.note, /llmgw cannot read '.*tiny-Q8_0\.gguf': permission denied/);
    assert.equal(result.plan.recommendation.artifact.label, "Q4_K_M");
    assert.equal(existsSync(path.join(harness.dataDir, "registry", "local-hashes.json")), false, "planning hashed nothing");
  });

  test("a gated repository without a token and an unknown one fail with errors that say what to do", async () => {
    await assert.rejects(ctl(["model", "plan", GATED_REPO]), (error: { stderr: string; code: number }) => {
      assert.equal(error.code, 1);
      assert.match(error.stderr, /HF_TOKEN/);
      assert.match(error.stderr, new RegExp(GATED_REPO));
      return true;
    });
    await assert.rejects(ctl(["model", "plan", "llmgw-test/does-not-exist"]), (error: { stderr: string }) => /does-not-exist/.test(error.stderr) && /not found/i.test(error.stderr));
    await assert.rejects(ctl(["model", "plan", "not a repo"]), (error: { stderr: string }) => /owner\/name/.test(error.stderr));
    await assert.rejects(ctl(["model", "plan", "./missing.gguf"]), (error: { stderr: string }) => /missing\.gguf/.test(error.stderr));
  });
});
