// End to end, as a user runs it: `llmgw up --demo` as a child process on a free port with
// a fresh data dir, driven by the official openai client and by the SDK example of
// README.md, then stopped with SIGTERM (and a second run with SIGINT); afterwards no
// engine process may be left.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { findFreePort } from "../src/agent/free-port.ts";
import { readyLine, startUp } from "./support/up-demo.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));
const ROOT = fileURLToPath(new URL("../", import.meta.url));

/** Pids of every process whose command line mentions `needle` (the engines name the data dir). */
function processesMentioning(needle: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, "utf8");
      if (cmdline.includes(needle)) pids.push(Number(entry));
    } catch {
      // The process ended while we looked.
    }
  }
  return pids;
}

/** The SDK example of README.md, and the shell lines that say how to run it. */
function readmeSdkExample(): { script: string; shell: string } {
  const readme = readFileSync(path.join(ROOT, "README.md"), "utf8");
  const script = /```js\n(\/\/ hello\.mjs\n[\s\S]*?)```/.exec(readme)?.[1];
  const shell = /```sh\n(npm i openai\n[\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(script !== undefined && shell !== undefined, "README.md has the hello.mjs example and the lines to run it");
  return { script, shell };
}

/** The quick start's shell lines (README.md, "Quick start"), without their comments. */
function readmeQuickStart(): string[] {
  const readme = readFileSync(path.join(ROOT, "README.md"), "utf8");
  const block = /## Quick start[\s\S]*?```sh\n([\s\S]*?)```/.exec(readme)?.[1];
  assert.ok(block !== undefined, "README.md has a quick start block");
  return block
    .split("\n")
    .map((line) => line.replace(/#.*$/, "").trim())
    .filter((line) => line !== "");
}

test("the quick start runs as written: `npm link` puts an llmgw on PATH that runs the compiled dist/", { timeout: 180_000 }, () => {
  assert.deepEqual(readmeQuickStart(), ["npm ci", "npm link", "llmgw up --demo"], "this test runs the quick start's commands; change it with them");
  // A fresh HOME and a global folder of its own, so the link touches nothing of the machine's.
  const home = mkdtempSync(path.join(tmpdir(), "llmgw-quick-start-"));
  try {
    const prefix = path.join(home, "prefix");
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      HOME: home,
      NPM_CONFIG_PREFIX: prefix,
      npm_config_update_notifier: "false",
      npm_config_fund: "false",
      npm_config_audit: "false",
    };
    delete env.LLMGW_FROM_SOURCE;
    // `npm ci` already ran (this suite runs from it); `npm link` runs `prepare`, which finds
    // dist/ current (`npm test` built it) and compiles nothing.
    const link = spawnSync("npm", ["link"], { cwd: ROOT, env, encoding: "utf8", timeout: 150_000 });
    assert.equal(link.status, 0, `npm link failed:\n${link.stdout}${link.stderr}`);
    assert.doesNotMatch(`${link.stdout}${link.stderr}`, /compiling src/, "dist/ was current, so npm link compiled nothing");
    const bin = path.join(prefix, "bin");
    const version = spawnSync("llmgw", ["--version"], { env: { ...env, PATH: `${bin}${path.delimiter}${env.PATH ?? ""}` }, encoding: "utf8", timeout: 30_000 });
    assert.equal(version.status, 0, `llmgw --version failed: ${version.stderr}`);
    const { version: packageVersion } = JSON.parse(readFileSync(path.join(ROOT, "package.json"), "utf8")) as { version: string };
    assert.equal(version.stdout.trim(), packageVersion);
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
});

test("without dist/ and without tsx, llmgw says to build instead of failing on an import", () => {
  // A copy of the entry point in a folder with neither dist/ nor node_modules: what an
  // install that skipped its build step looks like.
  const folder = mkdtempSync(path.join(tmpdir(), "llmgw-no-build-"));
  try {
    mkdirSync(path.join(folder, "bin"));
    writeFileSync(path.join(folder, "bin", "llmgw.js"), readFileSync(BIN));
    const { LLMGW_FROM_SOURCE: _fromSource, ...env } = process.env;
    const run = spawnSync(process.execPath, [path.join(folder, "bin", "llmgw.js"), "--version"], { cwd: folder, env, encoding: "utf8", timeout: 30_000 });
    assert.equal(run.status, 1);
    assert.match(run.stderr, /dist\/ is missing \(the compiled JavaScript\): run `npm run build`/);
    const forced = spawnSync(process.execPath, [path.join(folder, "bin", "llmgw.js"), "--version"], {
      cwd: folder,
      env: { ...env, LLMGW_FROM_SOURCE: "1" },
      encoding: "utf8",
      timeout: 30_000,
    });
    assert.equal(forced.status, 1);
    assert.match(forced.stderr, /LLMGW_FROM_SOURCE=1 runs the TypeScript sources through tsx, a dev dependency that is not installed here/);
  } finally {
    rmSync(folder, { recursive: true, force: true });
  }
});

test("llmgw up --demo answers the openai client and leaves no engine behind", { timeout: 240_000 }, async (t) => {
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-e2e-"));
  try {
    const port = await findFreePort("127.0.0.1");
    const { child, stdout, exited } = await startUp(dataDir, port);
    const keyFile = path.join(dataDir, "admin.key");
    const adminKey = readFileSync(keyFile, "utf8").trim();
    assert.equal(statSync(keyFile).mode & 0o777, 0o600, "admin.key is readable by its owner only");
    assert.ok(stdout().includes(adminKey), "the first start prints the admin key once");

    const client = new OpenAI({ apiKey: adminKey, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
    const startedAt = Date.now();
    await readyLine(stdout, port);
    const readyAfter = Date.now() - startedAt;
    // Ready means ready: the first request after the line is answered, no 503 to retry.
    const answer = await client.chat.completions.create({ model: "demo", messages: [{ role: "user", content: "Hello" }], max_tokens: 8 });
    assert.equal(answer.object, "chat.completion");
    assert.equal(answer.model, "demo");
    assert.equal(answer.choices[0]?.message.role, "assistant");
    assert.ok(answer.usage!.prompt_tokens > 0);
    assert.ok(answer.usage!.completion_tokens > 0 && answer.usage!.completion_tokens <= 8);
    assert.equal(answer.usage!.total_tokens, answer.usage!.prompt_tokens + answer.usage!.completion_tokens);

    const stream = await client.chat.completions.create({
      model: "demo",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 6,
      stream: true,
      stream_options: { include_usage: true },
    });
    let chunks = 0;
    let usage: OpenAI.CompletionUsage | undefined;
    let finish: string | null | undefined;
    for await (const chunk of stream) {
      chunks += 1;
      if (chunk.choices[0]?.finish_reason) finish = chunk.choices[0].finish_reason;
      if (chunk.usage) usage = chunk.usage;
    }
    assert.ok(chunks >= 3, `a stream of several chunks (got ${chunks})`);
    assert.equal(finish, "length");
    assert.equal(usage?.completion_tokens, 6);

    // README's example, as written, in a folder of its own with the openai package.
    const { script, shell } = readmeSdkExample();
    assert.match(shell, /export OPENAI_BASE_URL=http:\/\/127\.0\.0\.1:8700\/v1\n/);
    assert.match(shell, /export OPENAI_API_KEY=\$\(cat ~\/\.llmgw\/admin\.key\)\n/);
    const folder = mkdtempSync(path.join(tmpdir(), "llmgw-readme-"));
    try {
      writeFileSync(path.join(folder, "hello.mjs"), script);
      symlinkSync(path.join(ROOT, "node_modules"), path.join(folder, "node_modules")); // what `npm i openai` gives
      const { OPENAI_BASE_URL: _url, OPENAI_API_KEY: _key, ...env } = process.env;
      const run = spawnSync(process.execPath, ["hello.mjs"], {
        cwd: folder,
        encoding: "utf8",
        timeout: 60_000,
        env: { ...env, OPENAI_BASE_URL: `http://127.0.0.1:${port}/v1`, OPENAI_API_KEY: adminKey },
      });
      assert.equal(run.status, 0, `hello.mjs failed: ${run.stderr}`);
      // The demo model's weights are random, so its text may hold any token, a newline too:
      // what the example must show is a text answer, not undefined or null.
      assert.ok(
        run.stdout.endsWith("\n") && run.stdout.trim() !== "" && !/^(undefined|null)\n$/.test(run.stdout),
        `it prints the answer: ${JSON.stringify(run.stdout)}`,
      );
    } finally {
      rmSync(folder, { recursive: true, force: true });
    }

    const listed = await client.models.list();
    assert.deepEqual(
      listed.data.map((m) => m.id),
      ["demo"],
    );

    await assert.rejects(new OpenAI({ apiKey: "wrong", baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 }).models.list(), OpenAI.AuthenticationError);
    await assert.rejects(client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }), OpenAI.NotFoundError);
    await assert.rejects(client.chat.completions.create({ model: "demo", messages: [{ role: "user", content: "x" }], max_tokens: -1 }), OpenAI.BadRequestError);

    const engines = processesMentioning(dataDir).filter((pid) => pid !== child.pid);
    assert.ok(engines.length >= 1, "an engine process runs below the data dir");
    child.kill("SIGTERM");
    assert.equal(await exited, 0);
    assert.deepEqual(processesMentioning(dataDir), [], "no engine survives `up`");

    // A second start keeps the catalog and the key, prints no new key, and stops on SIGINT.
    const again = await startUp(dataDir, port);
    assert.ok(!again.stdout().includes("Admin key"), "the admin key is printed only on the first start");
    await readyLine(again.stdout, port);
    await client.chat.completions.create({ model: "demo", messages: [{ role: "user", content: "Hello" }], max_tokens: 4 });
    again.child.kill("SIGINT");
    assert.equal(await again.exited, 0);
    assert.deepEqual(processesMentioning(dataDir), [], "no engine survives SIGINT either");
    t.diagnostic(`demo answered ${readyAfter} ms after the server listened`);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
});

test("llmgw --version prints the version of package.json", () => {
  const { version } = JSON.parse(readFileSync(path.join(ROOT, "package.json"), "utf8")) as { version: string };
  const run = spawnSync(process.execPath, [BIN, "--version"], { encoding: "utf8", timeout: 60_000 });
  assert.equal(run.status, 0, run.stderr);
  assert.equal(run.stdout, `${version}\n`);
});
