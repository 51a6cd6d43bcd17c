// `llmgw up --demo` as a child process, the way a user starts it: a fresh data dir, a port,
// its output kept. Every `up` started here is killed when the test file ends, so a failing
// test leaves none running.
import { after } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { fileURLToPath } from "node:url";
import { eventually } from "./eventually.ts";

const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));

/** Every `up` this file started, so a failing test leaves none running. */
const started: ChildProcess[] = [];
/** How long an `up` gets to stop its engines after SIGTERM before it is killed outright. */
const ORDERLY_STOP_MS = 20_000;
after(async () => {
  // SIGTERM first: `up` stops its engines on the way out, where SIGKILL would leave them running.
  const running = started.filter((child) => child.exitCode === null && child.signalCode === null);
  await Promise.all(
    running.map(
      (child) =>
        new Promise<void>((resolve) => {
          const force = setTimeout(() => child.kill("SIGKILL"), ORDERLY_STOP_MS);
          child.once("exit", () => {
            clearTimeout(force);
            resolve();
          });
          child.kill("SIGTERM");
        }),
    ),
  );
});

export async function startUp(
  dataDir: string,
  port: number,
  extraArgs: string[] = [],
): Promise<{ child: ChildProcess; stdout: () => string; exited: Promise<number | null> }> {
  const child = spawn(process.execPath, [BIN, "up", "--demo", "--data-dir", dataDir, "--listen", `127.0.0.1:${port}`, ...extraArgs], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, LLMGW_LOG_LEVEL: "warn" },
  });
  started.push(child);
  let out = "";
  let err = "";
  child.stdout!.on("data", (chunk: Buffer) => (out += chunk.toString()));
  child.stderr!.on("data", (chunk: Buffer) => (err += chunk.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  // The demo hint is the last line of what `up` prints once it listens.
  await eventually("llmgw up to listen", () => {
    if (child.exitCode !== null) throw new Error(`llmgw up exited early (${child.exitCode}): ${err}`);
    return out.includes("is starting. Try:");
  });
  return { child, stdout: () => out, exited };
}

/** Waits for the line `up` prints when the demo model can answer, and checks its address. */
export async function readyLine(stdout: () => string, port: number): Promise<void> {
  const line = await eventually("the ready line of the demo model", () => /^ready: .*$/m.exec(stdout())?.[0], { timeoutMs: 120_000 });
  assert.equal(line, `ready: model 'demo' answers at http://127.0.0.1:${port}/v1`);
}
