// A serve job cut by kill -9 of the server during its mirror step: the next start of the
// server on the same data dir resumes the job (the mirror resumes its file), which then
// ends with a replica answering; the job says it was resumed. Real `llmgw up` processes
// against the stand-in Hub, whose CDN holds the first download open until the kill.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { findFreePort } from "../src/agent/free-port.ts";
import type { JobView } from "../src/serve/job-rows.ts";
import { eventually } from "./support/eventually.ts";
import { startStandInHub } from "./support/stand-in-hub.ts";
import { buildStandInRepos, GGUF_REPO } from "./support/stand-in-repos.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));

function up(dataDir: string, port: number, registry: string): { child: ChildProcess; exited: Promise<unknown>; output: () => string } {
  const child = spawn(process.execPath, [BIN, "up", "--data-dir", dataDir, "--listen", `127.0.0.1:${port}`, "--registry", registry, "--update-check", "off"], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, LLMGW_LOG_LEVEL: "info" },
  });
  let output = "";
  child.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()));
  child.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()));
  return { child, exited: new Promise((resolve) => child.on("exit", resolve)), output: () => output };
}

test("a serve job cut by kill -9 during the mirror step resumes on the next start and ends with a replica answering", { timeout: 300_000 }, async () => {
  const hub = await startStandInHub({ repos: (await buildStandInRepos()).all });
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-serve-restart-"));
  const running: ReturnType<typeof up>[] = [];
  try {
    // The first download of the weights hangs, so the job is mid-mirror when the server dies.
    hub.setFault({ kind: "hang", match: "/cdn/", times: 1 });
    const port = await findFreePort("127.0.0.1");
    const first = up(dataDir, port, hub.url);
    running.push(first);
    const url = `http://127.0.0.1:${port}`;
    await eventually("the first server listening", () => first.output().includes("listening on"), { timeoutMs: 120_000 });
    const adminKey = readFileSync(path.join(dataDir, "admin.key"), "utf8").trim();
    const admin = async <Body>(method: string, pathname: string, body?: unknown) => {
      const response = await fetch(url + pathname, {
        method,
        headers: { authorization: `Bearer ${adminKey}`, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      return { status: response.status, body: (await response.json()) as Body };
    };
    const started = await admin<JobView>("POST", "/api/v1/jobs/serve", { repo: GGUF_REPO, quant: "Q8_0", name: "survivor", ctx_pool: 2048, context: 1024 });
    assert.equal(started.status, 202, JSON.stringify(started.body));
    const id = started.body.id;
    await eventually(
      "the mirror step running with its download open",
      async () =>
        (await admin<JobView>("GET", `/api/v1/jobs/${id}`)).body.steps[1]!.state === "running" && hub.requests.some((r) => r.path.startsWith("/cdn/")),
    );

    first.child.kill("SIGKILL");
    await first.exited;

    const second = up(dataDir, port, hub.url);
    running.push(second);
    await eventually("the second server listening", () => second.output().includes("listening on"), { timeoutMs: 120_000 });
    const finished = await eventually(
      "the resumed job finished",
      async () => {
        const job = (await admin<JobView>("GET", `/api/v1/jobs/${id}`)).body;
        return job.state === "running" || job.state === "queued" ? undefined : job;
      },
      { timeoutMs: 180_000 },
    );
    assert.equal(finished.state, "done", JSON.stringify(finished));
    assert.equal(finished.resumed, 1);
    assert.ok(finished.result!.tokens_per_second > 0);
    assert.match(second.output(), /resuming a job cut by a server stop/);

    const key = (await admin<{ key: string }>("POST", "/api/v1/keys", { name: "app" })).body.key;
    const answer = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "survivor", messages: [{ role: "user", content: "Hello" }], max_tokens: 4 }),
    });
    assert.equal(answer.status, 200);
  } finally {
    for (const server of running) if (server.child.exitCode === null && server.child.signalCode === null) server.child.kill("SIGTERM");
    await Promise.all(running.map((server) => server.exited));
    await hub.close();
    rmSync(dataDir, { recursive: true, force: true });
  }
});
