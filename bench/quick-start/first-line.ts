// Benchmark of the quick start's first impression (issue "Fresh machine", item 2): after
// `npm ci && npm link`, `llmgw up --demo` on a fresh HOME must print its first line within
// 2 s. Each round makes a new HOME (so no data dir, no admin key, no demo model yet, as on a
// first start), starts `node bin/llmgw.js up --demo` on a free port and measures, side by side:
//
//   node         `node -e ''` started and ended: what any Node.js command costs here
//   first line   from the spawn of `up --demo` to the first line on its stdout
//   ready        from the spawn to "ready: model 'demo' answers at ..." (the demo model
//                generated, the engine started and loaded)
//
// Then `up` gets SIGTERM (it stops its engine) and the next round starts. Goal: the median
// first line ≤ 2000 ms. It runs the compiled dist/ as `llmgw` does: build first
// (`npm run build`).
//
//   npx tsx bench/quick-start/first-line.ts [--rounds N]
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { findFreePort } from "../../src/agent/free-port.ts";

const BIN = fileURLToPath(new URL("../../bin/llmgw.js", import.meta.url));
const GOAL_FIRST_LINE_MS = 2000;
const roundsFlag = process.argv.indexOf("--rounds");
const rounds = roundsFlag >= 0 ? Number(process.argv[roundsFlag + 1]) : 5;

interface Round {
  nodeMs: number;
  firstLineMs: number;
  readyMs: number;
}

async function oneRound(): Promise<Round> {
  const nodeStarted = performance.now();
  spawnSync(process.execPath, ["-e", ""]);
  const nodeMs = performance.now() - nodeStarted;

  const home = mkdtempSync(path.join(tmpdir(), "llmgw-bench-home-"));
  const port = await findFreePort("127.0.0.1");
  const { LLMGW_DATA_DIR: _dataDir, LLMGW_FROM_SOURCE: _fromSource, ...env } = process.env;
  const started = performance.now();
  const child = spawn(process.execPath, [BIN, "up", "--demo", "--listen", `127.0.0.1:${port}`], {
    env: { ...env, HOME: home, LLMGW_LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  let out = "";
  let firstLineMs = Number.NaN;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const readyMs = await new Promise<number>((resolve, reject) => {
    const deadline = setTimeout(() => reject(new Error(`no ready line within 120 s; output so far:\n${out}`)), 120_000);
    child.stdout.on("data", (chunk: Buffer) => {
      out += chunk.toString();
      if (Number.isNaN(firstLineMs) && out.includes("\n")) firstLineMs = performance.now() - started;
      if (/ready: model 'demo' answers at/.test(out)) {
        clearTimeout(deadline);
        resolve(performance.now() - started);
      }
    });
    child.once("exit", (code) => reject(new Error(`up --demo exited with ${code} before it was ready:\n${out}`)));
  });
  child.kill("SIGTERM");
  await exited;
  rmSync(home, { recursive: true, force: true });
  return { nodeMs, firstLineMs, readyMs };
}

function summary(values: number[]): string {
  const sorted = [...values].sort((a, b) => a - b);
  const median = sorted[Math.floor(sorted.length / 2)] ?? Number.NaN;
  return `median ${median.toFixed(0)} ms, min ${sorted[0]?.toFixed(0)} ms, max ${sorted.at(-1)?.toFixed(0)} ms`;
}

const results: Round[] = [];
for (let round = 1; round <= rounds; round += 1) {
  const result = await oneRound();
  results.push(result);
  console.log(`round ${round}: node ${result.nodeMs.toFixed(0)} ms, first line ${result.firstLineMs.toFixed(0)} ms, ready ${result.readyMs.toFixed(0)} ms`);
}
const firstLines = results.map((result) => result.firstLineMs);
console.log(`node alone:  ${summary(results.map((result) => result.nodeMs))}`);
console.log(`first line:  ${summary(firstLines)}`);
console.log(`ready:       ${summary(results.map((result) => result.readyMs))}`);
const median = [...firstLines].sort((a, b) => a - b)[Math.floor(firstLines.length / 2)] ?? Number.NaN;
console.log(`${median <= GOAL_FIRST_LINE_MS ? "PASS" : "MISS"}: median first line ${median.toFixed(0)} ms (goal ≤ ${GOAL_FIRST_LINE_MS} ms)`);
