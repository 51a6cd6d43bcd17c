// End to end, as a user runs it: `llmgw up --demo` as a child process on a free port with
// a fresh data dir, driven by the official openai client, then stopped with SIGTERM (and
// a second run with SIGINT); afterwards no engine process may be left.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { findFreePort } from "../src/agent/free-port.ts";
import { eventually } from "./support/eventually.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));


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

async function startUp(dataDir: string, port: number): Promise<{ child: ChildProcess; stdout: () => string; exited: Promise<number | null> }> {
  const child = spawn(process.execPath, [BIN, "up", "--demo", "--data-dir", dataDir, "--listen", `127.0.0.1:${port}`], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, LLMGW_LOG_LEVEL: "warn" },
  });
  let out = "";
  let err = "";
  child.stdout!.on("data", (chunk: Buffer) => (out += chunk.toString()));
  child.stderr!.on("data", (chunk: Buffer) => (err += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  try {
    // Either it listens, or it exited: then there is nothing more to wait for.
    await eventually("llmgw up to listen", () => out.includes("listening on") || child.exitCode !== null);
  } catch (error) {
    child.kill("SIGKILL");
    throw new Error(`llmgw up did not start (${(error as Error).message}): ${out}\n${err}`);
  }
  if (!out.includes("listening on")) throw new Error(`llmgw up exited early (${child.exitCode}): ${err}`);
  return { child, stdout: () => out, exited };
}

async function waitForAnswer(client: OpenAI): Promise<OpenAI.Chat.Completions.ChatCompletion> {
  const outcome = await eventually(
    "the demo model to answer",
    async () => {
      try {
        return { answer: await client.chat.completions.create({ model: "demo", messages: [{ role: "user", content: "Hello" }], max_tokens: 8 }) };
      } catch (error) {
        // 503 while the demo engine loads: not yet. Anything else is a real failure, returned to end the wait.
        if (error instanceof OpenAI.InternalServerError && error.status === 503) return undefined;
        return { error };
      }
    },
    { timeoutMs: 120_000, intervalMs: 250 },
  );
  if ("error" in outcome) throw outcome.error;
  return outcome.answer;
}

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
    const answer = await waitForAnswer(client);
    const readyAfter = Date.now() - startedAt;
    assert.equal(answer.object, "chat.completion");
    assert.equal(answer.model, "demo");
    assert.equal(answer.choices[0]?.message.role, "assistant");
    assert.ok(answer.usage!.prompt_tokens > 0);
    assert.ok(answer.usage!.completion_tokens > 0 && answer.usage!.completion_tokens <= 8);
    assert.equal(answer.usage!.total_tokens, answer.usage!.prompt_tokens + answer.usage!.completion_tokens);

    const stream = await client.chat.completions.create({ model: "demo", messages: [{ role: "user", content: "Hi" }], max_tokens: 6, stream: true, stream_options: { include_usage: true } });
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

    const listed = await client.models.list();
    assert.deepEqual(listed.data.map((m) => m.id), ["demo"]);

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
    await waitForAnswer(client);
    again.child.kill("SIGINT");
    assert.equal(await again.exited, 0);
    assert.deepEqual(processesMentioning(dataDir), [], "no engine survives SIGINT either");
    t.diagnostic(`demo answered ${readyAfter} ms after the server listened`);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
});
