// `llmgw ctl model plan` as a user runs it: the CLI as a child process against a real
// server whose registry is the stand-in Hub (test/support/stand-in-hub.ts, speaking the
// Hub's API shapes), and against a local GGUF file.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, rmSync, truncateSync, writeFileSync } from "node:fs";
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

  const ctl = (args: string[], cwd = workDir, env: Record<string, string> = {}) =>
    run(process.execPath, [BIN, "ctl", "--server", harness.url, "--key", harness.adminKey, ...args], {
      cwd,
      env: { ...process.env, LLMGW_LOG_LEVEL: "silent", ...env },
    });

  test("plans every quantisation of a GGUF repository on this machine and recommends one", async () => {
    const { stdout } = await ctl(["model", "plan", GGUF_REPO, "--context", "4096"]);
    assert.match(stdout, new RegExp(`${GGUF_REPO} @ main`));
    for (const quant of ["Q4_K_M", "Q8_0", "F16"]) assert.match(stdout, new RegExp(`^${quant}\\s+gguf\\s+llama\\.cpp\\s+CPU`, "m"));
    // The tiny test model's replica takes a quarter core (plan/cpu-share.ts), and the rule is printed.
    assert.match(stdout, /^Q4_K_M\s+gguf\s+llama\.cpp\s+CPU\s+\S+ \S+\/node\s+0\.25\/node\s/m);
    assert.match(stdout, /^A CPU replica reserves one core per 2 GiB of its memory, rounded up to a quarter, from 0\.25 to 1 core/m);
    assert.match(stdout, /Recommend/i);
    // What each artifact's memory is made of, as in the JSON; 4096 is the trained context, so no warning.
    assert.match(
      stdout,
      /^ {2}Q4_K_M: weights \S+ \S+ \+ KV cache \S+ \S+ \(4096 tokens, f16\) \+ compute buffer \S+ \S+ \((logits|feed-forward|attention) [^)]*\) \+ output buffer and tokenizer \S+ \S+ = \S+ \S+ on llama\.cpp$/m,
    );
    assert.doesNotMatch(stdout, /Warning/);

    const { stdout: json } = await ctl(["model", "plan", GGUF_REPO, "--context", "4096", "--json"]);
    const result = JSON.parse(json);
    assert.equal(result.sha.length, 40);
    // Tiny models fit anywhere, so the best quality wins: F16 over Q8_0 over Q4_K_M.
    assert.equal(result.plan.recommendation.artifact.label, "F16");
    assert.ok(result.plan.options.every((o: { fits: boolean }) => o.fits));
    // The header check read only the header: the stand-in saw ranged GETs of the files, never a whole one.
    const fileReads = hub.requests.filter((r) => r.method === "GET" && (r.path.includes("/resolve/") || r.path.startsWith("/cdn/")));
    assert.ok(fileReads.length > 0);
    assert.ok(
      fileReads.every((r) => r.range !== undefined),
      "every read of a GGUF file asked for a byte range",
    );
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

  test("the text plan shows each artifact's memory with the stage that sized the compute buffer, and warns past the trained context", async () => {
    const file = path.join(workDir, "long.gguf");
    await writeTinyLlamaGguf({ path: file, seed: 5, contextLength: 4096 });
    const { stdout: text } = await ctl(["model", "plan", "./long.gguf", "--context", "8192"]);
    const { stdout: json } = await ctl(["model", "plan", "./long.gguf", "--context", "8192", "--json"]);
    const memory = JSON.parse(json).plan.artifacts[0].memory;
    // A tiny vocabulary and an 8192-token context: the attention stage sizes the buffer.
    assert.equal(memory.overhead.computeStage, "attention");
    assert.ok(text.includes(`compute buffer`), text);
    assert.ok(text.includes(`(${memory.overhead.computeStageName})`), text);
    assert.match(text, /KV cache \S+ \S+ \(8192 tokens, f16\)/);
    assert.match(text, /^Warning: The 8192-token context exceeds the 4096 tokens the model was trained for.*--context 4096/m);
    assert.deepEqual(
      memory.warnings.map((w: string) => `Warning: ${w}`),
      text.split("\n").filter((line) => line.startsWith("Warning: ")),
    );
  });

  test("a GGUF cut after its header is not planned", async () => {
    const file = path.join(workDir, "cut.gguf");
    const { bytes } = await writeTinyLlamaGguf({ path: file, seed: 6 });
    truncateSync(file, Math.floor(bytes / 2));
    await assert.rejects(ctl(["model", "plan", "./cut.gguf"]), (error: { code: number; stderr: string }) => {
      assert.equal(error.code, 1);
      assert.match(error.stderr, /cut\.gguf is truncated: its tensor data ends at byte \d+/);
      assert.doesNotMatch(error.stderr, /\.\./, "no double full stop");
      return true;
    });
  });

  test("ctl model add sends the absolute path of a relative or ~ file, and the server refuses weights cut short", async () => {
    const file = path.join(workDir, "add.gguf");
    await writeTinyLlamaGguf({ path: file, seed: 7 });
    const elsewhere = path.join(workDir, "elsewhere");
    mkdirSync(elsewhere);
    await ctl(["model", "add", "relative", "--gguf", "./add.gguf", "--replicas", "0"]);
    assert.equal((await harness.admin("GET", "/api/v1/models/relative")).body.source.path, file);
    await ctl(["model", "add", "home", "--gguf", "~/add.gguf", "--replicas", "0"], elsewhere, { HOME: workDir });
    assert.equal((await harness.admin("GET", "/api/v1/models/home")).body.source.path, file);

    const definition = path.join(workDir, "definition.json");
    writeFileSync(
      definition,
      JSON.stringify({
        name: "defined",
        source: { kind: "file", path: "add.gguf" },
        scaling: { min: 0, max: 1 },
        profiles: [{ name: "cpu", engine: "llamacpp" }],
      }),
    );
    await ctl(["model", "add", "--definition", definition], elsewhere);
    assert.equal((await harness.admin("GET", "/api/v1/models/defined")).body.source.path, file, "relative to the definition file");

    const moved = path.join(workDir, "elsewhere", "moved.gguf");
    await writeTinyLlamaGguf({ path: moved, seed: 9 });
    await ctl(["model", "edit", "defined", "--patch", JSON.stringify({ source: { kind: "file", path: "./moved.gguf" } })], elsewhere);
    assert.equal((await harness.admin("GET", "/api/v1/models/defined")).body.source.path, moved, "ctl model edit sends a relative path absolute too");

    const cut = path.join(workDir, "add-cut.gguf");
    const { bytes } = await writeTinyLlamaGguf({ path: cut, seed: 8 });
    truncateSync(cut, Math.floor(bytes / 2));
    await assert.rejects(ctl(["model", "add", "cut", "--gguf", "./add-cut.gguf"]), (error: { code: number; stderr: string }) => {
      assert.equal(error.code, 1);
      assert.match(error.stderr, /The weights of model 'cut' cannot be loaded: .*add-cut\.gguf is truncated/);
      return true;
    });
    assert.equal((await harness.admin("GET", "/api/v1/models/cut")).status, 404);
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
      // The plan ran on the server: a token in ctl's shell would change nothing.
      assert.match(error.stderr, /set HF_TOKEN to that account's token in the environment of the llmgw server \(not of ctl\) and restart it/);
      return true;
    });
    await assert.rejects(
      ctl(["model", "plan", "llmgw-test/does-not-exist"]),
      (error: { stderr: string }) => /does-not-exist/.test(error.stderr) && /not found/i.test(error.stderr),
    );
    await assert.rejects(ctl(["model", "plan", "not a repo"]), (error: { stderr: string }) => /owner\/name/.test(error.stderr));
    await assert.rejects(ctl(["model", "plan", "./missing.gguf"]), (error: { stderr: string }) => /missing\.gguf/.test(error.stderr));
  });
});
