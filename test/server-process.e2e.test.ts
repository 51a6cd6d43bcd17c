// The server process as an operator meets it, with real `llmgw` child processes on a temp
// data dir and free ports: one server per data dir (a second `up` or `server` is refused,
// a lock left by kill -9 is taken over by exactly one of two starting servers), log lines
// readable or JSON, and `llmgw admin-key reset` with and without a running server.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { findFreePort } from "../src/agent/free-port.ts";
import { eventually } from "./support/eventually.ts";

const BIN = fileURLToPath(new URL("../bin/llmgw.js", import.meta.url));

interface Running {
  child: ChildProcess;
  stdout: () => string;
  stderr: () => string;
  exited: Promise<number | null>;
}

function llmgw(args: string[], env: Record<string, string> = {}): Running {
  const child = spawn(process.execPath, [BIN, ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, LLMGW_LOG_LEVEL: "info", ...env } });
  let out = "";
  let err = "";
  child.stdout!.on("data", (chunk: Buffer) => (out += chunk.toString()));
  child.stderr!.on("data", (chunk: Buffer) => (err += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  return { child, stdout: () => out, stderr: () => err, exited };
}

/** Resolves once it listens, or with its exit code when it stops first. */
async function listensOrExits(run: Running): Promise<"listening" | number | null> {
  return eventually("the server to listen or exit", () =>
    run.stdout().includes("listening on") ? "listening" : run.child.exitCode !== null ? { code: run.child.exitCode } : undefined,
  ).then((outcome) => (outcome === "listening" ? outcome : outcome.code));
}

function serverInfo(dataDir: string): { url: string; pid: number } {
  return JSON.parse(readFileSync(path.join(dataDir, "server.json"), "utf8")) as { url: string; pid: number };
}

test("one server per data dir: a second `up` or `server` is refused naming the first, and a lock left by kill -9 goes to exactly one of two new servers", {
  timeout: 240_000,
}, async () => {
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-e2e-lock-"));
  const running: Running[] = [];
  try {
    const firstPort = await findFreePort("127.0.0.1");
    const first = llmgw(["server", "--data-dir", dataDir, "--listen", `127.0.0.1:${firstPort}`, "--log-format", "pretty"]);
    running.push(first);
    assert.equal(await listensOrExits(first), "listening", first.stderr());
    const firstUrl = `http://127.0.0.1:${firstPort}`;
    // Forced readable log lines, though stderr is a pipe here.
    await eventually("the readable listening line", () => first.stderr().includes("INFO: llmgw server listening"));
    assert.match(first.stderr(), new RegExp(`^\\[\\d\\d:\\d\\d:\\d\\d\\.\\d{3}\\] INFO: llmgw server listening url=${firstUrl} database=`, "m"));
    const info = readFileSync(path.join(dataDir, "server.json"), "utf8");

    for (const command of [["up", "--demo"], ["server"]]) {
      const second = llmgw([...command, "--data-dir", dataDir, "--listen", `127.0.0.1:${await findFreePort("127.0.0.1")}`]);
      running.push(second);
      assert.equal(await second.exited, 1, `${command[0]} on a data dir in use must not start`);
      assert.match(
        second.stderr(),
        new RegExp(
          `error: The data dir ${dataDir} is in use by another llmgw \\(PID ${first.child.pid}, listening on ${firstUrl}, since [^)]+\\)\\. Stop that one first`,
        ),
      );
    }
    assert.equal(readFileSync(path.join(dataDir, "server.json"), "utf8"), info, "the refused ones left the first one's server.json alone");
    assert.equal(existsSync(path.join(dataDir, "models")), false, "the refused `up --demo` made no demo model (nor engine)");
    assert.equal((await fetch(`${firstUrl}/healthz`)).status, 200);

    first.child.kill("SIGKILL");
    await first.exited;
    assert.ok(existsSync(path.join(dataDir, "server.lock")), "a killed server leaves its lock");

    // Two servers find the stale lock at the same time: one takes it over, the other is refused.
    const ports = [await findFreePort("127.0.0.1"), await findFreePort("127.0.0.1")];
    const racers = ports.map((port) => llmgw(["server", "--data-dir", dataDir, "--listen", `127.0.0.1:${port}`]));
    running.push(...racers);
    const outcomes = await Promise.all(racers.map(listensOrExits));
    assert.deepEqual([...outcomes].sort(), [1, "listening"], racers.map((r) => r.stderr()).join("\n"));
    const winner = racers[outcomes.indexOf("listening")]!;
    const loser = racers[outcomes.indexOf(1)]!;
    assert.match(loser.stderr(), new RegExp(`\\(PID ${winner.child.pid}, `));
    assert.equal(serverInfo(dataDir).pid, winner.child.pid);
    // Not a terminal and no --log-format: JSON lines.
    await eventually("the JSON listening line", () => winner.stderr().includes("llmgw server listening"));
    const listening = winner
      .stderr()
      .split("\n")
      .find((line) => line.includes("llmgw server listening"))!;
    assert.equal((JSON.parse(listening) as { url: string }).url, serverInfo(dataDir).url);

    winner.child.kill("SIGTERM");
    assert.equal(await winner.exited, 0);
    assert.equal(existsSync(path.join(dataDir, "server.lock")), false, "a clean stop removes the lock");
    assert.equal(existsSync(path.join(dataDir, "server.json")), false, "and its own server.json");
  } finally {
    for (const run of running) if (run.child.exitCode === null) run.child.kill("SIGKILL");
    rmSync(dataDir, { recursive: true, force: true });
  }
});

test("llmgw admin-key reset mints a working admin key offline, with or without a running server", { timeout: 240_000 }, async () => {
  const dataDir = mkdtempSync(path.join(tmpdir(), "llmgw-e2e-reset-"));
  let server: Running | undefined;
  try {
    const missing = spawnSync(process.execPath, [BIN, "admin-key", "reset", "--data-dir", path.join(dataDir, "typo")], { encoding: "utf8", timeout: 60_000 });
    assert.equal(missing.status, 1);
    assert.match(missing.stderr, /error: No llmgw database at .*typo\/llmgw\.db\. Pass the server's data dir with --data-dir/);

    const port = await findFreePort("127.0.0.1");
    server = llmgw(["server", "--data-dir", dataDir, "--listen", `127.0.0.1:${port}`]);
    assert.equal(await listensOrExits(server), "listening", server.stderr());
    const keyFile = path.join(dataDir, "admin.key");
    const lostKey = readFileSync(keyFile, "utf8").trim();

    const reset = spawnSync(process.execPath, [BIN, "admin-key", "reset", "--data-dir", dataDir], { encoding: "utf8", timeout: 60_000 });
    assert.equal(reset.status, 0, reset.stderr);
    const newKey = readFileSync(keyFile, "utf8").trim();
    assert.notEqual(newKey, lostKey);
    assert.equal(statSync(keyFile).mode & 0o777, 0o600);
    assert.equal(reset.stdout.split(newKey).length, 2, "printed once");
    const audit = await fetch(`http://127.0.0.1:${port}/api/v1/audit?action=key.create`, { headers: { authorization: `Bearer ${newKey}` } });
    assert.equal(audit.status, 200, "the running server takes the new key at once");
    const entries = ((await audit.json()) as { data: Array<{ actor: string }> }).data;
    assert.equal(entries[0]?.actor, "system:admin-key-reset");

    server.child.kill("SIGTERM");
    assert.equal(await server.exited, 0);
    const offline = spawnSync(process.execPath, [BIN, "admin-key", "reset", "--data-dir", dataDir], { encoding: "utf8", timeout: 60_000 });
    assert.equal(offline.status, 0, offline.stderr);
    assert.ok(offline.stdout.includes(readFileSync(keyFile, "utf8").trim()), "without a server it works the same");
  } finally {
    if (server !== undefined && server.child.exitCode === null) server.child.kill("SIGKILL");
    rmSync(dataDir, { recursive: true, force: true });
  }
});
